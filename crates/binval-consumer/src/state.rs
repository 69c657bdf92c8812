//! State shared by the read path (`get`) and the invalidation listener thread: the local cache,
//! the fill-race guard, the fail-safe flag and the counters. Every decision that involves both
//! sides lives here, so the orderings that make them correct are in one place.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use binval_protocol::{should_evict, InvalidationEvent, Version};
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use tokio::sync::broadcast;

use crate::stats::Counters;

/// One local cache entry: the payload text as stored in the replica, and the version token
/// that was read *before* the replica.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub value: Arc<str>,
    pub version: Version,
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

pub(crate) struct Shared {
    pub local: Cache<String, Entry>,
    /// Newest event version seen per recently invalidated key (the fill-race guard).
    pub guard: Cache<String, Version>,
    pub counters: Counters,
    /// `true` while `get` may serve from, and fill into, the local cache.
    serving_local: AtomicBool,
    /// Bumped on every fail-safe transition; a fill that started in an older epoch must not
    /// leave an entry behind.
    epoch: AtomicU64,
    pub notices: broadcast::Sender<EvictionNotice>,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Shared {
    pub(crate) fn new(
        max_entries: u64,
        ttl: Duration,
        guard_entries: u64,
        guard_ttl: Duration,
        notice_capacity: usize,
    ) -> Self {
        let (notices, _) = broadcast::channel(notice_capacity.max(1));
        let counters = Counters::default();
        counters.serving_local(true);
        Shared {
            local: Cache::builder().max_capacity(max_entries).time_to_live(ttl).build(),
            guard: Cache::builder().max_capacity(guard_entries).time_to_live(guard_ttl).build(),
            counters,
            serving_local: AtomicBool::new(true),
            epoch: AtomicU64::new(0),
            notices,
        }
    }

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
        self.serving_local.store(true, SeqCst);
        self.counters.serving_local(true);
        true
    }

    fn guard_refuses(&self, key: &str, version: Version) -> bool {
        self.guard.get(key).is_some_and(|newest| version < newest)
    }

    /// Cache a fill of `key` read at `version`, unless the fill-race guard or a fail-safe
    /// transition since `epoch` says it may be stale. Returns `true` if it stayed cached.
    ///
    /// Ordering argument: the listener (1) raises the guard, then (2) evicts. The fill
    /// (a) inserts, then (b) re-checks the guard. If (2) did not see the insert, (2) ran before
    /// (a), so (1) ran before (b) and (b) sees the raised guard and removes the entry.
    pub(crate) fn try_cache(&self, key: &str, value: &Arc<str>, version: Version, epoch: u64) -> bool {
        if self.guard_refuses(key, version) {
            self.counters.fill_refused();
            return false;
        }
        self.local.entry_by_ref(key).and_compute_with(|cur| match cur {
            // A concurrent fill already cached a newer pair: keep it.
            Some(e) if e.value().version > version => Op::Nop,
            _ => Op::Put(Entry { value: value.clone(), version }),
        });
        let refused = self.guard_refuses(key, version);
        if refused || self.epoch() != epoch || !self.is_serving_local() {
            self.local.entry_by_ref(key).and_compute_with(|cur| match cur {
                Some(e) if e.value().version == version && Arc::ptr_eq(&e.value().value, value) => Op::Remove,
                _ => Op::Nop,
            });
            if refused {
                self.counters.fill_refused();
            }
            return false;
        }
        true
    }

    /// Apply one invalidation event: raise the fill-race guard, then evict by the evict rule,
    /// count, and notify subscribers.
    pub(crate) fn apply_event(&self, ev: &InvalidationEvent) -> EvictionNotice {
        let v = ev.version;
        self.guard.entry_by_ref(ev.key.as_str()).and_compute_with(|cur| match cur {
            Some(e) if *e.value() >= v => Op::Nop,
            _ => Op::Put(v),
        });
        let evicted = matches!(
            self.local.entry_by_ref(ev.key.as_str()).and_compute_with(|cur| match cur {
                Some(e) if should_evict(e.value().version, v) => Op::Remove,
                _ => Op::Nop,
            }),
            CompResult::Removed(_)
        );
        let received_at_ms = now_ms();
        self.counters.event();
        if evicted {
            self.counters.eviction();
        }
        self.counters.lag(received_at_ms.saturating_sub(ev.publish_time_ms));
        let notice = EvictionNotice {
            key: ev.key.clone(),
            version: v,
            evicted,
            commit_time_ms: ev.commit_time_ms,
            publish_time_ms: ev.publish_time_ms,
            received_at_ms,
        };
        if self.notices.receiver_count() > 0 {
            let _ = self.notices.send(notice.clone());
        }
        notice
    }
}
