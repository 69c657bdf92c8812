//! The pipeline: source -> decode -> txn -> mapping -> redis -> kafka -> checkpoint, and the
//! supervisor around it.
//!
//! This module is wiring and supervision only: the steps live in [`crate::binlog::reader`],
//! [`crate::write::apply`] and [`crate::ha::checkpoint_task`].
//!
//! Three tasks joined by bounded channels (so memory stays bounded: see "Memory" below):
//!
//! 1. the source task reads the binlog and sends committed [`Transaction`]s in commit order,
//!    their row events held raw (not decoded);
//! 2. the apply task takes every transaction already queued as one group
//!    ([`crate::write::group`]), decodes and maps it to one change per key, writes Redis
//!    (replicas, then version tokens, one pipeline per master per step) and enqueues one
//!    Kafka event per key — only after the Redis writes of the group are acknowledged (I1);
//! 3. the checkpoint task waits for every Kafka delivery of a group, in order, and only
//!    then moves the acknowledged position past it (I3); it saves at most once per interval
//!    and once more when the pipeline stops for any reason.
//!
//! With `source.heartbeat_table` set, a fourth task writes the heartbeat row every
//! `source.heartbeat_interval_ms` (seen back through the binlog, it gives the lag sub-second
//! precision; [`crate::monitor`] turns the shared counters into the lag and queue gauges).
//!
//! # Memory
//!
//! Transactions read but not applied: at most [`TXN_CHANNEL`] in the channel, their row events
//! in memory together at most twice `source.transaction_memory_mb` (a budget the source waits
//! on, [`crate::binlog::reader::MemoryBudget`]); one transaction's row events beyond
//! `source.transaction_memory_mb` are in a temporary file. Decoded rows: one group (at most
//! `apply.max_group_rows`) at a time, more while Redis is slow (at most
//! [`crate::write::apply::MAX_KEYS_IN_FLIGHT`] key changes in Redis at once, see
//! [`crate::write::apply::apply_loop`]). Events in flight: at most the producer queue
//! (`queue.buffering.max.messages`, 64 MiB), in at most [`ACK_CHANNEL`] groups (or chunks of
//! a large transaction).
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
use tokio::sync::{mpsc, watch, Mutex};

use crate::binlog::reader;
use crate::binlog::resume::SourceStats;
use crate::binlog::txn::Transaction;
use crate::binlog::{server, start_plan};
use crate::config::Config;
use crate::error::{task_failed, Error, TransientError};
use crate::ha::checkpoint::{checkpoint_at, CheckpointStoreImpl};
use crate::ha::checkpoint_task::{CheckpointStats, CheckpointTask};
use crate::ha::lease::Lease;
use crate::kafka::KafkaSink;
use crate::mapping::Mapper;
use crate::redis::RedisConn;
use crate::telemetry::{names, stage, QueueProbe};
use crate::write::apply::{apply_loop, ApplyOptions, ApplyStats, Pending, Writer};
use crate::write::fence::FenceRule;

/// Committed transactions buffered between source and apply.
pub const TXN_CHANNEL: usize = 4096;
/// Groups whose Kafka deliveries are awaited at once. Large, so that a broker that does not
/// answer stops the Redis writes only once the producer's own queue is full
/// (`queue.buffering.max.messages`, `queue.buffering.max.kbytes`: see
/// [`crate::kafka`]), not after a few dozen groups: while the broker is away the
/// replicas and tokens keep moving and an app whose fail safe bypasses its local cache reads
/// fresh values (issue #22). A waiting group holds its positions and one delivery future per
/// event (about 100 bytes each).
pub const ACK_CHANNEL: usize = 65_536;

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
    /// Commit time of the last acknowledged transaction, Unix ms (the heartbeat row's, when it
    /// was one).
    pub acked_commit_ms: AtomicU64,
    /// Groups applied (a group is every transaction queued when the apply stage took it).
    pub groups: AtomicU64,
    /// Large transactions applied alone, in chunks.
    pub large_transactions: AtomicU64,
    /// Large transactions whose row events went to a temporary file.
    pub spilled_transactions: AtomicU64,
    /// The `NOW(6)` of the last heartbeat row acknowledged, Unix µs (0: none yet).
    pub acked_heartbeat_us: AtomicU64,
    /// End position of the last transaction whose Redis writes are done and whose events are
    /// enqueued in the producer, with its commit time (Unix ms, 0: unknown); see
    /// [`ApplyStats::enqueued`]. Reset at the start of each tenure.
    pub enqueued: std::sync::Mutex<Option<(SourcePosition, u64)>>,
    /// Since when (Unix ms) the checkpoint task waits for Kafka to acknowledge a group's
    /// events; 0: not waiting.
    pub kafka_waiting_since_ms: AtomicU64,
}

