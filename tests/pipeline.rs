//! End to end on real services: MariaDB binlog -> binval pipeline -> Redis replicas + version
//! tokens -> Kafka invalidation events.

mod pipeline_env;

use std::time::{Duration, Instant};

use binval_protocol::Op;
use pipeline_env::items::mapping as items_mapping;
use pipeline_env::*;
use serde_json::json;

const ITEMS: &str =
    "CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(100), price DECIMAL(10,2), stock MEDIUMINT, updated DATETIME(3), note TEXT)";

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn insert_update_delete(kind: RedisKind) {
    let env = Env::new("iud", kind);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(4));
    let key = format!("{}:item:1", env.prefix);
    let mut r = env.redis_client();

    let v1 = env.exec_v("INSERT INTO items VALUES (1, 'héllo wörld', 9.90, -5, '2026-11-30 12:34:56.789', NULL)").await;
    assert_eq!(block(|| r.wait_version(&key, v1)), v1, "the version token is the transaction's GTID sequence number");
    let want = json!({"id": 1, "title": "héllo wörld", "price": "9.90", "stock": -5, "updated": "2026-11-30 12:34:56.789", "note": null});
    for (i, v) in block(|| r.replicas(&key, 4)).into_iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&v.unwrap_or_else(|| panic!("replica r{i} missing"))).unwrap();
        assert_eq!(v, want, "replica r{i}");
    }

    let v2 = env.exec_v("UPDATE items SET price = 12.50, stock = 8388607 WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&key, v2)), v2);
    assert_eq!(block(|| r.record(&key, 0)).1, Some(v2), "each replica stores the position that wrote it");
    let v: serde_json::Value = serde_json::from_str(&block(|| r.replica(&key, 3)).unwrap()).unwrap();
    assert_eq!(v["price"], json!("12.50"));
    assert_eq!(v["stock"], json!(8388607));

    let v3 = env.exec_v("DELETE FROM items WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&key, v3)), v3);
    assert_eq!(block(|| r.replicas(&key, 4)), vec![None, None, None, None], "a delete leaves no payload");
    for i in 0..4 {
        assert_eq!(block(|| r.record(&key, i)), (None, Some(v3), true), "replica r{i} is a tombstone at the delete's position");
        let ttl: i64 = block(|| r.cmd(redis::cmd("PTTL").arg(format!("{key}:r{i}"))));
        assert!(ttl > 0 && ttl <= 86_400_000, "tombstone has the default 24 h TTL: {ttl}");
    }

    let events = block(|| read_events(&env.topic, 3));
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events.iter().map(|e| (e.version, e.op)).collect::<Vec<_>>(), vec![(v1, Op::Insert), (v2, Op::Update), (v3, Op::Delete)]);
    for e in &events {
        assert_eq!(e.schema, 1);
        assert_eq!(e.key, key);
        assert_eq!(e.table, format!("{}.items", env.db));
        assert!(e.position.file.starts_with("mysql-bin."), "{:?}", e.position);
        assert!(e.position.pos > 4);
        let gtid = e.position.gtid.as_deref().expect("MariaDB writes a GTID per transaction");
        assert_eq!(gtid.split('-').count(), 3, "domain-server-seq: {gtid}");
        assert!(e.commit_time_ms > 1_700_000_000_000);
        assert!(e.publish_time_ms >= e.commit_time_ms, "published after the commit (read at or after it)");
        assert!(e.publish_time_ms <= binval::now_ms());
    }
    // MariaDB's headers carry whole seconds; binval, reading as the commits happen, gives the
    // commit time the millisecond it read it at (`Transaction::read_live`).
    assert!(
        events.iter().any(|e| e.commit_time_ms % 1000 != 0),
        "commit times to the ms: {:?}",
        events.iter().map(|e| e.commit_time_ms).collect::<Vec<_>>()
    );
    assert!(events[0].position.pos < events[1].position.pos || events[0].position.file < events[1].position.file);
    run.stop().await;
}

