//! The hot-key scenario of the design note, as numbers: several client tasks read **one** key
//! as fast as they can for a few seconds against a real 3-master Redis Cluster
//! (binval-testkit). Rows:
//!
//! - **(a) plain**: one string key without binval (`GET K`): every read hits one master.
//! - **(b) replicas, uniform**: the key as N = 8 suffix replicas in binval's fenced record
//!   format; every read is `HMGET K:r{i} d t p` of a replica chosen uniformly (the consumer's
//!   choice before issue #10).
//! - **(b2) replicas, master-balanced**: the same reads, the replica chosen master-balanced
//!   ([`binval_protocol::placement`]: a master uniformly among those holding a replica, then a
//!   replica on it — the consumer's choice now).
//! - **(c) replicas + local cache**: the same replicas read through [`Consumer::get_shared`]
//!   (local cache, single-flight, fills of one replica each), while a writer changes the key
//!   every `BENCH_UPDATE_MS` (default 100 ms) in binval's order — all replicas, the version
//!   token, then an invalidation event on the tansu broker — so the local cache keeps being
//!   invalidated and refilled as in production.
//! - **(d) consumer, local caching off**: `Consumer::get_shared` with a cache mode that caches
//!   nothing (as `CacheMode::HotOnly` before a key is detected hot, or the fail safe's bypass):
//!   every `get` is a fill (concurrent ones share it: single-flight).
//! - **(e) hot missing key**: a key no replica holds, through the consumer with its defaults
//!   (at most 2 replica reads per fill, "no row" cached for 1 s); **(e1)** the same with
//!   `max_replica_reads(1)`; **(f)** a hot deleted key (tombstones in every replica).
//!
//! The bench key is chosen so its 8 replicas lie on all 3 masters unevenly (one master holds
//! 4 or more): the layout that uniform choice spreads worst among keys that can be spread.
//! For each row it prints reads served (and per second), reads that reached Redis, and per
//! master the `GET`+`HMGET` calls and CPU time from `INFO commandstats` / `INFO cpu` deltas,
//! and max/mean of those calls over the masters, as a markdown table. Numbers, not assertions.
//! Client, masters and broker share this machine's cores: the per-master spread and the reads
//! that reach Redis are the point, the absolute rates are this machine's.
//!
//! Run: `cargo bench -p binval-consumer --bench hot_key` (env: `BENCH_SECS` default 3,
//! `BENCH_TASKS` default 32, `BENCH_UPDATE_MS` default 100).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::{CacheMode, Consumer};
use binval_protocol::fence::{replica_write_script, version_bump_script};
use binval_protocol::placement::Placement;
use binval_protocol::{replica_key, version_key, InvalidationEvent, Op, SourcePosition};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use redis::cluster_async::ClusterConnection;

const REPLICAS: u32 = 8;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Per master: (GET + HMGET calls, CPU seconds user+sys).
#[derive(Debug, Clone, Copy, Default)]
struct MasterSample {
    reads: u64,
    cpu_s: f64,
}

async fn sample_master(conn: &mut redis::aio::MultiplexedConnection) -> MasterSample {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("INFO commandstats");
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.expect("INFO cpu");
    let mut reads = 0;
    for line in stats.lines() {
        if let Some(rest) = line.strip_prefix("cmdstat_get:").or_else(|| line.strip_prefix("cmdstat_hmget:")) {
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|c| c.parse::<u64>().ok());
            reads += calls.unwrap_or(0);
        }
    }
    let mut cpu_s = 0.0;
    for line in cpu.lines() {
        if let Some(v) = line.strip_prefix("used_cpu_user:").or_else(|| line.strip_prefix("used_cpu_sys:")) {
            cpu_s += v.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    MasterSample { reads, cpu_s }
}

async fn sample_all(masters: &mut [redis::aio::MultiplexedConnection]) -> Vec<MasterSample> {
    let mut out = Vec::new();
    for m in masters.iter_mut() {
        out.push(sample_master(m).await);
    }
    out
}

struct Row {
    name: &'static str,
    served: u64,
    secs: f64,
    to_redis: u64,
    per_master: Vec<(u64, f64)>,
    note: String,
}

/// Run `tasks` copies of `read` until `secs` have passed; total reads.
async fn hammer<F, Fut>(tasks: u64, secs: u64, read: F) -> (u64, f64)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let total = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (read, total) = (read.clone(), total.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                for _ in 0..64 {
                    read().await;
                    n += 1;
                }
                // A local hit never awaits anything pending: yield so all tasks take turns.
                tokio::task::yield_now().await;
            }
            total.fetch_add(n, Relaxed);
        }));
    }
    for h in handles {
        h.await.expect("reader task");
    }
    (total.load(Relaxed), start.elapsed().as_secs_f64())
}

