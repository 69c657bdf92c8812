//! `binval replay`: re-apply a range of the binlog through the same version-fenced writes as
//! `binval run`, for operators after an incident (a Redis master lost its data, a bad deploy
//! wrote wrong values, an app instance missed invalidations).
//!
//! # Why replay is safe beside a live `binval run`
//!
//! Every replica write and every version bump is fenced by the change's source position
//! ([`binval_protocol::fence`]): replaying changes that Redis already holds is a no-op, and a
//! replayed change older than what a key holds is refused. So replay needs no lease, takes no
//! checkpoint and never pauses the live pipeline; it only adds read load (its own replica
//! connection, its own `server_id`) and write load (bounded by `--rate`).
//!
//! Replay writes under the source's current fencing token (read from Redis at start and after
//! a takeover), so a change a live instance wrote under a newer tenure is not overwritten by
//! replay either way: it holds a newer position.
//!
//! Events are published only for key changes that moved something in Redis (a restored
//! replica or a moved version token): consumers need no notice of a no-op.
//!
//! # Never a payload the database no longer has
//!
//! After a Redis master lost its data, fencing alone no longer protects: a deleted row whose
//! token was lost would get its old payload back from a replay of its UPDATE. So each key
//! change that would move something is first checked against the database's present row, and
//! written as logged only when the database still holds exactly that; otherwise its present
//! state is written at a fresh snapshot's position ([`guard`]; `--as-logged` turns this off).
//! The summary counts them (`checked_against_database`, `written_present`, `deleted_since`).
//!
//! # Range
//!
//! * `--from`: `FILE:POS` (the first event at that position), `gtid:D-S-N` (MariaDB: the first
//!   transaction after that GTID, as `CHANGE MASTER ... master_use_gtid` reads it), or a UTC
//!   date-time `YYYY-MM-DD HH:MM:SS` (the first transaction committed at or after it; binval
//!   starts at the start of the newest binlog file created before it).
//! * `--to` (inclusive; default: the primary's position when replay starts): the same forms.
//!
//! RENAMEs inside the range are followed. When the checkpoint records renamed mapped tables,
//! replay cannot know which of them happened before `--from` and asks: `--renames checkpoint`
//! (start with the checkpoint's names) or `--renames none` (start with the configured names).

use std::sync::Arc;
use std::time::Duration;

use binval_protocol::{BinlogPosition, MariadbGtid, SourcePosition};
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::binlog::reader;
use crate::binlog::resume::{Resume, SourceStats};
use crate::binlog::server;
use crate::binlog::txn::Transaction;
use crate::config::{Config, MappingConfig, SourceConfig, StartForms, StartPoint};
use crate::error::{task_failed, Error};
use crate::mapping::{Mapper, TableNames};
use crate::redis::RedisConn;
use crate::write::apply::{ApplyOptions, Writer};
use crate::write::fence::FenceRule;

pub mod guard;

/// The flags of `binval replay`, as given (clap; validated by [`ReplayArgs::from_cli`]). The
/// field docs are the `--help` text.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayCli {
    /// Start: FILE:POS, gtid:D-S-N (the first transaction after it) or a UTC date-time
    /// "YYYY-MM-DD HH:MM:SS".
    #[arg(long)]
    pub from: String,
    /// End, inclusive (same forms). Default: the primary's position when replay starts.
    #[arg(long)]
    pub to: Option<String>,
    /// Only this mapped table (`schema.table`); repeat for several. Default: all mapped tables.
    #[arg(long = "table")]
    pub tables: Vec<String>,
    /// Print what would change and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// At most this many key changes per second.
    #[arg(long)]
    pub rate: Option<u32>,
    /// server_id of replay's replica connection (default: source.server_id + 1000000).
    #[arg(long)]
    pub server_id: Option<u32>,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// When the checkpoint records renamed mapped tables: `checkpoint` (they were renamed
    /// before --from) or `none` (start with the configured names).
    #[arg(long, value_parser = ["checkpoint", "none"])]
    pub renames: Option<String>,
    /// Serve Prometheus metrics (replay progress: binval_replay_*) and /healthz on this
    /// ip:port while replaying (not `metrics.listen`: a live `binval run` may hold it).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Write the logged row images as they are, without checking a key whose write would move
    /// something against the database's present row. Can bring deleted rows back after Redis
    /// lost data; for MySQL sources (no snapshot positions) and for Redis that lost nothing.
    #[arg(long)]
    pub as_logged: bool,
}

