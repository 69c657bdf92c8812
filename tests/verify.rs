//! `binval verify` as an operator runs it, beside a live pipeline on a 3-master Redis Cluster:
//! it finds nothing on a consistent cache; it detects and exits 3 for a replica overwritten
//! with another payload, a deleted replica, a version token moved back and a key left for a
//! deleted row; `--repair` fixes each (with their events) and the next run exits 0; lag is
//! not counted; `--keys`, `--sample`, `--every` with its metrics; bad flags are named.

mod pipeline_env;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pipeline_env::*;
use serde_json::{json, Value};

/// Run `binval verify --config cfg args...`; returns (exit code, the summary, stderr).
fn verify(cfg: &std::path::Path, args: &[&str]) -> (i32, Value, String) {
    let cfg = cfg.to_string_lossy();
    let (code, out, err) = binval_cli(&[&["verify", "--config", &cfg], args].concat(), &[]);
    (code, json_lines(&out).pop().unwrap_or(Value::Null), err)
}

const MAPPING: &str = items_mapping!(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_finds_each_kind_of_mismatch_repair_fixes_them_and_lag_is_not_counted() {
    let env = Env::new("verify", RedisKind::Cluster);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, v INT, title VARCHAR(20))").await;
    let start = env.binlog_now().await;
    let cfg = env.write_config(&env.config_toml(&start, MAPPING));
    let run = pipeline_env::start(env.config(&start, MAPPING));
    let v = env.exec_v("INSERT INTO items SELECT seq, seq * 10, CONCAT('t', seq) FROM seq_1_to_20").await;
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&k(20), v)), v);

    // 1. Consistent: exit 0, every row and key checked.
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "300"]));
    assert_eq!(code, 0, "{s} {err}");
    assert_eq!(
        (s["rows_checked"].clone(), s["keys_checked"].clone(), s["replicas_checked"].clone()),
        (json!(20), json!(20), json!(60)),
        "{s}"
    );
    assert_eq!((s["mismatches"].clone(), s["nines_at_least"].clone()), (json!(0), json!(true)), "{s}");

    // 2. Four kinds of damage, done to Redis behind binval's back.
    let _: i64 = block(|| r.cmd(redis::cmd("HSET").arg(format!("{}:r1", k(1))).arg("d").arg(r#"{"id":1,"title":"evil","v":10}"#)));
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(format!("{}:r2", k(2)))));
    let _: () = block(|| r.cmd(redis::cmd("SET").arg(format!("{}:ver", k(3))).arg(v - 1)));
    for i in 0..2 {
        let _: i64 = block(|| {
            r.cmd(redis::cmd("HSET").arg(format!("{}:r{i}", k(999))).arg("d").arg(r#"{"id":999}"#).arg("p").arg(1).arg("f").arg(0))
        });
    }
    let lines = tk::state_root().join(format!("{}-mismatches.jsonl", env.prefix));
    let lines_arg = lines.to_string_lossy().to_string();
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "300", "--mismatches", &lines_arg]));
    assert_eq!(code, 3, "{s} {err}");
    assert_eq!(s["mismatches"], json!(4), "{s}");
    assert_eq!([&s["stale"], &s["missing"], &s["version"], &s["extra"]], [&json!(1), &json!(1), &json!(1), &json!(2)], "{s}");
    assert!(s["nines"].as_f64().unwrap() > 0.0 && s["nines_at_least"] == json!(false), "{s}");
    let text = std::fs::read_to_string(&lines).unwrap();
    let found: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let by_key = |key: String| found.iter().find(|l| l["key"] == json!(key)).unwrap_or_else(|| panic!("no line for {key}: {text}")).clone();
    let l1 = by_key(k(1));
    assert_eq!((l1["findings"][0]["kind"].clone(), l1["replicas"][0].clone()), (json!("stale"), json!(format!("{}:r1", k(1)))), "{l1}");
    assert_eq!(l1["findings"][0]["fields"], json!(["title"]), "{l1}");
    assert_eq!(l1["row_key"], json!({"id": 1}));
    assert_eq!(by_key(k(2))["findings"][0]["kind"], json!("missing"));
    assert_eq!(by_key(k(2))["replica_positions"], json!([v, v, null]));
    assert_eq!(by_key(k(3))["findings"][0]["kind"], json!("version"));
    assert_eq!(by_key(k(3))["version"], json!(v - 1));
    let l999 = by_key(k(999));
    assert_eq!(
        l999["findings"].as_array().unwrap().iter().map(|f| f["kind"].clone()).collect::<Vec<_>>(),
        vec![json!("extra"), json!("extra")]
    );
    assert_eq!(l999["row_key"], Value::Null, "no row maps to it");

    // 3. --repair: every one rewritten through the fenced path, with its event.
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "300", "--repair"]));
    assert_eq!(code, 3, "mismatches were found (and repaired): {s} {err}");
    assert_eq!((s["repaired"].clone(), s["repair_failed"].clone(), s["repair_events"].clone()), (json!(4), json!(0), json!(4)), "{s}");
    let want: HashSet<(String, u64)> = [1, 2, 3, 999].iter().map(|&id| (k(id), block(|| r.version(&k(id))))).collect();
    let got = block(|| events_until(&tk::broker().bootstrap(), &env.topic, &want));
    assert!(want.is_subset(&got), "repair events {want:?}, seen {got:?}");
    let repaired: Value = serde_json::from_str(&block(|| r.replica(&k(1), 1)).unwrap()).unwrap();
    assert_eq!(repaired, json!({"id": 1, "v": 10, "title": "t1"}));
    assert_eq!(block(|| r.record(&k(999), 0)), (None, Some(block(|| r.version(&k(999)))), true), "a tombstone now");
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "300"]));
    assert_eq!(code, 0, "{s} {err}");
    assert_eq!(s["keys_checked"], json!(21), "20 rows, and the tombstoned key found by the reverse check: {s}");

    // 4. Lag is not inconsistency: with binval stopped behind a change, the difference is
    // unsettled (binval's checkpoint is behind the snapshot), not a mismatch ...
    run.stop().await;
    let v5 = env.exec_v("UPDATE items SET v = 55 WHERE id = 5").await;
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "200"]));
    assert_eq!(code, 0, "{s} {err}");
    assert_eq!((s["mismatches"].clone(), s["unsettled"].clone()), (json!(0), json!(1)), "{s}");
    // ... and once binval caught up, all is consistent.
    let run = pipeline_env::start(env.config(&start, MAPPING));
    assert_eq!(block(|| r.wait_version(&k(5), v5)), v5);
    let (code, s, err) = block(|| verify(&cfg, &["--recheck-ms", "200", "--keys", &k(5), &k(999)]));
    assert_eq!(code, 0, "{s} {err}");
    assert_eq!((s["keys_checked"].clone(), s["unsettled"].clone()), (json!(2), json!(0)), "{s}");
    let (code, s, _) = block(|| verify(&cfg, &["--sample", "50", "--no-reverse"]));
    assert_eq!(code, 0);
    assert!(s["rows_checked"].as_u64().unwrap() <= 20 && s["sample_pct"] == json!(50.0), "{s}");

    // Bad flags are named (exit 2).
    let (code, _, err) = block(|| verify(&cfg, &["--sample", "0"]));
    assert!(code == 2 && err.contains("--sample"), "{code} {err}");
    let (code, _, err) = block(|| verify(&cfg, &["--keys", "nope:1"]));
    assert!(code == 2 && err.contains("--keys") && err.contains("nope:1"), "{code} {err}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_every_serves_its_metrics_and_stops_on_sigterm() {
    let env = Env::new("verifyevery", RedisKind::Standalone);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, v INT, title VARCHAR(20))").await;
    env.exec("INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b')").await;
    let start = env.binlog_now().await;
    let cfg = env.write_config(&env.config_toml(&start, MAPPING));
    let port = binval_testkit::free_port().unwrap();
    // Never bootstrapped: both keys are missing.
    let mut child = Command::new(env!("CARGO_BIN_EXE_binval"))
        .args(["verify", "--config"])
        .arg(&cfg)
        .args(["--recheck-ms", "100", "--every", "1h", "--metrics-listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _guard = KillOnPanic(child.id());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    block(|| out.read_line(&mut line)).unwrap();
    let s: Value = serde_json::from_str(&line).unwrap();
    assert_eq!((s["mismatches"].clone(), s["missing"].clone()), (json!(2), json!(8)), "token and 3 replicas per key: {s}");
    let (code, body) = block(|| binval::commands::status::http_get(format!("127.0.0.1:{port}").parse().unwrap(), "/metrics")).unwrap();
    assert_eq!(code, 200);
    for want in [
        "binval_verify_keys_checked",
        "binval_verify_mismatched_keys",
        "binval_verify_nines",
        "binval_verify_runs_total",
        "binval_verify_last_run_timestamp_seconds",
    ] {
        assert!(body.lines().any(|l| l.starts_with(want) && l.contains(&env.source_name)), "{want} in\n{body}");
    }
    assert!(body.contains(r#"binval_verify_mismatches{source=""#) && body.contains(r#"kind="missing"} 8"#), "{body}");
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "verify --every exits 0 on SIGTERM: {st}");
            break;
        }
        assert!(Instant::now() < until, "verify --every did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}
