//! The Redis side of a count change (module docs of [`super`]): copy replica 0 into the
//! replicas a larger count adds, announce a count on the replicas that exist, remove the
//! replicas a smaller count no longer has. Every step is fenced by the fencing token, and the
//! copy by position too, so each is safe to repeat (a restart finishes what a crash cut short).
//!
//! These run inside the apply loop, between groups, after every group sent before them is
//! done (`write::apply::apply_loop`): no change of the key is in flight with another count.

use std::collections::HashMap;

use binval_protocol::adaptive::{replica_count_script, replica_remove_script};
use binval_protocol::fence::replica_write_script;
use binval_protocol::replica_key;

use crate::error::{classify_redis, Error, TransientError};
use crate::redis::RedisConn;

/// What a resize step did, for the log and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    /// Replicas written by a copy (0 when they already held replica 0's change, or a newer one).
    pub copied: u32,
    /// Replicas whose count field was set.
    pub announced: u32,
    /// Replicas removed.
    pub removed: u32,
}

/// Grow `key` from `from` to `to` replicas: copy replica 0's record (payload or tombstone or
/// invalidate marker, its fence position, its remaining TTL) into replicas `from..to` with
/// `n = to`, then set `n = to` on replicas `0..from`. A key without replica 0 (never written,
/// expired) has nothing to copy: only the count is recorded where replicas exist.
///
/// Errors: [`TransientError::LeaseLost`] when a replica was written under a newer fencing
/// token; Redis errors per [`classify_redis`], naming the key.
pub async fn grow(redis: &RedisConn, source: &str, key: &str, from: u32, to: u32, token: u64) -> Result<Resized, Error> {
    let mut out = Resized::default();
    let mut c = redis.clone();
    let r0 = replica_key(key, 0);
    let rec: HashMap<String, Vec<u8>> = c.query(redis::cmd("HGETALL").arg(&r0)).await.map_err(|e| classify_redis(e, &r0))?;
    if let Some(p) = rec.get("p") {
        let pttl: i64 = c.query(redis::cmd("PTTL").arg(&r0)).await.map_err(|e| classify_redis(e, &r0))?;
        let ttl = if pttl > 0 { pttl.to_string() } else { "0".into() };
        let (kind, data) = match (rec.get("d"), rec.get("t")) {
            (Some(d), _) => ("set", String::from_utf8_lossy(d).into_owned()),
            (None, Some(_)) => ("del", String::new()),
            (None, None) => ("inv", String::new()),
        };
        let args = [String::from_utf8_lossy(p).into_owned(), token.to_string(), kind.into(), data, ttl, to.to_string()];
        let script = replica_write_script();
        for i in from.max(1)..to {
            let rk = replica_key(key, i);
            let code: i64 = c.eval(&script, std::slice::from_ref(&rk), &args).await.map_err(|e| classify_redis(e, &rk))?;
            match code {
                1 => out.copied += 1,
                c if c < 0 => return Err(lost(source, &rk, token)),
                _ => {}
            }
        }
    }
    out.announced = announce(redis, source, key, 0..from.min(to), to, token).await?;
    Ok(out)
}

/// Set `n = count` on the existing replicas `range` of `key`; returns how many were set.
pub async fn announce(
    redis: &RedisConn,
    source: &str,
    key: &str,
    range: std::ops::Range<u32>,
    count: u32,
    token: u64,
) -> Result<u32, Error> {
    each_replica(redis, source, key, range, &replica_count_script(), &[token.to_string(), count.to_string()], token).await
}

/// Remove replicas `range` of `key` (a smaller count no longer has them); returns how many
/// existed.
pub async fn remove(redis: &RedisConn, source: &str, key: &str, range: std::ops::Range<u32>, token: u64) -> Result<u32, Error> {
    each_replica(redis, source, key, range, &replica_remove_script(), &[token.to_string()], token).await
}

/// Run a fenced one-replica `script` with `args` on replicas `range` of `key`; the number of
/// replies `1`. A reply below 0 (a newer fencing token) is a lost lease.
async fn each_replica(
    redis: &RedisConn,
    source: &str,
    key: &str,
    range: std::ops::Range<u32>,
    script: &str,
    args: &[String],
    token: u64,
) -> Result<u32, Error> {
    let mut c = redis.clone();
    let mut n = 0;
    for i in range {
        let rk = replica_key(key, i);
        let code: i64 = c.eval(script, std::slice::from_ref(&rk), args).await.map_err(|e| classify_redis(e, &rk))?;
        match code {
            1 => n += 1,
            c if c < 0 => return Err(lost(source, &rk, token)),
            _ => {}
        }
    }
    Ok(n)
}

fn lost(source: &str, rk: &str, token: u64) -> Error {
    TransientError::LeaseLost {
        source_name: source.to_string(),
        message: format!("replica {rk} was written under a newer fencing token than {token} (while changing its replica count)"),
    }
    .into()
}
