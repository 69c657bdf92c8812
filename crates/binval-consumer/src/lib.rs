//! `binval-consumer`: the in-process local cache of an app instance, kept in step with the
//! database by binval's invalidation events.
//!
//! binval (the service) reads the binlog and, per changed logical key `K`, writes the payload to
//! every suffix replica `K:r0..K:r{N-1}`, then moves the version token `K:ver` to the change's
//! fence position, then publishes one invalidation event `{key, version, …}` to a Kafka topic.
//! This crate is the other end: [`Consumer::get`] serves a key from a bounded local cache, fills
//! misses from Redis, and a background listener evicts entries as events arrive.
//!
//! ```no_run
//! # #[derive(serde::Deserialize)] struct Item { id: u64 }
//! # async fn f() -> Result<(), binval_consumer::ConsumerError> {
//! use std::time::Duration;
//! use binval_consumer::CacheMode;
//!
//! let consumer = binval_consumer::Consumer::builder()
//!     .redis_cluster(["redis://10.0.0.1:7001"])       // or .redis_standalone(url)
//!     .brokers("10.0.0.5:9092")
//!     .topic("binval.invalidations")
//!     .replicas(1)                                     // default replica count N
//!     .replicas_for_prefix("item:detail:", 8)          // longest prefix wins
//!     .max_entries(100_000)                            // local cache bound, entries ...
//!     .max_bytes(64 << 20)                             // ... and estimated bytes
//!     .ttl(Duration::from_secs(60))                    // safety-net TTL
//!     .ttl_jitter(0.1)                                 // each entry lives 54..66 s
//!     .refresh_ahead(0.8)                              // re-read busy keys in the background
//!     .cache_mode(CacheMode::Prefixes(vec!["item:".into()])) // or All (default), HotOnly
//!     .hot_key_threshold(1000.0)                       // reads/s at which a key is hot
//!     .max_fills_per_key_per_sec(10)                   // miss rate limits ...
//!     .max_fills_per_sec(5_000)                        // ... with stale fallback
//!     .loader(|key: String| async move {               // last resort: all replicas missing
//!         let _ = key;                                 // e.g. SELECT from the primary
//!         Ok::<Option<String>, String>(None)
//!     })
//!     .kafka_property("fetch.wait.max.ms", "5")        // passthrough librdkafka setting
//!     .build()
//!     .await?;                                         // listener assigned at newest offsets
//!
//! let text: Option<String> = consumer.get("item:detail:6666").await?;
//! let item: Option<Item> = consumer.get_json("item:detail:6666").await?;
//! println!("{:?} {:?}", consumer.stats(), consumer.hot_keys());
//! consumer.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! An HTTP example app (axum) is `examples/product_api.rs`.
//!
//! # The record format
//!
//! A suffix replica `K:rN` is a Redis hash written by binval's version-fenced script
//! ([`binval_protocol::fence`]): `d` the payload, `p` the fence position of the change, `t` =
//! `1` for a tombstone (row deleted), `f` the writer's fencing token. The version token `K:ver`
//! is a decimal `u64`, the fence position of the newest change (not a counter: any increasing
//! number). A fill reads `GET K:ver`, then `HMGET K:rN d t` of one random replica:
//!
//! - a value: the answer;
//! - a tombstone: the row does not exist — `None`, and neither another replica nor the loader
//!   is asked (the tombstone is newer than anything they could say);
//! - missing (never written, expired, lost): try another replica, each at most once, then the
//!   loader if one is set, else `None`.
//!
//! # Why the read goes version token first, then replica
//!
//! The writer goes replicas first, then version token. A fill that reads `K:ver` (say 3) and
//! *then* a replica gets a value at least as new as version 3: the pair it caches is correct,
//! or "newer value, older version", which the next event (version ≥ 4) evicts. Read in the
//! other order, a fill can read the old replica, then the writer finishes (replicas, `ver`=4,
//! event), then the fill reads `ver`=4 and caches (old value, 4). The event for version 4 has
//! already been applied or will not evict (4 is not < 4), and no later event is coming: the
//! old value would be served until the TTL. So: version first, always.
//!
//! # The app-supplied loader
//!
//! [`ConsumerBuilder::loader`] is the last resort when every replica is missing (e.g. Redis
//! lost them, or binval runs in invalidate-only mode for the table). It runs inside the key's
//! single fill, after the miss rate limits, bounded by [`ConsumerBuilder::loader_timeout`].
//! Its value is cached under the version token read *before* the replicas — the same rule as
//! a replica value: a loader that reads the primary returns something at least as new as that
//! version, so the pair is correct or gets evicted by the next event, and the fill-race guard
//! refuses it when an event overtook the fill. A loader reading a lagging database replica
//! should not be cached: [`ConsumerBuilder::cache_loaded`]`(false)`.
//!
//! # The evict rule
//!
//! An event with version `v` evicts a cached entry filled at version `c` exactly when `c < v`
//! ([`binval_protocol::should_evict`]). An entry at `c ≥ v` already reflects that change, so
//! duplicates, replays and out-of-order deliveries after a restart evict nothing needlessly.
//!
//! # The fill race ("stale set")
//!
//! A fill can read `K:ver` = 9 and the replica, then be slow; meanwhile the writer moves `K` to
//! 10 and the event arrives and is applied — to a cache that does not hold `K` yet. Then the
//! slow fill lands and would cache (old value, 9) with nothing left to evict it. The listener
//! therefore remembers the newest event version per recently invalidated key (a bounded moka
//! cache, default 100 000 entries for 30 s), and a fill whose version is lower than that is
//! returned to its caller but not cached ([`Stats::fills_refused`]). The fill re-checks after
//! inserting, so an event applied between its check and its insert still removes it.
//!
//! # Invalidation in batches
//!
//! The listener thread waits up to 100 ms for a message, then takes everything already queued
//! (up to 1024 messages) and applies it as one batch: per distinct key one guard update and at
//! most one eviction (a row updated 50 times in a burst costs one eviction), then one
//! [`EvictionNotice`] per event. Readers are never blocked by it: the local cache and the
//! guard are concurrent maps, and no lock is held across a batch.
//!
//! # Why no shared consumer group
//!
//! A Kafka consumer group splits partitions among its members: each event would reach one app
//! instance, and every other instance would keep its stale entry. Every instance must see every
//! event of every partition, so the listener `assign()`s all partitions itself, under a unique
//! `group.id` per instance, and never commits offsets. It starts at the newest offsets (read
//! explicitly as high watermarks, so nothing published after `build()` returns is skipped) —
//! a new instance has an empty cache and nothing older to evict. Every 5 s it re-reads the
//! metadata and assigns partitions added since, from their beginning.
//!
//! # Fail safe
//!
//! While the listener cannot see the stream, entries may go stale without an event to evict
//! them. When librdkafka reports that all brokers are down (or a fatal error), or the listener
//! thread ends for any reason other than [`Consumer::shutdown`], the consumer stops serving
//! locally: [`Consumer::get`] reads Redis every time and caches nothing
//! ([`Consumer::is_serving_local`] is `false`, metric `binval_consumer_serving_local` 0). When
//! the stream is back (a message arrives, or the broker answers a metadata request) the listener
//! clears the whole local cache and then serves locally again.
//!
//! A stream can also stall without any error: a broker that hangs, a network that drops
//! packets without resetting connections, a listener that falls behind a burst. So the listener
//! checks every half [`ConsumerBuilder::max_staleness`] (default 2 s) that it has read each
//! partition up to the high watermark the broker reports *now*; when it could not confirm that
//! for longer than the bound, it stops serving locally in the same way, and resumes (clearing
//! the cache first) only after a check succeeds. So no local value older than the bound plus
//! one check is served while the stream is stuck (invariant I5).
//!
//! A gap in a partition's offsets (events deleted by retention before they were read, a
//! broker that lost its log) clears the local cache at once: an event that would have evicted
//! an entry may be among the missing ones. There is no consumer group, so no rebalance can
//! move partitions away from an instance.
//!
//! A `truncate` event (TRUNCATE / DROP TABLE of a mapped table; its `key` is the key template)
//! evicts every cached key with the template's literal prefix and an older version, and the
//! fill-race guard refuses older fills of such keys for `fill_guard_ttl`.
//!
//! # Single-flight
//!
//! Concurrent misses of one key in one instance share one fill: the first starts it as a tokio
//! task and registers it in a small map (key -> shared future); the others await the same
//! outcome ([`Stats::coalesced`]). The entry is removed when the task ends, so the map holds
//! only keys being filled right now. The fill-race guard still decides whether the value is
//! cached; a refused fill's value is returned to every waiter all the same.
//!
//! # Miss rate limit and stale fallback
//!
//! Optional GCRA limits (`governor`) on fills: per instance
//! ([`ConsumerBuilder::max_fills_per_sec`]) and per key
//! ([`ConsumerBuilder::max_fills_per_key_per_sec`]). A refused fill reads nothing
//! ([`Stats::limiter_rejections`]); its callers get the key's stale copy — the value of an
//! entry that an event, its TTL or a fail-safe clear removed within
//! [`ConsumerBuilder::stale_ttl`] ([`Stats::stale_served`]) — or
//! [`ConsumerError::Overloaded`]. A stale copy is by definition possibly out of date: it trades
//! freshness for protecting Redis, only while over the limit.
//!
//! # TTL jitter and refresh-ahead
//!
//! [`ConsumerBuilder::ttl_jitter`] spreads each entry's TTL uniformly over
//! `ttl × [1 - j, 1 + j]`, so entries filled together do not expire together.
//! With [`ConsumerBuilder::refresh_ahead`]`(f)`, a hit on an entry past `f` of its TTL returns
//! the cached value at once and starts one background fill (at most one per entry, joined with
//! any fill of the key in flight), which replaces the entry with a fresh TTL: a busy key never
//! expires into a miss that all its readers wait for.
//!
//! # What to cache, and hot keys
//!
//! [`ConsumerBuilder::cache_mode`]: [`CacheMode::All`] keys (default), [`CacheMode::Prefixes`]
//! or [`CacheMode::HotOnly`] — only keys this instance reads at or above
//! [`ConsumerBuilder::hot_key_threshold`] reads/s. Keys not cached still go through
//! single-flight, the miss rate limits and Redis ([`Stats::uncached_reads`]).
//!
//! Hot-key detection counts each instance's reads per key in a sliding window
//! ([`ConsumerBuilder::hot_key_window`], default 10 s) with a SpaceSaving top-K sketch
//! (bounded: [`ConsumerBuilder::hot_key_capacity`] counters), sampling one read in
//! [`ConsumerBuilder::hot_key_sample_every`] per thread to keep hits cheap. The hot decision
//! uses the sketch's *guaranteed* count, so the sketch's over-count never makes a cold key
//! hot. [`Consumer::hot_keys`] returns the top K with rates; the gauges below export them.
//!
//! # Bounds
//!
//! The local cache is bounded by entries ([`ConsumerBuilder::max_entries`]) and optionally by
//! estimated bytes ([`ConsumerBuilder::max_bytes`]): an entry weighs its key length + payload
//! length + [`ENTRY_OVERHEAD_BYTES`], at least `max_bytes / max_entries`, and moka keeps the
//! total weight within `max_bytes` — which then also caps the entries. The fill guard, stale
//! copies, per-key limiters and the hot-key sketch are bounded too (invariant I6).
//!
//! # Local hit cost: the per-thread front
//!
//! A hit through moka alone costs ~200 ns on the project's 2-core machine, about half of it in
//! moka's read path (hash lookup, read buffer, per-read clock, maintenance). In front of moka,
//! each reading thread keeps its last entries in 64 direct-mapped slots
//! ([`ConsumerBuilder::thread_front`], default on), so a thread re-reading a hot key costs
//! ~85-100 ns. Correctness does not depend on it: a front entry is tagged with a generation
//! read *before* the entry was read from moka, and every change that may make a remembered
//! entry wrong — each applied event batch (even one that evicted nothing: the key may have
//! left moka by size), each fill the fill-race guard removed again, each replacement, each
//! fail-safe clear — bumps the generation *after* the change. A front entry is served only at
//! its generation and before its own expiry (taken just before moka's), so it is exactly as
//! fresh as a moka hit at the same moment. Every 32nd hit of a slot reads moka anyway, so its
//! frequency sketch still sees the key as hot. Numbers: `docs/benchmarks.md`.
//!
//! # Metrics
//!
//! Through the [`metrics`](https://docs.rs/metrics) facade, so any installed recorder (e.g.
//! `metrics-exporter-prometheus`) exports them; every counter is also in [`Consumer::stats`].
//! Install the recorder **before** `build()`: the hit counter's handle is registered once at
//! build time (a local hit does not pay for the recorder's name lookup).
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `binval_consumer_hits_total` | counter | `get` served from the local cache |
//! | `binval_consumer_misses_total` | counter | `get` of a cacheable key not in the local cache |
//! | `binval_consumer_uncached_reads_total` | counter | `get` of a key the cache mode does not cache |
//! | `binval_consumer_bypass_reads_total` | counter | `get` while the fail-safe bypasses the cache |
//! | `binval_consumer_fills_total` | counter | fills that found a replica value (cached or not) |
//! | `binval_consumer_fills_refused_total` | counter | fills the fill-race guard did not cache |
//! | `binval_consumer_coalesced_total` | counter | misses that joined a fill in flight |
//! | `binval_consumer_limiter_rejections_total` | counter | fills refused by the miss rate limit |
//! | `binval_consumer_stale_served_total` | counter | `get` answered with a stale copy |
//! | `binval_consumer_tombstones_total` | counter | fills that found a tombstone |
//! | `binval_consumer_loader_fills_total` | counter | fills answered by the loader |
//! | `binval_consumer_loader_errors_total` | counter | loader calls that failed or timed out |
//! | `binval_consumer_refreshes_total` | counter | refresh-ahead fills started |
//! | `binval_consumer_events_total` | counter | invalidation events applied |
//! | `binval_consumer_evictions_total` | counter | events that removed a held entry |
//! | `binval_consumer_capacity_evictions_total` | counter | entries removed by the entry/byte bound |
//! | `binval_consumer_expirations_total` | counter | entries removed by their TTL |
//! | `binval_consumer_bad_messages_total` | counter | topic messages skipped (not an event) |
//! | `binval_consumer_invalidation_lag_ms{from}` | histogram | ms from the event's commit (`from="commit"`, binlog time, 1 s resolution) or publish (`from="publish"`) to its eviction here |
//! | `binval_consumer_serving_local` | gauge | 1 while serving locally, 0 while bypassed |
//! | `binval_consumer_hot_keys` | gauge | keys of the top K at or above the threshold |
//! | `binval_consumer_hot_key_reads_per_sec{key}` | gauge | estimated read rate of each top-K key (0 once it left the top) |
//!
//! The hot-key gauges are set once per hot-key window by the listener thread and on every
//! [`Consumer::hot_keys`] call; at most K `key` labels are non-zero at any time (a key that
//! left the top K stays exported at 0, so the label set grows with the churn of hot keys).
//!
//! # Not yet
//!
//! Negative caching of absent keys; cross-instance single-flight; a stale fallback on Redis
//! errors (only a rate-limit refusal falls back).

