//! The monitor of `binval run`: every [`SAMPLE`] it turns the pipeline's shared state
//! ([`crate::pipeline::Stats`], the lease role and the last checkpoint in
//! [`crate::telemetry::health`]) into the gauges that answer "how far behind" and into the lag
//! `/readyz` decides on; every [`SOURCE_POLL`] the leader also asks the primary where its
//! binlog is (`SHOW BINARY LOGS`), for the `source` position and the bytes still to read.
//!
//! The gauges are computed here rather than on the data path so that the data path only
//! stores what it passes (one position per transaction read, one per transaction
//! acknowledged) and pays nothing for the arithmetic.
//!
//! # Lag
//!
//! [`lag_ms`]: 0 when the acknowledged position is the position of the last transaction read
//! and the reader is at the end of the binlog (the primary sent a replication heartbeat since
//! that transaction: it sends one only after `source.heartbeat_ms` without events), so an idle
//! source is not "behind"; otherwise now minus the commit time of the last acknowledged
//! transaction (of the first one this tenure read while it acknowledged none yet): the age of the oldest
//! change whose effect may not be in Redis and Kafka yet. Commit times come from binlog event
//! headers, whole seconds, so the value has up to one second of jitter, except for binval's
//! heartbeat row (`source.heartbeat_table`), which carries the primary's `NOW(6)`: with it the
//! lag is sub-second, and it is measured while no application writes. It keeps growing while
//! the pipeline stalls with transactions in flight (Redis or Kafka down), which is what the
//! `BinvalLagHigh` alert needs.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use binval_protocol::{BinlogPosition, SourcePosition};
use tokio::sync::watch;

use crate::config::Config;
use crate::pipeline::Stats;
use crate::telemetry::{self, names, Role, SavedCheckpoint};

/// How often the gauges are sampled (lag sub-second precision needs more than once a second).
pub const SAMPLE: Duration = Duration::from_millis(250);

/// How often the leader polls the primary's binlog position.
pub const SOURCE_POLL: Duration = Duration::from_secs(10);

/// Seconds behind the source, in ms (the rule in the module docs). `read`: end position and
/// commit time (Unix ms) of the last transaction read; `first_read_ms`: the commit time of the
/// first transaction read in this tenure (0: unknown); `acked`: the last acknowledged
/// position and the commit time of its transaction (0: unknown); `at_end`: the reader is at
/// the end of the binlog.
///
/// While this tenure has acknowledged nothing yet, the oldest change not in Redis and Kafka
/// is the first one it read: a new leader catching up on what the old one left is as far
/// behind as that change is old (the newest one read would say 0.4 s while 1.3 s behind).
pub fn lag_ms(
    read: Option<&(SourcePosition, u64)>,
    first_read_ms: u64,
    acked: Option<(&SourcePosition, u64)>,
    at_end: bool,
    now_ms: u64,
) -> u64 {
    let since = match (read, acked) {
        (None, _) => return 0,
        (Some((r, _)), Some((a, _))) if same_place(r, a) && at_end => return 0,
        (_, Some((_, acked_ms))) if acked_ms > 0 => acked_ms,
        (Some(_), None) if first_read_ms > 0 => first_read_ms,
        (Some((_, read_ms)), _) => *read_ms,
    };
    if since == 0 {
        0
    } else {
        now_ms.saturating_sub(since)
    }
}

/// Checkpoint age in ms: 0 when the saved checkpoint covers everything read; else the time
/// since the last save, counted from no earlier than `since_ms` (when this instance started
/// to lead: a checkpoint loaded at start may be days old without anything being wrong).
pub fn checkpoint_age_ms(read: Option<&SourcePosition>, saved: Option<&SavedCheckpoint>, since_ms: u64, now_ms: u64) -> u64 {
    match (read, saved) {
        (None, _) => 0,
        (Some(r), Some(s)) if r.file == s.file && r.pos == s.pos => 0,
        (Some(_), s) => now_ms.saturating_sub(s.map(|s| s.saved_at_ms).unwrap_or(0).max(since_ms)),
    }
}

fn same_place(a: &SourcePosition, b: &SourcePosition) -> bool {
    a.file == b.file && a.pos == b.pos
}

/// `(domain, sequence)` of a GTID: MariaDB `domain-server-seq`, or MySQL `uuid:n` (the domain
/// is the uuid).
pub fn gtid_sequence(gtid: &str) -> Option<(String, u64)> {
    if let Ok(g) = gtid.parse::<binval_protocol::MariadbGtid>() {
        return Some((g.domain.to_string(), g.seq));
    }
    let (uuid, n) = gtid.rsplit_once(':')?;
    Some((uuid.to_string(), n.parse().ok()?))
}

