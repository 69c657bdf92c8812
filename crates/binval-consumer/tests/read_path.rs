//! The read path's protections against real services (standalone Redis and the tansu broker
//! from binval-testkit): single-flight of concurrent misses, the miss rate limit with its stale
//! fallback, and TTL jitter. Nothing here asserts a latency.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::ConsumerError;
use common::*;

const WAIT: Duration = Duration::from_secs(15);

/// 50 concurrent gets of one cold key: exactly one fill (one Redis round trip), same value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_share_one_fill() -> anyhow::Result<()> {
    let mut sc = Scene::new("sf", 1, 1).await?;
    let key = sc.key.clone();
    let payload = r#"{"id":1,"name":"single"}"#;
    sc.write(4, payload, 7).await?;
    let c = sc.consumer(4).build().await?;

    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (c, key, barrier) = (c.clone(), key.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.get(&key).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await??.as_deref(), Some(payload));
    }
    let s = c.stats();
    println!("50 concurrent gets of a cold key: {s:?}");
    assert_eq!(s.fills, 1, "{s:?}");
    assert_eq!(s.hits + s.misses, 50, "{s:?}");
    assert_eq!(c.cached_version(&key), Some(7));
    c.shutdown().await;
    Ok(())
}

/// A shared fill that the fill-race guard refuses: every waiter gets the value, nothing is
/// cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_shared_fill_reaches_all_waiters_caches_nothing() -> anyhow::Result<()> {
    let mut sc = Scene::new("sf", 2, 1).await?;
    let key = sc.key.clone();
    // Redis still at version 3, but the event for version 5 has been applied already.
    sc.write(2, "v3", 3).await?;
    let c = sc.consumer(2).build().await?;
    let mut rx = c.subscribe_evictions();
    sc.publish(5).await?;
    wait_notice(&mut rx, &key, 5, WAIT).await?;

    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (c, key, barrier) = (c.clone(), key.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.get(&key).await
        }));
    }
    for t in tasks {
        assert_eq!(t.await??.as_deref(), Some("v3"));
    }
    let s = c.stats();
    println!("20 concurrent gets, guard refuses: {s:?}");
    assert_eq!(c.cached_version(&key), None);
    assert!(s.fills >= 1 && s.fills_refused == s.fills, "{s:?}");
    assert_eq!(s.hits, 0, "{s:?}");
    c.shutdown().await;
    Ok(())
}

