//! The read-through fill of a miss: miss rate limit, at most
//! [`crate::ConsumerBuilder::max_replica_reads`] replica reads (master-balanced), the loader,
//! then caching what was found at the position it was written at.
//!
//! This is where the read rule of the crate docs ("Why a fill caches the replica's own
//! position") is enforced: a fill reads no version token; each `HMGET K:rN d t p n` returns a
//! payload (or tombstone) together with the fence position of the write that made it, and the
//! fill caches exactly that pair. Nothing is ever cached under a version newer than its value.
//!
//! The rest of the fill's correctness is in `state.rs`: [`Consumer::fill`] takes the fail-safe
//! epoch before the reads and hands value, version and epoch to `Shared::try_cache`, which
//! checks the fill-race guard (an event with a newer version already applied: do not cache),
//! inserts, and re-checks after the insert, so an event applied in between still removes the
//! entry; a fail-safe transition since the epoch (or not serving locally) removes it as well.
//!
//! Replica choice ([`binval_protocol::placement::Placement::read_order`]): the key's N replicas
//! (N from [`Consumer::replicas_for`]) grouped by the master of their hash slot in the slot map
//! the Cluster client routes by; the first read goes to a master chosen uniformly among those
//! holding a replica, to a replica chosen uniformly on it, so a hot key's reads load those
//! masters equally however its replicas are spread. A missing replica (or one whose master does
//! not answer) sends the next read to another master first. Standalone Redis: one group, so a
//! replica chosen uniformly, as before.
//!
//! **Adaptive replica counts** (crate docs, and `counts.rs`). N is what the key's records last
//! said (field `n`, learned from every answer at once), else the hot set, else the configured
//! count, so it can be larger than the replicas that exist (a shrink removed some, a grow has
//! not copied them yet, the configuration says more). The replica-0 rule ([`NextRead`]): a
//! replica `i > 0` with no record at all sends the next read to replica 0, before any other,
//! one read past the bound if the bound is used up, and a fill marks a key confirmed missing
//! only when replica 0 answered "missing". When the rule's read of replica 0 landed on the
//! master of the first read, one more read goes to another master, so a newly missing key is
//! still concluded from two masters. A key already confirmed missing is re-read with one read
//! and no fallback (its replica 0 was missing, and any write of it since would have sent an
//! event that ends the shortcut). If the source lag left replica 0 out of the order and the
//! replicas read were missing, only replica 0 could tell: the fill follows
//! [`crate::ConsumerBuilder::on_source_behind`] with replica 0 alone.
//!
//! Outcomes: a value, cached at its position; a tombstone ("no row"), cached at its position
//! with the normal TTL; every read replica missing: the loader if one is set, else "no row"
//! cached for [`crate::ConsumerBuilder::missing_ttl`] at the newest position any of the read
//! records carried (an invalidate-mode record has one) or 0, so the next event of the key
//! evicts it.
//!
//! **A master that does not answer in time.** Each read has a soft bound,
//! [`crate::ConsumerBuilder::replica_read_timeout`] (default 100 ms): when it passes without an
//! answer, the next replica in the order (another master's first) is read *as well*, and the
//! first answer that is a value or a tombstone wins; the slow read stays in flight until its
//! hard bound, [`crate::ConsumerBuilder::redis_response_timeout`], and is used if it answers
//! first after all. So a frozen master costs a read about one soft bound, not an error. Every
//! answer is an exact (value, position) pair of one replica record, whichever replica gave it,
//! so the caching rules above (fill-race guard, fail-safe epoch) apply unchanged.
//!
//! **The source side** ([`crate::fail_safe`], "The source lag"). While binval's progress
//! messages count, each replica's hash slot has a lag; replicas past
//! [`crate::ConsumerBuilder::max_staleness`] are left out of the order when the key has another
//! replica (a frozen master's replicas, when binval reports lags per slot range). When every
//! replica is past it, [`crate::ConsumerBuilder::on_source_behind`] decides: the loader
//! instead of Redis, a Redis value flagged stale, or [`ConsumerError::SourceBehind`]. Nothing
//! is cached then.

use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_protocol::{hash_slot, replica_key, ReplicaRecord, Version};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::consumer::OnSourceBehind;
use crate::error::ConsumerError;
use crate::redis_conn::{KeyPlacement, ReplicaRead};
use crate::single_flight::{FillOutcome, Filled, Freshness};
use crate::Consumer;

