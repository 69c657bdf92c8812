//! Progress messages (issue #22): every `kafka.progress_interval_ms` (default 200; 0 = off)
//! the leader sends one [`ProgressMessage`] to every partition of the invalidation topic, so
//! that app instances know how far the *source side* (binval's Redis writes and enqueued
//! events) is behind the source, not only how far their stream is. Without it, a frozen Redis
//! master stalls binval's writes, no events arrive, and a consumer's stream "looks caught up"
//! while its local values and the replicas it reads grow old.
//!
//! # What a round announces
//!
//! - `position`, `commit_time_ms`: [`Stats::enqueued`], the end of the last transaction whose
//!   Redis writes are done and whose events are enqueued ([`crate::write::apply::ApplyStats::enqueued`]),
//!   read *before* the round is enqueued: the producer is idempotent, so one partition's
//!   messages are delivered in the order enqueued, and a consumer that reads the progress
//!   message has read every event of that partition up to `position` before it.
//! - `lag_ms` ([`announced_lag_ms`]): [`crate::monitor::lag_ms`] (the same rule as the
//!   `binval_lag_seconds` gauge) over the reader's state and `Stats::enqueued` of this tenure:
//!   0 when everything read is enqueued and the reader is at the end of the binlog (the
//!   primary sent a replication heartbeat since the last transaction), else the age of the
//!   oldest change whose Redis writes or events are not done (commit times are binlog header
//!   seconds, or the heartbeat row's `NOW(6)`). One refinement for a quiet source, see
//!   [`announced_lag_ms`]: between a commit and the primary's next heartbeat
//!   (`source.heartbeat_ms`) the header seconds alone would announce up to two seconds for a
//!   source that is fully applied, and trip app instances' 2 s bound after single commits.
//! - `fencing_token`: the tenure's; `source`: `source.name`; `masters`: not measured yet
//!   (absent).
//!
//! # Bounds
//!
//! A round is enqueued only when the previous one is delivered (or failed): with the broker
//! frozen at most one message per partition waits in the producer, and the loop goes on and
//! publishes again as soon as the broker answers. A full producer queue (events first) skips
//! the round. Deliveries are awaited here and never by the checkpoint task: progress never
//! holds the checkpoint back. The partitions are re-read from the metadata every
//! [`PARTITIONS_REFRESH`], so partitions added to the topic get progress too.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_protocol::{ProgressMessage, SourcePosition, PROGRESS_SCHEMA_VERSION};
use tokio::sync::watch;

use crate::config::Config;
use crate::kafka::DeliveryFuture;
use crate::kafka::KafkaSink;
use crate::monitor;
use crate::pipeline::Stats;
use crate::telemetry::names;

/// How often the topic's partitions are re-read.
pub const PARTITIONS_REFRESH: Duration = Duration::from_secs(10);

/// The commit times of binlog headers are whole seconds: a commit stamped `c` happened in
/// `c..c + 1000` ms.
const HEADER_RESOLUTION_MS: u64 = 1000;

/// What the pipeline's shared state says at one instant, for [`announced_lag_ms`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The last transaction the reader passed on, with its commit time (Unix ms).
    pub read: Option<(SourcePosition, u64)>,
    /// The last transaction of this tenure whose Redis writes are done and events enqueued.
    pub enqueued: Option<(SourcePosition, u64)>,
    /// Transactions passed on in this tenure and not yet acknowledged.
    pub in_flight: i64,
    /// The primary sent a replication heartbeat since the last transaction.
    pub at_end: bool,
    /// Binlog events received so far (heartbeats included).
    pub events: u64,
    /// Commit time (Unix ms) of the first transaction this tenure read (0: none yet).
    pub first_read_ms: u64,
}

impl Observed {
    fn of(stats: &Stats) -> Self {
        Observed {
            read: stats.source.last_read(),
            enqueued: stats.enqueued.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            in_flight: stats.source.in_flight.load(Relaxed),
            at_end: stats.source.at_end.load(Relaxed),
            events: stats.source.events.load(Relaxed),
            first_read_ms: stats.source.first_read_ms(),
        }
    }

    /// The read position that belongs to this tenure: the last read one, unless this tenure
    /// has neither enqueued nor passed on anything yet (then it is the previous tenure's).
    fn tenure_read(&self) -> Option<&(SourcePosition, u64)> {
        (self.enqueued.is_some() || self.in_flight > 0).then_some(self.read.as_ref()).flatten()
    }

    /// Everything this tenure read is enqueued.
    fn all_enqueued(&self) -> bool {
        match (self.tenure_read(), &self.enqueued) {
            (None, _) => true,
            (Some((r, _)), Some((e, _))) => r.file == e.file && r.pos == e.pos,
            (Some(_), None) => false,
        }
    }
}

