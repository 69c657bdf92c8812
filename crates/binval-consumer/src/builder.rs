//! [`ConsumerBuilder`]: every setting of a [`Consumer`], with its default.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::future::Future;

use crate::error::ConsumerError;
use crate::hot::HotSettings;
use crate::listener::{self, ListenerSettings};
use crate::loader::LoaderFn;
use crate::redis_conn::{RedisConn, RedisTarget};
use crate::state::{Bounds, JitteredTtl, LimitSettings, Shared, SharedSettings};
use crate::{CacheMode, Consumer, Inner};

/// Builds a [`Consumer`]. Create it with [`Consumer::builder`]; the Redis target, the brokers
/// and the topic are required, everything else has a default.
///
/// ```no_run
/// # async fn f() -> Result<(), binval_consumer::ConsumerError> {
/// use std::time::Duration;
/// let consumer = binval_consumer::Consumer::builder()
///     .redis_standalone("redis://127.0.0.1:6379")
///     .brokers("127.0.0.1:9092")
///     .topic("binval.invalidations")
///     .replicas(8)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct ConsumerBuilder {
    redis: Option<RedisTarget>,
    brokers: Option<String>,
    topic: Option<String>,
    replicas: u32,
    prefix_replicas: Vec<(String, u32)>,
    max_entries: u64,
    ttl: Duration,
    kafka_properties: Vec<(String, String)>,
    redis_response_timeout: Duration,
    redis_connection_timeout: Duration,
    fill_guard_entries: u64,
    fill_guard_ttl: Duration,
    metadata_refresh: Duration,
    kafka_request_timeout: Duration,
    max_staleness: Option<Duration>,
    shutdown_timeout: Duration,
    eviction_channel_capacity: usize,
    group_id_prefix: String,
    ttl_jitter: f64,
    max_fills_per_sec: u32,
    max_fills_per_key_per_sec: u32,
    stale_ttl: Duration,
    stale_max_entries: u64,
    max_bytes: Option<u64>,
    refresh_ahead: Option<f64>,
    cache_mode: CacheMode,
    loader: Option<LoaderFn>,
    loader_timeout: Duration,
    cache_loaded: bool,
    hot_key_detection: bool,
    hot_key_window: Duration,
    hot_key_threshold: f64,
    hot_key_capacity: usize,
    hot_key_sample_every: u32,
    hot_key_top_k: usize,
    thread_front: bool,
}

impl Default for ConsumerBuilder {
    fn default() -> Self {
        ConsumerBuilder {
            redis: None,
            brokers: None,
            topic: None,
            replicas: 1,
            prefix_replicas: Vec::new(),
            max_entries: 100_000,
            ttl: Duration::from_secs(60),
            kafka_properties: Vec::new(),
            redis_response_timeout: Duration::from_millis(200),
            redis_connection_timeout: Duration::from_secs(1),
            fill_guard_entries: 100_000,
            fill_guard_ttl: Duration::from_secs(30),
            metadata_refresh: Duration::from_secs(5),
            kafka_request_timeout: Duration::from_secs(5),
            max_staleness: Some(Duration::from_secs(2)),
            shutdown_timeout: Duration::from_secs(5),
            eviction_channel_capacity: 4096,
            group_id_prefix: "binval-consumer".into(),
            ttl_jitter: 0.0,
            max_fills_per_sec: 0,
            max_fills_per_key_per_sec: 0,
            stale_ttl: Duration::from_secs(10),
            stale_max_entries: 10_000,
            max_bytes: None,
            refresh_ahead: None,
            cache_mode: CacheMode::All,
            loader: None,
            loader_timeout: Duration::from_secs(1),
            cache_loaded: true,
            hot_key_detection: true,
            hot_key_window: Duration::from_secs(10),
            hot_key_threshold: 1000.0,
            hot_key_capacity: 256,
            hot_key_sample_every: 16,
            hot_key_top_k: 10,
            thread_front: true,
        }
    }
}