/// What the replica reads of one fill found.
enum Found {
    /// A payload, written at `position`.
    Value { value: Arc<str>, position: Version },
    /// A tombstone: the row was deleted at `position`.
    Deleted { position: Version },
    /// No replica read held the key. `position`: the newest position of an invalidate-mode
    /// record among the reads (the row exists in the database as of it), 0 if none.
    /// `zero_left_out`: a replica was missing without a position, and replica 0 (the one that
    /// exists whenever the key does) was not read because the plan left it out (its master
    /// past the source lag bound).
    Missing { position: Version, zero_left_out: bool },
}

/// Which of a key's replicas a fill may read, per the source lag.
struct Plan {
    /// Replica indexes in read order (master-balanced; those past the bound left out when
    /// another is within it).
    order: Vec<u32>,
    /// `Some(lag)` when every replica is past the bound: the lag of the freshest.
    behind: Option<Duration>,
    /// `Some(lag)` when replica 0 is left out of `order` (past the bound while another
    /// replica is within it): its lag.
    zero_lag: Option<Duration>,
}

/// Which replica a fill reads next: the plan's order, bounded by `max_replica_reads`, with the
/// replica-0 rule (module docs, "Adaptive replica counts").
struct NextRead {
    /// The plan's order; replicas already read are skipped.
    queue: std::collections::VecDeque<u32>,
    read: Vec<u32>,
    /// Replica 0 is in the plan's order.
    zero_allowed: bool,
    /// A replica read missing without a position: the next read goes to replica 0.
    zero_due: bool,
    /// Replica 0 was read because of the rule (it may have taken the read the order gave
    /// another master).
    zero_by_rule: bool,
    bound: usize,
    /// One read past the bound is still allowed (not for a key confirmed missing).
    extra: bool,
}

impl NextRead {
    fn new(order: Vec<u32>, bound: usize, extra: bool) -> Self {
        let zero_allowed = order.contains(&0);
        NextRead { queue: order.into(), read: Vec::new(), zero_allowed, zero_due: false, zero_by_rule: false, bound, extra }
    }

    /// The next replica to read, if any: replica 0 first when a missing replica sent the fill
    /// there (past the bound by one read if need be); else the next in the order within the
    /// bound; past it, one replica on another master when the rule's read of replica 0 took
    /// the read the order would have spent there (`one_master`: every read so far was on one
    /// master, of a key whose replicas are on several).
    fn peek(&mut self, one_master: bool) -> Option<u32> {
        while self.queue.front().is_some_and(|i| self.read.contains(i)) {
            self.queue.pop_front();
        }
        let within = self.read.len() < self.bound;
        if self.zero_due && self.zero_allowed && !self.read.contains(&0) {
            return (within || self.extra).then_some(0);
        }
        if within || (self.extra && self.bound >= 2 && self.zero_by_rule && one_master) {
            return self.queue.front().copied();
        }
        None
    }

    /// Take the replica [`NextRead::peek`] gave; `true` when it is replica 0 read by the rule.
    fn take(&mut self, i: u32) -> bool {
        if self.read.len() >= self.bound {
            self.extra = false;
        }
        self.read.push(i);
        let by_rule = i == 0 && self.zero_due;
        self.zero_by_rule |= by_rule;
        by_rule
    }
}

