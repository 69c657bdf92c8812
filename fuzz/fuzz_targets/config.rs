//! `config`: see `binval::fuzzing::config` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| binval::fuzzing::config(data));
