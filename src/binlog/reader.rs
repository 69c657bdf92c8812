//! The reader: the replica connection to the MySQL/MariaDB primary, from a start position to
//! committed transactions in commit order.
//!
//! * Before reading: the server's preflight ([`crate::binlog::server::preflight`]).
//! * Start: from the saved checkpoint, else from `source.start` (current position, `FILE:POS`,
//!   or a MariaDB GTID position via `@slave_connect_state`).
//! * Announces itself with `source.server_id`, asks for a heartbeat every
//!   `source.heartbeat_ms` (`@master_heartbeat_period`, nanoseconds), and declares MariaDB GTID
//!   capability (`@mariadb_slave_capability=4`) so MariaDB sends its GTID events.
//! * A connection silent for three heartbeat periods (three to four: one timer per connection
//!   counts the periods) is treated as half-open and dropped.
//! * Reconnects with exponential backoff (backoff crate) from the end of the last complete
//!   transaction it passed on; a partial transaction is discarded and read again.
//!
//! Events are read with mysql_async's binlog stream and mysql_common's event parser, then go
//! through the framing shared with the offline reader ([`crate::binlog::framing`]: MariaDB GTID
//! events, MariaDB compressed events, MySQL 8 TRANSACTION_PAYLOAD, which unknown events may be
//! passed over) and are handled one by one by the handlers of `binlog/events.rs`. A MariaDB compressed
//! event that cannot be decompressed stops the source with its position; the inner events of
//! a TRANSACTION_PAYLOAD are handled in order at the payload event's position, and a payload
//! that cannot be read to its end stops the source with a definite error, none of its rows
//! passed on.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use binval_protocol::SourcePosition;
use futures::{FutureExt, StreamExt};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest};
use tokio::sync::{mpsc, watch};

use crate::binlog::events::{self, ReadContext};
use crate::binlog::json_columns::JsonColumns;
use crate::binlog::resume::{Resume, SourceStats};
use crate::binlog::row_events::SpillSettings;
use crate::binlog::server::{
    binary_logs, connect, judge_key_templates, preflight, require_binlog_file, table_columns, unique_keys, ServerIdentity,
};
use crate::binlog::txn::Transaction;
use crate::binlog::xa::{PreparedXas, XaCheckpoint};
use crate::config::SourceConfig;
use crate::error::{classify_mysql, DefiniteError, Error, TransientError};
use crate::mapping::{Mapper, TableNames};

/// HEARTBEAT_LOG_EVENT: the primary sends it only when it has had nothing to send for the
/// heartbeat period (MySQL `source_heartbeat_period`, MariaDB `@master_heartbeat_period`).
const HEARTBEAT_EVENT: u8 = 27;
/// MySQL 8's HEARTBEAT_LOG_EVENT_V2.
const HEARTBEAT_EVENT_V2: u8 = 41;

/// What the reader's event handlers need of the configuration.
#[derive(Debug, Clone, Default)]
pub struct ReadSettings {
    /// Where the row events of large transactions spill (`source.transaction_memory_mb`,
    /// `source.spill_dir`).
    pub spill: SpillSettings,
    /// `(source.heartbeat_table, source.name)`, when heartbeats are on.
    pub heartbeat: Option<(String, String)>,
}

impl ReadSettings {
    /// From the `[source]` section.
    pub fn from_config(cfg: &SourceConfig) -> Self {
        ReadSettings {
            spill: SpillSettings { memory_bytes: (cfg.transaction_memory_mb as usize) << 20, dir: cfg.spill_dir.clone() },
            heartbeat: cfg.heartbeat_table.clone().map(|t| (t, cfg.name.clone())),
        }
    }
}

/// What the reader keeps from one replica connection to the next, and starts from (the saved
/// checkpoint's, or the default).
#[derive(Debug, Clone, Default)]
pub struct ReadState {
    /// Renamed mapped tables (followed RENAMEs), saved with the checkpoint.
    pub names: TableNames,
    /// MariaDB JSON columns of the mapped tables as of the last event read
    /// ([`crate::binlog::json_columns`]), saved with the checkpoint; a mapped table missing
    /// from it is read from the schema when a connection opens.
    pub json: JsonColumns,
    /// Prepared XA transactions not decided yet, as of the checkpoint
    /// ([`crate::binlog::xa`]); those with changes of mapped tables are read again from the
    /// checkpoint's position, which is held back to the oldest of them.
    pub xa: XaCheckpoint,
}

