//! Options of the local cache itself (moka, in `state.rs`, and the per-thread front in
//! `front.rs`): its bounds in entries and bytes, and how long an entry lives.

use std::time::Duration;

use super::ConsumerBuilder;

/// # Bounds and lifetimes of the local cache
///
/// How much the local cache holds ([`ConsumerBuilder::max_entries`],
/// [`ConsumerBuilder::max_bytes`]) and how long an entry lives ([`ConsumerBuilder::ttl`],
/// [`ConsumerBuilder::ttl_jitter`], [`ConsumerBuilder::refresh_ahead`]); the per-thread front
/// in front of it ([`ConsumerBuilder::thread_front`]). See "Bounds" and "Reading through a hot
/// key" in the crate docs.
impl ConsumerBuilder {
    /// Bound of the local cache, in entries. Default 100 000.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_entries(10_000);
    /// ```
    pub fn max_entries(mut self, entries: u64) -> Self {
        self.max_entries = entries;
        self
    }

    /// Bound of the local cache in estimated bytes, in addition to [`ConsumerBuilder::max_entries`].
    /// Default: none (bounded by entries only).
    ///
    /// An entry weighs its key length + payload length + [`crate::ENTRY_OVERHEAD_BYTES`]
    /// (an estimate of the entry, `Arc` and moka node overhead), but at least
    /// `max_bytes / max_entries`; the cache keeps the total weight at or below `max_bytes`. The
    /// floor is what makes both bounds hold with moka's single weighted capacity: the total
    /// weight ≤ `max_bytes` implies ≤ `max_entries` entries. (So with many tiny entries the
    /// entry bound is reached first, with large ones the byte bound.) Beyond the bound moka
    /// evicts by its TinyLFU policy ([`crate::Stats::capacity_evictions`]). Must be at least
    /// `max_entries` and at least 1 KiB.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_entries(100_000).max_bytes(64 << 20); // 100k entries, 64 MiB
    /// ```
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Safety-net time to live of a local cache entry, from its fill. Default 60 s.
    /// Invalidation events, not the TTL, are what keeps entries fresh; the TTL bounds the damage
    /// of a missed event.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.ttl(Duration::from_secs(3));
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Spread of the local cache TTL, as a fraction of [`ConsumerBuilder::ttl`]: each entry
    /// lives `ttl × (1 + u)` with `u` drawn uniformly from `[-jitter, +jitter]` at its fill, so
    /// keys filled together do not all expire and refill together. Default 0 (every entry lives
    /// exactly `ttl`); must be in `0.0..1.0`.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.ttl(Duration::from_secs(60)).ttl_jitter(0.1); // 54 s .. 66 s
    /// ```
    pub fn ttl_jitter(mut self, fraction: f64) -> Self {
        self.ttl_jitter = fraction;
        self
    }

    /// Refresh-ahead: when a hit finds its entry past `fraction` of its TTL (e.g. 0.8 = in the
    /// last 20 % of its life), it returns the cached value at once and starts **one** background
    /// fill of the key (single-flight; at most one per entry, however many hits see it), which
    /// replaces the entry with a fresh value and a fresh TTL. A busy key then never expires
    /// into a miss. Default: off. `fraction` must be in `0.0..1.0`.
    ///
    /// Refreshes go through the miss rate limits like any fill (a refused refresh changes
    /// nothing; the entry then expires normally) and are counted in
    /// [`crate::Stats::refreshes`]. Events still evict at once: refresh-ahead only replaces the
    /// TTL as the trigger of a re-read for keys no event touched.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.ttl(Duration::from_secs(3)).refresh_ahead(0.8); // refresh after 2.4 s
    /// ```
    pub fn refresh_ahead(mut self, fraction: f64) -> Self {
        self.refresh_ahead = Some(fraction);
        self
    }

    /// The per-thread front of the local cache on or off. Default on. Each thread that reads
    /// remembers its last entries (64 direct-mapped slots), tagged with a generation that every
    /// applied event batch, guard removal and fail-safe clear moves, so a thread re-reading a
    /// hot key skips moka's read path (about half the cost of a hit) while serving exactly
    /// what the local cache would; see "Local hit cost" in the crate docs. Off: every hit reads
    /// moka (and no thread keeps up to 64 payloads referenced after they left the cache).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.thread_front(false);
    /// ```
    pub fn thread_front(mut self, on: bool) -> Self {
        self.thread_front = on;
        self
    }
}
