//! The fuzz targets' inputs replayed on stable Rust, no libFuzzer needed (see fuzz/README.md):
//! every crash input committed under `fuzz/regressions/<target>/` and every seed
//! `scripts/fuzz.sh` starts from (the binlogs of ../shared/binlogs/mysql-test, whole for
//! `binlog_file` and cut into events for `binlog_events`; the shipped configs; the sample
//! invalidation messages of `fuzz/seeds/invalidation_message/`), through the same bodies
//! (`binval::fuzzing`, `binval_consumer::fuzzing`). A body that panics on one of them fails
//! the test, naming the file.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir`, sorted; none when it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    v.sort();
    v
}

/// Run `body` on each input (name, bytes); fail naming every input that panicked.
fn replay(target: &str, inputs: Vec<(String, Vec<u8>)>, body: fn(&[u8])) -> usize {
    let mut failed = Vec::new();
    for (name, bytes) in &inputs {
        if std::panic::catch_unwind(|| body(bytes)).is_err() {
            failed.push(name.clone());
        }
    }
    assert!(failed.is_empty(), "{target}: the fuzz body panicked on {failed:?}");
    inputs.len()
}

fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    files(&root().join("fuzz/regressions").join(target))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md" && n != ".gitkeep"))
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

fn shared_binlogs() -> Vec<(String, Vec<u8>)> {
    let dir = root().join("../shared/binlogs/mysql-test");
    let v: Vec<_> = files(&dir).into_iter().map(|p| (p.display().to_string(), std::fs::read(&p).unwrap())).collect();
    assert!(!v.is_empty(), "no binlogs in {}", dir.display());
    v
}

#[test]
fn binlog_file_inputs_do_not_panic() {
    let mut inputs = regressions("binlog_file");
    let crashes = inputs.len();
    inputs.extend(shared_binlogs());
    let n = replay("binlog_file", inputs, binval::fuzzing::binlog_file);
    eprintln!("binlog_file: {crashes} regression inputs, {n} in all");
}

#[test]
fn binlog_events_inputs_do_not_panic() {
    let mut inputs = regressions("binlog_events");
    let crashes = inputs.len();
    for (name, bytes) in shared_binlogs() {
        for (i, seed) in binval::fuzzing::binlog_event_seeds(&bytes).into_iter().enumerate() {
            // The same events under each FORMAT_DESCRIPTION the target can pick.
            for mode in 0..5u8 {
                let mut s = seed.clone();
                s[0] = mode;
                inputs.push((format!("{name} seed {i} mode {mode}"), s));
            }
        }
    }
    let n = replay("binlog_events", inputs, binval::fuzzing::binlog_events);
    assert!(n > crashes + 100, "only {n} inputs: the binlogs were not cut into events");
}

#[test]
fn config_inputs_do_not_panic() {
    let mut inputs = regressions("config");
    for p in files(&root().join("config")) {
        inputs.push((p.display().to_string(), std::fs::read(&p).unwrap()));
    }
    replay("config", inputs, binval::fuzzing::config);
}

#[test]
fn invalidation_message_inputs_do_not_panic() {
    let mut inputs = regressions("invalidation_message");
    let seeds = files(&root().join("fuzz/seeds/invalidation_message"));
    assert!(!seeds.is_empty(), "no sample messages");
    for p in seeds {
        inputs.push((p.display().to_string(), std::fs::read(&p).unwrap()));
    }
    replay("invalidation_message", inputs, binval_consumer::fuzzing::invalidation_message);
}

/// The FORMAT_DESCRIPTIONs `binlog_events` picks from are whole events the offline reader
/// takes (checksum right, four flavours).
#[test]
fn fuzz_format_descriptions_read() {
    for (mariadb, crc) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut file = b"\xfebin".to_vec();
        file.extend(binval::fuzzing::format_description(mariadb, crc));
        let sum = binval::binlog::offline::read_bytes("fde", &file, &Default::default(), |_| {})
            .unwrap_or_else(|e| panic!("mariadb {mariadb} crc {crc}: {e}"));
        assert_eq!(sum.events, 1);
    }
}
