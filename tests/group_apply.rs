//! Group apply and large transactions on real services: a backlog of many transactions is
//! applied in groups (one change per key per group) and converges exactly; a transaction
//! larger than a group is applied alone, in chunks, its row events spilled to a temporary
//! file; the heartbeat row gives the lag and reaches neither Redis nor Kafka; a stale slot map
//! costs a resend, never a lost write.

mod pipeline_env;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use binval::mapping::KeyChange;
use binval::redis::{RedisConn, SlotMap};
use binval::write::redis_sink::WriteCtx;
use binval_protocol::{FencePosition, Op};
use mysql_async::prelude::Queryable;
use pipeline_env::*;
use serde_json::json;

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

const MAPPING: &str = items_mapping!(4);

/// 600 single-row transactions on 30 rows (updates, deletes, re-inserts) written while binval
/// is not running, then applied as a backlog: in groups, to exactly the database's last state.
async fn backlog_in_groups(kind: RedisKind) {
    let env = Env::new("groups", kind);
    env.exec(pipeline_env::items::ID_COUNTER).await;
    let start = env.binlog_now().await;
    let mut c = env.conn().await;
    let mut last: BTreeMap<u32, (Option<i64>, u64)> = BTreeMap::new();
    let mut changes: Vec<(String, u64)> = Vec::new();
    for n in 0..600i64 {
        let id = (n * 7 % 30) as u32 + 1;
        let exists = matches!(last.get(&id), Some((Some(_), _)));
        let (sql, after) = match (exists, n % 11) {
            (false, _) => (format!("INSERT INTO items VALUES ({id}, {n})"), Some(n)),
            (true, 0) => (format!("DELETE FROM items WHERE id = {id}"), None),
            (true, _) => (format!("UPDATE items SET v = {n} WHERE id = {id}"), Some(n)),
        };
        c.query_drop(&sql).await.unwrap();
        let v = last_version(&mut c).await;
        last.insert(id, (after, v));
        changes.push((format!("{}:item:{id}", env.prefix), v));
    }
    c.disconnect().await.ok();
    let run = pipeline_env::start(env.config(&start, MAPPING));
    let mut r = env.redis_client();
    for (id, (row, v)) in &last {
        let key = format!("{}:item:{id}", env.prefix);
        assert_eq!(block(|| r.wait_version(&key, *v)), *v, "item {id}: token at its last change");
        for i in 0..4 {
            let (d, p, tomb) = block(|| r.record(&key, i));
            assert_eq!(p, Some(*v), "item {id} r{i}");
            match row {
                Some(x) => assert_eq!(serde_json::from_str::<serde_json::Value>(&d.unwrap()).unwrap(), json!({"id": id, "v": x})),
                None => assert!(tomb, "item {id} r{i} deleted"),
            }
        }
    }
    let problem = block(|| events_cover(&tk::broker().bootstrap(), &env.topic, &changes));
    assert!(problem.is_none(), "{problem:?}");
    let (groups, txns) = (run.stats.groups.load(Relaxed), run.stats.transactions.load(Relaxed));
    println!("{kind:?}: {txns} transactions applied in {groups} groups");
    assert!(groups < txns, "a backlog is applied in groups of several transactions ({groups} groups for {txns} transactions)");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_applied_in_groups_standalone() {
    backlog_in_groups(RedisKind::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_applied_in_groups_cluster() {
    backlog_in_groups(RedisKind::Cluster).await;
}

/// One transaction of 8000 inserts (about 2 MB of row events, over the 1 MiB kept in memory:
/// spilled), updates and deletes of some of those rows and a row inserted, updated and
/// deleted, in chunks of 500 rows; the transaction after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transaction_is_applied_alone_in_chunks_and_spilled() {
    let env = Env::new("large", RedisKind::Cluster);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, v BIGINT, pad VARCHAR(255))").await;
    let start = env.binlog_now().await;
    let text = env.config_toml(&start, MAPPING).replace("reconnect_max_ms = 2000", "reconnect_max_ms = 2000\ntransaction_memory_mb = 1")
        + "\n[apply]\nmax_group_rows = 500\n";
    let run = pipeline_env::start(binval::config::Config::from_toml(&text).unwrap());
    let big = "SET SESSION max_recursive_iterations = 100000; BEGIN; \
        INSERT INTO items SELECT n, n, REPEAT('x', 200) FROM (WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 8000) SELECT n FROM s) t; \
        UPDATE items SET v = -v WHERE id % 100 = 0; \
        DELETE FROM items WHERE id % 1000 = 1; \
        INSERT INTO items VALUES (9001, 1, 'a'); UPDATE items SET v = 2 WHERE id = 9001; \
        INSERT INTO items VALUES (9002, 1, 'b'); DELETE FROM items WHERE id = 9002; \
        COMMIT";
    let v = env.exec_v(big).await;
    let after = env.exec_v("UPDATE items SET v = 7 WHERE id = 2").await;
    let mut r = env.redis_client();
    let key = |id: u32| format!("{}:item:{id}", env.prefix);
    assert_eq!(block(|| r.wait_version(&key(2), after)), after);
    let payload = |r: &mut RedisClient, id: u32, i: u32| -> (serde_json::Value, Option<u64>, bool) {
        let (d, p, t) = r.record(&key(id), i);
        (d.map(|d| serde_json::from_str(&d).unwrap()).unwrap_or(serde_json::Value::Null), p, t)
    };
    for id in [1u32, 3, 100, 1001, 4000, 7999, 8000, 9001, 9002] {
        let want = match id {
            1 | 1001 | 9002 => serde_json::Value::Null,
            100 | 4000 | 8000 => json!({"id": id, "v": -(id as i64), "pad": "x".repeat(200)}),
            9001 => json!({"id": 9001, "v": 2, "pad": "a"}),
            _ => json!({"id": id, "v": id, "pad": "x".repeat(200)}),
        };
        assert_eq!(block(|| r.version(&key(id))), v, "item {id}: token at the transaction's position");
        for i in 0..4 {
            let (d, p, tomb) = block(|| payload(&mut r, id, i));
            assert_eq!((d, p, tomb), (want.clone(), Some(v), want.is_null()), "item {id} r{i}: its last change in the transaction");
        }
    }
    assert_eq!(
        block(|| r.replica(&key(2), 1)).map(|d| serde_json::from_str::<serde_json::Value>(&d).unwrap()["v"].clone()),
        Some(json!(7))
    );
    assert_eq!((run.stats.large_transactions.load(Relaxed), run.stats.spilled_transactions.load(Relaxed)), (1, 1));
    // One event per key of the transaction, at its position: the key's last change.
    let mut keys: Vec<(String, u64)> = (1..=8000).chain([9001, 9002]).map(|id| (key(id), v)).collect();
    keys.push((key(2), after));
    let problem = block(|| events_cover(&tk::broker().bootstrap(), &env.topic, &keys));
    assert!(problem.is_none(), "{problem:?}");
    run.stop().await;
}

/// With `source.heartbeat_table`, the active instance writes its row every interval; the
/// reader sees it come back, the checkpoint moves while no application writes, and the row
/// reaches neither Redis nor Kafka.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_rows_give_the_lag_and_reach_neither_redis_nor_kafka() {
    let env = Env::new("beat", RedisKind::Standalone);
    env.exec(pipeline_env::items::ID_COUNTER).await;
    // The replication user of the tests may read only; the heartbeat needs to write its table.
    env.exec(&format!("GRANT CREATE, INSERT, UPDATE ON `{}`.* TO 'binval'@'%'", env.db)).await;
    let start = env.binlog_now().await;
    let text = env.config_toml(&start, MAPPING).replace(
        "reconnect_max_ms = 2000",
        &format!("reconnect_max_ms = 2000\nheartbeat_table = \"{}.binval_heartbeat\"\nheartbeat_interval_ms = 100", env.db),
    );
    let run = pipeline_env::start(binval::config::Config::from_toml(&text).unwrap());
    let until = Instant::now() + Duration::from_secs(20);
    while run.stats.acked_heartbeat_us.load(Relaxed) == 0 {
        assert!(Instant::now() < until, "no heartbeat row came back through the binlog");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = run.stats.acked_heartbeat_us.load(Relaxed);
    let mut c = env.conn().await;
    let (source, ts_us): (String, i64) = c.query_first("SELECT source, ts_us FROM binval_heartbeat").await.unwrap().unwrap();
    assert_eq!(source, env.source_name);
    assert!(ts_us as u64 >= first, "the row holds the newest heartbeat");
    c.disconnect().await.ok();
    let until = Instant::now() + Duration::from_secs(20);
    while run.stats.acked_heartbeat_us.load(Relaxed) <= first {
        assert!(Instant::now() < until, "heartbeats stopped coming back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(run.stats.key_changes.load(Relaxed), 0, "heartbeat rows are not mapped");
    let mut r = env.redis_client();
    let keys: Vec<String> = block(|| r.cmd(redis::cmd("KEYS").arg(format!("{}:*", env.prefix))));
    assert!(keys.is_empty(), "{keys:?}");
    assert!(block(|| read_events(&env.topic, 1)).is_empty(), "no event for a heartbeat");
    run.stop().await;
}

/// A batch sent with a slot map that puts every slot on one master: the other masters'
/// commands are refused with MOVED, resent one by one after a refresh, and every write lands
/// exactly once (the outcome counts are those of a first write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slot_map_costs_a_resend_not_a_write() {
    let env = Env::new("slots", RedisKind::Cluster);
    let cfg = env.config("current", "");
    let conn = RedisConn::connect(&cfg.redis).await.unwrap();
    let first = tk::redis_cluster().ports[0];
    let reply = redis::Value::Array(vec![redis::Value::Array(vec![
        redis::Value::Int(0),
        redis::Value::Int(16383),
        redis::Value::Array(vec![redis::Value::BulkString(b"127.0.0.1".to_vec()), redis::Value::Int(first as i64)]),
    ])]);
    conn.replace_slot_map(SlotMap::from_cluster_slots(&reply));
    let changes: Vec<KeyChange> = (0..60)
        .map(|i| KeyChange {
            key: format!("{}:k{i}", env.prefix),
            op: Op::Insert,
            table: "db.t".into(),
            payload: Some(format!("{{\"i\":{i}}}")),
            replicas: 3,
            count: 3,
            ttl_secs: 0,
        })
        .collect();
    let positions: Vec<FencePosition> = (0..60).map(|i| FencePosition(100 + i)).collect();
    let w = WriteCtx { position: FencePosition(0), fencing_token: 1, source_name: "t".into(), tombstone_ttl_ms: 60_000 };
    let applied = conn.apply_batch(&changes, &positions, &w).await.unwrap();
    assert!(applied.iter().all(|a| a.replicas_written == 3 && a.version_moved && !a.skipped_newer), "{applied:?}");
    let mut r = env.redis_client();
    for (i, c) in changes.iter().enumerate() {
        assert_eq!(block(|| r.version(&c.key)), 100 + i as u64);
        for k in 0..3 {
            assert_eq!(block(|| r.record(&c.key, k)), (c.payload.clone(), Some(100 + i as u64), false), "{} r{k}", c.key);
        }
    }
    // Applied again (the map was refreshed by the failure): every write is a fenced no-op.
    let again = conn.apply_batch(&changes, &positions, &w).await.unwrap();
    assert!(again.iter().all(|a| a.replicas_written == 0 && !a.version_moved), "{again:?}");
}
