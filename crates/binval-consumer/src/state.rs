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

/// Settings of the miss rate limit and its stale fallback.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitSettings {
    /// Fills per second of the whole instance (burst: the same number); `None` = no limit.
    pub per_instance: Option<NonZeroU32>,
    /// Fills per second of one key (burst: the same number); `None` = no limit.
    pub per_key: Option<NonZeroU32>,
    /// How long the stale copy of an evicted entry is kept.
    pub stale_ttl: Duration,
    /// Bound of the stale copies, entries.
    pub stale_entries: u64,
    /// Bound of the per-key limiter states, entries.
    pub key_limiter_entries: u64,
}

impl LimitSettings {
    fn enabled(&self) -> bool {
        self.per_instance.is_some() || self.per_key.is_some()
    }
}

/// The miss rate limit: an optional instance-wide GCRA limiter and optional per-key ones.
/// Per-key states live in a bounded moka cache and are dropped after 1 s without use — a
/// limiter idle that long has refilled its whole burst, so dropping it changes nothing.
pub(crate) struct Limiter {
    per_instance: Option<DefaultDirectRateLimiter>,
    per_key: Option<(Quota, Cache<String, Arc<DefaultDirectRateLimiter>>)>,
}

impl Limiter {
    fn new(s: &LimitSettings) -> Self {
        Limiter {
            per_instance: s.per_instance.map(|n| RateLimiter::direct(Quota::per_second(n))),
            per_key: s.per_key.map(|n| {
                let states = Cache::builder().max_capacity(s.key_limiter_entries).time_to_idle(Duration::from_secs(1)).build();
                (Quota::per_second(n), states)
            }),
        }
    }

