//! Counters: kept as atomics for [`crate::Consumer::stats`] and mirrored to the `metrics`
//! facade so any installed recorder (Prometheus exporter, …) sees them too.
//!
//! Metric names (all counters end in `_total`):
//!
//! | counter | meaning |
//! |---|---|
//! | `binval_consumer_hits_total` | `get` served from the local cache |
//! | `binval_consumer_misses_total` | `get` not in the local cache while serving locally |
//! | `binval_consumer_bypass_reads_total` | `get` while the fail-safe bypasses the local cache |
//! | `binval_consumer_fills_total` | Redis reads that found a value (cached or not) |
//! | `binval_consumer_fills_refused_total` | fills not cached by the fill-race guard |
//! | `binval_consumer_events_total` | invalidation events applied |
//! | `binval_consumer_evictions_total` | events that removed a held entry |
//! | `binval_consumer_bad_messages_total` | topic messages skipped because they do not parse |
//! | `binval_consumer_coalesced_total` | `get` misses that joined a fill already in flight |
//! | `binval_consumer_limiter_rejections_total` | fills refused by the miss rate limit |
//! | `binval_consumer_stale_served_total` | `get` calls answered with a stale copy |
//!
//! Histogram `binval_consumer_invalidation_lag_ms`: event `publish_time_ms` to the moment the
//! listener applied it, milliseconds. Gauge `binval_consumer_serving_local`: 1 while `get`
//! may serve from the local cache, 0 while the fail-safe bypasses it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the consumer's counters, all counted since `build()`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `get` calls answered from the local cache.
    pub hits: u64,
    /// `get` calls that did not find the key in the local cache (while serving locally).
    pub misses: u64,
    /// `get` calls made while the fail-safe bypassed the local cache (read Redis, cache nothing).
    pub bypass_reads: u64,
    /// Redis read-throughs that found a value, whether it was then cached or not.
    pub fills: u64,
    /// Fills that the fill-race guard refused to cache (returned to the caller only).
    pub fills_refused: u64,
    /// Invalidation events the listener applied.
    pub events: u64,
    /// Events that removed an entry the local cache held.
    pub evictions: u64,
    /// Topic messages skipped because they are not a valid invalidation event.
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
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub bypass_reads: AtomicU64,
    pub fills: AtomicU64,
    pub fills_refused: AtomicU64,
    pub events: AtomicU64,
    pub evictions: AtomicU64,
    pub bad_messages: AtomicU64,
    pub coalesced: AtomicU64,
    pub limiter_rejections: AtomicU64,
    pub stale_served: AtomicU64,
}

macro_rules! bump {
    ($fn:ident, $field:ident, $name:literal) => {
        #[inline]
        pub(crate) fn $fn(&self) {
            self.$field.fetch_add(1, Relaxed);
            metrics::counter!($name).increment(1);
        }
    };
}

impl Counters {
    bump!(hit, hits, "binval_consumer_hits_total");
    bump!(miss, misses, "binval_consumer_misses_total");
    bump!(bypass_read, bypass_reads, "binval_consumer_bypass_reads_total");
    bump!(fill, fills, "binval_consumer_fills_total");
    bump!(fill_refused, fills_refused, "binval_consumer_fills_refused_total");
    bump!(event, events, "binval_consumer_events_total");
    bump!(eviction, evictions, "binval_consumer_evictions_total");
    bump!(bad_message, bad_messages, "binval_consumer_bad_messages_total");
    bump!(coalesced, coalesced, "binval_consumer_coalesced_total");
    bump!(limiter_rejection, limiter_rejections, "binval_consumer_limiter_rejections_total");
    bump!(stale_served, stale_served, "binval_consumer_stale_served_total");

    pub(crate) fn lag(&self, lag_ms: u64) {
        metrics::histogram!("binval_consumer_invalidation_lag_ms").record(lag_ms as f64);
    }

    pub(crate) fn serving_local(&self, on: bool) {
        metrics::gauge!("binval_consumer_serving_local").set(if on { 1.0 } else { 0.0 });
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            bypass_reads: self.bypass_reads.load(Relaxed),
            fills: self.fills.load(Relaxed),
            fills_refused: self.fills_refused.load(Relaxed),
            events: self.events.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            bad_messages: self.bad_messages.load(Relaxed),
            coalesced: self.coalesced.load(Relaxed),
            limiter_rejections: self.limiter_rejections.load(Relaxed),
            stale_served: self.stale_served.load(Relaxed),
        }
    }
}
