//! The reader: the replica connection to the MySQL/MariaDB primary, from a start position to
//! committed transactions in commit order.
//!
//! * Before reading: the server's preflight ([`crate::binlog::server::preflight`]).
//! * Start: from the saved checkpoint, else from `source.start` (current position, `FILE:POS`,
//!   or a MariaDB GTID position via `@slave_connect_state`).
//! * Announces itself with `source.server_id`, asks for a heartbeat every
//!   `source.heartbeat_ms` (`@master_heartbeat_period`, nanoseconds), and declares MariaDB GTID
//!   capability (`@mariadb_slave_capability=4`) so MariaDB sends its GTID events.
//! * A connection silent for three heartbeat periods is treated as half-open and dropped.
//! * Reconnects with exponential backoff (backoff crate) from the end of the last complete
//!   transaction it passed on; a partial transaction is discarded and read again.
//!
//! Events are read with mysql_async's binlog stream and mysql_common's event parser. MariaDB's
//! own GTID event (type 162) is not parsed by mysql_common 0.37, so binval reads its fixed
//! 13-byte body (seq_no u64 LE, domain_id u32 LE, flags u8; MariaDB `Gtid_log_event`) itself.
//! MariaDB compressed events (`log_bin_compress=ON`, types 165-171) are decompressed into the
//! plain QUERY / row events they wrap ([`crate::binlog::decode::uncompress_mariadb_event`]) and then
//! handled like those; one that cannot be decompressed stops the source with its position.
//! MySQL 8 TRANSACTION_PAYLOAD events (`binlog_transaction_compression=ON`) are unwrapped
//! ([`crate::binlog::decode::transaction_payload_events`]) and their inner events (BEGIN, TABLE_MAPs,
//! rows, XID) handled in order at the payload event's position; a payload that cannot be read
//! to its end stops the source with a definite error, and none of its rows are passed on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backoff::backoff::Backoff;
use binval_protocol::SourcePosition;
use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::BinlogStreamRequest;
use mysql_common::binlog::events::EventData;
use tokio::sync::{mpsc, watch};

use crate::binlog::decode::{decode_rows, TableSchema};
use crate::binlog::server::{binary_logs, connect, preflight, require_binlog_file, ServerInfo};
use crate::binlog::txn::{Assembler, Boundary, Transaction};
use crate::config::{SourceConfig, StartPosition};
use crate::error::{classify_mysql, DefiniteError, Error, TransientError};
use crate::mapping::{Mapper, TableNames};

/// MariaDB GTID_EVENT type code.
const MARIADB_GTID_EVENT: u8 = 162;
/// MariaDB Gtid_log_event flag: the group is one statement with no COMMIT.
const MARIADB_FL_STANDALONE: u8 = 1;

/// Where the source begins reading.
#[derive(Debug, Clone)]
pub enum Resume {
    /// A binlog position (from a checkpoint or `FILE:POS`).
    FilePos(SourcePosition),
    /// A MariaDB GTID position.
    Gtid(String),
}

impl std::fmt::Display for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resume::FilePos(p) => write!(f, "{}:{}", p.file, p.pos),
            Resume::Gtid(g) => write!(f, "gtid {g}"),
        }
    }
}

/// Decide the first position: checkpoint, else the configured start.
pub fn initial_resume(checkpoint: Option<SourcePosition>, start: &StartPosition, info: &ServerInfo) -> Resume {
    match (checkpoint, start) {
        (Some(p), _) => Resume::FilePos(p),
        (None, StartPosition::Current) => Resume::FilePos(info.current.clone()),
        (None, StartPosition::FilePos { file, pos }) => Resume::FilePos(SourcePosition { file: file.clone(), pos: *pos, gtid: None }),
        (None, StartPosition::Gtid(g)) => Resume::Gtid(g.clone()),
    }
}

/// Counters the source shares with the progress log.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Binlog events read.
    pub events: std::sync::atomic::AtomicU64,
    /// Row changes of mapped tables decoded.
    pub rows: std::sync::atomic::AtomicU64,
    /// Reconnects after a failure.
    pub reconnects: std::sync::atomic::AtomicU64,
}

