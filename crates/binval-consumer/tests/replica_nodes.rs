//! Where a fill's reads go on a real Redis Cluster whose 3 masters each have a replica node
//! (binval-testkit's `ReplicatedCluster`, owned by this test, so every node's
//! `INFO commandstats` counts only this test's reads): master-balanced over the masters that
//! hold a key's replicas, and, with `read_from_replica_nodes`, spread over each master and its
//! replica node. Counts are asserted with wide margins (the choice is random); spreads printed.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use binval_consumer::{CacheMode, Consumer};
use binval_protocol::placement::Placement;
use binval_protocol::replica_key;
use common::*;

const N: u32 = 8;
const READS: u64 = 900;

/// `calls=` of `cmdstat_hmget` of the node at `port`.
async fn hmget_calls(port: u16) -> anyhow::Result<u64> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))?.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await?;
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_hmget:"))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// The master port a replica node copies (`master_port` of `INFO replication`).
async fn master_port_of(port: u16) -> anyhow::Result<u16> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))?.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("replication").query_async(&mut c).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("master_port:"))
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no master_port in INFO replication of {port}"))
}

/// Wait until every replica key of `key` is readable with `payload` from some replica node.
async fn replicated(replicas: &[u16], key: &str, payload: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut conns = Vec::new();
    for p in replicas {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{p}"))?.get_multiplexed_async_connection().await?;
        let _: () = redis::cmd("READONLY").query_async(&mut c).await?;
        conns.push(c);
    }
    for i in 0..N {
        let rkey = replica_key(key, i);
        'key: loop {
            for c in conns.iter_mut() {
                // A node that does not serve the slot answers MOVED (an error): try the next.
                if let Ok(Some(d)) = redis::cmd("HGET").arg(&rkey).arg("d").query_async::<Option<String>>(c).await {
                    if d == payload {
                        break 'key;
                    }
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "{rkey} not replicated within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

/// `READS` gets of `key` through `c` (local caching off: each is a fill); HMGET calls per node
/// during them.
async fn reads_per_node(c: &Consumer, key: &str, payload: &str, nodes: &[u16]) -> anyhow::Result<HashMap<u16, u64>> {
    let mut before = HashMap::new();
    for &p in nodes {
        before.insert(p, hmget_calls(p).await?);
    }
    for _ in 0..READS {
        assert_eq!(c.get(key).await?.as_deref(), Some(payload));
    }
    let mut delta = HashMap::new();
    for &p in nodes {
        delta.insert(p, hmget_calls(p).await? - before[&p]);
    }
    Ok(delta)
}

fn max_over_mean(counts: &[u64]) -> f64 {
    let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
    *counts.iter().max().unwrap_or(&0) as f64 / mean
}

/// One key with 8 replicas spread unevenly (one master holds at least 4): master-balanced
/// reads load the 3 masters equally (uniform replica choice would give one of them 1.5x its
/// share or more); with `read_from_replica_nodes` each shard's reads split between the master
/// and its replica node; values are right and eviction works on values read from replica nodes.
#[tokio::test(flavor = "multi_thread")]
async fn reads_balance_over_masters_and_optionally_replica_nodes() -> anyhow::Result<()> {
    init_tracing();
    let cluster = tokio::task::spawn_blocking(|| binval_testkit::ReplicatedCluster::start_new(1)).await??;
    let urls = cluster.urls();
    let master_of = cluster_master_of(&urls)?;
    let key = (0..2000)
        .map(|i| format!("item:detail:{i}"))
        .find(|k| {
            let p = Placement::of(k, N, &master_of);
            p.masters() == 3 && p.groups().iter().any(|(_, g)| g.len() >= 4)
        })
        .expect("a key with 4+ of its 8 replicas on one master");
    let placement = Placement::of(&key, N, &master_of);
    let layout: Vec<usize> = placement.groups().iter().map(|(_, g)| g.len()).collect();
    let payload = r#"{"id":1,"name":"lamp"}"#;
    let client = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = client.get_async_connection().await?;
    write_fenced(&mut w, &key, N, payload, 7).await?;
    replicated(&cluster.replicas, &key, payload).await?;

    let mut shard_of_node = HashMap::new();
    for &m in &cluster.masters {
        shard_of_node.insert(m, m);
    }
    for &r in &cluster.replicas {
        shard_of_node.insert(r, master_port_of(r).await?);
    }
    let nodes: Vec<u16> = cluster.masters.iter().chain(&cluster.replicas).copied().collect();
    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let uncached = CacheMode::Prefixes(vec!["not-this-key:".into()]);

    // Masters only (the default).
    let c = builder(&topic).redis_cluster(urls.clone()).replicas(N).cache_mode(uncached.clone()).build().await?;
    let d = reads_per_node(&c, &key, payload, &nodes).await?;
    let per_master: Vec<u64> = cluster.masters.iter().map(|m| d[m]).collect();
    let on_replica_nodes: u64 = cluster.replicas.iter().map(|r| d[r]).sum();
    println!(
        "replicas per master {layout:?}; {READS} fills, masters only: per master {per_master:?}, max/mean {:.2} (uniform replica choice: {:.2})",
        max_over_mean(&per_master),
        placement.uniform_max_over_mean(3)
    );
    assert_eq!(per_master.iter().sum::<u64>(), READS, "one read per fill: {d:?}");
    assert_eq!(on_replica_nodes, 0, "{d:?}");
    assert!(max_over_mean(&per_master) < 1.25, "{per_master:?}");
    c.shutdown().await;

    // Masters and their replica nodes.
    let c = builder(&topic).redis_cluster(urls.clone()).replicas(N).cache_mode(uncached).read_from_replica_nodes(true).build().await?;
    let d = reads_per_node(&c, &key, payload, &nodes).await?;
    let per_shard: Vec<u64> =
        cluster.masters.iter().map(|m| d.iter().filter(|(n, _)| shard_of_node[*n] == *m).map(|(_, v)| v).sum()).collect();
    let on_replica_nodes: u64 = cluster.replicas.iter().map(|r| d[r]).sum();
    println!(
        "{READS} fills with replica nodes: per node {d:?}; per shard {per_shard:?}, max/mean {:.2}; {on_replica_nodes} served by replica nodes",
        max_over_mean(&per_shard)
    );
    assert_eq!(per_shard.iter().sum::<u64>(), READS, "{d:?}");
    assert!(max_over_mean(&per_shard) < 1.25, "{per_shard:?}");
    assert!((READS * 3 / 10..=READS * 7 / 10).contains(&on_replica_nodes), "about half on replica nodes: {d:?}");
    c.shutdown().await;

    // Cached values read from replica nodes are exact pairs: the next event evicts them.
    let c = builder(&topic).redis_cluster(urls.clone()).replicas(N).read_from_replica_nodes(true).build().await?;
    assert_eq!(c.get(&key).await?.as_deref(), Some(payload));
    assert_eq!(c.cached_version(&key), Some(7));
    let mut rx = c.subscribe_evictions();
    write_fenced(&mut w, &key, N, "v8", 8).await?;
    replicated(&cluster.replicas, &key, "v8").await?;
    publish(&producer(&binval_testkit::broker().bootstrap())?, &topic, &event(&key, 8)).await?;
    assert!(wait_notice(&mut rx, &key, 8, Duration::from_secs(15)).await?.evicted);
    assert_eq!(c.get(&key).await?.as_deref(), Some("v8"));
    assert_eq!(c.cached_version(&key), Some(8));
    c.shutdown().await;
    Ok(())
}
