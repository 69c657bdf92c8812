//! The source lag from binval's progress messages (issue #22), on a real tansu topic and a real
//! Redis: progress messages are produced here exactly as binval's progress task sends them
//! (one per partition, explicitly addressed, header `binval.kind: progress`). While they say
//! the source side is within the bound, instances serve locally; when they stop (binval frozen)
//! or report a stall (a large `lag_ms`), every instance stops serving locally and its Redis
//! reads follow its `on_source_behind` choice; fresh progress brings local serving back.
//! Timings are asserted only with wide margins.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::{Consumer, ConsumerError, OnSourceBehind, Stale};
use common::*;

const PARTITIONS: i32 = 3;
const BOUND: Duration = Duration::from_millis(1500);

/// Sends a progress message with `lag_ms` 0 to every partition every 100 ms while running: a
/// live binval that is caught up.
struct LiveBinval {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl LiveBinval {
    fn start(topic: &str, token: u64) -> anyhow::Result<LiveBinval> {
        let p = producer(&binval_testkit::broker().bootstrap())?;
        let (stop, topic) = (Arc::new(AtomicBool::new(false)), topic.to_string());
        let stop2 = stop.clone();
        let task = tokio::spawn(async move {
            while !stop2.load(SeqCst) {
                for partition in 0..PARTITIONS {
                    publish_progress(&p, &topic, &progress("shop", partition, 0, token)).await?;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        });
        Ok(LiveBinval { stop, task })
    }

    /// Stop sending (as a frozen binval would).
    async fn freeze(self) -> anyhow::Result<()> {
        self.stop.store(true, SeqCst);
        self.task.await?
    }
}

async fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    while !f() {
        anyhow::ensure!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(t0.elapsed())
}

/// Four instances, one per `on_source_behind` choice. Before any progress message the source
/// lag does not count (a binval without progress); with live progress they serve locally; when
/// progress stops they bypass the local cache and: the default without a loader refuses, the
/// default with a loader asks it, `ServeStale` serves Redis flagged, `Refuse` refuses despite a
/// loader. Fresh progress resumes local serving (fresh values, cached again); a progress
/// message that reports a stall stops local serving without waiting for messages to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn progress_decides_whether_values_are_fresh() -> anyhow::Result<()> {
    let mut scene = Scene::new("progress", 1, PARTITIONS).await?;
    scene.write(2, r#"{"v":"redis"}"#, 7).await?;
    let key = scene.key.clone();
    let b = || scene.consumer(2).max_staleness(Some(BOUND));
    let loader = |key: String| async move { Ok::<_, String>(Some(format!(r#"{{"v":"db","key":"{key}"}}"#))) };
    let plain = b().build().await?;
    let loading = b().loader(loader).build().await?;
    let stale = b().on_source_behind(OnSourceBehind::ServeStale).build().await?;
    let refusing = b().on_source_behind(OnSourceBehind::Refuse).loader(loader).build().await?;
    let all: [&Consumer; 4] = [&plain, &loading, &stale, &refusing];

    // No progress message yet: the source lag does not count, reads are local.
    for c in all {
        assert_eq!(c.get(&key).await?.as_deref(), Some(r#"{"v":"redis"}"#));
        assert_eq!(c.source_lag(), None);
        assert_eq!(c.cached_version(&key), Some(7));
    }

    let live = LiveBinval::start(&scene.topic, 5)?;
    for c in all {
        until("progress seen", Duration::from_secs(10), || c.stats().progress_messages >= PARTITIONS as u64).await?;
        assert!(c.source_lag().is_some_and(|l| l < BOUND), "{:?}", c.source_lag());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for c in all {
        assert!(c.is_serving_local());
        let hits = c.stats().hits;
        assert_eq!(c.get(&key).await?.as_deref(), Some(r#"{"v":"redis"}"#));
        assert_eq!(c.stats().hits, hits + 1, "served locally while binval's progress flows");
    }

    // binval freezes: no more progress. Within the bound (plus a listener poll) every instance
    // bypasses its local cache.
    live.freeze().await?;
    let frozen = Instant::now();
    for c in all {
        let took = until("local serving stopped", Duration::from_secs(10), || !c.is_serving_local()).await?;
        println!("stopped serving locally {:?} after the last progress", frozen.elapsed().max(took));
        // Local serving stops a little before the bound (fail_safe::engage_at); a Redis read is
        // refused once the lag is past the bound itself.
        until("source lag past the bound", Duration::from_secs(10), || c.source_lag().is_some_and(|l| l > BOUND)).await?;
    }
    match plain.get(&key).await {
        Err(ConsumerError::SourceBehind { key: k, lag_ms, bound_ms }) => {
            assert_eq!(k, key);
            assert!(lag_ms > bound_ms && bound_ms == BOUND.as_millis() as u64, "{lag_ms} {bound_ms}");
        }
        other => panic!("default without a loader: refused, got {other:?}"),
    }
    let loaded = loading.get_flagged(&key).await?;
    assert_eq!(loaded.value.as_deref(), Some(format!(r#"{{"v":"db","key":"{key}"}}"#).as_str()));
    assert_eq!(loaded.stale, None, "the loader reads the database: fresh");
    let flagged = stale.get_flagged(&key).await?;
    assert_eq!(flagged.value.as_deref(), Some(r#"{"v":"redis"}"#));
    assert!(matches!(flagged.stale, Some(Stale::SourceBehind { lag }) if lag > BOUND), "{flagged:?}");
    assert_eq!(stale.get(&key).await?.as_deref(), Some(r#"{"v":"redis"}"#), "get alone returns the value");
    assert!(matches!(refusing.get(&key).await, Err(ConsumerError::SourceBehind { .. })));
    for c in all {
        assert_eq!(c.cached_version(&key), None, "nothing cached while the source side is behind");
    }
    assert_eq!(plain.stats().source_behind_refused, 1);
    assert_eq!(loading.stats().source_behind_loaded, 1);
    assert_eq!(loading.stats().loader_fills, 1);
    assert_eq!(stale.stats().source_behind_flagged, 2);
    assert_eq!(refusing.stats().source_behind_refused, 1);
    assert_eq!(refusing.stats().loader_fills, 0);
    for c in all {
        assert!(c.stats().fail_safe_engaged >= 1);
    }

    // binval is back: local serving resumes (cache cleared), Redis values are fresh again.
    let live = LiveBinval::start(&scene.topic, 5)?;
    for c in all {
        until("local serving resumed", Duration::from_secs(10), || c.is_serving_local()).await?;
        let read = c.get_flagged(&key).await?;
        assert_eq!(read.value.as_deref(), Some(r#"{"v":"redis"}"#));
        assert_eq!(read.stale, None);
        assert_eq!(c.cached_version(&key), Some(7), "cached again");
    }

    // binval reports a stall (its writes to a frozen master wait): that report alone stops
    // local serving (a source lag of a minute can only come from it).
    live.freeze().await?;
    let p = scene.producer()?;
    publish_progress(p, &scene.topic, &progress("shop", 1, 60_000, 5)).await?;
    for c in all {
        until("the reported stall is the source lag", Duration::from_secs(5), || {
            c.source_lag().is_some_and(|l| l >= Duration::from_secs(60))
        })
        .await?;
        until("a reported stall stops local serving", Duration::from_secs(5), || !c.is_serving_local()).await?;
    }
    assert!(matches!(plain.get(&key).await, Err(ConsumerError::SourceBehind { .. })));
    // The next live round clears it.
    let live = LiveBinval::start(&scene.topic, 5)?;
    for c in all {
        until("resumed after the stall cleared", Duration::from_secs(10), || c.is_serving_local()).await?;
    }
    live.freeze().await?;
    for c in all {
        c.shutdown().await;
    }
    Ok(())
}

/// Progress messages that are not valid are counted as bad messages and skipped, never taken
/// for invalidations (nothing evicted, no notice); an old leader's (lower fencing token) are
/// ignored; events still work after them.
#[tokio::test(flavor = "multi_thread")]
async fn bad_progress_messages_are_counted_and_skipped() -> anyhow::Result<()> {
    let mut scene = Scene::new("badprogress", 1, PARTITIONS).await?;
    scene.write(1, "v1", 3).await?;
    let c = scene.consumer(1).max_staleness(Some(Duration::from_secs(30))).build().await?;
    assert_eq!(c.get(&scene.key).await?.as_deref(), Some("v1"));
    let mut notices = c.subscribe_evictions();
    let p = scene.producer()?;
    let topic = scene.topic.clone();
    // Valid ones first, from tenure 9.
    for partition in 0..PARTITIONS {
        publish_progress(p, &topic, &progress("shop", partition, 0, 9)).await?;
    }
    until("progress seen", Duration::from_secs(10), || c.stats().progress_messages == PARTITIONS as u64).await?;
    // Not JSON, an event's JSON marked as progress, a progress message naming another
    // partition, a newer schema, an unknown kind: five bad messages.
    publish_kind(p, &topic, 0, "progress", b"not json").await?;
    publish_kind(p, &topic, 0, "progress", &event(&scene.key, 99).to_json()).await?;
    publish_kind(p, &topic, 0, "progress", &progress("shop", 2, 0, 9).to_json()).await?;
    let mut newer = progress("shop", 0, 0, 9);
    newer.schema = 2;
    publish_kind(p, &topic, 0, "progress", &newer.to_json()).await?;
    publish_kind(p, &topic, 0, "gossip", b"{}").await?;
    // An old leader's report of a huge lag: ignored.
    publish_progress(p, &topic, &progress("shop", 0, 600_000, 8)).await?;
    until("five bad messages", Duration::from_secs(10), || c.stats().bad_messages == 5).await?;
    until("the old tenure's message read", Duration::from_secs(10), || c.stats().progress_messages == PARTITIONS as u64).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.stats().progress_messages, PARTITIONS as u64, "the old tenure's message is not taken");
    assert!(c.source_lag().is_some_and(|l| l < Duration::from_secs(5)), "{:?}", c.source_lag());
    assert!(c.is_serving_local());
    assert_eq!(c.cached_version(&scene.key), Some(3), "nothing evicted by the event JSON marked as progress");
    assert!(notices.try_recv().is_err(), "no eviction notice for a progress message");
    assert_eq!(c.stats().events, 0);
    // Events still flow.
    scene.publish(4).await?;
    assert!(wait_notice(&mut notices, &scene.key, 4, Duration::from_secs(10)).await?.evicted);
    c.shutdown().await;
    Ok(())
}

/// With `require_progress(true)` the source lag counts from `build()` on: an instance whose
/// topic carries no progress (binval frozen before it started, or a binval without progress)
/// stops serving as fresh after the bound.
#[tokio::test(flavor = "multi_thread")]
async fn require_progress_counts_from_the_start() -> anyhow::Result<()> {
    let mut scene = Scene::new("reqprogress", 1, 1).await?;
    scene.write(1, "v1", 3).await?;
    let c = scene.consumer(1).max_staleness(Some(Duration::from_millis(500))).require_progress(true).build().await?;
    assert!(c.source_lag().is_some());
    until("local serving stopped without progress", Duration::from_secs(10), || !c.is_serving_local()).await?;
    assert!(matches!(c.get(&scene.key).await, Err(ConsumerError::SourceBehind { .. })));
    let p = scene.producer()?;
    publish_progress(p, &scene.topic, &progress("shop", 0, 0, 1)).await?;
    until("progress resumes local serving", Duration::from_secs(10), || c.is_serving_local()).await?;
    assert_eq!(c.get(&scene.key).await?.as_deref(), Some("v1"));
    c.shutdown().await;
    Ok(())
}
