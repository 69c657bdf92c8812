//! [`Writer`]: one transaction (or one group) decoded, mapped, collapsed, written to Redis
//! under the fence, and its events enqueued.

use super::*;
use std::sync::Arc;
use std::time::Instant;

use binval_protocol::{FencePosition, SourcePosition};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::binlog::txn::Transaction;
use crate::config::Config;
use crate::error::{Error, TransientError};
use crate::kafka::{DeliveryFuture, KafkaSink};
use crate::mapping::{KeyChange, Mapper};
use crate::redis::RedisConn;
use crate::telemetry::names;
use crate::write::fence::FenceRule;
use crate::write::group::{check_key_columns, decode_error, Group, KeyIndex, SMALL_TRANSACTION_BYTES};
use crate::write::redis_sink::{Applied, WriteCtx};

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
    /// `apply.max_group_rows`: rows per group, and per chunk of a large transaction.
    pub max_group_rows: usize,
    /// `apply.linger_ms`: how long a group may gather transactions at ordinary rates
    /// ([`Linger`]; [`apply_loop`] only).
    pub linger: std::time::Duration,
    /// Run or replay behaviour.
    pub options: ApplyOptions,
    /// Replica-count steps from the adaptive-count leader (`crate::replicas::task`), taken by
    /// [`apply_loop`] between groups; `None` without adaptive mappings, and outside `run`.
    pub resizes: Option<mpsc::Receiver<crate::replicas::task::CountCommand>>,
}

impl Writer {
    /// A writer with what every writer takes from the configuration (`redis.tombstone_ttl_ms`,
    /// `source.name`, `apply.max_group_rows`) and no replica-count steps (`binval run` sets
    /// [`Writer::resizes`] itself).
    pub fn new(
        cfg: &Config,
        mapper: Arc<Mapper>,
        redis: RedisConn,
        kafka: Option<Arc<KafkaSink>>,
        fence: FenceRule,
        fencing_token: u64,
        options: ApplyOptions,
    ) -> Writer {
        Writer {
            mapper,
            redis,
            kafka,
            fence,
            fencing_token,
            tombstone_ttl_ms: cfg.redis.tombstone_ttl_ms,
            source_name: Arc::from(cfg.source.name.as_str()),
            max_group_rows: cfg.apply.max_group_rows,
            linger: std::time::Duration::from_millis(cfg.apply.linger_ms),
            options,
            resizes: None,
        }
    }

    /// The writer of a step that holds no lease (`replay`, `bootstrap`, `verify --repair`):
    /// it writes under the source's current fencing token ([`current_fencing_token`]), which
    /// `options` (given the token counter's key) may refresh on a takeover; Kafka only when
    /// `publish`, its messages labelled `tool` (the `binval.writer` header).
    ///
    /// Errors: Kafka that cannot be reached (naming `kafka.brokers`), the token's `GET`
    /// (transient).
    pub async fn without_lease(
        cfg: &Config,
        tool: &'static str,
        mapper: Arc<Mapper>,
        redis: RedisConn,
        fence: FenceRule,
        publish: bool,
        options: impl FnOnce(String) -> ApplyOptions,
    ) -> Result<Writer, Error> {
        let kafka = if publish { Some(Arc::new(KafkaSink::connect(&cfg.kafka).await?.with_writer(tool))) } else { None };
        let fencing_token_key = crate::ha::lease::fencing_token_key(&cfg.source.name);
        let fencing_token = current_fencing_token(&redis, &fencing_token_key).await?;
        Ok(Writer::new(cfg, mapper, redis, kafka, fence, fencing_token, options(fencing_token_key)))
    }
}

