//! Redis stage: per changed key, in commit order, write all N suffix replicas, wait for every
//! acknowledgement, then move the version token `K:ver` to the change's fence position.
//!
//! Every single-key write is **version-fenced** (see `binval_protocol::fence`): a Lua script
//! applies it only when its fence position is newer than what the key holds, so re-applying
//! changes after a crash, a replay or a duplicate never moves a replica or a token backwards
//! (invariant I2), and a delete leaves a tombstone that refuses late, older writes.
//!
//! * Standalone: replicas and token in one Lua script per key change (scripts run atomically),
//!   so a reader sees all of it or none of it.
//! * Cluster: replicas live in different hash slots, usually on different masters, and Redis
//!   has no atomicity across slots (the redis crate refuses cross-slot pipelines). So binval
//!   sends each replica write to its own slot's master concurrently (the multiplexed cluster
//!   connection batches the commands per node), waits until every one is acknowledged, and only
//!   then runs the version script on `K:ver`. Order and idempotence carry correctness instead of atomicity: a
//!   reader reads the token first, so it can pair a newer value with an older version (which
//!   the next invalidation evicts) but never an older value with a newer version.
//!
//! Changes of different keys within one transaction are applied concurrently; changes of the
//! same key strictly in order. Errors are classified transient (connection, timeout, cluster
//! re-sharding) or definite (e.g. `WRONGTYPE`) by [`crate::error::classify_redis`].
//!
//! The connection itself ([`RedisConn`]: connect, commands, scripts, SCAN over the masters) is
//! the crate-wide client in [`crate::redis_conn`]; this module adds the fenced writes to it.

use std::collections::HashMap;
use std::sync::Arc;

use binval_protocol::fence::{self, FIELD_POSITION};
use binval_protocol::{parse_version, replica_key, version_key, FencePosition, KeyTemplate, Op};
use futures::stream::{self, StreamExt, TryStreamExt};

use crate::error::{classify_redis, DefiniteError, Error, TransientError};
use crate::mapping::{KeyChange, Mapper};
use crate::redis_conn::RedisConn;

/// How many keys of one transaction are written concurrently.
const KEY_CONCURRENCY: usize = 64;

/// The fenced write stage, as methods of the crate-wide client.
impl RedisConn {
    /// Apply one key change at fence position `w.position` under fencing token
    /// `w.fencing_token`, following "Writing one key" in `binval_protocol::fence`: skip when
    /// the version token is already newer, else every replica through the replica script, then
    /// the version token. Re-applying a change is a no-op; an older change never overwrites a
    /// newer one.
    ///
    /// Errors: [`TransientError::LeaseLost`] when a replica was written under a newer fencing
    /// token; transient/definite Redis errors per [`classify_redis`].
    pub async fn apply(&self, ch: &KeyChange, w: &WriteCtx) -> Result<Applied, Error> {
        let pos = w.position;
        let vkey = version_key(&ch.key);
        let args = replica_args(ch, pos, w.fencing_token, w.tombstone_ttl_ms);
        let (written, version_moved, lost) = match self {
            RedisConn::Standalone(c) => {
                let mut c = c.clone();
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(scripts().key.get_hash()).arg(1 + ch.replicas).arg(&vkey);
                for i in 0..ch.replicas {
                    cmd.arg(replica_key(&ch.key, i));
                }
                cmd.arg(&args);
                let (w, m, l, skipped): (u32, i64, i64, i64) = cmd.query_async(&mut c).await.map_err(|e| classify_redis(e, &ch.key))?;
                if skipped == 1 {
                    return Ok(Applied { version: pos.0, replicas_written: 0, version_moved: false, skipped_newer: true });
                }
                (w, m == 1, l == 1)
            }
            RedisConn::Cluster(c) => {
                // 1. A newer change fully applied? Then nothing to do (see binval_protocol::fence).
                if self.read_version(&ch.key).await? > pos.0 {
                    return Ok(Applied { version: pos.0, replicas_written: 0, version_moved: false, skipped_newer: true });
                }
                // 2. Every replica, concurrently, each fenced on its own.
                let writes = (0..ch.replicas).map(|i| {
                    let mut c = c.clone();
                    let rk = replica_key(&ch.key, i);
                    let args = &args;
                    async move {
                        let mut inv = scripts().replica.key(&rk);
                        inv.arg(args);
                        let r: i64 = inv.invoke_async(&mut c).await.map_err(|e| classify_redis(e, &rk))?;
                        crate::failpoint::hit("redis.after_replica");
                        Ok::<i64, Error>(r)
                    }
                });
                let results = futures::future::try_join_all(writes).await?;
                if results.iter().any(|r| *r < 0) {
                    (0, false, true)
                } else {
                    crate::failpoint::hit("redis.before_version");
                    // 3. The token, only after every replica acknowledged.
                    let mut c = c.clone();
                    let v: i64 = scripts()
                        .version
                        .key(&vkey)
                        .arg(pos.0.to_string())
                        .invoke_async(&mut c)
                        .await
                        .map_err(|e| classify_redis(e, &vkey))?;
                    (results.iter().filter(|r| **r == 1).count() as u32, v == 1, false)
                }
            }
        };
        if lost {
            return Err(TransientError::LeaseLost {
                source_name: w.source_name.to_string(),
                message: format!("a replica of key {} was written under a newer fencing token than {}", ch.key, w.fencing_token),
            }
            .into());
        }
        Ok(Applied { version: pos.0, replicas_written: written, version_moved, skipped_newer: false })
    }