impl Stats {
    /// A tenure's tasks start: what the previous tenure acknowledged, read and enqueued is not
    /// this one's (the lag gauge read it as this tenure's: 0 while 10 s behind, or the
    /// previous tenure's commit time, 170 s).
    fn new_tenure(&self) {
        self.source.new_tenure();
        *self.acked.lock().unwrap() = None;
        self.acked_commit_ms.store(0, Relaxed);
        self.acked_heartbeat_us.store(0, Relaxed);
        *self.enqueued.lock().unwrap() = None;
        self.kafka_waiting_since_ms.store(0, Relaxed);
    }
}

impl ApplyStats for Stats {
    fn applied(&self, transactions: u64, rows: u64, key_changes: u64) {
        self.key_changes.fetch_add(key_changes, Relaxed);
        self.transactions.fetch_add(transactions, Relaxed);
        self.source.rows.fetch_add(rows, Relaxed);
        self.groups.fetch_add(1, Relaxed);
    }
    fn large(&self, spilled: bool) {
        self.large_transactions.fetch_add(1, Relaxed);
        if spilled {
            self.spilled_transactions.fetch_add(1, Relaxed);
        }
    }
    fn enqueued(&self, position: &SourcePosition, commit_time_ms: u64) {
        *self.enqueued.lock().unwrap() = Some((position.clone(), commit_time_ms));
    }
}

impl CheckpointStats for Stats {
    fn event_acked(&self) {
        self.events_acked.fetch_add(1, Relaxed);
    }
    fn heartbeat_acked(&self, now_us: u64) {
        self.acked_heartbeat_us.store(now_us, Relaxed);
    }
    fn acked(&self, position: &SourcePosition, transactions: u64, commit_time_ms: u64) {
        *self.acked.lock().unwrap() = Some(position.clone());
        self.source.in_flight.fetch_sub(transactions as i64, Relaxed);
        if commit_time_ms > 0 {
            self.acked_commit_ms.store(commit_time_ms, Relaxed);
        }
    }
    fn saved(&self) {
        self.checkpoints.fetch_add(1, Relaxed);
    }
    fn kafka_waiting(&self, since_ms: u64) {
        self.kafka_waiting_since_ms.store(since_ms, Relaxed);
    }
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
    refuse_mapping_problems(&cfg, &shutdown).await?;
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
                crate::telemetry::health().restarting(e.to_string());
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
    // Stopping for good (shutdown, or a definite error: `binval run` exits), with every task
    // ended: release the lease so another instance takes over at once instead of after
    // `source.lease_ms`. A lost lease is another instance's now; a transient error is retried
    // by this instance, which keeps it.
    let stopping = *shutdown.borrow() || matches!(result, Err(Error::Definite(_)));
    if stopping && !matches!(result, Err(Error::Transient(TransientError::LeaseLost { .. }))) {
        lease.release(&redis).await;
    }
    result
}

