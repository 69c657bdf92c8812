//! The metric names of the crate docs are what a Prometheus recorder actually sees. Its own
//! test binary: it installs a process-wide recorder (metrics-exporter-prometheus) once, shared
//! by its tests.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use binval_consumer::CacheMode;
use common::*;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process-wide recorder, installed by the first test that asks.
fn prometheus() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| PrometheusBuilder::new().install_recorder().expect("install the Prometheus recorder"))
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_reach_a_prometheus_recorder() -> anyhow::Result<()> {
    init_tracing();
    let prometheus = prometheus();
    let broker = binval_testkit::broker();
    let topic = create_topic(&broker.bootstrap(), 1).await?;
    let key = format!("{}:1", binval_testkit::unique_name("metrics"));
    let mut r = redis_conn().await?;
    write_fenced(&mut r, &key, 2, "v1", 1).await?;
    let c = builder(&topic)
        .redis_standalone(binval_testkit::redis().url())
        .replicas(2)
        .hot_key_sample_every(1)
        .hot_key_threshold(1.0)
        .build()
        .await?;
    let mut rx = c.subscribe_evictions();
    assert_eq!(c.get(&key).await?.as_deref(), Some("v1")); // miss + fill
    for _ in 0..20 {
        assert_eq!(c.get(&key).await?.as_deref(), Some("v1")); // hits
    }
    write_fenced(&mut r, &key, 2, "v2", 2).await?;
    publish(&producer(&broker.bootstrap())?, &topic, &event(&key, 2)).await?;
    assert!(wait_notice(&mut rx, &key, 2, Duration::from_secs(15)).await?.evicted);
    let top = c.hot_keys();
    assert_eq!(top[0].key, key);

    let text = prometheus.render();
    println!("{text}");
    for name in [
        "binval_consumer_hits_total 20",
        "binval_consumer_misses_total 1",
        "binval_consumer_fills_total 1",
        "binval_consumer_events_total 1",
        "binval_consumer_evictions_total 1",
        "binval_consumer_serving_local 1",
        "binval_consumer_invalidation_lag_ms{from=\"commit\"",
        "binval_consumer_invalidation_lag_ms{from=\"publish\"",
        "binval_consumer_hot_keys 1",
        &format!("binval_consumer_hot_key_reads_per_sec{{key=\"{key}\"}}"),
    ] {
        assert!(text.contains(name), "`{name}` missing from:\n{text}");
    }
    c.shutdown().await;
    Ok(())
}

/// `binval_consumer_redis_reads_total{master="127.0.0.1:<port>", command="replica"}` now.
fn replica_reads(text: &str, port: u16) -> u64 {
    let master = format!("master=\"127.0.0.1:{port}\"");
    text.lines()
        .filter(|l| l.starts_with("binval_consumer_redis_reads_total{") && l.contains(&master) && l.contains("command=\"replica\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The slot map follows the cluster: a key's replica r0 moves to another master (the slot is
/// migrated the way `redis-cli --cluster reshard` does it); the next read of r0 is sent to the
/// old master, which answers `MOVED`; the client follows it, rebuilds its slot map and hands it
/// to the consumer, and from then on r0's reads are grouped and counted under the new master.
#[tokio::test(flavor = "multi_thread")]
async fn reads_follow_a_slot_moved_to_another_master() -> anyhow::Result<()> {
    init_tracing();
    let prometheus = prometheus();
    let cluster = tokio::task::spawn_blocking(binval_testkit::OwnedCluster::start_new).await??;
    let urls = cluster.urls();
    let master_of = cluster_master_of(&urls)?;
    // A key whose replicas r0 and r1 are on different masters.
    let key = (0..1000)
        .map(|i| format!("item:moved:{i}"))
        .find(|k| {
            master_of(binval_protocol::hash_slot(binval_protocol::replica_key(k, 0).as_bytes()))
                != master_of(binval_protocol::hash_slot(binval_protocol::replica_key(k, 1).as_bytes()))
        })
        .expect("a key with replicas on two masters");
    let r0 = binval_protocol::replica_key(&key, 0);
    let slot = binval_protocol::hash_slot(r0.as_bytes());
    let client = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = client.get_async_connection().await?;
    write_fenced(&mut w, &key, 2, "v1", 1).await?;
    let mut nodes = Vec::new();
    for u in &urls {
        nodes.push(redis::Client::open(u.as_str())?.get_multiplexed_async_connection().await?);
    }
    let mut ids = Vec::new();
    for n in nodes.iter_mut() {
        ids.push(redis::cmd("CLUSTER").arg("MYID").query_async::<String>(n).await?);
    }
    let owner = |k: &str| -> anyhow::Result<usize> {
        let m = master_of(binval_protocol::hash_slot(k.as_bytes()));
        let port = binval_testkit::SlotOwners::read(cluster.ports[0])?.masters[m];
        Ok(cluster.ports.iter().position(|p| *p == port).expect("a master of the cluster"))
    };
    let (from, to) = (owner(&r0)?, owner(&binval_protocol::replica_key(&key, 1))?);

    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    // What is checked is where reads go, not how fast: a generous response timeout, so the read
    // that meets `MOVED` (and the client's slot refresh) does not time out on a busy machine.
    let c = builder(&topic)
        .redis_cluster(urls.clone())
        .replicas(2)
        .redis_response_timeout(std::time::Duration::from_secs(5))
        .cache_mode(CacheMode::Prefixes(vec!["not-this:".into()]))
        .build()
        .await?;
    for _ in 0..40 {
        assert_eq!(c.get(&key).await?.as_deref(), Some("v1"));
    }
    let text = prometheus.render();
    let (before_from, before_to) = (replica_reads(&text, cluster.ports[from]), replica_reads(&text, cluster.ports[to]));
    assert_eq!(before_from + before_to, 40, "{text}");
    assert!(before_from > 0 && before_to > 0, "both masters read: {before_from} / {before_to}");

    // Migrate r0's slot from its master to r1's: IMPORTING, MIGRATING, MIGRATE the key, NODE.
    let cmd = |args: &[&str]| {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c
    };
    let s = slot.to_string();
    let _: () = cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &ids[from]]).query_async(&mut nodes[to]).await?;
    let _: () = cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &ids[to]]).query_async(&mut nodes[from]).await?;
    let to_port = cluster.ports[to].to_string();
    let _: () = cmd(&["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS", &r0]).query_async(&mut nodes[from]).await?;
    for n in nodes.iter_mut() {
        let _: () = cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &ids[to]]).query_async(n).await?;
    }

    for _ in 0..40 {
        assert_eq!(c.get(&key).await?.as_deref(), Some("v1"));
    }
    let text = prometheus.render();
    let (after_from, after_to) = (replica_reads(&text, cluster.ports[from]), replica_reads(&text, cluster.ports[to]));
    println!(
        "slot {slot} of {r0} moved {} -> {}: reads before {before_from} / {before_to}, after {after_from} / {after_to}",
        cluster.ports[from], cluster.ports[to]
    );
    assert_eq!(after_from + after_to, 80);
    assert!(after_from - before_from <= 3, "reads still counted under the old master: {} of 40", after_from - before_from);
    c.shutdown().await;
    Ok(())
}
