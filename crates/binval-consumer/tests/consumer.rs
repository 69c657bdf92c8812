//! binval-consumer against real services: standalone Redis, a 3-master Redis Cluster and a
//! tansu broker, all from binval-testkit. No mocks. Latencies are printed, never asserted.

mod common;

use std::time::{Duration, Instant};

use binval_protocol::{hash_slot, replica_key, version_key};
use common::*;
use redis::AsyncCommands;

const WAIT: Duration = Duration::from_secs(15);

#[derive(Debug, serde::Deserialize, PartialEq)]
struct Item {
    id: u64,
    name: String,
}

/// 1. A miss reads one replica (never the version token) and caches its value at the replica's
/// position; the next get hits.
#[tokio::test(flavor = "multi_thread")]
async fn fill_reads_one_replica_at_its_position() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 6666, 3).await?;
    let key = sc.key.clone();
    let payload = r#"{"id":6666,"name":"lamp"}"#;
    sc.write(4, payload, 3).await?;

    let c = sc.consumer(4).build().await?;
    assert!(c.is_serving_local());
    assert_eq!(c.get(&key).await?.as_deref(), Some(payload));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.fills, s.fills_refused, s.redis_reads), (0, 1, 1, 0, 1), "{s:?}");
    assert_eq!(c.cached_version(&key), Some(3));

    // Second read is a local hit, even though Redis changed behind its back (no event sent).
    sc.write(4, r#"{"id":6666,"name":"changed"}"#, 4).await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some(payload));
    let item: Option<Item> = c.get_json(&key).await?;
    assert_eq!(item, Some(Item { id: 6666, name: "lamp".into() }));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.fills), (2, 1, 1), "{s:?}");

    // A payload that does not fit the type is a Decode error naming the key.
    let err = c.get_json::<Vec<u8>>(&key).await.unwrap_err();
    assert!(err.to_string().contains(&key), "{err}");
    c.shutdown().await;
    Ok(())
}

/// 2. Two instances both hold K; an event for the new version evicts it on both.
#[tokio::test(flavor = "multi_thread")]
async fn event_evicts_on_every_instance() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 1, 3).await?;
    let key = sc.key.clone();
    sc.write(8, "old", 3).await?;

    let a = sc.consumer(8).build().await?;
    let b = sc.consumer(8).build().await?;
    assert_ne!(a.group_id(), b.group_id());
    assert_eq!(a.get(&key).await?.as_deref(), Some("old"));
    assert_eq!(b.get(&key).await?.as_deref(), Some("old"));
    assert_eq!(a.cached_version(&key), Some(3));
    assert_eq!(b.cached_version(&key), Some(3));

    let mut lat_a = Vec::new();
    let mut lat_b = Vec::new();
    // Several rounds, so the printed latency is not one sample; the first round is the test.
    for (round, version) in (4u64..=8).enumerate() {
        let payload = format!("new-{version}");
        // The writer's order: replicas, then the version token, then the event.
        sc.write(8, &payload, version).await?;
        let v: u64 = sc.redis.get(version_key(&key)).await?;
        assert_eq!(v, version);

        let mut rx_a = a.subscribe_evictions();
        let mut rx_b = b.subscribe_evictions();
        let t0 = Instant::now();
        sc.publish(version).await?;
        let acked = t0.elapsed();
        let (na, nb) = tokio::join!(
            async {
                let n = wait_notice(&mut rx_a, &key, version, WAIT).await;
                (n, t0.elapsed())
            },
            async {
                let n = wait_notice(&mut rx_b, &key, version, WAIT).await;
                (n, t0.elapsed())
            }
        );
        let (na, da) = (na.0?, na.1);
        let (nb, db) = (nb.0?, nb.1);
        assert!(na.evicted && nb.evicted, "round {round}: {na:?} {nb:?}");
        assert_eq!(a.cached_version(&key), None);
        assert_eq!(a.get(&key).await?.as_deref(), Some(payload.as_str()));
        assert_eq!(b.get(&key).await?.as_deref(), Some(payload.as_str()));
        assert_eq!(a.cached_version(&key), Some(version));
        println!(
            "round {round}: produce->ack {:.1} ms, produce->notice A {:.1} ms, B {:.1} ms; publish->apply (event clocks) A {} ms, B {} ms",
            acked.as_secs_f64() * 1e3,
            da.as_secs_f64() * 1e3,
            db.as_secs_f64() * 1e3,
            na.received_at_ms.saturating_sub(na.publish_time_ms),
            nb.received_at_ms.saturating_sub(nb.publish_time_ms),
        );
        lat_a.push(da);
        lat_b.push(db);
    }
    let max = lat_a.iter().chain(&lat_b).max().unwrap();
    println!("eviction latency produce->notice over {} samples: max {:.1} ms", lat_a.len() * 2, max.as_secs_f64() * 1e3);
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.events, sa.evictions), (5, 5), "{sa:?}");
    assert_eq!((sb.events, sb.evictions), (5, 5), "{sb:?}");
    let t = Instant::now();
    a.shutdown().await;
    b.shutdown().await;
    println!("shutdown of two consumers took {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    assert!(!a.is_serving_local());
    Ok(())
}