/// What `binval replay` was asked to do.
#[derive(Debug, Clone)]
pub struct ReplayArgs {
    /// Start of the range ([`StartForms::replay`]: a binlog position, one GTID or a time).
    pub from: StartPoint,
    /// End of the range (inclusive); `None` = the primary's position when replay starts.
    pub to: Option<StartPoint>,
    /// Only these mapped tables (`schema.table`); empty = all mapped tables.
    pub tables: Vec<String>,
    /// Print what would change (one JSON line per key change) and write nothing.
    pub dry_run: bool,
    /// At most this many key changes per second; `None` = unlimited.
    pub rate: Option<u32>,
    /// server_id of replay's replica connection. Default: `source.server_id + 1000000`
    /// (wrapping, never 0); must be unique in the topology like any replica's.
    pub server_id: Option<u32>,
    /// Which renamed-table state to start from when the checkpoint records renamed mapped
    /// tables: `Some(true)` = the checkpoint's (all renames happened before `--from`),
    /// `Some(false)` = none (the configured names), `None` = refuse if there are any.
    pub renames_from_checkpoint: Option<bool>,
    /// Show a progress line on stderr (hidden when stderr is not a terminal).
    pub progress: bool,
    /// Write the logged images without the check against the database's present rows
    /// ([`guard`]).
    pub as_logged: bool,
}

impl ReplayArgs {
    /// Validate the command line: `--from`/`--to` forms and order, `--rate` >= 1, a
    /// `--server-id` other than `source.server_id`. Errors are configuration errors naming the
    /// flag (exit code 2).
    pub fn from_cli(cfg: &Config, cli: ReplayCli) -> Result<Self, Error> {
        let from = StartPoint::parse(&cli.from, StartForms::replay("--from")).map_err(|r| Error::config("--from", r.to_string()))?;
        let to = cli
            .to
            .map(|t| StartPoint::parse(&t, StartForms::replay("--to")))
            .transpose()
            .map_err(|r| Error::config("--to", r.to_string()))?;
        if cli.rate == Some(0) {
            return Err(Error::config("--rate", "must be at least 1 key change per second"));
        }
        if cli.server_id == Some(cfg.source.server_id) {
            return Err(Error::config(
                "--server-id",
                format!(
                    "{} is source.server_id, which the live `binval run` uses: the server would disconnect one of them",
                    cfg.source.server_id
                ),
            ));
        }
        if let Some(to) = &to {
            check_range(&from, to).map_err(|r| Error::config("--to", r.to_string()))?;
        }
        Ok(ReplayArgs {
            from,
            to,
            tables: cli.tables,
            dry_run: cli.dry_run,
            rate: cli.rate,
            server_id: cli.server_id,
            progress: !cli.quiet,
            renames_from_checkpoint: cli.renames.map(|r| r == "checkpoint"),
            as_logged: cli.as_logged,
        })
    }
}

/// `binval replay` from the command line: validate, replay until done or Ctrl-C, print the
/// dry-run lines and the summary (one JSON line each) on stdout.
pub async fn cli(cfg: Config, cli: ReplayCli) -> Result<(), Error> {
    let listen = cli.metrics_listen.clone();
    let args = ReplayArgs::from_cli(&cfg, cli)?;
    if let Some(l) = &listen {
        crate::telemetry::serve(l, "--metrics-listen", &[("source", cfg.source.name.as_str())])
            .await
            .map_err(|e| Error::config("--metrics-listen", e.to_string()))?;
    }
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::warn!("interrupted: stopping replay after the current transaction (rerun it: replay is idempotent)");
        let _ = tx.send(true);
    });
    let summary = run(&cfg, &args, |line| println!("{line}"), rx).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

