//! The hot-key scenario of the design note, as numbers: several client tasks read **one** key
//! as fast as they can for a few seconds against a real 3-master Redis Cluster
//! (binval-testkit), in three layouts:
//!
//! - **(a) plain**: one string key without binval (`GET K`): every read hits one master.
//! - **(b) replicas**: the key as N = 8 suffix replicas in binval's fenced record format; every
//!   read is `HMGET K:r{random} d t` (no local cache, no version token read: the version token
//!   is itself one key on one master, read only by fills).
//! - **(c) replicas + local cache**: the same replicas read through [`Consumer::get_shared`]
//!   (local cache, single-flight, fills of version token + one replica), while a writer changes
//!   the key every `BENCH_UPDATE_MS` (default 100 ms) in binval's order — all replicas, the
//!   version token, then an invalidation event on the tansu broker — so the local cache keeps
//!   being invalidated and refilled as in production.
//!
//! For each it prints reads served (and per second), reads that reached Redis, and per master
//! the `GET`+`HMGET` calls and CPU time from `INFO commandstats` / `INFO cpu` deltas, as a
//! markdown table. Numbers, not assertions. Client, masters and broker share this machine's
//! cores: the per-master spread and the reads that reach Redis are the point, the absolute
//! rates are this machine's.
//!
//! Run: `cargo bench -p binval-consumer --bench hot_key` (env: `BENCH_SECS` default 3,
//! `BENCH_TASKS` default 32, `BENCH_UPDATE_MS` default 100).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use binval_protocol::fence::{replica_write_script, version_bump_script};
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

/// binval's write of one change: every replica (fenced), then the version token.
async fn write_change(conn: &mut ClusterConnection, key: &str, payload: &str, version: u64) {
    let rs = redis::Script::new(&replica_write_script());
    let vs = redis::Script::new(&version_bump_script());
    for i in 0..REPLICAS {
        let _: i64 = rs
            .key(replica_key(key, i))
            .arg(version)
            .arg(1)
            .arg("set")
            .arg(payload)
            .arg(60_000)
            .invoke_async(conn)
            .await
            .expect("replica write");
    }
    let _: i64 = vs.key(version_key(key)).arg(version).invoke_async(conn).await.expect("version bump");
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
        let key = format!("{base}:6666");
        let plain = format!("plain:{base}:6666");
        let version = seed(&mut conn, &key, &plain).await;
        println!("{} reader tasks on 2 tokio worker threads, {} s per scenario\n", params.tasks, params.secs);

        let setup = Setup { conn, urls, bootstrap: broker.bootstrap(), topic, key, plain, version };
        let rows = vec![
            plain_key(&setup, &mut masters, params).await,
            replicas_without_cache(&setup, &mut masters, params).await,
            replicas_with_consumer(&setup, &mut masters, params).await,
        ];
        print_rows(&rows);
    });
}

/// What every scenario reads from: the cluster, the broker's topic and the two keys.
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
        "key {key}: replica slots {slots:?}; plain key slot {}; version token slot {}",
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

/// (b) 8 replicas, random replica per read, no local cache.
async fn replicas_without_cache(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params) -> Row {
    let (c, k) = (setup.conn.clone(), setup.key.clone());
    let (row, _) = measure("(b) 8 replicas, HMGET random replica", masters, p.tasks, p.secs, move || {
        let (mut c, k) = (c.clone(), k.clone());
        async move {
            let i = rand::random_range(0..REPLICAS);
            let _: (Option<Vec<u8>>, Option<Vec<u8>>) =
                redis::cmd("HMGET").arg(replica_key(&k, i)).arg("d").arg("t").query_async(&mut c).await.expect("HMGET");
        }
    })
    .await;
    row
}

/// (c) replicas + local cache through the Consumer, with a writer invalidating it.
async fn replicas_with_consumer(setup: &Setup, masters: &mut [redis::aio::MultiplexedConnection], p: Params) -> Row {
    let consumer = Consumer::builder()
        .redis_cluster(setup.urls.clone())
        .brokers(setup.bootstrap.as_str())
        .topic(&setup.topic)
        .kafka_property("fetch.wait.max.ms", "5")
        .replicas(REPLICAS)
        .ttl(Duration::from_secs(1))
        .ttl_jitter(0.1)
        .build()
        .await
        .expect("build consumer");
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
    // A fill is GET K:ver + HMGET of one replica (all replicas exist here).
    row.to_redis = 2 * fills;
    row.note = format!(
        "hits {}, misses {}, fills {fills}, coalesced {}, events {}; writer: {n_updates} changes (each adds {} GET/HMGET inside its scripts to the per-master counts)",
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

/// The results as a markdown table, then each scenario's note.
fn print_rows(rows: &[Row]) {
    println!("| scenario | reads served | reads/s | reads that reached Redis | GET+HMGET per master (m1 / m2 / m3) | master CPU % of one core (m1 / m2 / m3) |");
    println!("|---|---:|---:|---:|---|---|");
    for r in rows {
        let ops: Vec<String> = r.per_master.iter().map(|(o, _)| o.to_string()).collect();
        let cpu: Vec<String> = r.per_master.iter().map(|(_, c)| format!("{:.0}", 100.0 * c / r.secs)).collect();
        println!(
            "| {} | {} | {:.0} | {} | {} | {} |",
            r.name,
            r.served,
            r.served as f64 / r.secs,
            r.to_redis,
            ops.join(" / "),
            cpu.join(" / ")
        );
    }
    for r in rows {
        if !r.note.is_empty() {
            println!("\n{}: {}", r.name, r.note);
        }
    }
}