/// The memory budget of transactions read but not applied yet: each transaction sent holds
/// permits for the bytes of row events it holds in memory (one permit per KiB, at most the
/// whole budget), so the reader waits while the apply stage is behind on large transactions.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    permits: Arc<tokio::sync::Semaphore>,
    total_kib: usize,
}

impl MemoryBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        let total_kib = (bytes >> 10).max(1);
        MemoryBudget { permits: Arc::new(tokio::sync::Semaphore::new(total_kib)), total_kib }
    }

    /// Wait for the permits of `bytes` held in memory (at most the whole budget; none for 0).
    pub async fn acquire(&self, bytes: usize) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let kib = bytes.div_ceil(1024).min(self.total_kib) as u32;
        if kib == 0 {
            return None;
        }
        Some(self.permits.clone().acquire_many_owned(kib).await.expect("the budget is never closed"))
    }
}

/// Run the source until `shutdown` turns true or a definite error: read, decode, assemble, and
/// send committed transactions to `out` in commit order. Transient failures reconnect with
/// backoff from the last transaction sent, to the server the tenure planned its start on
/// (`server`): a connection that reaches another one ends the source with
/// [`TransientError::SourceChanged`], so the tenure restarts with a new start plan.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    cfg: SourceConfig,
    mapper: Arc<Mapper>,
    mut state: ReadState,
    mut resume: Resume,
    server: Option<ServerIdentity>,
    out: mpsc::Sender<Transaction>,
    mut shutdown: watch::Receiver<bool>,
    stats: Arc<SourceStats>,
) -> Result<(), Error> {
    // Transactions read but not applied hold at most twice one transaction's memory limit.
    let budget = MemoryBudget::new(((cfg.transaction_memory_mb as usize) << 20) * 2);
    // Prepared XA transactions held live as long as the reader: across reconnects.
    let mut xa = PreparedXas::from_checkpoint(&state.xa);
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(Duration::from_millis(100))
        .with_max_interval(Duration::from_millis(cfg.reconnect_max_ms))
        .with_max_elapsed_time(None)
        .build();
    loop {
        let started = std::time::Instant::now();
        let r = read_once(&cfg, &mapper, &mut state, &mut xa, &mut resume, server.as_ref(), &out, &mut shutdown, &stats, &budget).await;
        match r {
            Ok(()) => return Ok(()),
            Err(e @ Error::Transient(TransientError::SourceChanged { .. })) => return Err(e),
            Err(Error::Transient(e)) => {
                if started.elapsed() > Duration::from_secs(10) {
                    backoff.reset();
                }
                let wait = backoff.next_backoff().unwrap_or(Duration::from_millis(cfg.reconnect_max_ms));
                stats.reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!(crate::telemetry::names::RECONNECTS).increment(1);
                tracing::warn!(error = %e, resume = %resume, wait_ms = wait.as_millis() as u64, "source connection lost; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.wait_for(|v| *v) => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// One replica connection: open it at `resume`, then read, frame and handle events until
/// `shutdown`, a closed `out`, or an error. `resume` moves past every transaction sent.
#[allow(clippy::too_many_arguments)]
async fn read_once(
    cfg: &SourceConfig,
    mapper: &Mapper,
    state: &mut ReadState,
    xa: &mut PreparedXas,
    resume: &mut Resume,
    server: Option<&ServerIdentity>,
    out: &mpsc::Sender<Transaction>,
    shutdown: &mut watch::Receiver<bool>,
    stats: &SourceStats,
    budget: &MemoryBudget,
) -> Result<(), Error> {
    let (mut stream, mariadb, position_text) = open_stream(cfg, resume, server).await?;
    let _connected = crate::telemetry::source_connected();
    let silent_limit = Duration::from_millis(cfg.heartbeat_ms * 3);
    // MariaDB JSON columns of mapped tables not known yet (the first connection, a mapping
    // added since the checkpoint) are read from the schema now; the rest is as the checkpoint
    // (or the previous connection) left it. A second connection serves these queries.
    let mut schema_conn = None;
    // The first transaction sent on each connection carries what is known, for the checkpoint.
    let mut json_changed = mariadb;
    if mariadb {
        let missing: Vec<String> = state.names.live_names(mapper).into_iter().filter(|t| !state.json.0.contains_key(t)).collect();
        if !missing.is_empty() {
            let conn = schema_conn.insert(connect(cfg).await?);
            state.json.load(conn, missing).await?;
        }
    }
    let mut ctx = ReadContext::new(mapper, state, xa, stats, mariadb, resume, ReadSettings::from_config(cfg));
    // The half-open check: one timer for the connection that fires every heartbeat period
    // and counts the periods in a row without an event (not a timeout per event, which would
    // enter and leave tokio's timer wheel, and read the clock, once per transaction).
    let period = Duration::from_millis(cfg.heartbeat_ms.max(1));
    let mut quiet_periods = 0u32;
    let watchdog = tokio::time::sleep(period);
    tokio::pin!(watchdog);
    // One shutdown future for the connection: a new one per event would join and leave the
    // watch channel's waiter list (a lock each way) five times per transaction.
    let stop = shutdown.wait_for(|v| *v);
    tokio::pin!(stop);
    loop {
        let framed = match ctx.framer.next() {
            Some(framed) => framed.map_err(|e| events::framing_error(&ctx, e))?,
            None => {
                // mysql_async parses each event with mysql_common inside `next`, and
                // mysql_common 0.37 panics on some damaged events (fuzzing found an event body
                // shorter than its checksum, and TRANSACTION_PAYLOAD headers; binval checks
                // those itself where it calls the parser, see `framing::check_event_bytes`).
                // Here binval cannot check first, so as a last resort a panic in the parser is
                // caught and becomes an error naming the position, and the connection is
                // dropped (the stream is not used again).
                // Biased, the stream first: an event already read is taken without polling the
                // other two (while the stream keeps returning events, tokio's cooperative budget
                // makes it yield now and then, and the send below looks at `stop` too).
                let next = tokio::select! {
                    biased;
                    r = std::panic::AssertUnwindSafe(stream.next()).catch_unwind() => Ok(r),
                    _ = &mut stop => return Ok(()),
                    _ = &mut watchdog => {
                        // Silent for more than three whole periods (three to four since
                        // the last event) is half-open.
                        quiet_periods += 1;
                        if quiet_periods < 4 {
                            watchdog.as_mut().reset(tokio::time::Instant::now() + period);
                            continue;
                        }
                        Err(())
                    }
                };
                // Not silent: count the periods again. The timer keeps its own beat (re-armed
                // when it fires), so four fires in a row without an event are still more than
                // three whole periods since the last one.
                quiet_periods = 0;
                // Before the first ROTATE of a GTID start no file is known: name the GTID.
                let at = || if ctx.file.is_empty() { position_text.clone() } else { format!("{}:{}", ctx.file, ctx.last_pos) };
                let ev = match next {
                    Err(_) => return Err(TransientError::SourceSilent { silent_ms: silent_limit.as_millis() as u64 }.into()),
                    Ok(Err(panic)) => {
                        let what =
                            panic.downcast_ref::<String>().map(String::as_str).or(panic.downcast_ref::<&str>().copied()).unwrap_or("");
                        return Err(TransientError::Source(format!(
                            "unreadable event after {}: the binlog event parser failed: {what}",
                            at()
                        ))
                        .into());
                    }
                    Ok(Ok(None)) => return Err(TransientError::Source("server closed the binlog stream".into()).into()),
                    Ok(Ok(Some(Err(e)))) => return Err(classify_mysql(e, &at())),
                    Ok(Ok(Some(Ok(ev)))) => ev,
                };
                stats.events.fetch_add(1, Relaxed);
                if matches!(ev.header().event_type_raw(), HEARTBEAT_EVENT | HEARTBEAT_EVENT_V2) {
                    stats.at_end.store(true, Relaxed);
                }
                events::check_end_position(&mut ctx, ev.header())?;
                ctx.framer.push(ev);
                continue;
            }
        };
        let handled = events::handle(&mut ctx, &framed)?;
        if !ctx.json_refresh.is_empty() {
            check_keys_after_ddl(cfg, &ctx, &mut schema_conn).await?;
            if mariadb {
                json_changed |= refresh_json_columns(cfg, &mut ctx, &mut schema_conn).await?;
            } else {
                ctx.json_refresh.clear();
            }
        }
        let Some(mut txn) = handled else { continue };
        txn.read_live(crate::now_ms());
        txn.read_at = Some(std::time::Instant::now());
        if std::mem::take(&mut json_changed) {
            txn.json_columns = Some(Arc::new(ctx.state.json.clone()));
        }
        if let Some(previous) = ctx.gtid_previous.take() {
            txn.gtid_previous = Some(previous);
        }
        if let Some(x) = ctx.xa.take_changed() {
            metrics::gauge!(crate::telemetry::names::XA_HELD).set(ctx.xa.held() as f64);
            txn.xa = Some(Arc::new(x));
        }
        let pos = txn.position.clone();
        stats.in_flight.fetch_add(1, Relaxed);
        stats.at_end.store(false, Relaxed);
        stats.transaction_read(&txn.position, txn.heartbeat_us.map_or(txn.commit_time_ms, |us| us / 1000));
        tokio::select! {
            r = async {
                txn.budget = budget.acquire(txn.rows.memory_bytes()).await;
                out.send(txn).await
            } => if r.is_err() { return Ok(()) },
            _ = &mut stop => return Ok(()),
        }
        *resume = Resume::FilePos(SourcePosition { gtid: None, ..pos });
    }
}

/// After a DDL statement named `ctx.json_refresh`: read the JSON columns of those of them that
/// are mapped (after the statement) again, before the next event is handled, and forget their
/// prepared TABLE_MAPs so the next ones use what was read (see [`crate::binlog::json_columns`]).
/// Returns whether what is known changed.
async fn refresh_json_columns(cfg: &SourceConfig, ctx: &mut ReadContext<'_>, conn: &mut Option<mysql_async::Conn>) -> Result<bool, Error> {
    let before = ctx.state.json.clone();
    for table in std::mem::take(&mut ctx.json_refresh) {
        ctx.tables.forget_named(&table);
        if ctx.state.names.resolve(ctx.mapper, &table).is_some() {
            let c = match conn {
                Some(c) => c,
                None => conn.insert(connect(cfg).await?),
            };
            let cols = JsonColumns::load_table(c, &table).await?;
            if ctx.state.json.0.get(&table) != Some(&cols) {
                tracing::info!(table = %table, columns = ?cols.iter().map(|c| &c.name).collect::<Vec<_>>(), "MariaDB JSON columns after a DDL: their values go into the payload as JSON documents");
            }
            ctx.state.json.0.insert(table, cols);
        } else {
            ctx.state.json.0.remove(&table);
        }
    }
    Ok(ctx.state.json != before)
}

/// After a DDL statement named tables (`ctx.json_refresh`): judge the key templates of those
/// that are mapped against their unique keys as the source has them now
/// ([`crate::binlog::server::judge_key_templates`], as at start). A template that no longer
/// identifies a row (`ALTER TABLE t DROP PRIMARY KEY`) stops the source with
/// [`DefiniteError::MappingBroken`] naming the table, the position after the statement and the
/// mapping, before any later row of the table is applied. A table that is gone (DROP) or a
/// template whose column is gone is not judged here (the rows say so, see
/// [`Mapper::missing_key_columns`]).
async fn check_keys_after_ddl(cfg: &SourceConfig, ctx: &ReadContext<'_>, conn: &mut Option<mysql_async::Conn>) -> Result<(), Error> {
    for table in &ctx.json_refresh {
        let Some(configured) = ctx.state.names.resolve(ctx.mapper, table) else { continue };
        let Some((index, templates, accepts)) = ctx.mapper.key_rule(&configured) else { continue };
        if accepts {
            continue;
        }
        let c = match conn {
            Some(c) => c,
            None => conn.insert(connect(cfg).await?),
        };
        let cols = table_columns(c, table).await?;
        let judged: Vec<(usize, binval_protocol::KeyTemplate)> = templates
            .iter()
            .enumerate()
            .filter(|(_, t)| t.columns().all(|x| cols.iter().any(|c| c == x)))
            .map(|(k, t)| (k, t.clone()))
            .collect();
        if judged.is_empty() {
            continue;
        }
        let problems = judge_key_templates(index, &configured, &judged, false, &unique_keys(c, table).await?);
        if !problems.is_empty() {
            return Err(DefiniteError::MappingBroken {
                table: table.clone(),
                position: format!("{}:{}", ctx.file, ctx.last_pos),
                message: format!("after this DDL statement, {}", problems.join("; ")),
            }
            .into());
        }
    }
    Ok(())
}

/// Connect, run the preflight, and open the binlog stream at `resume`: checks that the server
/// is the one expected (`server`, see [`crate::binlog::start_plan::same_server`]) and that a
/// resume file is still among its binary logs, asks for heartbeats, declares MariaDB GTID
/// capability, and for a GTID start sets `@slave_connect_state` (MariaDB) or sends the GTID
/// set (MySQL `COM_BINLOG_DUMP_GTID`). Returns the stream, whether the server is MariaDB, and
/// `resume` as text (to name the start in errors).
async fn open_stream(cfg: &SourceConfig, resume: &Resume, server: Option<&ServerIdentity>) -> Result<(BinlogStream, bool, String), Error> {
    let mut conn = connect(cfg).await?;
    let info = preflight(&mut conn).await?;
    crate::binlog::start_plan::same_server(server, &info.identity)?;
    if let Resume::FilePos(p) = resume {
        let logs = binary_logs(&mut conn).await?;
        require_binlog_file(&logs, &p.into(), "the resume position")?;
    }
    let heartbeat_ns = cfg.heartbeat_ms * 1_000_000;
    conn.query_drop(format!("SET @master_heartbeat_period = {heartbeat_ns}")).await.map_err(|e| classify_mysql(e, "setup"))?;
    if info.mariadb {
        conn.query_drop("SET @mariadb_slave_capability = 4").await.map_err(|e| classify_mysql(e, "setup"))?;
    }
    let position_text = resume.to_string();
    let mut req = BinlogStreamRequest::new(cfg.server_id);
    let fname;
    match resume {
        Resume::FilePos(p) => {
            fname = p.file.clone().into_bytes();
            req = req.with_filename(&fname).with_pos(p.pos);
        }
        Resume::Gtid(g) => {
            if !info.mariadb {
                return Err(DefiniteError::SourceRefused("a gtid: start needs MariaDB; for MySQL use FILE:POS".into()).into());
            }
            conn.query_drop(format!("SET @slave_connect_state = '{g}'")).await.map_err(|e| classify_mysql(e, "setup"))?;
            conn.query_drop("SET @slave_gtid_strict_mode = 0").await.map_err(|e| classify_mysql(e, "setup"))?;
        }
        Resume::MysqlGtid(set) => {
            if info.mariadb {
                return Err(DefiniteError::SourceRefused("a MySQL GTID set cannot be resumed on MariaDB".into()).into());
            }
            let sids =
                crate::binlog::gtid::dump_sids(set).map_err(|e| DefiniteError::SourceRefused(format!("the GTID set to resume by: {e}")))?;
            req = req.with_gtid().with_gtid_set(sids);
        }
    }
    tracing::info!(server = %info.version, from = %position_text, server_id = cfg.server_id, "replica connection open");
    let stream = conn.get_binlog_stream(req).await.map_err(|e| classify_mysql(e, &position_text))?;
    Ok((stream, info.mariadb, position_text))
}