fn start_pipeline(env: &Env, start: &str, mappings: &str) -> Running {
    pipeline_env::start(env.config(start, mappings))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_insert_update_delete() {
    insert_update_delete(RedisKind::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_insert_update_delete() {
    insert_update_delete(RedisKind::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replicas_spread_over_masters() {
    let env = Env::new("spread", RedisKind::Cluster);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(8));
    let key = format!("{}:item:6666", env.prefix);
    let v = env.exec_v("INSERT INTO items (id, title) VALUES (6666, 'hot')").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&key, v)), v);
    // Ask each master directly which replicas it holds (a key of another master answers MOVED).
    let mut masters_holding = 0;
    let mut total = 0;
    for url in tk::redis_cluster().urls() {
        let mut c = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
        let mut here = 0;
        for i in 0..8 {
            let rk = format!("{key}:r{i}");
            let res: redis::RedisResult<i64> = redis::cmd("EXISTS").arg(&rk).query(&mut c);
            if res == Ok(1) {
                here += 1;
            }
        }
        total += here;
        if here > 0 {
            masters_holding += 1;
        }
    }
    assert_eq!(total, 8, "all 8 replicas exist");
    assert!(masters_holding > 1, "8 replicas of one key landed on {masters_holding} master(s)");
    println!("replicas of {key} spread over {masters_holding} of 3 masters");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_column_update_moves_the_key() {
    let env = Env::new("keymove", RedisKind::Standalone);
    env.exec(ITEMS).await;
    env.exec("INSERT INTO items (id, title) VALUES (1, 'a')").await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(2));
    let v = env.exec_v("UPDATE items SET id = 2 WHERE id = 1").await;
    let (old, new) = (format!("{}:item:1", env.prefix), format!("{}:item:2", env.prefix));
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&new, v)), v);
    assert_eq!(block(|| r.wait_version(&old, v)), v, "old key's token bumped too");
    assert_eq!(block(|| r.replicas(&old, 2)), vec![None, None]);
    let v: serde_json::Value = serde_json::from_str(&block(|| r.replica(&new, 1)).unwrap()).unwrap();
    assert_eq!(v["id"], json!(2));
    assert_eq!(v["title"], json!("a"));
    let mut events = block(|| read_events(&env.topic, 2));
    events.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        events.iter().map(|e| (e.key.as_str(), e.op)).collect::<Vec<_>>(),
        vec![(old.as_str(), Op::Delete), (new.as_str(), Op::Insert)]
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_row_transaction_in_commit_order_and_rollback_changes_nothing() {
    let env = Env::new("txn", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    let mut c = env.conn().await;
    use mysql_async::prelude::Queryable;
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("INSERT INTO items (id, title) VALUES (1, 'rolled back')").await.unwrap();
    c.query_drop("ROLLBACK").await.unwrap();
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("INSERT INTO items (id, title) VALUES (2, 'first'), (3, 'x')").await.unwrap();
    c.query_drop("UPDATE items SET title = 'second' WHERE id = 2").await.unwrap();
    c.query_drop("UPDATE items SET title = 'third' WHERE id = 2").await.unwrap();
    c.query_drop("COMMIT").await.unwrap();
    let v = last_version(&mut c).await;
    c.disconnect().await.ok();
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&k(2), v)), v, "three changes of key 2 in one transaction -> its position");
    assert_eq!(block(|| r.version(&k(3))), v);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(2), 0)).unwrap()).unwrap();
    assert_eq!(row["title"], json!("third"), "last change in commit order wins");
    assert_eq!(block(|| r.version(&k(1))), 0, "rolled-back row never reached Redis");
    assert_eq!(block(|| r.replica(&k(1), 0)), None);
    let events = block(|| read_events(&env.topic, 2));
    let key2: Vec<(u64, Op)> = events.iter().filter(|e| e.key == k(2)).map(|e| (e.version, e.op)).collect();
    assert_eq!(
        key2,
        vec![(v, Op::Insert)],
        "one event per key per transaction: the state after the commit (inserted, then updated twice = insert)"
    );
    assert!(events.iter().all(|e| e.key != k(1)));
    let positions: std::collections::HashSet<_> = events.iter().map(|e| e.position.clone()).collect();
    assert_eq!(positions.len(), 1, "one transaction, one position");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmapped_tables_cause_no_writes() {
    let env = Env::new("unmapped", RedisKind::Standalone);
    env.exec(ITEMS).await;
    env.exec("CREATE TABLE other (id INT PRIMARY KEY, v INT)").await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    env.exec("INSERT INTO other VALUES (1, 1), (2, 2)").await;
    env.exec("UPDATE other SET v = 3").await;
    let v = env.exec_v("INSERT INTO items (id) VALUES (99)").await; // marker, committed after the others
    let mut r = env.redis_client();
    let marker = format!("{}:item:99", env.prefix);
    assert_eq!(block(|| r.wait_version(&marker, v)), v);
    let keys: Vec<String> = match &mut r {
        RedisClient::Standalone(c) => redis::cmd("KEYS").arg(format!("{}:*", env.prefix)).query(c).unwrap(),
        RedisClient::Cluster(_) => unreachable!(),
    };
    let mut keys = keys;
    keys.sort();
    assert_eq!(keys, vec![format!("{marker}:r0"), format!("{marker}:ver")]);
    let events = block(|| read_events(&env.topic, 2));
    assert_eq!(events.len(), 1, "only the mapped table produced an event: {events:?}");
    assert!(run.stats.source.rows.load(std::sync::atomic::Ordering::Relaxed) == 1, "unmapped rows are not decoded");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_between_changes_misses_nothing() {
    let env = Env::new("restart", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let mapping = items_mapping(2);
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();

    let run = start_pipeline(&env, &start, &mapping);
    let v1 = env.exec_v("INSERT INTO items (id, title) VALUES (1, 'before stop')").await;
    assert_eq!(block(|| r.wait_version(&k(1), v1)), v1);
    run.stop().await;

    // Changes while binval is down.
    let v2 = env.exec_v("INSERT INTO items (id, title) VALUES (2, 'while down')").await;
    let v3 = env.exec_v("UPDATE items SET title = 'changed while down' WHERE id = 1").await;

    // The configured start is ignored now: the checkpoint wins.
    let run = start_pipeline(&env, &start, &mapping);
    assert_eq!(block(|| r.wait_version(&k(2), v2)), v2);
    assert_eq!(block(|| r.wait_version(&k(1), v3)), v3, "the change made while down is applied");
    let v: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(1), 1)).unwrap()).unwrap();
    assert_eq!(v["title"], json!("changed while down"));
    let v4 = env.exec_v("INSERT INTO items (id) VALUES (3)").await;
    assert_eq!(block(|| r.wait_version(&k(3), v4)), v4);
    run.stop().await;
    let cp = block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).expect("checkpoint saved in Redis");
    let cp: serde_json::Value = serde_json::from_str(&cp).unwrap();
    assert!(cp["file"].as_str().unwrap().starts_with("mysql-bin."));
    assert!(cp["gtid"].as_str().is_some());
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(block(|| r.version(&k(1))), v3, "a clean stop changes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_and_drop_of_a_mapped_table_invalidate_every_key() {
    let env = Env::new("ddl", RedisKind::Cluster);
    env.exec(ITEMS).await;
    env.exec("CREATE TABLE other (id INT PRIMARY KEY)").await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(2));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    env.exec("INSERT INTO items (id) VALUES (1)").await;
    // A column change marks the keys stale like TRUNCATE (tests/invalidation.rs has each form).
    let va = env.exec_v("ALTER TABLE items ADD COLUMN extra INT DEFAULT 7").await;
    env.exec("TRUNCATE other").await; // unmapped: fine
    env.exec("DROP TABLE other").await;
    let v = env.exec_v("INSERT INTO items (id) VALUES (2)").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&k(2), v)), v);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(2), 0)).unwrap()).unwrap();
    assert_eq!(row["extra"], json!(7), "the new column follows from the TABLE_MAP");

    // TRUNCATE: every key of the table is marked stale at the statement's position (no payload
    // left to serve), one `truncate` event per key template; later inserts apply normally.
    let vt = env.exec_v("TRUNCATE TABLE items").await;
    for id in [1, 2] {
        assert_eq!(block(|| r.wait_version(&k(id), vt)), vt, "item {id}: token moved to the TRUNCATE");
        for i in 0..2 {
            assert_eq!(block(|| r.record(&k(id), i)), (None, Some(vt), false), "item {id} r{i}: stale marker");
        }
    }
    let v3 = env.exec_v("INSERT INTO items (id, title) VALUES (1, 'after truncate')").await;
    assert_eq!(block(|| r.wait_version(&k(1), v3)), v3);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(1), 1)).unwrap()).unwrap();
    assert_eq!(row["title"], json!("after truncate"));
    let events = block(|| read_events(&env.topic, 5));
    let mut trunc: Vec<_> = events.iter().filter(|e| e.op == Op::Truncate).collect();
    trunc.sort_by_key(|e| e.version);
    assert_eq!(trunc.iter().map(|e| e.version).collect::<Vec<_>>(), [va, vt], "the ALTER's and the TRUNCATE's: {events:?}");
    let trunc = &trunc[1..];
    assert_eq!(trunc[0].key, format!("{}:item:{{id}}", env.prefix), "a truncate event names the key template");
    assert_eq!(trunc[0].version, vt);
    assert_eq!(trunc[0].table, format!("{}.items", env.db));

    // DROP TABLE: the same.
    let vd = env.exec_v("DROP TABLE items").await;
    assert_eq!(block(|| r.wait_version(&k(1), vd)), vd);
    assert_eq!(block(|| r.record(&k(1), 0)), (None, Some(vd), false));

    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_of_a_mapped_table_is_followed_across_restarts() {
    let env = Env::new("rename", RedisKind::Standalone);
    env.exec(ITEMS).await;
    env.exec("CREATE TABLE tags (id INT PRIMARY KEY, name VARCHAR(20))").await;
    let start = env.binlog_now().await;
    let mapping = format!("{}\n[[mappings]]\ntable = \"{{db}}.tags\"\nkeys = [\"{{p}}:tag:{{id}}\"]\n", items_mapping(1));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    let run = start_pipeline(&env, &start, &mapping);
    // Streaming (its start check of the mappings done) before the RENAME.
    let v1 = env.exec_v("INSERT INTO items (id, title) VALUES (1, 'one')").await;
    assert_eq!(block(|| r.wait_version(&k(1), v1)), v1);
    env.exec("RENAME TABLE items TO goods").await;
    let v = env.exec_v("INSERT INTO goods (id, title) VALUES (2, 'two')").await;
    assert_eq!(block(|| r.wait_version(&k(2), v)), v, "rows of the renamed table still map to the items keys");
    run.stop().await;
    let cp: serde_json::Value =
        serde_json::from_str(&block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).unwrap()).unwrap();
    assert_eq!(cp["renamed"][format!("{}.goods", env.db)], json!(format!("{}.items", env.db)), "{cp}");
    // `check` reads the renames of the checkpoint as `run` does: the mapping of `items` is
    // checked against `goods` (it used to be refused: no table `items`).
    let config = env.write_config(&env.config_toml(&start, &mapping));
    let (code, out, err) = block(|| binval_cli(&["check", "--config", config.to_str().unwrap()], &[]));
    assert_eq!(code, 0, "check with a followed rename: {out}{err}");
    assert!(!out.contains("mapping problem"), "{out}");

    // After a restart (from the checkpoint) the new name is still followed; a new table under
    // the old name is not mapped any more.
    let run = start_pipeline(&env, &start, &mapping);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(100))").await;
    env.exec("INSERT INTO items (id, title) VALUES (7, 'new table, old name')").await;
    let v = env.exec_v("UPDATE goods SET title = 'uno' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&k(1), v)), v);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(1), 0)).unwrap()).unwrap();
    assert_eq!(row["title"], json!("uno"));
    assert_eq!(block(|| r.version(&k(7))), 0, "the new `items` table is not the mapped one");

    // Renaming onto another mapped table's name would mix two tables' keys: binval stops.
    env.exec("DROP TABLE tags").await;
    env.exec("RENAME TABLE goods TO tags").await;
    let e = run.expect_error(20).await;
    assert!(!e.is_transient());
    let m = e.to_string();
    assert!(m.contains("RENAME TABLE") && m.contains(&format!("{}.tags", env.db)) && m.contains("mysql-bin."), "{m}");
}