/// The lag a round announces, ms, at `now_ms` (Unix ms).
///
/// The base is [`monitor::lag_ms`] over this tenure's read position, `Stats::enqueued` and
/// the reader's end-of-binlog flag. `quiet_since_ms` refines it: the start of the newest
/// sampling interval during which the reader received no binlog event at all while, at its
/// end, everything read was enqueued. The primary streams every commit at once and sends a
/// heartbeat after `source.heartbeat_ms` without one, so a reader that received nothing for
/// a whole interval had read everything committed before the interval began, and the lag is
/// at most `now - quiet_since`. That bound is taken only down to the base less the header's
/// one-second resolution, so a reader that received nothing because it was busy elsewhere
/// (a schema query after a DDL) with a backlog behind it never looks more than a second
/// fresher than the base says. A quiet source thus announces at most about one interval right
/// after a commit, then 0 once the primary's heartbeat arrives, where the base alone announces
/// up to `heartbeat_ms` + 1 s.
pub fn announced_lag_ms(o: &Observed, quiet_since_ms: Option<u64>, now_ms: u64) -> u64 {
    let base = monitor::lag_ms(o.tenure_read(), o.first_read_ms, o.enqueued.as_ref().map(|(p, ms)| (p, *ms)), o.at_end, now_ms);
    match quiet_since_ms {
        Some(q) if o.all_enqueued() => base.min(now_ms.saturating_sub(q).max(base.saturating_sub(HEADER_RESOLUTION_MS))),
        _ => base,
    }
}

/// Tracks [`announced_lag_ms`]'s quiet intervals from one sample to the next.
#[derive(Debug, Default)]
struct Quiet {
    /// The previous sample: when (Unix ms) and the events count then.
    last: Option<(u64, u64)>,
    /// Start of the newest quiet interval.
    since_ms: Option<u64>,
}

impl Quiet {
    /// Take a sample at `now_ms`; the quiet start to use now.
    fn sample(&mut self, o: &Observed, now_ms: u64) -> Option<u64> {
        if let Some((at, events)) = self.last {
            if events == o.events && o.all_enqueued() {
                self.since_ms = Some(at);
            }
        }
        self.last = Some((now_ms, o.events));
        self.since_ms
    }
}

/// The running progress task of one tenure; aborted when dropped.
pub struct ProgressTask(Option<tokio::task::JoinHandle<()>>);