impl Consumer {
    /// The read-through on a miss: rate limit, replica reads, the loader if every read replica
    /// is missing; cache if `cache` and the guards allow it. While the source side is behind
    /// for every replica of the key, [`OnSourceBehind`] decides instead, and nothing is cached.
    pub(crate) async fn fill(&self, key: &str, cache: bool) -> FillOutcome {
        let inner = &*self.inner;
        let shared = &inner.shared;
        let at = inner.redis.placement(key, self.replicas_for(key));
        let plan = self.plan(key, &at);
        if !shared.limiter.admit(key) {
            shared.counters.limiter_rejection();
            // Over the limit while the source is behind: a stale copy is only served flagged.
            let copy_ok = plan.behind.is_none() || inner.on_source_behind == OnSourceBehind::ServeStale;
            return match shared.stale_copy(key).filter(|_| copy_ok) {
                Some(value) => Ok(Filled { value: Some(value), how: Freshness::StaleCopy }),
                None => Err(ConsumerError::Overloaded { key: key.to_string() }),
            };
        }
        if let Some(lag) = plan.behind {
            return self.fill_behind(key, &at, lag, plan.order).await;
        }
        let epoch = shared.epoch();
        let cache_at = |value: Option<&Arc<str>>, position: Version, ttl: Option<Duration>| {
            if cache {
                shared.try_cache(key, value, position, epoch, ttl);
            }
        };
        let fresh = |value: Option<Arc<str>>| Ok(Filled { value, how: Freshness::Fresh });
        match self.read_replicas(key, &at, plan.order).await? {
            Found::Value { value, position } => {
                shared.counters.fill();
                cache_at(Some(&value), position, None);
                fresh(Some(value))
            }
            Found::Deleted { position } => {
                shared.counters.tombstone();
                cache_at(None, position, None);
                fresh(None)
            }
            Found::Missing { zero_left_out: true, .. } if plan.zero_lag.is_some() => {
                // Only replica 0 can still say whether the key exists, and its master is past
                // the bound: as when every replica is.
                self.fill_behind(key, &at, plan.zero_lag.unwrap_or_default(), vec![0]).await
            }
            Found::Missing { position, .. } => {
                shared.counters.missing();
                let missing_ttl = inner.missing_ttl.filter(|t| !t.is_zero());
                let Some(loader) = &inner.loader else {
                    if let Some(ttl) = missing_ttl {
                        cache_at(None, position, Some(ttl));
                    }
                    return fresh(None);
                };
                let loaded = self.load(loader, key).await?;
                if inner.cache_loaded {
                    match &loaded {
                        Some(value) => cache_at(Some(value), position, None),
                        None => {
                            if let Some(ttl) = missing_ttl {
                                cache_at(None, position, Some(ttl));
                            }
                        }
                    }
                }
                fresh(loaded)
            }
        }
    }

    /// A fill while the source side is `lag` behind for the replicas in `order`:
    /// [`OnSourceBehind`] decides; nothing is cached.
    async fn fill_behind(&self, key: &str, at: &KeyPlacement, lag: Duration, order: Vec<u32>) -> FillOutcome {
        let inner = &*self.inner;
        let bound = inner.shared.fail_safe.bound().unwrap_or_default();
        let refused =
            || ConsumerError::SourceBehind { key: key.to_string(), lag_ms: lag.as_millis() as u64, bound_ms: bound.as_millis() as u64 };
        match (inner.on_source_behind, &inner.loader) {
            (OnSourceBehind::Refuse, _) | (OnSourceBehind::LoadOrRefuse, None) => Err(refused()),
            (OnSourceBehind::LoadOrRefuse, Some(loader)) => {
                let value = self.load(loader, key).await?;
                Ok(Filled { value, how: Freshness::LoadedSourceBehind })
            }
            (OnSourceBehind::ServeStale, _) => {
                let value = match self.read_replicas(key, at, order).await? {
                    Found::Value { value, .. } => Some(value),
                    Found::Deleted { .. } => None,
                    Found::Missing { .. } => match &inner.loader {
                        Some(loader) => self.load(loader, key).await?,
                        None => None,
                    },
                };
                Ok(Filled { value, how: Freshness::SourceBehind(lag) })
            }
        }
    }

    /// The read order of `key`'s replicas (master-balanced), without the replicas whose slot
    /// is past the source lag bound when another one is within it; `behind` when none is.
    fn plan(&self, key: &str, at: &KeyPlacement) -> Plan {
        let inner = &*self.inner;
        let order = at.placement.read_order(rand::random());
        let fs = &inner.shared.fail_safe;
        let Some(bound) = fs.bound() else { return Plan { order, behind: None, zero_lag: None } };
        let slots: Vec<u16> = order.iter().map(|&i| hash_slot(replica_key(key, i).as_bytes())).collect();
        let Some(lags) = fs.slot_lags(&slots, Instant::now()) else { return Plan { order, behind: None, zero_lag: None } };
        let fresh: Vec<u32> = order.iter().zip(&lags).filter(|(_, l)| **l <= bound).map(|(i, _)| *i).collect();
        if fresh.is_empty() {
            let lag = lags.iter().min().copied().unwrap_or_default();
            return Plan { order, behind: Some(lag), zero_lag: None };
        }
        let zero_lag = order.iter().zip(&lags).find(|(i, l)| **i == 0 && **l > bound).map(|(_, l)| *l);
        Plan { order: fresh, behind: None, zero_lag }
    }