/// `binval run` refuses at its first start (no checkpoint yet) what `binval check` refuses of the
/// mappings: a table or column the source does not have (a typo would otherwise stream nothing
/// without a word; the error names the mapping field and similar tables), a key template that
/// does not identify a row (refused on every start). Resuming a checkpoint, a missing table or
/// column is only warned about: the binlog still to read may hold the DDL that explains it.
/// A table with `created_later = true` may be missing; a mapped table a RENAME moved (the
/// checkpoint follows it) is checked under its new name. When the source or Redis cannot be
/// reached now, this is left to the first tenure, which connects with retries (and warns of schema
/// problems instead of refusing: by then the source may have changed under a running binval).
async fn refuse_mapping_problems(cfg: &Config, shutdown: &watch::Receiver<bool>) -> Result<(), Error> {
    let check = async {
        // The checkpoint's renames: a mapped table a RENAME moved is checked under its new name.
        let redis = RedisConn::connect(&cfg.redis).await?;
        let saved = CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis).load().await?;
        let mut conn = server::connect(&cfg.source).await?;
        // The binlog settings first, as `binval check` does: a wrong one is named before any
        // mapping problem it would cause.
        server::preflight(&mut conn).await?;
        let problems = server::check_mappings(&mut conn, &cfg.mappings, saved.as_ref().map(|c| &c.renamed)).await?;
        Ok::<_, Error>((problems, saved.is_some()))
    };
    let mut sd = shutdown.clone();
    let problems = tokio::select! {
        p = check => p,
        _ = sd.wait_for(|v| *v) => return Ok(()),
    };
    let (problems, resuming) = match problems {
        Ok(p) => p,
        Err(Error::Transient(e)) => {
            tracing::warn!(error = %e, "could not check the mappings against the source at start; the pipeline checks them when it connects");
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for w in &problems.waiting {
        tracing::info!(note = %w, "mapped table not created yet");
    }
    problems.refuse_keys()?;
    if problems.schema.is_empty() {
        return Ok(());
    }
    if resuming {
        // Resuming a checkpoint: the binlog between it and now may hold the DDL that explains
        // the difference (a RENAME binval follows, a DROP), done while binval was down; the
        // first tenure warns and the reader judges the tables again at each DDL.
        return Ok(());
    }
    Err(Error::config(
        "mappings",
        format!(
            "{} problem(s) against the source schema (`binval check` lists the same): {}",
            problems.schema.len(),
            problems.schema.join("; ")
        ),
    ))
}

/// What a tenure starts from, prepared before any task runs.
struct Prepared {
    store: CheckpointStoreImpl,
    kafka: Arc<KafkaSink>,
    writer: Writer,
    plan: start_plan::StartPlan,
    /// The stored replica-count decisions, when a mapping is adaptive.
    adaptive: Option<Vec<(String, crate::replicas::counts::Stored)>>,
}

/// One tenure: prepare, run the tasks, report the root cause.
async fn run_active(
    cfg: &Config,
    mapper: Arc<Mapper>,
    shutdown: watch::Receiver<bool>,
    stats: Arc<Stats>,
    redis: &RedisConn,
    lease: &Lease,
) -> Result<(), Error> {
    let Some(p) = prepare(cfg, mapper, &shutdown, redis, lease).await? else { return Ok(()) };
    let kafka = p.kafka.clone();
    // Before any task of this tenure (progress included) reads the shared state.
    stats.new_tenure();
    // Progress messages for app instances (`write::progress`); stopped when this tenure ends.
    let _progress = crate::write::progress::spawn(cfg, kafka.clone(), stats.clone(), lease.fencing_token, shutdown.clone());
    match run_tasks(cfg, p, &shutdown, stats, redis, lease).await {
        Some(e) => Err(e),
        None if *shutdown.borrow() => {
            kafka.flush(Duration::from_secs(5)).await;
            Ok(())
        }
        None => Err(TransientError::Task {
            task: "pipeline",
            message: "every task ended without an error before a shutdown was asked for".into(),
        }
        .into()),
    }
}

/// Load the checkpoint, connect Kafka, check the source and plan where to start
/// ([`start_plan::plan`]); `None` when a shutdown came while connecting.
async fn prepare(
    cfg: &Config,
    mapper: Arc<Mapper>,
    shutdown: &watch::Receiver<bool>,
    redis: &RedisConn,
    lease: &Lease,
) -> Result<Option<Prepared>, Error> {
    let mut store = CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, redis);
    store.set_fencing_token(lease.fencing_token);
    let saved = store.load().await?;
    // Connecting can take long while the broker is down: a shutdown must not wait for it.
    let kafka = {
        let mut sd = shutdown.clone();
        tokio::select! {
            k = KafkaSink::connect(&cfg.kafka) => Arc::new(k?),
            _ = sd.wait_for(|v| *v) => return Ok(None),
        }
    };
    let mut conn = server::connect(&cfg.source).await?;
    let info = server::preflight(&mut conn).await?;
    let logs = server::binary_logs(&mut conn).await?;
    let problems = server::check_mappings(&mut conn, &cfg.mappings, saved.as_ref().map(|c| &c.renamed)).await?;
    // A key that does not identify a row is fatal (deletes would tombstone keys other rows
    // still render). A missing table or column was refused when the process started
    // (`refuse_mapping_problems`); here, later, the source changed under a running binval (a
    // DROP TABLE): it warns, and the key templates are judged again after the DDL that brings
    // the table back.
    problems.refuse_keys()?;
    for p in &problems.schema {
        tracing::warn!(problem = %p, "mapping does not match the source schema");
    }
    let loc = store.location();
    let plan = start_plan::plan_start(cfg, saved.as_ref(), &loc, redis, &mut conn, &info, &logs).await?;
    drop(conn);
    plan.log(&info.identity, &loc, store.loaded_from());
    if let Some(p) = &plan.pin {
        // Pin the start now: a crash before the first transaction must not move a
        // `current` start forward and skip changes.
        store.save(&checkpoint_at(p, &plan.gtids, &plan.state, &plan.origin)).await?;
    }
    // The replica counts of adaptive mappings as the last leader left them: the first groups
    // are written with them (`crate::replicas`).
    let adaptive = if mapper.any_adaptive() { Some(mapper.counts().load_from(redis, &cfg.source.name).await?) } else { None };
    let writer = Writer::new(
        cfg,
        mapper,
        redis.clone(),
        Some(kafka.clone()),
        FenceRule::resolve(&cfg.source, info.mariadb),
        lease.fencing_token,
        ApplyOptions::run(),
    );
    Ok(Some(Prepared { store, kafka, writer, plan, adaptive }))
}

