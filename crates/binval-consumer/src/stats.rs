//! Counters: kept as atomics for [`crate::Consumer::stats`] and mirrored to the `metrics`
//! facade so any installed recorder (Prometheus exporter, …) sees them too. The metric names
//! and their meaning are listed in the crate docs, "Metrics".

use crate::metric_names;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Suggested histogram buckets per histogram of this crate (`(metric name, upper bounds)`),
/// for recorders that export histograms with buckets, so dashboards can use
/// `histogram_quantile` (`deploy/grafana/binval-consumer.json` does):
///
/// ```no_run
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// let mut b = PrometheusBuilder::new();
/// for (name, buckets) in binval_consumer::HISTOGRAM_BUCKETS {
///     b = b.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets).unwrap();
/// }
/// let handle = b.install_recorder().unwrap(); // before Consumer::build()
/// ```
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[(
    metric_names::INVALIDATION_LAG_MS,
    &[1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0],
)];

const WITHIN_LABELS: [&str; 3] = ["50", "200", "1000"];

/// A snapshot of the consumer's counters, all counted since `build()`. Serializes (serde) as
/// a flat object of these field names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// `get` calls answered from the local cache.
    pub hits: u64,
    /// `get` calls that did not find the key in the local cache (while serving locally).
    pub misses: u64,
    /// `get` calls made while the fail-safe bypassed the local cache (read Redis, cache nothing).
    pub bypass_reads: u64,
    /// Redis read-throughs that found a value, whether it was then cached or not.
    pub fills: u64,
    /// Redis reads made by fills (one `HMGET K:rN d t p n` each, whichever node served it): the
    /// sum of `binval_consumer_redis_reads_total` over masters and commands.
    pub redis_reads: u64,
    /// Fills whose replica reads (at most [`crate::ConsumerBuilder::max_replica_reads`]) all
    /// found the key missing; they went on to the loader if one is set.
    pub missing: u64,
    /// `get` calls answered "no row" from the local cache: a cached tombstone, or a key cached
    /// as missing ([`crate::ConsumerBuilder::missing_ttl`]). Also counted in `hits`.
    pub negative_hits: u64,
    /// Fills that the fill-race guard refused to cache (returned to the caller only).
    pub fills_refused: u64,
    /// Invalidation events the listener applied.
    pub events: u64,
    /// Events that removed an entry the local cache held.
    pub evictions: u64,
    /// Topic messages skipped: no payload, longer than [`crate::ConsumerBuilder::max_message_bytes`], not a valid invalidation event,
    /// marked as a progress message (`binval.kind: progress`) and not a valid one (or read
    /// from another partition than it names), or of an unknown `binval.kind`.
    pub bad_messages: u64,
    /// `get` misses (or bypass reads) that did not read Redis themselves but awaited the fill
    /// of the same key already in flight in this instance (single-flight).
    pub coalesced: u64,
    /// Fills the miss rate limit refused ([`crate::ConsumerBuilder::max_fills_per_sec`],
    /// [`crate::ConsumerBuilder::max_fills_per_key_per_sec`]); counted once per refused fill,
    /// however many callers awaited it.
    pub limiter_rejections: u64,
    /// `get` calls answered with the stale copy of an evicted entry because the rate limit
    /// refused the fill (one per caller).
    pub stale_served: u64,
    /// `get` calls of keys that the cache mode does not cache locally (a prefix not listed, or
    /// not hot in hot-only mode); they go through single-flight, limits and Redis.
    pub uncached_reads: u64,
    /// Fills that found a tombstone (the row was deleted) and answered `None`.
    pub tombstones: u64,
    /// Fills answered by the app-supplied loader (every replica missing).
    pub loader_fills: u64,
    /// Loader calls that failed or timed out.
    pub loader_errors: u64,
    /// Refresh-ahead fills started by a hit on an entry near its expiry.
    pub refreshes: u64,
    /// Entries removed to keep the local cache within its entry / byte bound.
    pub capacity_evictions: u64,
    /// Entries removed by their TTL.
    pub expirations: u64,
    /// Times the fail safe stopped local serving (the stream was lost, or its lag went past
    /// [`crate::ConsumerBuilder::max_staleness`]); the end of the listener is not counted.
    pub fail_safe_engaged: u64,
    /// Times the listener replaced its librdkafka consumer because the broker reported events
    /// the consumer did not receive for four bounds (connections presumed wedged).
    pub listener_rebuilds: u64,
    /// Jumps in a partition's offsets (events deleted before they were read, a broker that lost
    /// its log): each cleared the local cache.
    pub stream_gaps: u64,
    /// binval progress messages the listener took (valid, of a current tenure); see
    /// [`crate::Consumer::source_lag`]. Invalid ones are counted in `bad_messages`.
    pub progress_messages: u64,
    /// `get` calls refused with [`crate::ConsumerError::SourceBehind`]: the source side was
    /// behind the bound for every replica of the key and
    /// [`crate::ConsumerBuilder::on_source_behind`] said to refuse (or to load without a
    /// loader). One per caller.
    pub source_behind_refused: u64,
    /// `get` calls answered with a Redis value flagged stale
    /// ([`crate::OnSourceBehind::ServeStale`], [`crate::Stale::SourceBehind`]). One per caller.
    pub source_behind_flagged: u64,
    /// `get` calls answered by the loader instead of Redis because the source side was behind
    /// ([`crate::OnSourceBehind::LoadOrRefuse`]). One per caller.
    pub source_behind_loaded: u64,
    /// Replica reads that did not answer within
    /// [`crate::ConsumerBuilder::replica_read_timeout`] (each moved the fill on to a replica on
    /// another master when one was left to try).
    pub replica_read_timeouts: u64,
    /// Topic messages the listener received, of any kind (per-key events, batches, progress
    /// messages, bad ones): what this instance fetched from the broker, one per per-key event
    /// or one per batch.
    pub messages: u64,
    /// Payload bytes of those messages as librdkafka hands them over (after decompression;
    /// keys, headers and the record framing not included).
    pub message_bytes: u64,
    /// Reads of replica 0 that a fill made because a replica it read before was missing
    /// without a position (never written, removed by a shrink of the key's replica count, or
    /// not yet copied by a grow): see "Adaptive replica counts" in the crate docs.
    pub replica_zero_fallbacks: u64,
    /// Keys whose learned replica count (from a record's field `n` or the hot set) differs
    /// from the configured one, at the time of the snapshot (bounded by
    /// [`crate::LEARNED_COUNT_ENTRIES`]). A gauge, not a counter.
    pub learned_counts: u64,
    /// Heat reports this instance wrote (`HSET binval:heat:{b}`, see
    /// [`crate::ConsumerBuilder::heat_reports`]).
    pub heat_reports_sent: u64,
    /// Heat reports (and the removal of this instance's report at shutdown) that failed:
    /// refused (`NOPERM`), timed out or the connection failed. Retried at the next interval.
    pub heat_reports_failed: u64,
    /// Loads of the hot set (`HGETALL binval:hot`, at start and at each refresh) that failed.
    pub hot_set_load_failures: u64,
    /// Invalidations applied whose event carried a commit time (every one binval writes): the
    /// denominator of the consistency shares below and of [`Stats::nines`].
    pub timed_invalidations: u64,
    /// Of those, applied within 50 ms of the commit (applied at − the event's `commit_time_ms`).
    pub applied_within_50ms: u64,
    /// Of those, applied within 200 ms of the commit.
    pub applied_within_200ms: u64,
    /// Of those, applied within 1,000 ms of the commit.
    pub applied_within_1000ms: u64,
}

