//! Redis stage: per changed key, write all N suffix replicas, wait for every acknowledgement,
//! then move the version token `K:ver` to the change's fence position.
//!
//! Every single-key write is **version-fenced** (see `binval_protocol::fence`): a Lua script
//! applies it only when its fence position is newer than what the key holds, so re-applying
//! changes after a crash, a replay or a duplicate never moves a replica or a token backwards
//! (invariant I2), and a delete leaves a tombstone that refuses late, older writes.
//!
//! The changes of a whole group of transactions (see `write::apply`) are written together,
//! one change per key, each at its own fence position, in as few round trips as the order
//! allows, with one pipeline per master per step ([`RedisConn::run_batch`]):
//!
//! * Standalone: replicas and token of each key in one Lua script (scripts run atomically,
//!   so a reader sees all of a key's change or none of it); the whole group is one step.
//! * Cluster: replicas live in different hash slots, usually on different masters, and Redis
//!   has no atomicity across slots. Three steps, each one pipeline per master, all masters at
//!   once: (1) read the version tokens (a key whose token is already newer is skipped: see
//!   "Writing one key" in `binval_protocol::fence`); (2) every replica of every key; (3) once
//!   *every* replica write of the group is acknowledged, the version tokens. Order and
//!   idempotence carry correctness instead of atomicity: no token moves before all replicas of
//!   its change are written (I1).
//!
//!   The read of step 1 waits at most [`TOKEN_READ_WAIT`]: when a master does not answer in
//!   time, the group's replicas are written without it, so the masters that answer keep
//!   receiving every change while one is frozen or failing over (issue #22; the groups behind
//!   a stuck one are sent meanwhile, see `write::apply::apply_loop`). What the skipped check
//!   would have prevented: an *older* change re-applied (a restart from the checkpoint) into a
//!   replica that is missing while its token is newer (a tombstone expired after
//!   `redis.tombstone_ttl_ms`, or lost data), for the few groups written while a master does
//!   not answer. Every replica write is still fenced by its own position.
//!
//! Errors are classified transient (connection, timeout, cluster re-sharding) or definite
//! (e.g. `WRONGTYPE`) by [`crate::error::classify_redis`], naming the key.
//!
//! The connection itself ([`RedisConn`]: connect, commands, scripts, batches, SCAN over the
//! masters) is the crate-wide client in [`crate::redis`]; this module adds the fenced
//! writes to it.

use std::sync::Arc;

use binval_protocol::fence;
use binval_protocol::{hash_slot, parse_version, replica_key, version_key, FencePosition, KeyTemplate, Op};
use redis::{RedisError, RedisResult, Value};

use crate::error::{classify_redis, DefiniteError, Error, TransientError};

/// How long step 1 of a Cluster group (reading the version tokens) may take before the
/// replicas are written without it (module docs).
pub const TOKEN_READ_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
use crate::mapping::{KeyChange, Mapper};
use crate::redis::RedisConn;

/// The fenced write stage, as methods of the crate-wide client.
impl RedisConn {
    /// Apply key changes at fence position `w.position` under fencing token
    /// `w.fencing_token` ([`RedisConn::apply_batch`] with one position for all); returns the
    /// outcome of each change, index for index. Callers pass at most one change per key (see
    /// [`crate::mapping::collapse_per_key`]): two changes at the same position would be a
    /// no-op re-apply for the second.
    pub async fn apply_all(&self, changes: &[KeyChange], w: &WriteCtx) -> Result<Vec<Applied>, Error> {
        let positions = vec![w.position; changes.len()];
        self.apply_batch(changes, &positions, w).await
    }

