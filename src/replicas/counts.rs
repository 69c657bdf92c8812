//! The count of every key of an adaptive mapping that is not at its `min`: shared between the
//! leader's decisions ([`super::task`]) and the mapping ([`crate::mapping::Mapper`]), which
//! gives each key change the number of replicas to write and the count to record in them.
//!
//! # Where the counts are kept
//!
//! * In memory: [`ReplicaCounts`], read for every change of an adaptive mapping (one hash
//!   lookup behind a read lock; nothing at all while no key is above its `min`).
//! * `binval:{<source>}:replicas` (the source's hash tag, beside its lease and checkpoint): the
//!   decisions, field = logical key, value = [`Stored`] as JSON. Written before a decision is
//!   applied, read at the start of every tenure and by the other commands (`replay`,
//!   `bootstrap`, `verify`, `inspect`, `status`), so a restart or a lease handover continues
//!   with the same counts and finishes a change a crash cut short.
//! * `binval:hot` (`binval_protocol::adaptive::HOT_SET_KEY`): logical key -> count, for app
//!   instances to load at start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use binval_protocol::adaptive::HOT_SET_KEY;
use serde::{Deserialize, Serialize};

use crate::error::{classify_redis, DefiniteError, Error};
use crate::redis::RedisConn;

/// What a key's changes write: `write` replicas, each recording `count` (field `n`).
/// `write > count` only while a shrink is announced and its extra replicas are not removed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCount {
    /// The count readers are told (field `n` of every record, and the hot set).
    pub count: u32,
    /// Replicas every change writes (`>= count`).
    pub write: u32,
}

/// The counts of the keys not at their mapping's `min` (module docs). Cheap to read when empty.
#[derive(Debug, Default)]
pub struct ReplicaCounts {
    map: RwLock<HashMap<String, KeyCount>>,
    len: AtomicUsize,
}

