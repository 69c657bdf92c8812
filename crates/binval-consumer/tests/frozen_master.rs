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
