//! The consumer's metric names, each declared once here and used by name everywhere else; the
//! crate docs' metrics table ("Metrics") names exactly these, which a test checks. Each constant
//! says the metric's kind, labels and what it counts. The metrics go to the `metrics` crate's
//! recorder installed before [`crate::ConsumerBuilder::build`] (e.g.
//! `metrics-exporter-prometheus`); with [`crate::HISTOGRAM_BUCKETS`] the histogram gets buckets.
//!
//! ```
//! assert_eq!(binval_consumer::metric_names::HITS_TOTAL, "binval_consumer_hits_total");
//! ```

/// Counter: `get` served from the local cache.
pub const HITS_TOTAL: &str = "binval_consumer_hits_total";

/// Counter: `get` of a cacheable key not in the local cache.
pub const MISSES_TOTAL: &str = "binval_consumer_misses_total";

/// Counter: `get` of a key the cache mode does not cache.
pub const UNCACHED_READS_TOTAL: &str = "binval_consumer_uncached_reads_total";

/// Counter: `get` while the fail-safe bypasses the cache.
pub const BYPASS_READS_TOTAL: &str = "binval_consumer_bypass_reads_total";

/// Counter: fills that found a replica value (cached or not).
pub const FILLS_TOTAL: &str = "binval_consumer_fills_total";

/// Counter: fills whose replica reads all found the key missing (then the loader, if set).
pub const MISSING_TOTAL: &str = "binval_consumer_missing_total";

/// Counter: `get` answered "no row" from the local cache (a cached tombstone or missing key; also in hits).
pub const NEGATIVE_HITS_TOTAL: &str = "binval_consumer_negative_hits_total";

/// Counter: fills the fill-race guard did not cache.
pub const FILLS_REFUSED_TOTAL: &str = "binval_consumer_fills_refused_total";

/// Counter: misses that joined a fill in flight.
pub const COALESCED_TOTAL: &str = "binval_consumer_coalesced_total";

/// Counter: fills refused by the miss rate limit.
pub const LIMITER_REJECTIONS_TOTAL: &str = "binval_consumer_limiter_rejections_total";

/// Counter: `get` answered with a stale copy.
pub const STALE_SERVED_TOTAL: &str = "binval_consumer_stale_served_total";

/// Counter: fills that found a tombstone.
pub const TOMBSTONES_TOTAL: &str = "binval_consumer_tombstones_total";

/// Counter: fills answered by the loader.
pub const LOADER_FILLS_TOTAL: &str = "binval_consumer_loader_fills_total";

/// Counter: loader calls that failed or timed out.
pub const LOADER_ERRORS_TOTAL: &str = "binval_consumer_loader_errors_total";

/// Counter: refresh-ahead fills started.
pub const REFRESHES_TOTAL: &str = "binval_consumer_refreshes_total";

/// Counter: invalidation events applied.
pub const EVENTS_TOTAL: &str = "binval_consumer_events_total";

/// Counter: events that removed a held entry.
pub const EVICTIONS_TOTAL: &str = "binval_consumer_evictions_total";

/// Counter: entries removed by the entry/byte bound.
pub const CAPACITY_EVICTIONS_TOTAL: &str = "binval_consumer_capacity_evictions_total";

/// Counter: entries removed by their TTL.
pub const EXPIRATIONS_TOTAL: &str = "binval_consumer_expirations_total";

/// Counter: topic messages skipped: no payload, longer than `max_message_bytes`, not an event, a `binval.kind: progress` message that is not a valid progress message, an unknown `binval.kind`.
pub const BAD_MESSAGES_TOTAL: &str = "binval_consumer_bad_messages_total";

/// Histogram: ms from the event's commit (`from="commit"`: binval's commit time, to the ms when it keeps up, see [`crate::Stats::nines`]) or publish (`from="publish"`) to its eviction here. Labels: `from`.
pub const INVALIDATION_LAG_MS: &str = "binval_consumer_invalidation_lag_ms";

/// Counter: invalidations applied whose event carried a commit time ([`crate::Stats::timed_invalidations`]).
pub const TIMED_INVALIDATIONS_TOTAL: &str = "binval_consumer_timed_invalidations_total";

/// Counter: of those, applied within 50, 200 or 1000 ms of the commit; the consistency as nines is `-log10(1 - rate(within) / rate(timed))` ([`crate::Stats::nines`]). Labels: `within_ms`.
pub const APPLIED_WITHIN_TOTAL: &str = "binval_consumer_applied_within_total";

/// Counter: times the fail safe stopped local serving (stream lost or lagging, or the source lag past the bound).
pub const FAIL_SAFE_ENGAGED_TOTAL: &str = "binval_consumer_fail_safe_engaged_total";