/// A replay range whose end (`--to`) lies before its start (`--from`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackwardRange {
    /// Both ends are binlog positions, the end before the start.
    #[error("{to} is before --from {from}")]
    Binlog { from: BinlogPosition, to: BinlogPosition },
    /// Both ends are GTIDs of one domain, the end's sequence number below the start's.
    #[error("gtid {domain}-?-{to_seq} is before --from (sequence {from_seq})")]
    Gtid { domain: u32, from_seq: u64, to_seq: u64 },
    /// Both ends are times, the end before the start.
    #[error("the end time is before --from")]
    Time,
}

/// Errors (shown for `--to`) when `to` lies before `from` in the same coordinate (binlog
/// position, one GTID domain, or time); mixed forms are not compared.
pub fn check_range(from: &StartPoint, to: &StartPoint) -> Result<(), BackwardRange> {
    match (from, to) {
        (StartPoint::Binlog(a), StartPoint::Binlog(b)) if b.order_key() < a.order_key() => {
            Err(BackwardRange::Binlog { from: a.clone(), to: b.clone() })
        }
        (StartPoint::Gtid(a), StartPoint::Gtid(b)) => match (StartPoint::single_gtid(a), StartPoint::single_gtid(b)) {
            (Some(a), Some(b)) if a.domain == b.domain && b.seq < a.seq => {
                Err(BackwardRange::Gtid { domain: a.domain, from_seq: a.seq, to_seq: b.seq })
            }
            _ => Ok(()),
        },
        (StartPoint::Time(a), StartPoint::Time(b)) if b < a => Err(BackwardRange::Time),
        _ => Ok(()),
    }
}

/// Totals of a replay, printed as one JSON line at the end.
#[derive(Debug, Default, Serialize, Clone, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Transactions read in the range (with or without mapped rows: other databases' and
    /// tables' transactions on the same server count too).
    pub transactions: u64,
    /// Transactions of the range with changes of mapped tables (row changes, or a DDL that
    /// made a mapped table's keys stale).
    pub mapped_transactions: u64,
    /// Key changes in the range (after the per-transaction collapse).
    pub key_changes: u64,
    /// Key changes that moved a replica or a version token (dry run: would move).
    pub changed: u64,
    /// Key changes Redis already held (fenced no-ops).
    pub unchanged: u64,
    /// Events published (0 in a dry run).
    pub events: u64,
    /// Key changes that would have moved something, checked against the database's present
    /// row first ([`guard`]; 0 with `--as-logged` and in a dry run).
    pub checked_against_database: u64,
    /// Of those, written with the database's present state at a snapshot's position instead
    /// of the logged image (the row changed or went since, or a record of the key was newer).
    pub written_present: u64,
    /// Of those, logged inserts or updates of rows the database no longer has: written as
    /// deleted, where the logged image would have brought the row back.
    pub deleted_since: u64,
    /// Position after the last transaction replayed, `file:pos`.
    pub last_position: Option<String>,
    /// Whether nothing was written.
    pub dry_run: bool,
}

/// Where the replica connection starts and where the range ends.
struct Range {
    resume: Resume,
    /// Transactions committed before this (Unix ms; 0 = none) are read but skipped (a time
    /// `--from` starts at the beginning of a binlog file).
    not_before_ms: u64,
    to: StartPoint,
    source: SourceConfig,
}

