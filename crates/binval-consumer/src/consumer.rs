//! [`Consumer`]: the handle an app instance keeps, and the synchronous part of a read.
//!
//! A read ([`Consumer::get_shared`]) is split in two on purpose: `Consumer::lookup` is plain
//! synchronous code (count the read for hot-key detection, check the fail-safe flag, the
//! per-thread front and moka) that serves a local hit without building any future state; only
//! a miss goes on to single-flight (`single_flight.rs`) and the read-through fill (`read.rs`).
//! The rest of this file is the accessors and [`Consumer::shutdown`].

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_protocol::Version;
use futures::future::FutureExt;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, oneshot};
use tracing::warn;

use crate::counts::ReplicaCounts;
use crate::error::ConsumerError;
use crate::front;
use crate::heat::Background;
use crate::hot::HotKey;
use crate::loader::LoaderFn;
use crate::redis_conn::RedisConn;
use crate::single_flight::Freshness;
use crate::state::{EvictionNotice, Shared};
use crate::stats::Stats;
use crate::ConsumerBuilder;

/// Which keys the local cache holds ([`ConsumerBuilder::cache_mode`]). Keys it does not hold
/// are still read through single-flight, the miss rate limits and Redis, on every `get`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Every key read (the default).
    #[default]
    All,
    /// Only keys that start with one of these prefixes, e.g. `["item:detail:"]`.
    Prefixes(Vec<String>),
    /// Only keys this instance detected hot: read at or above
    /// [`ConsumerBuilder::hot_key_threshold`] reads per second (see "Hot-key detection" in the
    /// crate docs). A key is judged when it misses; once cached it stays until an event, its
    /// TTL or the bounds remove it, and is judged again at its next miss.
    HotOnly,
}

/// What a read does when binval's progress messages say the source side is behind
/// [`ConsumerBuilder::max_staleness`] for every replica of the key
/// ([`ConsumerBuilder::on_source_behind`]; see "The source side" in the crate docs). The local
/// cache is bypassed in any case; this decides what a Redis read may stand for then.
///
/// Why the default does not serve Redis: while binval's writes stall (a frozen Redis master,
/// the source out of reach), the replicas keep the values of before the stall, and nothing in
/// a replica record says it is older than the bound. Serving it as usual would be exactly the
/// failure of issue #22: a value older than the bound served as if it were fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnSourceBehind {
    /// The default: ask the [`ConsumerBuilder::loader`] (the database) instead of Redis, not
    /// cached ([`crate::Stats::source_behind_loaded`]); without a loader, refuse with
    /// [`ConsumerError::SourceBehind`] ([`crate::Stats::source_behind_refused`]). Mind the
    /// load: every `get` of the bypassed cache reaches the loader (concurrent ones of a key
    /// share one call), so set the miss rate limits ([`ConsumerBuilder::max_fills_per_sec`])
    /// if the database cannot take the whole read rate.
    #[default]
    LoadOrRefuse,
    /// Serve what Redis holds (missing replicas: the loader if set), not cached, flagged:
    /// [`Consumer::get_flagged`] returns it with [`Stale::SourceBehind`], and
    /// [`crate::Stats::source_behind_flagged`] counts it; [`Consumer::get`] returns the value
    /// alone. For apps that prefer an old value to none and can say so to their users.
    ServeStale,
    /// Refuse every such read with [`ConsumerError::SourceBehind`], loader or not.
    Refuse,
}

/// Why a value [`Consumer::get_flagged`] returned may be older than the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stale {
    /// The stale copy of an evicted entry, served because the miss rate limit refused the fill
    /// ([`ConsumerBuilder::stale_ttl`]).
    Copy,
    /// Read from Redis while binval's progress said the source side was `lag` behind
    /// ([`OnSourceBehind::ServeStale`]): the value may be that old, or older.
    SourceBehind {
        /// The source lag of the freshest replica of the key.
        lag: Duration,
    },
}

/// A value with what is known about its freshness ([`Consumer::get_flagged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flagged {
    /// The payload, `None` when the row does not exist (as [`Consumer::get_shared`]).
    pub value: Option<Arc<str>>,
    /// `None`: within the bound (a local hit, a fresh replica, the loader); else why not.
    pub stale: Option<Stale>,
}

/// The handle an app instance keeps: a local cache in front of binval's Redis replicas, kept
/// in step by a background invalidation listener. Cheap to clone (all clones share one cache
/// and one listener); create one per process with [`Consumer::builder`].
#[derive(Clone)]
pub struct Consumer {
    pub(crate) inner: Arc<Inner>,
}

