//! Options of the miss rate limits and their stale fallback (the `Limiter` and the stale
//! copies in `state.rs`).

use std::time::Duration;

use super::ConsumerBuilder;

/// # Miss rate limits and the stale fallback
///
/// Optional GCRA limits on fills, per instance ([`ConsumerBuilder::max_fills_per_sec`]) and
/// per key ([`ConsumerBuilder::max_fills_per_key_per_sec`]); a fill over the limit is answered
/// with the key's stale copy, kept [`ConsumerBuilder::stale_ttl`] after its entry left the
/// cache, or [`ConsumerError::Overloaded`](crate::ConsumerError::Overloaded). See "Miss rate
/// limit and stale fallback" in the crate docs.
impl ConsumerBuilder {
    /// Miss rate limit of the whole instance: at most `fills` Redis fills per second (burst of the
    /// same size; GCRA from the `governor` crate). A fill over the limit is not read: `get` returns
    /// the key's stale copy if one is held ([`crate::Stats::stale_served`]), else
    /// [`ConsumerError::Overloaded`](crate::ConsumerError::Overloaded). Default 0 = no limit.
    /// Concurrent misses of one key share one fill, so they count once.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_fills_per_sec(5_000);
    /// ```
    pub fn max_fills_per_sec(mut self, fills: u32) -> Self {
        self.max_fills_per_sec = fills;
        self
    }

    /// Miss rate limit of one key: at most `fills` Redis fills per second for each logical key
    /// (burst of the same size), checked before [`ConsumerBuilder::max_fills_per_sec`]. Over the
    /// limit: stale copy, else [`ConsumerError::Overloaded`](crate::ConsumerError::Overloaded).
    /// Default 0 = no limit. The per-key limiter states are bounded by
    /// [`ConsumerBuilder::max_entries`] and dropped after 1 s unused.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_fills_per_key_per_sec(10);
    /// ```
    pub fn max_fills_per_key_per_sec(mut self, fills: u32) -> Self {
        self.max_fills_per_key_per_sec = fills;
        self
    }

    /// How long the stale copy of an entry is kept after the entry left the local cache (by
    /// an invalidation event, by its TTL, or by a fail-safe clear), for the fallback of the
    /// miss rate limit. Default 10 s. Stale copies are kept only when a miss rate limit is set.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.stale_ttl(Duration::from_secs(30));
    /// ```
    pub fn stale_ttl(mut self, ttl: Duration) -> Self {
        self.stale_ttl = ttl;
        self
    }

    /// Bound of the stale copies, in entries. Default 10 000.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.stale_max_entries(50_000);
    /// ```
    pub fn stale_max_entries(mut self, entries: u64) -> Self {
        self.stale_max_entries = entries;
        self
    }
}
