//! Cost per key of applying invalidations in the listener, without Kafka or Redis: one batch
//! message (`kafka.event_format = "batched"`, 1,000 key changes of one transaction) checked and
//! applied from its payload, for keys the local cache does not hold (the common case in a
//! fleet: most changes are of keys an instance never read) and for keys it holds (each change
//! evicts an entry); and, for comparison, the per-key JSON path (1,000 messages parsed, then
//! applied as one listener batch) for the same two cases. The cache holds 10,000 other keys
//! throughout, so lookups search a populated map. The "cached" cases cache the 1,000 keys
//! before each timed run (untimed, moka's pending maintenance of those inserts run too), so
//! they time the evictions; an eviction goes through moka's per-key compute and raises the
//! fill-race guard (a moka insert), which is most of its cost in both formats.
//!
//! Run: `cargo bench -p binval-consumer --bench apply_batch` (add `-- --quick` for a short run).
//! Besides criterion's report (time per 1,000 keys, keys/s) it prints ns per key from plain
//! timed loops. Numbers, not assertions (the target for an uncached key is <= 100 ns).

use std::hint::black_box;
use std::time::{Duration, Instant};

use binval_consumer::bench_support::ApplyBench;
use binval_protocol::{BatchBuilder, InvalidationEvent, Op, SourcePosition, EVENT_SCHEMA_VERSION};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const KEYS: usize = 1_000;
const OTHER_KEYS: usize = 10_000;

fn position() -> SourcePosition {
    SourcePosition { file: "mysql-bin.000003".into(), pos: 4711, gtid: Some("0-1-42".into()) }
}

fn key(i: usize) -> String {
    format!("shop:item:detail:{i}")
}

/// A batch of `KEYS` changes at `version`.
fn batch_payload(version: u64) -> Vec<u8> {
    let mut b = BatchBuilder::new();
    let p = position();
    for i in 0..KEYS {
        b.push(&p, 1_764_540_000_000, Op::Update, version, "shop.items", &key(i)).expect("fits");
    }
    b.finish(1_764_540_000_012)
}

/// `KEYS` per-key JSON events at `version`.
fn json_payloads(version: u64) -> Vec<Vec<u8>> {
    (0..KEYS)
        .map(|i| {
            InvalidationEvent {
                schema: EVENT_SCHEMA_VERSION,
                key: key(i),
                version,
                op: Op::Update,
                table: "shop.items".into(),
                position: position(),
                commit_time_ms: 1_764_540_000_000,
                publish_time_ms: 1_764_540_000_012,
            }
            .to_json()
        })
        .collect()
}

/// A cache holding `OTHER_KEYS` keys that no batch touches.
fn bench_cache() -> ApplyBench {
    let a = ApplyBench::new(1_000_000);
    for i in 0..OTHER_KEYS {
        assert!(a.cache(&format!("shop:other:{i}"), "{\"id\":1}", 1));
    }
    a.settle();
    a
}

/// Cache the batch's keys at `version` (untimed setup of the "cached" cases).
fn cache_batch_keys(a: &ApplyBench, version: u64) {
    for i in 0..KEYS {
        assert!(a.cache(&key(i), "{\"id\":1,\"title\":\"lamp\"}", version), "cached at {version}");
    }
    a.settle();
}

/// ns per key of `f` over `rounds` rounds of `KEYS` keys; `prep` makes each round's input,
/// untimed.
fn per_key<T>(rounds: u32, mut prep: impl FnMut(u32) -> T, mut f: impl FnMut(&T)) -> f64 {
    let mut total = Duration::ZERO;
    for r in 0..rounds {
        let input = prep(r);
        let t = Instant::now();
        f(&input);
        total += t.elapsed();
    }
    total.as_nanos() as f64 / (rounds as f64 * KEYS as f64)
}

fn apply_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply");
    g.throughput(Throughput::Elements(KEYS as u64));

    // Batched, uncached keys: the same payload again and again (nothing gets cached).
    let a = bench_cache();
    let payload = batch_payload(2);
    g.bench_function("batch_uncached_1000_keys", |b| b.iter(|| black_box(a.apply_batch_payload(black_box(&payload)))));

    // Batched, cached keys: every iteration caches the keys at v, then applies a batch at v + 1.
    let a = bench_cache();
    let mut v = 10u64;
    g.bench_function("batch_cached_1000_keys", |b| {
        b.iter_batched(
            || {
                v += 2;
                cache_batch_keys(&a, v);
                batch_payload(v + 1)
            },
            |p| black_box(a.apply_batch_payload(&p)),
            BatchSize::PerIteration,
        )
    });

    // Per-key JSON, uncached and cached.
    let j = bench_cache();
    let payloads = json_payloads(2);
    g.bench_function("json_uncached_1000_keys", |b| b.iter(|| black_box(j.apply_json(black_box(&payloads)))));
    let j = bench_cache();
    let mut v = 10u64;
    g.bench_function("json_cached_1000_keys", |b| {
        b.iter_batched(
            || {
                v += 2;
                cache_batch_keys(&j, v);
                json_payloads(v + 1)
            },
            |p| black_box(j.apply_json(&p)),
            BatchSize::PerIteration,
        )
    });
    g.finish();

    // Plain timed loops: ns per key.
    let rounds = 200;
    let a = bench_cache();
    let payload = batch_payload(2);
    let uncached = per_key(
        rounds,
        |_| (),
        |_| {
            black_box(a.apply_batch_payload(&payload));
        },
    );
    let a = bench_cache();
    let cached = per_key(
        rounds,
        |r| {
            let v = 10 + 2 * r as u64;
            cache_batch_keys(&a, v);
            batch_payload(v + 1)
        },
        |p| {
            black_box(a.apply_batch_payload(p));
        },
    );
    assert!(!a.is_cached(&key(0)), "the cached keys were evicted");
    let j = bench_cache();
    let payloads = json_payloads(2);
    let json_uncached = per_key(
        rounds,
        |_| (),
        |_| {
            black_box(j.apply_json(&payloads));
        },
    );
    let j = bench_cache();
    let json_cached = per_key(
        rounds,
        |r| {
            let v = 10 + 2 * r as u64;
            cache_batch_keys(&j, v);
            json_payloads(v + 1)
        },
        |p| {
            black_box(j.apply_json(p));
        },
    );
    let batch_bytes = batch_payload(2).len();
    let json_bytes: usize = json_payloads(2).iter().map(Vec::len).sum();
    println!();
    println!("apply cost per key ({KEYS} keys per message/batch, {OTHER_KEYS} other keys cached, {rounds} rounds):");
    println!("| path | uncached key | cached key (evicted) | bytes per key (uncompressed) |");
    println!("|---|---|---|---|");
    println!("| batched (binary) | {uncached:.0} ns | {cached:.0} ns | {:.1} |", batch_bytes as f64 / KEYS as f64);
    println!("| per-key JSON | {json_uncached:.0} ns | {json_cached:.0} ns | {:.1} |", json_bytes as f64 / KEYS as f64);
}

criterion_group!(benches, apply_batch);
criterion_main!(benches);