    /// Apply `changes[i]` at fence position `positions[i]` (this, not `w.position`, is each
    /// change's position), under fencing token `w.fencing_token`, following "Writing one key"
    /// in `binval_protocol::fence`: a key whose version token is already newer is skipped,
    /// else every replica goes through the replica script, then the version token moves. At
    /// most one change per key. Re-applying a change is a no-op; an older change never
    /// overwrites a newer one. Returns the outcome of each change, index for index.
    ///
    /// Errors: [`TransientError::LeaseLost`] when a replica was written under a newer fencing
    /// token (no token of the batch moves then); transient/definite Redis errors per
    /// [`classify_redis`], naming the key.
    pub async fn apply_batch(&self, changes: &[KeyChange], positions: &[FencePosition], w: &WriteCtx) -> Result<Vec<Applied>, Error> {
        assert_eq!(changes.len(), positions.len(), "one position per change");
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let mut applied: Vec<Applied> = positions.iter().map(|p| Applied { version: p.0, ..Applied::default() }).collect();
        match self {
            RedisConn::Standalone(_) => self.apply_standalone(changes, positions, w, &mut applied).await?,
            RedisConn::Cluster(..) => self.apply_cluster(changes, positions, w, &mut applied).await?,
        }
        Ok(applied)
    }