    /// Read replicas in `order` until one answers with a value or a tombstone, at most
    /// `max_replica_reads` of them, with the replica-0 rule ([`NextRead`]: a replica missing
    /// without a position sends the next read to replica 0, one read past the bound if need
    /// be). A read that has not answered within the soft bound (`replica_read_timeout`) is
    /// joined by a read of the next replica, and the first value or tombstone wins; a read
    /// that fails because its master is unreachable or slow moves on like a missing replica.
    /// If no read answered and one failed, that failure is the outcome (a missing key is only
    /// concluded from answers). Every answer's count (field `n`) is learned at once.
    async fn read_replicas(&self, key: &str, at: &KeyPlacement, order: Vec<u32>) -> Result<Found, ConsumerError> {
        let inner = &*self.inner;
        let counters = &inner.shared.counters;
        let mut position: Version = 0;
        let mut failed: Option<ConsumerError> = None;
        // A key confirmed missing by a recent fill (every read replica missing, replica 0 among
        // them, on at least two masters) and not written since is checked again with one read:
        // a hot missing key costs one read per fill, and a master that lost its data still
        // cannot make an existing row look missing (that needs a fill which asked two masters).
        let confirmed = inner.shared.confirmed_missing.contains_key(key);
        let bound = if confirmed { 1 } else { inner.max_replica_reads as usize };
        let soft = inner.replica_read_timeout.min(inner.response_timeout);
        let mut next = NextRead::new(order, bound, !confirmed);
        let mut masters = std::collections::HashSet::new();
        let several_masters = at.placement.masters() >= 2;
        // Reads in flight: (replica, started, counted as slow).
        let mut flying: Vec<(u32, Instant, bool)> = Vec::new();
        let mut pending = FuturesUnordered::new();
        let read = |i: u32| async move {
            let rkey = replica_key(key, i);
            let r = inner.redis.replica(&rkey, at, inner.response_timeout).await;
            (i, rkey, r)
        };
        // Start the read of the next replica, if one is left.
        macro_rules! start_next {
            () => {
                let one_master = several_masters && masters.len() == 1;
                if let Some(i) = next.peek(one_master) {
                    if next.take(i) {
                        counters.replica_zero_fallback();
                    }
                    counters.redis_read();
                    masters.insert(at.placement.master_of_replica(i));
                    flying.push((i, Instant::now(), false));
                    pending.push(read(i));
                }
            };
        }
        // Before returning an answer: reads still in flight past the soft bound are slow ones.
        macro_rules! count_slow {
            () => {
                for _ in flying.iter().filter(|f| !f.2 && f.1.elapsed() >= soft) {
                    counters.replica_read_timeout();
                }
            };
        }
        start_next!();
        while !pending.is_empty() {
            let more = next.peek(several_masters && masters.len() == 1).is_some();
            let hedge_at = flying.last().map(|f| f.1 + soft).filter(|_| more);
            let step = tokio::select! {
                done = pending.next() => done,
                _ = sleep_until(hedge_at) => None,
            };
            let Some((i, rkey, r)) = step else {
                // The newest read did not answer within the soft bound: read the next replica
                // too (another master's first); the slow one stays in flight.
                if let Some(f) = flying.last_mut() {
                    f.2 = true;
                }
                counters.replica_read_timeout();
                start_next!();
                continue;
            };
            if let Some(k) = flying.iter().position(|f| f.0 == i) {
                let (_, started, counted) = flying.remove(k);
                if !counted && started.elapsed() >= soft {
                    counters.replica_read_timeout();
                }
            }
            if let Ok(ReplicaRead { count: Some(n), .. }) = &r {
                self.inner.counts.learn(key, *n);
            }
            match r.map(|r| r.record) {
                Ok(ReplicaRecord::Value { data, position }) => {
                    count_slow!();
                    let text = String::from_utf8(data).map_err(|e| ConsumerError::Decode {
                        key: rkey.clone(),
                        what: "replica",
                        reason: format!("payload (field `d`) is not UTF-8: {e}"),
                    })?;
                    return Ok(Found::Value { value: Arc::from(text), position });
                }
                Ok(ReplicaRecord::Deleted { position }) => {
                    count_slow!();
                    return Ok(Found::Deleted { position });
                }
                Ok(ReplicaRecord::Missing { position: p }) => {
                    // No record at all: never written, removed by a shrink, or not yet copied
                    // by a grow. Replica 0 exists whenever the key does.
                    if p.is_none() && i != 0 {
                        next.zero_due = true;
                    }
                    position = position.max(p.unwrap_or(0));
                    start_next!();
                }
                Err(e) if e.is_unreachable() => {
                    failed.get_or_insert(e);
                    start_next!();
                }
                Err(e) => {
                    count_slow!();
                    return Err(e);
                }
            }
        }
        let zero_read = next.read.contains(&0);
        match failed {
            Some(e) => Err(e),
            None => {
                // Replica 0 answered "missing" (it exists whenever the key does), and two
                // masters were asked, or every master there is (standalone), or every replica.
                let reads = next.read.len();
                if !confirmed && zero_read && (masters.len() >= 2 || !several_masters || reads >= at.placement.replicas() as usize) {
                    inner.shared.mark_confirmed_missing(key);
                }
                Ok(Found::Missing { position, zero_left_out: next.zero_due && !next.zero_allowed && !confirmed })
            }
        }
    }

