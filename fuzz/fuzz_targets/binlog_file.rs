//! `binlog_file`: see `binval::fuzzing::binlog_file` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| binval::fuzzing::binlog_file(data));