/// Run a replay; dry-run lines go to `out` (stdout in the CLI). Stops early when `shutdown`
/// turns true (the summary then covers what was done).
///
/// Errors: definite for bad arguments (unknown `--table`, an unreachable range) and for what
/// `binval run` treats as definite; transient failures are returned too (replay does not
/// retry on its own: rerun it, it is idempotent).
pub async fn run(
    cfg: &Config,
    args: &ReplayArgs,
    mut out: impl FnMut(&str) + Send,
    shutdown: watch::Receiver<bool>,
) -> Result<ReplaySummary, Error> {
    let mappings = crate::scan::selected_mappings(cfg, &args.tables)?;
    let (mapper, range, mariadb) = open_range(cfg, args, &mappings).await?;
    let redis = RedisConn::connect(&cfg.redis).await?;
    let names = start_names(cfg, &redis, args.renames_from_checkpoint).await?;
    let mut writer = open_writer(cfg, args, mapper.clone(), redis, mariadb).await?;
    let guard_stats = Arc::new(guard::GuardStats::default());
    if !args.dry_run && !args.as_logged {
        writer.options.guard = Some(Box::new(guard::PresentGuard::new(cfg, &mappings, guard_stats.clone())));
    }
    let progress = progress_bar(args.progress);
    tracing::info!(from = ?args.from, to = ?range.to, tables = ?args.tables, dry_run = args.dry_run, server_id = range.source.server_id, "replay starting");

    let (txn_tx, txn_rx) = mpsc::channel::<Transaction>(64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stats = Arc::new(SourceStats::default());
    // JSON columns: read from the schema of now when the replica connection opens, then
    // again after each DDL on a mapped table in the range (see binlog::json_columns).
    let state = reader::ReadState { names, ..Default::default() };
    let source_task = tokio::spawn(reader::run(range.source.clone(), mapper, state, range.resume.clone(), None, txn_tx, stop_rx, stats));
    let mut summary = ReplaySummary { dry_run: args.dry_run, ..Default::default() };
    let mut last: Option<SourcePosition> = match &args.from {
        StartPoint::Binlog(p) => Some(SourcePosition { file: p.file.clone(), pos: p.pos, gtid: None }),
        _ => None,
    };
    let result = replay_range(&range, &mut writer, txn_rx, shutdown, &mut out, &progress, &mut summary, &mut last).await;
    let _ = stop_tx.send(true);
    let src = source_task.await.map_err(|e| task_failed("source", e))?;
    progress.finish_and_clear();
    result?;
    src?;
    summary.last_position = last.map(|p| format!("{}:{}", p.file, p.pos));
    use std::sync::atomic::Ordering::Relaxed;
    summary.checked_against_database = guard_stats.checked.load(Relaxed);
    summary.written_present = guard_stats.present.load(Relaxed);
    summary.deleted_since = guard_stats.deleted_since.load(Relaxed);
    Ok(summary)
}

/// Check the source and resolve the range: the mapper, the
/// range and whether the source is MariaDB.
async fn open_range(cfg: &Config, args: &ReplayArgs, mappings: &[MappingConfig]) -> Result<(Arc<Mapper>, Range, bool), Error> {
    let mapper = Arc::new(Mapper::new(mappings).map_err(|e| Error::config("mappings", e.to_string()))?);
    let mut conn = server::connect(&cfg.source).await?;
    let info = server::preflight(&mut conn).await?;
    let logs = server::binary_logs(&mut conn).await?;
    drop(conn);
    let to = args.to.clone().unwrap_or_else(|| StartPoint::Binlog(BinlogPosition::from(&info.current)));
    let mut source = cfg.source.clone();
    source.server_id = args.server_id.unwrap_or_else(|| match cfg.source.server_id.wrapping_add(1_000_000) {
        0 => 1,
        s => s,
    });
    let (resume, not_before_ms) = match &args.from {
        StartPoint::Binlog(p) => {
            server::require_binlog_file(&logs, p, "--from")?;
            // A position inside a transaction starts at its first event (see binlog::boundary).
            let p = crate::binlog::boundary::group_start(&source, p, "--from").await?;
            (Resume::FilePos(SourcePosition { file: p.file.clone(), pos: p.pos, gtid: None }), 0)
        }
        StartPoint::Gtid(g) => (Resume::Gtid(g.clone()), 0),
        StartPoint::Time(ms) => {
            let file = file_for_time(&source, &logs, *ms).await?;
            (Resume::FilePos(SourcePosition { file, pos: 4, gtid: None }), *ms)
        }
        StartPoint::Current | StartPoint::MysqlGtidSet(_) => unreachable!("--from accepts neither `current` nor a GTID set"),
    };
    Ok((mapper, Range { resume, not_before_ms, to, source }, info.mariadb))
}

/// Renamed mapped tables: the live run follows RENAMEs as it reads them and keeps the state
/// in its checkpoint. Replay starts elsewhere and cannot know which renames came before
/// --from: the operator says so (`--renames`), else an error naming `--renames`.
async fn start_names(cfg: &Config, redis: &RedisConn, from_checkpoint: Option<bool>) -> Result<TableNames, Error> {
    let mut store = crate::ha::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, redis);
    let renamed = store.load().await?.map(|c| c.renamed).unwrap_or_default();
    match (renamed.0.is_empty(), from_checkpoint) {
        (true, _) | (false, Some(false)) => Ok(TableNames::default()),
        (false, Some(true)) => Ok(renamed),
        (false, None) => {
            let list: Vec<String> = renamed.0.iter().map(|(k, v)| format!("{k} -> {}", v.as_deref().unwrap_or("(unmapped)"))).collect();
            Err(Error::config(
                "--renames",
                format!(
                    "the checkpoint of source {} records renamed mapped tables ({}); say whether they happened before --from: --renames checkpoint (yes) or --renames none (no, use the configured names)",
                    cfg.source.name,
                    list.join(", ")
                ),
            ))
        }
    }
}