/// Start the monitor; it ends with `shutdown`. Registers every counter at 0 first, so that
/// `rate()` and the alerts see 0 rather than nothing before the first event of each kind.
pub fn spawn(cfg: &Config, stats: Arc<Stats>, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    register_zeros();
    let cfg = cfg.clone();
    tokio::spawn(async move { run(cfg, stats, shutdown).await })
}

fn register_zeros() {
    use names::*;
    for c in [
        LEASE_ACQUIRED,
        RECONNECTS,
        BINLOG_EVENTS,
        TRANSACTIONS,
        ROWS,
        KEY_CHANGES,
        EVENTS_ACKED,
        TRANSACTIONS_SPILLED,
        RESTARTS,
        FENCED_NOOPS,
        REDIS_RETRIES,
        TOKEN_READS_SKIPPED,
        PROGRESS_MESSAGES,
        CHECKPOINTS,
    ] {
        metrics::counter!(c).increment(0);
    }
    for service in ["source", "redis", "kafka"] {
        for kind in ["definite", "transient"] {
            metrics::counter!(ERRORS, "service" => service, "kind" => kind).increment(0);
        }
    }
    // The dashboard's step panel selects by label: each step is a series from the start.
    for step in ["grow", "announce", "remove"] {
        metrics::counter!(ADAPTIVE_COUNT_CHANGES, "step" => step).increment(0);
    }
    for g in [LEADER, FENCING_TOKEN, SOURCE_CONNECTED, LAG, CHECKPOINT_AGE, READY, KAFKA_WAIT, GROUPS_IN_FLIGHT] {
        metrics::gauge!(g).set(0.0);
    }
}