/// What applying a group (or one transaction, or one chunk of a large one) did.
#[derive(Default)]
pub struct TxnOutcome {
    /// Key changes after the collapse.
    pub key_changes: u64,
    /// Key changes that moved a replica or a version token (dry run: would move).
    pub changed: u64,
    /// Key changes Redis already held (fenced no-ops).
    pub unchanged: u64,
    /// Rows decoded.
    pub rows: u64,
    /// Events acknowledged (only with [`ApplyOptions::await_deliveries`]).
    pub events_acked: u64,
    /// Messages in flight, each named by its key (a batch: its first key and how many more)
    /// (without [`ApplyOptions::await_deliveries`]).
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
    /// Apply one transaction (replay): a group of one, or in chunks when large. Dry-run lines
    /// go to `out`.
    ///
    /// Errors: [`DefiniteError::MappingBroken`](crate::error::DefiniteError::MappingBroken)
    /// naming table, position and the missing key columns; decode errors naming the position;
    /// [`DefiniteError::Fence`](crate::error::DefiniteError::Fence) when the fence position
    /// cannot be derived; Redis and Kafka errors as classified by [`crate::error`].
    pub async fn apply_transaction(&mut self, txn: Transaction, out: &mut (dyn FnMut(&str) + Send)) -> Result<TxnOutcome, Error> {
        if is_large(&txn) {
            return self.apply_large(txn, out, None).await;
        }
        let mut group = Group::new();
        group.add(txn, &self.mapper, &self.fence)?;
        self.apply_group(&mut group, out).await
    }

    /// Apply a group (module docs of [`crate::write::group`]): its key changes, then the
    /// table invalidations of its transactions. Dry-run lines go to `out`.
    pub async fn apply_group(&mut self, group: &mut Group, out: &mut (dyn FnMut(&str) + Send)) -> Result<TxnOutcome, Error> {
        group.finish();
        let mut o = TxnOutcome { rows: group.rows as u64, ..TxnOutcome::default() };
        if !group.changes.is_empty() {
            self.rate_limit(group.changes.len()).await;
            o.key_changes = group.changes.len() as u64;
            if self.options.dry_run {
                self.dry_run(group, &mut o, out).await?;
            } else {
                self.write_changes(group, &mut o).await?;
            }
        }
        if !self.options.dry_run {
            for txn in &group.txns {
                if !txn.invalidate_tables.is_empty() {
                    self.invalidate_tables(txn, &mut o).await?;
                }
            }
            self.await_if_asked(&mut o).await?;
        }
        Ok(o)
    }

