//! Options of the read-through fill (`read.rs` at the crate root): how many suffix replicas a
//! reader starts with for a key (the records correct it, `counts.rs`), which keys the local
//! cache holds, and the app-supplied loader of last resort.

use std::future::Future;
use std::time::Duration;

use super::ConsumerBuilder;
use crate::loader::LoaderFn;
use crate::CacheMode;

/// # Read-through: replicas, cache mode and the loader
///
/// What a miss reads: the replica count N a key starts with ([`ConsumerBuilder::replicas`],
/// [`ConsumerBuilder::replicas_for_prefix`]; the records correct it), whether its value may be cached
/// ([`ConsumerBuilder::cache_mode`]), and what is asked when every replica is missing
/// ([`ConsumerBuilder::loader`]). See "Reading through a hot key" and "Typed reads and the
/// loader" in the crate docs.
impl ConsumerBuilder {
    /// The number N of suffix replicas (`K:r0..K:r{N-1}`) a reader **starts with** for a
    /// logical key; the data corrects it. Default 1. Every replica record carries the key's
    /// current count (field `n`, written by binval), so the first read of a key teaches this
    /// instance its real count, and reads spread over that many replicas from the next fill on
    /// ([`crate::Consumer::replica_count`]); keys binval has already spread are known from the
    /// hot set at start ([`ConsumerBuilder::hot_set`]). See "Adaptive replica counts" in the
    /// crate docs.
    ///
    /// So this need not match binval's mapping any more. A larger N than binval writes is
    /// harmless: a read of a replica that does not exist finds it missing and goes on to
    /// replica 0 (which exists whenever the key does), never to "no row", and the record it
    /// finds there corrects the count. A smaller N spreads a key's reads over fewer replicas
    /// only until the first read corrects it. Records written by a binval older than adaptive
    /// counts carry no `n`: for them the configured N stays what is used, so set it to the
    /// mapping's count there.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.replicas(8); // a start for keys not yet read; records say the rest
    /// ```
    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }

    /// The replica count a reader starts with for logical keys starting with `prefix` (the data
    /// corrects it, as for [`ConsumerBuilder::replicas`]); the longest matching prefix wins
    /// over shorter ones and over [`ConsumerBuilder::replicas`]. May be called repeatedly.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.replicas(1).replicas_for_prefix("item:detail:", 8).replicas_for_prefix("item:", 2);
    /// ```
    pub fn replicas_for_prefix(mut self, prefix: impl Into<String>, n: u32) -> Self {
        let prefix = prefix.into();
        self.prefix_replicas.retain(|(p, _)| *p != prefix);
        self.prefix_replicas.push((prefix, n));
        self
    }

    /// Which keys the local cache holds: [`CacheMode::All`](crate::CacheMode::All) (default),
    /// [`CacheMode::Prefixes`](crate::CacheMode::Prefixes) or
    /// [`CacheMode::HotOnly`](crate::CacheMode::HotOnly) (only keys read at or above
    /// [`ConsumerBuilder::hot_key_threshold`]; needs hot-key detection on). Keys not cached are
    /// read through single-flight, the miss rate limits and Redis on every `get`
    /// ([`crate::Stats::uncached_reads`]).
    ///
    /// ```no_run
    /// # use binval_consumer::CacheMode;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.cache_mode(CacheMode::Prefixes(vec!["item:detail:".into(), "shop:".into()]));
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.cache_mode(CacheMode::HotOnly).hot_key_threshold(500.0);
    /// ```
    pub fn cache_mode(mut self, mode: CacheMode) -> Self {
        self.cache_mode = mode;
        self
    }

    /// The last resort of a fill: when every suffix replica the fill read is **missing** (not
    /// a tombstone; at most [`ConsumerBuilder::max_replica_reads`] reads), call `loader(key)` —
    /// e.g. a query of the database — and use its answer: `Ok(Some(payload))` is returned (and
    /// cached, see below), `Ok(None)` means no row (cached like a missing key, for
    /// [`ConsumerBuilder::missing_ttl`]), `Err(e)` is
    /// [`ConsumerError::Loader`](crate::ConsumerError::Loader) with `e`'s text (nothing
    /// cached). Bounded by [`ConsumerBuilder::loader_timeout`]; runs inside the key's single
    /// fill, after the miss rate limit admitted it, so a hot key never stampedes the loader
    /// either, and a cached `None` keeps a hot missing key away from it.
    ///
    /// **Version of a loaded value.** It is cached at the newest position the missing replicas
    /// carried — an invalidate-mode record (`mode = "invalidate"` in binval's mapping) holds
    /// the position of the last change and no payload — or at 0 when the keys do not exist at
    /// all. The loader runs after those reads, so if it reads the source of truth (the
    /// primary, or anything at least as fresh as binval's source), its value is at least as new
    /// as that position: the next change has a higher version and its event evicts the entry
    /// (at 0 any event does), and a fill that raced an event is refused by the fill-race guard
    /// like any other. A loader that reads a lagging copy (a read replica of the database)
    /// could cache an older value under a newer position: then turn caching off with
    /// [`ConsumerBuilder::cache_loaded`]`(false)`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.loader(|key: String| async move {
    ///     // e.g. SELECT ... WHERE id = <id from key>, rendered as binval's payload JSON
    ///     let id: u64 = key.rsplit(':').next().and_then(|s| s.parse().ok()).ok_or("bad key")?;
    ///     Ok::<_, &str>(Some(format!(r#"{{"id":{id}}}"#)))
    /// });
    /// ```
    pub fn loader<F, Fut, E>(mut self, loader: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Option<String>, E>> + Send + 'static,
        E: std::fmt::Display,
    {
        self.loader = Some(LoaderFn::new(loader));
        self
    }

    /// Bound of one loader call. Default 1 s. Exceeded:
    /// [`ConsumerError::Timeout`](crate::ConsumerError::Timeout).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.loader_timeout(Duration::from_millis(300));
    /// ```
    pub fn loader_timeout(mut self, timeout: Duration) -> Self {
        self.loader_timeout = timeout;
        self
    }

    /// Whether the loader's answers are cached locally (under the fill-race rules, see
    /// [`ConsumerBuilder::loader`]): its values with the TTL, its `None` for
    /// [`ConsumerBuilder::missing_ttl`]. Default `true`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.cache_loaded(false); // the loader reads a lagging database replica
    /// ```
    pub fn cache_loaded(mut self, cache: bool) -> Self {
        self.cache_loaded = cache;
        self
    }

    /// How many suffix replicas one fill reads at most before it concludes that no replica
    /// holds the key (then the loader, else `None`). Default **2**: the first replica, then
    /// one on another master (or, on standalone Redis or when every replica is on one master,
    /// another replica). At least 1; more than N reads every replica once.
    ///
    /// **Replica 0 first after a missing replica.** A replica that does not exist at all (no
    /// record: never written, removed when binval shrank the key's count, not yet copied when
    /// it grew it) sends the next read to replica 0, which exists whenever the key does; no
    /// fill concludes "missing" without having read replica 0 (when it answers). That read
    /// takes the place of the second one; when the bound is used up already (a bound of 1, or
    /// a first read that failed), it is one read past the bound, and when replica 0 sat on the
    /// master of the first read, one more read goes to another master (the second master this
    /// bound promises). So a fill reads at most this bound plus one
    /// ([`crate::Stats::replica_zero_fallbacks`] counts the replica-0 reads).
    ///
    /// Why 2: a key whose row does not exist (never written, or its tombstone expired) is
    /// missing from every replica, and a hot one (a deleted product still linked from a feed, a
    /// crawler probing ids) must cost a bounded number of reads, not N. One read is not enough
    /// to conclude it on a Cluster: a master that lost its data (restarted without
    /// persistence, failed over to a replica node that lagged) misses its replicas until
    /// `binval replay` restores them, and its share of fills would answer "no row" for rows
    /// that exist. The second read on another master only misses as well when two masters
    /// lost the key. Once a fill has concluded "missing" that way, the key's next fills (while
    /// no event of the key arrives, for [`ConsumerBuilder::fill_guard_ttl`]) read one replica:
    /// a hot missing key costs **one read per fill** (per [`ConsumerBuilder::missing_ttl`] per
    /// instance), and only the first fill of a newly missing key pays the second read (that
    /// first fill read replica 0, see below, so the one read of the next ones needs no
    /// fallback: an event of the key, which binval publishes after writing it, ends the
    /// shortcut).
    /// `max_replica_reads(1)` makes every miss one read, for deployments whose Redis keeps its
    /// data (AOF) or that set a loader.
    ///
    /// A read whose master does not answer in time (or cannot be reached) also moves on to
    /// another master within this bound; it is never repeated on the same master.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.max_replica_reads(1); // one read per miss: Redis with AOF, or a loader set
    /// ```
    pub fn max_replica_reads(mut self, reads: u32) -> Self {
        self.max_replica_reads = reads;
        self
    }

    /// How long a key that no read replica holds is cached as "no row" (and a loader's
    /// `None`). Default **1 s**; `Duration::ZERO` caches nothing. Must not exceed
    /// [`ConsumerBuilder::ttl`].
    ///
    /// The entry is cached at position 0 (or at an invalidate-mode record's position), so the
    /// next invalidation event of the key evicts it like any entry, and the fill-race guard
    /// refuses it when an event overtook the fill. The short bound is for what no event
    /// announces: a replica restored by an operator, a Redis that got its data back. A
    /// tombstone is not affected: it is cached at its own position with the normal TTL, as a
    /// value is (the delete is a change like any other, and the next one evicts it).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.missing_ttl(Duration::from_millis(500));
    /// ```
    pub fn missing_ttl(mut self, ttl: Duration) -> Self {
        self.missing_ttl = ttl;
        self
    }
}
