//! The fail safe under a flowing stream (issue #15, invariant I8): a publisher produces real
//! invalidation events at a steady rate (binval's producer settings) while the test samples
//! the consumer. A busy stream must keep the consumer serving locally in every sample, with no
//! bypass, no rebuild and no gap; a frozen broker (SIGSTOP) under the same flow must still stop
//! local serving, and local serving must resume after the thaw (invariant I5).
//!
//! The consumers here use the crate's defaults for everything Kafka (no `fetch.wait.max.ms`
//! override), as an app would. Assertions are on states and counts; durations are printed.

mod common;

use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use common::*;

/// Samples taken while events flow, 50 ms apart: 5 s, longer than the four bounds of 1 s after
/// which the old fail safe rebuilt its consumer.
const SAMPLES: u32 = 100;
const BOUND: Duration = Duration::from_secs(1);

fn keys(prefix: &str, n: usize) -> Vec<String> {
    let base = binval_testkit::unique_name(prefix);
    (0..n).map(|i| format!("{base}:{i}")).collect()
}

/// Wait until `f` holds (checked every 20 ms), or fail naming `what`.
async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    while !f() {
        anyhow::ensure!(t0.elapsed() < timeout, "not within {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(t0.elapsed())
}

/// Sample `c` SAMPLES times while events flow: serving locally, and a key it holds (not
/// touched by the events; `value` in Redis) is a local hit. Returns the largest stream lag
/// seen.
async fn sample_serving(c: &Consumer, held: &str, value: &str) -> anyhow::Result<Duration> {
    let mut max_lag = Duration::ZERO;
    for i in 0..SAMPLES {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let lag = c.stream_lag();
        max_lag = max_lag.max(lag);
        anyhow::ensure!(c.is_serving_local(), "sample {i}: not serving locally (stream lag {lag:?}): {:?}", c.stats());
        let hits = c.stats().hits;
        anyhow::ensure!(c.get(held).await?.as_deref() == Some(value), "sample {i}: wrong value");
        anyhow::ensure!(c.stats().hits == hits + 1, "sample {i}: the held key was not a local hit: {:?}", c.stats());
    }
    Ok(max_lag)
}

/// `rate` events/s over 3 partitions: serving locally in every sample; every published event
/// applied exactly once; no bypass, fail-safe stop, rebuild or gap.
async fn keeps_serving_at(rate: u32) -> anyhow::Result<()> {
    init_tracing();
    let broker = binval_testkit::broker();
    let topic = create_topic(&broker.bootstrap(), 3).await?;
    let held = keys("held", 1).remove(0);
    let mut r = redis_conn().await?;
    write_fenced(&mut r, &held, 1, "held", 1).await?;
    let c = Consumer::builder()
        .brokers(broker.bootstrap())
        .topic(&topic)
        .redis_standalone(binval_testkit::redis().url())
        .max_staleness(Some(BOUND))
        .build()
        .await?;
    assert_eq!(c.get(&held).await?.as_deref(), Some("held"));

    let publisher = SteadyPublisher::start(&broker.bootstrap(), &topic, rate, keys("busy", 200))?;
    wait_until("events flowing", Duration::from_secs(15), || c.stats().events > 0).await?;
    let sampled = sample_serving(&c, &held, "held").await;
    let published = publisher.finish().await?;
    let max_lag = sampled?;
    wait_until("every published event applied", Duration::from_secs(15), || c.stats().events >= published).await?;
    let s = c.stats();
    println!("{rate} events/s: {SAMPLES} of {SAMPLES} samples served locally; largest stream lag {max_lag:?} (bound {BOUND:?}); {published} published; {s:?}");
    assert_eq!(s.events, published, "each event applied exactly once: {s:?}");
    assert_eq!((s.bypass_reads, s.fail_safe_engaged, s.listener_rebuilds, s.stream_gaps), (0, 0, 0, 0), "{s:?}");
    assert!(c.is_serving_local());
    c.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_stream_keeps_serving_locally_at_300_per_sec() -> anyhow::Result<()> {
    keeps_serving_at(300).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_stream_keeps_serving_locally_at_1000_per_sec() -> anyhow::Result<()> {
    keeps_serving_at(1000).await
}

/// I5 with events flowing: the broker freezes (SIGSTOP: connections stay open, nothing
/// answers) under a 300 events/s publisher. The consumer stops serving locally (once), serves
/// a value changed in Redis meanwhile, and serves locally again after the thaw; every event,
/// including those held up by the freeze, is applied exactly once, without a rebuild or gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_stops_local_serving_while_events_flow() -> anyhow::Result<()> {
    init_tracing();
    let broker = tokio::task::spawn_blocking(binval_testkit::OwnedBroker::start_new).await??;
    let topic = create_topic(&broker.bootstrap(), 2).await?;
    let held = keys("frozen-held", 1).remove(0);
    let mut r = redis_conn().await?;
    write_fenced(&mut r, &held, 1, "held", 1).await?;
    let c = Consumer::builder()
        .brokers(broker.bootstrap())
        .topic(&topic)
        .redis_standalone(binval_testkit::redis().url())
        .max_staleness(Some(BOUND))
        .kafka_request_timeout(Duration::from_millis(500))
        .build()
        .await?;
    assert_eq!(c.get(&held).await?.as_deref(), Some("held"));
    let publisher = SteadyPublisher::start(&broker.bootstrap(), &topic, 300, keys("frozen-busy", 100))?;
    wait_until("events flowing", Duration::from_secs(15), || c.stats().events > 0).await?;
    sample_serving(&c, &held, "held").await?;

    broker.freeze(true);
    let frozen = Instant::now();
    // Changed in Redis while the broker hangs; no event can reach the consumer.
    write_fenced(&mut r, &held, 1, "changed", 2).await?;
    let bypassed = wait_until("local serving stopped", Duration::from_secs(20), || !c.is_serving_local()).await;
    let stopped_after = frozen.elapsed();
    // Still frozen: 20 samples over about a bound, each bypassing the cache with the new value.
    let mut during = Vec::new();
    if bypassed.is_ok() {
        for _ in 0..20 {
            during.push((c.is_serving_local(), c.get(&held).await));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    broker.freeze(false);
    bypassed?;
    println!("broker frozen under 300 events/s: local serving stopped after {stopped_after:?} (bound {BOUND:?})");
    for (i, (serving, got)) in during.into_iter().enumerate() {
        assert!(!serving, "sample {i} while frozen: serving locally again");
        assert_eq!(got?.as_deref(), Some("changed"), "sample {i} while frozen: the old local value was served");
    }

    let resumed = wait_until("serving locally after the thaw", Duration::from_secs(20), || c.is_serving_local()).await?;
    println!("thawed: serving locally again after {resumed:?}");
    assert_eq!(c.get(&held).await?.as_deref(), Some("changed"));
    sample_serving(&c, &held, "changed").await?;
    let published = publisher.finish().await?;
    wait_until("every published event applied", Duration::from_secs(20), || c.stats().events >= published).await?;
    let s = c.stats();
    println!("{published} published; {s:?}");
    assert_eq!(s.events, published, "each event applied exactly once: {s:?}");
    assert_eq!((s.fail_safe_engaged, s.listener_rebuilds, s.stream_gaps), (1, 0, 0), "{s:?}");
    assert!(s.bypass_reads >= 20, "{s:?}");
    c.shutdown().await;
    drop(broker);
    Ok(())
}
