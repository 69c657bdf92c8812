//! The batched event format (`kafka.event_format = "batched"`) end to end on the real services:
//! changes in MariaDB -> binval (in-process pipeline) -> batch messages on a tansu topic -> an
//! app instance (binval-consumer) that evicts and reads the new values; and the rolling upgrade
//! from `per_key` to `batched` on one topic while an app keeps reading. Values are asserted,
//! never timings (the timeouts only bound a wait that would otherwise hang).

mod pipeline_env;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use binval::kafka::Partitioner;
use binval_consumer::{Consumer, EvictionNotice};
use binval_protocol::{BatchView, InvalidationEvent, KIND_BATCH, KIND_HEADER};
use pipeline_env::*;
use rdkafka::message::Headers;
use rdkafka::Message;
use tokio::sync::broadcast;

const ITEMS: &str = "CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50), price DECIMAL(8,2))";
const MAPPING: &str = items_mapping!(4);

/// The test's config with `kafka.event_format = format`.
fn config(env: &Env, start: &str, format: &str) -> binval::config::Config {
    let text =
        env.config_toml(start, MAPPING).replace("create_topic = false\n", &format!("create_topic = false\nevent_format = \"{format}\"\n"));
    binval::config::Config::from_toml(&text).expect("test config is valid")
}

async fn app(env: &Env) -> Consumer {
    let b = Consumer::builder()
        .brokers(tk::broker().bootstrap())
        .topic(env.topic.clone())
        .replicas(4)
        .kafka_property("fetch.wait.max.ms", "5")
        // These tests are about events, not the fail safe.
        .max_staleness(Some(Duration::from_secs(30)));
    let b = match env.redis {
        RedisKind::Standalone => b.redis_standalone(tk::redis().url()),
        RedisKind::Cluster => b.redis_cluster(tk::redis_cluster().urls()),
    };
    b.build().await.expect("consumer starts")
}

