//! The consumer's share of the Kafka leg under load (issue #15, part 3): publish -> received ->
//! applied, at a given event rate, on the tansu broker of binval-testkit.
//!
//! A publisher hands invalidation events (real `InvalidationEvent` JSON, binval's producer
//! settings: idempotent, `acks=all`, `linger.ms=1`) to librdkafka at a steady rate, over 3
//! partitions, keyed over 1000 keys. Each event's key carries its sequence number, and the
//! bench remembers the instant it handed the event to the producer ("publish", as binval's
//! `publish_time_ms`). Two readers see every event:
//!
//! - **received**: a plain librdkafka consumer on its own thread, assigned every partition at
//!   its high watermark like the listener, with the same consumer settings: publish -> the
//!   message returned by `poll`. This is the Kafka leg alone (producer batching, the broker,
//!   the fetch).
//! - **applied**: a [`Consumer`] (the listener thread, its batch application, then the
//!   eviction notice taken from [`Consumer::subscribe_evictions`] by a bench task): publish ->
//!   notice received. The difference to "received" is the listener's share.
//!
//! For each rate and each listener setting it prints p50 / p99 / max of both, the events
//! measured (the first second is warm-up) and whether the consumer served locally throughout,
//! as a markdown table. Numbers, not assertions; the machine's other load adds to them.
//!
//! Run: `cargo bench -p binval-consumer --bench kafka_latency` (env: `BENCH_RATES` events/s,
//! comma-separated, default `20,1000`; `BENCH_SECS` per cell, default 10;
//! `BENCH_FETCH_WAIT_MS` the `fetch.wait.max.ms` values to compare, comma-separated,
//! `default` = the crate's default, default `default`; `BENCH_PREFILL` records published into
//! each cell's topic before it is measured, default 0). Cells longer than 10 s also print the
//! applied p99 per 10 s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use binval_protocol::{InvalidationEvent, Op, SourcePosition};
use futures::StreamExt as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 3;
const KEYS: u64 = 1000;
const WARM_UP: Duration = Duration::from_secs(1);
/// The listener's default `fetch.wait.max.ms` (crate docs, `ConsumerBuilder::kafka_property`).
const CRATE_DEFAULT_FETCH_WAIT_MS: &str = "10";

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name).unwrap_or_else(|_| default.to_string()).split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// Publish instants, ns since `base`, by sequence number (0 = not published yet).
struct Clock {
    base: Instant,
    sent: Vec<AtomicU64>,
}

impl Clock {
    fn since(&self, seq: u64, at: Instant) -> Option<Duration> {
        let ns = self.sent.get(seq as usize)?.load(Relaxed);
        (ns != 0).then(|| at.saturating_duration_since(self.base + Duration::from_nanos(ns)))
    }
}

fn seq_of(key: &str) -> Option<u64> {
    key.rsplit(':').next()?.parse().ok()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

async fn create_topic(bootstrap: &str) -> String {
    let name = binval_testkit::unique_name("latency");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let res = admin
        .create_topics(&[NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1))], &AdminOptions::new())
        .await
        .expect("create_topics");
    for r in res {
        r.expect("create topic");
    }
    name
}

/// The plain reader: every partition from its high watermark, `poll` in a loop.
fn plain_reader(
    bootstrap: &str,
    topic: &str,
    fetch_wait: Option<&str>,
    clock: Arc<Clock>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(Instant, Duration)>> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", bootstrap).set("group.id", binval_testkit::unique_name("plain")).set("enable.auto.commit", "false");
    if let Some(w) = fetch_wait {
        cfg.set("fetch.wait.max.ms", w);
    }
    let c: BaseConsumer = cfg.create().expect("plain consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(5)).expect("watermarks");
        tpl.add_partition_offset(topic, p, Offset::Offset(high)).expect("tpl");
    }
    c.assign(&tpl).expect("assign");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !stop.load(Relaxed) {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                let now = Instant::now();
                if let Some(d) = m.key().and_then(|k| std::str::from_utf8(k).ok()).and_then(seq_of).and_then(|s| clock.since(s, now)) {
                    seen.push((now, d));
                }
            }
        }
        seen
    })
}