/// Everything a [`Consumer`] and its clones share. Built by [`ConsumerBuilder::build`].
pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) redis: RedisConn,
    /// The replica count of each key: configured, learned from the records and the hot set
    /// (`counts.rs`).
    pub(crate) counts: Arc<ReplicaCounts>,
    /// The heat reports and hot-set refresh task (`heat.rs`); stopped by shutdown or drop.
    pub(crate) background: Background,
    /// This instance's id in its heat reports ([`ConsumerBuilder::instance_id`]).
    pub(crate) instance_id: String,
    pub(crate) mode: CacheMode,
    pub(crate) loader: Option<LoaderFn>,
    pub(crate) loader_timeout: Duration,
    pub(crate) cache_loaded: bool,
    /// Replica reads one fill makes at most ([`ConsumerBuilder::max_replica_reads`]).
    pub(crate) max_replica_reads: u32,
    /// How long "no replica holds the key" is cached; `None` or zero: not cached.
    pub(crate) missing_ttl: Option<Duration>,
    /// Use the per-thread front ([`front`]).
    pub(crate) thread_front: bool,
    pub(crate) response_timeout: Duration,
    /// Soft bound of one replica read before the next replica is read too
    /// ([`ConsumerBuilder::replica_read_timeout`]).
    pub(crate) replica_read_timeout: Duration,
    /// What a read does while the source side is behind ([`ConsumerBuilder::on_source_behind`]).
    pub(crate) on_source_behind: OnSourceBehind,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) done: Mutex<Option<oneshot::Receiver<()>>>,
    pub(crate) topic: String,
    pub(crate) group_id: String,
}

