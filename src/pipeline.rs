//! The pipeline: source -> decode -> txn -> mapping -> redis -> kafka -> checkpoint, and the
//! supervisor around it.
//!
//! Three tasks joined by bounded channels (so memory stays bounded by channel capacity plus
//! one open transaction):
//!
//! 1. the source task reads the binlog and sends committed [`Transaction`]s in commit order;
//! 2. the apply task maps each transaction to key changes, writes Redis (replicas, then version
//!    token) and enqueues one Kafka event per key change — only after the Redis writes of that
//!    transaction are acknowledged (I1);
//! 3. the checkpoint task waits for every Kafka delivery of a transaction, in order, and only
//!    then moves the acknowledged position past it (I3); it saves at most once per interval
//!    and once more when the pipeline stops for any reason.
//!
//! Before any of it runs, the instance takes the source's lease ([`crate::ha::lease`]); while
//! another instance holds it, this one waits as standby. A fourth task renews the lease and
//! stops the pipeline when it is lost.
//!
//! The supervisor restarts the whole pipeline from the saved checkpoint after a transient
//! failure (with exponential backoff), and stops on a definite one. Re-applied transactions
//! are no-ops in Redis (version-fenced writes, see [`crate::write::redis_sink`]) and publish their
//! events again with the same versions, which consumers ignore (the evict rule).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use binval_protocol::SourcePosition;
use rdkafka::producer::DeliveryFuture;
use tokio::sync::{mpsc, watch, Mutex};

use crate::binlog::reader::{self, Resume, SourceStats};
use crate::binlog::server;
use crate::binlog::txn::Transaction;
use crate::config::{Config, StartPosition};
use crate::error::{DefiniteError, Error, TransientError};
use crate::ha::checkpoint::{checkpoint_at, CheckpointStoreImpl, GtidState};
use crate::ha::lease::Lease;
use crate::mapping::{KeyChange, Mapper, TableNames};
use crate::telemetry::names;
use crate::write::fence::FenceRule;
use crate::write::kafka_sink::KafkaSink;
use crate::write::redis_sink::{collapse_per_key, RedisConn, WriteCtx};

/// Committed transactions buffered between source and apply.
const TXN_CHANNEL: usize = 256;
/// Transactions whose Kafka deliveries are awaited at once.
const ACK_CHANNEL: usize = 4096;

/// Counters of a running pipeline, for the progress log and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Source counters.
    pub source: Arc<SourceStats>,
    /// Transactions applied to Redis.
    pub transactions: AtomicU64,
    /// Key changes written to Redis.
    pub key_changes: AtomicU64,
    /// Events acknowledged by Kafka.
    pub events_acked: AtomicU64,
    /// Checkpoints saved.
    pub checkpoints: AtomicU64,
    /// Pipeline restarts after transient failures.
    pub restarts: AtomicU64,
    /// Last acknowledged position, `file:pos`.
    pub acked: std::sync::Mutex<Option<SourcePosition>>,
}

/// Run until `shutdown` becomes true (then drain, save the checkpoint and return `Ok`) or a
/// definite error.
pub async fn run(cfg: Config, shutdown: watch::Receiver<bool>, stats: Arc<Stats>) -> Result<(), Error> {
    let mapper = Arc::new(Mapper::new(&cfg.mappings).map_err(|e| Error::config("mappings", e.to_string()))?);
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(Duration::from_millis(200))
        .with_max_interval(Duration::from_millis(cfg.source.reconnect_max_ms))
        .with_max_elapsed_time(None)
        .build();
    let progress = tokio::spawn(progress_log(stats.clone(), shutdown.clone()));
    let holder = crate::ha::lease::holder_id();
    let result = loop {
        let started = Instant::now();
        match run_once(&cfg, mapper.clone(), shutdown.clone(), stats.clone(), &holder).await {
            Ok(()) => break Ok(()),
            Err(Error::Transient(e @ TransientError::LeaseLost { .. })) => {
                if *shutdown.borrow() {
                    break Ok(());
                }
                stats.restarts.fetch_add(1, Relaxed);
                metrics::counter!(names::RESTARTS).increment(1);
                tracing::warn!(error = %e, "stopped writing: another instance is active");
            }
            Err(Error::Transient(e)) => {
                if *shutdown.borrow() {
                    break Ok(());
                }
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let wait = backoff.next_backoff().unwrap_or(Duration::from_secs(30));
                stats.restarts.fetch_add(1, Relaxed);
                metrics::counter!(names::RESTARTS).increment(1);
                tracing::warn!(error = %e, wait_ms = wait.as_millis() as u64, "pipeline stalled; restarting from the checkpoint");
                let mut sd = shutdown.clone();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = sd.wait_for(|v| *v) => break Ok(()),
                }
            }
            Err(e) => break Err(e),
        }
    };
    progress.abort();
    result
}

