//! The read-through fill of a miss: miss rate limit, version token, one replica at a time,
//! the loader, then caching under the version token read first.
//!
//! This is where the read order of the crate docs ("Why the read goes version token first,
//! then replica") is enforced: [`Consumer::read_through`] issues `GET K:ver` before any
//! `HMGET K:rN d t`, and the value it returns carries that version, never one read after the
//! replica. The writer goes the other way (replicas, then version token), so the pair is
//! correct or "newer value, older version", which the next event evicts.
//!
//! The rest of the fill's correctness is in `state.rs`: [`Consumer::fill`] takes the fail-safe
//! epoch before the reads and hands value, version and epoch to `Shared::try_cache`, which
//! checks the fill-race guard (an event with a newer version already applied: do not cache),
//! inserts, and re-checks after the insert, so an event applied in between still removes the
//! entry; a fail-safe transition since the epoch (or not serving locally) removes it as well.
//!
//! Replica choice: a random order over `0..N` (N from [`Consumer::replicas_for`]), each replica
//! tried at most once, so the reads of a hot key spread over the N masters that hold its
//! replicas. A tombstone ends the fill (`None`, no other replica or loader is asked: it is
//! newer than anything they could say); a missing replica moves on to the next; all missing
//! goes to the app-supplied loader, if any, whose value is cached under the same version token
//! (unless [`crate::ConsumerBuilder::cache_loaded`] is off).

use std::sync::Arc;

use binval_protocol::{parse_version, replica_key, version_key, ReplicaRecord, Version};
use rand::seq::SliceRandom;

use crate::error::ConsumerError;
use crate::single_flight::FillOutcome;
use crate::Consumer;

/// A value a fill found, with the version token read before it.
struct Found {
    value: Arc<str>,
    version: Version,
    /// `true` when the app-supplied loader produced it (every replica was missing).
    loaded: bool,
}

impl Consumer {
    /// The read-through on a miss: rate limit, version token, then a replica (then the
    /// loader); cache if `cache` and the guards allow it.
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
}