    /// A large transaction (see [`crate::write::group`]): pass 1 indexes the last change of
    /// every key, pass 2 writes those chunk by chunk. The deliveries of every chunk but the
    /// last go to `chunks` as a [`Pending`] without a position (the checkpoint does not move
    /// inside a transaction), or are awaited ([`ApplyOptions::await_deliveries`]); the last
    /// chunk's are returned.
    pub async fn apply_large(
        &mut self,
        mut txn: Transaction,
        out: &mut (dyn FnMut(&str) + Send),
        chunks: Option<mpsc::Sender<Pending>>,
    ) -> Result<TxnOutcome, Error> {
        let chunk_rows = self.max_group_rows;
        let started = Instant::now();
        let mapper = self.mapper.clone();
        let position = txn.position.clone();
        // Pass 1 (on a blocking thread: decoding is synchronous): check the key columns of
        // every row, and find the keys that may change more than once; pass 1b, only if some
        // may: the last change of each of those (see `KeyIndex`).
        let held = std::mem::take(&mut txn.rows);
        // A row image takes at least ~16 bytes of binlog: an upper bound of the keys to expect.
        let expected = (held.total_bytes() / 16) as usize;
        let (mut rows_events, index, rows) = {
            let (mapper, at) = (mapper.clone(), position.clone());
            tokio::task::spawn_blocking(move || {
                let (mut held, mut index, mut rows, mut mapped) = (held, KeyIndex::new(expected), 0u64, Vec::new());
                held.decode_chunks(chunk_rows, |chunk| {
                    rows += chunk.len() as u64;
                    check_key_columns(&mapper, &at, chunk)?;
                    mapped.clear();
                    mapper.map_rows(chunk, &mut mapped);
                    Ok::<(), ChunkError>(index.record(&mapped)?)
                })?;
                if index.may_repeat() {
                    let mut seen = 0u32;
                    held.decode_chunks(chunk_rows, |chunk| {
                        mapped.clear();
                        mapper.map_rows(chunk, &mut mapped);
                        index.record_repeated(&mapped, &mut seen);
                        Ok::<(), ChunkError>(())
                    })?;
                }
                Ok::<_, ChunkError>((held, index, rows))
            })
            .await
            .map_err(|e| crate::error::task_failed("large transaction decoder", e))?
            .map_err(|e| e.into_error(&position))?
        };
        tracing::info!(
            position = %txn.position, rows, key_changes = index.changes(), repeated_keys = index.repeated(), spilled = rows_events.spilled(),
            bytes = rows_events.total_bytes(), "large transaction: applying it alone, in chunks of {chunk_rows} rows"
        );
        // Pass 2: write the last change of each key, chunk by chunk.
        let pos = if index.changes() > 0 { Some(self.fence.position(&txn.position)?) } else { None };
        let mut total = TxnOutcome { rows, ..TxnOutcome::default() };
        let mut seen = 0u32;
        let mut pending_chunk: Option<Vec<KeyChange>> = None;
        let (tx, mut rx) = mpsc::channel::<Vec<KeyChange>>(1);
        // Decoding is synchronous; the writes are not: decode on a blocking thread, a chunk ahead.
        let decoder = {
            let mapper = mapper.clone();
            tokio::task::spawn_blocking(move || {
                let r = rows_events.decode_chunks(chunk_rows, |chunk| {
                    let mut changes = Vec::new();
                    mapper.map_rows(chunk, &mut changes);
                    index.keep_last(&mut changes, &mut seen);
                    tx.blocking_send(changes).map_err(|_| {
                        ChunkError::Apply(TransientError::Task { task: "apply", message: "it no longer takes changes".into() }.into())
                    })
                });
                drop(tx);
                r
            })
        };
        loop {
            let next = rx.recv().await;
            if let Some(prev) = pending_chunk.take() {
                let last = next.is_none();
                let o = self.write_chunk(&txn, prev, pos.expect("keys were indexed"), out).await?;
                total.key_changes += o.key_changes;
                total.changed += o.changed;
                total.unchanged += o.unchanged;
                total.events_acked += o.events_acked;
                if last {
                    total.deliveries = o.deliveries;
                } else if let Some(acks) = &chunks {
                    let p = Pending { deliveries: o.deliveries, ..Pending::default() };
                    acks.send(p).await.map_err(|_| TransientError::Task {
                        task: "checkpoint",
                        message: "it no longer takes acknowledged positions".into(),
                    })?;
                }
            }
            match next {
                Some(c) => pending_chunk = Some(c),
                None => break,
            }
        }
        decoder.await.map_err(|e| crate::error::task_failed("large transaction decoder", e))?.map_err(|e| e.into_error(&position))?;
        if !self.options.dry_run && !txn.invalidate_tables.is_empty() {
            self.invalidate_tables(&txn, &mut total).await?;
        }
        tracing::info!(position = %txn.position, rows, key_changes = total.key_changes, elapsed_ms = started.elapsed().as_millis() as u64, "large transaction applied");
        Ok(total)
    }