    async fn apply_group(&self, changes: &[KeyChange], idx: Vec<usize>, w: &WriteCtx) -> Result<Vec<(usize, Applied)>, Error> {
        let mut out = Vec::with_capacity(idx.len());
        for i in idx {
            out.push((i, self.apply(&changes[i], w).await?));
        }
        Ok(out)
    }

    /// Apply the key changes of one transaction (all at the transaction's fence position);
    /// returns the outcome of each change, index for index. Callers pass at most one change
    /// per key (see [`crate::mapping::collapse_per_key`]): two changes at the same position would be a no-op
    /// re-apply for the second. Different keys are applied concurrently.
    pub async fn apply_all(&self, changes: &[KeyChange], w: &WriteCtx) -> Result<Vec<Applied>, Error> {
        let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (i, c) in changes.iter().enumerate() {
            by_key
                .entry(c.key.as_str())
                .or_insert_with(|| {
                    order.push(c.key.as_str());
                    Vec::new()
                })
                .push(i);
        }
        let groups: Vec<Vec<usize>> = order.into_iter().map(|k| by_key.remove(k).unwrap_or_default()).collect();
        let mut applied = vec![Applied::default(); changes.len()];
        let results: Vec<Vec<(usize, Applied)>> =
            stream::iter(groups).map(|idx| self.apply_group(changes, idx, w)).buffer_unordered(KEY_CONCURRENCY).try_collect().await?;
        for (i, a) in results.into_iter().flatten() {
            applied[i] = a;
        }
        Ok(applied)
    }

    /// Mark every key of `template` stale at `w.position` (TRUNCATE / DROP TABLE of its table):
    /// `SCAN` every master for the template's version tokens (`<glob>:ver`), then apply an
    /// invalidate-kind change (replicas keep only the position: readers see no payload and
    /// fall back to their loader) through the same fenced writes, so keys written after the
    /// statement (newer positions) are left alone. Returns the number of keys found.
    ///
    /// Cost: one full `SCAN` of the keyspace per template (TRUNCATE is rare; the writes are
    /// batched `KEY_CONCURRENCY` keys at a time).
    pub async fn invalidate_template(&self, template: &KeyTemplate, replicas: u32, table: &Arc<str>, w: &WriteCtx) -> Result<u64, Error> {
        let pattern = format!("{}:ver", template.glob());
        // Each logical key once, sorted (the order the writes go in, 4096 keys at a time).
        let mut keys: Vec<String> =
            self.scan_match(&pattern).await?.into_iter().filter_map(|k| k.strip_suffix(":ver").map(String::from)).collect();
        keys.sort();
        keys.dedup();
        let n = keys.len() as u64;
        for chunk in keys.chunks(4096) {
            let changes: Vec<KeyChange> = chunk
                .iter()
                .map(|k| KeyChange { key: k.clone(), op: Op::Update, table: table.clone(), payload: None, replicas, ttl_secs: 0 })
                .collect();
            self.apply_all(&changes, w).await?;
        }
        Ok(n)
    }