impl ReplicaCounts {
    /// The count of `key`, `None` when it is at its mapping's `min`.
    pub fn get(&self, key: &str) -> Option<KeyCount> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.map.read().unwrap_or_else(|e| e.into_inner()).get(key).copied()
    }

    /// Set (`Some`) or clear (`None`: back at `min`) the count of `key`.
    pub fn set(&self, key: &str, count: Option<KeyCount>) {
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        match count {
            Some(c) => {
                m.insert(key.to_string(), c);
            }
            None => {
                m.remove(key);
            }
        }
        self.len.store(m.len(), Ordering::Release);
        metrics::gauge!(crate::telemetry::names::ADAPTIVE_KEYS).set(m.len() as f64);
    }

    /// Every key with its count, sorted by key.
    pub fn entries(&self) -> Vec<(String, KeyCount)> {
        let m = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(String, KeyCount)> = m.iter().map(|(k, c)| (k.clone(), *c)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Replace this map with the stored decisions of `source` (at the start of a tenure or of
    /// a command); returns them.
    pub async fn load_from(&self, redis: &RedisConn, source: &str) -> Result<Vec<(String, Stored)>, Error> {
        let stored = load(redis, source).await?;
        let mut m = self.map.write().unwrap_or_else(|e| e.into_inner());
        m.clear();
        for (k, s) in &stored {
            m.insert(k.clone(), KeyCount { count: s.n, write: s.w.max(s.n) });
        }
        self.len.store(m.len(), Ordering::Release);
        metrics::gauge!(crate::telemetry::names::ADAPTIVE_KEYS).set(m.len() as f64);
        Ok(stored)
    }
}

/// Load the stored decisions of `source` into `mapper`'s counts when a mapping is adaptive
/// (what `replay`, `bootstrap` and `verify` do before they write or compare: each key gets the
/// replicas the leader gave it).
pub async fn load_for(mapper: &crate::mapping::Mapper, redis: &RedisConn, source: &str) -> Result<(), Error> {
    if mapper.any_adaptive() {
        mapper.counts().load_from(redis, source).await?;
    }
    Ok(())
}

/// One stored decision (module docs), as JSON:
/// `{"n":8,"w":8,"at_ms":1764790000000,"why":"fleet reads 180000/s ..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The count readers are told.
    pub n: u32,
    /// Replicas changes write (above `n` while a shrink waits for its removal).
    pub w: u32,
    /// When the decision was made, Unix ms.
    pub at_ms: u64,
    /// Why, for `binval inspect` and `binval status`: the fleet read rate and the budget, or
    /// the pin.
    pub why: String,
    /// The fleet read rate the decision saw, reads/s.
    #[serde(default)]
    pub reads_per_sec: f64,
    /// When the extra replicas of an announced shrink may be removed, Unix ms.
    #[serde(default)]
    pub remove_at_ms: Option<u64>,
}

/// The Redis key of `source`'s decisions: `binval:{<source>}:replicas`.
pub fn state_key(source: &str) -> String {
    format!("binval:{{{source}}}:replicas")
}

/// Read the stored decisions of `source`, sorted by key. A field that does not parse is a
/// definite error naming the key and field (something other than binval wrote it).
pub async fn load(redis: &RedisConn, source: &str) -> Result<Vec<(String, Stored)>, Error> {
    let key = state_key(source);
    let mut c = redis.clone();
    let raw: HashMap<String, String> = c.query(redis::cmd("HGETALL").arg(&key)).await.map_err(|e| classify_redis(e, &key))?;
    let mut out = Vec::with_capacity(raw.len());
    for (field, v) in raw {
        let s: Stored = serde_json::from_str(&v).map_err(|e| DefiniteError::RedisRefused {
            key: format!("{key} field {field}"),
            message: format!("not a replica-count decision: {e}"),
        })?;
        out.push((field, s));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Store (`Some`) or clear (`None`) the decision for `key`, and keep the hot set in step: a
/// key is listed there with its count while that count is above 1.
pub async fn store(redis: &RedisConn, source: &str, key: &str, s: Option<&Stored>) -> Result<(), Error> {
    let skey = state_key(source);
    let mut c = redis.clone();
    match s {
        Some(s) => {
            let v = serde_json::to_string(s).expect("a decision serializes");
            c.query::<()>(redis::cmd("HSET").arg(&skey).arg(key).arg(v)).await.map_err(|e| classify_redis(e, &skey))?;
        }
        None => {
            c.query::<()>(redis::cmd("HDEL").arg(&skey).arg(key)).await.map_err(|e| classify_redis(e, &skey))?;
        }
    }
    match s.map(|s| s.n).filter(|n| *n > 1) {
        Some(n) => c.query::<()>(redis::cmd("HSET").arg(HOT_SET_KEY).arg(key).arg(n)).await,
        None => c.query::<()>(redis::cmd("HDEL").arg(HOT_SET_KEY).arg(key)).await,
    }
    .map_err(|e| classify_redis(e, HOT_SET_KEY))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_set_read_and_cleared() {
        let c = ReplicaCounts::default();
        assert_eq!(c.get("k"), None);
        c.set("k", Some(KeyCount { count: 1, write: 8 }));
        assert_eq!(c.get("k"), Some(KeyCount { count: 1, write: 8 }));
        assert_eq!(c.entries().len(), 1);
        c.set("k", None);
        assert_eq!(c.get("k"), None);
        assert_eq!(state_key("shop"), "binval:{shop}:replicas");
    }

    #[test]
    fn stored_decisions_round_trip() {
        let s = Stored { n: 8, w: 8, at_ms: 1, why: "x".into(), reads_per_sec: 1e5, remove_at_ms: None };
        let back: Stored = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let old: Stored = serde_json::from_str(r#"{"n":2,"w":4,"at_ms":5,"why":"y"}"#).unwrap();
        assert_eq!((old.n, old.w, old.remove_at_ms), (2, 4, None));
    }
}