/// The notice of `key` at `version` or newer: one already in `seen`, or the next one received
/// (bounded wait); every notice received meanwhile goes to `seen`.
async fn notice_of(
    sub: &mut broadcast::Receiver<EvictionNotice>,
    key: &str,
    version: u64,
    seen: &mut Vec<EvictionNotice>,
) -> EvictionNotice {
    if let Some(n) = seen.iter().find(|n| n.key == key && n.version >= version) {
        return n.clone();
    }
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let n = sub.recv().await.expect("eviction channel open");
            seen.push(n.clone());
            if n.key == key && n.version >= version {
                return n;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no notice of {key} at {version}"))
}

/// Every message of `topic` (3 partitions) from the beginning until `want` key changes were
/// read (or 20 s passed): per message its partition, whether it was a batch, and its changes.
fn topic_changes(topic: &str, want: usize) -> Vec<(i32, bool, Vec<InvalidationEvent>)> {
    let c = reader_from_start(&tk::broker().bootstrap(), topic, 3);
    let (mut out, mut n) = (Vec::new(), 0);
    let until = Instant::now() + Duration::from_secs(20);
    while n < want && Instant::now() < until {
        let Some(Ok(m)) = c.poll(Duration::from_millis(100)) else { continue };
        if is_progress(&m) {
            continue;
        }
        let batch = m.headers().is_some_and(|h| h.iter().any(|h| h.key == KIND_HEADER && h.value == Some(KIND_BATCH.as_bytes())));
        let evs = if batch {
            assert!(m.key().is_none(), "a batch has no message key");
            BatchView::parse(m.payload().unwrap()).expect("binval's batch parses").to_events()
        } else {
            vec![InvalidationEvent::from_json(m.payload().unwrap()).expect("binval's event parses")]
        };
        n += evs.len();
        out.push((m.partition(), batch, evs));
    }
    out
}

/// Every key's changes are on the partition librdkafka's default partitioner gives its key,
/// whichever format carried them.
fn assert_partitions_of_keys(messages: &[(i32, bool, Vec<InvalidationEvent>)]) {
    for (p, batch, evs) in messages {
        for ev in evs {
            assert_eq!(Partitioner::Crc32.partition(ev.key.as_bytes(), 3), *p, "{} (batch: {batch}) is on partition {p}", ev.key);
        }
    }
}

/// (a) Batched end to end: a multi-key transaction evicts every key it changed from the app's
/// local cache and the next reads return the new values; a TRUNCATE evicts the table's keys;
/// the topic holds batch messages only, each key on its partitioner's partition, and one
/// message per partition for the multi-key transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_events_evict_end_to_end() {
    let env = Env::new("batched", RedisKind::Cluster);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = pipeline_env::start(config(&env, &start, "batched"));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let ids = [1u32, 2, 3, 4, 5, 6];
    let v1 = env.exec_v("INSERT INTO items VALUES (1,'a',1.00),(2,'b',2.00),(3,'c',3.00),(4,'d',4.00),(5,'e',5.00),(6,'f',6.00)").await;
    let mut r = env.redis_client();
    for id in ids {
        assert_eq!(block(|| r.wait_version(&k(id), v1)), v1);
    }
    let a = app(&env).await;
    for id in ids {
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().expect("filled from a replica");
        assert_eq!(v["title"], ((b'a' + id as u8 - 1) as char).to_string());
        assert_eq!(a.cached_version(&k(id)), Some(v1));
    }
    let mut sub = a.subscribe_evictions();
    let mut seen = Vec::new();

    // One transaction changing five keys (and inserting a sixth nobody cached).
    let mut c = env.conn().await;
    use mysql_async::prelude::Queryable;
    c.query_drop("BEGIN").await.unwrap();
    c.query_drop("UPDATE items SET price = price + 10 WHERE id IN (1, 2, 3)").await.unwrap();
    c.query_drop("UPDATE items SET title = 'changed' WHERE id = 4").await.unwrap();
    c.query_drop("DELETE FROM items WHERE id = 5").await.unwrap();
    c.query_drop("INSERT INTO items VALUES (7, 'g', 7.00)").await.unwrap();
    c.query_drop("COMMIT").await.unwrap();
    let v2 = last_version(&mut c).await;
    c.disconnect().await.ok();
    for id in [1u32, 2, 3, 4, 5] {
        let n = notice_of(&mut sub, &k(id), v2, &mut seen).await;
        assert!(n.evicted, "{} was cached and evicted", k(id));
        assert_eq!(n.version, v2);
    }
    for id in [1u32, 2, 3] {
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert_eq!(v["price"], format!("{}.00", id + 10), "the next read returns the database's value");
        assert_eq!(a.cached_version(&k(id)), Some(v2));
    }
    let v: serde_json::Value = a.get_json(&k(4)).await.unwrap().unwrap();
    assert_eq!(v["title"], "changed");
    assert_eq!(a.get(&k(5)).await.unwrap(), None, "deleted");
    assert_eq!(a.cached_version(&k(6)), Some(v1), "an unchanged key stays cached");

    // TRUNCATE: every cached key of the table evicted, the next read finds no row.
    let vt = env.exec_v("TRUNCATE TABLE items").await;
    let template = format!("{}:item:{{id}}", env.prefix);
    let n = notice_of(&mut sub, &template, vt, &mut seen).await;
    assert!(n.evicted);
    for id in [1u32, 2, 3, 4, 6] {
        assert_eq!(a.cached_version(&k(id)), None, "{} evicted by the truncate", k(id));
    }
    assert_eq!(a.get(&k(6)).await.unwrap(), None, "the row is gone");
    assert_eq!(a.stats().bad_messages, 0);

    // On the topic: batches only; the multi-key transaction's changes in one message per
    // partition; every key on its partitioner's partition.
    let messages = topic_changes(&env.topic, 6 + 6 + 1);
    assert!(messages.iter().all(|(_, batch, _)| *batch), "only batch messages");
    assert_partitions_of_keys(&messages);
    let of_v2: Vec<(i32, usize)> =
        messages.iter().filter(|(_, _, evs)| evs.iter().any(|e| e.version == v2)).map(|(p, _, evs)| (*p, evs.len())).collect();
    let parts: BTreeSet<i32> = of_v2.iter().map(|(p, _)| *p).collect();
    assert_eq!(parts.len(), of_v2.len(), "one message per partition for one transaction: {of_v2:?}");
    assert_eq!(of_v2.iter().map(|(_, n)| n).sum::<usize>(), 6, "six keys changed: {of_v2:?}");
    a.shutdown().await;
    run.stop().await;
}

