//! The read-through fill of a miss: miss rate limit, at most
//! [`crate::ConsumerBuilder::max_replica_reads`] replica reads (master-balanced), the loader,
//! then caching what was found at the position it was written at.
//!
//! This is where the read rule of the crate docs ("Why a fill caches the replica's own
//! position") is enforced: a fill reads no version token; each `HMGET K:rN d t p` returns a
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
//! Outcomes: a value, cached at its position; a tombstone ("no row"), cached at its position
//! with the normal TTL; every read replica missing: the loader if one is set, else "no row"
//! cached for [`crate::ConsumerBuilder::missing_ttl`] at the newest position any of the read
//! records carried (an invalidate-mode record has one) or 0, so the next event of the key
//! evicts it.

use std::sync::Arc;
use std::time::Duration;

use binval_protocol::{replica_key, ReplicaRecord, Version};

use crate::error::ConsumerError;
use crate::single_flight::FillOutcome;
use crate::Consumer;

/// What the replica reads of one fill found.
enum Found {
    /// A payload, written at `position`.
    Value { value: Arc<str>, position: Version },
    /// A tombstone: the row was deleted at `position`.
    Deleted { position: Version },
    /// No replica read held the key. `position`: the newest position of an invalidate-mode
    /// record among the reads (the row exists in the database as of it), 0 if none.
    Missing { position: Version },
}

impl Consumer {
    /// The read-through on a miss: rate limit, replica reads, the loader if every read replica
    /// is missing; cache if `cache` and the guards allow it.
    pub(crate) async fn fill(&self, key: &str, cache: bool) -> FillOutcome {
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
        let cache_at = |value: Option<&Arc<str>>, position: Version, ttl: Option<Duration>| {
            if cache {
                shared.try_cache(key, value, position, epoch, ttl);
            }
        };
        match self.read_replicas(key).await? {
            Found::Value { value, position } => {
                shared.counters.fill();
                cache_at(Some(&value), position, None);
                Ok(Some((value, false)))
            }
            Found::Deleted { position } => {
                shared.counters.tombstone();
                cache_at(None, position, None);
                Ok(None)
            }
            Found::Missing { position } => {
                shared.counters.missing();
                let missing_ttl = inner.missing_ttl.filter(|t| !t.is_zero());
                let Some(loader) = &inner.loader else {
                    if let Some(ttl) = missing_ttl {
                        cache_at(None, position, Some(ttl));
                    }
                    return Ok(None);
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
                Ok(loaded.map(|v| (v, false)))
            }
        }
    }

    /// Read replicas in the master-balanced order until one answers with a value or a
    /// tombstone, at most `max_replica_reads` of them. A read that fails because its master is
    /// unreachable or slow moves on like a missing replica; if no read answered and one
    /// failed, that failure is the outcome (a missing key is only concluded from answers).
    async fn read_replicas(&self, key: &str) -> Result<Found, ConsumerError> {
        let inner = &*self.inner;
        let at = inner.redis.placement(key, self.replicas_for(key));
        let order = at.placement.read_order(rand::random());
        let mut position: Version = 0;
        let mut failed: Option<ConsumerError> = None;
        // A key confirmed missing by a recent fill (every read replica missing, on at least two
        // masters) and not written since is checked again with one read: a hot missing key
        // costs one read per fill, and a master that lost its data still cannot make an
        // existing row look missing (that needs a fill which asked two masters).
        let confirmed = inner.shared.confirmed_missing.contains_key(key);
        let bound = if confirmed { 1 } else { inner.max_replica_reads as usize };
        let (mut reads, mut masters) = (0usize, std::collections::HashSet::new());
        for i in order.into_iter().take(bound) {
            let rkey = replica_key(key, i);
            inner.shared.counters.redis_read();
            reads += 1;
            masters.insert(at.placement.master_of_replica(i));
            match inner.redis.replica(&rkey, &at, inner.response_timeout).await {
                Ok(ReplicaRecord::Value { data, position }) => {
                    let text = String::from_utf8(data).map_err(|e| ConsumerError::Decode {
                        key: rkey.clone(),
                        what: "replica",
                        reason: format!("payload (field `d`) is not UTF-8: {e}"),
                    })?;
                    return Ok(Found::Value { value: Arc::from(text), position });
                }
                Ok(ReplicaRecord::Deleted { position }) => return Ok(Found::Deleted { position }),
                Ok(ReplicaRecord::Missing { position: p }) => position = position.max(p.unwrap_or(0)),
                Err(e) if e.is_unreachable() => {
                    failed.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => {
                // Asked two masters, or every master there is (standalone), or every replica.
                if !confirmed && (masters.len() >= 2 || at.placement.masters() <= 1 || reads >= self.replicas_for(key) as usize) {
                    inner.shared.confirmed_missing.insert(key.to_string(), ());
                }
                Ok(Found::Missing { position })
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