    /// Mark every key of the mapped tables `tables` stale ([`RedisConn::invalidate_template`]
    /// for each of their key templates). Returns the (table, template) pairs done, for the
    /// caller's `truncate` events.
    pub async fn invalidate_tables<'m>(
        &self,
        mapper: &'m Mapper,
        tables: &[String],
        w: &WriteCtx,
    ) -> Result<Vec<(&'m str, &'m KeyTemplate)>, Error> {
        let mut done = Vec::new();
        for table in tables {
            let Some((name, templates, replicas)) = mapper.templates_of(table) else { continue };
            let table_arc: Arc<str> = Arc::from(name);
            for t in templates {
                let n = self.invalidate_template(t, replicas, &table_arc, w).await?;
                tracing::info!(table = %name, template = %t, keys = n, position = %w.position, "table-wide DDL: every key of the template marked stale");
                done.push((name, t));
            }
        }
        Ok(done)
    }

    /// The version token of logical key `key` (0 when never written). A token that is not a
    /// decimal integer is a definite error naming the key.
    pub async fn read_version(&self, key: &str) -> Result<u64, Error> {
        let vkey = version_key(key);
        let mut c = self.clone();
        let raw: Option<Vec<u8>> = c.query(redis::cmd("GET").arg(&vkey)).await.map_err(|e| classify_redis(e, &vkey))?;
        parse_version(raw.as_deref()).map_err(|m| DefiniteError::RedisRefused { key: vkey, message: m }.into())
    }

    /// The version token of `key` and the fence position stored in each of its `replicas`
    /// replicas (`None`: missing), for replay dry runs.
    pub async fn read_positions(&self, key: &str, replicas: u32) -> Result<(u64, Vec<Option<u64>>), Error> {
        let version = self.read_version(key).await?;
        let mut c = self.clone();
        let mut positions = Vec::with_capacity(replicas as usize);
        for r in 0..replicas {
            let rk = replica_key(key, r);
            let p: Option<String> = c.query(redis::cmd("HGET").arg(&rk).arg(FIELD_POSITION)).await.map_err(|e| classify_redis(e, &rk))?;
            positions.push(p.and_then(|p| p.parse().ok()));
        }
        Ok((version, positions))
    }
}

/// What one key change did in Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// The change's version (its fence position); the event carries it.
    pub version: u64,
    /// Replicas that actually changed (0 on a re-apply of an applied change).
    pub replicas_written: u32,
    /// Whether the version token moved to `version`.
    pub version_moved: bool,
    /// The key's version token was already newer than this change: nothing was written.
    pub skipped_newer: bool,
}

/// Per-transaction write context.
#[derive(Debug, Clone)]
pub struct WriteCtx {
    /// Fence position of the transaction (the order of writes, see [`crate::write::fence`]).
    pub position: FencePosition,
    /// Fencing token of the tenure writing (see [`crate::ha::lease`]): replicas refuse writes
    /// under an older token than the one they hold.
    pub fencing_token: u64,
    /// Source name (`source.name`), named by [`TransientError::LeaseLost`].
    pub source_name: Arc<str>,
    /// Tombstone TTL, ms.
    pub tombstone_ttl_ms: u64,
}

struct Scripts {
    replica: redis::Script,
    version: redis::Script,
    key: redis::Script,
}

fn scripts() -> &'static Scripts {
    static S: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let (rc, vc) = (fence::replica_write_script(), fence::version_bump_script());
        Scripts { replica: redis::Script::new(&rc), version: redis::Script::new(&vc), key: redis::Script::new(&fence::key_apply_script()) }
    })
}

/// ARGV of the replica script for `ch`.
fn replica_args(ch: &KeyChange, pos: FencePosition, fencing_token: u64, tombstone_ttl_ms: u64) -> Vec<String> {
    let (kind, payload, ttl_ms) = match (&ch.payload, ch.op) {
        (_, Op::Delete) => ("del", String::new(), tombstone_ttl_ms),
        (Some(p), _) => ("set", p.clone(), ch.ttl_secs * 1000),
        // Invalidate mode: no payload, readers go to their loader.
        (None, _) => ("inv", String::new(), if ch.ttl_secs > 0 { ch.ttl_secs * 1000 } else { tombstone_ttl_ms }),
    };
    vec![pos.0.to_string(), fencing_token.to_string(), kind.into(), payload, ttl_ms.to_string()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(key: &str, op: Op, payload: Option<&str>) -> KeyChange {
        KeyChange { key: key.into(), op, table: std::sync::Arc::from("db.t"), payload: payload.map(String::from), replicas: 1, ttl_secs: 0 }
    }

    #[test]
    fn replica_arguments_per_kind() {
        let p = FencePosition(42);
        assert_eq!(replica_args(&ch("k", Op::Update, Some("{}")), p, 7, 1000), ["42", "7", "set", "{}", "0"]);
        assert_eq!(replica_args(&ch("k", Op::Delete, None), p, 7, 1000), ["42", "7", "del", "", "1000"]);
        assert_eq!(replica_args(&ch("k", Op::Update, None), p, 7, 1000), ["42", "7", "inv", "", "1000"]);
    }
}
