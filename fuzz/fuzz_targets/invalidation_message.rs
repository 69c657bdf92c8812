//! `invalidation_message`: see `binval_consumer::fuzzing::invalidation_message` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| binval_consumer::fuzzing::invalidation_message(data));