/// 3. The evict rule: an event with version <= the cached version does not evict.
#[tokio::test(flavor = "multi_thread")]
async fn event_not_newer_than_cache_does_not_evict() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 3, 3).await?;
    let key = sc.key.clone();
    sc.write(2, "v5", 5).await?;
    let c = sc.consumer(2).build().await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("v5"));
    assert_eq!(c.cached_version(&key), Some(5));

    let mut rx = c.subscribe_evictions();
    for v in [4u64, 5] {
        sc.publish(v).await?;
        let n = wait_notice(&mut rx, &key, v, WAIT).await?;
        assert!(!n.evicted, "{n:?}");
        assert_eq!(c.cached_version(&key), Some(5));
    }
    assert_eq!(c.get(&key).await?.as_deref(), Some("v5"));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.events, s.evictions), (1, 1, 2, 0), "{s:?}");

    sc.publish(6).await?;
    assert!(wait_notice(&mut rx, &key, 6, WAIT).await?.evicted);
    assert_eq!(c.cached_version(&key), None);
    c.shutdown().await;
    Ok(())
}

/// 4. Fill race: the event for version 10 arrives before a fill that reads version 9; the fill
/// is returned but not cached.
#[tokio::test(flavor = "multi_thread")]
async fn fill_older_than_seen_event_is_not_cached() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 4, 3).await?;
    let key = sc.key.clone();
    sc.write(2, "stale-v9", 9).await?;
    let c = sc.consumer(2).build().await?;

    let mut rx = c.subscribe_evictions();
    sc.publish(10).await?;
    let n = wait_notice(&mut rx, &key, 10, WAIT).await?;
    assert!(!n.evicted, "nothing was held: {n:?}");

    // Redis still says 9 (the "slow fill" read before the write landed).
    assert_eq!(c.get(&key).await?.as_deref(), Some("stale-v9"));
    let s = c.stats();
    assert_eq!((s.misses, s.fills, s.fills_refused), (1, 1, 1), "{s:?}");
    assert_eq!(c.cached_version(&key), None);
    assert_eq!(c.get(&key).await?.as_deref(), Some("stale-v9"));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.fills_refused), (0, 2, 2), "{s:?}");

    // Once Redis reaches version 10, the fill is cached again.
    sc.write(2, "v10", 10).await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("v10"));
    assert_eq!(c.cached_version(&key), Some(10));
    assert_eq!(c.get(&key).await?.as_deref(), Some("v10"));
    assert_eq!(c.stats().hits, 1);
    c.shutdown().await;
    Ok(())
}