async fn measure<F, Fut>(
    name: &'static str,
    masters: &mut [redis::aio::MultiplexedConnection],
    tasks: u64,
    secs: u64,
    read: F,
) -> (Row, Vec<MasterSample>)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let before = sample_all(masters).await;
    let (served, el) = hammer(tasks, secs, read).await;
    let after = sample_all(masters).await;
    let per_master: Vec<(u64, f64)> =
        before.iter().zip(&after).map(|(b, a)| (a.reads.saturating_sub(b.reads), a.cpu_s - b.cpu_s)).collect();
    (Row { name, served, secs: el, to_redis: served, per_master, note: String::new() }, after)
}

fn event(key: &str, version: u64) -> InvalidationEvent {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    InvalidationEvent {
        schema: 1,
        key: key.to_string(),
        version,
        op: Op::Update,
        table: "shop.items".into(),
        position: SourcePosition { file: "mysql-bin.000001".into(), pos: version, gtid: None },
        commit_time_ms: now / 1000 * 1000,
        publish_time_ms: now,
    }
}

/// binval's write of one change: every replica (fenced; `kind` `set` or `del`), then the
/// version token.
async fn write_record(conn: &mut ClusterConnection, key: &str, kind: &str, payload: &str, version: u64) {
    let rs = redis::Script::new(&replica_write_script());
    let vs = redis::Script::new(&version_bump_script());
    for i in 0..REPLICAS {
        let _: i64 = rs
            .key(replica_key(key, i))
            .arg(version)
            .arg(1)
            .arg(kind)
            .arg(payload)
            .arg(60_000)
            .invoke_async(conn)
            .await
            .expect("replica write");
    }
    let _: i64 = vs.key(version_key(key)).arg(version).invoke_async(conn).await.expect("version bump");
}

async fn write_change(conn: &mut ClusterConnection, key: &str, payload: &str, version: u64) {
    write_record(conn, key, "set", payload, version).await
}

/// The bench's parameters, from the environment.
#[derive(Clone, Copy)]
struct Params {
    secs: u64,
    tasks: u64,
    update_ms: u64,
}

