//! Applying one batch message ([`binval_protocol::batch`]) to the local cache in one pass.

use super::*;

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