/// (c) Rolling upgrade: an app (with batch support) reads one topic while binval runs with
/// `per_key`, is stopped, and restarts from its checkpoint with `batched`. Changes before,
/// during (binval down) and after the switch are all evicted and read back with the
/// database's values; per key, the app sees versions in order across formats; every key stays
/// on one partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_from_per_key_to_batched() {
    let env = Env::new("upgrade", RedisKind::Standalone);
    env.exec(ITEMS).await;
    env.exec("INSERT INTO items VALUES (1,'one',1.00),(2,'two',2.00),(3,'three',3.00),(4,'four',4.00)").await;
    let start = env.binlog_now().await;
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let ids = [1u32, 2, 3, 4];
    let mut r = env.redis_client();

    let run = pipeline_env::start(config(&env, &start, "per_key"));
    // Seed every key through binval.
    let v0 = env.exec_v("UPDATE items SET title = CONCAT(title, '-0')").await;
    for id in ids {
        assert_eq!(block(|| r.wait_version(&k(id), v0)), v0);
    }
    let a = app(&env).await;
    let mut sub = a.subscribe_evictions();
    let mut seen = Vec::new();
    let mut expect: BTreeMap<u32, String> = BTreeMap::new();

    // Cache every key, change them all, wait for the eviction of each, read the new value.
    async fn round(
        env: &Env,
        a: &Consumer,
        sub: &mut broadcast::Receiver<EvictionNotice>,
        seen: &mut Vec<EvictionNotice>,
        tag: &str,
    ) -> u64 {
        let k = |id: u32| format!("{}:item:{id}", env.prefix);
        let v = env.exec_v(&format!("UPDATE items SET title = CONCAT(SUBSTRING_INDEX(title, '-', 1), '-{tag}')")).await;
        for id in [1u32, 2, 3, 4] {
            notice_of(sub, &k(id), v, seen).await;
            assert!(a.cached_version(&k(id)).is_none_or(|c| c >= v), "{} still cached at an older version", k(id));
        }
        v
    }
    for id in ids {
        assert!(a.get(&k(id)).await.unwrap().is_some());
    }
    let v_before = round(&env, &a, &mut sub, &mut seen, "before").await;
    for id in ids {
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert!(v["title"].as_str().unwrap().ends_with("-before"), "{v}");
        expect.insert(id, v["title"].as_str().unwrap().to_string());
    }
    run.stop().await;

    // While binval is down (the switch): changes committed, keys cached at the old values.
    let v_during = env.exec_v("UPDATE items SET title = CONCAT(SUBSTRING_INDEX(title, '-', 1), '-during')").await;
    for id in ids {
        assert_eq!(a.cached_version(&k(id)), Some(v_before), "cached before the restart");
    }
    let run = pipeline_env::start(config(&env, &start, "batched"));
    for id in ids {
        let n = notice_of(&mut sub, &k(id), v_during, &mut seen).await;
        assert!(n.evicted, "{} evicted by the batched run's event for the change made while down", k(id));
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert!(v["title"].as_str().unwrap().ends_with("-during"), "{v}");
    }
    let v_after = round(&env, &a, &mut sub, &mut seen, "after").await;
    for id in ids {
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert_eq!(v["title"].as_str().unwrap(), format!("{}-after", expect[&id].split('-').next().unwrap()), "{v}");
        assert_eq!(a.cached_version(&k(id)), Some(v_after));
    }
    assert!(v_before < v_during && v_during < v_after);
    assert_eq!(a.stats().bad_messages, 0);

    // Per key, the notices came in version order (a re-sent version may repeat after the
    // restart: the checkpoint resumes at or before the last acknowledged transaction).
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for n in &seen {
        let l = last.entry(n.key.as_str()).or_insert(0);
        assert!(n.version >= *l, "{} went from {} back to {}", n.key, l, n.version);
        *l = n.version;
    }
    // The topic: per-key events first, batches after the switch, each key on one partition.
    let messages = topic_changes(&env.topic, 4 * 4);
    let formats: Vec<bool> = messages.iter().map(|(_, b, _)| *b).collect();
    assert!(formats.contains(&false) && formats.contains(&true), "both formats on the topic: {formats:?}");
    assert_partitions_of_keys(&messages);
    for p in 0..3 {
        let on_p: Vec<bool> = messages.iter().filter(|(q, _, _)| *q == p).map(|(_, b, _)| *b).collect();
        assert!(on_p.windows(2).all(|w| w[0] <= w[1]), "partition {p}: no per-key event after a batch: {on_p:?}");
    }
    a.shutdown().await;
    run.stop().await;
}

