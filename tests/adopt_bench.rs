//! Opt-in benchmark of issue #11: `binval bootstrap` and `binval verify` over a table of
//! `BINVAL_ADOPT_ROWS` rows (default 1,000,000) on a 3-master Redis Cluster, 4 suffix replicas
//! per key, through the `binval` binary. Prints rows/s of each (and the peak RSS of the
//! process); asserts only that they did their job (every row written, 0 mismatches).
//!
//! ```sh
//! cargo test --release --test adopt_bench -- --ignored --nocapture
//! BINVAL_ADOPT_ROWS=200000 cargo test --release --test adopt_bench -- --ignored --nocapture
//! ```

mod pipeline_env;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pipeline_env::*;
use serde_json::Value;

/// Run `binval <args>` to the end; returns (exit code, last JSON line of stdout, peak RSS KiB,
/// wall time).
fn timed(args: &[&str]) -> (i32, Value, u64, Duration) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_binval"))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0u64;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if let Some(v) = binval_testkit::procfs::peak_rss_kib(pid) {
            peak = peak.max(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    let last = out.lines().rev().find(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).unwrap_or(Value::Null);
    (status.code().unwrap_or(-1), last, peak, t0.elapsed())
}

#[test]
#[ignore = "opt-in: a 1M-row bootstrap and verify (BINVAL_ADOPT_ROWS), minutes and a GB of Redis"]
fn bootstrap_and_verify_rates_on_a_million_rows() {
    let rows: u64 = std::env::var("BINVAL_ADOPT_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let env = Env::new("adoptbench", RedisKind::Cluster);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(env.exec(
        "CREATE TABLE items (id INT PRIMARY KEY, sku VARCHAR(20) NOT NULL, price DECIMAL(8,2), title VARCHAR(60), updated DATETIME(3))",
    ));
    let t0 = Instant::now();
    rt.block_on(env.exec(&format!(
        "INSERT INTO items SELECT seq, CONCAT('sku-', seq), seq / 100, CONCAT('an item called number ', seq), '2024-01-02 03:04:05.678' FROM seq_1_to_{rows}"
    )));
    println!("{rows} rows inserted in {:.1} s", t0.elapsed().as_secs_f64());
    let start = rt.block_on(env.binlog_now());
    let mapping = items_mapping!(4);
    let cfg = env.write_config(&env.config_toml(&start, mapping)).to_string_lossy().to_string();

    let (code, s, rss, took) = timed(&["bootstrap", "--config", &cfg, "--quiet"]);
    assert_eq!(code, 0, "{s}");
    assert_eq!(s["rows"].as_u64(), Some(rows), "{s}");
    println!(
        "bootstrap: {rows} rows ({} key changes, {} replica writes) in {:.1} s = {:.0} rows/s; peak RSS {} MiB; {s}",
        s["key_changes"],
        rows * 4,
        took.as_secs_f64(),
        rows as f64 / took.as_secs_f64(),
        rss / 1024
    );
    for (what, extra) in [("verify (rows and keys, reverse check by SCAN)", vec![]), ("verify --no-reverse", vec!["--no-reverse"])] {
        let mut args = vec!["verify", "--config", cfg.as_str()];
        args.extend(extra);
        let (code, s, rss, took) = timed(&args);
        assert_eq!(code, 0, "{s}");
        assert_eq!(s["mismatches"].as_u64(), Some(0), "{s}");
        println!(
            "{what}: {rows} rows in {:.1} s = {:.0} rows/s; peak RSS {} MiB; {s}",
            took.as_secs_f64(),
            rows as f64 / took.as_secs_f64(),
            rss / 1024
        );
    }
    let (code, s, _, took) = timed(&["bootstrap", "--config", &cfg, "--quiet", "--restart", "--dry-run"]);
    assert_eq!(code, 0, "{s}");
    println!(
        "bootstrap --dry-run (reads every key back): {rows} rows in {:.1} s = {:.0} rows/s",
        took.as_secs_f64(),
        rows as f64 / took.as_secs_f64()
    );
}