    /// Standalone: one whole-key script per change, all in pipelines.
    async fn apply_standalone(
        &self,
        changes: &[KeyChange],
        positions: &[FencePosition],
        w: &WriteCtx,
        applied: &mut [Applied],
    ) -> Result<(), Error> {
        let sha = scripts().key.get_hash();
        let make = |i: usize| {
            let ch = &changes[i];
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1 + ch.replicas).arg(version_key(&ch.key));
            for r in 0..ch.replicas {
                cmd.arg(replica_key(&ch.key, r));
            }
            push_replica_args(&mut cmd, ch, positions[i], w);
            (0, cmd)
        };
        let replies = self.script_batch(changes.len(), make, None).await;
        let mut lost = None;
        for ((a, ch), reply) in applied.iter_mut().zip(changes).zip(replies) {
            let (written, moved, l, skipped): (u32, i64, i64, i64) = reply_as(reply, || ch.key.clone())?;
            a.replicas_written = written;
            a.version_moved = moved == 1;
            a.skipped_newer = skipped == 1;
            if l == 1 {
                lost = Some(&ch.key);
            }
        }
        match lost {
            Some(key) => Err(lease_lost(key, w)),
            None => Ok(()),
        }
    }

    /// Cluster: tokens read (for at most [`TOKEN_READ_WAIT`]), then every replica, then the
    /// tokens (module docs).
    async fn apply_cluster(
        &self,
        changes: &[KeyChange],
        positions: &[FencePosition],
        w: &WriteCtx,
        applied: &mut [Applied],
    ) -> Result<(), Error> {
        // 1. Version tokens: a key whose token is newer than the change is fully applied.
        let read = |i: usize| {
            let vkey = version_key(&changes[i].key);
            let slot = hash_slot(vkey.as_bytes());
            let mut cmd = redis::cmd("GET");
            cmd.arg(vkey);
            (slot, cmd)
        };
        let mut todo: Vec<usize> = Vec::with_capacity(changes.len());
        let Ok(versions) = tokio::time::timeout(TOKEN_READ_WAIT, self.run_batch(changes.len(), &read, None)).await else {
            // A master does not answer in time (frozen, failing over): write every replica
            // without the check rather than hold back the masters that answer; each replica
            // write is still fenced by its own position (see TOKEN_READ_WAIT).
            metrics::counter!(crate::telemetry::names::TOKEN_READS_SKIPPED).increment(1);
            todo.extend(0..changes.len());
            return self.write_replicas_then_tokens(changes, positions, w, applied, todo).await;
        };
        for (i, r) in versions.into_iter().enumerate() {
            let vkey = || version_key(&changes[i].key);
            let raw: Option<Vec<u8>> = reply_as(r, vkey)?;
            let v = parse_version(raw.as_deref()).map_err(|m| DefiniteError::RedisRefused { key: vkey(), message: m.to_string() })?;
            if v > positions[i].0 {
                applied[i].skipped_newer = true;
            } else {
                todo.push(i);
            }
        }
        self.write_replicas_then_tokens(changes, positions, w, applied, todo).await
    }

    /// Steps 2 and 3 of [`RedisConn::apply_cluster`] for the changes `todo`.
    async fn write_replicas_then_tokens(
        &self,
        changes: &[KeyChange],
        positions: &[FencePosition],
        w: &WriteCtx,
        applied: &mut [Applied],
        todo: Vec<usize>,
    ) -> Result<(), Error> {
        // 2. Every replica of every key still to write, each fenced on its own.
        let replicas: Vec<(usize, u32)> = todo.iter().flat_map(|&i| (0..changes[i].replicas).map(move |r| (i, r))).collect();
        let sha = scripts().replica.get_hash();
        let write = |k: usize| {
            let (i, r) = replicas[k];
            let rk = replica_key(&changes[i].key, r);
            let slot = hash_slot(rk.as_bytes());
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1).arg(rk);
            push_replica_args(&mut cmd, &changes[i], positions[i], w);
            (slot, cmd)
        };
        let replies = self.script_batch(replicas.len(), write, Some("redis.after_replica")).await;
        let mut lost = None;
        for (&(i, r), reply) in replicas.iter().zip(replies) {
            let code: i64 = reply_as(reply, || replica_key(&changes[i].key, r))?;
            match code {
                1 => applied[i].replicas_written += 1,
                c if c < 0 => lost = Some(i),
                _ => {}
            }
        }
        if let Some(i) = lost {
            return Err(lease_lost(&changes[i].key, w));
        }
        // 3. The tokens, only after every replica write of the batch is acknowledged.
        for _ in &todo {
            crate::failpoint::hit("redis.before_version");
        }
        let sha = scripts().version.get_hash();
        let bump = |k: usize| {
            let i = todo[k];
            let vkey = version_key(&changes[i].key);
            let slot = hash_slot(vkey.as_bytes());
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(sha).arg(1).arg(vkey).arg(positions[i].0);
            (slot, cmd)
        };
        let replies = self.script_batch(todo.len(), bump, None).await;
        for (&i, reply) in todo.iter().zip(replies) {
            let moved: i64 = reply_as(reply, || version_key(&changes[i].key))?;
            applied[i].version_moved = moved == 1;
        }
        Ok(())
    }

    /// [`RedisConn::run_batch`] of the `n` script calls `make(0..n)`; calls refused with
    /// `NOSCRIPT` (the server lost its script cache: a restart, a failover) are made again once
    /// after the scripts are loaded anew.
    async fn script_batch(
        &self,
        n: usize,
        make: impl Fn(usize) -> (u16, redis::Cmd) + Sync,
        ack_point: Option<&'static str>,
    ) -> Vec<RedisResult<Value>> {
        let mut out = self.run_batch(n, &make, ack_point).await;
        let again: Vec<usize> = (0..n)
            .filter(|&i| matches!(&out[i], Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)))
            .collect();
        if !again.is_empty() {
            tracing::info!(calls = again.len(), "Redis lost binval's scripts (NOSCRIPT); loading them again");
            if let Err(e) = self.load_scripts().await {
                tracing::warn!(error = %e, "loading the scripts again failed");
                return out;
            }
            let retry = |k: usize| make(again[k]);
            let replies = self.run_batch(again.len(), &retry, ack_point).await;
            for (i, r) in again.into_iter().zip(replies) {
                out[i] = r;
            }
        }
        out
    }

    /// Mark every key of `template` stale at `w.position` (TRUNCATE / DROP TABLE of its table):
    /// `SCAN` every master for the template's version tokens (`<glob>:ver`), then apply an
    /// invalidate-kind change (replicas keep only the position: readers see no payload and
    /// fall back to their loader) through the same fenced writes, so keys written after the
    /// statement (newer positions) are left alone. Returns the number of keys found.
    ///
    /// Cost: one full `SCAN` of the keyspace per template (TRUNCATE is rare; the writes are
    /// batched `KEY_CONCURRENCY` keys at a time).
    ///
    /// `replicas` is the mapping's setting; with an adaptive one, `counts` (the mapping's) gives
    /// each key the count it has now.
    pub async fn invalidate_template(
        &self,
        template: &KeyTemplate,
        replicas: crate::config::Replicas,
        counts: Option<&Mapper>,
        table: &Arc<str>,
        w: &WriteCtx,
    ) -> Result<u64, Error> {
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
                .map(|k| {
                    let (replicas, count) = counts.map_or((replicas.min, replicas.min), |m| m.count_of(k, replicas));
                    KeyChange { key: k.clone(), op: Op::Update, table: table.clone(), payload: None, replicas, count, ttl_secs: 0 }
                })
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
                let n = self.invalidate_template(t, replicas, Some(mapper), &table_arc, w).await?;
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
        parse_version(raw.as_deref()).map_err(|m| DefiniteError::RedisRefused { key: vkey, message: m.to_string() }.into())
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

/// ARGV of the replica script for `ch`: position, fencing token, kind, payload, TTL ms (the
/// count is pushed by [`push_replica_args`]).
fn replica_args(ch: &KeyChange, pos: FencePosition, fencing_token: u64, tombstone_ttl_ms: u64) -> (u64, u64, &'static str, &str, u64) {
    match (&ch.payload, ch.op) {
        (_, Op::Delete) => (pos.0, fencing_token, "del", "", tombstone_ttl_ms),
        (Some(p), _) => (pos.0, fencing_token, "set", p.as_str(), ch.ttl_secs * 1000),
        // Invalidate mode: no payload, readers go to their loader.
        (None, _) => (pos.0, fencing_token, "inv", "", if ch.ttl_secs > 0 { ch.ttl_secs * 1000 } else { tombstone_ttl_ms }),
    }
}

/// Append the replica script's ARGV for `ch` at `pos` to `cmd`.
fn push_replica_args(cmd: &mut redis::Cmd, ch: &KeyChange, pos: FencePosition, w: &WriteCtx) {
    let (p, token, kind, payload, ttl) = replica_args(ch, pos, w.fencing_token, w.tombstone_ttl_ms);
    cmd.arg(p).arg(token).arg(kind).arg(payload).arg(ttl).arg(ch.count.max(1));
}

/// One reply of a batch as `T`; an error reply or a reply of another shape is classified per
/// [`classify_redis`], naming the key `key()` (made only on an error: this runs per command).
fn reply_as<T: redis::FromRedisValue>(reply: RedisResult<Value>, key: impl FnOnce() -> String) -> Result<T, Error> {
    reply.and_then(|v| redis::from_redis_value(v).map_err(RedisError::from)).map_err(|e| classify_redis(e, &key()))
}

/// The lease was lost: a replica of `key` was written under a newer fencing token.
fn lease_lost(key: &str, w: &WriteCtx) -> Error {
    TransientError::LeaseLost {
        source_name: w.source_name.to_string(),
        message: format!("a replica of key {key} was written under a newer fencing token than {}", w.fencing_token),
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(key: &str, op: Op, payload: Option<&str>) -> KeyChange {
        KeyChange {
            key: key.into(),
            op,
            table: std::sync::Arc::from("db.t"),
            payload: payload.map(String::from),
            replicas: 1,
            count: 1,
            ttl_secs: 0,
        }
    }

    #[test]
    fn replica_arguments_per_kind() {
        let p = FencePosition(42);
        assert_eq!(replica_args(&ch("k", Op::Update, Some("{}")), p, 7, 1000), (42, 7, "set", "{}", 0));
        assert_eq!(replica_args(&ch("k", Op::Delete, None), p, 7, 1000), (42, 7, "del", "", 1000));
        assert_eq!(replica_args(&ch("k", Op::Update, None), p, 7, 1000), (42, 7, "inv", "", 1000));
    }
}
