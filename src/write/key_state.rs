//! What Redis holds for logical keys, read back in batches: each key's version token and the
//! record of each of its suffix replicas (payload, fence position, tombstone flag, fencing
//! token; layout in `binval_protocol::fence`). Used where binval compares Redis with what it
//! would write: dry runs ([`crate::write::apply`]), `binval verify`, `binval inspect`,
//! `binval bootstrap --dry-run`.
//!
//! Reads go through [`RedisConn::run_batch`]: one pipeline per master (`GET K:ver` and
//! `HMGET K:rN d p t f` of many keys), so reading a million keys costs round trips per
//! thousands of keys, not per key. Nothing here takes a lock or a snapshot: a key written
//! between two of its commands is read half old, half new; callers that judge what they read
//! (verify) read again before they conclude.

use binval_protocol::fence::{FIELD_DATA, FIELD_FENCING_TOKEN, FIELD_POSITION, FIELD_TOMBSTONE};
use binval_protocol::{hash_slot, parse_version, replica_key, version_key};
use redis::{RedisError, Value};

use crate::error::{classify_redis, Error};
use crate::redis::RedisConn;

/// Keys per batch: bounds the replies held at once.
const KEYS_PER_BATCH: usize = 2048;

/// One suffix replica as read (`HMGET K:rN d p t f`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaState {
    /// The hash exists (it has at least one of the fields).
    pub exists: bool,
    /// The payload (`d`): absent in a tombstone and in an invalidate-mode record.
    pub payload: Option<Vec<u8>>,
    /// The fence position of the write that made the record (`p`); `None` when absent or not
    /// a decimal integer.
    pub position: Option<u64>,
    /// A tombstone (`t` = 1): the row was deleted.
    pub tombstone: bool,
    /// The fencing token of the writer (`f`).
    pub fencing_token: Option<u64>,
}

/// A logical key as read: its version token and its replicas, index for index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    /// The version token `K:ver`; `None` when the key has none.
    pub version: Option<u64>,
    /// Set when `K:ver` holds something that is not a decimal integer (the message names it).
    pub version_invalid: Option<String>,
    /// `K:r0 .. K:r{N-1}`.
    pub replicas: Vec<ReplicaState>,
}

impl KeyState {
    /// The newest fence position any replica or the token holds (0 when none).
    pub fn newest_position(&self) -> u64 {
        self.replicas.iter().filter_map(|r| r.position).chain(self.version).max().unwrap_or(0)
    }

    /// The positions the key holds: the token's, then each replica's (`None`: absent). Two
    /// reads of a key whose positions are equal saw no write in between.
    pub fn positions(&self) -> (Option<u64>, Vec<Option<u64>>) {
        (self.version, self.replicas.iter().map(|r| r.position).collect())
    }
}

impl RedisConn {
    /// Read the version token and the `replicas` replicas of each `(key, replicas)`, in
    /// batches of pipelines (module docs). Returns one [`KeyState`] per key, index for index.
    ///
    /// Errors: Redis errors classified per [`classify_redis`] naming the key (a replica that is
    /// not a hash is `WRONGTYPE`, definite).
    pub async fn read_key_states(&self, keys: &[(&str, u32)]) -> Result<Vec<KeyState>, Error> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(KEYS_PER_BATCH) {
            // Command k of the batch: (key index in chunk, None = token | Some(replica)).
            let cmds: Vec<(usize, Option<u32>)> = chunk
                .iter()
                .enumerate()
                .flat_map(|(i, &(_, n))| std::iter::once((i, None)).chain((0..n).map(move |r| (i, Some(r)))))
                .collect();
            let make = |k: usize| {
                let (i, which) = cmds[k];
                match which {
                    None => {
                        let v = version_key(chunk[i].0);
                        let mut cmd = redis::cmd("GET");
                        cmd.arg(&v);
                        (hash_slot(v.as_bytes()), cmd)
                    }
                    Some(r) => {
                        let rk = replica_key(chunk[i].0, r);
                        let mut cmd = redis::cmd("HMGET");
                        cmd.arg(&rk).arg(FIELD_DATA).arg(FIELD_POSITION).arg(FIELD_TOMBSTONE).arg(FIELD_FENCING_TOKEN);
                        (hash_slot(rk.as_bytes()), cmd)
                    }
                }
            };
            let replies = self.run_batch(cmds.len(), &make, None).await;
            let mut states: Vec<KeyState> =
                chunk.iter().map(|&(_, n)| KeyState { replicas: Vec::with_capacity(n as usize), ..KeyState::default() }).collect();
            for (&(i, which), reply) in cmds.iter().zip(replies) {
                let name = || match which {
                    None => version_key(chunk[i].0),
                    Some(r) => replica_key(chunk[i].0, r),
                };
                let v = reply.map_err(|e| classify_redis(e, &name()))?;
                match which {
                    None => {
                        let raw: Option<Vec<u8>> = from_value(v, &name)?;
                        match parse_version(raw.as_deref()) {
                            Ok(0) if raw.is_none() => {}
                            Ok(n) => states[i].version = Some(n),
                            Err(m) => states[i].version_invalid = Some(m.to_string()),
                        }
                    }
                    Some(_) => {
                        let (d, p, t, f): (Option<Vec<u8>>, Option<String>, Option<String>, Option<String>) = from_value(v, &name)?;
                        let exists = d.is_some() || p.is_some() || t.is_some() || f.is_some();
                        states[i].replicas.push(ReplicaState {
                            exists,
                            payload: d,
                            position: p.and_then(|p| p.parse().ok()),
                            tombstone: t.as_deref() == Some("1"),
                            fencing_token: f.and_then(|f| f.parse().ok()),
                        });
                    }
                }
            }
            out.extend(states);
        }
        Ok(out)
    }

    /// `PTTL` of each key of `keys` (ms; -1: no TTL, -2: no such key), index for index.
    pub async fn read_ttls(&self, keys: &[String]) -> Result<Vec<i64>, Error> {
        let make = |k: usize| {
            let mut cmd = redis::cmd("PTTL");
            cmd.arg(&keys[k]);
            (hash_slot(keys[k].as_bytes()), cmd)
        };
        let replies = self.run_batch(keys.len(), &make, None).await;
        keys.iter().zip(replies).map(|(k, r)| r.map_err(|e| classify_redis(e, k)).and_then(|v| from_value(v, &|| k.clone()))).collect()
    }
}

/// A reply as `T`; a reply of another shape is a classified error naming the key `name()`.
fn from_value<T: redis::FromRedisValue>(v: Value, name: &dyn Fn() -> String) -> Result<T, Error> {
    redis::from_redis_value(v).map_err(|e| classify_redis(RedisError::from(e), &name()))
}