/// 5. A message that is not an invalidation event is skipped and counted; later events apply.
#[tokio::test(flavor = "multi_thread")]
async fn bad_message_is_skipped_and_counted() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 5, 3).await?;
    let key = sc.key.clone();
    sc.write(1, "one", 1).await?;
    let c = sc.consumer(1).build().await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("one"));

    let mut rx = c.subscribe_evictions();
    // Same Kafka key, so same partition: the bad messages are read before the good event.
    sc.publish_raw(b"this is not json").await?;
    sc.publish_raw(br#"{"schema":99,"key":"x","version":1,"op":"update","table":"a.b","position":{"file":"f","pos":4},"commit_time_ms":0,"publish_time_ms":0}"#).await?;
    sc.publish_raw(br#"{"key":"missing fields"}"#).await?;
    sc.write(1, "two", 2).await?;
    sc.publish(2).await?;
    let n = wait_notice(&mut rx, &key, 2, WAIT).await?;
    assert!(n.evicted);
    let s = c.stats();
    assert_eq!((s.bad_messages, s.events, s.evictions), (3, 1, 1), "{s:?}");
    assert_eq!(c.get(&key).await?.as_deref(), Some("two"));
    assert!(c.is_serving_local());
    c.shutdown().await;
    Ok(())
}

/// 5a. Batch messages (header `binval.kind: batch`): a malformed one (cut short, garbage, a
/// newer format) is counted as bad and skipped, and the good batch after it on the same
/// partition applies: its cached key is evicted, its uncached key costs nothing.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_batch_is_skipped_and_counted() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 56, 3).await?;
    let key = sc.key.clone();
    sc.write(1, "one", 1).await?;
    let c = sc.consumer(1).build().await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("one"));
    let mut rx = c.subscribe_evictions();
    let batch = |version: u64| {
        let mut b = binval_protocol::BatchBuilder::new();
        let pos = binval_protocol::SourcePosition { file: "mysql-bin.000001".into(), pos: 4, gtid: None };
        b.push(&pos, 0, binval_protocol::Op::Update, version, "shop.items", "not:cached:anywhere").unwrap();
        b.push(&pos, 0, binval_protocol::Op::Update, version, "shop.items", &key).unwrap();
        b.finish(0)
    };
    let good = batch(2);
    let mut newer = good.clone();
    newer[0] = 9;
    publish_kind(sc.producer()?, &sc.topic, 0, "batch", &good[..good.len() - 3]).await?;
    publish_kind(sc.producer()?, &sc.topic, 0, "batch", b"garbage").await?;
    publish_kind(sc.producer()?, &sc.topic, 0, "batch", &newer).await?;
    sc.write(1, "two", 2).await?;
    publish_kind(sc.producer()?, &sc.topic, 0, "batch", &good).await?;
    let n = wait_notice(&mut rx, &key, 2, WAIT).await?;
    assert!(n.evicted);
    let s = c.stats();
    assert_eq!((s.bad_messages, s.events, s.evictions), (3, 2, 1), "{s:?}");
    assert_eq!(c.get(&key).await?.as_deref(), Some("two"));
    assert!(c.is_serving_local());
    c.shutdown().await;
    Ok(())
}

/// 5b. A message longer than `max_message_bytes` (here a well-formed event, padded) is not
/// parsed: counted as bad and skipped, and the events after it still apply.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_message_is_skipped_and_counted() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 55, 3).await?;
    let key = sc.key.clone();
    sc.write(1, "one", 1).await?;
    let c = sc.consumer(1).max_message_bytes(1024).build().await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("one"));

    let mut rx = c.subscribe_evictions();
    // An event for version 5 with a table name that makes it 4 KiB: over the limit, so it must
    // not evict; the next (normal) event, for version 2, does.
    let mut big = event(&key, 5);
    big.table = format!("shop.{}", "x".repeat(4096));
    sc.publish_raw(&big.to_json()).await?;
    sc.publish_raw(&vec![b'{'; 8192]).await?;
    sc.write(1, "two", 2).await?;
    sc.publish(2).await?;
    let n = wait_notice(&mut rx, &key, 2, WAIT).await?;
    assert!(n.evicted);
    let s = c.stats();
    assert_eq!((s.bad_messages, s.events, s.evictions), (2, 1, 1), "{s:?}");
    assert_eq!(c.get(&key).await?.as_deref(), Some("two"));
    assert!(c.is_serving_local());
    c.shutdown().await;

    let Err(err) = sc.consumer(1).max_message_bytes(0).build().await else { panic!("max_message_bytes(0) accepted") };
    assert!(err.to_string().contains("max_message_bytes"), "{err}");
    Ok(())
}