/// The writer of a replay: Kafka unless a dry run, the source's current fencing token (replay
/// holds no lease, see the module docs), replay's [`ApplyOptions`].
async fn open_writer(cfg: &Config, args: &ReplayArgs, mapper: Arc<Mapper>, redis: RedisConn, mariadb: bool) -> Result<Writer, Error> {
    let fence = FenceRule::resolve(&cfg.source, mariadb);
    crate::replicas::counts::load_for(&mapper, &redis, &cfg.source.name).await?;
    Writer::without_lease(cfg, "replay", mapper, redis, fence, !args.dry_run, |key| ApplyOptions::replay(args.dry_run, args.rate, key))
        .await
}

fn progress_bar(show: bool) -> indicatif::ProgressBar {
    let progress = indicatif::ProgressBar::new_spinner();
    if !show {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    progress.enable_steady_tick(Duration::from_millis(200));
    progress
}

/// Apply the transactions of the range as the source sends them, until the end of the range,
/// the end of the binlog (idle and caught up) or `shutdown`.
#[allow(clippy::too_many_arguments)]
async fn replay_range(
    range: &Range,
    writer: &mut Writer,
    mut txn_rx: mpsc::Receiver<Transaction>,
    mut shutdown: watch::Receiver<bool>,
    out: &mut (dyn FnMut(&str) + Send),
    progress: &indicatif::ProgressBar,
    summary: &mut ReplaySummary,
    last: &mut Option<SourcePosition>,
) -> Result<(), Error> {
    if let StartPoint::Binlog(p) = &range.to {
        replay_position("end", &p.file, p.pos);
    }
    loop {
        let next = tokio::select! {
            t = txn_rx.recv() => t,
            _ = shutdown.wait_for(|v| *v) => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(1000)) => {
                // Idle: done when the server has nothing beyond what was replayed.
                if caught_up(&range.source, last.as_ref(), &range.to).await? { return Ok(()); }
                continue;
            }
        };
        let Some(txn) = next else { return Ok(()) };
        if beyond(&txn, &range.to) {
            return Ok(());
        }
        *last = Some(txn.position.clone());
        if range.not_before_ms > 0 && txn.commit_time_ms + 999 < range.not_before_ms {
            continue;
        }
        summary.transactions += 1;
        summary.mapped_transactions += u64::from(!txn.rows.is_empty() || !txn.invalidate_tables.is_empty());
        let (position, at_end) = (txn.position.clone(), reached(&txn, &range.to));
        let o = writer.apply_transaction(txn, out).await?;
        summary.key_changes += o.key_changes;
        summary.changed += o.changed;
        summary.unchanged += o.unchanged;
        summary.events += o.events_acked;
        replay_metrics(&o, &position);
        progress.set_message(format!(
            "{} transactions, {} key changes ({} changed, {} unchanged), at {}",
            summary.transactions, summary.key_changes, summary.changed, summary.unchanged, position
        ));
        if at_end {
            return Ok(());
        }
    }
}

/// Progress of one replayed transaction as `binval_replay_*` metrics (see `telemetry`).
fn replay_metrics(o: &crate::write::apply::TxnOutcome, at: &SourcePosition) {
    use crate::telemetry::names;
    metrics::counter!(names::REPLAY_TRANSACTIONS).increment(1);
    metrics::counter!(names::REPLAY_KEY_CHANGES, "result" => "changed").increment(o.changed);
    metrics::counter!(names::REPLAY_KEY_CHANGES, "result" => "unchanged").increment(o.unchanged);
    metrics::counter!(names::REPLAY_EVENTS).increment(o.events_acked);
    replay_position("read", &at.file, at.pos);
}

