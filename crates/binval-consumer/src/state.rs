//! State shared by the read path (`get`) and the invalidation listener thread: the local cache,
//! the fill-race guard, the fail-safe flag and the counters. Every decision that involves both
//! sides lives here, so the orderings that make them correct are in one place.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use binval_protocol::batch::BatchView;
use binval_protocol::{should_evict, InvalidationEvent, Version};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use moka::notification::RemovalCause;
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use moka::Expiry;
use tokio::sync::broadcast;

use crate::fail_safe::FailSafe;
use crate::hot::{HotKeys, HotSettings};
use crate::single_flight::SingleFlight;
use crate::stats::Counters;

/// One local cache entry: the payload text (`None`: "no row", a cached tombstone or missing
/// key), the fence position it was written at (the version it is cached at), the entry's own
/// time to live (drawn with jitter at the fill, or the short TTL of a missing key) and, with
/// refresh-ahead, when a background refresh becomes due.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub value: Option<Arc<str>>,
    pub version: Version,
    pub ttl: Duration,
    /// Fill time + `ttl`, taken just before the insert (so never later than moka's own expiry);
    /// what the per-thread front checks.
    pub expires_at: Instant,
    /// `Some` only with [`crate::ConsumerBuilder::refresh_ahead`].
    pub refresh: Option<Arc<RefreshMark>>,
}

/// When an entry's refresh-ahead is due, and whether it was started (once per entry).
#[derive(Debug)]
pub(crate) struct RefreshMark {
    pub at: Instant,
    pub started: AtomicBool,
}

impl RefreshMark {
    /// `true` exactly once, for the first caller that finds the refresh due at `now`.
    #[inline]
    pub(crate) fn claim(&self, now: Instant) -> bool {
        !self.started.load(Relaxed) && now >= self.at && !self.started.swap(true, SeqCst)
    }
}

/// Estimated bytes one entry costs besides its key and payload text: the entry itself, the
/// `Arc` headers, and moka's per-entry node and access-order bookkeeping (measured roughly;
/// an estimate, not an accounting).
pub const ENTRY_OVERHEAD_BYTES: u64 = 160;

/// The weight of an entry in the local cache, in bytes: key length + payload length +
/// [`ENTRY_OVERHEAD_BYTES`], but at least `floor`. With `floor = max_bytes / max_entries` and a
/// capacity of `max_bytes`, the cache holds at most `max_bytes` (estimated) bytes *and* at most
/// `max_entries` entries: moka bounds one total weight, and the floor turns the entry bound
/// into a weight bound.
pub(crate) fn entry_weight(key: &str, e: &Entry, floor: u64) -> u32 {
    let bytes = key.len() as u64 + e.value.as_ref().map_or(0, |v| v.len() as u64) + ENTRY_OVERHEAD_BYTES;
    bytes.max(floor).min(u64::from(u32::MAX)) as u32
}

/// Bounds of the local cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub max_entries: u64,
    /// `None` = bounded by entries only.
    pub max_bytes: Option<u64>,
}

/// Sent on [`crate::Consumer::subscribe_evictions`] for every invalidation event the listener
/// applied, whether or not it removed an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionNotice {
    /// The logical key of the event.
    pub key: String,
    /// The event's version (the value of the version token after the change).
    pub version: Version,
    /// `true` when this instance held an entry for `key` with an older version and removed it.
    pub evicted: bool,
    /// The event's commit time from the binlog, Unix epoch ms (whole seconds).
    pub commit_time_ms: u64,
    /// When binval handed the event to its producer, Unix epoch ms.
    pub publish_time_ms: u64,
    /// When this instance's listener applied the event, Unix epoch ms.
    pub received_at_ms: u64,
}

/// Per-entry time to live of the local cache: `ttl` scaled by a factor drawn uniformly from
/// `[1 - jitter, 1 + jitter]` at every insert or replacement, so entries filled together do not
/// all expire (and refill) together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JitteredTtl {
    pub ttl: Duration,
    /// Fraction, `0.0 <= jitter < 1.0`; 0 = every entry lives exactly `ttl`.
    pub jitter: f64,
}

impl JitteredTtl {
    pub(crate) fn sample(&self) -> Duration {
        if self.jitter <= 0.0 {
            return self.ttl;
        }
        let f = rand::random_range(-self.jitter..=self.jitter);
        self.ttl.mul_f64(1.0 + f)
    }
}

/// Each entry lives its own `ttl`, drawn (with jitter) when it was filled.
struct EntryTtl;

