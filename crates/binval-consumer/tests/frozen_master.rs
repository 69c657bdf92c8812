//! Reads on a real 3-master Redis Cluster with one master frozen (SIGSTOP: its connections stay
//! open and nothing answers, as with a stalled host; issue #22). A key whose 8 replicas lie on
//! all three masters is read from another master after about `replica_read_timeout`, never
//! failed; the timeouts are counted; the fill-race guard still refuses a value older than an
//! event the instance was told about. Latencies are asserted only with wide margins.

mod common;

use std::time::{Duration, Instant};

use binval_consumer::CacheMode;
use binval_protocol::placement::Placement;
use common::*;

const N: u32 = 8;

/// `CONFIG SET` on the node at `port`.
async fn config_set(port: u16, name: &str, value: &str) -> anyhow::Result<()> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))?.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query_async(&mut c).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_move_to_another_master_when_one_is_frozen() -> anyhow::Result<()> {
    init_tracing();
    let cluster = tokio::task::spawn_blocking(binval_testkit::OwnedCluster::start_new).await??;
    let urls = cluster.urls();
    // Keep the two live masters serving their slots once the frozen one is marked failed
    // (Redis's default, full coverage, would answer CLUSTERDOWN for every key after
    // cluster-node-timeout, whichever master holds it).
    for &port in &cluster.ports {
        config_set(port, "cluster-require-full-coverage", "no").await?;
    }
    let owners = binval_testkit::SlotOwners::read(cluster.ports[0])?;
    let master_of = |slot: u16| owners.master_of(slot);
    let key = (0..2000)
        .map(|i| format!("item:detail:{i}"))
        .find(|k| Placement::of(k, N, &master_of).masters() == 3)
        .expect("a key with replicas on all 3 masters");
    let payload = r#"{"id":1,"name":"lamp"}"#;
    let client = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = client.get_async_connection().await?;
    write_fenced(&mut w, &key, N, payload, 7).await?;

    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let b = || builder(&topic).redis_cluster(urls.clone()).replicas(N).max_staleness(Some(Duration::from_secs(30)));
    // Every get is a fill (nothing of `item:` is cached): each picks a master anew.
    let uncached = b().cache_mode(CacheMode::Prefixes(vec!["none:".into()])).build().await?;
    let cached = b().build().await?;
    assert_eq!(uncached.get(&key).await?.as_deref(), Some(payload));

    // Freeze the master holding the most of the key's replicas.
    let placement = Placement::of(&key, N, &master_of);
    let frozen_master = placement.groups().iter().max_by_key(|(_, g)| g.len()).map(|(m, _)| *m).unwrap();
    let frozen_port = owners.masters[frozen_master];
    let frozen_index = cluster.ports.iter().position(|&p| p == frozen_port).expect("the frozen master's port");
    cluster.freeze_node(frozen_index, true);
    let frozen_at = Instant::now();

    // 40 reads within the first seconds of the freeze (before the cluster marks it failed).
    let mut slowest = Duration::ZERO;
    let mut errors = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        match uncached.get(&key).await {
            Ok(v) => assert_eq!(v.as_deref(), Some(payload)),
            Err(e) => errors.push(e.to_string()),
        }
        slowest = slowest.max(t.elapsed());
    }
    let stats = uncached.stats();
    println!(
        "frozen master {frozen_master} (port {frozen_port}, {} of {N} replicas): 40 reads in {:?}, slowest {slowest:?}, replica read timeouts {}, errors {errors:?}",
        placement.groups().iter().find(|(m, _)| *m == frozen_master).map_or(0, |(_, g)| g.len()),
        frozen_at.elapsed(),
        stats.replica_read_timeouts
    );
    assert!(errors.is_empty(), "reads failed while another master holds replicas: {errors:?}");
    assert!(stats.replica_read_timeouts >= 1, "some reads went to the frozen master first and timed out: {stats:?}");
    assert!(slowest < Duration::from_secs(1), "a read took {slowest:?}: about the 100 ms soft bound expected");

    // The fill-race guard still holds: an event newer than every replica arrives; a fill
    // (served from another master) answers the value it read but does not cache it.
    let p = producer(&binval_testkit::broker().bootstrap())?;
    let mut notices = cached.subscribe_evictions();
    publish(&p, &topic, &event(&key, 9)).await?;
    wait_notice(&mut notices, &key, 9, Duration::from_secs(10)).await?;
    for _ in 0..6 {
        assert_eq!(cached.get(&key).await?.as_deref(), Some(payload));
        assert_eq!(cached.cached_version(&key), None, "version 7 is older than the event's 9: never cached");
    }
    assert!(cached.stats().fills_refused >= 6, "{:?}", cached.stats());

    cluster.freeze_node(frozen_index, false);
    // Thawed: reads go on (the frozen master answers again).
    for _ in 0..10 {
        assert_eq!(uncached.get(&key).await?.as_deref(), Some(payload));
    }
    uncached.shutdown().await;
    cached.shutdown().await;
    Ok(())
}

