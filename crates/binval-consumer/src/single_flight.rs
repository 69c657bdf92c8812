//! Single-flight: concurrent misses of one key in one instance share one fill.
//!
//! The first miss of a key starts its fill as a tokio task and registers it in a small map
//! (key -> shared future, [`SingleFlight`]); every other miss of the key while it runs awaits
//! the same outcome ([`crate::Stats::coalesced`]), so a hot key that expires costs one Redis
//! round trip, not one per reader. Why a task of its own: a caller that gives up (a dropped
//! request future) must not cancel the fill for the others, and the registration must be
//! removed however the fill ends — [`InflightGuard`] does that when the task ends, normally or
//! by panic, so the map holds only keys being filled right now. The fill-race guard still
//! decides whether the value is cached (`read.rs`); a refused fill's value is returned to every
//! waiter all the same. Refresh-ahead joins the same map, so a refresh and a miss of one key
//! never fill twice.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared as SharedFuture};

use crate::error::ConsumerError;
use crate::Consumer;

/// How fresh a fill's answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Read from a replica within the bound (or from the loader after missing replicas).
    Fresh,
    /// The stale copy of an evicted entry: the miss rate limit refused the fill.
    StaleCopy,
    /// Read from Redis while the source side was this far behind for every replica of the key
    /// ([`crate::OnSourceBehind::ServeStale`]).
    SourceBehind(std::time::Duration),
    /// Answered by the loader because the source side was behind
    /// ([`crate::OnSourceBehind::LoadOrRefuse`]).
    LoadedSourceBehind,
}

/// What one fill hands to every caller awaiting it: the value (`None` if the key has no row)
/// and how fresh it is.
#[derive(Debug, Clone)]
pub(crate) struct Filled {
    pub value: Option<Arc<str>>,
    pub how: Freshness,
}

/// The outcome of one fill.
pub(crate) type FillOutcome = Result<Filled, ConsumerError>;

/// A fill in flight, awaitable by any number of callers.
pub(crate) type InflightFill = SharedFuture<BoxFuture<'static, FillOutcome>>;

/// The fills in flight per key, with their ids (so a finished fill removes only its own entry,
/// never a newer fill of the same key). An entry lives exactly as long as its fill task, which
/// Redis timeouts bound, so the map holds at most one entry per key being filled right now.
#[derive(Default)]
pub(crate) struct SingleFlight {
    fills: Mutex<HashMap<String, (u64, InflightFill), crate::state::LocalHasher>>,
    next_id: AtomicU64,
}

impl SingleFlight {
    /// For each key of `keys`, whether a fill of it is registered right now (set in `out`,
    /// index for index), all under one lock: a fill that registers after this returns reads
    /// Redis after it (what the batched listener relies on, `Shared::apply_batch_view`).
    /// Returns `false`, and touches `out` not at all, when no fill is registered.
    pub(crate) fn registered<'k>(&self, keys: impl Iterator<Item = &'k str>, out: &mut Vec<bool>) -> bool {
        let map = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        if map.is_empty() {
            return false;
        }
        out.clear();
        out.extend(keys.map(|k| map.contains_key(k)));
        true
    }

    /// Remove `key`'s entry if it is still the fill `id`.
    fn finished(&self, key: &str, id: u64) {
        let mut map = self.fills.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(key).is_some_and(|(i, _)| *i == id) {
            map.remove(key);
        }
    }
}

/// Removes a key's single-flight entry when its fill task ends (normally or by panic).
struct InflightGuard {
    consumer: Consumer,
    key: String,
    id: u64,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.consumer.inner.shared.inflight.finished(&self.key, self.id);
    }
}

impl Consumer {
    /// The fill of `key` in flight, or a new one (spawned as a task at its first poll) that is
    /// registered for others to join. The flag is `true` when an existing fill was joined.
    fn flight(&self, key: &str, cache: bool) -> (InflightFill, bool) {
        let flights = &self.inner.shared.inflight;
        let mut map = flights.fills.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, f)) = map.get(key) {
            return (f.clone(), true);
        }
        let id = flights.next_id.fetch_add(1, Relaxed);
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

    /// Join the fill of `key` in flight, or start one, and await its outcome; counts what this
    /// caller got (a stale copy, a flagged or loaded answer, a refusal because the source side
    /// is behind).
    pub(crate) async fn fill_single_flight(&self, key: &str, cache: bool) -> FillOutcome {
        let (fill, joined) = self.flight(key, cache);
        let counters = &self.inner.shared.counters;
        if joined {
            counters.coalesced();
        }
        let out = fill.await;
        match &out {
            Ok(Filled { how: Freshness::StaleCopy, value: Some(_) }) => counters.stale_served(),
            Ok(Filled { how: Freshness::SourceBehind(_), .. }) => counters.source_behind("flagged"),
            Ok(Filled { how: Freshness::LoadedSourceBehind, .. }) => counters.source_behind("loaded"),
            Err(ConsumerError::SourceBehind { .. }) => counters.source_behind("refused"),
            _ => {}
        }
        out
    }

    /// Refresh-ahead: start a background fill of `key` (or join the one in flight) without
    /// waiting for it. Skipped outside a tokio runtime.
    pub(crate) fn start_refresh(&self, key: &str) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        self.inner.shared.counters.refresh();
        let (fill, _) = self.flight(key, true);
        rt.spawn(async move {
            let _ = fill.await;
        });
    }
}
