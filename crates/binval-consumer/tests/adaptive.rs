//! Adaptive replica counts (issue #23, `binval_protocol::adaptive`) against real services: a
//! 3-master Redis Cluster and the standalone Redis from binval-testkit, and the tansu broker.
//! The reader learns each key's count from field `n` of the records, a missing replica sends
//! the read to replica 0 (so a reader configured with more replicas than exist, or one that
//! still believes a count that shrank, never answers "no row" for an existing row), the hot set
//! seeds counts at start, and the heat report names the keys this instance reads with their
//! rates.

mod common;

use std::time::{Duration, Instant};

use binval_consumer::{CacheMode, Consumer, ConsumerBuilder};
use binval_protocol::adaptive::{heat_bucket_key, heat_bucket_of, HeatReport, HOT_SET_KEY};
use binval_protocol::replica_key;
use common::*;
use redis::cluster_async::ClusterConnection;

/// The hot set (`binval:hot`) is one hash per Redis, which every consumer reads at start and
/// at each refresh: the test that writes entries into it holds this lock alone, every other
/// test holds it shared, so no test's consumer learns counts from another test's entries
/// (which made `learned_counts` 2 where 1 was expected, once under CI load).
static HOT_SET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A Cluster connection of the shared 3-master cluster.
async fn cluster() -> anyhow::Result<ClusterConnection> {
    let client = redis::cluster::ClusterClient::new(binval_testkit::redis_cluster().urls())?;
    Ok(client.get_async_connection().await?)
}

/// `HSET K:ri d <payload> p <position> f 1 [n <count>]` for every `i` in `replicas`: a record
/// as binval writes it, by hand.
async fn put<C: redis::aio::ConnectionLike + Send>(
    c: &mut C,
    key: &str,
    replicas: std::ops::Range<u32>,
    payload: &str,
    position: u64,
    count: Option<u32>,
) -> anyhow::Result<()> {
    for i in replicas {
        let mut cmd = redis::cmd("HSET");
        cmd.arg(replica_key(key, i)).arg("d").arg(payload).arg("p").arg(position).arg("f").arg(1);
        if let Some(n) = count {
            cmd.arg("n").arg(n);
        }
        let _: i64 = cmd.query_async(c).await?;
    }
    Ok(())
}

/// A consumer of a fresh topic over the shared cluster, local caching off for every key used
/// here (each `get` is a fill), `replicas` the configured count.
async fn uncached_cluster_consumer(replicas: u32, more: impl FnOnce(ConsumerBuilder) -> ConsumerBuilder) -> anyhow::Result<Consumer> {
    let topic = create_topic(&binval_testkit::broker().bootstrap(), 1).await?;
    let b = builder(&topic)
        .redis_cluster(binval_testkit::redis_cluster().urls())
        .replicas(replicas)
        .cache_mode(CacheMode::Prefixes(vec!["not-cached:".into()]));
    Ok(more(b).build().await?)
}

/// Seconds since `rkey` was last read or written (`OBJECT IDLETIME`, 1 s resolution).
async fn idle_secs(c: &mut ClusterConnection, rkey: &str) -> anyhow::Result<u64> {
    Ok(redis::cmd("OBJECT").arg("IDLETIME").arg(rkey).query_async(c).await?)
}