/// Run the source, apply, checkpoint and lease tasks until they end; the root cause of their
/// failures, if any.
async fn run_tasks(
    cfg: &Config,
    p: Prepared,
    shutdown: &watch::Receiver<bool>,
    stats: Arc<Stats>,
    redis: &RedisConn,
    lease: &Lease,
) -> Option<Error> {
    let (txn_tx, txn_rx) = mpsc::channel::<Transaction>(TXN_CHANNEL);
    let (ack_tx, ack_rx) = mpsc::channel::<Pending>(ACK_CHANNEL);
    crate::telemetry::watch_queues(vec![
        QueueProbe::channel(stage::SOURCE, &txn_tx),
        QueueProbe::channel(stage::APPLY, &ack_tx),
        p.kafka.queue_probe(),
    ]);
    // One stop signal for the tasks: set by the operator's shutdown, or by any task that
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
    let spawn = |f: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>| {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            let r = f.await;
            if r.is_err() {
                let _ = stop_tx.send(true);
            }
            r
        })
    };
    let mapper = p.writer.mapper.clone();
    let heartbeat = cfg
        .source
        .heartbeat_table
        .as_ref()
        .map(|t| tokio::spawn(crate::binlog::heartbeat::run(cfg.source.clone(), t.clone(), stop_rx.clone())));
    let plan = p.plan;
    let source = reader::run(
        cfg.source.clone(),
        mapper,
        plan.state.clone(),
        plan.resume,
        plan.origin.server.clone(),
        txn_tx,
        stop_rx.clone(),
        stats.source.clone(),
    );
    let source_task = spawn(Box::pin(source));
    let mut writer = p.writer;
    // Adaptive replica counts: the leader's task decides, the apply loop takes the steps.
    let adaptive = p.adaptive.map(|stored| {
        let (tx, rx) = mpsc::channel(16);
        writer.resizes = Some(rx);
        let leader = crate::replicas::task::Leader {
            cfg: cfg.adaptive.clone(),
            mapper: writer.mapper.clone(),
            redis: redis.clone(),
            source: cfg.source.name.clone(),
            tx,
        };
        spawn(Box::pin(leader.run(stored, stop_rx.clone())))
    });
    let apply_task = spawn(Box::pin(apply_loop(writer, txn_rx, ack_tx, stats.clone())));
    let checkpoint = CheckpointTask {
        store: Arc::new(Mutex::new(p.store)),
        kafka: p.kafka,
        gtids: plan.gtids,
        origin: plan.origin,
        state: plan.state,
        interval: Duration::from_millis(cfg.checkpoint.interval_ms),
        stats,
    };
    let cp_task = spawn(Box::pin(checkpoint.run(ack_rx)));
    let (lease, conn) = (lease.clone(), redis.clone());
    let lease_task = spawn(Box::pin(async move { lease.keep(conn, stop_rx).await }));
    let (s, a, c) = tokio::join!(source_task, apply_task, cp_task);
    let _ = stop_tx.send(true);
    let l = lease_task.await;
    forward.abort();
    if let Some(h) = heartbeat {
        h.abort();
    }
    if let Some(h) = adaptive {
        h.abort();
    }
    let flat = |task: &'static str, r: Result<Result<(), Error>, tokio::task::JoinError>| r.unwrap_or_else(|e| Err(task_failed(task, e)));
    root_cause([flat("lease", l), flat("source", s), flat("apply", a), flat("checkpoint", c)])
}

/// The error to report when several tasks failed: a lost lease wins over everything (the
/// other failures are its consequences), then a definite error over the transient ones it
/// caused, else the first.
fn root_cause(results: [Result<(), Error>; 4]) -> Option<Error> {
    let lost = |e: &Error| matches!(e, Error::Transient(TransientError::LeaseLost { .. }));
    let mut first: Option<Error> = None;
    for e in results.into_iter().filter_map(Result::err) {
        match (&first, &e) {
            (None, _) => first = Some(e),
            (Some(f), _) if lost(f) => {}
            (_, e2) if lost(e2) => first = Some(e),
            (Some(Error::Transient(_)), Error::Definite(_)) => first = Some(e),
            _ => {}
        }
    }
    first
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