mod builder;
mod error;
mod front;
mod hot;
mod listener;
mod loader;
mod redis_conn;
mod state;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_protocol::{parse_version, replica_key, version_key, ReplicaRecord, Version};
use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};
use rand::seq::SliceRandom;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, oneshot};
use tracing::warn;

pub use builder::ConsumerBuilder;
pub use error::ConsumerError;
pub use hot::HotKey;
pub use loader::LoaderFuture;
pub use redis_conn::RedisTarget;
pub use state::{EvictionNotice, ENTRY_OVERHEAD_BYTES};
pub use stats::Stats;

use loader::LoaderFn;
use redis_conn::RedisConn;
use state::Shared;

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
    /// [`ConsumerBuilder::hot_key_threshold`] reads per second (see "Hot keys" in the crate
    /// docs). A key is judged when it misses; once cached it stays until an event, its TTL or
    /// the bounds remove it, and is judged again at its next miss.
    HotOnly,
}

/// The handle an app instance keeps: a local cache in front of binval's Redis replicas, kept
/// in step by a background invalidation listener. Cheap to clone (all clones share one cache
/// and one listener); create one per process with [`Consumer::builder`].
#[derive(Clone)]
pub struct Consumer {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    redis: RedisConn,
    default_replicas: u32,
    /// Sorted longest prefix first.
    prefix_replicas: Vec<(String, u32)>,
    mode: CacheMode,
    loader: Option<LoaderFn>,
    loader_timeout: Duration,
    cache_loaded: bool,
    /// Use the per-thread front ([`front`]).
    thread_front: bool,
    response_timeout: Duration,
    shutdown_timeout: Duration,
    stop: Arc<AtomicBool>,
    /// Single-flight: the fill in flight per key, with its id (so a finished fill removes only
    /// its own entry). An entry lives exactly as long as its fill task, which Redis timeouts
    /// bound, so the map holds at most one entry per key being filled right now.
    inflight: Mutex<HashMap<String, (u64, InflightFill)>>,
    next_fill_id: AtomicU64,
    done: Mutex<Option<oneshot::Receiver<()>>>,
    topic: String,
    group_id: String,
}