/// (b) A reader configured with 1 replica reads a key binval keeps in 8 (records `n = 8`):
/// after one fill it uses 8, and its next fills read every one of the 8 replicas (each read
/// finds a value: no fallback, one read per fill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fill_teaches_the_count_and_reads_spread() -> anyhow::Result<()> {
    let _shared = HOT_SET.read().await;
    init_tracing();
    let mut w = cluster().await?;
    let key = format!("item:adaptive:{}", binval_testkit::unique_name("spread"));
    put(&mut w, &key, 0..8, r#"{"id":1}"#, 10, Some(8)).await?;
    let c = uncached_cluster_consumer(1, |b| b).await?;
    assert_eq!(c.replica_count(&key), 1, "starts at the configured count");
    // Let the records' idle time grow, so the replicas the fills read stand out.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_eq!(c.get(&key).await?.as_deref(), Some(r#"{"id":1}"#));
    assert_eq!(c.replica_count(&key), 8, "one fill read n = 8");
    for i in 1..8 {
        assert!(idle_secs(&mut w, &replica_key(&key, i)).await? >= 2, "r{i} not read yet");
    }
    for _ in 0..400 {
        assert_eq!(c.get(&key).await?.as_deref(), Some(r#"{"id":1}"#));
    }
    let mut idle = Vec::new();
    for i in 0..8 {
        idle.push(idle_secs(&mut w, &replica_key(&key, i)).await?);
    }
    let s = c.stats();
    println!("idle seconds of r0..r7 after 400 fills: {idle:?}; {s:?}");
    assert!(idle.iter().all(|&t| t <= 1), "every replica read by the 400 fills: idle {idle:?}");
    assert_eq!((s.fills, s.redis_reads, s.replica_zero_fallbacks, s.missing), (401, 401, 0, 0), "{s:?}");
    assert_eq!(s.learned_counts, 1, "{s:?}");
    c.shutdown().await;
    Ok(())
}

/// (c) A reader configured with 16 replicas, on keys binval keeps in 8 (r0..r7 only): with
/// `n = 8` in the records it learns 8 at the first fill; with records written before `n`
/// existed it keeps 16, and every read of a replica 8..15 finds it missing and goes to
/// replica 0. 1,000 fills each, local caching off: never "no row", never an error; with
/// `max_replica_reads(1)` as well (the replica-0 read is the one read past the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_configured_count_never_answers_no_row() -> anyhow::Result<()> {
    let _shared = HOT_SET.read().await;
    init_tracing();
    let mut w = cluster().await?;
    let base = binval_testkit::unique_name("larger");
    let (with_n, old) = (format!("item:{base}:n"), format!("item:{base}:old"));
    put(&mut w, &with_n, 0..8, "with-n", 5, Some(8)).await?;
    put(&mut w, &old, 0..8, "old", 5, None).await?;
    // The share of fills whose first read is one of replicas 8..15 (master-balanced: a master
    // uniformly, then a replica on it), from the cluster's slot map.
    let master_of = cluster_master_of(&binval_testkit::redis_cluster().urls())?;
    let p = binval_protocol::placement::Placement::of(&old, 16, &master_of);
    let groups = p.groups();
    let share: f64 =
        groups.iter().map(|(_, g)| g.iter().filter(|&&i| i >= 8).count() as f64 / g.len() as f64).sum::<f64>() / groups.len() as f64;

    for reads in [2u32, 1] {
        let c = uncached_cluster_consumer(16, |b| b.max_replica_reads(reads)).await?;
        for _ in 0..1000 {
            assert_eq!(c.get(&with_n).await?.as_deref(), Some("with-n"));
        }
        assert_eq!(c.replica_count(&with_n), 8);
        let s = c.stats();
        println!("max_replica_reads({reads}), n = 8: {s:?}");
        assert_eq!((s.fills, s.missing), (1000, 0), "{s:?}");
        assert!(s.replica_zero_fallbacks <= 1, "only the first fill can read a replica above 7: {s:?}");
        assert!(s.redis_reads <= 1001, "{s:?}");
        c.shutdown().await;

        let c = uncached_cluster_consumer(16, |b| b.max_replica_reads(reads)).await?;
        for _ in 0..1000 {
            assert_eq!(c.get(&old).await?.as_deref(), Some("old"));
        }
        assert_eq!(c.replica_count(&old), 16, "no record says otherwise");
        let s = c.stats();
        println!("max_replica_reads({reads}), records without n: {s:?}");
        assert_eq!((s.fills, s.missing), (1000, 0), "{s:?}");
        // Half the replicas do not exist: about `share` of the fills go on to replica 0 (±100
        // is more than six standard deviations).
        let expected = share * 1000.0;
        assert!((s.replica_zero_fallbacks as f64 - expected).abs() <= 100.0, "expected ~{expected:.0}: {s:?}");
        assert_eq!(s.redis_reads, 1000 + s.replica_zero_fallbacks, "one read, plus replica 0 after a missing one: {s:?}");
        c.shutdown().await;
    }
    Ok(())
}

/// (d) A shrink 8 -> 1 as binval's leader does it: `n = 1` announced on every replica (the
/// fenced count script), a grace period, then r1..r7 removed (the fenced remove script). A
/// reader reading all along, and readers that learned 8 before and read only after the
/// removal, answer the value every time: no "no row", no error; afterwards they use 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shrink_never_loses_the_row() -> anyhow::Result<()> {
    let _shared = HOT_SET.read().await;
    init_tracing();
    let mut w = cluster().await?;
    let base = binval_testkit::unique_name("shrink");
    let keys: Vec<String> = (0..20).map(|i| format!("item:{base}:{i}")).collect();
    for k in &keys {
        put(&mut w, k, 0..8, "v", 7, Some(8)).await?;
    }
    let busy = uncached_cluster_consumer(1, |b| b).await?;
    let later = uncached_cluster_consumer(1, |b| b).await?;
    for k in &keys {
        assert_eq!(busy.get(k).await?.as_deref(), Some("v"));
        assert_eq!(later.get(k).await?.as_deref(), Some("v"));
        assert_eq!((busy.replica_count(k), later.replica_count(k)), (8, 8));
    }
    // The busy reader reads key 0 without a pause while the shrink happens.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reading = {
        let (c, k, stop) = (busy.clone(), keys[0].clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut bad) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match c.get(&k).await {
                    Ok(Some(v)) if v == "v" => ok += 1,
                    other => bad.push(format!("{other:?}")),
                }
            }
            (ok, bad)
        })
    };
    let count = redis::Script::new(&binval_protocol::adaptive::replica_count_script());
    let remove = redis::Script::new(&binval_protocol::adaptive::replica_remove_script());
    for k in &keys {
        for i in 0..8 {
            let r: i64 = count.key(replica_key(k, i)).arg(1).arg(1).invoke_async(&mut w).await?;
            assert_eq!(r, 1);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // the grace period
    for k in &keys {
        for i in 1..8 {
            let r: i64 = remove.key(replica_key(k, i)).arg(1).invoke_async(&mut w).await?;
            assert_eq!(r, 1);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, bad) = reading.await?;
    println!("busy reader during the shrink: {ok} values, bad {bad:?}; {:?}", busy.stats());
    assert!(bad.is_empty(), "{bad:?}");
    assert!(ok > 100, "{ok}");
    assert_eq!(busy.replica_count(&keys[0]), 1);

    // The other reader still believes 8 for every key: its first read of each goes to a random
    // replica of 0..8, 7 in 8 of them removed, and on to replica 0.
    for round in 0..50 {
        for k in &keys {
            assert_eq!(later.get(k).await?.as_deref(), Some("v"), "round {round} {k}");
        }
    }
    let s = later.stats();
    println!("reader that believed 8: {s:?}");
    assert!(keys.iter().all(|k| later.replica_count(k) == 1));
    assert_eq!(s.missing, 0, "{s:?}");
    assert!((1..=20).contains(&s.replica_zero_fallbacks), "at most one fallback per key: {s:?}");
    assert_eq!(s.learned_counts, 0, "1 is the configured count: no entry needed {s:?}");
    busy.shutdown().await;
    later.shutdown().await;
    Ok(())
}

/// (e) The hot set (`binval:hot`) seeds the counts at start, before any read; bad entries are
/// skipped with a warning (never a failed build); an entry added later arrives with the
/// refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_set_seeds_counts_at_start() -> anyhow::Result<()> {
    let _alone = HOT_SET.write().await;
    init_tracing();
    let mut w = cluster().await?;
    let base = binval_testkit::unique_name("hotset");
    let (hot, bad, zero, later) =
        (format!("item:{base}:hot"), format!("item:{base}:bad"), format!("item:{base}:zero"), format!("item:{base}:later"));
    let _: i64 = redis::cmd("HSET").arg(HOT_SET_KEY).arg(&hot).arg(8).arg(&bad).arg("lots").arg(&zero).arg(0).query_async(&mut w).await?;
    let c = uncached_cluster_consumer(2, |b| b.hot_set_refresh(Duration::from_secs(1))).await?;
    assert_eq!(c.replica_count(&hot), 8, "from the hot set, before any read");
    assert_eq!((c.replica_count(&bad), c.replica_count(&zero)), (2, 2), "bad entries are no count information");
    assert_eq!(c.stats().hot_set_load_failures, 0);
    // A read of a record without `n` keeps it; one with `n` corrects it.
    put(&mut w, &hot, 0..8, "h", 3, None).await?;
    assert_eq!(c.get(&hot).await?.as_deref(), Some("h"));
    assert_eq!(c.replica_count(&hot), 8);
    put(&mut w, &hot, 0..8, "h", 4, Some(4)).await?;
    assert_eq!(c.get(&hot).await?.as_deref(), Some("h"));
    assert_eq!(c.replica_count(&hot), 4, "the records win over the hot set");

    let _: i64 = redis::cmd("HSET").arg(HOT_SET_KEY).arg(&later).arg(16).query_async(&mut w).await?;
    let t = Instant::now();
    while c.replica_count(&later) != 16 {
        assert!(t.elapsed() < Duration::from_secs(5), "the refresh did not bring the new entry");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.replica_count(&hot), 4, "a refresh does not override what a record said");
    let _: i64 = redis::cmd("HDEL").arg(HOT_SET_KEY).arg(&hot).arg(&bad).arg(&zero).arg(&later).query_async(&mut w).await?;
    c.shutdown().await;
    Ok(())
}

/// Read `key` from `c` at about `rate` gets per second (local hits) until `stop`, in a task;
/// returns how many gets it made.
fn read_at(c: &Consumer, key: &str, rate: u32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> tokio::task::JoinHandle<u64> {
    let (c, key) = (c.clone(), key.to_string());
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut done = 0u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let due = (t0.elapsed().as_secs_f64() * f64::from(rate)) as u64;
            while done < due {
                c.get(&key).await.expect("a local hit");
                done += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        done
    })
}

/// This instance's report, if its field exists.
async fn report_of(r: &mut redis::aio::MultiplexedConnection, id: &str) -> anyhow::Result<Option<HeatReport>> {
    let raw: Option<Vec<u8>> = redis::cmd("HGET").arg(heat_bucket_key(heat_bucket_of(id))).arg(id).query_async(r).await?;
    Ok(match raw {
        None => None,
        Some(b) => Some(HeatReport::parse(&b).map_err(anyhow::Error::msg)?),
    })
}

/// (f) Heat reports: a key this instance reads at a steady 20,000 gets/s is in its report at
/// close to that rate; another key that goes from idle to 30,000 gets/s is reported at
/// >= 25,000 within about a second and a fifth (measured; asserted with a margin for a busy
/// machine); the field is removed at shutdown; a cold key is not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heat_reports_follow_the_reads() -> anyhow::Result<()> {
    let _shared = HOT_SET.read().await;
    let mut sc = Scene::new("heat", 1, 1).await?;
    let (steady, step, cold) = (sc.key.clone(), format!("{}:step", sc.key), format!("{}:cold", sc.key));
    for k in [&steady, &step, &cold] {
        write_standalone(&mut sc.redis, k, 1, "x", 1).await?;
    }
    let id = binval_testkit::unique_name("instance");
    let c = sc.consumer(1).instance_id(&id).build().await?;
    assert_eq!(c.instance_id(), id);
    assert_eq!(report_of(&mut sc.redis, &id).await?, None, "nothing read: nothing reported");
    c.get(&cold).await?;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t0 = Instant::now();
    let steady_task = read_at(&c, &steady, 20_000, stop.clone());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let report = report_of(&mut sc.redis, &id).await?.expect("a report");
    let rate = report.keys.iter().find(|(k, _)| *k == steady).map(|(_, r)| *r);
    println!("after 2.5 s at 20,000 gets/s: {report:?}");
    let rate = rate.expect("the steady key is reported");
    assert!((14_000.0..=26_000.0).contains(&rate), "{rate}");
    assert!(!report.keys.iter().any(|(k, _)| *k == cold), "{report:?}");

    // The step: from idle to 30,000 gets/s.
    let step_at = Instant::now();
    let step_ms = common::now_ms();
    let step_task = read_at(&c, &step, 30_000, stop.clone());
    let seen = loop {
        let r = report_of(&mut sc.redis, &id).await?.expect("a report");
        if let Some((_, rate)) = r.keys.iter().find(|(k, _)| *k == step) {
            if *rate >= 25_000.0 && r.at_ms >= step_ms {
                break (step_at.elapsed(), *rate);
            }
        }
        assert!(step_at.elapsed() < Duration::from_secs(5), "no report with the step key at >= 25,000 within 5 s: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (steady_gets, step_gets) = (steady_task.await?, step_task.await?);
    println!(
        "step to 30,000 gets/s reported at {:.0} after {:?}; gets: steady {steady_gets} in {:?}, step {step_gets}; {:?}",
        seen.1,
        seen.0,
        t0.elapsed(),
        c.stats()
    );
    assert!(seen.0 <= Duration::from_millis(2000), "the step took {:?} to be reported (about 1.2 s expected)", seen.0);
    let s = c.stats();
    assert!(s.heat_reports_sent >= 3 && s.heat_reports_failed == 0, "{s:?}");
    c.shutdown().await;
    assert_eq!(report_of(&mut sc.redis, &id).await?, None, "the report is removed at shutdown");
    Ok(())
}

/// Heat reports refused by the ACL (`NOPERM`): counted, never a failed read, and the consumer
/// keeps working; the hot set refused too: a warning, not a failed build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_reports_are_counted_not_fatal() -> anyhow::Result<()> {
    let _shared = HOT_SET.read().await;
    let mut sc = Scene::new("heatacl", 1, 1).await?;
    let key = sc.key.clone();
    write_standalone(&mut sc.redis, &key, 1, "x", 1).await?;
    let user = binval_testkit::unique_name("reader");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">pw")
        .arg("resetkeys")
        .arg(format!("%R~{}*", key.split(':').next().unwrap_or(&key)))
        .arg("resetchannels")
        .arg("-@all")
        .arg("+ping")
        .arg("+hmget")
        .arg("+hgetall")
        .arg("+hset")
        .arg("+hdel")
        .query_async(&mut sc.redis)
        .await?;
    let c = sc
        .consumer(1)
        .redis_user(Some(&user), binval_consumer::Secret::new("pw"))
        .hot_key_sample_every(1)
        .heat_report_min_rate(1.0)
        .heat_report_interval(Duration::from_millis(200))
        .build()
        .await?;
    assert_eq!(c.stats().hot_set_load_failures, 1, "HGETALL binval:hot refused: {:?}", c.stats());
    let t = Instant::now();
    while c.stats().heat_reports_failed < 3 {
        assert_eq!(c.get(&key).await?.as_deref(), Some("x"));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", c.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = c.stats();
    println!("reports refused by the ACL: {s:?}");
    assert_eq!(s.heat_reports_sent, 0, "{s:?}");
    c.shutdown().await;
    let _: () = redis::cmd("ACL").arg("DELUSER").arg(&user).query_async(&mut sc.redis).await?;
    Ok(())
}