    /// `true` if a fill of `key` may read Redis now (and uses up one cell of each limit).
    /// The per-key limit is checked first, so a hot key that is over its own limit does not
    /// use up the instance-wide budget.
    pub(crate) fn admit(&self, key: &str) -> bool {
        if let Some((quota, states)) = &self.per_key {
            let l = states.get_with_by_ref(key, || Arc::new(RateLimiter::direct(*quota)));
            if l.check().is_err() {
                return false;
            }
        }
        if let Some(l) = &self.per_instance {
            if l.check().is_err() {
                return false;
            }
        }
        true
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

/// Scratch space of [`Shared::apply_batch_view`], kept by the listener between messages so
/// applying a batch allocates nothing in the steady state.
#[derive(Default)]
pub(crate) struct BatchScratch {
    /// Per change: a fill of its key was registered when the batch was taken.
    filling: Vec<bool>,
}

impl Shared {
    /// Apply one batch message ([`binval_protocol::batch`]) in one pass over its changes, in
    /// order. Per change (not `truncate`), the key is looked up by `&str` borrowed from the
    /// payload, without allocating, and only a key that this instance may hold or be about to
    /// hold is applied as [`Shared::apply_batch`] applies a per-key event (fill-race guard
    /// raised, confirmed-missing mark dropped, entry evicted by the evict rule, a stale copy
    /// kept): a key cached, a key whose fill is in flight, or a key confirmed missing. Any
    /// other key costs a few hash lookups and nothing else. A `truncate` change is applied
    /// like a `truncate` event. Returns the notices (only built when someone subscribed, or
    /// when `want_notices`).
    ///
    /// Why skipping the guard of a key nobody caches or fills is exact: the fills in flight
    /// are read first, under the single-flight lock, at a time `T` after the message arrived,
    /// so after every Redis write of its changes (binval enqueues a group's messages only after
    /// its writes, I1). A fill registered at `T` gets the full treatment; one that registers
    /// later reads Redis after `T`, so it reads this change or a newer one and caches a
    /// version the guard would not have refused; one that ended before `T` left its entry in
    /// the cache, where the lookup after `T` finds (and evicts) it. What the guard
    /// additionally covered for such keys is a fill reading a copy that lacks an already
    /// acknowledged write: a replica node behind its master (so with
    /// [`crate::ConsumerBuilder::read_from_replica_nodes`] every key is guarded, as in the
    /// per-key path) or a master that lost acknowledged writes in a failover; the entry TTL
    /// bounds those.
    pub(crate) fn apply_batch_view(&self, b: &BatchView<'_>, scratch: &mut BatchScratch, want_notices: bool) -> Vec<EvictionNotice> {
        let filling = self.inflight.registered(b.changes().map(|c| c.key), &mut scratch.filling);
        let any_missing = self.may_hold_confirmed_missing();
        let applied_at_ms = now_ms();
        let subscribed = want_notices || self.notices.receiver_count() > 0;
        let mut notices = Vec::new();
        let (mut evictions, mut n) = (0u64, 0u64);
        // Lag, recorded once per transaction for all of its changes: (commit time, changes).
        let mut lag_of: Option<(u64, usize)> = None;
        for (i, c) in b.changes().enumerate() {
            n += 1;
            match &mut lag_of {
                Some((t, k)) if *t == c.txn.commit_time_ms => *k += 1,
                _ => {
                    if let Some((t, k)) = lag_of {
                        self.counters.lag_many(applied_at_ms, t, b.publish_time_ms, k);
                    }
                    lag_of = Some((c.txn.commit_time_ms, 1));
                }
            }
            let evicted = if c.op == binval_protocol::Op::Truncate {
                let e = self.apply_truncate(c.key, c.version);
                evictions += e;
                e > 0
            } else {
                let in_flight = filling && scratch.filling.get(i).copied().unwrap_or(true);
                let interesting = self.guard_every_key
                    || in_flight
                    || self.local.contains_key(c.key)
                    || (any_missing && self.confirmed_missing.contains_key(c.key));
                let evicted = interesting && self.apply_key(c.key, c.version);
                evictions += evicted as u64;
                evicted
            };
            if subscribed {
                let notice = EvictionNotice {
                    key: c.key.to_string(),
                    version: c.version,
                    evicted,
                    commit_time_ms: c.txn.commit_time_ms,
                    publish_time_ms: b.publish_time_ms,
                    received_at_ms: applied_at_ms,
                };
                notices.push(notice);
            }
        }
        if let Some((t, k)) = lag_of {
            self.counters.lag_many(applied_at_ms, t, b.publish_time_ms, k);
        }
        // As after every per-key batch: a thread's front may remember an entry of one of these
        // keys that already left moka (by size).
        self.bump_front();
        self.counters.events(n, evictions);
        // Last, as on the per-key path: whoever sees a notice finds the front forgotten and
        // the batch counted.
        if self.notices.receiver_count() > 0 {
            for notice in &notices {
                let _ = self.notices.send(notice.clone());
            }
        }
        notices
    }

    /// Mark `key` confirmed missing (every replica a fill read was missing, see `read.rs`).
    pub(crate) fn mark_confirmed_missing(&self, key: &str) {
        // Before the insert: the entry expires `guard_ttl` after the insert, so never before
        // `guard_ttl` after this time.
        let at = self.created.elapsed().as_nanos().min(u128::from(u64::MAX - 1)) as u64;
        self.confirmed_missing_at.store(at, SeqCst);
        self.confirmed_missing.insert(key.to_string(), ());
    }

    /// `false` only when no key can be marked confirmed missing now: none was ever, or the
    /// last mark is more than `guard_ttl` (and a second of margin) old.
    fn may_hold_confirmed_missing(&self) -> bool {
        let at = self.confirmed_missing_at.load(SeqCst);
        if at == u64::MAX {
            return false;
        }
        let age = self.created.elapsed().saturating_sub(Duration::from_nanos(at));
        age <= self.guard_ttl + Duration::from_secs(1)
    }

    /// One key's change at version `v`, as [`Shared::apply_batch`] applies it: raise the
    /// fill-race guard, drop the confirmed-missing mark, evict by the evict rule (keeping a
    /// stale copy). Returns whether an entry was evicted.
    fn apply_key(&self, key: &str, v: Version) -> bool {
        self.guard.entry_by_ref(key).and_compute_with(|cur| match cur {
            Some(e) if *e.value() >= v => Op::Nop,
            _ => Op::Put(v),
        });
        self.confirmed_missing.invalidate(key);
        if let CompResult::Removed(e) = self.local.entry_by_ref(key).and_compute_with(|cur| match cur {
            Some(e) if should_evict(e.value().version, v) => Op::Remove,
            _ => Op::Nop,
        }) {
            if let (Some(stale), Some(value)) = (&self.stale, e.into_value().value) {
                stale.insert(key.to_string(), value);
            }
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use binval_protocol::{Op as EvOp, SourcePosition};

    fn shared() -> Shared {
        Shared::new(SharedSettings::plain(100, 100, 16))
    }

    fn ev(key: &str, version: Version) -> InvalidationEvent {
        InvalidationEvent {
            schema: 1,
            key: key.into(),
            version,
            op: EvOp::Update,
            table: "a.b".into(),
            position: SourcePosition::default(),
            commit_time_ms: 0,
            publish_time_ms: 0,
        }
    }

    /// A `truncate` event evicts every older key of the template's prefix, refuses older fills
    /// of such keys afterwards, and leaves other keys and newer entries alone.
    #[test]
    fn truncate_evicts_by_prefix_and_guards_fills() {
        let s = shared();
        let v: Arc<str> = Arc::from("x");
        assert!(s.try_cache("p:item:1", Some(&v), 5, s.epoch(), None));
        assert!(s.try_cache("p:item:2", Some(&v), 12, s.epoch(), None));
        assert!(s.try_cache("p:tag:1", Some(&v), 5, s.epoch(), None));
        let mut t = ev("p:item:{id}", 10);
        t.op = EvOp::Truncate;
        s.apply_batch(&[t]);
        assert!(s.local.get("p:item:1").is_none(), "older entry of the table evicted");
        assert!(s.local.get("p:item:2").is_some(), "entry newer than the truncate stays");
        assert!(s.local.get("p:tag:1").is_some(), "other prefix stays");
        assert!(!s.try_cache("p:item:3", Some(&v), 9, s.epoch(), None), "a fill older than the truncate is refused");
        assert!(s.try_cache("p:item:3", Some(&v), 10, s.epoch(), None), "a fill at or after it is cached");
        assert!(s.try_cache("p:tag:2", Some(&v), 9, s.epoch(), None));
    }

    /// The front remembers an entry the local cache no longer holds (dropped for size); an
    /// event of that key evicts nothing from the cache, and must still invalidate the front.
    #[test]
    fn every_batch_invalidates_the_front() {
        let s = shared();
        let v: Arc<str> = Arc::from("old");
        assert!(s.try_cache("k", Some(&v), 1, s.epoch(), None));
        let gen = s.front_gen();
        let e = s.local.get("k").unwrap();
        crate::front::put(s.id, gen, "k", &e);
        s.local.invalidate("k"); // as a size eviction would
        let now = Instant::now();
        assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_some());
        let notices = s.apply_batch(&[ev("k", 2)]);
        assert!(!notices[0].evicted, "nothing left in the cache to evict");
        assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_none(), "front still serves after the event");
    }

    /// The front remembers an entry the local cache dropped (for size); a newer fill of the key
    /// is an insert, not a replacement, and must still invalidate the front, so the next read
    /// sees the newer value.
    #[test]
    fn a_fill_after_a_size_drop_invalidates_the_front() {
        let s = shared();
        let (old, new): (Arc<str>, Arc<str>) = (Arc::from("v1"), Arc::from("v2"));
        assert!(s.try_cache("k", Some(&old), 1, s.epoch(), None));
        let gen = s.front_gen();
        crate::front::put(s.id, gen, "k", &s.local.get("k").unwrap());
        s.local.invalidate("k"); // as a size eviction would
        assert!(s.try_cache("k", Some(&new), 2, s.epoch(), None));
        let now = Instant::now();
        assert!(crate::front::get(s.id, s.front_gen(), "k", now).is_none(), "front still serves v1 after v2 was cached");
        assert_eq!(s.local.get("k").and_then(|e| e.value).as_deref(), Some("v2"));
    }

    /// A fill removed again by the fill-race guard, and a fail-safe clear, invalidate the front.
    #[test]
    fn guard_removal_and_fail_safe_invalidate_the_front() {
        let s = shared();
        let v: Arc<str> = Arc::from("x");
        assert!(s.try_cache("k", Some(&v), 5, s.epoch(), None));
        let gen = s.front_gen();
        crate::front::put(s.id, gen, "k", &s.local.get("k").unwrap());
        s.apply_batch(&[ev("k", 9)]);
        let g1 = s.front_gen();
        assert_ne!(g1, gen);
        // A fill at an older version than the guard is refused: nothing cached.
        assert!(!s.try_cache("k", Some(&v), 8, s.epoch(), None));
        // A fill started before a fail-safe transition is removed again, and the front moves.
        let epoch = s.epoch();
        s.stop_serving_local();
        assert!(s.front_gen() > g1);
        s.resume_serving_local();
        let g2 = s.front_gen();
        assert!(!s.try_cache("k", Some(&v), 10, epoch, None), "fill from an older epoch");
        assert!(s.front_gen() > g2);
        assert!(s.local.get("k").is_none());
    }

    /// "No row" entries follow the same rules as values: a tombstone at its position is evicted
    /// only by a newer event; a missing key at position 0 by any event, and refused while an
    /// event of the key is remembered; a missing key's own TTL is used.
    #[test]
    fn no_row_entries_follow_the_evict_rule_and_the_guard() {
        let s = shared();
        assert!(s.try_cache("tomb", None, 7, s.epoch(), None));
        assert!(s.try_cache("gone", None, 0, s.epoch(), Some(Duration::from_millis(500))));
        assert_eq!(s.local.get("gone").map(|e| (e.value, e.ttl)), Some((None, Duration::from_millis(500))));
        let n = s.apply_batch(&[ev("tomb", 7), ev("gone", 1)]);
        assert_eq!((n[0].evicted, n[1].evicted), (false, true));
        assert!(s.local.get("tomb").is_some_and(|e| e.value.is_none() && e.version == 7));
        assert!(!s.try_cache("gone", None, 0, s.epoch(), Some(Duration::from_secs(1))), "the guard remembers version 1");
        let v: Arc<str> = Arc::from("back");
        assert!(s.try_cache("gone", Some(&v), 1, s.epoch(), None));
        assert!(s.apply_batch(&[ev("tomb", 8)])[0].evicted);
    }

    fn batch(changes: &[(&str, Version, EvOp)]) -> Vec<u8> {
        let mut b = binval_protocol::BatchBuilder::new();
        let pos = SourcePosition { file: "f.000001".into(), pos: 4, gtid: None };
        for (k, v, op) in changes {
            b.push(&pos, 1000, *op, *v, "a.b", k).unwrap();
        }
        b.finish(1010)
    }

    /// A batch applies each change by the per-key rules: a cached older entry is evicted and
    /// its older fills refused afterwards, a newer entry stays, an uncached key leaves nothing
    /// behind (no guard entry: nobody held or filled it), a truncate evicts by prefix; one
    /// notice per change.
    #[test]
    fn a_batch_applies_like_its_per_key_events() {
        let s = shared();
        let v: Arc<str> = Arc::from("x");
        assert!(s.try_cache("p:1", Some(&v), 5, s.epoch(), None));
        assert!(s.try_cache("p:2", Some(&v), 20, s.epoch(), None));
        assert!(s.try_cache("q:1", Some(&v), 5, s.epoch(), None));
        let bytes =
            batch(&[("p:1", 10, EvOp::Update), ("p:2", 10, EvOp::Update), ("p:3", 10, EvOp::Delete), ("q:{id}", 11, EvOp::Truncate)]);
        let b = binval_protocol::BatchView::parse(&bytes).unwrap();
        let notices = s.apply_batch_view(&b, &mut BatchScratch::default(), true);
        let evicted: Vec<(&str, bool)> = notices.iter().map(|n| (n.key.as_str(), n.evicted)).collect();
        assert_eq!(evicted, [("p:1", true), ("p:2", false), ("p:3", false), ("q:{id}", true)]);
        assert_eq!((notices[0].commit_time_ms, notices[0].publish_time_ms), (1000, 1010));
        assert!(s.local.get("p:1").is_none());
        assert!(s.local.get("p:2").is_some(), "newer than the change");
        assert!(s.local.get("q:1").is_none(), "truncated");
        assert!(!s.try_cache("p:1", Some(&v), 9, s.epoch(), None), "an older fill of an evicted key is refused");
        assert!(s.guard.get("p:3").is_none(), "an uncached key costs no guard entry");
        assert!(s.try_cache("p:3", Some(&v), 10, s.epoch(), None));
        assert_eq!(s.counters.snapshot().events, 4);
    }

    /// With reads from replica nodes every key of a batch raises the guard, as per key.
    #[test]
    fn guard_every_key_guards_uncached_keys() {
        let mut s = shared();
        s.guard_every_key = true;
        let bytes = batch(&[("p:3", 10, EvOp::Update)]);
        s.apply_batch_view(&binval_protocol::BatchView::parse(&bytes).unwrap(), &mut BatchScratch::default(), false);
        assert_eq!(s.guard.get("p:3"), Some(10));
    }

    proptest::proptest! {
        /// Random bytes, and valid batches cut short or with bytes changed, never panic the
        /// listener's batch path: a bad one is an error, a good one applies.
        #[test]
        fn batch_bytes_never_panic(
            raw in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            keys in proptest::collection::vec("[a-z:{}0-9]{0,12}", 1..20),
            cut in 0usize..2000,
            flips in proptest::collection::vec((0usize..2000, proptest::num::u8::ANY), 0..4),
        ) {
            let s = shared();
            let mut scratch = BatchScratch::default();
            let changes: Vec<(&str, Version, EvOp)> = keys.iter().enumerate().map(|(i, k)| (k.as_str(), i as u64, [EvOp::Insert, EvOp::Update, EvOp::Delete, EvOp::Truncate][i % 4])).collect();
            let good = batch(&changes);
            let mut bent = good.clone();
            for (at, x) in &flips {
                let n = bent.len();
                bent[at % n] = *x;
            }
            let cut = cut % (good.len() + 1);
            for bytes in [&raw[..], &good[..cut], &bent[..], &good[..]] {
                match crate::listener::decode_batch(Some(bytes), crate::listener::DEFAULT_MAX_MESSAGE_BYTES) {
                    Ok(b) => {
                        let n = s.apply_batch_view(&b, &mut scratch, true);
                        proptest::prop_assert_eq!(n.len(), b.change_count);
                    }
                    Err(e) => { let _ = e.to_string(); }
                }
            }
            let b = binval_protocol::BatchView::parse(&good).unwrap();
            proptest::prop_assert_eq!(b.change_count, keys.len());
        }
    }

    #[test]
    fn jittered_ttl_stays_within_bounds_and_spreads() {
        let t = JitteredTtl { ttl: Duration::from_secs(10), jitter: 0.1 };
        let samples: Vec<Duration> = (0..10_000).map(|_| t.sample()).collect();
        let (lo, hi) = (Duration::from_secs(9), Duration::from_secs(11));
        assert!(samples.iter().all(|d| (lo..=hi).contains(d)));
        let min = samples.iter().min().unwrap();
        let max = samples.iter().max().unwrap();
        assert!(*min < Duration::from_millis(9_500) && *max > Duration::from_millis(10_500), "{min:?} {max:?}");
        let exact = JitteredTtl { ttl: Duration::from_secs(10), jitter: 0.0 };
        assert_eq!(exact.sample(), Duration::from_secs(10));
    }
}
