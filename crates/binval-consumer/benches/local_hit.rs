//! Latency and throughput of a local cache hit: `Consumer::get` on a key the local cache holds.
//!
//! A `Consumer` needs Redis and a Kafka broker to be built, so the bench starts real ones with
//! binval-testkit (standalone Redis, tansu) and fills one key before measuring. A hit never
//! touches them. Run: `cargo bench -p binval-consumer --bench local_hit` (add `-- --quick` for
//! a short run). Numbers, not assertions; besides criterion's report it prints ns per hit
//! (1 thread) and hits/s (2 threads) from plain timed loops, for `get` (copies the payload
//! into a `String`) and `get_shared` (hands out the cached `Arc<str>`), with the per-thread
//! front off (every hit reads moka), hot-key detection off, and the defaults (both on).

use std::hint::black_box;
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::FutureExt;

/// One hit through `get` (copies the payload into a new `String`), polled once: a hit
/// completes without awaiting anything.
#[inline]
fn hit(c: &Consumer, key: &str) -> usize {
    let v = c.get(key).now_or_never().expect("a local hit completes at once").expect("get").expect("value");
    v.len()
}

/// One hit through `get_shared` (returns the cached `Arc<str>`, no copy).
#[inline]
fn hit_shared(c: &Consumer, key: &str) -> usize {
    let v = c.get_shared(key).now_or_never().expect("a local hit completes at once").expect("get").expect("value");
    v.len()
}

/// `iters` hits spread over `threads` threads; wall time.
fn run_threads(c: &Consumer, key: &str, threads: u64, iters: u64) -> Duration {
    run_threads_with(c, key, threads, iters, hit)
}

fn run_threads_with(c: &Consumer, key: &str, threads: u64, iters: u64, f: fn(&Consumer, &str) -> usize) -> Duration {
    let per = iters.div_ceil(threads);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..per {
                    black_box(f(c, black_box(key)));
                }
            });
        }
    });
    start.elapsed()
}

fn setup(hot_key_detection: bool, thread_front: bool) -> (tokio::runtime::Runtime, Consumer, String) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let broker = binval_testkit::broker();
    let topic = binval_testkit::unique_name("bench-inval");
    broker.create_topic(&topic, 1).expect("create topic");
    let redis_url = binval_testkit::redis().url();
    let key = format!("{}:6666", binval_testkit::unique_name("bench-item"));
    let consumer = rt.block_on(async {
        let client = redis::Client::open(redis_url.as_str()).expect("redis url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("redis connection");
        let mut p = redis::pipe();
        // binval's fenced record format: a hash with the payload `d` and position `p`.
        p.hset_multiple(binval_protocol::replica_key(&key, 0), &[("d", r#"{"id":6666,"name":"lamp","price_cents":1999}"#), ("p", "1")])
            .ignore();
        p.set(binval_protocol::version_key(&key), 1).ignore();
        p.query_async::<()>(&mut conn).await.expect("write key");
        let c = Consumer::builder()
            .redis_standalone(&redis_url)
            .brokers(broker.bootstrap())
            .topic(&topic)
            .kafka_property("fetch.wait.max.ms", "5")
            .hot_key_detection(hot_key_detection)
            .thread_front(thread_front)
            .build()
            .await
            .expect("build consumer");
        assert!(c.get(&key).await.expect("fill").is_some());
        c
    });
    assert!(consumer.cached_version(&key).is_some(), "key not cached");
    (rt, consumer, key)
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// Plain timed loops of `f`: ns per hit on 1 thread, hits/s on 2 threads.
fn plain(label: &str, c: &Consumer, key: &str, f: fn(&Consumer, &str) -> usize) {
    let n = 2_000_000;
    run_threads_with(c, key, 1, n / 10, f); // warm-up
    let one = run_threads_with(c, key, 1, n, f);
    let two = run_threads_with(c, key, 2, n, f);
    println!(
        "{label}: 1 thread {:.1} ns per hit; 2 threads {:.2} M hits/s ({n} hits each)",
        one.as_nanos() as f64 / n as f64,
        n as f64 / two.as_secs_f64() / 1e6,
    );
}

fn local_hit(cr: &mut Criterion) {
    // Plain timed loops first, so the numbers are printed even when criterion's output is not
    // read; also without hot-key detection, to show its cost.
    for (hot, front) in [(true, false), (false, true)] {
        let (rt, c, key) = setup(hot, front);
        let label = format!("hot-key detection {}, thread front {}", on_off(hot), on_off(front));
        plain(&format!("{label}, get       "), &c, &key, hit);
        plain(&format!("{label}, get_shared"), &c, &key, hit_shared);
        rt.block_on(c.shutdown());
    }
    // The defaults: both on. Criterion measures this one.
    let (rt, c, key) = setup(true, true);
    plain("hot-key detection on, thread front on (defaults), get       ", &c, &key, hit);
    plain("hot-key detection on, thread front on (defaults), get_shared", &c, &key, hit_shared);

    let mut g = cr.benchmark_group("local_hit");
    g.throughput(Throughput::Elements(1));
    g.bench_function("get_1_thread", |b| b.iter(|| hit(&c, black_box(&key))));
    g.bench_function("get_shared_1_thread", |b| b.iter(|| hit_shared(&c, black_box(&key))));
    // Each iteration is one hit; two threads share the iterations, so criterion's time per
    // iteration is wall time / hits and its throughput is the total of both threads.
    g.bench_function("get_2_threads", |b| b.iter_custom(|iters| run_threads(&c, &key, 2, iters)));
    g.bench_function("get_shared_2_threads", |b| b.iter_custom(|iters| run_threads_with(&c, &key, 2, iters, hit_shared)));
    g.finish();

    let s = c.stats();
    assert_eq!(s.fills, 1, "every measured get must be a hit: {s:?}");
    rt.block_on(c.shutdown());
}

criterion_group!(benches, local_hit);
criterion_main!(benches);
