//! Applying one committed transaction: the one implementation of map -> collapse -> fenced
//! Redis writes -> one event per key change, shared by `binval run` (through [`apply_loop`])
//! and `binval replay`.
//!
//! The steps, in order (invariant I1: a transaction's events are enqueued only after its
//! Redis writes are acknowledged):
//!
//! 1. every row image must carry the columns the key templates use, else
//!    [`DefiniteError::MappingBroken`] (a dropped or renamed key column would silently stop
//!    invalidation);
//! 2. rows -> key changes ([`Mapper::map_rows`]), one per key ([`collapse_per_key`]);
//! 3. the fenced writes at the transaction's fence position ([`crate::write::fence`]) under the
//!    tenure's fencing token ([`RedisConn::apply_all`]);
//! 4. one invalidation event per key change;
//! 5. table-wide invalidations (TRUNCATE / DROP TABLE / partition operations on mapped
//!    tables): every key of the table marked stale, with one `truncate` event per key template.
//!
//! What differs between run and replay is spelled out in [`ApplyOptions`]; the differences
//! exist because replay runs beside a live `binval run` (see `commands::replay`).

use std::sync::Arc;
use std::time::Instant;

use binval_protocol::{FencePosition, SourcePosition};
use rdkafka::producer::DeliveryFuture;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::binlog::txn::Transaction;
use crate::error::{DefiniteError, Error, TransientError};
use crate::mapping::{collapse_per_key, KeyChange, Mapper, TableNames};
use crate::redis_conn::RedisConn;
use crate::telemetry::names;
use crate::write::fence::FenceRule;
use crate::write::kafka_sink::KafkaSink;
use crate::write::redis_sink::{Applied, WriteCtx};

/// A rate limiter of key changes per second (`binval replay --rate`).
pub type RateLimiter = governor::DefaultDirectRateLimiter;

/// How [`Writer::apply_transaction`] behaves; [`ApplyOptions::run`] and
/// [`ApplyOptions::replay`] are the two uses.
pub struct ApplyOptions {
    /// Read the key's version token and replica positions, print one [`DryRunLine`] per key
    /// change, and write nothing (no Redis writes, no events, no table invalidations).
    pub dry_run: bool,
    /// Publish events only for key changes that moved a replica or a version token (replay:
    /// consumers need no notice of a no-op). Run publishes every key change's event.
    pub events_only_if_moved: bool,
    /// Publish a `truncate` event per key template of a table-wide invalidation (run). Replay
    /// publishes none: the live run published them.
    pub table_events: bool,
    /// Await the transaction's deliveries before returning (replay); run hands them to the
    /// checkpoint task instead ([`Pending`]).
    pub await_deliveries: bool,
    /// At most this many key changes per second (a transaction larger than one second's quota
    /// passes alone).
    pub limiter: Option<RateLimiter>,
    /// Redis key of the source's fencing token counter: when set, a write refused under an
    /// older fencing token ([`TransientError::LeaseLost`]: a new tenure began) reads the
    /// current token and retries once (replay, which holds no lease). Unset: the error ends
    /// the tenure (run).
    pub refresh_fencing_token: Option<String>,
}

impl ApplyOptions {
    /// `binval run`: every event published, deliveries handed on, a lost lease stops.
    pub fn run() -> Self {
        ApplyOptions {
            dry_run: false,
            events_only_if_moved: false,
            table_events: true,
            await_deliveries: false,
            limiter: None,
            refresh_fencing_token: None,
        }
    }

    /// `binval replay`: events only for changes that moved something, no table events,
    /// deliveries awaited per transaction, the fencing token refreshed on a takeover.
    pub fn replay(dry_run: bool, rate: Option<u32>, fencing_token_key: String) -> Self {
        let limiter = rate.and_then(std::num::NonZeroU32::new).map(|r| governor::RateLimiter::direct(governor::Quota::per_second(r)));
        ApplyOptions {
            dry_run,
            events_only_if_moved: true,
            table_events: false,
            await_deliveries: true,
            limiter,
            refresh_fencing_token: Some(fencing_token_key),
        }
    }
}

/// Everything the writes of a tenure (run) or of a replay share.
pub struct Writer {
    /// The mapping rules.
    pub mapper: Arc<Mapper>,
    /// Redis.
    pub redis: RedisConn,
    /// Kafka; `None` only in a dry run.
    pub kafka: Option<Arc<KafkaSink>>,
    /// How fence positions are derived.
    pub fence: FenceRule,
    /// The fencing token writes carry (refreshed on a takeover per
    /// [`ApplyOptions::refresh_fencing_token`]).
    pub fencing_token: u64,
    /// `redis.tombstone_ttl_ms`.
    pub tombstone_ttl_ms: u64,
    /// `source.name`.
    pub source_name: Arc<str>,
    /// Run or replay behaviour.
    pub options: ApplyOptions,
}