impl ConsumerBuilder {
    /// Read replicas and version tokens from one standalone Redis server. Required (or
    /// [`ConsumerBuilder::redis_cluster`]); the last call wins.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_standalone("redis://127.0.0.1:6379");
    /// ```
    pub fn redis_standalone(mut self, url: impl Into<String>) -> Self {
        self.redis = Some(RedisTarget::Standalone(url.into()));
        self
    }

    /// Read replicas and version tokens from a Redis Cluster, given by seed node URLs (one is
    /// enough; the slot map is discovered). Required (or [`ConsumerBuilder::redis_standalone`]).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_cluster(vec!["redis://10.0.0.1:7000".to_string(), "redis://10.0.0.2:7000".to_string()]);
    /// ```
    pub fn redis_cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.redis = Some(RedisTarget::Cluster(urls.into_iter().map(Into::into).collect()));
        self
    }

    /// Kafka bootstrap servers (`host:port[,host:port…]`) of the invalidation topic. Required.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.brokers("kafka-1:9092,kafka-2:9092");
    /// ```
    pub fn brokers(mut self, brokers: impl Into<String>) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    /// The topic binval publishes invalidation events to. Required; it must exist when
    /// `build()` runs.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.topic("binval.invalidations");
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

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

    /// Pass a librdkafka setting to the listener's consumer (applied after this crate's own
    /// settings, so it can override them; do not override `group.id` or enable commits).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_property("fetch.wait.max.ms", "5").kafka_property("security.protocol", "ssl");
    /// ```
    pub fn kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka_properties.push((key.into(), value.into()));
        self
    }

    /// Bound of each Redis read of a fill (version token, one replica). Default 200 ms. A read
    /// that exceeds it fails with [`ConsumerError::Timeout`]; reads are never retried.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_response_timeout(Duration::from_millis(50));
    /// ```
    pub fn redis_response_timeout(mut self, timeout: Duration) -> Self {
        self.redis_response_timeout = timeout;
        self
    }

    /// Bound of one Redis connection attempt. Default 1 s. `build()` fails if it cannot
    /// connect within three times this.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_connection_timeout(Duration::from_millis(500));
    /// ```
    pub fn redis_connection_timeout(mut self, timeout: Duration) -> Self {
        self.redis_connection_timeout = timeout;
        self
    }

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

    /// How often the listener re-reads the topic's metadata to pick up added partitions.
    /// Default 5 s.
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

    /// The lag bound of the fail safe (invariant I5): the listener checks every half of it that
    /// it has read every partition up to the broker's high watermark; when it could not
    /// confirm that for longer than the bound (the broker is silent, the network drops packets
    /// without resetting connections, or the listener fell behind), the consumer stops serving
    /// local values until a check succeeds again (then it clears the cache and resumes).
    /// `None` turns the check off (only broker errors trigger the fail safe). Default 2 s.
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

    /// Bound of each Kafka metadata / watermark request (at `build()` and on refresh).
    /// Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_request_timeout(Duration::from_secs(2));
    /// ```
    pub fn kafka_request_timeout(mut self, timeout: Duration) -> Self {
        self.kafka_request_timeout = timeout;
        self
    }

    /// How long [`Consumer::shutdown`] waits for the listener (and librdkafka's teardown)
    /// before giving up on it. Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.shutdown_timeout(Duration::from_secs(2));
    /// ```
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Capacity of the [`Consumer::subscribe_evictions`] channel, in notices. Default 4096; a
    /// receiver that falls further behind gets `RecvError::Lagged`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.eviction_channel_capacity(65_536);
    /// ```
    pub fn eviction_channel_capacity(mut self, notices: usize) -> Self {
        self.eviction_channel_capacity = notices;
        self
    }

    /// Prefix of the listener's unique Kafka `group.id` (the rest is pid, time and a random
    /// number). Default `binval-consumer`. Useful to recognise instances in broker tooling.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.group_id_prefix("shop-api");
    /// ```
    pub fn group_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.group_id_prefix = prefix.into();
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

    /// Miss rate limit of the whole instance: at most `fills` Redis fills per second (burst of
    /// the same size; GCRA from the `governor` crate). A fill over the limit is not read: `get`
    /// returns the key's stale copy if one is held ([`crate::Stats::stale_served`]), else
    /// [`ConsumerError::Overloaded`]. Default 0 = no limit. Concurrent misses of one key share
    /// one fill, so they count once.
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
    /// (burst of the same size), checked before [`ConsumerBuilder::max_fills_per_sec`]. Over
    /// the limit: stale copy, else [`ConsumerError::Overloaded`]. Default 0 = no limit. The
    /// per-key limiter states are bounded by [`ConsumerBuilder::max_entries`] and dropped after
    /// 1 s unused.
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

    /// Which keys the local cache holds: [`CacheMode::All`] (default), [`CacheMode::Prefixes`]
    /// or [`CacheMode::HotOnly`] (only keys read at or above
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
    /// `Err(e)` is [`ConsumerError::Loader`] with `e`'s text. Bounded by
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

    /// Bound of one loader call. Default 1 s. Exceeded: [`ConsumerError::Timeout`].
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

    /// Hot-key detection on or off. Default on. It counts (sampled) reads per key in a sliding
    /// window with a SpaceSaving top-K sketch; see "Hot keys" in the crate docs,
    /// [`crate::Consumer::hot_keys`] and the `binval_consumer_hot_key*` gauges. Off saves a
    /// few ns per `get`; [`CacheMode::HotOnly`] needs it on.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_detection(false);
    /// ```
    pub fn hot_key_detection(mut self, on: bool) -> Self {
        self.hot_key_detection = on;
        self
    }

    /// Length of the sliding window over which read rates are measured. Default 10 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_window(Duration::from_secs(2));
    /// ```
    pub fn hot_key_window(mut self, window: Duration) -> Self {
        self.hot_key_window = window;
        self
    }

    /// Reads per second (of this instance) at or above which a key is hot: reported as `hot`
    /// by [`crate::Consumer::hot_keys`], and cached in [`CacheMode::HotOnly`]. Compared with
    /// the *guaranteed* rate (the sketch's lower bound), so a cold key is never judged hot by
    /// the sketch's over-count. Default 1000.0.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_threshold(200.0);
    /// ```
    pub fn hot_key_threshold(mut self, reads_per_sec: f64) -> Self {
        self.hot_key_threshold = reads_per_sec;
        self
    }

    /// Counters of the SpaceSaving sketch (per window). Default 256. Every key read more than
    /// `1/capacity` of all reads in a window is guaranteed to be tracked.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_capacity(1024);
    /// ```
    pub fn hot_key_capacity(mut self, counters: usize) -> Self {
        self.hot_key_capacity = counters;
        self
    }

    /// Count one read of every `n` per thread, weighted by `n`. Default 16 (keeps the counting
    /// cost of a local hit to a few ns); 1 counts every read.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_sample_every(1);
    /// ```
    pub fn hot_key_sample_every(mut self, n: u32) -> Self {
        self.hot_key_sample_every = n;
        self
    }

    /// How many keys [`crate::Consumer::hot_keys`] and the per-key gauge report. Default 10.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.hot_key_top_k(20);
    /// ```
    pub fn hot_key_top_k(mut self, k: usize) -> Self {
        self.hot_key_top_k = k;
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

    /// The largest replica count N of any key.
    fn max_replicas(&self) -> u32 {
        self.prefix_replicas.iter().map(|(_, n)| *n).chain([self.replicas]).max().unwrap_or(1)
    }

    /// Upper bound of one fill: the version token read, every replica read once, the loader.
    fn longest_fill(&self) -> Duration {
        let reads = self.redis_response_timeout * (1 + self.max_replicas());
        reads + if self.loader.is_some() { self.loader_timeout } else { Duration::ZERO }
    }

    fn validate(&self) -> Result<(), ConsumerError> {
        let cfg = |field, reason: &str| Err(ConsumerError::Config { field, reason: reason.to_string() });
        match &self.redis {
            None => return cfg("redis", "no Redis given: call .redis_standalone(url) or .redis_cluster(urls)"),
            Some(RedisTarget::Cluster(urls)) if urls.is_empty() => return cfg("redis_cluster", "at least one seed node URL is needed"),
            _ => {}
        }
        if self.brokers.as_deref().is_none_or(|b| b.trim().is_empty()) {
            return cfg("brokers", "no Kafka bootstrap servers given: call .brokers(\"host:port\")");
        }
        if self.topic.as_deref().is_none_or(|t| t.trim().is_empty()) {
            return cfg("topic", "no invalidation topic given: call .topic(name)");
        }
        if self.replicas == 0 {
            return cfg("replicas", "must be at least 1");
        }
        if let Some((p, _)) = self.prefix_replicas.iter().find(|(_, n)| *n == 0) {
            return Err(ConsumerError::Config {
                field: "replicas_for_prefix",
                reason: format!("prefix `{p}`: replica count must be at least 1"),
            });
        }
        if self.max_entries == 0 {
            return cfg("max_entries", "must be at least 1 entry");
        }
        if self.ttl.is_zero() {
            return cfg("ttl", "must be longer than 0 ms");
        }
        if !(0.0..1.0).contains(&self.ttl_jitter) {
            return Err(ConsumerError::Config {
                field: "ttl_jitter",
                reason: format!("must be a fraction in 0.0..1.0, got {}", self.ttl_jitter),
            });
        }
        if let Some(bytes) = self.max_bytes {
            if bytes < 1024 || bytes < self.max_entries {
                return Err(ConsumerError::Config {
                    field: "max_bytes",
                    reason: format!("must be at least 1024 and at least max_entries ({}), got {bytes}", self.max_entries),
                });
            }
        }
        if let Some(f) = self.refresh_ahead {
            if !(0.0..1.0).contains(&f) {
                return Err(ConsumerError::Config {
                    field: "refresh_ahead",
                    reason: format!("must be a fraction of the TTL in 0.0..1.0, got {f}"),
                });
            }
        }
        if self.loader_timeout.is_zero() {
            return cfg("loader_timeout", "must be longer than 0 ms");
        }
        if self.cache_mode == CacheMode::HotOnly && !self.hot_key_detection {
            return cfg("cache_mode", "CacheMode::HotOnly needs hot_key_detection(true)");
        }
        if let CacheMode::Prefixes(p) = &self.cache_mode {
            if p.is_empty() || p.iter().any(|p| p.is_empty()) {
                return cfg("cache_mode", "CacheMode::Prefixes needs at least one non-empty prefix (use CacheMode::All for every key)");
            }
        }
        if self.hot_key_window < Duration::from_millis(10) {
            return cfg("hot_key_window", "must be at least 10 ms");
        }
        if !(self.hot_key_threshold.is_finite() && self.hot_key_threshold > 0.0) {
            return Err(ConsumerError::Config {
                field: "hot_key_threshold",
                reason: format!("must be a positive number of reads per second, got {}", self.hot_key_threshold),
            });
        }
        if self.hot_key_capacity == 0 {
            return cfg("hot_key_capacity", "must be at least 1 counter");
        }
        if self.hot_key_sample_every == 0 {
            return cfg("hot_key_sample_every", "must be at least 1 (1 = count every read)");
        }
        if self.stale_ttl.is_zero() {
            return cfg("stale_ttl", "must be longer than 0 ms");
        }
        if self.stale_max_entries == 0 {
            return cfg("stale_max_entries", "must be at least 1 entry");
        }
        if self.redis_response_timeout.is_zero() {
            return cfg("redis_response_timeout", "must be longer than 0 ms");
        }
        if self.redis_connection_timeout.is_zero() {
            return cfg("redis_connection_timeout", "must be longer than 0 ms");
        }
        if self.fill_guard_entries == 0 {
            return cfg("fill_guard_entries", "must be at least 1 entry");
        }
        let longest = self.longest_fill();
        if self.fill_guard_ttl <= longest {
            return Err(ConsumerError::Config {
                field: "fill_guard_ttl",
                reason: format!(
                    "must exceed the longest fill, {} ms (redis_response_timeout x (1 version token + {} replicas){})",
                    longest.as_millis(),
                    self.max_replicas(),
                    if self.loader.is_some() { " + loader_timeout" } else { "" }
                ),
            });
        }
        if self.metadata_refresh.is_zero() {
            return cfg("metadata_refresh", "must be longer than 0 ms");
        }
        if self.max_staleness.is_some_and(|b| b < Duration::from_millis(100)) {
            return cfg("max_staleness", "must be at least 100 ms (or None to turn the check off)");
        }
        if self.kafka_request_timeout.is_zero() {
            return cfg("kafka_request_timeout", "must be longer than 0 ms");
        }
        Ok(())
    }

    /// Connect to Redis, start the invalidation listener, and return once the listener is
    /// assigned every partition of the topic at its newest offset: every event published after
    /// `build()` returns will be seen.
    ///
    /// Fails with [`ConsumerError::Config`] for a missing/invalid setting or a topic that does
    /// not exist, [`ConsumerError::Redis`]/[`ConsumerError::Timeout`] if Redis is unreachable,
    /// [`ConsumerError::Kafka`] if the brokers do not answer.
    pub async fn build(self) -> Result<Consumer, ConsumerError> {
        self.validate()?;
        let redis_target = self.redis.clone().expect("validated");
        let redis = RedisConn::connect(&redis_target, self.redis_response_timeout, self.redis_connection_timeout).await?;

        let mut prefix_replicas = self.prefix_replicas.clone();
        // Longest prefix first, so the first match is the longest.
        prefix_replicas.sort_by_key(|p| std::cmp::Reverse(p.0.len()));

        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let group_id = format!("{}-{}-{:x}-{:08x}", self.group_id_prefix, std::process::id(), nanos, rand::random::<u32>());
        let settings = ListenerSettings {
            brokers: self.brokers.clone().expect("validated"),
            topic: self.topic.clone().expect("validated"),
            group_id,
            properties: self.kafka_properties.clone(),
            metadata_refresh: self.metadata_refresh,
            request_timeout: self.kafka_request_timeout,
            max_staleness: self.max_staleness,
        };

        // Metadata, watermarks and assign are blocking librdkafka calls.
        let (consumer, known, settings) = tokio::task::spawn_blocking(move || {
            let consumer = listener::create_consumer(&settings)?;
            let known = listener::assign_all_at_end(&consumer, &settings)?;
            Ok::<_, ConsumerError>((consumer, known, settings))
        })
        .await
        .map_err(|e| ConsumerError::Config { field: "listener", reason: format!("startup task failed: {e}") })??;

        let shared = Arc::new(Shared::new(SharedSettings {
            bounds: Bounds { max_entries: self.max_entries, max_bytes: self.max_bytes },
            ttl: JitteredTtl { ttl: self.ttl, jitter: self.ttl_jitter },
            refresh_ahead: self.refresh_ahead,
            guard_entries: self.fill_guard_entries,
            guard_ttl: self.fill_guard_ttl,
            notice_capacity: self.eviction_channel_capacity,
            limits: LimitSettings {
                per_instance: NonZeroU32::new(self.max_fills_per_sec),
                per_key: NonZeroU32::new(self.max_fills_per_key_per_sec),
                stale_ttl: self.stale_ttl,
                stale_entries: self.stale_max_entries,
                key_limiter_entries: self.max_entries,
            },
            hot: self.hot_key_detection.then_some(HotSettings {
                window: self.hot_key_window,
                threshold: self.hot_key_threshold,
                capacity: self.hot_key_capacity,
                sample_every: self.hot_key_sample_every,
                top_k: self.hot_key_top_k,
            }),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let topic = settings.topic.clone();
        let group_id = settings.group_id.clone();
        let done = listener::spawn(consumer, known, settings, shared.clone(), stop.clone())?;

        Ok(Consumer {
            inner: Arc::new(Inner {
                shared,
                redis,
                default_replicas: self.replicas,
                prefix_replicas,
                mode: self.cache_mode.clone(),
                loader: self.loader.clone(),
                loader_timeout: self.loader_timeout,
                cache_loaded: self.cache_loaded,
                thread_front: self.thread_front,
                response_timeout: self.redis_response_timeout,
                shutdown_timeout: self.shutdown_timeout,
                stop,
                inflight: Mutex::new(HashMap::new()),
                next_fill_id: AtomicU64::new(0),
                done: Mutex::new(Some(done)),
                topic,
                group_id,
            }),
        })
    }
}
