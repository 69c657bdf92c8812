//! `binval bootstrap` as an operator runs it, beside a live pipeline, on the real services:
//! a table filled before binval started is bootstrapped while a writer updates random rows,
//! then `binval verify` finds every key consistent and the rows changed meanwhile hold their
//! newest value; a bootstrap killed midway resumes; `--dry-run` writes nothing; composite
//! keys, several keys per row, invalidate mode; clear errors.
//!
//! `BINVAL_BOOTSTRAP_ROWS` sets the size of the first test's table (default 100,000).

mod pipeline_env;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mysql_async::prelude::Queryable;
use pipeline_env::*;
use serde_json::{json, Value};

/// Run `binval <cmd> --config cfg args...`; returns (exit code, stdout JSON lines, stderr).
fn binval(cmd: &str, cfg: &std::path::Path, args: &[&str], vars: &[(&str, &str)]) -> (i32, Vec<Value>, String) {
    let cfg = cfg.to_string_lossy();
    let (code, out, err) = binval_cli(&[&[cmd, "--config", &cfg], args].concat(), vars);
    (code, json_lines(&out), err)
}

/// Count the keys of `pattern` in Redis (every master of a cluster).
fn count_keys(env: &Env, pattern: &str) -> usize {
    let urls: Vec<String> = match env.redis {
        RedisKind::Standalone => vec![tk::redis().url()],
        RedisKind::Cluster => tk::redis_cluster().urls(),
    };
    urls.iter()
        .map(|u| {
            let mut c = redis::Client::open(u.as_str()).unwrap().get_connection().unwrap();
            let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut c).unwrap();
            keys.len()
        })
        .sum()
}

const ITEMS: &str = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\", \"{p}:sku:{sku}\"]\nreplicas = 2\n";

/// CI: 25,000 rows (`BINVAL_BOOTSTRAP_ROWS` overrides); the 100,000 rows of the issue take
/// 26 s of debug-build test time on an idle 2-core machine and about twice that while other
/// builds run, so they are the opt-in test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_beside_a_writer_then_verify_finds_every_key_consistent() {
    let rows: u64 = std::env::var("BINVAL_BOOTSTRAP_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(25_000);
    bootstrap_beside_a_writer(rows).await;
}

/// The size: `cargo test --test bootstrap -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "opt-in: 100,000 rows, ~30-60 s in a debug build"]
async fn bootstrap_of_100k_rows_beside_a_writer_then_verify_finds_every_key_consistent() {
    bootstrap_beside_a_writer(100_000).await;
}

/// Bootstrap a table of `rows` rows filled before binval started, while a writer updates
/// random rows; then verify finds every key consistent and the changed rows hold their newest
/// value.
async fn bootstrap_beside_a_writer(rows: u64) {
    let env = Env::new("bootstrap", RedisKind::Standalone);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, sku VARCHAR(20) NOT NULL UNIQUE, v INT NOT NULL, title VARCHAR(40))").await;
    // The rows exist before binval: no binlog event of theirs will ever reach it.
    env.exec(&format!("INSERT INTO items SELECT seq, CONCAT('s', seq), 0, CONCAT('title ', seq) FROM seq_1_to_{rows}")).await;
    let start = env.binlog_now().await;
    let cfg = env.write_config(&env.config_toml(&start, ITEMS));
    let run = pipeline_env::start(env.config(&start, ITEMS));

    // A writer updates random rows for as long as the bootstrap runs.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, url) = (stop.clone(), format!("{}/{}", tk::mariadb().root_url(), env.db));
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(url).await.unwrap();
            let mut changed: BTreeMap<u64, u64> = BTreeMap::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let id = 1 + (n * 7919 + n * n * 104_729) % rows;
                c.query_drop(format!("UPDATE items SET v = {n}, title = 'w{n}' WHERE id = {id}")).await.unwrap();
                changed.insert(id, n);
            }
            let v = last_version(&mut c).await;
            (changed, v)
        })
    };
    let t0 = Instant::now();
    let (code, lines, err) = block(|| binval("bootstrap", &cfg, &["--quiet"], &[]));
    let took = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (changed, last_v) = writer.await.unwrap();
    assert_eq!(code, 0, "{err}");
    let s = &lines[0];
    println!(
        "bootstrap of {rows} rows (2 keys each, 2 replicas, standalone Redis, debug build) beside {} updates: {:.1} s; {s}",
        changed.len(),
        took.as_secs_f64()
    );
    assert_eq!(s["rows"], json!(rows), "{s}");
    assert_eq!(s["key_changes"], json!(rows * 2), "{s}");
    assert_eq!(s["tables"][0]["status"], json!("done"));
    assert_eq!(s["events"], json!(0), "no events without --publish");
    assert!(!changed.is_empty(), "the writer ran during the bootstrap");

    // binval caught up with the writer, then every key agrees with the database.
    let mut r = env.redis_client();
    let last_id = *changed.iter().max_by_key(|(_, n)| **n).unwrap().0;
    assert_eq!(block(|| r.wait_version(&format!("{}:item:{last_id}", env.prefix), last_v)), last_v);
    let t0 = Instant::now();
    let (code, lines, err) = block(|| binval("verify", &cfg, &["--recheck-ms", "500"], &[]));
    let vs = &lines[0];
    println!("verify of {rows} rows: {:.1} s; {vs}", t0.elapsed().as_secs_f64());
    assert_eq!(code, 0, "{vs} {err}");
    assert_eq!(vs["rows_checked"], json!(rows), "{vs}");
    assert_eq!(vs["keys_checked"], json!(rows * 2), "{vs}");
    assert_eq!(vs["mismatches"], json!(0), "{vs}");
    assert_eq!(vs["extra"], json!(0), "{vs}");

    // The rows changed during the bootstrap hold their newest value in every replica.
    let mut c = env.conn().await;
    for (id, _) in changed.iter().take(500) {
        let (v, title): (i64, String) = c.query_first(format!("SELECT v, title FROM items WHERE id = {id}")).await.unwrap().unwrap();
        for key in [format!("{}:item:{id}", env.prefix), format!("{}:sku:s{id}", env.prefix)] {
            for i in 0..2 {
                let got: Value = serde_json::from_str(&block(|| r.replica(&key, i)).expect("replica")).unwrap();
                assert_eq!((got["v"].as_i64().unwrap(), got["title"].as_str().unwrap()), (v, title.as_str()), "{key}:r{i}");
            }
        }
    }
    // A row nobody changed got its replicas from the bootstrap, at its snapshot's version.
    let quiet = (1..=rows).find(|id| !changed.contains_key(id)).unwrap();
    let key = format!("{}:item:{quiet}", env.prefix);
    let got: Value = serde_json::from_str(&block(|| r.replica(&key, 1)).unwrap()).unwrap();
    assert_eq!(got, json!({"id": quiet, "sku": format!("s{quiet}"), "v": 0, "title": format!("title {quiet}")}));
    assert!(block(|| r.version(&key)) > 0);
    c.disconnect().await.ok();
    run.stop().await;
}