/// 5c. A replica hash binval did not write (a position that is not a number; a key of another
/// type) is an error naming the key, never a miss or a value.
#[tokio::test(flavor = "multi_thread")]
async fn malformed_replica_hash_is_an_error_naming_the_key() -> anyhow::Result<()> {
    let sc = Scene::new("item", 56, 3).await?;
    let (key, rkey) = (sc.key.clone(), replica_key(&sc.key, 0));
    let mut r = sc.redis.clone();
    let c = sc.consumer(1).build().await?;

    let _: () = redis::cmd("HSET").arg(&rkey).arg("d").arg("{}").arg("p").arg("12x").query_async(&mut r).await?;
    let err = c.get(&key).await.unwrap_err().to_string();
    assert!(err.contains(&rkey) && err.contains("12x"), "{err}");

    let _: () = r.del(&rkey).await?;
    let _: () = r.set(&rkey, "a plain string").await?;
    let err = c.get(&key).await.unwrap_err().to_string();
    assert!(err.contains(&rkey) && err.contains("WRONGTYPE"), "{err}");
    assert_eq!(c.cached_version(&key), None, "nothing cached");
    let _: () = r.del(&rkey).await?;
    c.shutdown().await;
    Ok(())
}

/// 6. Through a 3-master Redis Cluster, with replicas on different slots.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_fill_reads_replicas_on_different_slots() -> anyhow::Result<()> {
    init_tracing();
    let broker = binval_testkit::broker();
    let topic = create_topic(&broker.bootstrap(), 3).await?;
    let urls = binval_testkit::redis_cluster().urls();
    let key = format!("item:detail:{}", binval_testkit::unique_name("k"));
    let slots: std::collections::BTreeSet<u16> = (0..8).map(|i| hash_slot(replica_key(&key, i).as_bytes())).collect();
    assert!(slots.len() > 1, "replicas should spread over slots: {slots:?}");
    // Slot ranges of a 3-master cluster made by redis-cli --cluster create: 0-5460, 5461-10922, 10923-16383.
    let masters: std::collections::BTreeSet<u16> = slots.iter().map(|s| s / 5461).collect();
    println!("replica slots {slots:?}, on ~{} masters", masters.len());

    let client = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = client.get_async_connection().await?;
    write_fenced(&mut w, &key, 8, "clustered", 7).await?;

    let c = builder(&topic)
        .redis_cluster(urls.clone())
        .replicas(1)
        .replicas_for_prefix("item:", 2)
        .replicas_for_prefix("item:detail:", 8)
        .build()
        .await?;
    assert_eq!(c.replicas_for(&key), 8);
    assert_eq!(c.replicas_for("item:x"), 2);
    assert_eq!(c.replicas_for("other"), 1);
    assert_eq!(c.get(&key).await?.as_deref(), Some("clustered"));
    assert_eq!(c.cached_version(&key), Some(7));

    // One master lost its replicas of key2 (the others hold them): a fill that reads a missing
    // replica first moves to another master, so every fill finds the value within two reads.
    let master_of = cluster_master_of(&urls)?;
    let (key2, lost) = (0..200)
        .find_map(|i| {
            let k = format!("item:detail:{}:{i}", binval_testkit::unique_name("k"));
            let p = binval_protocol::placement::Placement::of(&k, 8, &master_of);
            (p.masters() >= 2).then(|| (k, p.groups()[0].clone()))
        })
        .expect("a key with replicas on two masters");
    let kept: Vec<u32> = (0..8).filter(|i| !lost.1.contains(i)).collect();
    write_record(&mut w, &key2, kept.clone(), "set", "kept", 2).await?;
    // Local caching off for the key: every get is a fill.
    let c2 = builder(&topic)
        .redis_cluster(urls.clone())
        .replicas(8)
        .cache_mode(binval_consumer::CacheMode::Prefixes(vec!["not-this-key:".into()]))
        .build()
        .await?;
    for round in 0..20 {
        assert_eq!(c2.get(&key2).await?.as_deref(), Some("kept"), "round {round}");
    }
    let s = c2.stats();
    println!("master {} lost replicas {:?} of {key2}; 20 fills: {s:?}", lost.0, lost.1);
    assert_eq!((s.fills, s.missing), (20, 0), "{s:?}");
    assert!(s.redis_reads <= 40, "{s:?}");
    c2.shutdown().await;

    // Eviction works the same on a cluster.
    let p = producer(&broker.bootstrap())?;
    let mut rx = c.subscribe_evictions();
    write_fenced(&mut w, &key, 8, "clustered-2", 8).await?;
    publish(&p, &topic, &event(&key, 8)).await?;
    assert!(wait_notice(&mut rx, &key, 8, WAIT).await?.evicted);
    assert_eq!(c.get(&key).await?.as_deref(), Some("clustered-2"));
    c.shutdown().await;
    Ok(())
}