/// What applying one transaction did.
#[derive(Default)]
pub struct TxnOutcome {
    /// Key changes after the per-transaction collapse.
    pub key_changes: u64,
    /// Key changes that moved a replica or a version token (dry run: would move).
    pub changed: u64,
    /// Key changes Redis already held (fenced no-ops).
    pub unchanged: u64,
    /// Events acknowledged (only with [`ApplyOptions::await_deliveries`]).
    pub events_acked: u64,
    /// Events in flight, with their keys (without [`ApplyOptions::await_deliveries`]).
    pub deliveries: Vec<(String, DeliveryFuture)>,
}

/// One line of a dry run (JSON).
#[derive(Debug, Serialize)]
pub struct DryRunLine<'a> {
    key: &'a str,
    op: &'a str,
    table: &'a str,
    position: String,
    version_now: u64,
    version_new: u64,
    replica_positions: Vec<Option<u64>>,
    would_change: bool,
}

impl Writer {
    /// Apply `txn` (steps in the module docs). `changes` is a reusable buffer; dry-run lines go
    /// to `out`.
    ///
    /// Errors: [`DefiniteError::MappingBroken`] naming table, position and the missing key
    /// columns; [`DefiniteError::Fence`] when the fence position cannot be derived; Redis and
    /// Kafka errors as classified by [`crate::error`].
    pub async fn apply_transaction(
        &mut self,
        txn: &Transaction,
        changes: &mut Vec<KeyChange>,
        out: &mut (dyn FnMut(&str) + Send),
    ) -> Result<TxnOutcome, Error> {
        check_key_columns(&self.mapper, txn)?;
        changes.clear();
        self.mapper.map_rows(&txn.rows, changes);
        collapse_per_key(changes);
        let mut o = TxnOutcome::default();
        if !changes.is_empty() {
            self.rate_limit(changes.len()).await;
            let pos = self.fence.position(&txn.position)?;
            o.key_changes = changes.len() as u64;
            if self.options.dry_run {
                self.dry_run(txn, changes, pos, &mut o, out).await?;
            } else {
                self.write_changes(txn, changes, pos, &mut o).await?;
            }
        }
        if !self.options.dry_run && !txn.invalidate_tables.is_empty() {
            self.invalidate_tables(txn, &mut o).await?;
        }
        Ok(o)
    }

    fn ctx(&self, position: FencePosition) -> WriteCtx {
        WriteCtx {
            position,
            fencing_token: self.fencing_token,
            source_name: self.source_name.clone(),
            tombstone_ttl_ms: self.tombstone_ttl_ms,
        }
    }

    async fn rate_limit(&self, n: usize) {
        if let Some(l) = &self.options.limiter {
            let n = std::num::NonZeroU32::new(n.min(u32::MAX as usize) as u32).expect("not empty");
            // A transaction larger than one second's quota passes alone.
            if l.until_n_ready(n).await.is_err() {
                l.until_ready().await;
            }
        }
    }

    /// Print what would change: same rule as the write (skipped when the token is newer).
    async fn dry_run(
        &self,
        txn: &Transaction,
        changes: &[KeyChange],
        pos: FencePosition,
        o: &mut TxnOutcome,
        out: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), Error> {
        for ch in changes {
            let (version_now, replica_positions) = self.redis.read_positions(&ch.key, ch.replicas).await?;
            let would = version_now <= pos.0 && (version_now < pos.0 || replica_positions.iter().any(|p| p.is_none_or(|p| p < pos.0)));
            if would {
                o.changed += 1;
            } else {
                o.unchanged += 1;
            }
            let line = DryRunLine {
                key: &ch.key,
                op: ch.op.as_str(),
                table: &ch.table,
                position: txn.position.to_string(),
                version_now,
                version_new: pos.0,
                replica_positions,
                would_change: would,
            };
            out(&serde_json::to_string(&line).expect("serializable"));
        }
        Ok(())
    }

    /// The fenced writes of the key changes, then their events.
    async fn write_changes(
        &mut self,
        txn: &Transaction,
        changes: &[KeyChange],
        pos: FencePosition,
        o: &mut TxnOutcome,
    ) -> Result<(), Error> {
        let t = Instant::now();
        let applied = self.apply_all(changes, pos).await?;
        metrics::histogram!(names::REDIS_APPLY_SECONDS).record(t.elapsed().as_secs_f64());
        let noop = applied.iter().filter(|a| !moved(a)).count();
        if noop > 0 {
            metrics::counter!(names::FENCED_NOOPS).increment(noop as u64);
        }
        let kafka = self.kafka.clone().expect("not a dry run");
        for (ch, a) in changes.iter().zip(applied) {
            if moved(&a) {
                o.changed += 1;
            } else {
                o.unchanged += 1;
                if self.options.events_only_if_moved {
                    continue;
                }
            }
            crate::failpoint::hit("kafka.before_enqueue");
            let ev = txn.event(&ch.key, a.version, ch.op, &ch.table);
            o.deliveries.push((ch.key.clone(), kafka.enqueue(&ev).await?));
        }
        metrics::counter!(names::KEY_CHANGES).increment(changes.len() as u64);
        metrics::counter!(names::ROWS).increment(txn.rows.len() as u64);
        if self.options.await_deliveries {
            for (key, d) in o.deliveries.drain(..) {
                kafka.delivered(&key, d).await?;
                o.events_acked += 1;
            }
        }
        Ok(())
    }