/// `binval republish` of a batched topic: every batch goes out again as a batch, to the
/// partition it was read from, marked `binval.republished`, and an app applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_re_sends_batches_as_batches() {
    let env = Env::new("rebatch", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let run = pipeline_env::start(config(&env, &start, "batched"));
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let v1 = env.exec_v("INSERT INTO items VALUES (1,'a',1.00),(2,'b',2.00),(3,'c',3.00)").await;
    let mut r = env.redis_client();
    for id in [1u32, 2, 3] {
        assert_eq!(block(|| r.wait_version(&k(id), v1)), v1);
    }
    let before = topic_changes(&env.topic, 3);
    run.stop().await;
    let a = app(&env).await;
    let mut sub = a.subscribe_evictions();

    let text = env.config_toml(&start, MAPPING).replace("create_topic = false\n", "create_topic = false\nevent_format = \"batched\"\n");
    let cfg = env.write_config(&text);
    let (code, out, err) = block(|| binval_cli(&["republish", "--config", cfg.to_str().unwrap(), "--from", "2000-01-01 00:00:00"], &[]));
    assert_eq!(code, 0, "{err}");
    let summary = json_lines(&out).pop().expect("a summary line");
    assert_eq!(summary["read"], 3, "{summary} {err}");
    assert_eq!(summary["republished"], 3, "{summary}");
    let mut seen = Vec::new();
    for id in [1u32, 2, 3] {
        let n = notice_of(&mut sub, &k(id), v1, &mut seen).await;
        assert_eq!(n.version, v1, "the app applied the re-sent batch");
    }
    let all = topic_changes(&env.topic, 6);
    assert!(all.iter().all(|(_, batch, _)| *batch), "batches re-sent as batches");
    assert_partitions_of_keys(&all);
    let parts = |m: &[(i32, bool, Vec<InvalidationEvent>)]| m.iter().map(|(p, _, _)| *p).collect::<BTreeSet<i32>>();
    assert_eq!(parts(&all), parts(&before), "re-sent to the partitions they were read from");
    assert_eq!(a.stats().bad_messages, 0);
    a.shutdown().await;
}