/// What one fill hands to every caller awaiting it: the value (and `true` if it is a stale
/// copy served because the rate limit refused the fill), `None` if the key has no row.
type FillOutcome = Result<Option<(Arc<str>, bool)>, ConsumerError>;
type InflightFill = SharedFuture<BoxFuture<'static, FillOutcome>>;

/// What the synchronous part of a read decided.
enum Lookup {
    /// A local hit.
    Hit(Arc<str>),
    /// Read through; `cache`: whether the fill may cache its value.
    Fill { cache: bool },
}

/// A value a fill found, with the version token read before it.
struct Found {
    value: Arc<str>,
    version: Version,
    /// `true` when the app-supplied loader produced it (every replica was missing).
    loaded: bool,
}

/// Removes a key's single-flight entry when its fill task ends (normally or by panic).
struct InflightGuard {
    consumer: Consumer,
    key: String,
    id: u64,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut map = self.consumer.inner.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            map.remove(&self.key);
        }
    }
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
    /// loader value; `None` is not cached).
    ///
    /// A local cache hit returns at once. A miss reads `K:ver` (absent = version 0), then
    /// `HMGET K:r{i} d t` of one random replica: a value is the answer; a tombstone means the
    /// row was deleted (`None`, no other replica or loader is asked); a missing replica sends
    /// the fill to another replica (each at most once), then to the loader if one is set
    /// ([`ConsumerBuilder::loader`]). The value is cached with the version unless the cache
    /// mode, the fill-race guard or the fail-safe forbids it. Each Redis read is bounded by
    /// the response timeout (default 200 ms) and never retried.
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
            Lookup::Hit(value) => Ok(Some(value)),
            // Boxed: keeps this future small, so a hit does not build (or move) the whole state
            // of a fill; the allocation is paid by misses only, next to a Redis round trip.
            Lookup::Fill { cache } => self.fill_single_flight(key, cache).boxed().await,
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

    /// The fill of `key` in flight, or a new one (spawned as a task at its first poll) that is
    /// registered for others to join. The flag is `true` when an existing fill was joined.
    fn flight(&self, key: &str, cache: bool) -> (InflightFill, bool) {
        let inner = &*self.inner;
        let mut map = inner.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, f)) = map.get(key) {
            return (f.clone(), true);
        }
        let id = inner.next_fill_id.fetch_add(1, Relaxed);
        let guard = InflightGuard { consumer: self.clone(), key: key.to_string(), id };
        // Spawned at the first poll (after the lock is released), never under the lock: the
        // guard's drop takes the lock.
        let fill: InflightFill = async move {
            let task = tokio::spawn(async move {
                let out = guard.consumer.fill(&guard.key, cache).await;
                drop(guard);
                out
            });
            match task.await {
                Ok(out) => out,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => Err(ConsumerError::Config {
                    field: "runtime",
                    reason: format!("fill task cancelled (tokio runtime shutting down?): {e}"),
                }),
            }
        }
        .boxed()
        .shared();
        map.insert(key.to_string(), (id, fill.clone()));
        (fill, false)
    }

    /// Join the fill of `key` in flight, or start one, and await its outcome.
    async fn fill_single_flight(&self, key: &str, cache: bool) -> Result<Option<Arc<str>>, ConsumerError> {
        let (fill, joined) = self.flight(key, cache);
        if joined {
            self.inner.shared.counters.coalesced();
        }
        match fill.await? {
            None => Ok(None),
            Some((value, stale)) => {
                if stale {
                    self.inner.shared.counters.stale_served();
                }
                Ok(Some(value))
            }
        }
    }

    /// Refresh-ahead: start a background fill of `key` (or join the one in flight) without
    /// waiting for it. Skipped outside a tokio runtime.
    fn start_refresh(&self, key: &str) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        self.inner.shared.counters.refresh();
        let (fill, _) = self.flight(key, true);
        rt.spawn(async move {
            let _ = fill.await;
        });
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

    /// The read-through on a miss: rate limit, version token, then a replica (then the
    /// loader); cache if `cache` and the guards allow it.
    async fn fill(&self, key: &str, cache: bool) -> FillOutcome {
        let inner = &*self.inner;
        let shared = &inner.shared;
        if !shared.limiter.admit(key) {
            shared.counters.limiter_rejection();
            return match shared.stale_copy(key) {
                Some(value) => Ok(Some((value, true))),
                None => Err(ConsumerError::Overloaded { key: key.to_string() }),
            };
        }
        let epoch = shared.epoch();
        let Some(found) = self.read_through(key).await? else {
            return Ok(None);
        };
        if !found.loaded {
            shared.counters.fill();
        }
        if cache && (!found.loaded || inner.cache_loaded) {
            shared.try_cache(key, &found.value, found.version, epoch);
        }
        Ok(Some((found.value, false)))
    }

    /// GET `K:ver`, then replicas in random order until one answers with a value or a
    /// tombstone; all missing: the loader, if any.
    async fn read_through(&self, key: &str) -> Result<Option<Found>, ConsumerError> {
        let inner = &*self.inner;
        let vkey = version_key(key);
        let raw = inner.redis.get(&vkey, inner.response_timeout).await?;
        let version =
            parse_version(raw.as_deref()).map_err(|reason| ConsumerError::Decode { key: vkey.clone(), what: "version token", reason })?;
        let n = self.replicas_for(key);
        let mut order: Vec<u32> = (0..n).collect();
        order.shuffle(&mut rand::rng());
        for i in order {
            let rkey = replica_key(key, i);
            match inner.redis.replica(&rkey, inner.response_timeout).await? {
                ReplicaRecord::Value(bytes) => {
                    let text = String::from_utf8(bytes).map_err(|e| ConsumerError::Decode {
                        key: rkey.clone(),
                        what: "replica",
                        reason: format!("payload (field `d`) is not UTF-8: {e}"),
                    })?;
                    return Ok(Some(Found { value: Arc::from(text), version, loaded: false }));
                }
                ReplicaRecord::Deleted => {
                    inner.shared.counters.tombstone();
                    return Ok(None);
                }
                ReplicaRecord::Missing => {}
            }
        }
        let Some(loader) = &inner.loader else { return Ok(None) };
        let counters = &inner.shared.counters;
        match tokio::time::timeout(inner.loader_timeout, loader.call(key)).await {
            Ok(Ok(Some(text))) => {
                counters.loader_fill();
                Ok(Some(Found { value: Arc::from(text), version, loaded: true }))
            }
            Ok(Ok(None)) => Ok(None),
            Ok(Err(reason)) => {
                counters.loader_error();
                Err(ConsumerError::Loader { key: key.to_string(), reason })
            }
            Err(_) => {
                counters.loader_error();
                Err(ConsumerError::Timeout { op: format!("loader for `{key}`"), after_ms: inner.loader_timeout.as_millis() as u64 })
            }
        }
    }

    /// The replica count N used for `key`: the longest matching
    /// [`ConsumerBuilder::replicas_for_prefix`], else [`ConsumerBuilder::replicas`].
    pub fn replicas_for(&self, key: &str) -> u32 {
        self.inner.prefix_replicas.iter().find(|(p, _)| key.starts_with(p.as_str())).map_or(self.inner.default_replicas, |(_, n)| *n)
    }

    /// The version the local cache holds `key` at, if it holds it; does not count as a hit or
    /// miss. For tests, debugging and `inspect`-style tooling.
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
    /// payload length + [`ENTRY_OVERHEAD_BYTES`] each, at least `max_bytes / max_entries`;
    /// see [`ConsumerBuilder::max_bytes`]). Without a byte bound every entry weighs 1 and this
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

    /// A snapshot of the counters (since `build()`).
    pub fn stats(&self) -> Stats {
        self.inner.shared.counters.snapshot()
    }

    /// `true` while `get` may serve from and fill into the local cache; `false` while the
    /// fail-safe bypasses it (invalidation stream lost, listener ended, or after
    /// [`Consumer::shutdown`]). See the crate docs, "Fail safe".
    pub fn is_serving_local(&self) -> bool {
        self.inner.shared.is_serving_local()
    }

    /// The listener's Kafka `group.id` (unique per instance; no group join, no commits).
    pub fn group_id(&self) -> &str {
        &self.inner.group_id
    }

    /// The invalidation topic this consumer listens to.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// Stop the listener and wait for it and librdkafka's teardown, at most the shutdown
    /// timeout (default 5 s; teardown that takes longer is abandoned with a warning). Afterwards
    /// `get` still works but reads Redis every time. Calling it again returns at once.
    pub async fn shutdown(&self) {
        let inner = &*self.inner;
        inner.stop.store(true, SeqCst);
        inner.shared.stop_serving_local();
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