/// Progress messages with per-slot-range lags (`masters`): the ranges of one master report a
/// minute of lag, the others none. A key with replicas on the other masters is read there as
/// fresh, never from the lagging master (frozen here, with one read per fill: a read sent to it
/// would time out); a key whose only replica is on it follows `on_source_behind` (the default
/// without a loader: refused), and so does a key whose other replicas are missing (its count
/// shrank to 1) while its replica 0 is on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_on_a_master_reported_behind_are_skipped() -> anyhow::Result<()> {
    use binval_consumer::ConsumerError;
    use binval_protocol::MasterLag;
    init_tracing();
    let cluster = tokio::task::spawn_blocking(binval_testkit::OwnedCluster::start_new).await??;
    let urls = cluster.urls();
    let owners = binval_testkit::SlotOwners::read(cluster.ports[0])?;
    let master_of = |slot: u16| owners.master_of(slot);
    let spread = (0..2000).map(|i| format!("item:spread:{i}")).find(|k| Placement::of(k, N, &master_of).masters() == 3).unwrap();
    let behind = 0usize; // the master whose writes binval reports as a minute behind
    let single = (0..5000)
        .map(|i| format!("item:single:{i}"))
        .find(|k| Placement::of(k, 1, &master_of).groups()[0].0 == behind)
        .expect("a key whose one replica is on master 0");
    let client = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = client.get_async_connection().await?;
    write_fenced(&mut w, &spread, N, "spread", 7).await?;
    write_fenced(&mut w, &single, 1, "single", 7).await?;
    // A key the reader believes has N replicas while only replica 0 exists (binval shrank it
    // to 1), replica 0 on the lagging master: the replicas within the bound are missing, and
    // only replica 0 could say whether the row exists.
    let shrunk = (0..5000)
        .map(|i| format!("item:spread:shrunk{i}"))
        .find(|k| {
            let p = Placement::of(k, N, &master_of);
            p.master_of_replica(0) == Some(behind) && p.masters() >= 2
        })
        .expect("a key whose replica 0 is on master 0");
    write_record(&mut w, &shrunk, 0..1, "set", "only-r0", 7).await?;

    // Slot ranges per master, from the slot map.
    let mut ranges: Vec<MasterLag> = Vec::new();
    for slot in 0..16384u16 {
        let lag_ms = if master_of(slot) == behind { 60_000 } else { 0 };
        match ranges.last_mut() {
            Some(r) if r.last_slot + 1 == slot && (r.lag_ms == lag_ms) => r.last_slot = slot,
            _ => ranges.push(MasterLag { first_slot: slot, last_slot: slot, lag_ms }),
        }
    }
    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let c = builder(&topic)
        .redis_cluster(urls.clone())
        .replicas(1)
        .replicas_for_prefix("item:spread:", N)
        .max_replica_reads(1)
        .cache_mode(CacheMode::Prefixes(vec!["none:".into()]))
        .max_staleness(Some(Duration::from_millis(1500)))
        .build()
        .await?;
    let p = producer(&binval_testkit::broker().bootstrap())?;
    let mut m = progress("shop", 0, 60_000, 1);
    m.masters = Some(ranges);
    // Reported again every 200 ms, as binval does, so the fresh masters stay fresh however
    // slow the reads below are.
    let (p2, topic2, m2) = (p.clone(), topic.clone(), m.clone());
    let reporter = tokio::spawn(async move {
        loop {
            publish_progress(&p2, &topic2, &m2).await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        #[allow(unreachable_code)]
        Ok::<(), anyhow::Error>(())
    });
    let t0 = Instant::now();
    while c.stats().progress_messages == 0 {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(10), "progress not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cluster.freeze_node(cluster.ports.iter().position(|&p| p == owners.masters[behind]).unwrap(), true);
    for _ in 0..30 {
        assert_eq!(c.get(&spread).await?.as_deref(), Some("spread"), "read from a master within the bound");
    }
    assert_eq!(c.stats().replica_read_timeouts, 0, "no read went to the lagging (frozen) master");
    assert_eq!(c.stats().source_behind_refused, 0);
    match c.get(&single).await {
        Err(ConsumerError::SourceBehind { key, lag_ms, .. }) => assert!(key == single && lag_ms >= 60_000),
        other => panic!("its only replica is on the lagging master: refused, got {other:?}"),
    }
    // Not "no row" (the replica-0 rule): as when every replica is behind.
    match c.get(&shrunk).await {
        Err(ConsumerError::SourceBehind { key, lag_ms, .. }) => assert!(key == shrunk && lag_ms >= 60_000),
        other => panic!("only replica 0 holds it and it is behind: refused, got {other:?}"),
    }
    assert_eq!(c.stats().missing, 0, "{:?}", c.stats());
    cluster.freeze_node(cluster.ports.iter().position(|&p| p == owners.masters[behind]).unwrap(), false);
    reporter.abort();
    c.shutdown().await;
    Ok(())
}