/// The thresholds of the consistency shares, ms: [`Stats::applied_within_50ms`] and its two
/// siblings, exported as `binval_consumer_applied_within_total{within_ms="50"|"200"|"1000"}`.
pub const CONSISTENCY_THRESHOLDS_MS: [u64; 3] = [50, 200, 1000];

impl Stats {
    /// The share of timed invalidations this instance applied within `within_ms` of their
    /// commit (one of [`CONSISTENCY_THRESHOLDS_MS`]) as nines: `-log10(1 - share)`, so 0.99 is
    /// 2.0 and 0.999 is 3.0. `None` before the first timed invalidation or for another
    /// threshold. When every one was within, the nines are capped at `log10(count)` (more
    /// cannot be told from that many).
    ///
    /// The commit time is binval's (`commit_time_ms` of the event): MySQL 8's own commit
    /// timestamp, else the millisecond binval read the commit at when it keeps up (within a
    /// millisecond or so of the commit), else the binlog header's second.
    ///
    /// ```
    /// let s = binval_consumer::Stats { timed_invalidations: 1000, applied_within_200ms: 999, ..Default::default() };
    /// assert!((s.nines(200).unwrap() - 3.0).abs() < 1e-9);
    /// assert_eq!(s.nines(50), Some(0.0));
    /// assert_eq!(s.nines(7), None);
    /// ```
    pub fn nines(&self, within_ms: u64) -> Option<f64> {
        let i = CONSISTENCY_THRESHOLDS_MS.iter().position(|t| *t == within_ms)?;
        let within = [self.applied_within_50ms, self.applied_within_200ms, self.applied_within_1000ms][i];
        if self.timed_invalidations == 0 {
            return None;
        }
        let n = self.timed_invalidations as f64;
        let cap = n.log10();
        let missed = (self.timed_invalidations - within.min(self.timed_invalidations)) as f64;
        Some(if missed == 0.0 { cap } else { (-(missed / n).log10()).min(cap) })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bypass_reads: AtomicU64,
    pub fills: AtomicU64,
    pub redis_reads: AtomicU64,
    pub missing: AtomicU64,
    pub negative_hits: AtomicU64,
    pub fills_refused: AtomicU64,
    pub events: AtomicU64,
    pub evictions: AtomicU64,
    pub bad_messages: AtomicU64,
    pub coalesced: AtomicU64,
    pub limiter_rejections: AtomicU64,
    pub stale_served: AtomicU64,
    pub uncached_reads: AtomicU64,
    pub tombstones: AtomicU64,
    pub loader_fills: AtomicU64,
    pub loader_errors: AtomicU64,
    pub refreshes: AtomicU64,
    pub capacity_evictions: AtomicU64,
    pub expirations: AtomicU64,
    pub fail_safe_engaged: AtomicU64,
    pub listener_rebuilds: AtomicU64,
    pub stream_gaps: AtomicU64,
    pub progress_messages: AtomicU64,
    pub source_behind_refused: AtomicU64,
    pub source_behind_flagged: AtomicU64,
    pub source_behind_loaded: AtomicU64,
    pub replica_read_timeouts: AtomicU64,
    pub messages: AtomicU64,
    pub message_bytes: AtomicU64,
    pub replica_zero_fallbacks: AtomicU64,
    pub heat_reports_sent: AtomicU64,
    pub heat_reports_failed: AtomicU64,
    pub hot_set_load_failures: AtomicU64,
    pub timed_invalidations: AtomicU64,
    /// Applied within each of [`CONSISTENCY_THRESHOLDS_MS`].
    pub applied_within: [AtomicU64; 3],
    /// The consistency counters' handles, registered once like `hit_metric`.
    consistency_metrics: ConsistencyMetrics,
    /// The hit counter's handle, registered once: a local hit must not pay for the recorder's
    /// key lookup that `metrics::counter!` does on every call.
    hit_metric: HitMetric,
}

/// `binval_consumer_hits_total`, registered with the recorder installed when the consumer is
/// built (install a recorder before `build()`; later ones do not see hits).
struct HitMetric(metrics::Counter);

impl Default for HitMetric {
    fn default() -> Self {
        HitMetric(metrics::counter!(metric_names::HITS_TOTAL))
    }
}

impl std::fmt::Debug for HitMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HitMetric")
    }
}