/// What the synchronous part of a read decided.
enum Lookup {
    /// A local hit (`None`: a cached "no row").
    Hit(Option<Arc<str>>),
    /// Read through; `cache`: whether the fill may cache its value.
    Fill { cache: bool },
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Last handle gone without shutdown(): let the listener thread end on its own.
        self.stop.store(true, SeqCst);
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.inner.topic)
            .field("group_id", &self.inner.group_id)
            .field("serving_local", &self.is_serving_local())
            .field("cache_mode", &self.inner.mode)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Consumer {
    /// Start configuring a consumer; see [`ConsumerBuilder`] for every option and its default.
    pub fn builder() -> ConsumerBuilder {
        ConsumerBuilder::default()
    }

    /// The payload of logical key `key` (e.g. `item:detail:6666`), as the JSON text stored in
    /// its replicas, or `None` if the row does not exist (a tombstone, or no replica and no
    /// loader value).
    ///
    /// A local cache hit returns at once (a cached "no row" too). A miss reads
    /// `HMGET K:r{i} d t p n` of one replica, chosen master-balanced (a master uniformly among
    /// those holding one of the key's replicas, then a replica on it): a value is the answer,
    /// cached at the replica's position `p`; a tombstone means the row was deleted (`None`,
    /// cached at its position; no other replica or loader is asked); a missing replica sends
    /// the fill to replica 0 if it was not read yet (it exists whenever the key does: see
    /// "Adaptive replica counts" in the crate docs), else to a replica on another master, at
    /// most [`ConsumerBuilder::max_replica_reads`] reads in all (default 2; one more for
    /// replica 0 if need be), then to the loader if
    /// one is set ([`ConsumerBuilder::loader`]), else `None`, cached for
    /// [`ConsumerBuilder::missing_ttl`] (default 1 s). Nothing is cached when the cache mode,
    /// the fill-race guard or the fail-safe forbids it. Each Redis read is bounded by the
    /// response timeout (default 200 ms); a read is never repeated on the same master.
    ///
    /// Concurrent misses of the same key in this instance share one fill (single-flight): one
    /// Redis round trip, and every caller gets its outcome (value, `None` or error). The fill
    /// runs as its own tokio task, so a caller that gives up does not cancel it for the others.
    /// If a miss rate limit is set and refuses the fill, `get` returns the key's stale copy if
    /// one is held, else [`ConsumerError::Overloaded`].
    ///
    /// Must be called within a tokio runtime (a local hit does not touch it, except to start a
    /// refresh-ahead, which is skipped outside a runtime).
    pub async fn get(&self, key: &str) -> Result<Option<String>, ConsumerError> {
        Ok(self.get_shared(key).await?.map(|v| v.to_string()))
    }

    /// Like [`Consumer::get`], without copying the payload out of the local cache.
    pub async fn get_shared(&self, key: &str) -> Result<Option<Arc<str>>, ConsumerError> {
        match self.lookup(key) {
            Lookup::Hit(value) => Ok(value),
            // Boxed: keeps this future small, so a hit does not build (or move) the whole state
            // of a fill; the allocation is paid by misses only, next to a Redis round trip.
            Lookup::Fill { cache } => Ok(self.fill_single_flight(key, cache).boxed().await?.value),
        }
    }

    /// Like [`Consumer::get_shared`], and says whether the value may be older than the bound:
    /// [`Stale::SourceBehind`] for a Redis value served while the source side was behind
    /// ([`OnSourceBehind::ServeStale`]), [`Stale::Copy`] for the stale copy the miss rate limit
    /// fell back to; `stale: None` for everything else (a local hit, a fresh replica, the
    /// loader). Errors as [`Consumer::get`], including [`ConsumerError::SourceBehind`] with the
    /// other [`OnSourceBehind`] choices.
    ///
    /// ```no_run
    /// # async fn f(consumer: binval_consumer::Consumer) -> Result<(), binval_consumer::ConsumerError> {
    /// use binval_consumer::Stale;
    /// let read = consumer.get_flagged("item:detail:6666").await?;
    /// if let Some(Stale::SourceBehind { lag }) = read.stale {
    ///     println!("may be {} ms old", lag.as_millis()); // e.g. add a response header
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn get_flagged(&self, key: &str) -> Result<Flagged, ConsumerError> {
        match self.lookup(key) {
            Lookup::Hit(value) => Ok(Flagged { value, stale: None }),
            Lookup::Fill { cache } => {
                let f = self.fill_single_flight(key, cache).boxed().await?;
                let stale = match f.how {
                    Freshness::StaleCopy if f.value.is_some() => Some(Stale::Copy),
                    Freshness::SourceBehind(lag) => Some(Stale::SourceBehind { lag }),
                    _ => None,
                };
                Ok(Flagged { value: f.value, stale })
            }
        }
    }

    /// The synchronous part of `get`: count the read, serve a local hit (starting a
    /// refresh-ahead if due), or say whether the fill may cache.
    #[inline]
    fn lookup(&self, key: &str) -> Lookup {
        let inner = &*self.inner;
        let shared = &inner.shared;
        if let Some(hot) = &shared.hot {
            hot.record(key);
        }
        if !shared.is_serving_local() {
            shared.counters.bypass_read();
            return Lookup::Fill { cache: false };
        }
        let lookup = match &inner.mode {
            CacheMode::Prefixes(prefixes) => prefixes.iter().any(|p| key.starts_with(p.as_str())),
            CacheMode::All | CacheMode::HotOnly => true,
        };
        if lookup {
            // The generation is read before the local cache (see `front`): an entry read after
            // this point and removed later carries the older generation.
            let gen = shared.front_gen();
            let now = Instant::now();
            let found = if inner.thread_front {
                match front::get(shared.id, gen, key, now) {
                    Some(e) => Some(e),
                    None => shared.local.get(key).inspect(|e| front::put(shared.id, gen, key, e)),
                }
            } else {
                shared.local.get(key)
            };
            if let Some(e) = found {
                shared.counters.hit();
                if e.value.is_none() {
                    shared.counters.negative_hit();
                }
                if let Some(mark) = &e.refresh {
                    if mark.claim(now) {
                        self.start_refresh(key);
                    }
                }
                return Lookup::Hit(e.value);
            }
        }
        let cache = match &inner.mode {
            CacheMode::All => true,
            CacheMode::Prefixes(_) => lookup,
            CacheMode::HotOnly => shared.hot.as_ref().is_some_and(|h| h.is_hot(key)),
        };
        if cache {
            shared.counters.miss();
        } else {
            shared.counters.uncached_read();
        }
        Lookup::Fill { cache }
    }

    /// [`Consumer::get`], then deserialize the payload with serde_json. A payload that does not
    /// fit `T` is [`ConsumerError::Decode`] naming the key. (The text is cached, not the `T`:
    /// every call deserializes; see [`Consumer::get_with`] to cache nothing extra but choose
    /// the decoding.)
    ///
    /// ```no_run
    /// # async fn f(consumer: binval_consumer::Consumer) -> Result<(), binval_consumer::ConsumerError> {
    /// #[derive(serde::Deserialize)]
    /// struct Item { id: u64, name: String, price_cents: i64 }
    /// let item: Option<Item> = consumer.get_json("item:detail:6666").await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ConsumerError> {
        self.get_with(key, |text| serde_json::from_str(text)).await
    }

    /// [`Consumer::get`], then decode the payload text with `decode` (any format, any error
    /// type). An error is [`ConsumerError::Decode`] naming the key, with the error's text.
    ///
    /// ```no_run
    /// # async fn f(consumer: binval_consumer::Consumer) -> Result<(), binval_consumer::ConsumerError> {
    /// let len: Option<usize> = consumer.get_with("item:detail:6666", |t| Ok::<_, std::convert::Infallible>(t.len())).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_with<T, E: std::fmt::Display>(
        &self,
        key: &str,
        decode: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<Option<T>, ConsumerError> {
        match self.get_shared(key).await? {
            None => Ok(None),
            Some(text) => {
                decode(&text).map(Some).map_err(|e| ConsumerError::Decode { key: key.to_string(), what: "payload", reason: e.to_string() })
            }
        }
    }

    /// The replica count N a fill of `key` uses now (its replicas `K:r0..K:r{N-1}` are where
    /// its reads spread): the count the key's records last said (field `n`, see "Adaptive
    /// replica counts" in the crate docs), else its hot-set entry (`binval:hot`, loaded at
    /// start), else the configured one — the longest matching
    /// [`ConsumerBuilder::replicas_for_prefix`], else [`ConsumerBuilder::replicas`].
    pub fn replicas_for(&self, key: &str) -> u32 {
        self.inner.counts.count(key)
    }

    /// The same as [`Consumer::replicas_for`]: what this reader would use for `key` now, for
    /// tests and operators (e.g. after `binval` grew a hot key: 8 once a record said so).
    ///
    /// ```no_run
    /// # async fn f(consumer: binval_consumer::Consumer) -> Result<(), binval_consumer::ConsumerError> {
    /// consumer.get("item:detail:6666").await?;
    /// println!("item:detail:6666 is read over {} suffix replicas", consumer.replica_count("item:detail:6666"));
    /// # Ok(()) }
    /// ```
    pub fn replica_count(&self, key: &str) -> u32 {
        self.inner.counts.count(key)
    }

    /// This instance's id: the field of its heat report in `binval:heat:{b}`
    /// ([`ConsumerBuilder::instance_id`]; default `<hostname>-<pid>-<random hex>`).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The version the local cache holds `key` at, if it holds it (a value, or a cached "no
    /// row": a tombstone at its position, a missing key at 0); does not count as a hit or miss.
    /// For tests, debugging and `inspect`-style tooling.
    ///
    /// It reads the local cache itself, not a thread's front: while a fill or an event batch is
    /// being applied it can already see the new state a moment before the fronts are
    /// invalidated (the last step of both), when [`Consumer::get`] on another thread may still
    /// serve the entry it replaced. A `get` that starts after one that saw the new state, or
    /// after the [`EvictionNotice`](crate::EvictionNotice) of the event, sees it too.
    pub fn cached_version(&self, key: &str) -> Option<Version> {
        self.inner.shared.local.get(key).map(|e| e.version)
    }

    /// Number of entries in the local cache. Applies moka's pending evictions first, so it is
    /// exact at the time of the call (and costs a short flush: for monitoring, not per read).
    pub fn local_entries(&self) -> u64 {
        self.inner.shared.local.run_pending_tasks();
        self.inner.shared.local.entry_count()
    }

    /// Estimated bytes the local cache holds: the sum of its entries' weights (key length +
    /// payload length + [`ENTRY_OVERHEAD_BYTES`](crate::ENTRY_OVERHEAD_BYTES) each, at least
    /// `max_bytes / max_entries`; see [`ConsumerBuilder::max_bytes`]). Without a byte bound every entry weighs 1 and this
    /// equals [`Consumer::local_entries`]. Flushes pending evictions first, like it.
    pub fn local_weighted_size(&self) -> u64 {
        self.inner.shared.local.run_pending_tasks();
        self.inner.shared.local.weighted_size()
    }

    /// The top K keys this instance reads, highest estimated read rate first, over the last
    /// hot-key window (K = [`ConsumerBuilder::hot_key_top_k`]); each says whether it is at or
    /// above the hot-key threshold. Also sets the hot-key gauges. Empty when hot-key detection
    /// is off ([`ConsumerBuilder::hot_key_detection`]).
    pub fn hot_keys(&self) -> Vec<HotKey> {
        self.inner.shared.hot.as_ref().map(|h| h.publish_metrics()).unwrap_or_default()
    }

    /// `true` when `key`'s guaranteed read rate in this instance is at or above the hot-key
    /// threshold (always `false` when detection is off).
    pub fn is_hot(&self, key: &str) -> bool {
        self.inner.shared.hot.as_ref().is_some_and(|h| h.is_hot(key))
    }

    /// The cache mode this consumer was built with.
    pub fn cache_mode(&self) -> &CacheMode {
        &self.inner.mode
    }

    /// A receiver of one [`EvictionNotice`] per invalidation event applied from now on
    /// (whether or not it evicted). For tests, benchmarks and metrics; a receiver that falls
    /// more than the channel capacity behind gets `RecvError::Lagged`.
    pub fn subscribe_evictions(&self) -> broadcast::Receiver<EvictionNotice> {
        self.inner.shared.notices.subscribe()
    }

    /// A snapshot of the counters (since `build()`), and the number of learned replica
    /// counts now (which also sets its gauge).
    pub fn stats(&self) -> Stats {
        let mut s = self.inner.shared.counters.snapshot();
        s.learned_counts = self.inner.counts.entries();
        self.inner.shared.counters.learned_counts(s.learned_counts);
        s
    }

    /// `true` while `get` may serve from and fill into the local cache; `false` while the
    /// fail-safe bypasses it (invalidation stream lost, its lag or the source lag
    /// ([`Consumer::source_lag`]) past [`ConsumerBuilder::max_staleness`], listener ended, or
    /// after [`Consumer::shutdown`]).
    /// See the crate docs, "Fail safe".
    pub fn is_serving_local(&self) -> bool {
        self.inner.shared.is_serving_local()
    }

    /// How far behind the invalidation stream this instance is confirmed to be: the time since
    /// the newest high-watermark observation its listener has read up to (every event the
    /// broker acknowledged before then has been applied). Under a flowing, healthy stream it
    /// stays around a quarter of [`ConsumerBuilder::max_staleness`] plus one fetch; the fail
    /// safe bypasses the local cache while it exceeds the bound. Also exported as the gauge
    /// `binval_consumer_stream_lag_ms`. See the crate docs, "Fail safe".
    pub fn stream_lag(&self) -> Duration {
        self.inner.shared.fail_safe.lag(Instant::now())
    }

    /// How far behind the source binval's side is, by its progress messages: the worst, over
    /// every (source, partition), of the newest message's `lag_ms` plus the time since this
    /// instance received it (its own monotonic clock; no clock of another host is compared).
    /// `None` until a progress message has been seen (a binval older than the progress
    /// message sends none), unless [`ConsumerBuilder::require_progress`] is set: then it counts
    /// from `build()` on. Past [`ConsumerBuilder::max_staleness`] the local cache is bypassed
    /// and Redis reads follow [`ConsumerBuilder::on_source_behind`]. Also exported as the
    /// gauge `binval_consumer_source_lag_ms`. See the crate docs, "The source side".
    pub fn source_lag(&self) -> Option<Duration> {
        self.inner.shared.fail_safe.source_lag(Instant::now())
    }

    /// The listener's Kafka `group.id` (unique per instance; no group join, no commits).
    pub fn group_id(&self) -> &str {
        &self.inner.group_id
    }

    /// The invalidation topic this consumer listens to.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Stop the heat reports (removing this instance's report from its heat hash, see
    /// [`ConsumerBuilder::heat_reports`]) and the listener, and wait for them and librdkafka's
    /// teardown, each at most the shutdown timeout (default 5 s; teardown that takes longer is
    /// abandoned with a warning). Afterwards `get` still works but reads Redis every time; once
    /// binval's progress messages counted, none is received any more, so after
    /// [`ConsumerBuilder::max_staleness`] reads follow [`ConsumerBuilder::on_source_behind`].
    /// Calling it again returns at once.
    pub async fn shutdown(&self) {
        let inner = &*self.inner;
        inner.background.stop(inner.shutdown_timeout).await;
        inner.stop.store(true, SeqCst);
        // For good: the lag checker may still be running and must not resume local serving.
        inner.shared.fail_safe.end(&inner.shared);
        let done = inner.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            if tokio::time::timeout(inner.shutdown_timeout, done).await.is_err() {
                warn!(
                    topic = %inner.topic,
                    timeout_ms = inner.shutdown_timeout.as_millis() as u64,
                    "binval-consumer listener did not stop in time (librdkafka teardown hanging?); abandoned"
                );
            }
        }
    }
}