    /// One chunk of a large transaction at its position `pos`: written (or dry-run) and
    /// announced like a group of one.
    async fn write_chunk(
        &mut self,
        txn: &Transaction,
        changes: Vec<KeyChange>,
        pos: FencePosition,
        out: &mut (dyn FnMut(&str) + Send),
    ) -> Result<TxnOutcome, Error> {
        let mut group = Group::new();
        group.tags = vec![(pos, 0); changes.len()];
        group.changes = changes;
        // The group borrows the transaction's position and commit time for its events.
        group.txns.push(Transaction { position: txn.position.clone(), commit_time_ms: txn.commit_time_ms, ..Transaction::default() });
        let mut o = TxnOutcome { key_changes: group.changes.len() as u64, ..TxnOutcome::default() };
        if group.changes.is_empty() {
            return Ok(o);
        }
        self.rate_limit(group.changes.len()).await;
        if self.options.dry_run {
            self.dry_run(&group, &mut o, out).await?;
        } else {
            self.write_changes(&group, &mut o).await?;
            self.await_if_asked(&mut o).await?;
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

    /// With [`ApplyOptions::await_deliveries`]: wait for every delivery in `o`.
    async fn await_if_asked(&self, o: &mut TxnOutcome) -> Result<(), Error> {
        if self.options.await_deliveries && !o.deliveries.is_empty() {
            let kafka = self.kafka.as_ref().expect("not a dry run");
            for (key, d) in o.deliveries.drain(..) {
                kafka.delivered(&key, d).await?;
                o.events_acked += 1;
            }
        }
        Ok(())
    }

    /// Print what would change: same rule as the write (skipped when the token is newer).
    async fn dry_run(&self, group: &Group, o: &mut TxnOutcome, out: &mut (dyn FnMut(&str) + Send)) -> Result<(), Error> {
        let keys: Vec<(&str, u32)> = group.changes.iter().map(|c| (c.key.as_str(), c.replicas)).collect();
        let states = self.redis.read_key_states(&keys).await?;
        for ((ch, &(pos, t)), state) in group.changes.iter().zip(&group.tags).zip(states) {
            let version_now = state.version.unwrap_or(0);
            let replica_positions: Vec<Option<u64>> = state.replicas.iter().map(|r| r.position).collect();
            let would = would_change(version_now, &replica_positions, pos);
            if would {
                o.changed += 1;
            } else {
                o.unchanged += 1;
            }
            let line = DryRunLine {
                key: &ch.key,
                op: ch.op.as_str(),
                table: &ch.table,
                position: group.txns[t as usize].position.to_string(),
                version_now,
                version_new: pos.0,
                replica_positions,
                would_change: would,
            };
            out(&serde_json::to_string(&line).expect("serializable"));
        }
        Ok(())
    }

    /// The fenced writes of the group's key changes, then their events.
    async fn write_changes(&mut self, group: &Group, o: &mut TxnOutcome) -> Result<(), Error> {
        let reviewed = match self.options.guard.as_mut() {
            Some(g) => g.review(&self.redis, group).await?,
            None => None,
        };
        let group = reviewed.as_ref().unwrap_or(group);
        let t = Instant::now();
        let positions = group.positions();
        let applied = self.apply_batch(&group.changes, &positions).await?;
        metrics::histogram!(names::REDIS_APPLY_SECONDS).record(t.elapsed().as_secs_f64());
        self.announce(group, applied, o).await
    }

    /// The events of a group whose Redis writes are done (`applied`, one per change): counted
    /// in `o`, and enqueued (all of them, or with [`ApplyOptions::events_only_if_moved`] those
    /// of changes that moved something) unless [`ApplyOptions::publish_events`] is off.
    pub(super) async fn announce(&self, group: &Group, applied: Vec<Applied>, o: &mut TxnOutcome) -> Result<(), Error> {
        let noop = applied.iter().filter(|a| !moved(a)).count();
        if noop > 0 {
            metrics::counter!(names::FENCED_NOOPS).increment(noop as u64);
        }
        let kafka = if self.options.publish_events { Some(self.kafka.clone().expect("not a dry run")) } else { None };
        let mut out = kafka.as_ref().map(|k| k.publisher());
        for ((ch, a), &(_, t)) in group.changes.iter().zip(applied).zip(&group.tags) {
            if moved(&a) {
                o.changed += 1;
            } else {
                o.unchanged += 1;
                if self.options.events_only_if_moved {
                    continue;
                }
            }
            let Some(out) = &mut out else { continue };
            let txn = &group.txns[t as usize];
            out.push(&txn.position, txn.commit_time_ms, &ch.key, a.version, ch.op, &ch.table).await?;
        }
        if let Some(out) = out {
            o.deliveries.extend(out.finish().await?);
        }
        metrics::counter!(names::KEY_CHANGES).increment(group.changes.len() as u64);
        Ok(())
    }

    /// The fenced Redis writes of `group` (finished, without table invalidations) as a future
    /// that owns what it needs, so several groups can be in Redis at once ([`apply_loop`]).
    /// On a Cluster, a transient Redis failure (a timeout: a master frozen or failing over) is
    /// retried with backoff for up to [`REDIS_RETRY_FOR`] before it ends the tenure: every write is fenced,
    /// so sending a group again only completes what did not land, and the groups behind it
    /// keep writing to the masters that answer meanwhile. Run only (no fencing token refresh).
    pub(super) fn redis_writes(
        &self,
        group: Group,
    ) -> impl std::future::Future<Output = (Group, Result<Vec<Applied>, Error>)> + Send + 'static {
        let redis = self.redis.clone();
        let w = self.ctx(FencePosition::default());
        // Standalone Redis is one master: nothing else could progress meanwhile, and a
        // restart of the tenure (reconnect, checkpoint) is the better retry.
        let retry = matches!(redis, RedisConn::Cluster(..));
        async move {
            let positions = group.positions();
            let w = WriteCtx { position: positions.first().copied().unwrap_or_default(), ..w };
            let started = Instant::now();
            let mut wait = std::time::Duration::from_millis(50);
            loop {
                match redis.apply_batch(&group.changes, &positions, &w).await {
                    Err(Error::Transient(TransientError::Redis(m))) if retry && started.elapsed() < REDIS_RETRY_FOR => {
                        metrics::counter!(names::REDIS_RETRIES).increment(1);
                        tracing::warn!(
                            error = %m,
                            position = %w.position,
                            key_changes = group.changes.len(),
                            waited_ms = started.elapsed().as_millis() as u64,
                            "Redis did not take a group's writes; sending them again (the groups behind it keep writing to the masters that answer)"
                        );
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(std::time::Duration::from_secs(1));
                    }
                    r => {
                        metrics::histogram!(names::REDIS_APPLY_SECONDS).record(started.elapsed().as_secs_f64());
                        return (group, r);
                    }
                }
            }
        }
    }

    /// [`RedisConn::apply_batch`]; with [`ApplyOptions::refresh_fencing_token`], a takeover
    /// (LeaseLost) refreshes the token and retries once.
    async fn apply_batch(&mut self, changes: &[KeyChange], positions: &[FencePosition]) -> Result<Vec<Applied>, Error> {
        let w = self.ctx(positions.first().copied().unwrap_or_default());
        match (self.redis.apply_batch(changes, positions, &w).await, &self.options.refresh_fencing_token) {
            (Err(Error::Transient(TransientError::LeaseLost { .. })), Some(key)) => {
                // A new tenure began while replaying: continue under its token.
                self.fencing_token = current_fencing_token(&self.redis, key).await?;
                let w = self.ctx(w.position);
                self.redis.apply_batch(changes, positions, &w).await
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
        // One `truncate` event per key template, keyed (and, batched, partitioned) by the
        // template.
        let mut out = kafka.publisher();
        for (table, t) in done {
            out.push(&txn.position, txn.commit_time_ms, t.as_str(), w.position.0, binval_protocol::Op::Truncate, table).await?;
        }
        o.deliveries.extend(out.finish().await?);
        Ok(())
    }
}

/// An error of [`crate::binlog::row_events::RowEvents::decode_chunks`] over a large transaction:
/// the held events, or what was done with their rows.
pub(super) enum ChunkError {
    Rows(crate::binlog::row_events::RowEventsError),
    Apply(Error),
}

impl ChunkError {
    /// As the pipeline's error, for the transaction ending at `position`.
    fn into_error(self, position: &SourcePosition) -> Error {
        match self {
            ChunkError::Rows(e) => decode_error(position, e),
            ChunkError::Apply(e) => e,
        }
    }
}

impl From<crate::binlog::row_events::RowEventsError> for ChunkError {
    fn from(e: crate::binlog::row_events::RowEventsError) -> Self {
        ChunkError::Rows(e)
    }
}

impl From<Error> for ChunkError {
    fn from(e: Error) -> Self {
        ChunkError::Apply(e)
    }
}

/// Too large for a group: applied alone, in chunks.
pub(super) fn is_large(txn: &Transaction) -> bool {
    txn.rows.total_bytes() > SMALL_TRANSACTION_BYTES
}

/// Whether a write at fence position `pos` would change a key whose version token holds
/// `version_now` (0: none) and whose replicas hold `replica_positions` (`None`: missing): the
/// rule of the fenced scripts (`binval_protocol::fence`, "Writing one key"): nothing when the
/// token is newer, else every replica older than `pos` (or missing) and the token.
pub fn would_change(version_now: u64, replica_positions: &[Option<u64>], pos: FencePosition) -> bool {
    version_now <= pos.0 && (version_now < pos.0 || replica_positions.iter().any(|p| p.is_none_or(|p| p < pos.0)))
}

/// The change moved a replica or the version token.
pub(super) fn moved(a: &Applied) -> bool {
    a.replicas_written > 0 || a.version_moved
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