/// `binval_consumer_timed_invalidations_total` and `binval_consumer_applied_within_total`
/// per threshold, registered at 0 with the recorder installed when the consumer is built.
struct ConsistencyMetrics {
    timed: metrics::Counter,
    within: [metrics::Counter; 3],
}

impl Default for ConsistencyMetrics {
    fn default() -> Self {
        let timed = metrics::counter!(metric_names::TIMED_INVALIDATIONS_TOTAL);
        timed.increment(0);
        let within = WITHIN_LABELS.map(|w| metrics::counter!(metric_names::APPLIED_WITHIN_TOTAL, "within_ms" => w));
        within.iter().for_each(|c| c.increment(0));
        ConsistencyMetrics { timed, within }
    }
}

impl std::fmt::Debug for ConsistencyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConsistencyMetrics")
    }
}

macro_rules! bump {
    ($fn:ident, $field:ident, $name:expr) => {
        #[inline]
        pub(crate) fn $fn(&self) {
            self.$field.fetch_add(1, Relaxed);
            metrics::counter!($name).increment(1);
        }
    };
}

/// Every counter of [`Counters`], registered at 0 when the consumer is built so that `rate()`
/// and alerts see 0 rather than nothing before the first event of each kind.
const COUNTER_NAMES: &[&str] = &[
    metric_names::HITS_TOTAL,
    metric_names::MISSES_TOTAL,
    metric_names::BYPASS_READS_TOTAL,
    metric_names::FILLS_TOTAL,
    metric_names::MISSING_TOTAL,
    metric_names::NEGATIVE_HITS_TOTAL,
    metric_names::FILLS_REFUSED_TOTAL,
    metric_names::EVENTS_TOTAL,
    metric_names::EVICTIONS_TOTAL,
    metric_names::BAD_MESSAGES_TOTAL,
    metric_names::COALESCED_TOTAL,
    metric_names::LIMITER_REJECTIONS_TOTAL,
    metric_names::STALE_SERVED_TOTAL,
    metric_names::UNCACHED_READS_TOTAL,
    metric_names::TOMBSTONES_TOTAL,
    metric_names::LOADER_FILLS_TOTAL,
    metric_names::LOADER_ERRORS_TOTAL,
    metric_names::REFRESHES_TOTAL,
    metric_names::CAPACITY_EVICTIONS_TOTAL,
    metric_names::EXPIRATIONS_TOTAL,
    metric_names::PROGRESS_MESSAGES_TOTAL,
    metric_names::REPLICA_READ_TIMEOUTS_TOTAL,
    metric_names::MESSAGES_TOTAL,
    metric_names::MESSAGE_BYTES_TOTAL,
    metric_names::REPLICA_ZERO_FALLBACKS_TOTAL,
    metric_names::HOT_SET_LOAD_FAILURES_TOTAL,
];