async fn run(cfg: Config, stats: Arc<Stats>, mut shutdown: watch::Receiver<bool>) {
    let mut source: Option<mysql_async::Conn> = None;
    let mut next_poll = tokio::time::Instant::now();
    let mut leading_since: Option<u64> = None;
    let mut kafka_warned_ms = 0u64;
    loop {
        let now = crate::now_ms();
        let leader = telemetry::health().role() == Role::Leader;
        let since = *leading_since.get_or_insert(now);
        if !leader {
            leading_since = None;
        }
        sample(&stats, leader, since, now);
        warn_kafka_waiting(&stats, now, &mut kafka_warned_ms);
        if leader && tokio::time::Instant::now() >= next_poll {
            poll_source(&cfg, &stats, &mut source).await;
            next_poll = tokio::time::Instant::now() + SOURCE_POLL;
        }
        if !leader {
            source = None;
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
    }
}

/// One sample of the gauges from the shared state.
fn sample(stats: &Stats, leader: bool, leading_since_ms: u64, now: u64) {
    let read = stats.source.last_read();
    let acked = stats.acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let health = telemetry::health();
    let (lag, age) = if leader {
        let acked_ms = stats.acked_commit_ms.load(Relaxed);
        (
            lag_ms(
                read.as_ref(),
                stats.source.first_read_ms(),
                acked.as_ref().map(|a| (a, acked_ms)),
                stats.source.at_end.load(Relaxed),
                now,
            ),
            checkpoint_age_ms(read.as_ref().map(|r| &r.0), health.checkpoint().as_ref(), leading_since_ms, now),
        )
    } else {
        (0, 0)
    };
    health.set_lag_ms(lag);
    metrics::gauge!(names::LAG).set(lag as f64 / 1000.0);
    metrics::gauge!(names::CHECKPOINT_AGE).set(age as f64 / 1000.0);
    metrics::gauge!(names::READY).set(if health.readiness(now).ready { 1.0 } else { 0.0 });
    metrics::counter!(names::BINLOG_EVENTS).absolute(stats.source.events.load(Relaxed));
    for (which, p) in [("read", read.as_ref().map(|r| &r.0)), ("acked", acked.as_ref())] {
        let Some(p) = p else { continue };
        telemetry::set_position(which, &p.file, p.pos);
        if let Some((domain, seq)) = p.gtid.as_deref().and_then(gtid_sequence) {
            metrics::gauge!(names::GTID_SEQUENCE, "position" => which, "domain" => domain).set(seq as f64);
        }
    }
    telemetry::sample_queues();
}

/// How long Kafka has not acknowledged the oldest event waiting (`binval_kafka_unacked_seconds`),
/// and a warning every [`KAFKA_WARN_EVERY`] while it is past it: a frozen broker answers
/// nothing and librdkafka reports nothing until its request timeouts, so without this a
/// broker that hangs is silent for `message.timeout.ms`.
fn warn_kafka_waiting(stats: &Stats, now: u64, warned_ms: &mut u64) {
    let since = stats.kafka_waiting_since_ms.load(Relaxed);
    let waited = if since == 0 { 0 } else { now.saturating_sub(since) };
    metrics::gauge!(names::KAFKA_WAIT).set(waited as f64 / 1000.0);
    let every = KAFKA_WARN_EVERY.as_millis() as u64;
    if waited >= every && now.saturating_sub(*warned_ms) >= every {
        *warned_ms = now;
        tracing::warn!(
            waited_ms = waited,
            "Kafka has not acknowledged invalidation events for {} s (broker down, frozen or slow?); Redis writes go on until the producer queue is full, and the checkpoint waits",
            waited / 1000
        );
    }
}

/// How long Kafka may leave an event unacknowledged before [`warn_kafka_waiting`] warns, and
/// how often it warns again.
pub const KAFKA_WARN_EVERY: Duration = Duration::from_secs(3);

/// The primary's position and the bytes between it and the acknowledged position. Failures
/// only drop the connection (the next poll reconnects); the pipeline reports source trouble.
async fn poll_source(cfg: &Config, stats: &Stats, conn: &mut Option<mysql_async::Conn>) {
    if conn.is_none() {
        match crate::binlog::server::connect(&cfg.source).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                tracing::debug!(error = %e, "monitor: cannot connect to the source");
                return;
            }
        }
    }
    let c = conn.as_mut().expect("connected above");
    match crate::binlog::server::binary_log_sizes(c).await {
        Ok(logs) => {
            if let Some((file, size)) = logs.last() {
                telemetry::set_position("source", file, *size);
            }
            let acked = stats.acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(behind) = acked.and_then(|a| crate::binlog::server::bytes_behind(&logs, &BinlogPosition::from(&a))) {
                metrics::gauge!(names::BINLOG_BYTES_BEHIND).set(behind as f64);
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "monitor: SHOW BINARY LOGS failed");
            *conn = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(file: &str, pos: u64) -> SourcePosition {
        SourcePosition { file: file.into(), pos, gtid: None }
    }

    #[test]
    fn lag_is_zero_only_when_everything_read_is_acknowledged_at_the_end_of_the_binlog() {
        let read = (pos("b.000001", 900), 1_000_000);
        let (all, some) = (pos("b.000001", 900), pos("b.000001", 400));
        assert_eq!(lag_ms(None, 0, None, true, 5_000_000), 0, "nothing read yet");
        assert_eq!(lag_ms(Some(&read), 0, Some((&all, 1_000_000)), true, 5_000_000), 0, "idle source");
        assert_eq!(
            lag_ms(Some(&read), 0, Some((&all, 1_000_000)), false, 1_000_300),
            300,
            "all read is acknowledged, but the reader may be behind the source: age of the last change"
        );
        assert_eq!(lag_ms(Some(&read), 0, Some((&some, 997_500)), false, 1_002_500), 5_000, "in flight: age of the oldest unacknowledged");
        assert_eq!(lag_ms(Some(&read), 0, None, false, 1_000_700), 700, "nothing acknowledged yet, first read unknown");
        assert_eq!(
            lag_ms(Some(&read), 998_700, None, false, 1_000_700),
            2_000,
            "a new tenure catching up: the first change it read is the oldest not acknowledged"
        );
    }

    #[test]
    fn checkpoint_age() {
        let saved = SavedCheckpoint { file: "b.000002".into(), pos: 4, saved_at_ms: 1_000 };
        assert_eq!(checkpoint_age_ms(Some(&pos("b.000002", 4)), Some(&saved), 0, 9_000), 0, "covers everything read");
        assert_eq!(checkpoint_age_ms(Some(&pos("b.000002", 80)), Some(&saved), 0, 9_000), 8_000);
        assert_eq!(checkpoint_age_ms(Some(&pos("b.000002", 80)), Some(&saved), 5_000, 9_000), 4_000, "not before leading");
        assert_eq!(checkpoint_age_ms(None, Some(&saved), 0, 9_000), 0);
    }

    #[test]
    fn gtid_sequences() {
        assert_eq!(gtid_sequence("0-1-42"), Some(("0".into(), 42)));
        assert_eq!(gtid_sequence("3e11fa47-71ca-11e1-9e33-c80aa9429562:23"), Some(("3e11fa47-71ca-11e1-9e33-c80aa9429562".into(), 23)));
        assert_eq!(gtid_sequence("nonsense"), None);
    }

    #[test]
    fn bytes_behind_spans_files() {
        let logs = vec![("b.000001".to_string(), 1000), ("b.000002".into(), 500), ("b.000003".into(), 300)];
        assert_eq!(crate::binlog::server::bytes_behind(&logs, &BinlogPosition::new("b.000003", 300)), Some(0));
        assert_eq!(crate::binlog::server::bytes_behind(&logs, &BinlogPosition::new("b.000002", 100)), Some(400 + 300));
        assert_eq!(crate::binlog::server::bytes_behind(&logs, &BinlogPosition::new("b.000000", 4)), None);
    }
}