    /// The app-supplied loader, bounded by its timeout.
    async fn load(&self, loader: &crate::loader::LoaderFn, key: &str) -> Result<Option<Arc<str>>, ConsumerError> {
        let inner = &*self.inner;
        let counters = &inner.shared.counters;
        match tokio::time::timeout(inner.loader_timeout, loader.call(key)).await {
            Ok(Ok(Some(text))) => {
                counters.loader_fill();
                Ok(Some(Arc::from(text)))
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
}

/// Sleep until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(tokio::time::Instant::from_std(t)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::NextRead;

    /// Drive [`NextRead`] as `read_replicas` does: every read answers "missing without a
    /// position" (the worst case), `master` gives each replica's master; returns the replicas
    /// read in order.
    fn all_missing(order: Vec<u32>, bound: usize, extra: bool, master: impl Fn(u32) -> usize, several: bool) -> Vec<u32> {
        let mut next = NextRead::new(order, bound, extra);
        let mut masters = std::collections::HashSet::new();
        while let Some(i) = next.peek(several && masters.len() == 1) {
            next.take(i);
            masters.insert(master(i));
            if i != 0 {
                next.zero_due = true;
            }
        }
        next.read
    }

    #[test]
    fn a_missing_replica_sends_the_next_read_to_replica_zero() {
        // Replicas 0..4 on two masters: 0, 1 on master 0; 2, 3 on master 1.
        let m = |i: u32| usize::from(i >= 2);
        // Bound 2, first read on master 1: replica 0 next (it is on the other master): 2 reads.
        assert_eq!(all_missing(vec![3, 1, 2, 0], 2, true, m, true), [3, 0]);
        // First read on replica 0's own master: replica 0, then one read on the other master.
        assert_eq!(all_missing(vec![1, 3, 0, 2], 2, true, m, true), [1, 0, 3]);
        // Replica 0 first: no fallback, the order's next (another master).
        assert_eq!(all_missing(vec![0, 2, 1, 3], 2, true, m, true), [0, 2]);
        // Bound 1: replica 0 is the one read past it.
        assert_eq!(all_missing(vec![3, 1, 2, 0], 1, true, m, true), [3, 0]);
        assert_eq!(all_missing(vec![1, 3, 0, 2], 1, true, m, true), [1, 0]);
        // A key confirmed missing: one read, no extra.
        assert_eq!(all_missing(vec![3, 1, 2, 0], 1, false, m, true), [3]);
        // Standalone (one master): replica 0, no second-master read.
        assert_eq!(all_missing(vec![2, 1, 3, 0], 2, true, |_| 0, false), [2, 0]);
        // Replica 0 left out of the order (source lag): never read.
        assert_eq!(all_missing(vec![3, 1, 2], 2, true, m, true), [3, 1]);
        // A larger bound: replica 0 right after the first missing one, then the order.
        assert_eq!(all_missing(vec![1, 3, 0, 2], 3, true, m, true), [1, 0, 3]);
    }
}
