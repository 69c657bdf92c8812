//! Options of the read-through fill (`read.rs` at the crate root): how many suffix replicas a
//! key has, which keys the local cache holds, and the app-supplied loader of last resort.

use std::future::Future;
use std::time::Duration;

use super::ConsumerBuilder;
use crate::loader::LoaderFn;
use crate::CacheMode;

/// # Read-through: replicas, cache mode and the loader
///
/// What a miss reads: the replica count N of a key ([`ConsumerBuilder::replicas`],
/// [`ConsumerBuilder::replicas_for_prefix`]), whether its value may be cached
/// ([`ConsumerBuilder::cache_mode`]), and what is asked when every replica is missing
/// ([`ConsumerBuilder::loader`]). See "Reading through a hot key" and "Typed reads and the
/// loader" in the crate docs.
impl ConsumerBuilder {
    /// Default number N of suffix replicas (`K:r0..K:r{N-1}`) per logical key: set it to the
    /// replica count of binval's mapping rule. Default 1. A larger N than the writer uses only
    /// costs extra reads on a miss (a missing replica is skipped); a smaller one concentrates
    /// reads on fewer replicas.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.replicas(8);
    /// ```
    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }

    /// Replica count for logical keys starting with `prefix`; the longest matching prefix wins
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

    /// The last resort of a fill: when every suffix replica of a key is **missing** (not a
    /// tombstone), call `loader(key)` — e.g. a query of the database — and use its answer:
    /// `Ok(Some(payload))` is returned (and cached, see below), `Ok(None)` means no row,
    /// `Err(e)` is [`ConsumerError::Loader`](crate::ConsumerError::Loader) with `e`'s text. Bounded by
    /// [`ConsumerBuilder::loader_timeout`]; runs inside the key's single fill, after the miss
    /// rate limit admitted it, so a hot key never stampedes the loader either.
    ///
    /// **Version of a loaded value.** It is cached under the version token read *before* the
    /// replicas (as a replica value is). The loader runs after that read, so if it reads the
    /// source of truth (the primary, or anything at least as fresh as binval's source), its
    /// value is at least as new as that version: the pair is correct or "newer value, older
    /// version", which the next event evicts, and a fill that raced an event is refused by the
    /// fill-race guard like any other. A loader that reads a lagging copy (a read replica of
    /// the database) could cache an older value under a newer version: then turn caching off
    /// with [`ConsumerBuilder::cache_loaded`]`(false)`.
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

    /// Whether values from the loader are cached locally (under the fill-race rules, see
    /// [`ConsumerBuilder::loader`]). Default `true`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.cache_loaded(false); // the loader reads a lagging database replica
    /// ```
    pub fn cache_loaded(mut self, cache: bool) -> Self {
        self.cache_loaded = cache;
        self
    }
}