impl Expiry<String, Entry> for EntryTtl {
    fn expire_after_create(&self, _key: &String, value: &Entry, _created_at: Instant) -> Option<Duration> {
        Some(value.ttl)
    }

    /// A replacement (a newer fill of the same key, or a refresh) gets its own fresh TTL.
    fn expire_after_update(
        &self,
        _key: &String,
        value: &Entry,
        _updated_at: Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// The hasher of the local cache: foldhash (seeded per process), several times cheaper than
/// the default SipHash on the read path of every hit. Keys are app keys; foldhash's seeding
/// keeps collisions unpredictable from outside.
pub(crate) type LocalHasher = foldhash::fast::RandomState;

pub(crate) struct Shared {
    /// Process-unique id of this consumer (owner tag of its per-thread front entries).
    pub id: u64,
    /// Generation of the per-thread front ([`crate::front`]): bumped after every change that
    /// may make a remembered entry wrong.
    front_gen: AtomicU64,
    pub local: Cache<String, Entry, LocalHasher>,
    ttl: JitteredTtl,
    /// Fraction of an entry's TTL after which a hit starts a background refresh.
    refresh_ahead: Option<f64>,
    /// Last known value of recently evicted entries (only when a miss rate limit is set).
    stale: Option<Cache<String, Arc<str>>>,
    pub limiter: Limiter,
    /// Newest event version seen per recently invalidated key (the fill-race guard).
    pub guard: Cache<String, Version>,
    /// The same for table-wide invalidations (`truncate` events): key prefix -> version, kept
    /// as long as the per-key guard (`guard_ttl`).
    prefix_guard: std::sync::RwLock<Vec<(String, Version, Instant)>>,
    guard_ttl: Duration,
    /// Keys that every replica read of a fill found missing (at least two masters asked),
    /// kept as long as the fill-race guard: their next fill reads one replica (see
    /// [`crate::ConsumerBuilder::max_replica_reads`]). An event of the key removes it.
    pub confirmed_missing: Cache<String, (), LocalHasher>,
    /// When a key was last marked confirmed missing ([`Shared::mark_confirmed_missing`]), ns
    /// since `created`; `u64::MAX`: never. Entries live `guard_ttl`, so once that has passed
    /// since the last mark the map is empty, and the batched listener skips its lookups.
    confirmed_missing_at: AtomicU64,
    /// When this state was created (the base of `confirmed_missing_at`).
    created: Instant,
    pub counters: Arc<Counters>,
    /// Read counter for hot-key detection (`None` when detection is off).
    pub hot: Option<HotKeys>,
    /// `true` while `get` may serve from, and fill into, the local cache.
    serving_local: AtomicBool,
    /// Bumped on every fail-safe transition and cache clear; a fill that started in an older
    /// epoch must not leave an entry behind.
    epoch: AtomicU64,
    pub notices: broadcast::Sender<EvictionNotice>,
    /// The lag of the stream and the decision to serve locally (`fail_safe.rs`).
    pub fail_safe: FailSafe,
    /// Single-flight: the fill in flight per key (`single_flight.rs`). Here, not in the
    /// consumer, because the batched listener asks it which keys are being filled
    /// ([`Shared::apply_batch_view`]).
    pub inflight: SingleFlight,
    /// Raise the fill-race guard for every key of a batch, cached or not
    /// ([`crate::ConsumerBuilder::read_from_replica_nodes`]: a fill that starts after the event
    /// may still read a replica node that has not received the change).
    guard_every_key: bool,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Everything [`Shared::new`] needs.
pub(crate) struct SharedSettings {
    pub bounds: Bounds,
    pub ttl: JitteredTtl,
    pub refresh_ahead: Option<f64>,
    pub guard_entries: u64,
    pub guard_ttl: Duration,
    pub notice_capacity: usize,
    pub limits: LimitSettings,
    pub hot: Option<HotSettings>,
    /// The fail safe's lag bound ([`crate::ConsumerBuilder::max_staleness`]).
    pub max_staleness: Option<Duration>,
    /// The source lag counts from the start ([`crate::ConsumerBuilder::require_progress`]).
    pub require_progress: bool,
    /// See [`Shared::apply_batch_view`]: on with reads from replica nodes.
    pub guard_every_key: bool,
}

impl SharedSettings {
    /// A cache of `max_entries` with a 60 s TTL (no jitter), a fill-race guard of
    /// `guard_entries` for 30 s, `notice_capacity` notices, no miss rate limit, no hot-key
    /// detection and no staleness bound: what the unit tests and the `apply_batch` bench
    /// start from (`SharedSettings { field: .., ..SharedSettings::plain(..) }`).
    pub(crate) fn plain(max_entries: u64, guard_entries: u64, notice_capacity: usize) -> Self {
        SharedSettings {
            bounds: Bounds { max_entries, max_bytes: None },
            ttl: JitteredTtl { ttl: Duration::from_secs(60), jitter: 0.0 },
            refresh_ahead: None,
            guard_entries,
            guard_ttl: Duration::from_secs(30),
            notice_capacity,
            limits: LimitSettings {
                per_instance: None,
                per_key: None,
                stale_ttl: Duration::from_secs(1),
                stale_entries: 1,
                key_limiter_entries: 1,
            },
            hot: None,
            max_staleness: None,
            require_progress: false,
            guard_every_key: false,
        }
    }
}

impl Shared {
    pub(crate) fn new(s: SharedSettings) -> Self {
        let (notices, _) = broadcast::channel(s.notice_capacity.max(1));
        let counters = Arc::new(Counters::registered());
        counters.serving_local(true);
        let limits = s.limits;
        let stale: Option<Cache<String, Arc<str>>> =
            limits.enabled().then(|| Cache::builder().max_capacity(limits.stale_entries.max(1)).time_to_live(limits.stale_ttl).build());
        let mut local = Cache::builder().expire_after(EntryTtl);
        local = match s.bounds.max_bytes {
            None => local.max_capacity(s.bounds.max_entries),
            Some(bytes) => {
                let floor = bytes.div_ceil(s.bounds.max_entries.max(1));
                local.max_capacity(bytes).weigher(move |k: &String, e: &Entry| entry_weight(k, e, floor))
            }
        };
        let (stale_l, counters_l) = (stale.clone(), counters.clone());
        let local = local
            .eviction_listener(move |k: Arc<String>, e: Entry, cause| {
                match cause {
                    RemovalCause::Size => counters_l.capacity_eviction(),
                    RemovalCause::Expired => counters_l.expiration(),
                    _ => {}
                }
                // Entries removed by an event, by clearing, or by their TTL leave a stale copy
                // (size evictions do not: those are cold keys).
                if let (Some(stale), Some(value)) = (&stale_l, e.value) {
                    if matches!(cause, RemovalCause::Explicit | RemovalCause::Expired) {
                        stale.insert(String::clone(&k), value);
                    }
                }
            })
            .build_with_hasher(LocalHasher::default());
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Shared {
            id: NEXT_ID.fetch_add(1, SeqCst),
            front_gen: AtomicU64::new(0),
            local,
            ttl: s.ttl,
            refresh_ahead: s.refresh_ahead,
            stale,
            limiter: Limiter::new(&limits),
            guard: Cache::builder().max_capacity(s.guard_entries).time_to_live(s.guard_ttl).build(),
            prefix_guard: std::sync::RwLock::new(Vec::new()),
            guard_ttl: s.guard_ttl,
            confirmed_missing: Cache::builder()
                .max_capacity(s.guard_entries)
                .time_to_live(s.guard_ttl)
                .build_with_hasher(LocalHasher::default()),
            confirmed_missing_at: AtomicU64::new(u64::MAX),
            created: Instant::now(),
            counters,
            hot: s.hot.map(HotKeys::new),
            serving_local: AtomicBool::new(true),
            epoch: AtomicU64::new(0),
            notices,
            fail_safe: FailSafe::with_progress(s.max_staleness, s.require_progress),
            inflight: SingleFlight::default(),
            guard_every_key: s.guard_every_key,
        }
    }

    /// The current generation of the per-thread front.
    #[inline]
    pub(crate) fn front_gen(&self) -> u64 {
        self.front_gen.load(SeqCst)
    }

    /// Invalidate every thread's front entries of this consumer (after the change is done).
    fn bump_front(&self) {
        self.front_gen.fetch_add(1, SeqCst);
    }

    #[inline]
    pub(crate) fn is_serving_local(&self) -> bool {
        self.serving_local.load(SeqCst)
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(SeqCst)
    }

    /// Fail-safe: the invalidation stream is lost (or the listener ended). From now on `get`
    /// bypasses the local cache. Returns `true` if this was a transition.
    pub(crate) fn stop_serving_local(&self) -> bool {
        let was = self.serving_local.swap(false, SeqCst);
        self.epoch.fetch_add(1, SeqCst);
        self.local.invalidate_all();
        self.bump_front();
        if was {
            self.counters.serving_local(false);
        }
        was
    }

    /// Fail-safe: the stream is back. Clear everything that may have missed an event, then
    /// serve locally again. Returns `true` if this was a transition.
    pub(crate) fn resume_serving_local(&self) -> bool {
        if self.serving_local.load(SeqCst) {
            return false;
        }
        self.epoch.fetch_add(1, SeqCst);
        self.local.invalidate_all();
        self.bump_front();
        self.serving_local.store(true, SeqCst);
        self.counters.serving_local(true);
        true
    }

    /// Drop every local entry (and every fill in flight) while going on serving locally: for a
    /// gap in the stream, where some events were never read. Same steps as a stop and resume,
    /// without the window in which reads bypass the cache.
    pub(crate) fn clear_local(&self) {
        self.epoch.fetch_add(1, SeqCst);
        self.local.invalidate_all();
        self.bump_front();
    }

    /// The stale copy of `key`, if one is held. Flushes moka's pending expirations first if
    /// none is found, so an entry whose TTL just ran out has left its copy.
    pub(crate) fn stale_copy(&self, key: &str) -> Option<Arc<str>> {
        let stale = self.stale.as_ref()?;
        if let Some(v) = stale.get(key) {
            return Some(v);
        }
        self.local.run_pending_tasks();
        stale.get(key)
    }

    fn guard_refuses(&self, key: &str, version: Version) -> bool {
        if self.guard.get(key).is_some_and(|newest| version < newest) {
            return true;
        }
        let prefixes = self.prefix_guard.read().unwrap_or_else(|e| e.into_inner());
        prefixes.iter().any(|(p, v, _)| version < *v && key.starts_with(p.as_str()))
    }

    /// A `truncate` event: every key of a template is stale at `version`. Raise the prefix
    /// guard, then evict every cached key with the template's literal prefix and an older
    /// version. Returns the number of entries evicted.
    fn apply_truncate(&self, template: &str, version: Version) -> u64 {
        // A template that does not parse (a newer writer?) degrades to "everything".
        let prefix = binval_protocol::KeyTemplate::parse(template).map(|t| t.literal_prefix().to_string()).unwrap_or_default();
        {
            let mut g = self.prefix_guard.write().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            g.retain(|(_, _, at)| now.duration_since(*at) < self.guard_ttl);
            g.push((prefix.clone(), version, now));
        }
        let victims: Vec<Arc<String>> =
            self.local.iter().filter(|(k, e)| k.starts_with(prefix.as_str()) && should_evict(e.version, version)).map(|(k, _)| k).collect();
        let mut n = 0;
        for k in victims {
            if let CompResult::Removed(e) = self.local.entry_by_ref(k.as_str()).and_compute_with(|cur| match cur {
                Some(e) if should_evict(e.value().version, version) => Op::Remove,
                _ => Op::Nop,
            }) {
                if let (Some(stale), Some(value)) = (&self.stale, e.into_value().value) {
                    stale.insert(k.to_string(), value);
                }
                n += 1;
            }
        }
        n
    }

    /// A new entry for a fill: its TTL drawn with jitter (or `ttl`, for a missing key), its
    /// refresh-ahead mark.
    fn new_entry(&self, value: Option<&Arc<str>>, version: Version, ttl: Option<Duration>) -> Entry {
        let ttl = ttl.unwrap_or_else(|| self.ttl.sample());
        let now = Instant::now();
        let refresh = self.refresh_ahead.map(|f| Arc::new(RefreshMark { at: now + ttl.mul_f64(1.0 - f), started: AtomicBool::new(false) }));
        Entry { value: value.cloned(), version, ttl, expires_at: now + ttl, refresh }
    }

    /// Cache a fill of `key` found at `version` (`value` `None`: "no row"; `ttl` `Some`: the
    /// entry's own TTL instead of the jittered one), unless the fill-race guard or a fail-safe
    /// transition since `epoch` says it may be stale. Returns `true` if it stayed cached.
    ///
    /// Ordering argument: the listener (1) raises the guard, then (2) evicts. The fill
    /// (a) inserts, then (b) re-checks the guard. If (2) did not see the insert, (2) ran before
    /// (a), so (1) ran before (b) and (b) sees the raised guard and removes the entry.
    pub(crate) fn try_cache(&self, key: &str, value: Option<&Arc<str>>, version: Version, epoch: u64, ttl: Option<Duration>) -> bool {
        if self.guard_refuses(key, version) {
            self.counters.fill_refused();
            return false;
        }
        let entry = self.new_entry(value, version, ttl);
        let same = |e: &Entry| match (&e.value, value) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let put = self.local.entry_by_ref(key).and_compute_with(|cur| match cur {
            // A concurrent fill already cached a newer pair: keep it.
            Some(e) if e.value().version > version => Op::Nop,
            _ => Op::Put(entry),
        });
        if matches!(put, CompResult::ReplacedWith(_) | CompResult::Inserted(_)) {
            // A refresh or a newer fill cached a value: threads' fronts should not keep serving
            // an older one (not wrong — no event touched it — just older). Also on `Inserted`:
            // a front may remember an entry that left moka without a bump (dropped for size),
            // and moka's Inserted/ReplacedWith is decided from a snapshot taken before the put,
            // which a concurrent removal can make wrong (moka-rs/moka#593). Fills are rare next
            // to hits, so one bump per cached fill costs each thread a moka read per slot.
            self.bump_front();
        }
        let refused = self.guard_refuses(key, version);
        if refused || self.epoch() != epoch || !self.is_serving_local() {
            self.local.entry_by_ref(key).and_compute_with(|cur| match cur {
                Some(e) if e.value().version == version && same(e.value()) => Op::Remove,
                _ => Op::Nop,
            });
            // A reader may have copied the entry into its front between insert and removal.
            self.bump_front();
            if refused {
                self.counters.fill_refused();
            }
            return false;
        }
        true
    }

    /// Apply a batch of invalidation events, in order: per distinct key, raise the fill-race
    /// guard to the batch's newest version of that key, then evict by the evict rule once;
    /// then count, record the lag, and notify subscribers (one notice per event; `evicted` is
    /// set on the event whose version did the eviction, the newest of its key in the batch).
    ///
    /// Readers are never blocked: the local cache and the guard are concurrent maps, and each
    /// key is touched by one short atomic compute. A burst of changes of one key (a hot row
    /// updated in a loop) costs one eviction per batch, not one per change.
    pub(crate) fn apply_batch(&self, events: &[InvalidationEvent]) -> Vec<EvictionNotice> {
        // Newest version per key in this batch, and the index of the event that carries it.
        let mut newest: HashMap<&str, (Version, usize)> = HashMap::with_capacity(events.len());
        let mut truncated = 0u64;
        for (i, ev) in events.iter().enumerate() {
            if ev.op == binval_protocol::Op::Truncate {
                truncated += self.apply_truncate(&ev.key, ev.version);
                continue;
            }
            let e = newest.entry(ev.key.as_str()).or_insert((ev.version, i));
            if ev.version > e.0 {
                *e = (ev.version, i);
            }
        }
        let mut evicted_at = vec![false; events.len()];
        for (key, (v, i)) in &newest {
            let v = *v;
            self.guard.entry_by_ref(*key).and_compute_with(|cur| match cur {
                Some(e) if *e.value() >= v => Op::Nop,
                _ => Op::Put(v),
            });
            // The key was written: its next fill asks every master the bound allows again.
            self.confirmed_missing.invalidate(*key);
            if let CompResult::Removed(e) = self.local.entry_by_ref(*key).and_compute_with(|cur| match cur {
                Some(e) if should_evict(e.value().version, v) => Op::Remove,
                _ => Op::Nop,
            }) {
                // Keep the last known value for the stale fallback of the miss rate limit.
                if let (Some(stale), Some(value)) = (&self.stale, e.into_value().value) {
                    stale.insert(key.to_string(), value);
                }
                evicted_at[*i] = true;
            }
        }
        // After the evictions, and for every batch: a thread's front may remember an entry of
        // one of these keys that already left moka (by size), which no eviction above saw.
        self.bump_front();
        let applied_at_ms = now_ms();
        let evictions = evicted_at.iter().filter(|e| **e).count() as u64 + truncated;
        self.counters.events(events.len() as u64, evictions);
        let subscribed = self.notices.receiver_count() > 0;
        events
            .iter()
            .zip(evicted_at)
            .map(|(ev, evicted)| {
                self.counters.lag(applied_at_ms, ev.commit_time_ms, ev.publish_time_ms);
                let notice = EvictionNotice {
                    key: ev.key.clone(),
                    version: ev.version,
                    evicted,
                    commit_time_ms: ev.commit_time_ms,
                    publish_time_ms: ev.publish_time_ms,
                    received_at_ms: applied_at_ms,
                };
                if subscribed {
                    let _ = self.notices.send(notice.clone());
                }
                notice
            })
            .collect()
    }
}

mod batch;
mod limiter;
pub(crate) use batch::BatchScratch;
pub(crate) use limiter::{LimitSettings, Limiter};

#[cfg(test)]
mod tests;