fn replay_position(which: &'static str, file: &str, pos: u64) {
    use crate::telemetry::names;
    if let Some(i) = binval_protocol::file_index(file) {
        metrics::gauge!(names::REPLAY_FILE_INDEX, "position" => which).set(i as f64);
    }
    metrics::gauge!(names::REPLAY_POSITION, "position" => which).set(pos as f64);
}

/// `txn` lies after the end of the range (exclusive of it).
fn beyond(txn: &Transaction, to: &StartPoint) -> bool {
    match to {
        StartPoint::Binlog(p) => BinlogPosition::from(&txn.position).order_key() > p.order_key(),
        StartPoint::Gtid(g) => StartPoint::single_gtid(g).is_some_and(|g| gtid_seq(txn, g.domain).is_some_and(|s| s > g.seq)),
        StartPoint::Time(ms) => txn.commit_time_ms > *ms,
        StartPoint::Current | StartPoint::MysqlGtidSet(_) => false,
    }
}

/// `txn` is the last transaction of the range.
fn reached(txn: &Transaction, to: &StartPoint) -> bool {
    match to {
        StartPoint::Binlog(p) => BinlogPosition::from(&txn.position).order_key() >= p.order_key(),
        StartPoint::Gtid(g) => StartPoint::single_gtid(g).is_some_and(|g| gtid_seq(txn, g.domain).is_some_and(|s| s >= g.seq)),
        StartPoint::Time(_) | StartPoint::Current | StartPoint::MysqlGtidSet(_) => false,
    }
}

/// The sequence number of `txn`'s GTID when it is a MariaDB GTID of `domain`.
fn gtid_seq(txn: &Transaction, domain: u32) -> Option<u64> {
    let g: MariadbGtid = txn.position.gtid.as_deref()?.parse().ok()?;
    (g.domain == domain).then_some(g.seq)
}

/// Idle check: nothing more to replay when the primary's current position is not beyond the
/// last transaction replayed (or the end of the range was passed).
async fn caught_up(cfg: &SourceConfig, last: Option<&SourcePosition>, to: &StartPoint) -> Result<bool, Error> {
    let mut conn = server::connect(cfg).await?;
    let current = server::current_position(&mut conn).await?;
    let _ = conn.disconnect().await;
    let Some(current) = current else { return Ok(true) };
    let cur = current.order_key();
    let Some(last) = last else { return Ok(false) };
    let last = BinlogPosition::from(last).order_key();
    Ok(match to {
        StartPoint::Binlog(p) => last >= p.order_key() || last >= cur,
        _ => last >= cur,
    })
}

/// The newest binlog file whose first event was written at or before `ms` (else the oldest).
async fn file_for_time(cfg: &SourceConfig, logs: &[String], ms: u64) -> Result<String, Error> {
    use futures::StreamExt;
    let mut chosen = logs.first().cloned().ok_or_else(|| Error::config("--from", "the server has no binary logs"))?;
    for f in logs {
        let conn = server::connect(cfg).await?;
        let name = f.clone().into_bytes();
        let req = mysql_async::BinlogStreamRequest::new(cfg.server_id).with_filename(&name).with_pos(4).with_non_blocking();
        let mut stream = conn.get_binlog_stream(req).await.map_err(|e| crate::error::classify_mysql(e, &format!("{f}:4")))?;
        let mut created: Option<u64> = None;
        for _ in 0..3 {
            match stream.next().await {
                Some(Ok(ev)) if ev.header().timestamp() > 0 => {
                    created = Some(u64::from(ev.header().timestamp()) * 1000);
                    break;
                }
                Some(Ok(_)) => continue,
                _ => break,
            }
        }
        let _ = stream.close().await;
        match created {
            Some(c) if c <= ms => chosen = f.clone(),
            Some(_) => break,
            None => {}
        }
    }
    Ok(chosen)
}