const PAIRS: &str = "[[mappings]]\ntable = \"{db}.pairs\"\nkeys = [\"{p}:pair:{a}:{b}\"]\nreplicas = 3\n\n[[mappings]]\ntable = \"{db}.lazy\"\nkeys = [\"{p}:lazy:{id}\"]\nreplicas = 2\nmode = \"invalidate\"\n\n[[mappings]]\ntable = \"{db}.nokey\"\nkeys = [\"{p}:nokey:{x}\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_resumes_after_a_kill_dry_run_writes_nothing_and_errors_are_clear() {
    let env = Env::new("bootresume", RedisKind::Cluster);
    env.exec("CREATE TABLE pairs (a INT NOT NULL, b VARCHAR(10) NOT NULL, v INT, PRIMARY KEY (a, b))").await;
    env.exec("INSERT INTO pairs SELECT seq DIV 4, CONCAT('b', seq MOD 4), seq FROM seq_1_to_4000").await;
    env.exec("CREATE TABLE lazy (id INT PRIMARY KEY, v INT)").await;
    env.exec("INSERT INTO lazy SELECT seq, seq FROM seq_1_to_50").await;
    env.exec("CREATE TABLE nokey (x INT, y INT)").await;
    let start = env.binlog_now().await;
    let cfg = env.write_config(&env.config_toml(&start, PAIRS));
    let pairs = format!("{}.pairs", env.db);
    let progress_key = format!("binval:{{{}}}:bootstrap", env.source_name);
    let mut r = env.redis_client();

    // A dry run reads and compares: every key would change, nothing is written.
    let (code, lines, err) = block(|| binval("bootstrap", &cfg, &["--table", &pairs, "--dry-run", "--chunk-rows", "700"], &[]));
    assert_eq!(code, 0, "{err}");
    let s = &lines[0];
    assert_eq!((s["dry_run"].clone(), s["rows"].clone(), s["changed"].clone()), (json!(true), json!(4000), json!(4000)), "{s}");
    assert_eq!(block(|| count_keys(&env, &format!("{}:*", env.prefix))), 0, "dry run wrote no key");
    assert!(!block(|| r.cmd::<bool>(redis::cmd("EXISTS").arg(&progress_key))), "nor progress");

    // Killed after its third chunk (kill -9 right after the progress save) ...
    let (code, _, err) = block(|| {
        binval("bootstrap", &cfg, &["--table", &pairs, "--chunk-rows", "500", "--quiet"], &[("BINVAL_KILL_AT", "bootstrap.after_chunk:3")])
    });
    assert_eq!(code, -1, "killed by SIGKILL: {err}");
    let saved: Value = serde_json::from_str(&block(|| r.cmd::<String>(redis::cmd("HGET").arg(&progress_key).arg(&pairs)))).unwrap();
    assert_eq!((saved["rows"].clone(), saved["done"].clone()), (json!(1500), json!(false)), "{saved}");
    assert_eq!(block(|| count_keys(&env, &format!("{}:pair:*:ver", env.prefix))), 1500);
    // ... a rerun resumes after the last key saved, a different --where is refused.
    let (code, _, err) = block(|| binval("bootstrap", &cfg, &["--table", &pairs, "--where", "a > 10"], &[]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--where") && err.contains("1500 rows"), "{err}");
    let (code, lines, err) = block(|| binval("bootstrap", &cfg, &["--table", &pairs, "--chunk-rows", "500"], &[]));
    assert_eq!(code, 0, "{err}");
    let t = &lines[0]["tables"][0];
    assert_eq!((t["status"].clone(), t["rows"].clone(), t["changed"].clone()), (json!("done"), json!(2500), json!(2500)), "{t}");
    let last_written = &saved["last_key"];
    assert_eq!(&t["resumed_after"], last_written, "resumed after the saved composite key");
    assert_eq!(last_written, &json!([{"int": 375}, {"bytes": "YjA="}]), "(a, b) = (375, 'b0'): the 1500th row in key order");
    assert_eq!(block(|| count_keys(&env, &format!("{}:pair:*:ver", env.prefix))), 4000);
    let got: Value = serde_json::from_str(&block(|| r.replica(&format!("{}:pair:375:b1", env.prefix), 2)).unwrap()).unwrap();
    assert_eq!(got, json!({"a": 375, "b": "b1", "v": 1501}));
    // Done: a rerun skips it; --restart does it again (every key already held: unchanged).
    let (_, lines, _) = block(|| binval("bootstrap", &cfg, &["--table", &pairs], &[]));
    assert_eq!(lines[0]["tables"][0]["status"], json!("skipped"));
    let (code, lines, err) =
        block(|| binval("bootstrap", &cfg, &["--table", &pairs, "--restart", "--where", "a < 10", "--rate", "5000"], &[]));
    assert_eq!(code, 0, "{err}");
    let t = &lines[0]["tables"][0];
    assert_eq!((t["rows"].clone(), t["key_changes"].clone()), (json!(39), json!(39)), "--where a < 10: (0,b1..b3) and 9 x 4: {t}");

    // SIGTERM: the chunk in flight is finished and saved, the summary says so; a rerun
    // resumes there.
    let child = Command::new(env!("CARGO_BIN_EXE_binval"))
        .args(["bootstrap", "--config"])
        .arg(&cfg)
        .args(["--table", &pairs, "--restart", "--rate", "1000", "--chunk-rows", "100"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _guard = KillOnPanic(child.id());
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    let out = block(|| child.wait_with_output()).unwrap();
    assert!(out.status.success(), "exit 0 after SIGTERM: {}", out.status);
    let first: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!((first["interrupted"].clone(), first["tables"][0]["status"].clone()), (json!(true), json!("interrupted")), "{first}");
    let done_first = first["rows"].as_u64().unwrap();
    assert!(done_first > 0 && done_first < 4000, "{first}");
    let (code, lines, err) = block(|| binval("bootstrap", &cfg, &["--table", &pairs], &[]));
    assert_eq!(code, 0, "{err}");
    assert_eq!(lines[0]["rows"].as_u64().unwrap() + done_first, 4000, "{}", lines[0]);

    // Invalidate mode: version tokens and position-only replicas, no payload; --publish: an
    // event per key it changed.
    let lazy = format!("{}.lazy", env.db);
    let (code, lines, err) = block(|| binval("bootstrap", &cfg, &["--table", &lazy, "--publish"], &[]));
    assert_eq!(code, 0, "{err}");
    assert_eq!((lines[0]["key_changes"].clone(), lines[0]["events"].clone()), (json!(50), json!(50)), "{}", lines[0]);
    let k = format!("{}:lazy:7", env.prefix);
    let (payload, position, tombstone) = block(|| r.record(&k, 1));
    assert_eq!((payload, tombstone), (None, false));
    let version = block(|| r.version(&k));
    assert_eq!(position, Some(version));
    let want: std::collections::HashSet<(String, u64)> = [(k.clone(), version)].into();
    assert!(want.is_subset(&block(|| events_until(&tk::broker().bootstrap(), &env.topic, &want))), "the event of {k} at {version}");

    // A table without a primary key is named; so is a --where the server refuses.
    let (code, _, err) = block(|| binval("bootstrap", &cfg, &[], &[]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("{}.nokey", env.db)) && err.contains("no PRIMARY KEY"), "{err}");
    let (code, _, err) = block(|| binval("bootstrap", &cfg, &["--table", &lazy, "--restart", "--where", "nosuchcolumn = 1"], &[]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&lazy) && err.contains("nosuchcolumn"), "{err}");
    let (code, _, err) = block(|| binval("bootstrap", &cfg, &["--table", "x.y"], &[]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--table") && err.contains("x.y"), "{err}");
}