/// Run the source until `shutdown` turns true or a definite error: read, decode, assemble, and
/// send committed transactions to `out` in commit order. Transient failures reconnect with
/// backoff from the last transaction sent.
pub async fn run(
    cfg: SourceConfig,
    mapper: Arc<Mapper>,
    mut names: TableNames,
    mut resume: Resume,
    out: mpsc::Sender<Transaction>,
    mut shutdown: watch::Receiver<bool>,
    stats: Arc<SourceStats>,
) -> Result<(), Error> {
    let mut backoff = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(Duration::from_millis(100))
        .with_max_interval(Duration::from_millis(cfg.reconnect_max_ms))
        .with_max_elapsed_time(None)
        .build();
    loop {
        let started = std::time::Instant::now();
        let r = read_once(&cfg, &mapper, &mut names, &mut resume, &out, &mut shutdown, &stats).await;
        match r {
            Ok(()) => return Ok(()),
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

async fn read_once(
    cfg: &SourceConfig,
    mapper: &Mapper,
    names: &mut TableNames,
    resume: &mut Resume,
    out: &mpsc::Sender<Transaction>,
    shutdown: &mut watch::Receiver<bool>,
    stats: &SourceStats,
) -> Result<(), Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut conn = connect(cfg).await?;
    let info = preflight(&mut conn).await?;
    if let Resume::FilePos(p) = &*resume {
        let logs = binary_logs(&mut conn).await?;
        require_binlog_file(&logs, &p.into(), "the resume position")?;
    }
    let heartbeat_ns = cfg.heartbeat_ms * 1_000_000;
    conn.query_drop(format!("SET @master_heartbeat_period = {heartbeat_ns}")).await.map_err(|e| classify_mysql(e, "setup"))?;
    if info.mariadb {
        conn.query_drop("SET @mariadb_slave_capability = 4").await.map_err(|e| classify_mysql(e, "setup"))?;
    }
    let mut file = String::new();
    let position_text = resume.to_string();
    let mut req = BinlogStreamRequest::new(cfg.server_id);
    let fname;
    match &*resume {
        Resume::FilePos(p) => {
            fname = p.file.clone().into_bytes();
            req = req.with_filename(&fname).with_pos(p.pos);
            file = p.file.clone();
        }
        Resume::Gtid(g) => {
            if !info.mariadb {
                return Err(DefiniteError::SourceRefused("a gtid: start needs MariaDB; for MySQL use FILE:POS".into()).into());
            }
            conn.query_drop(format!("SET @slave_connect_state = '{g}'")).await.map_err(|e| classify_mysql(e, "setup"))?;
            conn.query_drop("SET @slave_gtid_strict_mode = 0").await.map_err(|e| classify_mysql(e, "setup"))?;
        }
    }
    tracing::info!(server = %info.version, from = %position_text, server_id = cfg.server_id, "replica connection open");
    let mut stream = conn.get_binlog_stream(req).await.map_err(|e| classify_mysql(e, &position_text))?;

    let silent_limit = Duration::from_millis(cfg.heartbeat_ms * 3);
    let mut tables: HashMap<u64, Arc<TableSchema>> = HashMap::new();
    let mut asm = Assembler::new();
    let mut seen_fde = false;
    let mut last_pos: u64 = match &*resume {
        Resume::FilePos(p) => p.pos,
        Resume::Gtid(_) => 4,
    };
    // Events unwrapped from a MySQL 8 TRANSACTION_PAYLOAD, handled before the next event of
    // the stream; they take the payload event's position and time.
    let mut payload: std::vec::IntoIter<mysql_common::binlog::events::Event> = Vec::new().into_iter();
    let mut payload_header = None;
    loop {
        let (ev, outer) = match payload.next() {
            Some(inner) => (inner, payload_header),
            None => {
                let next = tokio::select! {
                    r = tokio::time::timeout(silent_limit, stream.next()) => r,
                    _ = shutdown.wait_for(|v| *v) => return Ok(()),
                };
                let ev = match next {
                    Err(_) => return Err(TransientError::SourceSilent { silent_ms: silent_limit.as_millis() as u64 }.into()),
                    Ok(None) => return Err(TransientError::Source("server closed the binlog stream".into()).into()),
                    // Before the first ROTATE of a GTID start no file is known: name the GTID.
                    Ok(Some(Err(e))) => {
                        return Err(classify_mysql(e, &if file.is_empty() { position_text.clone() } else { format!("{file}:{last_pos}") }))
                    }
                    Ok(Some(Ok(ev))) => ev,
                };
                (ev, None)
            }
        };
        stats.events.fetch_add(1, Relaxed);
        let header = ev.header();
        // Position and time of this event: the payload event's for the events inside one.
        let placed = outer.unwrap_or(header);
        if placed.log_pos() != 0 && outer.is_none() && positions_grow(header.event_type_raw()) {
            // Within one file the end positions of these events only grow. The replication
            // protocol carries them in 32 bits: past 4 GiB of one file they wrap, and a
            // checkpoint would name the wrong place. Stop before passing such a position on.
            let p = placed.log_pos() as u64;
            if p < last_pos {
                return Err(DefiniteError::UnsupportedEvent(format!(
                    "binlog file {file} grew past 4 GiB (event ending at {p} after one ending at {last_pos}): binlog positions are 32-bit in the replication protocol and wrap there, so binval cannot name a resume position; keep binlog files under 4 GiB (max_binlog_size, no transaction of several GiB)"
                ))
                .into());
            }
            last_pos = p;
        }
        let here = |file: &str| SourcePosition { file: file.to_string(), pos: placed.log_pos() as u64, gtid: None };
        let at = || format!("{}:{}", file, placed.log_pos());
        if header.event_type_raw() == MARIADB_GTID_EVENT {
            let d = ev.data();
            if d.len() < 13 {
                return Err(TransientError::Source(format!("short MariaDB GTID event at {}", at())).into());
            }
            let seq = u64::from_le_bytes(d[0..8].try_into().unwrap());
            let domain = u32::from_le_bytes(d[8..12].try_into().unwrap());
            let flags = d[12];
            let gtid = format!("{domain}-{}-{seq}", header.server_id());
            asm.boundary(Boundary::Begin { gtid: Some(gtid), standalone: flags & MARIADB_FL_STANDALONE != 0 });
            continue;
        }
        // MariaDB log_bin_compress=ON: QUERY_COMPRESSED and the compressed row events become
        // the plain events they wrap; a record that cannot be decompressed stops the stream.
        let uncompressed;
        let ev = if crate::binlog::decode::mariadb_compressed_plain_type(header.event_type_raw()).is_some() {
            uncompressed =
                crate::binlog::decode::uncompress_mariadb_event(&ev).map_err(|e| DefiniteError::Decode { position: at(), source: e })?;
            &uncompressed
        } else {
            &ev
        };
        let data = match ev.read_data() {
            Ok(Some(d)) => d,
            // Types mysql_common does not know: passed over only when they carry no rows.
            Ok(None) if crate::binlog::decode::skippable_unknown_event(header.event_type_raw(), header.flags_raw()) => continue,
            Ok(None) => {
                return Err(DefiniteError::UnsupportedEvent(format!(
                    "unknown binlog event type {} at {} (not marked ignorable): binval does not skip events it cannot read",
                    header.event_type_raw(),
                    at()
                ))
                .into())
            }
            Err(e) => return Err(TransientError::Source(format!("unreadable event at {}: {e}", at())).into()),
        };
        let finished = match data {
            EventData::RotateEvent(r) => {
                let mut name = r.name_raw().to_vec();
                if !seen_fde && header.log_pos() == 0 && ends_with_own_crc32(ev) {
                    // The stream's first (fake) ROTATE is parsed before the FORMAT_DESCRIPTION
                    // that announces checksums, so its name carries the 4 CRC32 bytes. The
                    // server adds them by what the replica asked for (mysql_async asks for
                    // 'ALL'), not by its own binlog_checksum: with binlog_checksum=NONE they
                    // are there too. So the bytes are checked, not assumed.
                    name.truncate(name.len().saturating_sub(4));
                }
                file = String::from_utf8_lossy(&name).into_owned();
                // Positions start again in the file it names: at its position field (4 for a
                // new file; the requested start for the first, fake ROTATE of a stream; a fake
                // ROTATE also announces the next file when a file ended without a ROTATE, as
                // after a server restart).
                last_pos = r.position();
                if header.log_pos() != 0 && !asm.in_transaction() {
                    // A real rotation: move the checkpoint to the new file even when no
                    // transaction follows, so an idle source never pins a log that may be purged.
                    Some(Transaction {
                        position: SourcePosition { file: file.clone(), pos: r.position(), gtid: None },
                        commit_time_ms: header.timestamp() as u64 * 1000,
                        rows: Vec::new(),
                        invalidate_tables: Vec::new(),
                        table_names: None,
                    })
                } else {
                    None
                }
            }
            EventData::FormatDescriptionEvent(_) => {
                seen_fde = true;
                None
            }
            EventData::TableMapEvent(tme) => {
                let id = tme.table_id();
                if let Some(configured) = names.resolve(mapper, &format!("{}.{}", tme.database_name(), tme.table_name())) {
                    // A TABLE_MAP precedes every statement's rows; an identical one (under the
                    // same configured name) keeps its prepared schema.
                    if !tables.get(&id).is_some_and(|t| t.same_table_map(&tme) && *t.name == *configured) {
                        let mut schema = TableSchema::from_table_map(tme.into_owned(), info.mariadb)
                            .map_err(|e| DefiniteError::Decode { position: at(), source: e })?;
                        if *schema.name != *configured {
                            // A renamed mapped table: its rows go on under the configured rule.
                            schema.name = Arc::from(configured.as_str());
                        }
                        tables.insert(id, Arc::new(schema));
                    }
                } else {
                    tables.remove(&id);
                }
                None
            }
            EventData::RowsEvent(rows) => {
                if let Some(t) = tables.get(&rows.table_id()) {
                    let mut out_rows = Vec::new();
                    decode_rows(t, &rows, &mut out_rows).map_err(|e| DefiniteError::Decode { position: at(), source: e })?;
                    stats.rows.fetch_add(out_rows.len() as u64, Relaxed);
                    asm.push_rows(out_rows);
                }
                None
            }
            EventData::TransactionPayloadEvent(_) => {
                // MySQL 8 binlog_transaction_compression=ON: the whole transaction (BEGIN,
                // TABLE_MAPs, rows, XID) is inside; a payload that cannot be read stops here.
                let inner = crate::binlog::decode::transaction_payload_events(ev)
                    .map_err(|e| DefiniteError::Decode { position: at(), source: e })?;
                payload = inner.into_iter();
                payload_header = Some(header);
                None
            }
            EventData::IncidentEvent(i) => {
                // INCIDENT_LOST_EVENTS: the primary could not write some changes to its binlog
                // (a replica stops here too, MySQL error 1590); the cache cannot be trusted.
                return Err(DefiniteError::UnsupportedEvent(format!(
                    "incident event at {} ({:?}: {}): the source reports changes missing from its binlog; rebuild the cache (bootstrap) and restart from a position after it",
                    at(),
                    i.incident_type(),
                    i.message()
                ))
                .into());
            }
            EventData::XaPrepareLogEvent(_) => {
                if asm.held_rows() > 0 {
                    return Err(DefiniteError::UnsupportedEvent(format!(
                        "XA PREPARE at {} holds changes of mapped tables; binval does not apply two-phase XA transactions yet (they would reach the cache before their XA COMMIT or despite an XA ROLLBACK)",
                        at()
                    ))
                    .into());
                }
                asm.boundary(Boundary::Commit { end: here(&file), timestamp_s: placed.timestamp() })
            }
            EventData::XidEvent(_) => asm.boundary(Boundary::Commit { end: here(&file), timestamp_s: placed.timestamp() }),
            EventData::GtidEvent(g) => {
                let gtid = format!("{}:{}", uuid_text(&g.sid()), g.gno());
                asm.boundary(Boundary::Begin { gtid: Some(gtid), standalone: true });
                None
            }
            EventData::QueryEvent(q) => {
                let text = q.query();
                let t = text.trim();
                let upper: String = t.chars().take(12).collect::<String>().to_ascii_uppercase();
                if t.starts_with("# Dummy event replacing event type") {
                    // MariaDB replaces events a replica declared it cannot handle (by
                    // @mariadb_slave_capability) with this comment: the real event is lost.
                    return Err(DefiniteError::UnsupportedEvent(format!(
                        "at {}: the source sent a placeholder instead of an event ({t}); binval never accepts it in place of row events",
                        at()
                    ))
                    .into());
                }
                if upper.starts_with("XA START") || upper.starts_with("XA END") || upper.starts_with("XA BEGIN") {
                    None
                } else if upper.starts_with("XA COMMIT") && asm.in_transaction() && t.to_ascii_uppercase().ends_with("ONE PHASE") {
                    asm.boundary(Boundary::Commit { end: here(&file), timestamp_s: placed.timestamp() })
                } else if t.eq_ignore_ascii_case("BEGIN") {
                    asm.boundary(Boundary::Begin { gtid: None, standalone: false })
                } else if t.eq_ignore_ascii_case("COMMIT") {
                    asm.boundary(Boundary::Commit { end: here(&file), timestamp_s: placed.timestamp() })
                } else if t.eq_ignore_ascii_case("ROLLBACK") {
                    asm.boundary(Boundary::Rollback)
                } else {
                    let mut invalidate_tables = Vec::new();
                    let mut renamed = false;
                    if let Some(ddl) = crate::binlog::ddl::classify(t, &q.schema()) {
                        let unsupported = |table: &str| DefiniteError::UnsupportedDdl {
                            kind: ddl.kind,
                            table: table.to_string(),
                            position: at(),
                            statement: t.chars().take(500).collect(),
                        };
                        if ddl.invalidates() {
                            for table in &ddl.tables {
                                if let Some(configured) = names.resolve(mapper, table) {
                                    invalidate_tables.push(configured);
                                }
                            }
                        } else {
                            // RENAME: tables come in (from, to) pairs; a mapped table's rule
                            // follows it to its new name (its rows and keys are unchanged)...
                            let mut moved: Vec<(String, String)> = Vec::new();
                            for pair in ddl.tables.chunks(2) {
                                let [from, to] = pair else { continue };
                                match names.rename(mapper, from, to) {
                                    Ok(true) => {
                                        renamed = true;
                                        moved.push((from.clone(), to.clone()));
                                        tracing::info!(from = %from, to = %to, position = %at(), "mapped table renamed: its mapping follows the new name");
                                    }
                                    Ok(false) => {}
                                    Err(_) => return Err(unsupported(to).into()),
                                }
                            }
                            // ...unless the same statement puts another table under the old
                            // name: the cut-over of an online schema change (gh-ost, pt-osc:
                            // `RENAME TABLE t TO t_old, t_new TO t`). The rule stays with the
                            // name, and since the table behind it is a new one, every key of
                            // it is marked stale.
                            for (from, to) in moved {
                                let swapped_in = ddl.tables.chunks(2).any(|p| matches!(p, [_, t2] if *t2 == from));
                                if swapped_in {
                                    if let Some(configured) = names.undo_rename(mapper, &from, &to) {
                                        tracing::info!(table = %from, old_table_now = %to, position = %at(), "table swapped under a mapped name (online schema change cut-over): the mapping stays with the name; its keys are marked stale");
                                        invalidate_tables.push(configured);
                                    }
                                }
                            }
                        }
                    }
                    let b = asm.boundary(Boundary::Statement { end: here(&file), timestamp_s: placed.timestamp(), invalidate_tables });
                    b.map(|mut txn| {
                        if renamed {
                            txn.table_names = Some(Arc::new(names.clone()));
                        }
                        txn
                    })
                }
            }
            _ => None,
        };
        if let Some(txn) = finished {
            let pos = txn.position.clone();
            tokio::select! {
                r = out.send(txn) => if r.is_err() { return Ok(()) },
                _ = shutdown.wait_for(|v| *v) => return Ok(()),
            }
            *resume = Resume::FilePos(SourcePosition { gtid: None, ..pos });
        }
    }
}

/// Event types whose end positions within one binlog file only grow (never sent as fakes with
/// an older position at the start of a stream): QUERY, XID, TABLE_MAP, row events (v1, v2,
/// partial, MariaDB compressed), MySQL GTID / ANONYMOUS_GTID, MariaDB GTID, TRANSACTION_PAYLOAD.
fn positions_grow(ty: u8) -> bool {
    matches!(ty, 2 | 16 | 19 | 23..=25 | 30..=34 | 39 | 40 | 162 | 165..=171)
}

/// True when the last 4 bytes of the event body are the CRC32 of the event before them
/// (header included), as MySQL/MariaDB compute event checksums.
fn ends_with_own_crc32(ev: &mysql_common::binlog::events::Event) -> bool {
    use mysql_common::proto::MySerialize;
    let data = ev.data();
    if data.len() < 4 {
        return false;
    }
    let (body, tail) = data.split_at(data.len() - 4);
    let mut header = Vec::with_capacity(19);
    ev.header().serialize(&mut header);
    let mut crc = flate2::Crc::new();
    crc.update(&header);
    crc.update(body);
    crc.sum() == u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])
}

fn uuid_text(sid: &[u8; 16]) -> String {
    let h: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}