/// Per-key limit 1/s: a refill right after an invalidation is refused and the evicted value is
/// served from the stale copy; without a stale copy the caller gets `Overloaded`.
#[tokio::test(flavor = "multi_thread")]
async fn per_key_limit_serves_stale_or_overloaded() -> anyhow::Result<()> {
    let mut sc = Scene::new("lim", 3, 1).await?;
    let key = sc.key.clone();
    sc.write(1, "v1", 1).await?;
    let c = sc
        .consumer(1)
        .max_fills_per_key_per_sec(1)
        .stale_ttl(Duration::from_secs(30))
        // The absent key below must miss every time (a cached "no row" would answer it).
        .missing_ttl(Duration::ZERO)
        .build()
        .await?;
    let mut rx = c.subscribe_evictions();
    assert_eq!(c.get(&key).await?.as_deref(), Some("v1"));

    // Change + event, then read at once. The refill normally falls within the second after the
    // previous fill and is refused; if the machine was slow enough for the second to pass, the
    // refill is admitted (and caches the new value), so go round again.
    let mut held = "v1".to_string();
    let mut served_stale = false;
    for v in 2u64..=6 {
        let new = format!("v{v}");
        sc.write(1, &new, v).await?;
        sc.publish(v).await?;
        assert!(wait_notice(&mut rx, &key, v, WAIT).await?.evicted);
        let got = c.get(&key).await?;
        if got.as_deref() == Some(held.as_str()) {
            served_stale = true;
            break;
        }
        assert_eq!(got.as_deref(), Some(new.as_str()));
        held = new;
    }
    let s = c.stats();
    println!("per-key limit, after invalidation: {s:?}");
    assert!(served_stale, "no refill was refused: {s:?}");
    assert_eq!(s.stale_served, 1, "{s:?}");
    assert_eq!(s.limiter_rejections, 1, "{s:?}");
    assert_eq!(c.cached_version(&key), None, "a stale copy is never put back in the cache");

    // No stale copy: an absent key (the first read uses the key's one fill of this second).
    let absent = format!("{}:absent", binval_testkit::unique_name("lim"));
    let mut overloaded = None;
    for _ in 0..5 {
        assert_eq!(c.get(&absent).await?, None);
        match c.get(&absent).await {
            Err(e @ ConsumerError::Overloaded { .. }) => {
                overloaded = Some(e);
                break;
            }
            Ok(None) => {} // more than a second passed between the two reads; again
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    let e = overloaded.expect("the second read within the second is refused");
    println!("{e}");
    assert!(e.to_string().contains(&absent), "{e}");
    assert_eq!(c.stats().stale_served, 1);
    c.shutdown().await;
    Ok(())
}

/// Instance-wide limit 1/s: the second fill of any key within the second is refused.
#[tokio::test(flavor = "multi_thread")]
async fn instance_limit_refuses_second_fill() -> anyhow::Result<()> {
    init_tracing();
    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let base = binval_testkit::unique_name("lim");
    let c = builder(&topic).redis_standalone(binval_testkit::redis().url()).max_fills_per_sec(1).build().await?;
    let mut refused = false;
    for i in 0..5 {
        assert_eq!(c.get(&format!("{base}:a{i}")).await?, None);
        match c.get(&format!("{base}:b{i}")).await {
            Err(ConsumerError::Overloaded { key }) => {
                assert_eq!(key, format!("{base}:b{i}"));
                refused = true;
                break;
            }
            Ok(None) => {}
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert!(refused);
    assert!(c.stats().limiter_rejections >= 1);
    c.shutdown().await;
    Ok(())
}

/// TTL 2 s with jitter 0.25: every entry lives between 1.5 s and 2.5 s. Checked with wide
/// margins: all present at 1.0 s, all gone at 3.5 s.
#[tokio::test(flavor = "multi_thread")]
async fn ttl_jitter_keeps_entries_within_bounds() -> anyhow::Result<()> {
    init_tracing();
    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let base = binval_testkit::unique_name("jit");
    let mut r = redis_conn().await?;
    let keys: Vec<String> = (0..20).map(|i| format!("{base}:{i}")).collect();
    for k in &keys {
        write_standalone(&mut r, k, 1, "x", 1).await?;
    }
    let c = builder(&topic).redis_standalone(binval_testkit::redis().url()).ttl(Duration::from_secs(2)).ttl_jitter(0.25).build().await?;
    let first_fill = Instant::now();
    for k in &keys {
        assert_eq!(c.get(k).await?.as_deref(), Some("x"));
    }
    let last_fill = Instant::now();
    tokio::time::sleep_until((first_fill + Duration::from_millis(1000)).into()).await;
    if first_fill.elapsed() < Duration::from_millis(1400) {
        for k in &keys {
            assert_eq!(c.cached_version(k), Some(1), "{k} gone before ttl*(1-j)");
        }
    } else {
        println!("machine too slow to check the lower bound ({:?})", first_fill.elapsed());
    }
    tokio::time::sleep_until((last_fill + Duration::from_millis(3500)).into()).await;
    for k in &keys {
        assert_eq!(c.cached_version(k), None, "{k} still cached after ttl*(1+j)");
    }
    c.shutdown().await;
    Ok(())
}

/// An out-of-range jitter is a config error naming the field (before any connection).
#[tokio::test]
async fn ttl_jitter_out_of_range_is_config_error() {
    for bad in [-0.1, 1.0, 2.5, f64::NAN] {
        let err = binval_consumer::Consumer::builder()
            .redis_standalone("redis://127.0.0.1:1")
            .brokers("127.0.0.1:1")
            .topic("t")
            .ttl_jitter(bad)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, ConsumerError::Config { field: "ttl_jitter", .. }), "{bad}: {err}");
    }
}

/// `calls=` of `cmdstat_<cmd>` in `INFO commandstats` of one node.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let prefix = format!("cmdstat_{cmd}:");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0))
}

/// The fill-race test, with a real pause: on the 3-master cluster, the master of the key's
/// only replica is paused (`CLIENT PAUSE`), so a fill's replica read waits there, and the event
/// of change 6 is applied meanwhile — the fill's answer (the record at position 5, read before
/// change 6 reached the replica) is overtaken by the event, as when a fill's reply is slow to
/// arrive. Then the pause ends and the fill gets the old record: it is returned to the caller
/// and not cached.
#[tokio::test(flavor = "multi_thread")]
async fn fill_paused_in_its_replica_read_is_not_cached() -> anyhow::Result<()> {
    init_tracing();
    let broker = binval_testkit::broker();
    let topic = create_topic(&broker.bootstrap(), 1).await?;
    let urls = binval_testkit::redis_cluster().urls();
    let mut nodes = Vec::new();
    for u in &urls {
        nodes.push(redis::Client::open(u.as_str())?.get_multiplexed_async_connection().await?);
    }
    let key = format!("item:{}:1", binval_testkit::unique_name("pause"));
    // The node that owns the replica: the one that answers for it without a MOVED redirect.
    let rkey = binval_protocol::replica_key(&key, 0);
    let mut rep_node = None;
    for (i, n) in nodes.iter_mut().enumerate() {
        if redis::cmd("EXISTS").arg(&rkey).query_async::<i64>(n).await.is_ok() {
            rep_node = Some(i);
        }
    }
    let rep_node = rep_node.expect("a node owns the replica");
    let cluster = redis::cluster::ClusterClient::new(urls.clone())?;
    let mut w = cluster.get_async_connection().await?;
    write_fenced(&mut w, &key, 1, "old", 5).await?;

    // The guard must outlive the longest fill: up to max_replica_reads + 1 reads (the
    // replica-0 rule) of 10 s each.
    let c = builder(&topic)
        .redis_cluster(urls.clone())
        .replicas(1)
        .redis_response_timeout(Duration::from_secs(10))
        .fill_guard_ttl(Duration::from_secs(40))
        .build()
        .await?;
    let mut rx = c.subscribe_evictions();
    let hmgets_before = command_calls(&mut nodes[rep_node], "hmget").await?;

    const PAUSE_MS: u64 = 3000;
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(PAUSE_MS).arg("ALL").query_async(&mut nodes[rep_node]).await?;
    let paused_at = Instant::now();
    let fill = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { c.get(&key).await })
    };
    // The fill's read is on its way (it waits in the paused node); the event of 6 overtakes it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    anyhow::ensure!(!fill.is_finished(), "the fill did not wait for the paused master");
    publish(&producer(&broker.bootstrap())?, &topic, &event(&key, 6)).await?;
    let notice = wait_notice(&mut rx, &key, 6, WAIT).await?;
    let applied_after = paused_at.elapsed();
    let finished_early = fill.is_finished();
    let got = fill.await??;
    let s = c.stats();
    println!("event applied {applied_after:?} into the {PAUSE_MS} ms pause; fill returned {got:?}; {s:?}");
    let hmgets_after = command_calls(&mut nodes[rep_node], "hmget").await?;
    assert!(hmgets_after > hmgets_before, "the fill read the paused master");
    if finished_early || applied_after >= Duration::from_millis(PAUSE_MS) {
        println!("machine too slow: the pause ended before the event was applied; race not exercised");
        c.shutdown().await;
        return Ok(());
    }
    assert!(!notice.evicted, "nothing was cached yet: {notice:?}");
    assert_eq!(got.as_deref(), Some("old"), "the caller gets what the fill read");
    assert_eq!((s.fills, s.fills_refused), (1, 1), "{s:?}");
    assert_eq!(c.cached_version(&key), None, "a fill older than the applied event must not be cached");
    c.shutdown().await;
    Ok(())
}