/// 7. No replica exists (never written; the version token does not matter): `None` after at
/// most two reads, cached as "no row" for `missing_ttl` (concurrent and later gets read nothing
/// more), then one read per fill while it stays missing; the key's next event evicts it;
/// `missing_ttl(ZERO)` caches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_key_costs_two_reads_and_is_cached_briefly() -> anyhow::Result<()> {
    let mut sc = Scene::new("item", 7, 1).await?;
    let key = sc.key.clone();
    let _: () = sc.redis.set(version_key(&key), 12).await?;
    let c = sc.consumer(4).missing_ttl(Duration::from_millis(1500)).build().await?;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, key) = (c.clone(), key.clone());
        tasks.push(tokio::spawn(async move { c.get(&key).await }));
    }
    for t in tasks {
        assert_eq!(t.await??, None);
    }
    for _ in 0..200 {
        assert_eq!(c.get(&key).await?, None);
    }
    assert_eq!(c.get_json::<Item>(&key).await?, None);
    assert_eq!(c.cached_version(&key), Some(0), "cached as no row at position 0");
    let s = c.stats();
    println!("hot missing key, 221 gets: {s:?}");
    assert_eq!((s.missing, s.fills, s.redis_reads), (1, 0, 2), "one fill, two reads: {s:?}");
    assert!(s.negative_hits >= 200 && s.negative_hits == s.hits, "{s:?}");

    // The key's next change evicts it at once (any version is above 0).
    sc.write(4, "now-there", 13).await?;
    let mut rx = c.subscribe_evictions();
    sc.publish(13).await?;
    assert!(wait_notice(&mut rx, &key, 13, WAIT).await?.evicted);
    assert_eq!(c.get(&key).await?.as_deref(), Some("now-there"));
    assert_eq!(c.cached_version(&key), Some(13));

    // Without an event, the entry expires after missing_ttl.
    let gone = format!("{}:7b", binval_testkit::unique_name("item"));
    assert_eq!(c.get(&gone).await?, None);
    assert_eq!(c.cached_version(&gone), Some(0));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(c.cached_version(&gone), None, "missing_ttl bounds it");
    // Confirmed missing by that fill (two reads), the key's next fill reads one replica.
    let before = c.stats().redis_reads;
    assert_eq!(c.get(&gone).await?, None);
    assert_eq!(c.stats().redis_reads - before, 1, "a key confirmed missing costs one read per fill");
    c.shutdown().await;

    let c = sc.consumer(4).missing_ttl(Duration::ZERO).build().await?;
    assert_eq!(c.get(&gone).await?, None);
    assert_eq!(c.cached_version(&gone), None);
    assert_eq!(c.stats().redis_reads, 2);
    c.shutdown().await;
    Ok(())
}