struct Cell {
    /// p99 of "applied" per 10 s of publish time (how the broker's fetch cost develops as the
    /// partitions grow).
    windows: Vec<Duration>,
    received: Vec<Duration>,
    applied: Vec<Duration>,
    published: u64,
    serving_throughout: bool,
    max_stream_lag: Duration,
}

/// Publish `n` records into `topic`, one record per batch (as a steady load with
/// `linger.ms=1` mostly does; tansu stores each batch as one object), so the partitions hold
/// that many more batches when the measured cell starts.
async fn prefill(bootstrap: &str, topic: &str, n: u64) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .set("message.timeout.ms", "120000")
        .create()
        .expect("prefill producer");
    let payload = vec![b'x'; 200];
    let keys: Vec<String> = (0..n).map(|i| format!("fill:{i}")).collect();
    for chunk in keys.chunks(10_000) {
        let sends: Vec<_> =
            chunk.iter().map(|key| p.send(FutureRecord::to(topic).key(key).payload(&payload), Duration::from_secs(60))).collect();
        for r in futures::future::join_all(sends).await {
            r.map_err(|(e, _)| e).expect("prefill delivered");
        }
    }
}

fn producer(bootstrap: &str) -> FutureProducer {
    // binval's producer settings (src/write/kafka_sink.rs).
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "1")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer")
}

