//! Options of the invalidation listener (`listener.rs`) and what it shares with the read path
//! (`state.rs`): the fill-race guard, the lag bound of the fail safe, the metadata refresh and
//! the eviction notices.

use std::time::Duration;

use super::ConsumerBuilder;

/// # Invalidation, the fill-race guard and the fail safe
///
/// How long and for how many keys the fill-race guard remembers event versions
/// ([`ConsumerBuilder::fill_guard_entries`], [`ConsumerBuilder::fill_guard_ttl`]), the lag
/// bound after which the local cache is bypassed ([`ConsumerBuilder::max_staleness`]), what
/// a read does while binval's side is behind ([`ConsumerBuilder::on_source_behind`],
/// [`ConsumerBuilder::require_progress`]), how
/// often new partitions are looked for ([`ConsumerBuilder::metadata_refresh`]) and the
/// capacity of [`Consumer::subscribe_evictions`](crate::Consumer::subscribe_evictions). See
/// "Invalidation and the fail safe" in the crate docs.
impl ConsumerBuilder {
    /// Bound of the fill-race guard (newest event version per recently invalidated key), in
    /// entries. Default 100 000. Size it for the number of distinct keys invalidated within
    /// [`ConsumerBuilder::fill_guard_ttl`].
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.fill_guard_entries(500_000);
    /// ```
    pub fn fill_guard_entries(mut self, entries: u64) -> Self {
        self.fill_guard_entries = entries;
        self
    }

    /// How long the fill-race guard remembers a key's newest event version. Default 30 s; must
    /// exceed the longest fill: [`ConsumerBuilder::redis_response_timeout`] × (1 + the largest
    /// replica count), plus [`ConsumerBuilder::loader_timeout`] when a loader is set
    /// (`build()` checks it).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.fill_guard_ttl(Duration::from_secs(10));
    /// ```
    pub fn fill_guard_ttl(mut self, ttl: Duration) -> Self {
        self.fill_guard_ttl = ttl;
        self
    }

    /// The lag bound of the fail safe (invariant I5). Default 2 s; at least 100 ms.
    ///
    /// A checker thread observes the broker's high watermarks every quarter of the bound; an
    /// observation taken at `t` is *confirmed* once the listener has read every partition up
    /// to it (every event the broker acknowledged before `t` is then applied). The lag
    /// ([`Consumer::stream_lag`](crate::Consumer::stream_lag)) is the time since the newest
    /// confirmed `t`. While it is within the bound the local cache is served; past it (the
    /// broker hangs, the network drops packets without resetting connections, the listener
    /// falls behind) `get` bypasses the local cache until the lag is back under half the bound,
    /// then the cache is cleared and served again. A busy but healthy stream stays at about a
    /// quarter of the bound plus one fetch, so it never trips the bound; set the bound well
    /// above your broker's fetch latency (with tansu: `fetch.wait.max.ms`, see the crate
    /// README). `None` turns the bound off: only errors (every broker down, a fatal error)
    /// stop local serving, and it resumes at the first confirmed observation after them.
    ///
    /// What it bounds: a value served locally at time `now` has seen every event the broker
    /// acknowledged before `now - bound`. The same bound applies to the source lag
    /// ([`Consumer::source_lag`](crate::Consumer::source_lag), from binval's progress
    /// messages): how far binval's Redis writes and events are behind the source; past it the
    /// local cache is bypassed too, and Redis reads follow
    /// [`ConsumerBuilder::on_source_behind`]. binval measures its lag by binlog commit times,
    /// which are whole seconds: under a steady stream of commits its reports range up to about
    /// one second for a binval that keeps up (1.2 s worst seen at 140 commits/s,
    /// `tests/progress.rs`), plus up to one progress interval (200 ms) since the last report.
    /// Keep the bound at 2 s or more where binval sends progress; a bound under ~1.5 s trips
    /// on a busy, healthy source.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_staleness(Some(Duration::from_millis(500)));
    /// ```
    pub fn max_staleness(mut self, bound: Option<Duration>) -> Self {
        self.max_staleness = bound;
        self
    }

    /// What a read does when binval's progress messages say the source side is behind
    /// [`ConsumerBuilder::max_staleness`] for every replica of the key: see
    /// [`OnSourceBehind`](crate::OnSourceBehind). Default
    /// [`OnSourceBehind::LoadOrRefuse`](crate::OnSourceBehind::LoadOrRefuse): the
    /// [`ConsumerBuilder::loader`] instead of Redis when one is set, else
    /// [`ConsumerError::SourceBehind`](crate::ConsumerError::SourceBehind) — never a value that
    /// may be older than the bound as if it were fresh.
    ///
    /// When it applies: binval (a version that sends progress messages,
    /// `kafka.progress_interval_ms`) reports its own lag to every partition; this instance's
    /// source lag ([`Consumer::source_lag`](crate::Consumer::source_lag)) is the worst
    /// partition's last report plus the time since it was received. It passes the bound when
    /// binval's Redis writes stall (a frozen master: binval waits for it) or when the reports
    /// stop arriving (binval frozen or cut off, the broker gone). While it is past the bound the
    /// local cache is bypassed as well. With per-slot lags in the reports (`masters`), a key
    /// with a replica on a master within the bound is read there, as fresh.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// use binval_consumer::OnSourceBehind;
    /// let b = b.on_source_behind(OnSourceBehind::ServeStale); // then check Consumer::get_flagged
    /// ```
    pub fn on_source_behind(mut self, what: crate::OnSourceBehind) -> Self {
        self.on_source_behind = what;
        self
    }

    /// Count the source lag from `build()` on, before any progress message arrives. Default
    /// `false`: the source lag counts only once a progress message has been seen, so an
    /// instance reading a topic of a binval that sends none (an older version, or
    /// `kafka.progress_interval_ms = 0`) keeps the stream lag alone. Set it once every binval
    /// writing to the topic sends progress: then an instance that starts while binval is
    /// frozen or cut off does not serve as fresh what it cannot confirm, and a binval
    /// downgraded by mistake shows at once (every read follows
    /// [`ConsumerBuilder::on_source_behind`] after the bound).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.require_progress(true);
    /// ```
    pub fn require_progress(mut self, required: bool) -> Self {
        self.require_progress = required;
        self
    }

    /// How often the lag checker re-reads the topic's metadata to pick up added partitions
    /// (assigned from their low watermark). Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.metadata_refresh(Duration::from_secs(30));
    /// ```
    pub fn metadata_refresh(mut self, every: Duration) -> Self {
        self.metadata_refresh = every;
        self
    }

    /// Capacity of the [`Consumer::subscribe_evictions`](crate::Consumer::subscribe_evictions)
    /// channel, in notices. Default 4096; a receiver that falls further behind gets
    /// `RecvError::Lagged`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.eviction_channel_capacity(65_536);
    /// ```
    pub fn eviction_channel_capacity(mut self, notices: usize) -> Self {
        self.eviction_channel_capacity = notices;
        self
    }
}