/// Builder errors name the setting; a topic that does not exist is refused at build().
#[tokio::test(flavor = "multi_thread")]
async fn config_errors_name_the_field() -> anyhow::Result<()> {
    init_tracing();
    let err = binval_consumer::Consumer::builder().brokers("x:1").topic("t").build().await.unwrap_err();
    assert!(matches!(err, binval_consumer::ConsumerError::Config { field: "redis", .. }), "{err}");
    let err = builder("t").redis_standalone(binval_testkit::redis().url()).replicas(0).build().await.unwrap_err();
    assert!(matches!(err, binval_consumer::ConsumerError::Config { field: "replicas", .. }), "{err}");
    let err = builder("t").redis_standalone(binval_testkit::redis().url()).max_replica_reads(0).build().await.unwrap_err();
    assert!(matches!(err, binval_consumer::ConsumerError::Config { field: "max_replica_reads", .. }), "{err}");
    let err = builder("t")
        .redis_standalone(binval_testkit::redis().url())
        .ttl(Duration::from_secs(1))
        .missing_ttl(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, binval_consumer::ConsumerError::Config { field: "missing_ttl", .. }), "{err}");
    assert!(err.to_string().contains("1000 ms") && err.to_string().contains("2000 ms"), "{err}");
    let err = builder("t").redis_standalone(binval_testkit::redis().url()).read_from_replica_nodes(true).build().await.unwrap_err();
    assert!(matches!(err, binval_consumer::ConsumerError::Config { field: "read_from_replica_nodes", .. }), "{err}");
    let missing = binval_testkit::unique_name("no_such_topic");
    let err = builder(&missing)
        .redis_standalone(binval_testkit::redis().url())
        .kafka_request_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap_err();
    println!("missing topic: {err}");
    assert!(err.to_string().contains(&missing), "{err}");
    Ok(())
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > timeout {
            anyhow::bail!("not within {timeout:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(t0.elapsed())
}

/// Fail safe: when the broker dies the consumer stops serving locally (reads Redis every time,
/// caches nothing).
#[tokio::test(flavor = "multi_thread")]
async fn broker_loss_bypasses_local_cache() -> anyhow::Result<()> {
    init_tracing();
    let mut broker = tokio::task::spawn_blocking(binval_testkit::OwnedBroker::start_new).await??;
    let topic = create_topic(&broker.bootstrap(), 2).await?;
    let key = format!("{}:9", binval_testkit::unique_name("item"));
    let mut r = redis_conn().await?;
    write_standalone(&mut r, &key, 1, "a", 1).await?;
    let c = binval_consumer::Consumer::builder()
        .brokers(broker.bootstrap())
        .topic(&topic)
        .kafka_property("fetch.wait.max.ms", "5")
        .kafka_property("reconnect.backoff.max.ms", "500")
        .metadata_refresh(Duration::from_millis(500))
        .kafka_request_timeout(Duration::from_secs(1))
        .redis_standalone(binval_testkit::redis().url())
        .build()
        .await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("a"));
    assert_eq!(c.cached_version(&key), Some(1));

    broker.stop();
    let took = wait_until("fail-safe engaged", Duration::from_secs(20), || !c.is_serving_local()).await?;
    println!("broker killed -> is_serving_local()=false after {:.0} ms", took.as_secs_f64() * 1e3);
    assert_eq!(c.cached_version(&key), None, "cache cleared on loss");
    // Reads go to Redis every time and cache nothing, so a change is seen without any event.
    write_standalone(&mut r, &key, 1, "b", 2).await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some("b"));
    assert_eq!(c.get(&key).await?.as_deref(), Some("b"));
    assert_eq!(c.cached_version(&key), None);
    assert!(c.stats().bypass_reads >= 2);

    // Recovery (stream back -> cache cleared -> serving locally) is not exercised here: after a
    // restart of tansu (in-memory storage, so the topic and its topic id are gone) librdkafka
    // 2.12.1 crashes with SIGSEGV in rd_kafka_metadata_update_op (strcmp on a NULL topic name,
    // reached from a fetch response without topic name/id). See README "Known gaps".
    let t = Instant::now();
    c.shutdown().await;
    println!("shutdown with the broker down took {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    assert!(!c.is_serving_local());
    drop(broker);
    Ok(())
}