impl Drop for ProgressTask {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// Start the progress task of a tenure (nothing when `kafka.progress_interval_ms` is 0), after
/// the pipeline reset the tenure's shared state (`Stats::enqueued` among it: what the previous
/// tenure enqueued may never have been delivered, and this tenure reads again from its
/// checkpoint). The task runs until the returned handle is dropped or `stop` becomes true.
pub fn spawn(cfg: &Config, kafka: Arc<KafkaSink>, stats: Arc<Stats>, fencing_token: u64, stop: watch::Receiver<bool>) -> ProgressTask {
    let interval = Duration::from_millis(cfg.kafka.progress_interval_ms);
    if interval.is_zero() {
        return ProgressTask(None);
    }
    let source: Arc<str> = Arc::from(cfg.source.name.as_str());
    ProgressTask(Some(tokio::spawn(run(kafka, stats, source, fencing_token, interval, stop))))
}

async fn run(
    kafka: Arc<KafkaSink>,
    stats: Arc<Stats>,
    source: Arc<str>,
    fencing_token: u64,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut partitions: Vec<i32> = Vec::new();
    let mut next_refresh = Instant::now();
    let mut quiet = Quiet::default();
    let mut failing = false;
    let mut next = tokio::time::Instant::now() + interval;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.wait_for(|v| *v) => return,
        }
        let started = tokio::time::Instant::now();
        next = started + interval;
        if partitions.is_empty() || Instant::now() >= next_refresh {
            match kafka.partitions(Duration::from_secs(5)).await {
                Ok(p) => {
                    partitions = p;
                    next_refresh = Instant::now() + PARTITIONS_REFRESH;
                }
                Err(e) => tracing::debug!(error = %e, "progress: reading the topic's partitions failed; retrying"),
            }
            if partitions.is_empty() {
                continue;
            }
        }
        let now = crate::now_ms();
        let o = Observed::of(&stats);
        let lag_ms = announced_lag_ms(&o, quiet.sample(&o, now), now);
        metrics::gauge!(names::PROGRESS_LAG).set(lag_ms as f64 / 1000.0);
        let (position, commit_time_ms) = o.enqueued.map_or((None, 0), |(p, ms)| (Some(p), ms));
        let mut round: Vec<(i32, DeliveryFuture)> = Vec::with_capacity(partitions.len());
        for &partition in &partitions {
            let msg = ProgressMessage {
                schema: PROGRESS_SCHEMA_VERSION,
                source: source.to_string(),
                partition,
                position: position.clone(),
                commit_time_ms,
                lag_ms,
                fencing_token,
                publish_time_ms: crate::now_ms(),
                masters: None,
            };
            match kafka.enqueue_progress(&msg) {
                Ok(Some(f)) => round.push((partition, f)),
                // The queue is full of events: they go first; this round is skipped.
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "progress: enqueue failed");
                    break;
                }
            }
        }
        // Wait for the whole round before the next one (at most one message per partition in
        // the producer), however long the broker takes; a shutdown does not wait.
        let mut delivered = 0u64;
        let mut error = None;
        for (partition, f) in round {
            let r = tokio::select! {
                r = f => r,
                _ = stop.wait_for(|v| *v) => return,
            };
            match r {
                Ok(Ok(_)) => delivered += 1,
                Ok(Err(e)) => error = Some(format!("partition {partition}: {e}")),
                Err(_) => error = Some(format!("partition {partition}: delivery cancelled")),
            }
        }
        metrics::counter!(names::PROGRESS_MESSAGES).increment(delivered);
        match error {
            Some(e) if !failing => {
                tracing::warn!(error = %e, topic = kafka.topic(), "progress message not delivered; app instances will see the source side as behind until one is");
                failing = true;
            }
            Some(_) => {}
            None if failing && delivered > 0 => {
                tracing::info!(topic = kafka.topic(), "progress messages delivered again");
                failing = false;
            }
            None => {}
        }
        // A round whose deliveries took longer than the interval is followed by the next at
        // once (`next` is past).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(p: u64) -> SourcePosition {
        SourcePosition { file: "b.000001".into(), pos: p, gtid: None }
    }

    fn obs(read: Option<(u64, u64)>, enqueued: Option<(u64, u64)>, in_flight: i64, at_end: bool) -> Observed {
        Observed {
            read: read.map(|(p, ms)| (pos(p), ms)),
            enqueued: enqueued.map(|(p, ms)| (pos(p), ms)),
            in_flight,
            at_end,
            events: 0,
            first_read_ms: 0,
        }
    }

    #[test]
    fn the_base_is_the_monitors_lag_over_this_tenure() {
        // Nothing read: 0.
        assert_eq!(announced_lag_ms(&obs(None, None, 0, false), None, 10_000), 0);
        // Caught up at the end of the binlog: 0.
        assert_eq!(announced_lag_ms(&obs(Some((900, 5_000)), Some((900, 5_000)), 1, true), None, 10_000), 0);
        // Applied, not known to be at the end yet: the age of the last change.
        assert_eq!(announced_lag_ms(&obs(Some((900, 5_000)), Some((900, 5_000)), 1, false), None, 10_000), 5_000);
        // Writes stalled behind the last enqueued change (committed at 4 s): its age.
        assert_eq!(announced_lag_ms(&obs(Some((900, 9_000)), Some((400, 4_000)), 3, false), None, 10_000), 6_000);
        // A tenure that has read but enqueued nothing yet: the age of what it read.
        assert_eq!(announced_lag_ms(&obs(Some((900, 9_000)), None, 1, false), None, 10_000), 1_000);
        // The previous tenure's read position does not count: this one read nothing yet.
        assert_eq!(announced_lag_ms(&obs(Some((900, 1_000)), None, 0, true), None, 10_000), 0);
    }

    #[test]
    fn a_quiet_reader_bounds_the_lag_by_the_interval_not_below_the_header_resolution() {
        // Committed at 9.0 s (header second), applied; 0.8 s later no heartbeat yet, but the
        // reader received nothing since 9.6 s: at most 0.2 s behind.
        let applied = obs(Some((900, 9_000)), Some((900, 9_000)), 1, false);
        assert_eq!(announced_lag_ms(&applied, None, 9_800), 800);
        assert_eq!(announced_lag_ms(&applied, Some(9_600), 9_800), 200);
        // Quiet since long ago, but the base says 5 s: never fresher than base - 1 s.
        assert_eq!(announced_lag_ms(&obs(Some((900, 5_000)), Some((900, 5_000)), 1, false), Some(9_600), 10_000), 4_000);
        // Not everything read is enqueued: the quiet interval says nothing about the writes.
        let stalled = obs(Some((900, 9_000)), Some((400, 9_000)), 2, false);
        assert_eq!(announced_lag_ms(&stalled, Some(9_900), 10_500), 1_500);
    }

    #[test]
    fn quiet_intervals_need_no_events_and_everything_enqueued() {
        let mut q = Quiet::default();
        let mut o = obs(Some((900, 9_000)), Some((900, 9_000)), 1, false);
        o.events = 10;
        assert_eq!(q.sample(&o, 1_000), None, "first sample: no interval yet");
        o.events = 12;
        assert_eq!(q.sample(&o, 1_200), None, "events arrived");
        assert_eq!(q.sample(&o, 1_400), Some(1_200), "nothing arrived in 1.2..1.4 s");
        assert_eq!(q.sample(&o, 1_600), Some(1_400));
        o.events = 13;
        assert_eq!(q.sample(&o, 1_800), Some(1_400), "the last quiet start stays until a newer one");
        o.enqueued = Some((pos(400), 9_000));
        assert_eq!(q.sample(&o, 2_000), Some(1_400), "not all enqueued: no new quiet interval");
    }
}