    /// [`RedisConn::apply_all`]; with [`ApplyOptions::refresh_fencing_token`], a takeover
    /// (LeaseLost) refreshes the token and retries once.
    async fn apply_all(&mut self, changes: &[KeyChange], pos: FencePosition) -> Result<Vec<Applied>, Error> {
        match (self.redis.apply_all(changes, &self.ctx(pos)).await, &self.options.refresh_fencing_token) {
            (Err(Error::Transient(TransientError::LeaseLost { .. })), Some(key)) => {
                // A new tenure began while replaying: continue under its token.
                self.fencing_token = current_fencing_token(&self.redis, key).await?;
                self.redis.apply_all(changes, &self.ctx(pos)).await
            }
            (r, _) => r,
        }
    }

    /// TRUNCATE / DROP TABLE / partition operations on mapped tables: every key of the table
    /// is stale at this position (fenced: keys changed after it keep their values); one
    /// `truncate` event per key template when [`ApplyOptions::table_events`].
    async fn invalidate_tables(&self, txn: &Transaction, o: &mut TxnOutcome) -> Result<(), Error> {
        let w = self.ctx(self.fence.position(&txn.position)?);
        let done = self.redis.invalidate_tables(&self.mapper, &txn.invalidate_tables, &w).await?;
        if !self.options.table_events {
            return Ok(());
        }
        let kafka = self.kafka.as_ref().expect("not a dry run");
        for (table, t) in done {
            crate::failpoint::hit("kafka.before_enqueue");
            let ev = txn.event(t.as_str(), w.position.0, binval_protocol::Op::Truncate, table);
            o.deliveries.push((t.as_str().to_string(), kafka.enqueue(&ev).await?));
        }
        Ok(())
    }
}

/// The change moved a replica or the version token.
fn moved(a: &Applied) -> bool {
    a.replicas_written > 0 || a.version_moved
}

/// Every row image of `txn` must carry the columns the key templates of its table use.
fn check_key_columns(mapper: &Mapper, txn: &Transaction) -> Result<(), Error> {
    let Some((table, missing)) = mapper.missing_key_columns(&txn.rows) else { return Ok(()) };
    Err(DefiniteError::MappingBroken {
        table,
        position: txn.position.to_string(),
        message: format!(
            "key column(s) {} are not in the row image (renamed or dropped by ALTER TABLE, or a session wrote a MINIMAL/NOBLOB row image): its keys would no longer be written or invalidated. Change the mapping's keys (or the writer's binlog_row_image), then restart",
            missing.join(", ")
        ),
    }
    .into())
}

/// The newest fencing token handed out for the source (`GET` of its counter key, see
/// `ha::lease`; 0 when none was). Errors are transient.
pub async fn current_fencing_token(redis: &RedisConn, fencing_token_key: &str) -> Result<u64, Error> {
    let mut c = redis.clone();
    let t: Option<u64> = c
        .query(redis::cmd("GET").arg(fencing_token_key))
        .await
        .map_err(|e| TransientError::Redis(format!("GET {fencing_token_key}: {e}")))?;
    Ok(t.unwrap_or(0))
}

/// A transaction whose Redis writes are done and whose events are in flight: what the apply
/// task hands the checkpoint task (`ha::checkpoint_loop`).
pub struct Pending {
    /// Binlog position after the transaction.
    pub position: SourcePosition,
    /// Commit time, Unix ms (0: unknown).
    pub commit_time_ms: u64,
    /// The renamed-table state after the transaction, when it changed.
    pub table_names: Option<Arc<TableNames>>,
    /// Events in flight, with their keys.
    pub deliveries: Vec<(String, DeliveryFuture)>,
}

/// Counters the apply task keeps (shared with the pipeline's progress log).
pub trait ApplyStats: Send + Sync {
    /// One transaction applied with `key_changes` key changes.
    fn applied(&self, key_changes: u64);
}

/// The apply task of `binval run`: apply each transaction from `rx` in commit order and hand
/// its deliveries to the checkpoint task through `acks` (bounded: the apply task waits while
/// the checkpoint task is behind). Returns when `rx` closes or the checkpoint task stopped.
pub async fn apply_loop(
    mut writer: Writer,
    mut rx: mpsc::Receiver<Transaction>,
    acks: mpsc::Sender<Pending>,
    stats: Arc<dyn ApplyStats>,
) -> Result<(), Error> {
    let mut changes: Vec<KeyChange> = Vec::new();
    while let Some(txn) = rx.recv().await {
        let o = writer.apply_transaction(&txn, &mut changes, &mut |_| {}).await?;
        stats.applied(o.key_changes);
        metrics::counter!(names::TRANSACTIONS).increment(1);
        crate::telemetry::group_applied(1, o.key_changes);
        let p =
            Pending { position: txn.position, commit_time_ms: txn.commit_time_ms, table_names: txn.table_names, deliveries: o.deliveries };
        if acks.send(p).await.is_err() {
            break;
        }
    }
    Ok(())
}