async fn run_once(
    cfg: &Config,
    mapper: Arc<Mapper>,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    holder: &str,
) -> Result<(), Error> {
    let redis = RedisConn::connect(&cfg.redis).await?;
    let lease = {
        let mut sd = shutdown.clone();
        match Lease::acquire(&redis, &cfg.source.name, holder, cfg.source.lease_ms, &mut sd).await? {
            Some(l) => l,
            None => return Ok(()),
        }
    };
    let result = run_active(cfg, mapper, shutdown.clone(), stats, &redis, &lease).await;
    if *shutdown.borrow() && !matches!(result, Err(Error::Transient(TransientError::LeaseLost { .. }))) {
        lease.release(&redis).await;
    }
    result
}

async fn run_active(
    cfg: &Config,
    mapper: Arc<Mapper>,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    redis: &RedisConn,
    lease: &Lease,
) -> Result<(), Error> {
    let redis = redis.clone();
    let mut store = CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis);
    store.set_token(lease.token);
    let saved = store.load().await?;
    // Connecting can take long while the broker is down: a shutdown must not wait for it.
    let kafka = {
        let mut sd = shutdown.clone();
        tokio::select! {
            k = KafkaSink::connect(&cfg.kafka) => Arc::new(k?),
            _ = sd.wait_for(|v| *v) => return Ok(()),
        }
    };

    let mut conn = server::connect(&cfg.source).await?;
    let info = server::preflight(&mut conn).await?;
    let fence = FenceRule::resolve(&cfg.source, info.mariadb);
    let wctx = WriteBase { fence, token: lease.token, tombstone_ttl_ms: cfg.redis.tombstone_ttl_ms };
    let logs = server::binary_logs(&mut conn).await?;
    for p in server::check_mappings(&mut conn, &cfg.mappings).await? {
        // Not fatal: the table may be created later; `binval check` fails on it.
        tracing::warn!(problem = %p, "mapping does not match the source schema");
    }
    let mapper = with_detected_json(&cfg.mappings, mapper, &mut conn, info.mariadb).await?;
    drop(conn);
    let start = StartPosition::parse(&cfg.source.start).expect("validated");
    let resume =
        reader::initial_resume(saved.as_ref().map(|c| SourcePosition { file: c.file.clone(), pos: c.pos, gtid: None }), &start, &info);
    let names = saved.as_ref().map(|c| c.renamed.clone()).unwrap_or_default();
    let mut gtids = GtidState::default();
    if let Some(g) = saved.as_ref().and_then(|c| c.gtid.as_deref()) {
        for one in g.split(',') {
            gtids.record(one);
        }
    }
    match (&saved, &resume) {
        (Some(c), _) => tracing::info!(file = %c.file, pos = c.pos, store = %store.location(), "resuming from checkpoint"),
        (None, Resume::FilePos(p)) => {
            server::require_binlog_file(&logs, &p.into(), "source.start")?;
            if start == StartPosition::Current {
                tracing::warn!(store = %store.location(), "no checkpoint found: starting at the primary's current position. If binval ran before with this source name, its checkpoint is lost (e.g. Redis data loss) and changes since then are not replayed: stop and set source.start to a position before the loss");
            }
            // Pin the start now: a crash before the first transaction must not move a
            // `current` start forward and skip changes.
            store.save(&checkpoint_at(p, &gtids, &names)).await?;
            tracing::info!(file = %p.file, pos = p.pos, store = %store.location(), "no checkpoint; starting at configured position");
        }
        (None, Resume::Gtid(g)) => tracing::info!(gtid = %g, "no checkpoint; starting at configured GTID position"),
    }

    let (txn_tx, txn_rx) = mpsc::channel::<Transaction>(TXN_CHANNEL);
    let (ack_tx, ack_rx) = mpsc::channel::<Pending>(ACK_CHANNEL);

    // One stop signal for the three tasks: set by the operator's shutdown, or by any task that
    // fails, so an idle source (blocked on the binlog) stops at once when a sink fails.
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let forward = {
        let stop_tx = stop_tx.clone();
        let mut sd = shutdown.clone();
        tokio::spawn(async move {
            let _ = sd.wait_for(|v| *v).await;
            let _ = stop_tx.send(true);
        })
    };
    let stop_on_error = |stop_tx: Arc<watch::Sender<bool>>, r: Result<(), Error>| {
        if r.is_err() {
            let _ = stop_tx.send(true);
        }
        r
    };
    let source_task = {
        let (st, f) = (
            stop_tx.clone(),
            reader::run(cfg.source.clone(), mapper.clone(), names.clone(), resume, txn_tx, stop_rx.clone(), stats.source.clone()),
        );
        tokio::spawn(async move { stop_on_error(st, f.await) })
    };
    let apply_task = {
        let (st, f) = (stop_tx.clone(), apply_loop(mapper, redis.clone(), kafka.clone(), txn_rx, ack_tx, stats.clone(), wctx));
        tokio::spawn(async move { stop_on_error(st, f.await) })
    };
    let interval = Duration::from_millis(cfg.checkpoint.interval_ms);
    let store = Arc::new(Mutex::new(store));
    let cp_task = {
        let (st, f) = (stop_tx.clone(), checkpoint_loop(store, ack_rx, gtids, names, interval, stats.clone()));
        tokio::spawn(async move { stop_on_error(st, f.await) })
    };
    let lease_task = {
        let (st, lease, conn, stop) = (stop_tx.clone(), lease.clone(), redis.clone(), stop_rx.clone());
        tokio::spawn(async move { stop_on_error(st, lease.keep(conn, stop).await) })
    };
    let (s, a, c) = tokio::join!(source_task, apply_task, cp_task);
    let _ = stop_tx.send(true);
    let l = lease_task.await;
    forward.abort();
    let flat = |r: Result<Result<(), Error>, tokio::task::JoinError>| match r {
        Ok(r) => r,
        Err(e) => Err(TransientError::Source(format!("task failed: {e}")).into()),
    };
    // Report the root cause: a definite error wins over the transient ones it caused.
    let results = [flat(l), flat(s), flat(a), flat(c)];
    // A lost lease wins over everything: the other failures are its consequences.
    let mut first: Option<Error> = None;
    for r in results {
        if let Err(e) = r {
            let lost = |e: &Error| matches!(e, Error::Transient(TransientError::LeaseLost { .. }));
            match (&first, &e) {
                (None, _) => first = Some(e),
                (Some(f), _) if lost(f) => {}
                (_, e2) if lost(e2) => first = Some(e),
                (Some(Error::Transient(_)), Error::Definite(_)) => first = Some(e),
                _ => {}
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None if *shutdown.borrow() => {
            kafka.flush(Duration::from_secs(5)).await;
            Ok(())
        }
        None => Err(TransientError::Source("pipeline stopped".into()).into()),
    }
}

/// On MariaDB, the mapper with the mapped tables' JSON columns detected on the source (for
/// mappings without `json_columns`), so their text values become JSON documents.
pub(crate) async fn with_detected_json(
    mappings: &[crate::config::MappingConfig],
    mapper: Arc<Mapper>,
    conn: &mut mysql_async::Conn,
    mariadb: bool,
) -> Result<Arc<Mapper>, Error> {
    if !mariadb {
        return Ok(mapper);
    }
    let tables: Vec<String> = mappings.iter().map(|m| m.table.clone()).collect();
    let detected = server::mariadb_json_columns(conn, &tables).await?;
    if detected.is_empty() {
        return Ok(mapper);
    }
    let mut m = Mapper::new(mappings).expect("mappings were validated at start");
    for (table, cols) in detected {
        tracing::info!(table = %table, columns = ?cols, "MariaDB JSON columns: values go into the payload as JSON documents");
        m.set_detected_json(&table, cols);
    }
    Ok(Arc::new(m))
}

/// A transaction whose Redis writes are done and whose events are in flight.
struct Pending {
    position: SourcePosition,
    commit_time_ms: u64,
    table_names: Option<Arc<TableNames>>,
    deliveries: Vec<(String, DeliveryFuture)>,
}

/// What every write of this tenure shares.
#[derive(Debug, Clone, Copy)]
struct WriteBase {
    fence: FenceRule,
    token: u64,
    tombstone_ttl_ms: u64,
}

async fn apply_loop(
    mapper: Arc<Mapper>,
    redis: RedisConn,
    kafka: Arc<KafkaSink>,
    mut rx: mpsc::Receiver<Transaction>,
    acks: mpsc::Sender<Pending>,
    stats: Arc<Stats>,
    base: WriteBase,
) -> Result<(), Error> {
    let mut changes: Vec<KeyChange> = Vec::new();
    while let Some(txn) = rx.recv().await {
        if let Some((table, missing)) = mapper.missing_key_columns(&txn.rows) {
            return Err(DefiniteError::MappingBroken {
                table,
                position: txn.position.to_string(),
                message: format!(
                    "key column(s) {} are not in the row image (renamed or dropped by ALTER TABLE, or a session wrote a MINIMAL/NOBLOB row image): its keys would no longer be written or invalidated. Change the mapping's keys (or the writer's binlog_row_image), then restart",
                    missing.join(", ")
                ),
            }
            .into());
        }
        changes.clear();
        mapper.map_rows(&txn.rows, &mut changes);
        collapse_per_key(&mut changes);
        let mut deliveries = Vec::with_capacity(changes.len());
        if !changes.is_empty() {
            let w = WriteCtx { position: base.fence.position(&txn.position)?, token: base.token, tombstone_ttl_ms: base.tombstone_ttl_ms };
            let t = Instant::now();
            let applied = redis.apply_all(&changes, &w).await?;
            metrics::histogram!(names::REDIS_APPLY_MS).record(t.elapsed().as_secs_f64() * 1000.0);
            let noop = applied.iter().filter(|a| a.replicas_written == 0 && !a.version_moved).count();
            if noop > 0 {
                metrics::counter!(names::FENCED_NOOPS).increment(noop as u64);
            }
            for (ch, a) in changes.iter().zip(applied) {
                crate::failpoint::hit("kafka.before_enqueue");
                let ev = txn.event(&ch.key, a.version, ch.op, &ch.table);
                deliveries.push((ch.key.clone(), kafka.enqueue(&ev).await?));
            }
            stats.key_changes.fetch_add(changes.len() as u64, Relaxed);
            metrics::counter!(names::KEY_CHANGES).increment(changes.len() as u64);
            metrics::counter!(names::ROWS).increment(txn.rows.len() as u64);
        }
        // TRUNCATE / DROP TABLE / partition operations on mapped tables: every key of the
        // table is stale at this position; one `truncate` event per key template.
        if !txn.invalidate_tables.is_empty() {
            let w = WriteCtx { position: base.fence.position(&txn.position)?, token: base.token, tombstone_ttl_ms: base.tombstone_ttl_ms };
            for (table, t) in redis.invalidate_tables(&mapper, &txn.invalidate_tables, &w).await? {
                crate::failpoint::hit("kafka.before_enqueue");
                let ev = txn.event(t.as_str(), w.position.0, binval_protocol::Op::Truncate, table);
                deliveries.push((t.as_str().to_string(), kafka.enqueue(&ev).await?));
            }
        }
        stats.transactions.fetch_add(1, Relaxed);
        metrics::counter!(names::TRANSACTIONS).increment(1);
        if acks
            .send(Pending { position: txn.position, commit_time_ms: txn.commit_time_ms, table_names: txn.table_names, deliveries })
            .await
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

async fn checkpoint_loop(
    store: Arc<Mutex<CheckpointStoreImpl>>,
    mut rx: mpsc::Receiver<Pending>,
    mut gtids: GtidState,
    mut names: TableNames,
    interval: Duration,
    stats: Arc<Stats>,
) -> Result<(), Error> {
    let mut acked: Option<SourcePosition> = None;
    let mut last_save = Instant::now();
    let mut dirty = false;
    let mut failure: Option<Error> = None;
    'outer: loop {
        let next = if dirty {
            let deadline = last_save + interval;
            match tokio::time::timeout_at(deadline.into(), rx.recv()).await {
                Ok(n) => n,
                Err(_) => {
                    if let Err(e) = save(&store, acked.as_ref().unwrap(), &gtids, &names, &stats).await {
                        failure = Some(e);
                        break 'outer;
                    }
                    last_save = Instant::now();
                    dirty = false;
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        let Some(p) = next else { break };
        let had_events = !p.deliveries.is_empty();
        for (key, d) in p.deliveries {
            match d.await {
                Ok(Ok(_)) => {
                    stats.events_acked.fetch_add(1, Relaxed);
                    metrics::counter!(names::EVENTS_ACKED).increment(1);
                }
                Ok(Err((e, _))) => {
                    failure = Some(TransientError::Kafka(format!("delivery of event for key {key} failed: {e}")).into());
                    break 'outer;
                }
                Err(_) => {
                    failure = Some(TransientError::Kafka(format!("delivery of event for key {key} was cancelled")).into());
                    break 'outer;
                }
            }
        }
        if let Some(g) = &p.position.gtid {
            gtids.record(g);
        }
        if let Some(n) = &p.table_names {
            names = (**n).clone();
        }
        if p.commit_time_ms > 0 {
            metrics::gauge!(names::ACKED_COMMIT_TS).set(p.commit_time_ms as f64 / 1000.0);
            if had_events {
                metrics::histogram!(names::COMMIT_TO_ACK_S).record(crate::now_ms().saturating_sub(p.commit_time_ms) as f64 / 1000.0);
            }
        }
        *stats.acked.lock().unwrap() = Some(p.position.clone());
        acked = Some(p.position);
        dirty = true;
        if last_save.elapsed() >= interval {
            if let Err(e) = save(&store, acked.as_ref().unwrap(), &gtids, &names, &stats).await {
                failure = Some(e);
                break 'outer;
            }
            last_save = Instant::now();
            dirty = false;
        }
    }
    if let (true, Some(a), None) = (dirty, acked.as_ref(), &failure) {
        if let Err(e) = save(&store, a, &gtids, &names, &stats).await {
            failure = Some(e);
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Save; only a lost lease is an error (a failed save only means a restart re-applies more,
/// and the next save retries).
async fn save(
    store: &Mutex<CheckpointStoreImpl>,
    pos: &SourcePosition,
    gtids: &GtidState,
    names: &TableNames,
    stats: &Stats,
) -> Result<(), Error> {
    let cp = checkpoint_at(pos, gtids, names);
    crate::failpoint::hit("checkpoint.before_save");
    match store.lock().await.save(&cp).await {
        Ok(()) => {
            crate::failpoint::hit("checkpoint.after_save");
            stats.checkpoints.fetch_add(1, Relaxed);
            metrics::counter!(names::CHECKPOINTS).increment(1);
            tracing::debug!(file = %cp.file, pos = cp.pos, "checkpoint saved");
            Ok(())
        }
        Err(e @ Error::Transient(TransientError::LeaseLost { .. })) => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "checkpoint save failed; will retry");
            Ok(())
        }
    }
}

async fn progress_log(stats: Arc<Stats>, mut shutdown: watch::Receiver<bool>) {
    let mut last = (u64::MAX, 0u64);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let now = (stats.transactions.load(Relaxed), stats.events_acked.load(Relaxed));
        if now != last {
            let acked = stats.acked.lock().unwrap().clone();
            tracing::info!(
                transactions = now.0,
                rows = stats.source.rows.load(Relaxed),
                key_changes = stats.key_changes.load(Relaxed),
                events_acked = now.1,
                acked = %acked.map(|p| format!("{}:{}", p.file, p.pos)).unwrap_or_default(),
                "progress"
            );
            last = now;
        }
    }
}