/// A typo in a mapping (a table or a key column the source does not have) stops `run` at start
/// with an error naming the mapping field and the similar table, as `binval check` does; it
/// used to warn, report ready and stream nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_mapping_the_source_does_not_match() {
    let env = Env::new("typo", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, "[[mappings]]\ntable = \"{db}.itemz\"\nkeys = [\"{p}:item:{id}\"]\n");
    let e = run.expect_error(20).await;
    assert!(!e.is_transient(), "{e}");
    let m = e.to_string();
    assert!(m.contains("mappings[0].table") && m.contains(&format!("`{}.items`", env.db)) && m.contains("created_later"), "{m}");

    let run = start_pipeline(&env, &start, "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{idd}\"]\n");
    let m = run.expect_error(20).await.to_string();
    assert!(m.contains("mappings[0].keys[0]") && m.contains("`idd`"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_failure_stops_an_idle_pipeline_at_once() {
    let env = Env::new("sinkfail", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    let key = format!("{}:item:1", env.prefix);
    // Make the version token a hash: the version script then fails with WRONGTYPE (definite).
    let mut r = env.redis_client();
    if let RedisClient::Standalone(c) = &mut r {
        let _: () = redis::cmd("HSET").arg(format!("{key}:ver")).arg("f").arg("v").query(c).unwrap();
    }
    let v = env.exec_v("INSERT INTO items (id) VALUES (1)").await;
    // No further commit: the source sits idle on the binlog, yet the failure must end the run.
    let e = run.expect_error(15).await;
    let m = e.to_string();
    assert!(!e.is_transient() && m.contains("WRONGTYPE") && m.contains(&key), "{m}");
    // The failed transaction was not acknowledged: once the key is repaired, a restart re-reads
    // it from the checkpoint and applies it.
    if let RedisClient::Standalone(c) = &mut r {
        let _: () = redis::cmd("DEL").arg(format!("{key}:ver")).query(c).unwrap();
    }
    let run = start_pipeline(&env, &start, &items_mapping(1));
    assert_eq!(block(|| r.wait_version(&key, v)), v, "the failed change is applied after the restart");
    run.stop().await;
}

/// Run `stmts` on one connection, then close it (a prepared XA transaction outlives it).
/// `XA COMMIT` / `XA ROLLBACK` of a transaction another connection prepared, on a connection of
/// its own; the version of the last transaction committed on it. MariaDB detaches a prepared
/// XA transaction when its connection's thread ends, which may come just after that
/// connection's disconnect returned: until then the XID is unknown here (XAER_NOTA), so that
/// error is retried for a few seconds (it failed a CI run once).
async fn on_detached(env: &Env, stmt: &str) -> u64 {
    use mysql_async::prelude::Queryable;
    let mut c = env.conn().await;
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match c.query_drop(stmt).await {
            Ok(()) => break,
            Err(e) if e.to_string().contains("XAER_NOTA") && Instant::now() < until => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{stmt}: {e}"),
        }
    }
    let v = last_version(&mut c).await;
    c.disconnect().await.ok();
    v
}

async fn xa(env: &Env, stmts: &[&str]) {
    use mysql_async::prelude::Queryable;
    let mut c = env.conn().await;
    for q in stmts {
        c.query_drop(*q).await.unwrap_or_else(|e| panic!("{q}: {e}"));
    }
    c.disconnect().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_transactions_reach_the_cache_at_their_commit_and_never_before() {
    // Issue #12 (7): an XA PREPARE on a mapped table stopped binval for good. Now its changes
    // are held until XA COMMIT (applied, at the commit's position) or XA ROLLBACK (dropped),
    // other transactions flow meanwhile, and a restart in between still applies them.
    let env = Env::new("xa", RedisKind::Standalone);
    env.exec(ITEMS).await;
    env.exec("CREATE TABLE other (id INT PRIMARY KEY)").await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    let title = |r: &mut RedisClient, id: u32| -> Option<serde_json::Value> {
        block(|| r.replica(&k(id), 0)).map(|p| serde_json::from_str::<serde_json::Value>(&p).unwrap()["title"].clone())
    };
    // One-phase XA commit on a mapped table: applied like any transaction.
    xa(&env, &["XA START 'one'", "INSERT INTO items (id, title) VALUES (1, 'xa one phase')", "XA END 'one'", "XA COMMIT 'one' ONE PHASE"])
        .await;
    // Two-phase XA on an unmapped table: passes by.
    xa(&env, &["XA START 'two'", "INSERT INTO other VALUES (1)", "XA END 'two'", "XA PREPARE 'two'", "XA ROLLBACK 'two'"]).await;

    // Two-phase on a mapped table: nothing reaches Redis at the PREPARE; later transactions
    // are applied meanwhile; the XA COMMIT applies it, versioned by the commit.
    xa(
        &env,
        &["XA START 'three'", "UPDATE items SET title = 'prepared, then committed' WHERE id = 1", "XA END 'three'", "XA PREPARE 'three'"],
    )
    .await;
    let v2 = env.exec_v("INSERT INTO items (id, title) VALUES (2, 'meanwhile')").await;
    assert_eq!(block(|| r.wait_version(&k(2), v2)), v2, "transactions after an XA PREPARE are applied");
    assert_eq!(title(&mut r, 1), Some(json!("xa one phase")), "the prepared change is not in the cache");
    let vc = on_detached(&env, "XA COMMIT 'three'").await;
    assert_eq!(block(|| r.wait_version(&k(1), vc)), vc, "applied at the XA COMMIT, with its version");
    assert_eq!(title(&mut r, 1), Some(json!("prepared, then committed")));

    // Prepared, then rolled back: never reaches the cache.
    xa(&env, &["XA START 'four'", "UPDATE items SET title = 'rolled back' WHERE id = 2", "XA END 'four'", "XA PREPARE 'four'"]).await;
    on_detached(&env, "XA ROLLBACK 'four'").await;
    let v3 = env.exec_v("INSERT INTO items (id) VALUES (3)").await;
    assert_eq!(block(|| r.wait_version(&k(3), v3)), v3);
    assert_eq!(title(&mut r, 2), Some(json!("meanwhile")));

    // Restarts between PREPARE and COMMIT: the checkpoint stays at the XA PREPARE's group.
    xa(&env, &["XA START 'five'", "UPDATE items SET title = 'five' WHERE id = 2", "XA END 'five'", "XA PREPARE 'five'"]).await;
    xa(&env, &["XA START 'six'", "UPDATE items SET title = 'six' WHERE id = 3", "XA END 'six'", "XA PREPARE 'six'"]).await;
    let v4 = env.exec_v("INSERT INTO items (id) VALUES (4)").await;
    assert_eq!(block(|| r.wait_version(&k(4), v4)), v4);
    run.stop().await;
    let cp: serde_json::Value =
        serde_json::from_str(&block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).unwrap()).unwrap();
    let open: Vec<&str> = cp["xa"]["open"].as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
    assert_eq!(open, vec!["X'66697665',X'',1", "X'736978',X'',1"], "{cp}");
    let applied = &cp["xa"]["applied"];
    assert!(applied["pos"].as_u64().unwrap() > cp["pos"].as_u64().unwrap() || applied["file"] != cp["file"], "held back: {cp}");
    // 'five' is committed while binval is down, 'six' after it restarted.
    let v5 = on_detached(&env, "XA COMMIT 'five'").await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    assert_eq!(block(|| r.wait_version(&k(2), v5)), v5, "committed while down: applied after the restart");
    assert_eq!(title(&mut r, 2), Some(json!("five")));
    assert_eq!(title(&mut r, 3), Some(json!(null)), "still prepared: not applied");
    let v6 = on_detached(&env, "XA COMMIT 'six'").await;
    assert_eq!(block(|| r.wait_version(&k(3), v6)), v6, "prepared before the restart, committed after it: applied");
    assert_eq!(title(&mut r, 3), Some(json!("six")));
    let v7 = env.exec_v("INSERT INTO items (id) VALUES (7)").await;
    assert_eq!(block(|| r.wait_version(&k(7), v7)), v7);
    run.stop().await;
    let cp: serde_json::Value =
        serde_json::from_str(&block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).unwrap()).unwrap();
    assert!(cp.get("xa").is_none(), "nothing prepared any more: the checkpoint moves freely again: {cp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_types_arrive_as_canonical_json() {
    let env = Env::new("types", RedisKind::Standalone);
    env.exec(
        "CREATE TABLE t (id INT PRIMARY KEY, ti TINYINT, mi MEDIUMINT, bu BIGINT UNSIGNED, d DECIMAL(12,4), f FLOAT, db DOUBLE, \
         dt DATE, dtm DATETIME(6), tm TIME(3), ts TIMESTAMP(2) NULL, y YEAR, bt BIT(10), e ENUM('red','green'), s SET('a','b','c'), \
         bin BINARY(4), vb VARBINARY(8), l1 VARCHAR(10) CHARACTER SET latin1, u2 VARCHAR(10) CHARACTER SET ucs2, emoji VARCHAR(10) CHARACTER SET utf8mb4, \
         tx TEXT, n INT)",
    )
    .await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, "[[mappings]]\ntable = \"{db}.t\"\nkeys = [\"{p}:t:{id}\"]\n");
    env.exec("SET time_zone = '+00:00'").await;
    let v = env
        .exec_v(
            "INSERT INTO t VALUES (1, -128, -8388608, 18446744073709551615, -12345678.0100, 0.1, 2.5, \
         '2024-02-29', '2024-02-29 23:59:59.000001', '-838:59:58.123', '2038-01-19 03:14:07.99', 0, b'1000000001', 'green', 'a,c', \
         'ab', x'00ff00', 'café', 'AB', '🎉', 'multi\nline', NULL)",
        )
        .await;
    let key = format!("{}:t:1", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&key, v)), v);
    let v: serde_json::Value = serde_json::from_str(&block(|| r.replica(&key, 0)).unwrap()).unwrap();
    let want = json!({
        "id": 1, "ti": -128, "mi": -8388608, "bu": 18446744073709551615u64, "d": "-12345678.0100", "f": 0.1, "db": 2.5,
        "dt": "2024-02-29", "dtm": "2024-02-29 23:59:59.000001", "tm": "-838:59:58.123", "ts": "2038-01-19T03:14:07.99Z", "y": 0,
        "bt": 513, "e": "green", "s": ["a", "c"], "bin": "YWIAAA==", "vb": "AP8A", "l1": "café", "u2": "AB", "emoji": "🎉",
        "tx": "multi\nline", "n": null
    });
    assert_eq!(v, want);
    // A loader using binval_protocol's payload helper on a SELECT of the same row gives the very
    // bytes binval wrote (the consumer's `payload::result_set::row_payload`, feature `mysql`).
    let written = block(|| r.replica(&key, 0)).unwrap();
    let mut c = env.conn().await;
    use mysql_async::prelude::Queryable;
    c.query_drop("SET NAMES utf8mb4, time_zone = '+00:00'").await.unwrap();
    let row: mysql_async::Row = c.exec_first(format!("SELECT * FROM `{}`.t WHERE id = ?", env.db), (1,)).await.unwrap().unwrap();
    let columns = row.columns();
    let loaded = binval_protocol::payload::result_set::row_payload(&format!("{}.t", env.db), &columns, row.unwrap(), None, &[]).unwrap();
    assert_eq!(loaded, written, "the loader's payload is binval's, byte for byte");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_follows_binlog_rotation_while_idle() {
    let env = Env::new("rotate", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    env.exec("FLUSH BINARY LOGS").await;
    let now = env.binlog_now().await;
    let (file, _) = now.rsplit_once(':').unwrap();
    let mut r = env.redis_client();
    let key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let cp: serde_json::Value = block(|| r.get(&key)).map(|t| serde_json::from_str(&t).unwrap()).unwrap_or_default();
        if cp["file"].as_str().is_some_and(|f| f >= file) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "checkpoint {cp} still before {file}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And changes in the new file still arrive.
    let v = env.exec_v("INSERT INTO items (id) VALUES (1)").await;
    assert_eq!(block(|| r.wait_version(&format!("{}:item:1", env.prefix), v)), v);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_replica_connection_reconnects_and_misses_nothing() {
    let env = Env::new("reconnect", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    let v1 = env.exec_v("INSERT INTO items (id) VALUES (1)").await;
    assert_eq!(block(|| r.wait_version(&k(1), v1)), v1);
    // Kill the binlog dump threads on the server (ours among them; the server does not show
    // which server_id a dump thread serves; other pipelines reconnect the same way).
    let ids = tk::mariadb().sql("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'").unwrap();
    let dump_ids: Vec<&str> = ids.lines().collect();
    assert!(!dump_ids.is_empty(), "a binlog dump thread serves binval");
    for id in &dump_ids {
        let _ = tk::mariadb().sql(&format!("KILL CONNECTION {id}"));
    }
    let v2 = env.exec_v("INSERT INTO items (id) VALUES (2)").await;
    let v3 = env.exec_v("UPDATE items SET title = 'after reconnect' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&k(2), v2)), v2, "change made while reconnecting arrives");
    assert_eq!(block(|| r.wait_version(&k(1), v3)), v3);
    assert!(run.stats.source.reconnects.load(std::sync::atomic::Ordering::Relaxed) >= 1, "the source reconnected");
    assert_eq!(block(|| r.version(&k(1))), v3, "a re-applied change (allowed: at-least-once) never moves a token");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_json_columns_become_documents() {
    let env = Env::new("json", RedisKind::Standalone);
    env.exec("CREATE TABLE docs (id INT PRIMARY KEY, doc JSON, note TEXT)").await;
    env.exec("CREATE TABLE raw (id INT PRIMARY KEY, doc JSON)").await;
    let start = env.binlog_now().await;
    let mapping = "[[mappings]]\ntable = \"{db}.docs\"\nkeys = [\"{p}:doc:{id}\"]\n\n[[mappings]]\ntable = \"{db}.raw\"\nkeys = [\"{p}:raw:{id}\"]\njson_columns = []\n";
    let run = start_pipeline(&env, &start, mapping);
    let text = r#"{"a": [1, 2.5, null], "b": {"c": "é"}, "n": 123456789012345678901234567890, "price": 19.90}"#;
    env.exec(&format!("INSERT INTO docs VALUES (1, '{text}', '{text}')")).await;
    let v = env.exec_v(&format!("INSERT INTO raw VALUES (1, '{text}')")).await;
    let mut r = env.redis_client();
    let (kd, kr) = (format!("{}:doc:1", env.prefix), format!("{}:raw:1", env.prefix));
    assert_eq!(block(|| r.wait_version(&kr, v)), v);
    let payload = block(|| r.replica(&kd, 0)).unwrap();
    assert!(payload.contains(&format!("\"doc\":{text}")), "the document is embedded exactly as stored (every digit, the scale): {payload}");
    let row: serde_json::Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(row["doc"]["b"], json!({"c": "é"}), "a JSON column is the document itself");
    assert_eq!(row["note"], json!(text), "a TEXT column stays text");
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&kr, 0)).unwrap()).unwrap();
    assert_eq!(row["doc"], json!(text), "json_columns = [] turns detection off");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_schema_change_cut_over_comments_and_create_or_replace_keep_keys_correct() {
    let env = Env::new("osc", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &items_mapping(1));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let mut r = env.redis_client();
    let v = env.exec_v("INSERT INTO items (id, title) VALUES (1, 'v1')").await;
    assert_eq!(block(|| r.wait_version(&k(1), v)), v);

    // gh-ost / pt-osc cut-over: the mapping stays with the name, the swapped-in table's keys
    // are marked stale, and later changes of the new table are applied.
    env.exec("CREATE TABLE items_gho LIKE items").await;
    env.exec("INSERT INTO items_gho SELECT * FROM items").await;
    let vs = env.exec_v("RENAME TABLE items TO items_del, items_gho TO items").await;
    assert_eq!(block(|| r.wait_version(&k(1), vs)), vs, "cut-over marks the keys stale");
    let v2 = env.exec_v("UPDATE items SET title = 'after swap' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&k(1), v2)), v2, "the new table under the mapped name is followed");
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k(1), 0)).unwrap()).unwrap();
    assert_eq!(row["title"], json!("after swap"));
    env.exec("UPDATE items_del SET title = 'old table' WHERE id = 1").await;

    // TRUNCATE behind a comment, and MariaDB's CREATE OR REPLACE TABLE.
    let vt = env.exec_v("/* app:cleanup */ TRUNCATE TABLE items").await;
    assert_eq!(block(|| r.wait_version(&k(1), vt)), vt, "a commented TRUNCATE is recognised");
    let v3 = env.exec_v("INSERT INTO items (id, title) VALUES (3, 'x')").await;
    assert_eq!(block(|| r.wait_version(&k(3), v3)), v3);
    let vc = env.exec_v("CREATE OR REPLACE TABLE items (id INT PRIMARY KEY, title VARCHAR(100), price DECIMAL(10,2), stock MEDIUMINT, updated DATETIME(3), note TEXT)").await;
    assert_eq!(block(|| r.wait_version(&k(3), vc)), vc, "CREATE OR REPLACE invalidates the old table's keys");
    assert_eq!(block(|| r.record(&k(3), 0)), (None, Some(vc), false));

    // A key column renamed away: binval stops instead of silently writing no keys.
    env.exec("ALTER TABLE items CHANGE id item_id INT").await;
    env.exec("INSERT INTO items (item_id) VALUES (9)").await;
    let e = run.expect_error(20).await;
    assert!(!e.is_transient());
    let m = e.to_string();
    assert!(m.contains("key column") && m.contains("id") && m.contains(&format!("{}.items", env.db)) && m.contains("mysql-bin."), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_in_the_source_url_connects_over_tcp() {
    // Issue #12 (6): mysql_async's `prefer_socket` default switched a `mysql://user@127.0.0.1`
    // connection to the server's Unix socket behind the operator's back (a proxy or firewall
    // on the TCP port was bypassed). The host of the URL is used unless the URL asks otherwise.
    use mysql_async::prelude::Queryable;
    let host_of = |url: String| async move {
        let cfg: binval::config::SourceConfig = serde_json::from_value(json!({"url": url, "server_id": 1})).unwrap();
        let mut c = binval::binlog::server::connect(&cfg).await.unwrap();
        let host: String =
            c.query_first("SELECT HOST FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()").await.unwrap().unwrap();
        c.disconnect().await.ok();
        host
    };
    let url = tk::mariadb().root_url();
    let host = host_of(url.clone()).await;
    assert!(host.starts_with("127.0.0.1:"), "connected over TCP: {host}");
    let host = host_of(format!("{url}?prefer_socket=true")).await;
    assert_eq!(host, "localhost", "prefer_socket=true in the URL still asks for the socket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_long_unique_hash_columns_stay_out_of_the_payload() {
    // Issue #12 (4): a UNIQUE key on a TEXT column makes MariaDB add a hidden column
    // `DB_ROW_HASH_1` (SELECT * does not show it), which the binlog carries; it was in every
    // payload. A user's own column of that name is kept.
    let env = Env::new("rowhash", RedisKind::Standalone);
    env.exec("CREATE TABLE t (id INT PRIMARY KEY, body TEXT, UNIQUE KEY (body))").await;
    env.exec("CREATE TABLE u (id INT PRIMARY KEY, DB_ROW_HASH_1 BIGINT, b TEXT, UNIQUE KEY (b))").await;
    let start = env.binlog_now().await;
    let mapping =
        "[[mappings]]\ntable = \"{db}.t\"\nkeys = [\"{p}:t:{id}\"]\n\n[[mappings]]\ntable = \"{db}.u\"\nkeys = [\"{p}:u:{id}\"]\n";
    let run = start_pipeline(&env, &start, mapping);
    env.exec("INSERT INTO t VALUES (1, 'hello')").await;
    let v = env.exec_v("INSERT INTO u VALUES (1, 42, 'world')").await;
    let mut r = env.redis_client();
    let (kt, ku) = (format!("{}:t:1", env.prefix), format!("{}:u:1", env.prefix));
    assert_eq!(block(|| r.wait_version(&ku, v)), v);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&kt, 0)).unwrap()).unwrap();
    assert_eq!(row, json!({"id": 1, "body": "hello"}), "the hidden hash column is not in the payload");
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&ku, 0)).unwrap()).unwrap();
    assert_eq!(row, json!({"id": 1, "DB_ROW_HASH_1": 42, "b": "world"}), "the user's column is; the hidden DB_ROW_HASH_2 is not");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_position_inside_a_transaction_starts_at_the_transaction() {
    // Issue #12 (2): `source.start = "FILE:POS"` at a row event (its TABLE_MAP just before)
    // dropped that event's rows without a word. A start inside a transaction is moved back to
    // the transaction's first event; a start inside an event is refused.
    let env = Env::new("midtxn", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let before = env.binlog_now().await;
    let v = env.exec_v("INSERT INTO items (id, title) VALUES (1, 'first'), (2, 'second')").await;
    let at_rows = row_event_position(&before, &format!("{}.items", env.db));
    let run = start_pipeline(&env, &at_rows, &items_mapping(1));
    let v2 = env.exec_v("INSERT INTO items (id) VALUES (3)").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&format!("{}:item:3", env.prefix), v2)), v2);
    assert_eq!(block(|| r.version(&format!("{}:item:1", env.prefix))), v, "the transaction the start position was in is applied whole");
    assert_eq!(block(|| r.version(&format!("{}:item:2", env.prefix))), v);
    run.stop().await;
    let cp: serde_json::Value =
        serde_json::from_str(&block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).unwrap()).unwrap();
    assert!(cp["file"].is_string(), "{cp}");

    // The reader itself, opened there (as a checkpoint never would be), stops instead of
    // passing the transaction on without its first rows.
    let (file, pos) = at_rows.rsplit_once(':').unwrap();
    let resume = binval::binlog::resume::Resume::FilePos(binval_protocol::SourcePosition {
        file: file.into(),
        pos: pos.parse().unwrap(),
        gtid: None,
    });
    let cfg = env.config(&before, &items_mapping(1));
    let mapper = std::sync::Arc::new(binval::mapping::Mapper::new(&cfg.mappings).unwrap());
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let read = binval::binlog::reader::run(cfg.source, mapper, Default::default(), resume, None, tx, stop_rx, Default::default());
    let e = tokio::time::timeout(Duration::from_secs(20), read).await.expect("the reader stops by itself").unwrap_err();
    assert!(!e.is_transient() && e.to_string().contains("started inside a transaction"), "{e}");

    // Inside an event: refused, naming the position.
    let env = Env::new("midevent", RedisKind::Standalone);
    env.exec(ITEMS).await; // the mapping must match (run refuses a missing table at start)
    let (file, pos) = at_rows.rsplit_once(':').unwrap();
    let inside = format!("{file}:{}", pos.parse::<u64>().unwrap() + 3);
    let e = start_pipeline(&env, &inside, &items_mapping(1)).expect_error(20).await;
    assert!(!e.is_transient() && e.to_string().contains(&inside) && e.to_string().contains("not an event boundary"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_swap_between_two_mapped_tables_is_never_silent() {
    // Issue #12 (1): with `acct` and `acct_new` both mapped, the cut-over `RENAME TABLE acct TO
    // acct_old, acct_new TO acct` left the `an:` keys stale without a word. Now: a mapping
    // whose name keeps a table stays with the name (its keys marked stale); a mapping whose
    // table moves onto another mapping's name would mix two mappings on one table: binval stops.
    let env = Env::new("swap", RedisKind::Standalone);
    env.exec("CREATE TABLE acct (id INT PRIMARY KEY, bal INT)").await;
    env.exec("CREATE TABLE acct_new (id INT PRIMARY KEY, bal INT)").await;
    env.exec("CREATE TABLE x (id INT PRIMARY KEY, v INT)").await;
    env.exec("CREATE TABLE y (id INT PRIMARY KEY, v INT)").await;
    let start = env.binlog_now().await;
    let mapping = "[[mappings]]\ntable = \"{db}.acct\"\nkeys = [\"{p}:a:{id}\"]\n\n[[mappings]]\ntable = \"{db}.acct_new\"\nkeys = [\"{p}:an:{id}\"]\n\n\
                   [[mappings]]\ntable = \"{db}.x\"\nkeys = [\"{p}:x:{id}\"]\n\n[[mappings]]\ntable = \"{db}.y\"\nkeys = [\"{p}:y:{id}\"]\n";
    let run = start_pipeline(&env, &start, mapping);
    let mut r = env.redis_client();
    let k = |t: &str, id: u32| format!("{}:{t}:{id}", env.prefix);

    // A true swap of two mapped tables (through a temporary name): each mapping stays with its
    // name, and the keys of both are marked stale; later rows go by name.
    env.exec("INSERT INTO x VALUES (1, 10)").await;
    let v = env.exec_v("INSERT INTO y VALUES (1, 20)").await;
    assert_eq!(block(|| r.wait_version(&k("y", 1), v)), v);
    let vs = env.exec_v("RENAME TABLE x TO tmp, y TO x, tmp TO y").await;
    for t in ["x", "y"] {
        assert_eq!(block(|| r.wait_version(&k(t, 1), vs)), vs, "{t}: keys marked stale at the swap");
        assert_eq!(block(|| r.record(&k(t, 1), 0)), (None, Some(vs), false), "{t}: stale marker");
    }
    let v2 = env.exec_v("UPDATE x SET v = 21 WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&k("x", 1), v2)), v2, "the table now named x maps to x:*");
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k("x", 1), 0)).unwrap()).unwrap();
    assert_eq!(row, json!({"id": 1, "v": 21}));

    // The cut-over onto another mapped table's name: stopped, naming both mappings.
    env.exec("INSERT INTO acct VALUES (1, 100)").await;
    let v = env.exec_v("INSERT INTO acct_new VALUES (2, 200)").await;
    assert_eq!(block(|| r.wait_version(&k("an", 2), v)), v);
    env.exec("RENAME TABLE acct TO acct_old, acct_new TO acct").await;
    env.exec("UPDATE acct SET bal = 250 WHERE id = 2").await;
    let e = run.expect_error(20).await;
    assert!(!e.is_transient());
    let m = e.to_string();
    assert!(m.contains("RENAME TABLE") && m.contains(&format!("{}.acct_new", env.db)) && m.contains(&format!("{}.acct", env.db)), "{m}");
    assert_eq!(block(|| r.version(&k("an", 2))), v, "nothing after the statement was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_json_columns_are_detected_at_event_time() {
    // Issue #12 (3): JSON columns were detected once, at start: a mapped table created later,
    // or `ALTER TABLE ... ADD COLUMN j JSON`, gave the document as a string until a restart.
    // Now each DDL on a mapped table refreshes the detection at its place in the binlog: rows
    // before the DDL keep the old shape, rows after it get the new one.
    let env = Env::new("jsonddl", RedisKind::Standalone);
    env.exec("CREATE TABLE docs (id INT PRIMARY KEY, t LONGTEXT)").await;
    let start = env.binlog_now().await;
    let mapping = "[[mappings]]\ntable = \"{db}.docs\"\nkeys = [\"{p}:doc:{id}\"]\n\n[[mappings]]\ntable = \"{db}.later\"\nkeys = [\"{p}:later:{id}\"]\ncreated_later = true\n";
    let run = start_pipeline(&env, &start, mapping);
    let doc = r#"{"amount": 105.0}"#;
    let mut r = env.redis_client();
    let k = |t: &str, id: u32| format!("{}:{t}:{id}", env.prefix);
    let payload = |r: &mut RedisClient, key: String| block(|| r.replica(&key, 0)).unwrap();
    // Each row is read back before the next ALTER, which marks it stale (a column change).
    // Before any DDL: `t` is text.
    let v = env.exec_v(&format!("INSERT INTO docs VALUES (1, '{doc}')")).await;
    assert_eq!(block(|| r.wait_version(&k("doc", 1), v)), v);
    assert_eq!(payload(&mut r, k("doc", 1)), format!(r#"{{"id":1,"t":"{}"}}"#, doc.replace('"', "\\\"")), "before the DDLs: text");
    env.exec("ALTER TABLE docs ADD COLUMN j JSON").await;
    let v = env.exec_v(&format!("INSERT INTO docs VALUES (2, '{doc}', '{doc}')")).await;
    assert_eq!(block(|| r.wait_version(&k("doc", 2), v)), v);
    assert_eq!(
        payload(&mut r, k("doc", 2)),
        format!(r#"{{"id":2,"j":{doc},"t":"{}"}}"#, doc.replace('"', "\\\"")),
        "after ADD COLUMN j JSON: j is a document, t still text"
    );
    env.exec("ALTER TABLE docs MODIFY t JSON").await;
    env.exec(&format!("INSERT INTO docs VALUES (3, '{doc}', '{doc}')")).await;
    env.exec("CREATE TABLE later (id INT PRIMARY KEY, doc JSON)").await;
    let v = env.exec_v(&format!("INSERT INTO later VALUES (1, '{doc}')")).await;
    assert_eq!(block(|| r.wait_version(&k("later", 1), v)), v);
    assert_eq!(payload(&mut r, k("doc", 3)), format!(r#"{{"id":3,"j":{doc},"t":{doc}}}"#), "after MODIFY t JSON: both documents");
    assert_eq!(payload(&mut r, k("later", 1)), format!(r#"{{"doc":{doc},"id":1}}"#), "a mapped table created after start");
    run.stop().await;

    let cp: serde_json::Value =
        serde_json::from_str(&block(|| r.get(&format!("binval:{{{}}}:checkpoint", env.source_name))).unwrap()).unwrap();
    assert!(cp["json_columns"][format!("{}.docs", env.db)].is_array(), "the checkpoint keeps what the reader knew: {cp}");

    // While binval is down, `j` stops being JSON without changing its type or collation (the
    // TABLE_MAP cannot show it): rows written before that still get it as a document after the
    // restart (the checkpoint's knowledge), rows after it as text (the DDL's). The ALTER then
    // marks row 5 stale (a column change), so what binval wrote for it before is not in Redis
    // any more; the stale mark at the ALTER's position is.
    env.exec(&format!("INSERT INTO docs VALUES (5, '{doc}', '{doc}')")).await;
    let va = env.exec_v("ALTER TABLE docs MODIFY j LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin").await;
    env.exec(&format!("INSERT INTO docs VALUES (6, '{doc}', '{doc}')")).await;
    let run = start_pipeline(&env, &start, mapping);
    let v = env.exec_v("INSERT INTO later VALUES (2, NULL)").await;
    assert_eq!(block(|| r.wait_version(&k("later", 2), v)), v);
    assert_eq!(block(|| r.record(&k("doc", 5), 0)), (None, Some(va), false), "row 5 marked stale by the ALTER");
    assert_eq!(
        payload(&mut r, k("doc", 6)),
        format!(r#"{{"id":6,"j":"{}","t":{doc}}}"#, doc.replace('"', "\\\"")),
        "written after j became text"
    );
    run.stop().await;
}
