//! `binlog_events`: see `binval::fuzzing::binlog_events` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| binval::fuzzing::binlog_events(data));