impl Counters {
    /// New counters, each registered with the installed recorder at 0.
    pub(crate) fn registered() -> Self {
        for name in COUNTER_NAMES {
            metrics::counter!(*name).increment(0);
        }
        for outcome in ["refused", "flagged", "loaded"] {
            metrics::counter!(metric_names::SOURCE_BEHIND_READS_TOTAL, "outcome" => outcome).increment(0);
        }
        for outcome in ["sent", "failed"] {
            metrics::counter!(metric_names::HEAT_REPORTS_TOTAL, "outcome" => outcome).increment(0);
        }
        Counters::default()
    }

    #[inline]
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Relaxed);
        self.hit_metric.0.increment(1);
    }
    bump!(miss, misses, metric_names::MISSES_TOTAL);
    bump!(bypass_read, bypass_reads, metric_names::BYPASS_READS_TOTAL);
    bump!(fill, fills, metric_names::FILLS_TOTAL);
    bump!(missing, missing, metric_names::MISSING_TOTAL);

    /// One Redis read of a fill (the per-master metric is counted where the read is sent).
    #[inline]
    pub(crate) fn redis_read(&self) {
        self.redis_reads.fetch_add(1, Relaxed);
    }
    bump!(negative_hit, negative_hits, metric_names::NEGATIVE_HITS_TOTAL);
    bump!(fill_refused, fills_refused, metric_names::FILLS_REFUSED_TOTAL);
    bump!(bad_message, bad_messages, metric_names::BAD_MESSAGES_TOTAL);
    bump!(coalesced, coalesced, metric_names::COALESCED_TOTAL);
    bump!(limiter_rejection, limiter_rejections, metric_names::LIMITER_REJECTIONS_TOTAL);
    bump!(stale_served, stale_served, metric_names::STALE_SERVED_TOTAL);
    bump!(uncached_read, uncached_reads, metric_names::UNCACHED_READS_TOTAL);
    bump!(tombstone, tombstones, metric_names::TOMBSTONES_TOTAL);
    bump!(loader_fill, loader_fills, metric_names::LOADER_FILLS_TOTAL);
    bump!(loader_error, loader_errors, metric_names::LOADER_ERRORS_TOTAL);
    bump!(refresh, refreshes, metric_names::REFRESHES_TOTAL);
    bump!(capacity_eviction, capacity_evictions, metric_names::CAPACITY_EVICTIONS_TOTAL);
    bump!(expiration, expirations, metric_names::EXPIRATIONS_TOTAL);
    bump!(fail_safe_engaged, fail_safe_engaged, metric_names::FAIL_SAFE_ENGAGED_TOTAL);
    bump!(listener_rebuild, listener_rebuilds, metric_names::LISTENER_REBUILDS_TOTAL);
    bump!(stream_gap, stream_gaps, metric_names::STREAM_GAPS_TOTAL);
    bump!(progress_message, progress_messages, metric_names::PROGRESS_MESSAGES_TOTAL);
    bump!(replica_read_timeout, replica_read_timeouts, metric_names::REPLICA_READ_TIMEOUTS_TOTAL);
    bump!(replica_zero_fallback, replica_zero_fallbacks, metric_names::REPLICA_ZERO_FALLBACKS_TOTAL);
    bump!(hot_set_load_failure, hot_set_load_failures, metric_names::HOT_SET_LOAD_FAILURES_TOTAL);

    /// A heat report written (`sent`) or not (`failed`).
    pub(crate) fn heat_report(&self, sent: bool) {
        let (field, outcome) = if sent { (&self.heat_reports_sent, "sent") } else { (&self.heat_reports_failed, "failed") };
        field.fetch_add(1, Relaxed);
        metrics::counter!(metric_names::HEAT_REPORTS_TOTAL, "outcome" => outcome).increment(1);
    }

    /// The number of learned replica counts (gauge `binval_consumer_learned_counts`).
    pub(crate) fn learned_counts(&self, entries: u64) {
        metrics::gauge!(metric_names::LEARNED_COUNTS).set(entries as f64);
    }

    /// A `get` the source side's lag decided: `outcome` is `refused`, `flagged` or `loaded`.
    pub(crate) fn source_behind(&self, outcome: &'static str) {
        let field = match outcome {
            "refused" => &self.source_behind_refused,
            "flagged" => &self.source_behind_flagged,
            _ => &self.source_behind_loaded,
        };
        field.fetch_add(1, Relaxed);
        metrics::counter!(metric_names::SOURCE_BEHIND_READS_TOTAL, "outcome" => outcome).increment(1);
    }

    /// A batch of `events` applied by the listener, `evictions` of which removed an entry.
    pub(crate) fn events(&self, events: u64, evictions: u64) {
        self.events.fetch_add(events, Relaxed);
        self.evictions.fetch_add(evictions, Relaxed);
        metrics::counter!(metric_names::EVENTS_TOTAL).increment(events);
        metrics::counter!(metric_names::EVICTIONS_TOTAL).increment(evictions);
    }

    /// One poll batch of the listener: `messages` topic messages of `bytes` payload bytes.
    pub(crate) fn received(&self, messages: u64, bytes: u64) {
        if messages == 0 {
            return;
        }
        self.messages.fetch_add(messages, Relaxed);
        self.message_bytes.fetch_add(bytes, Relaxed);
        metrics::counter!(metric_names::MESSAGES_TOTAL).increment(messages);
        metrics::counter!(metric_names::MESSAGE_BYTES_TOTAL).increment(bytes);
    }

    /// Lag of one applied event, from its commit and from its publish (Unix ms).
    pub(crate) fn lag(&self, applied_ms: u64, commit_ms: u64, publish_ms: u64) {
        self.lag_many(applied_ms, commit_ms, publish_ms, 1);
    }

    /// [`Counters::lag`] for `count` changes with the same commit and publish times. A commit
    /// time of 0 (unknown) counts in neither the commit lag nor the consistency shares.
    pub(crate) fn lag_many(&self, applied_ms: u64, commit_ms: u64, publish_ms: u64, count: usize) {
        metrics::histogram!(metric_names::INVALIDATION_LAG_MS, "from" => "publish")
            .record_many(applied_ms.saturating_sub(publish_ms) as f64, count);
        if commit_ms == 0 {
            return;
        }
        let lag = applied_ms.saturating_sub(commit_ms);
        metrics::histogram!(metric_names::INVALIDATION_LAG_MS, "from" => "commit").record_many(lag as f64, count);
        let n = count as u64;
        self.timed_invalidations.fetch_add(n, Relaxed);
        self.consistency_metrics.timed.increment(n);
        for (i, t) in CONSISTENCY_THRESHOLDS_MS.iter().enumerate() {
            if lag <= *t {
                self.applied_within[i].fetch_add(n, Relaxed);
                self.consistency_metrics.within[i].increment(n);
            }
        }
    }

    /// The fail safe's lag: time since the newest watermark observation the listener reached.
    pub(crate) fn stream_lag(&self, lag: std::time::Duration) {
        metrics::gauge!(metric_names::STREAM_LAG_MS).set(lag.as_secs_f64() * 1e3);
    }

    /// The source lag: worst progress `lag_ms` + time since it was received.
    pub(crate) fn source_lag(&self, lag: std::time::Duration) {
        metrics::gauge!(metric_names::SOURCE_LAG_MS).set(lag.as_secs_f64() * 1e3);
    }

    pub(crate) fn serving_local(&self, on: bool) {
        metrics::gauge!(metric_names::SERVING_LOCAL).set(if on { 1.0 } else { 0.0 });
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            bypass_reads: self.bypass_reads.load(Relaxed),
            fills: self.fills.load(Relaxed),
            redis_reads: self.redis_reads.load(Relaxed),
            missing: self.missing.load(Relaxed),
            negative_hits: self.negative_hits.load(Relaxed),
            fills_refused: self.fills_refused.load(Relaxed),
            events: self.events.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            bad_messages: self.bad_messages.load(Relaxed),
            coalesced: self.coalesced.load(Relaxed),
            limiter_rejections: self.limiter_rejections.load(Relaxed),
            stale_served: self.stale_served.load(Relaxed),
            uncached_reads: self.uncached_reads.load(Relaxed),
            tombstones: self.tombstones.load(Relaxed),
            loader_fills: self.loader_fills.load(Relaxed),
            loader_errors: self.loader_errors.load(Relaxed),
            refreshes: self.refreshes.load(Relaxed),
            capacity_evictions: self.capacity_evictions.load(Relaxed),
            expirations: self.expirations.load(Relaxed),
            fail_safe_engaged: self.fail_safe_engaged.load(Relaxed),
            listener_rebuilds: self.listener_rebuilds.load(Relaxed),
            stream_gaps: self.stream_gaps.load(Relaxed),
            progress_messages: self.progress_messages.load(Relaxed),
            source_behind_refused: self.source_behind_refused.load(Relaxed),
            source_behind_flagged: self.source_behind_flagged.load(Relaxed),
            source_behind_loaded: self.source_behind_loaded.load(Relaxed),
            replica_read_timeouts: self.replica_read_timeouts.load(Relaxed),
            messages: self.messages.load(Relaxed),
            message_bytes: self.message_bytes.load(Relaxed),
            replica_zero_fallbacks: self.replica_zero_fallbacks.load(Relaxed),
            learned_counts: 0,
            heat_reports_sent: self.heat_reports_sent.load(Relaxed),
            heat_reports_failed: self.heat_reports_failed.load(Relaxed),
            hot_set_load_failures: self.hot_set_load_failures.load(Relaxed),
            timed_invalidations: self.timed_invalidations.load(Relaxed),
            applied_within_50ms: self.applied_within[0].load(Relaxed),
            applied_within_200ms: self.applied_within[1].load(Relaxed),
            applied_within_1000ms: self.applied_within[2].load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_shares_count_by_threshold() {
        let c = Counters::default();
        c.lag(10_040, 10_000, 10_010); // 40 ms
        c.lag_many(10_300, 10_000, 10_010, 3); // 300 ms
        c.lag(12_000, 10_000, 10_010); // 2 s
        c.lag(12_000, 0, 10_010); // no commit time: not timed
        let s = c.snapshot();
        assert_eq!(s.timed_invalidations, 5);
        assert_eq!((s.applied_within_50ms, s.applied_within_200ms, s.applied_within_1000ms), (1, 1, 4));
        assert!((s.nines(1000).unwrap() - (-(0.2f64).log10())).abs() < 1e-9);
        let all = Stats { timed_invalidations: 100, applied_within_50ms: 100, ..Stats::default() };
        assert_eq!(all.nines(50), Some(2.0), "capped at log10(count)");
    }
}