fn main() {
    let params = Params { secs: env_u64("BENCH_SECS", 3), tasks: env_u64("BENCH_TASKS", 32), update_ms: env_u64("BENCH_UPDATE_MS", 100) };
    let cluster = binval_testkit::redis_cluster();
    let urls = cluster.urls();
    let owners = binval_testkit::SlotOwners::read(cluster.ports[0]).expect("CLUSTER NODES");
    let broker = binval_testkit::broker();
    let topic = binval_testkit::unique_name("bench-hot");
    broker.create_topic(&topic, 1).expect("create topic");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    rt.block_on(async move {
        let client = redis::cluster::ClusterClient::new(urls.clone()).expect("cluster client");
        let mut conn = client.get_async_connection().await.expect("cluster connection");
        let mut masters = Vec::new();
        for u in &urls {
            let c = redis::Client::open(u.as_str()).expect("url");
            masters.push(c.get_multiplexed_async_connection().await.expect("master connection"));
        }
        let base = binval_testkit::unique_name("item:detail");
        let key = uneven_key(&base, &owners);
        let placement = Placement::of(&key, REPLICAS, |s| owners.master_of(s));
        let plain = format!("plain:{base}:6666");
        let version = seed(&mut conn, &key, &plain).await;
        let (missing, deleted) = (format!("{base}:missing"), format!("{base}:deleted"));
        write_change(&mut conn, &deleted, r#"{"id":7}"#, 1 << 32).await;
        write_record(&mut conn, &deleted, "del", "", (1 << 32) + 1).await;
        println!(
            "replicas per master (by lowest slot): {:?}",
            placement.groups().iter().map(|(m, g)| (owners.masters[*m], g.len())).collect::<Vec<_>>()
        );
        println!("grouping a key's {REPLICAS} replicas by master costs {:.0} ns (no cache needed)", grouping_ns(&key, &owners));
        println!("{} reader tasks on 2 tokio worker threads, {} s per scenario\n", params.tasks, params.secs);

        let setup = Setup { conn, urls, bootstrap: broker.bootstrap(), topic, key, plain, version, placement };
        let mut rows = vec![
            plain_key(&setup, &mut masters, params).await,
            replicas_without_cache(&setup, &mut masters, params, false).await,
            replicas_without_cache(&setup, &mut masters, params, true).await,
            replicas_with_consumer(&setup, &mut masters, params).await,
            consumer_uncached(&setup, &mut masters, params).await,
        ];
        for (reads, what) in [
            (2, "(e) hot missing key, Consumer defaults (2 reads for its first fill, then 1)"),
            (1, "(e1) hot missing key, max_replica_reads(1)"),
        ] {
            rows.push(consumer_absent(&setup, &mut masters, params, &missing, reads, what).await);
        }
        rows.push(consumer_absent(&setup, &mut masters, params, &deleted, 2, "(f) hot deleted key (tombstones), Consumer defaults").await);
        print_rows(&rows);
    });
}

/// A key of `base` whose 8 replicas lie on all 3 masters, one master holding 4 or more.
fn uneven_key(base: &str, owners: &binval_testkit::SlotOwners) -> String {
    (6666..100_000)
        .map(|i| format!("{base}:{i}"))
        .find(|k| {
            let p = Placement::of(k, REPLICAS, |s| owners.master_of(s));
            p.masters() == 3 && p.groups().iter().any(|(_, g)| g.len() >= 4)
        })
        .expect("a key with an uneven 3-master layout")
}

/// Mean time of `Placement::of` for `key` (N slot computations and the grouping), ns.
fn grouping_ns(key: &str, owners: &binval_testkit::SlotOwners) -> f64 {
    let n = 200_000;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(Placement::of(std::hint::black_box(key), REPLICAS, |s| owners.master_of(s)));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// What every scenario reads from: the cluster, the broker's topic and the keys.
struct Setup {
    conn: ClusterConnection,
    urls: Vec<String>,
    bootstrap: String,
    topic: String,
    /// The logical key, as `REPLICAS` suffix replicas and a version token.
    key: String,
    /// The same payload as one plain string key.
    plain: String,
    /// The version of `key`'s first change.
    version: u64,
    /// `key`'s replicas grouped by master.
    placement: Placement,
}

/// Write the plain key and the first change of `key` (all replicas, version token); print
/// which slots they live in. Returns the version written.
async fn seed(conn: &mut ClusterConnection, key: &str, plain: &str) -> u64 {
    let payload = r#"{"id":6666,"name":"desk lamp","price_cents":1999,"stock":42}"#;
    let _: () = redis::cmd("SET").arg(plain).arg(payload).query_async(conn).await.expect("SET plain");
    let version = 1u64 << 32;
    write_change(conn, key, payload, version).await;
    let slots: Vec<u16> = (0..REPLICAS).map(|i| binval_protocol::hash_slot(replica_key(key, i).as_bytes())).collect();
    println!(
        "key {key}: replica slots {slots:?}; plain key slot {}; version token slot {} (not read by the consumer)",
        binval_protocol::hash_slot(plain.as_bytes()),
        binval_protocol::hash_slot(version_key(key).as_bytes())
    );
    version
}

/// (a) one plain key.
async fn plain_key(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params) -> Row {
    let (c, p_key) = (setup.conn.clone(), setup.plain.clone());
    let (row, _) = measure("(a) plain key, GET", masters, p.tasks, p.secs, move || {
        let (mut c, p) = (c.clone(), p_key.clone());
        async move {
            let _: Option<Vec<u8>> = redis::cmd("GET").arg(&p).query_async(&mut c).await.expect("GET");
        }
    })
    .await;
    row
}

/// (b) 8 replicas, a replica chosen uniformly per read, or (b2) master-balanced; no local
/// cache.
async fn replicas_without_cache(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params, balanced: bool) -> Row {
    let (c, k) = (setup.conn.clone(), setup.key.clone());
    let placement = Arc::new(setup.placement.clone());
    let name = if balanced { "(b2) 8 replicas, HMGET master-balanced replica" } else { "(b) 8 replicas, HMGET uniform replica" };
    let (row, _) = measure(name, masters, p.tasks, p.secs, move || {
        let (mut c, k, placement) = (c.clone(), k.clone(), placement.clone());
        async move {
            let i = if balanced { placement.read_order(rand::random())[0] } else { rand::random_range(0..REPLICAS) };
            let _: Vec<Option<Vec<u8>>> =
                redis::cmd("HMGET").arg(replica_key(&k, i)).arg("d").arg("t").arg("p").query_async(&mut c).await.expect("HMGET");
        }
    })
    .await;
    row
}

/// (c) replicas + local cache through the Consumer, with a writer invalidating it.
async fn replicas_with_consumer(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params) -> Row {
    let consumer = consumer(setup, |b| b.ttl(Duration::from_secs(1)).ttl_jitter(0.1)).await;
    let writer = Writer::start(setup, p.update_ms);
    let before = consumer.stats();
    let (cc, k) = (consumer.clone(), setup.key.clone());
    let (mut row, _) = measure("(c) 8 replicas + local cache (Consumer)", masters, p.tasks, p.secs, move || {
        let (cc, k) = (cc.clone(), k.clone());
        async move {
            let v = cc.get_shared(&k).await.expect("get");
            assert!(v.is_some());
        }
    })
    .await;
    let n_updates = writer.stop().await;
    let s = consumer.stats();
    let fills = s.fills - before.fills;
    // A fill is one HMGET of a replica (all replicas exist here).
    row.to_redis = s.redis_reads - before.redis_reads;
    row.note = format!(
        "hits {}, misses {}, fills {fills}, coalesced {}, events {}; writer: {n_updates} changes (each adds {} GET/HMGET inside its scripts to the per-master counts, so max/mean is the writer's)",
        s.hits - before.hits,
        s.misses - before.misses,
        s.coalesced - before.coalesced,
        s.events - before.events,
        REPLICAS + 1,
    );
    consumer.shutdown().await;
    row
}

/// A task that changes the key every `update_ms` in binval's order — all replicas, the version
/// token, then an invalidation event — until stopped.
struct Writer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    updates: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(setup: &Setup, update_ms: u64) -> Writer {
        let producer: FutureProducer =
            ClientConfig::new().set("bootstrap.servers", &setup.bootstrap).set("linger.ms", "0").create().expect("producer");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let updates = Arc::new(AtomicU64::new(0));
        let (mut conn, key, stop2, updates2, topic) =
            (setup.conn.clone(), setup.key.clone(), stop.clone(), updates.clone(), setup.topic.clone());
        let mut version = setup.version;
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(update_ms));
            while !stop2.load(Relaxed) {
                tick.tick().await;
                version += 1;
                let body = format!(r#"{{"id":6666,"name":"desk lamp","price_cents":1999,"stock":{}}}"#, version % 100);
                write_change(&mut conn, &key, &body, version).await;
                let ev = event(&key, version).to_json();
                producer
                    .send(FutureRecord::to(&topic).key(key.as_str()).payload(&ev), Duration::from_secs(5))
                    .await
                    .map_err(|(e, _)| e)
                    .expect("publish");
                updates2.fetch_add(1, Relaxed);
            }
        });
        Writer { stop, updates, task }
    }

    /// Stop the writer, wait for it; the number of changes it made.
    async fn stop(self) -> u64 {
        self.stop.store(true, Relaxed);
        self.task.await.expect("writer");
        self.updates.load(Relaxed)
    }
}