/// A fill that reads a replica one change behind (the writer is between replicas: r1 holds
/// version 6, r0 still 5) caches the exact older pair — (old value, 5), never the old value at
/// 6 — and converges: the event of 6, published after every replica holds it, evicts it, and the
/// next fill reads 6.
#[tokio::test(flavor = "multi_thread")]
async fn fill_of_a_replica_one_change_behind_converges() -> anyhow::Result<()> {
    let mut sc = Scene::new("behind", 1, 1).await?;
    let key = sc.key.clone();
    sc.write(2, "v5", 5).await?;
    // The writer of change 6 has written r1 only (no version token, no event yet).
    let replica_script = redis::Script::new(&binval_protocol::fence::replica_write_script());
    let _: i64 = replica_script
        .key(binval_protocol::replica_key(&key, 1))
        .arg(6)
        .arg(1)
        .arg("set")
        .arg("v6")
        .arg(0)
        .invoke_async(&mut sc.redis)
        .await?;
    // The app reads r0 only (replicas(1)): the lagging replica, deterministically.
    let c = sc.consumer(1).build().await?;
    let mut rx = c.subscribe_evictions();
    assert_eq!(c.get(&key).await?.as_deref(), Some("v5"));
    assert_eq!(c.cached_version(&key), Some(5), "cached at the replica's own position, not the newest");
    assert_eq!(c.get(&key).await?.as_deref(), Some("v5"), "a hit until the change's event");
    // The writer finishes change 6 (r0, the version token), then publishes its event.
    sc.write(2, "v6", 6).await?;
    sc.publish(6).await?;
    assert!(wait_notice(&mut rx, &key, 6, WAIT).await?.evicted, "the event of 6 evicts the entry at 5");
    assert_eq!(c.get(&key).await?.as_deref(), Some("v6"));
    assert_eq!(c.cached_version(&key), Some(6));
    let s = c.stats();
    assert_eq!((s.fills, s.fills_refused, s.evictions), (2, 0, 1), "{s:?}");
    c.shutdown().await;
    Ok(())
}