/// Counter: librdkafka consumers replaced (connections presumed wedged).
pub const LISTENER_REBUILDS_TOTAL: &str = "binval_consumer_listener_rebuilds_total";

/// Counter: jumps in a partition's offsets (each cleared the local cache).
pub const STREAM_GAPS_TOTAL: &str = "binval_consumer_stream_gaps_total";

/// Gauge: 1 while serving locally, 0 while bypassed.
pub const SERVING_LOCAL: &str = "binval_consumer_serving_local";

/// Gauge: the fail safe's lag: ms since the newest confirmed watermark observation.
pub const STREAM_LAG_MS: &str = "binval_consumer_stream_lag_ms";

/// Gauge: the source lag: worst progress `lag_ms` + ms since it was received (set once progress counts).
pub const SOURCE_LAG_MS: &str = "binval_consumer_source_lag_ms";

/// Counter: binval progress messages taken (invalid ones count as bad messages).
pub const PROGRESS_MESSAGES_TOTAL: &str = "binval_consumer_progress_messages_total";

/// Counter: `get` calls decided by the source lag: `refused` ([`crate::ConsumerError::SourceBehind`]), `flagged` (Redis value, [`crate::Stale::SourceBehind`]), `loaded` (the loader instead of Redis). Labels: `outcome`.
pub const SOURCE_BEHIND_READS_TOTAL: &str = "binval_consumer_source_behind_reads_total";

/// Counter: topic messages the listener received, of any kind (one per per-key event, one per batch, progress and bad ones too).
pub const MESSAGES_TOTAL: &str = "binval_consumer_messages_total";

/// Counter: payload bytes of those messages (after decompression; no keys, headers or framing).
pub const MESSAGE_BYTES_TOTAL: &str = "binval_consumer_message_bytes_total";

/// Counter: replica reads that did not answer within `replica_read_timeout` (the fill then read another master's replica too, when one was left).
pub const REPLICA_READ_TIMEOUTS_TOTAL: &str = "binval_consumer_replica_read_timeouts_total";

/// Counter: reads of replica 0 made because a replica read before it had no record (the replica-0 rule, "Adaptive replica counts").
pub const REPLICA_ZERO_FALLBACKS_TOTAL: &str = "binval_consumer_replica_zero_fallbacks_total";

/// Gauge: keys whose learned replica count differs from the configured one (set every heat report interval and on [`crate::Consumer::stats`]).
pub const LEARNED_COUNTS: &str = "binval_consumer_learned_counts";

/// Counter: heat reports written (`sent`) or not (`failed`: `NOPERM`, timeout, connection; the removal at shutdown too). Labels: `outcome`.
pub const HEAT_REPORTS_TOTAL: &str = "binval_consumer_heat_reports_total";

/// Counter: loads of `binval:hot` (at start, at each refresh) that failed.
pub const HOT_SET_LOAD_FAILURES_TOTAL: &str = "binval_consumer_hot_set_load_failures_total";

/// Gauge: keys of the top K at or above the threshold.
pub const HOT_KEYS: &str = "binval_consumer_hot_keys";

/// Gauge: estimated read rate of each top-K key (0 once it left the top). Labels: `key`.
pub const HOT_KEY_READS_PER_SEC: &str = "binval_consumer_hot_key_reads_per_sec";

/// Gauge: estimated read rate of the key at rank 1..K of the top K (0 for an empty rank): K series whatever the churn. Labels: `rank`.
pub const HOT_KEY_RANK_READS_PER_SEC: &str = "binval_consumer_hot_key_rank_reads_per_sec";

/// Gauge: messages between the listener's position and the partition's high watermark, at each watermark observation of the fail safe (every quarter of `max_staleness`). Labels: `partition`.
pub const PARTITION_LAG_MESSAGES: &str = "binval_consumer_partition_lag_messages";

/// Counter: Redis reads of fills per master (`host:port`; Cluster: by the slot map, see below) and `command` (`replica`: `HMGET K:rN d t p n` served by the master; `replica_node`: served by one of its replica nodes). Labels: `master, command`.
pub const REDIS_READS_TOTAL: &str = "binval_consumer_redis_reads_total";

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// The metrics table of the crate docs (`lib.rs`) against the constants of this file.
    #[test]
    fn the_crate_docs_table_names_exactly_these_metrics() {
        let declared: BTreeSet<&str> =
            include_str!("metric_names.rs").lines().filter(|l| l.starts_with("pub const ")).filter_map(|l| l.split('"').nth(1)).collect();
        let documented: BTreeSet<&str> = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `"))
            .filter_map(|rest| rest.split(['`', '{']).next())
            .filter(|n| n.starts_with("binval_consumer_"))
            .collect();
        assert!(declared.len() >= 40, "{declared:?}");
        assert_eq!(declared, documented, "metric_names.rs against the crate docs' metrics table");
    }
}