/// Max over mean of the per-master counts (1.0 = every master equally loaded).
fn max_over_mean(per_master: &[(u64, f64)]) -> f64 {
    let total: u64 = per_master.iter().map(|(o, _)| o).sum();
    if total == 0 {
        return 0.0;
    }
    let max = per_master.iter().map(|(o, _)| *o).max().unwrap_or(0);
    max as f64 * per_master.len() as f64 / total as f64
}

/// The results as a markdown table, then each scenario's note.
fn print_rows(rows: &[Row]) {
    println!("| scenario | reads served | reads/s | reads that reached Redis | GET+HMGET per master (m1 / m2 / m3) | max/mean | master CPU % of one core (m1 / m2 / m3) |");
    println!("|---|---:|---:|---:|---|---:|---|");
    for r in rows {
        let ops: Vec<String> = r.per_master.iter().map(|(o, _)| o.to_string()).collect();
        let cpu: Vec<String> = r.per_master.iter().map(|(_, c)| format!("{:.0}", 100.0 * c / r.secs)).collect();
        println!(
            "| {} | {} | {:.0} | {} | {} | {:.2} | {} |",
            r.name,
            r.served,
            r.served as f64 / r.secs,
            r.to_redis,
            ops.join(" / "),
            max_over_mean(&r.per_master),
            cpu.join(" / ")
        );
    }
    for r in rows {
        if !r.note.is_empty() {
            println!("\n{}: {}", r.name, r.note);
        }
    }
}