/// A large transaction (over 256 KiB of row events: applied alone, in chunks of
/// `apply.max_group_rows` rows) in the batched format: each chunk goes out as batches, every
/// key's change is on the topic once, on its partition, and the app evicts the keys it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_transaction_goes_out_in_batches_per_chunk() {
    let env = Env::new("bigbatch", RedisKind::Standalone);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, v BIGINT, pad VARCHAR(255))").await;
    env.exec("INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')").await;
    let start = env.binlog_now().await;
    let text = env.config_toml(&start, MAPPING).replace("create_topic = false\n", "create_topic = false\nevent_format = \"batched\"\n")
        + "\n[apply]\nmax_group_rows = 500\n";
    let run = pipeline_env::start(binval::config::Config::from_toml(&text).unwrap());
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let v0 = env.exec_v("UPDATE items SET v = v + 10").await;
    let mut r = env.redis_client();
    for id in [1u32, 2, 3] {
        assert_eq!(block(|| r.wait_version(&k(id), v0)), v0);
    }
    let a = app(&env).await;
    for id in [1u32, 2, 3] {
        let v: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert_eq!(v["v"], 10 + id as i64);
    }
    let mut sub = a.subscribe_evictions();
    let big = "SET SESSION max_recursive_iterations = 100000; BEGIN; \
        INSERT INTO items SELECT n, n, REPEAT('x', 200) FROM (WITH RECURSIVE s(n) AS (SELECT 4 UNION ALL SELECT n + 1 FROM s WHERE n < 3000) SELECT n FROM s) t; \
        UPDATE items SET v = -v WHERE id <= 3; \
        COMMIT";
    let v = env.exec_v(big).await;
    let mut seen = Vec::new();
    for id in [1u32, 2, 3] {
        let n = notice_of(&mut sub, &k(id), v, &mut seen).await;
        assert!(n.evicted, "{} evicted", k(id));
        let got: serde_json::Value = a.get_json(&k(id)).await.unwrap().unwrap();
        assert_eq!(got["v"], -(10 + id as i64));
    }
    assert_eq!(block(|| r.wait_version(&k(2999), v)), v);
    assert_eq!(run.stats.large_transactions.load(std::sync::atomic::Ordering::Relaxed), 1);
    let messages = topic_changes(&env.topic, 3 + 3000);
    assert_partitions_of_keys(&messages);
    let of_v: Vec<&(i32, bool, Vec<InvalidationEvent>)> = messages.iter().filter(|(_, _, e)| e.iter().any(|e| e.version == v)).collect();
    let keys: BTreeSet<&str> = of_v.iter().flat_map(|(_, _, e)| e.iter().map(|e| e.key.as_str())).collect();
    assert_eq!(keys.len(), 3000, "every key of the transaction, once");
    assert_eq!(of_v.iter().map(|(_, _, e)| e.len()).sum::<usize>(), 3000, "no key twice");
    assert!(of_v.iter().all(|(_, b, e)| *b && e.iter().all(|e| e.version == v)));
    assert!(of_v.len() >= 6, "one batch per partition per chunk of 500 rows: {} messages", of_v.len());
    assert!(of_v.len() < 3000 / 10, "batched: {} messages for 3000 keys", of_v.len());
    a.shutdown().await;
    run.stop().await;
}

/// The topic's recovery reader (`ha::topic_marks`, used when no checkpoint survived) takes a
/// batch for the per-key event of its last transaction: each partition's newest mark is the
/// newest transaction with a key on it (progress messages off, so only batches mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_marks_read_batches() {
    let env = Env::new("batchmarks", RedisKind::Standalone);
    env.exec(ITEMS).await;
    let start = env.binlog_now().await;
    let text = env
        .config_toml(&start, MAPPING)
        .replace("create_topic = false\n", "create_topic = false\nevent_format = \"batched\"\nprogress_interval_ms = 0\n");
    let cfg = binval::config::Config::from_toml(&text).unwrap();
    let run = pipeline_env::start(cfg.clone());
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    let v1 = env.exec_v("INSERT INTO items SELECT seq, CONCAT('t', seq), 1.00 FROM seq_1_to_30").await;
    let v2 = env.exec_v("UPDATE items SET title = 'x' WHERE id = 1").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&k(30), v1)), v1);
    assert_eq!(block(|| r.wait_version(&k(1), v2)), v2);
    // Every message delivered: the checkpoint only moves after the deliveries.
    let _ = topic_changes(&env.topic, 31);
    run.stop().await;
    let report = block(|| binval::ha::topic_marks::read(&cfg)).expect("topic read");
    assert_eq!(report.marks.len(), 3, "30 keys put a batch on every partition: {}", report.describe());
    let p1 = Partitioner::Crc32.partition(k(1).as_bytes(), 3);
    for m in &report.marks {
        assert!(matches!(m.mark, binval::ha::topic_marks::Mark::Before(_)), "{:?}", m.mark);
        let want = if m.partition == p1 { v2 } else { v1 };
        let gtid = m.mark.position().gtid.clone().unwrap_or_default();
        assert!(gtid.ends_with(&format!("-{want}")), "partition {}: {gtid}, want seq {want}: {}", m.partition, report.describe());
    }
}