async fn run_cell(bootstrap: &str, rate: u64, secs: u64, fetch_wait: Option<&str>, prefilled: u64) -> Cell {
    let topic = create_topic(bootstrap).await;
    if prefilled > 0 {
        prefill(bootstrap, &topic, prefilled).await;
    }
    let p = producer(bootstrap);
    let total = rate * secs;
    let clock = Arc::new(Clock { base: Instant::now(), sent: (0..total + 1).map(|_| AtomicU64::new(0)).collect() });
    let stop = Arc::new(AtomicBool::new(false));
    // The plain reader gets the listener's setting; `default` is the crate's 10 ms.
    let plain = plain_reader(bootstrap, &topic, Some(fetch_wait.unwrap_or(CRATE_DEFAULT_FETCH_WAIT_MS)), clock.clone(), stop.clone());

    let mut b = Consumer::builder().brokers(bootstrap).topic(&topic).redis_standalone(binval_testkit::redis().url());
    if let Some(w) = fetch_wait {
        b = b.kafka_property("fetch.wait.max.ms", w);
    }
    let c = b.eviction_channel_capacity(1 << 16).build().await.expect("consumer");
    let mut notices = c.subscribe_evictions();
    let applied = Arc::new(Mutex::new(Vec::new()));
    let collector = {
        let (clock, applied) = (clock.clone(), applied.clone());
        tokio::spawn(async move {
            while let Ok(n) = notices.recv().await {
                let now = Instant::now();
                if let Some(d) = seq_of(&n.key).and_then(|s| clock.since(s, now)) {
                    applied.lock().unwrap().push((now, d));
                }
            }
        })
    };
    let watcher = {
        let c = c.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut serving, mut max_lag) = (true, Duration::ZERO);
            while !stop.load(Relaxed) {
                serving &= c.is_serving_local();
                max_lag = max_lag.max(c.stream_lag());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (serving, max_lag)
        })
    };

    let mut acks = futures::stream::FuturesUnordered::new();
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut seq = 0u64;
    while seq < total {
        tick.tick().await;
        let due = ((t0.elapsed().as_secs_f64() * rate as f64) as u64 + 1).min(total);
        while seq < due {
            seq += 1;
            let key = format!("lat:{}:{seq}", seq % KEYS);
            let ev = InvalidationEvent {
                schema: 1,
                key: key.clone(),
                version: seq,
                op: Op::Update,
                table: "shop.items".into(),
                position: SourcePosition { file: "mysql-bin.000001".into(), pos: 4 + seq, gtid: None },
                commit_time_ms: 0,
                publish_time_ms: 0,
            };
            let payload = ev.to_json();
            clock.sent[seq as usize].store(clock.base.elapsed().as_nanos() as u64, Relaxed);
            match p.send_result(FutureRecord::to(&topic).key(key.as_str()).payload(&payload)) {
                Ok(f) => acks.push(f),
                Err((e, _)) => panic!("produce: {e}"),
            }
        }
        while let Some(Some(r)) = futures::FutureExt::now_or_never(acks.next()) {
            r.expect("delivery future").map_err(|(e, _)| e).expect("delivered");
        }
    }
    while let Some(r) = acks.next().await {
        r.expect("delivery future").map_err(|(e, _)| e).expect("delivered");
    }
    // Let the readers catch up, then stop them.
    let deadline = Instant::now() + Duration::from_secs(20);
    while applied.lock().unwrap().len() < total as usize && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Relaxed);
    let (serving_throughout, max_stream_lag) = watcher.await.expect("watcher");
    let received = tokio::task::spawn_blocking(move || plain.join().expect("plain reader")).await.expect("join");
    c.shutdown().await;
    collector.abort();
    let warm = t0 + WARM_UP;
    let keep = |v: Vec<(Instant, Duration)>| {
        let mut d: Vec<Duration> =
            v.into_iter().filter(|(at, d)| at.checked_sub(*d).is_some_and(|sent| sent >= warm)).map(|(_, d)| d).collect();
        d.sort();
        d
    };
    let applied = std::mem::take(&mut *applied.lock().unwrap());
    let mut windows: Vec<Vec<Duration>> = Vec::new();
    for &(at, d) in applied.iter().filter(|(at, d)| at.checked_sub(*d).is_some_and(|sent| sent >= warm)) {
        let w = (at.checked_sub(d).unwrap_or(t0).saturating_duration_since(t0).as_secs() / 10) as usize;
        windows.resize_with(windows.len().max(w + 1), Vec::new);
        windows[w].push(d);
    }
    let windows = windows
        .into_iter()
        .map(|mut w| {
            w.sort();
            percentile(&w, 0.99)
        })
        .collect();
    Cell { windows, received: keep(received), applied: keep(applied), published: total, serving_throughout, max_stream_lag }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rates: Vec<u64> = env_list("BENCH_RATES", "20,1000").iter().map(|r| r.parse().expect("BENCH_RATES: events/s")).collect();
    let secs: u64 = std::env::var("BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let waits = env_list("BENCH_FETCH_WAIT_MS", "default");
    let prefilled: u64 = std::env::var("BENCH_PREFILL").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let bootstrap = binval_testkit::broker().bootstrap();
    let _ = binval_testkit::redis();
    println!("publish -> received (plain librdkafka consumer) and publish -> applied (binval-consumer listener, eviction notice), tansu on loopback, {PARTITIONS} partitions, {secs} s per cell, first {WARM_UP:?} dropped, {prefilled} records in the topic before each cell");
    println!();
    println!("| events/s | fetch.wait.max.ms | events measured | received p50 / p99 / max, ms | applied p50 / p99 / max, ms | served locally throughout | largest stream lag, ms |");
    println!("|---:|---|---:|---|---|---|---:|");
    let mut seen: HashMap<(u64, String), ()> = HashMap::new();
    let mut trends = Vec::new();
    for w in &waits {
        for &rate in &rates {
            if seen.insert((rate, w.clone()), ()).is_some() {
                continue;
            }
            let fetch_wait = (w != "default").then_some(w.as_str());
            let cell = run_cell(&bootstrap, rate, secs, fetch_wait, prefilled).await;
            let (r, a) = (&cell.received, &cell.applied);
            println!(
                "| {rate} | {w} | {} of {} | {} / {} / {} | {} / {} / {} | {} | {} |",
                a.len(),
                cell.published,
                ms(percentile(r, 0.5)),
                ms(percentile(r, 0.99)),
                ms(percentile(r, 1.0)),
                ms(percentile(a, 0.5)),
                ms(percentile(a, 0.99)),
                ms(percentile(a, 1.0)),
                if cell.serving_throughout { "yes" } else { "no" },
                ms(cell.max_stream_lag),
            );
            if cell.windows.len() > 1 {
                trends.push(format!(
                    "{rate} events/s, fetch.wait.max.ms {w}: applied p99 per 10 s: {} ms",
                    cell.windows.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    println!();
    for t in trends {
        println!("{t}");
    }
}