/// A consumer of the bench's cluster and topic with `configure` applied on top.
async fn consumer(setup: &Setup, configure: impl FnOnce(binval_consumer::ConsumerBuilder) -> binval_consumer::ConsumerBuilder) -> Consumer {
    let b = Consumer::builder()
        .redis_cluster(setup.urls.clone())
        .brokers(setup.bootstrap.as_str())
        .topic(&setup.topic)
        .kafka_property("fetch.wait.max.ms", "5")
        .replicas(REPLICAS);
    configure(b).build().await.expect("build consumer")
}

/// (d) the key through the Consumer with local caching off: every get is a fill.
async fn consumer_uncached(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params) -> Row {
    let c = consumer(setup, |b| b.cache_mode(CacheMode::Prefixes(vec!["not-the-bench-key:".into()]))).await;
    let (cc, k) = (c.clone(), setup.key.clone());
    let (mut row, _) = measure("(d) 8 replicas through the Consumer, local caching off", masters, p.tasks, p.secs, move || {
        let (cc, k) = (cc.clone(), k.clone());
        async move {
            assert!(cc.get_shared(&k).await.expect("get").is_some());
        }
    })
    .await;
    let s = c.stats();
    row.to_redis = s.redis_reads;
    row.note = format!("uncached gets {}, fills {} (coalesced {}), Redis reads {}", s.uncached_reads, s.fills, s.coalesced, s.redis_reads);
    c.shutdown().await;
    row
}

/// (e), (e1), (f): a key without a row, read through the Consumer (local cache on).
async fn consumer_absent(
    setup: &Setup,
    masters: &mut [redis::aio::MultiplexedConnection],
    p: Params,
    key: &str,
    max_reads: u32,
    name: &'static str,
) -> Row {
    let c = consumer(setup, |b| b.max_replica_reads(max_reads)).await;
    let (cc, k) = (c.clone(), key.to_string());
    let (mut row, _) = measure(name, masters, p.tasks, p.secs, move || {
        let (cc, k) = (cc.clone(), k.clone());
        async move {
            assert!(cc.get_shared(&k).await.expect("get").is_none());
        }
    })
    .await;
    let s = c.stats();
    let fills = s.missing + s.tombstones;
    row.to_redis = s.redis_reads;
    row.note = format!(
        "fills {fills} (missing {}, tombstones {}), Redis reads {} = {:.2} per fill; hits {} of which \"no row\" {}; cached at version {:?}",
        s.missing,
        s.tombstones,
        s.redis_reads,
        s.redis_reads as f64 / fills.max(1) as f64,
        s.hits,
        s.negative_hits,
        c.cached_version(key),
    );
    c.shutdown().await;
    row
}
