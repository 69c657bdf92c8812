//! `binval replay` as an operator runs it, beside a live pipeline, on real services.

mod pipeline_env;

use std::process::Command;

use pipeline_env::*;
use serde_json::{json, Value};

const MAPPING: &str = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = 3\n\n[[mappings]]\ntable = \"{db}.tags\"\nkeys = [\"{p}:tag:{id}\"]\n";

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Run `binval replay` with `args`; returns (exit code, stdout JSON lines, stderr).
fn replay(cfg: &std::path::Path, args: &[&str]) -> (i32, Vec<Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_binval"))
        .arg("replay")
        .arg("--config")
        .arg(cfg)
        .args(args)
        .arg("--quiet")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let lines =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    (out.status.code().unwrap_or(-1), lines, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn write_config(env: &Env, text: &str) -> std::path::PathBuf {
    let dir = tk::state_root().join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.toml", env.prefix));
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_is_a_no_op_on_applied_changes_restores_wiped_replicas_and_dry_run_writes_nothing() {
    let env = Env::new("replay", RedisKind::Cluster);
    env.exec(pipeline_env::items::ID_V).await;
    env.exec("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(20))").await;
    let start = env.binlog_now().await;
    let cfg = write_config(&env, &env.config_toml(&start, MAPPING));
    let run = pipeline_env::start(env.config(&start, MAPPING));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let v_ins = env.exec_v("INSERT INTO items VALUES (1, 10), (2, 20), (3, 30)").await;
    env.exec("INSERT INTO tags VALUES (1, 'red')").await;
    let v_upd = env.exec_v("UPDATE items SET v = 11 WHERE id = 1").await;
    let v_del = env.exec_v("DELETE FROM items WHERE id = 3").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&k(3), v_del)), v_del);
    let snapshot = |r: &mut RedisClient| -> Vec<(u64, Vec<Record>)> {
        (1..=3).map(|id| (r.version(&k(id)), (0..3).map(|i| r.record(&k(id), i)).collect())).collect()
    };
    let before = block(|| snapshot(&mut r));
    // Every change has its event, or a newer one of its key (a group publishes one per key).
    let changes = vec![(k(1), v_ins), (k(1), v_upd), (k(2), v_ins), (k(3), v_ins), (k(3), v_del)];
    let problem = block(|| events_cover(&tk::broker().bootstrap(), &env.topic, &changes));
    assert!(problem.is_none(), "{problem:?}");

    // 1. Replaying the applied range beside the live pipeline changes nothing.
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &start]));
    assert_eq!(code, 0, "{err}");
    let summary = lines.last().unwrap();
    // Other tests write to the shared server meanwhile: their transactions are read too.
    assert_eq!(summary["mapped_transactions"], json!(4), "{summary}");
    assert!(summary["transactions"].as_u64().unwrap() >= 4, "{summary}");
    assert_eq!(summary["key_changes"], json!(6), "{summary}");
    assert_eq!(summary["changed"], json!(0), "{summary}");
    assert_eq!(summary["unchanged"], json!(6), "{summary}");
    assert_eq!(summary["events"], json!(0), "no events for no-ops");
    assert_eq!(block(|| snapshot(&mut r)), before, "versions and replicas equal before and after");

    // 2. One replica of item 1 lost (e.g. its master's data): a dry run shows it and writes
    // nothing ...
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(format!("{}:r1", k(1)))));
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &start, "--dry-run", "--table", &format!("{}.items", env.db)]));
    assert_eq!(code, 0, "{err}");
    let (summary, changes) = lines.split_last().unwrap();
    assert_eq!(summary["dry_run"], json!(true));
    assert_eq!(summary["key_changes"], json!(5), "only items (--table): 3 inserts, 1 update, 1 delete: {summary}");
    let would: Vec<&Value> = changes.iter().filter(|l| l["would_change"] == json!(true)).collect();
    assert_eq!(would.len(), 1, "only the last change of item 1 would restore r1: {changes:?}");
    assert_eq!(would[0]["key"], json!(k(1)));
    assert_eq!(would[0]["version_new"], json!(v_upd));
    assert_eq!(would[0]["version_now"], json!(v_upd));
    assert_eq!(would[0]["replica_positions"], json!([v_upd, null, v_upd]));
    assert!(changes.iter().all(|l| l["key"].as_str().unwrap().contains(":item:")), "--table filters");
    assert_eq!(block(|| r.record(&k(1), 1)), (None, None, false), "dry run wrote nothing");

    // ... and a real replay restores exactly that replica, without moving any version.
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &start, "--rate", "1000"]));
    assert_eq!(code, 0, "{err}");
    let summary = lines.last().unwrap();
    assert_eq!(summary["changed"], json!(1), "{summary}");
    assert_eq!(summary["events"], json!(1), "{summary}");
    assert_eq!(block(|| snapshot(&mut r)), before, "replica restored, versions unchanged");
    let row: Value = serde_json::from_str(&block(|| r.replica(&k(1), 1)).unwrap()).unwrap();
    assert_eq!(row, json!({"id": 1, "v": 11}));

    // Ranges by GTID and by time; --to inclusive.
    let g_upd = format!("gtid:0-1-{}", v_upd - 1);
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &g_upd, "--to", &format!("gtid:0-1-{v_upd}"), "--dry-run"]));
    assert_eq!(code, 0, "{err}");
    let (summary, changes) = lines.split_last().unwrap();
    assert_eq!(summary["transactions"], json!(1), "{summary}");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0]["version_new"], json!(v_upd));
    let (code, lines, err) = block(|| replay(&cfg, &["--from", "2000-01-01 00:00:00", "--dry-run"]));
    assert_eq!(code, 0, "{err}");
    assert!(lines.last().unwrap()["key_changes"].as_u64().unwrap() >= 6, "{:?}", lines.last());

    // Bad input names the flag.
    let (code, _, err) = block(|| replay(&cfg, &["--from", "yesterday"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from") && err.contains("yesterday"), "{err}");
    let (code, _, err) = block(|| replay(&cfg, &["--from", &start, "--table", "nope.nope"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--table") && err.contains("nope.nope"), "{err}");
    let (code, _, err) = block(|| replay(&cfg, &["--from", "mysql-bin.000001:500", "--to", "mysql-bin.000001:400"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--to"), "{err}");
    let sid = env.server_id.to_string();
    let (code, _, err) = block(|| replay(&cfg, &["--from", &start, "--server-id", &sid]));
    assert_eq!(code, 2, "replay must not take the live run's server_id: {err}");

    // After a RENAME of a mapped table the checkpoint records it; replay asks which names
    // apply at --from.
    let vr = env.exec_v("RENAME TABLE tags TO tags2").await;
    let v5 = env.exec_v("INSERT INTO items VALUES (5, 50)").await;
    assert_eq!(block(|| r.wait_version(&k(5), v5)), v5);
    let _ = vr;
    run.stop().await;
    let (code, _, err) = block(|| replay(&cfg, &["--from", &start, "--dry-run"]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--renames") && err.contains(".tags2"), "{err}");
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &start, "--dry-run", "--renames", "none"]));
    assert_eq!(code, 0, "{err}");
    assert!(lines.last().unwrap()["key_changes"].as_u64().unwrap() >= 7, "{:?}", lines.last());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_inside_a_transaction_replays_the_whole_transaction() {
    // Issue #12 (2): `binval replay --from FILE:POS` at a row event skipped that event's rows.
    let env = Env::new("replaymid", RedisKind::Standalone);
    env.exec(pipeline_env::items::ID_V).await;
    env.exec("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(20))").await;
    let before = env.binlog_now().await;
    let v = env.exec_v("INSERT INTO items VALUES (1, 10), (2, 20)").await;
    let at_rows = row_event_position(&before, &format!("{}.items", env.db));
    let cfg = write_config(&env, &env.config_toml(&before, MAPPING));
    let (code, lines, err) = block(|| replay(&cfg, &["--from", &at_rows, "--dry-run"]));
    assert_eq!(code, 0, "{err}");
    let (summary, changes) = lines.split_last().unwrap();
    assert_eq!(summary["key_changes"], json!(2), "{summary} {err}");
    assert!(changes.iter().all(|l| l["version_new"] == json!(v)), "{changes:?}");
    assert!(err.contains("inside") && err.contains(&at_rows), "the move is reported: {err}");
}
