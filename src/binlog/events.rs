//! The live reader's event handlers: one function per binlog event type, each taking the
//! [`ReadContext`] that holds what the replica connection has read so far (binlog file and
//! position, TABLE_MAPs, the open transaction).
//!
//! [`crate::binlog::reader`] reads events from the replica connection, passes them through the
//! [`Framer`] (MariaDB GTID, compressed events, TRANSACTION_PAYLOAD) and calls [`handle`] on
//! each; a handler returns a finished [`Transaction`] when its event ends one (commit,
//! standalone statement, rotation to a new file). Errors are definite when the binlog holds
//! something binval cannot apply exactly, transient when the connection may be at fault.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use binval_protocol::SourcePosition;
use mysql_common::binlog::events::{
    BinlogEventHeader, Event, EventData, GtidEvent, IncidentEvent, QueryEvent, RotateEvent, RowsEventData, TableMapEvent,
};

use crate::binlog::ddl::TableDdl;
use crate::binlog::decode::{decode_rows, TableSchema};
use crate::binlog::framing::{Body, Framed, Framer, FramingError, FramingErrorKind, MariadbGtidEvent, TableMaps};
use crate::binlog::reader::{ReadSettings, ReadState};
use crate::binlog::resume::{Resume, SourceStats};
use crate::binlog::row_events::SpillSettings;
use crate::binlog::txn::{Assembler, Boundary, Transaction};
use crate::binlog::xa::{Decided, PreparedXas, Xid};
use crate::error::{DefiniteError, Error, TransientError};
use crate::mapping::Mapper;

/// What one replica connection has read so far: the state the event handlers share.
pub(crate) struct ReadContext<'a> {
    pub(crate) mapper: &'a Mapper,
    /// What the reader keeps across connections: renamed mapped tables, JSON columns.
    pub(crate) state: &'a mut ReadState,
    /// Prepared XA transactions held until their XA COMMIT / ROLLBACK (kept across
    /// connections, see `binlog::xa`).
    pub(crate) xa: &'a mut PreparedXas,
    /// Where held row events spill (`source.transaction_memory_mb`, `source.spill_dir`).
    spill: SpillSettings,
    /// Tables a DDL statement just named: before the next event is handled, the key templates
    /// of the mapped ones are judged again (`reader::check_keys_after_ddl`) and, on MariaDB,
    /// their JSON columns are read again (see `binlog::json_columns`).
    pub(crate) json_refresh: Vec<String>,
    stats: &'a SourceStats,
    /// The source is MariaDB (its TABLE_MAPs count GEOMETRY among the character columns).
    mariadb: bool,
    /// The binlog file being read; empty before the first ROTATE of a GTID start.
    pub(crate) file: String,
    /// End position of the last event read whose position only grows (see
    /// [`check_end_position`]); where the stream starts before that.
    pub(crate) last_pos: u64,
    /// A FORMAT_DESCRIPTION has been read on this connection.
    seen_fde: bool,
    pub(crate) tables: TableMaps,
    asm: Assembler,
    /// `source.heartbeat_table` and `source.name`: rows of the heartbeat table written by this
    /// source are read here (not mapped) for the sub-second lag.
    heartbeat: Option<(String, String)>,
    /// Events read but not handled yet (the inner events of a TRANSACTION_PAYLOAD).
    pub(crate) framer: Framer,
    /// Where the open event group began: its GTID event (MariaDB, MySQL), or its `BEGIN`
    /// when no GTID event came first (MySQL 5.x). `None` before the first group.
    pub(crate) group_start: Option<SourcePosition>,
    /// No event group has begun on this connection yet. A row event, TABLE_MAP or commit seen
    /// now belongs to a group that began before the start position: its first events (and so
    /// some of its rows, or its GTID) were not read. The start position is checked before
    /// reading (`binlog::boundary`), so this is a last guard: the reader stops instead.
    before_first_group: bool,
    /// MySQL: the set of the last PREVIOUS_GTIDS event read, until the reader hands it on with
    /// the next transaction (`Transaction::gtid_previous`).
    pub(crate) gtid_previous: Option<Arc<binval_protocol::MysqlGtidSet>>,
}

impl<'a> ReadContext<'a> {
    /// The state of a new connection that starts at `resume`.
    pub(crate) fn new(
        mapper: &'a Mapper,
        state: &'a mut ReadState,
        xa: &'a mut PreparedXas,
        stats: &'a SourceStats,
        mariadb: bool,
        resume: &Resume,
        settings: ReadSettings,
    ) -> Self {
        let (file, last_pos) = match resume {
            Resume::FilePos(p) => (p.file.clone(), p.pos),
            Resume::Gtid(_) | Resume::MysqlGtid(_) => (String::new(), 4),
        };
        ReadContext {
            mapper,
            state,
            xa,
            spill: settings.spill.clone(),
            json_refresh: Vec::new(),
            stats,
            mariadb,
            file,
            last_pos,
            seen_fde: false,
            tables: TableMaps::new(),
            asm: Assembler::new(settings.spill),
            heartbeat: settings.heartbeat,
            framer: Framer::new(),
            group_start: None,
            before_first_group: true,
            gtid_previous: None,
        }
    }

    /// True inside an event group (a transaction, or a MariaDB standalone statement group).
    pub(crate) fn in_group(&self) -> bool {
        self.asm.in_transaction()
    }

    /// An event group begins with the event placed by `placed`.
    fn group_begins(&mut self, placed: BinlogEventHeader) {
        let start = (placed.log_pos() as u64).saturating_sub(placed.event_size() as u64);
        self.group_start = Some(SourcePosition { file: self.file.clone(), pos: start, gtid: None });
        self.before_first_group = false;
    }

    /// The error for an event of a group whose start was not read (see `before_first_group`).
    fn started_inside_a_group(&self, placed: BinlogEventHeader, what: &str) -> Error {
        DefiniteError::UnsupportedEvent(format!(
            "{what} at {}: the replica connection started inside a transaction (its first events lie before the start position), so some of its rows would be lost; start at the transaction's first event (its GTID event)",
            self.at(placed)
        ))
        .into()
    }

    /// `file:pos` of an event placed by `placed` (see [`Framed::placed`]), for errors and logs.
    fn at(&self, placed: BinlogEventHeader) -> String {
        format!("{}:{}", self.file, placed.log_pos())
    }

    /// The binlog position just after the event placed by `placed`: where a transaction that
    /// ends with it resumes.
    fn end(&self, placed: BinlogEventHeader) -> SourcePosition {
        SourcePosition { file: self.file.clone(), pos: placed.log_pos() as u64, gtid: None }
    }

    /// The open transaction commits with the event placed by `placed`.
    fn commit(&mut self, placed: BinlogEventHeader) -> Option<Transaction> {
        let end = self.end(placed);
        self.asm.boundary(Boundary::Commit { end, timestamp_s: placed.timestamp() })
    }
}

/// Event types whose end positions within one binlog file only grow (never sent as fakes with
/// an older position at the start of a stream): QUERY, XID, TABLE_MAP, row events (v1, v2,
/// partial, MariaDB compressed), MySQL GTID / ANONYMOUS_GTID, MariaDB GTID, TRANSACTION_PAYLOAD.
fn positions_grow(ty: u8) -> bool {
    matches!(ty, 2 | 16 | 19 | 23..=25 | 30..=34 | 39 | 40 | 162 | 165..=171)
}

/// Check the end position of an event read from the stream (not one inside a payload) before
/// it is handled, and remember it.
pub(crate) fn check_end_position(ctx: &mut ReadContext<'_>, header: BinlogEventHeader) -> Result<(), Error> {
    if header.log_pos() == 0 || !positions_grow(header.event_type_raw()) {
        return Ok(());
    }
    // Within one file the end positions of these events only grow. The replication
    // protocol carries them in 32 bits: past 4 GiB of one file they wrap, and a
    // checkpoint would name the wrong place. Stop before passing such a position on.
    let p = header.log_pos() as u64;
    if p < ctx.last_pos {
        return Err(DefiniteError::UnsupportedEvent(format!(
            "binlog file {} grew past 4 GiB (event ending at {p} after one ending at {}): binlog positions are 32-bit in the replication protocol and wrap there, so binval cannot name a resume position; keep binlog files under 4 GiB (max_binlog_size, no transaction of several GiB)",
            ctx.file, ctx.last_pos
        ))
        .into());
    }
    ctx.last_pos = p;
    Ok(())
}

/// A framing error as the live reader reports it: definite when the binlog holds something
/// binval cannot read exactly, transient when the connection may have damaged the event.
pub(crate) fn framing_error(ctx: &ReadContext<'_>, e: FramingError) -> Error {
    let at = ctx.at(e.placed());
    match *e.kind {
        FramingErrorKind::Compressed(source) | FramingErrorKind::Payload(source) => DefiniteError::Decode { position: at, source }.into(),
        FramingErrorKind::ShortMariadbGtid { .. } => TransientError::Source(format!("short MariaDB GTID event at {at}")).into(),
        FramingErrorKind::Unreadable(e) => TransientError::Source(format!("unreadable event at {at}: {e}")).into(),
        FramingErrorKind::Unknown => DefiniteError::UnsupportedEvent(format!(
            "unknown binlog event type {} at {at} (not marked ignorable): binval does not skip events it cannot read",
            e.header.event_type_raw()
        ))
        .into(),
    }
}

/// Handle one framed event; returns the transaction it finishes, if any.
pub(crate) fn handle(ctx: &mut ReadContext<'_>, framed: &Framed) -> Result<Option<Transaction>, Error> {
    if framed.outer.is_some() {
        // An event from inside a TRANSACTION_PAYLOAD: read from the payload, not the stream.
        ctx.stats.events.fetch_add(1, Relaxed);
    }
    let placed = framed.placed();
    let data = match framed.body().map_err(|e| framing_error(ctx, e))? {
        Body::MariadbGtid(g) => return Ok(on_mariadb_gtid(ctx, placed, g)),
        Body::Skipped => return Ok(None),
        Body::Data(data) => data,
    };
    if ctx.before_first_group {
        let what = match &data {
            EventData::TableMapEvent(_) => Some("a TABLE_MAP"),
            EventData::RowsEvent(_) => Some("a row event"),
            EventData::XidEvent(_) => Some("a commit (XID)"),
            EventData::XaPrepareLogEvent(_) => Some("an XA PREPARE"),
            EventData::QueryEvent(q) if matches!(q.query().trim().to_ascii_uppercase().as_str(), "COMMIT" | "ROLLBACK") => {
                Some("a COMMIT/ROLLBACK")
            }
            _ => None,
        };
        if let Some(what) = what {
            return Err(ctx.started_inside_a_group(placed, what));
        }
    }
    Ok(match data {
        EventData::RotateEvent(r) => on_rotate(ctx, &framed.event, &r),
        EventData::FormatDescriptionEvent(_) => {
            ctx.seen_fde = true;
            None
        }
        EventData::TableMapEvent(tme) => on_table_map(ctx, placed, tme)?,
        EventData::RowsEvent(rows) => on_rows(ctx, placed, &framed.event, &rows)?,
        EventData::IncidentEvent(i) => return Err(on_incident(ctx, placed, &i)),
        EventData::XaPrepareLogEvent(body) => on_xa_prepare(ctx, placed, &body)?,
        EventData::XidEvent(_) => ctx.commit(placed),
        EventData::GtidEvent(g) => on_mysql_gtid(ctx, placed, &g),
        EventData::PreviousGtidsEvent(p) => {
            // MySQL, near a binlog file's start: every GTID of the files before it. It goes
            // with the next transaction passed on, for the checkpoint's GTID set.
            ctx.gtid_previous = Some(Arc::new(crate::binlog::gtid::previous_gtids(&p)));
            None
        }
        EventData::QueryEvent(q) => on_query(ctx, placed, &q)?,
        _ => None,
    })
}

/// ROTATE: the binlog file changes (or, for a fake ROTATE, is announced).
fn on_rotate(ctx: &mut ReadContext<'_>, ev: &Event, r: &RotateEvent<'_>) -> Option<Transaction> {
    let header = ev.header();
    let mut name = r.name_raw().to_vec();
    if !ctx.seen_fde && header.log_pos() == 0 && ends_with_own_crc32(ev) {
        // The stream's first (fake) ROTATE is parsed before the FORMAT_DESCRIPTION
        // that announces checksums, so its name carries the 4 CRC32 bytes. The
        // server adds them by what the replica asked for (mysql_async asks for
        // 'ALL'), not by its own binlog_checksum: with binlog_checksum=NONE they
        // are there too. So the bytes are checked, not assumed.
        name.truncate(name.len().saturating_sub(4));
    }
    ctx.file = String::from_utf8_lossy(&name).into_owned();
    // Positions start again in the file it names: at its position field (4 for a
    // new file; the requested start for the first, fake ROTATE of a stream; a fake
    // ROTATE also announces the next file when a file ended without a ROTATE, as
    // after a server restart).
    ctx.last_pos = r.position();
    if header.log_pos() != 0 && !ctx.asm.in_transaction() {
        // A real rotation: move the checkpoint to the new file even when no
        // transaction follows, so an idle source never pins a log that may be purged.
        Some(Transaction {
            position: SourcePosition { file: ctx.file.clone(), pos: r.position(), gtid: None },
            commit_time_ms: header.timestamp() as u64 * 1000,
            ..Transaction::default()
        })
    } else {
        None
    }
}

/// TABLE_MAP: prepare the schema of a mapped table (under its configured name); forget the
/// table id of any other table, so its rows are passed over.
fn on_table_map(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, tme: TableMapEvent<'_>) -> Result<Option<Transaction>, Error> {
    let id = tme.table_id();
    let name = format!("{}.{}", tme.database_name(), tme.table_name());
    if ctx.heartbeat.as_ref().is_some_and(|(t, _)| *t == name) {
        let mariadb = ctx.mariadb;
        ctx.tables
            .table_map(tme, None, |tme| TableSchema::from_table_map(tme, mariadb))
            .map_err(|e| DefiniteError::Decode { position: ctx.at(placed), source: e })?;
        return Ok(None);
    }
    let Some(configured) = ctx.state.names.resolve(ctx.mapper, &name) else {
        ctx.tables.forget(id);
        return Ok(None);
    };
    let mariadb = ctx.mariadb;
    let json = &ctx.state.json;
    let prepare = |tme| {
        let mut t = TableSchema::from_table_map(tme, mariadb)?;
        if mariadb {
            // What the reader knows of the table's JSON columns now, at its place in the binlog.
            t.json_columns = Some(json.for_table_map(&name, &t));
        }
        Ok(t)
    };
    let r = ctx.tables.table_map(tme, Some(&configured), prepare);
    r.map_err(|e| DefiniteError::Decode { position: ctx.at(placed), source: e })?;
    Ok(None)
}

/// Row event of a mapped table: held, not decoded, in the open transaction (decoded after its
/// commit by the apply stage, see `binlog::row_events`). A row of the heartbeat table written
/// by this source marks the transaction as a heartbeat.
fn on_rows(
    ctx: &mut ReadContext<'_>,
    placed: BinlogEventHeader,
    event: &Event,
    rows: &RowsEventData<'_>,
) -> Result<Option<Transaction>, Error> {
    let Some(t) = ctx.tables.get(rows.table_id()).cloned() else { return Ok(None) };
    if ctx.heartbeat.as_ref().is_some_and(|(table, _)| **table == *t.name) {
        on_heartbeat_rows(ctx, placed, &t, rows)?;
        return Ok(None);
    }
    let file = ctx.file.clone();
    ctx.asm
        .push_rows(&t, &file, placed.log_pos(), event.clone())
        .map_err(|e| TransientError::LocalDisk(format!("holding the row event at {}: {e}", ctx.at(placed))))?;
    Ok(None)
}

/// Rows of the heartbeat table: the `ts_us` of the row whose `source` is this source's name.
fn on_heartbeat_rows(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, t: &TableSchema, rows: &RowsEventData<'_>) -> Result<(), Error> {
    let mut out = Vec::new();
    decode_rows(t, rows, &mut out).map_err(|e| DefiniteError::Decode { position: ctx.at(placed), source: e })?;
    let source = ctx.heartbeat.as_ref().map(|(_, s)| s.as_str()).unwrap_or_default();
    for r in out {
        let Some(after) = r.after else { continue };
        if after.get("source").and_then(|v| v.as_str()) == Some(source) {
            if let Some(us) = after.get("ts_us").and_then(|v| v.as_u64()) {
                ctx.asm.heartbeat(us);
            }
        }
    }
    Ok(())
}

/// INCIDENT: always stops the source.
fn on_incident(ctx: &ReadContext<'_>, placed: BinlogEventHeader, i: &IncidentEvent<'_>) -> Error {
    // INCIDENT_LOST_EVENTS: the primary could not write some changes to its binlog
    // (a replica stops here too, MySQL error 1590); the cache cannot be trusted.
    DefiniteError::UnsupportedEvent(format!(
        "incident event at {} ({:?}: {}): the source reports changes missing from its binlog; rebuild the cache (bootstrap) and restart from a position after it",
        ctx.at(placed),
        i.incident_type(),
        i.message()
    ))
    .into()
}

/// XA PREPARE: ends the event group of a prepared XA transaction. Its row events of mapped
/// tables are held until its XA COMMIT or XA ROLLBACK (`binlog::xa`); the group passes on
/// empty (its GTID and position move on, the checkpoint stays at the group's start while it is
/// held).
fn on_xa_prepare(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, body: &[u8]) -> Result<Option<Transaction>, Error> {
    let xid = Xid::from_prepare_event(body).ok_or_else(|| {
        DefiniteError::UnsupportedEvent(format!("XA PREPARE at {}: its XID cannot be read (the event is cut short)", ctx.at(placed)))
    })?;
    let rows = ctx.asm.take_rows();
    let start = match (&ctx.group_start, rows.is_empty()) {
        (_, true) => SourcePosition::default(),
        (Some(s), false) => s.clone(),
        (None, false) => return Err(ctx.started_inside_a_group(placed, "an XA PREPARE")),
    };
    if !rows.is_empty() {
        tracing::info!(xid = %xid, position = %ctx.at(placed), row_events = rows.events(), "XA PREPARE with changes of mapped tables: held until its XA COMMIT (applied) or XA ROLLBACK (dropped); the checkpoint stays at its start meanwhile");
    }
    let at = ctx.at(placed);
    ctx.xa
        .prepare(xid, start, rows, &ctx.spill)
        .map_err(|e| TransientError::LocalDisk(format!("holding the XA transaction prepared at {at}: {e}")))?;
    Ok(ctx.commit(placed))
}

/// `XA COMMIT xid` / `XA ROLLBACK xid` of a prepared XA transaction (its own event group): the
/// held row events become this transaction's (commit) or are dropped (rollback).
fn on_xa_decision(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, t: &str, commit: bool) -> Result<Option<Transaction>, Error> {
    let keyword = if commit { "XA COMMIT".len() } else { "XA ROLLBACK".len() };
    let xid = t.get(keyword..).and_then(Xid::parse_statement).ok_or_else(|| {
        DefiniteError::UnsupportedEvent(format!(
            "at {}: `{}` names no XID binval can read",
            ctx.at(placed),
            t.chars().take(200).collect::<String>()
        ))
    })?;
    if commit {
        match ctx.xa.commit(&xid, &ctx.end(placed)) {
            Decided::Held(rows) => {
                tracing::info!(xid = %xid, position = %ctx.at(placed), row_events = rows.events(), "XA COMMIT: the changes held since its XA PREPARE are applied");
                ctx.asm.set_rows(rows);
            }
            Decided::Known => {}
            Decided::Unknown => tracing::warn!(
                xid = %xid,
                position = %ctx.at(placed),
                "XA COMMIT of a transaction whose XA PREPARE binval did not read (it lies before where binval started reading: source.start, or replay --from): if it changed mapped tables, those changes are not applied; replay from a position before its XA PREPARE"
            ),
        }
    } else {
        ctx.xa.rollback(&xid);
    }
    Ok(ctx.commit(placed))
}

/// MySQL GTID (or ANONYMOUS_GTID): a transaction starts; its `BEGIN` follows.
fn on_mysql_gtid(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, g: &GtidEvent) -> Option<Transaction> {
    ctx.group_begins(placed);
    let gtid = crate::binlog::gtid::gtid_text(g);
    ctx.asm.boundary(Boundary::Begin { gtid, standalone: true });
    // MySQL 8.0.1+: when the transaction committed on the original primary, then on this
    // server, Unix µs (0 when the writer did not record it).
    let us = if g.original_commit_timestamp() > 0 { g.original_commit_timestamp() } else { g.immediate_commit_timestamp() };
    if us > 0 {
        ctx.asm.commit_timestamp(us);
    }
    None
}

/// MariaDB GTID: an event group starts; with `FL_STANDALONE` it is one statement.
fn on_mariadb_gtid(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, g: MariadbGtidEvent) -> Option<Transaction> {
    ctx.group_begins(placed);
    ctx.asm.boundary(Boundary::Begin { gtid: Some(g.gtid.to_string()), standalone: g.standalone() });
    None
}

/// QUERY: a transaction boundary (BEGIN, COMMIT, ROLLBACK, XA), or a statement (DDL).
fn on_query(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, q: &QueryEvent<'_>) -> Result<Option<Transaction>, Error> {
    let text = q.query();
    let t = text.trim();
    let upper: String = t.chars().take(12).collect::<String>().to_ascii_uppercase();
    if t.starts_with("# Dummy event replacing event type") {
        // MariaDB replaces events a replica declared it cannot handle (by
        // @mariadb_slave_capability) with this comment: the real event is lost.
        return Err(DefiniteError::UnsupportedEvent(format!(
            "at {}: the source sent a placeholder instead of an event ({t}); binval never accepts it in place of row events",
            ctx.at(placed)
        ))
        .into());
    }
    Ok(if upper.starts_with("XA START") || upper.starts_with("XA END") || upper.starts_with("XA BEGIN") {
        None
    } else if upper.starts_with("XA COMMIT") && t.to_ascii_uppercase().ends_with("ONE PHASE") {
        // One phase: an ordinary commit of the group it ends.
        if ctx.asm.in_transaction() {
            ctx.commit(placed)
        } else {
            None
        }
    } else if upper.starts_with("XA COMMIT") {
        on_xa_decision(ctx, placed, t, true)?
    } else if upper.starts_with("XA ROLLBACK") {
        on_xa_decision(ctx, placed, t, false)?
    } else if t.eq_ignore_ascii_case("BEGIN") {
        if !ctx.asm.in_transaction() {
            ctx.group_begins(placed);
        }
        ctx.asm.boundary(Boundary::Begin { gtid: None, standalone: false })
    } else if t.eq_ignore_ascii_case("COMMIT") {
        ctx.commit(placed)
    } else if t.eq_ignore_ascii_case("ROLLBACK") {
        ctx.asm.boundary(Boundary::Rollback)
    } else {
        on_statement(ctx, placed, t, &q.schema())?
    })
}

/// A statement outside the transaction boundaries: table DDL on mapped tables invalidates
/// their keys (TRUNCATE, DROP, column changes...) or moves their rules (RENAME), or both (an
/// ALTER that renames and changes columns: the rename first, then the keys of the mapping
/// under its new name).
fn on_statement(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, t: &str, schema: &str) -> Result<Option<Transaction>, Error> {
    let mut invalidate_tables = Vec::new();
    let mut renamed = false;
    ctx.json_refresh.extend(crate::binlog::ddl::tables_named(t, schema));
    if let Some(ddl) = crate::binlog::ddl::classify(t, schema) {
        if ddl.invalidates() {
            for table in &ddl.tables {
                if let Some(configured) = ctx.state.names.resolve(ctx.mapper, table) {
                    invalidate_tables.push(configured);
                }
            }
        } else {
            let before = ctx.state.names.clone();
            invalidate_tables = follow_renames(ctx, placed, &ddl, t)?;
            renamed = ctx.state.names != before;
        }
        if let Some(clause) = &ddl.column_change {
            // The altered table is the first named; after a rename it is the last.
            let now = ddl.tables.last().expect("an ALTER names its table");
            if let Some(configured) = ctx.state.names.resolve(ctx.mapper, now) {
                tracing::info!(
                    mapping = %configured,
                    table = %now,
                    clause = %clause,
                    position = %ctx.at(placed),
                    "ALTER TABLE of a mapped table may have changed every row's payload without row events (a column change, or a clause binval cannot prove harmless): every key of the mapping is marked stale, as for TRUNCATE"
                );
                if !invalidate_tables.contains(&configured) {
                    invalidate_tables.push(configured);
                }
            }
        }
    }
    let end = ctx.end(placed);
    let b = ctx.asm.boundary(Boundary::Statement { end, timestamp_s: placed.timestamp(), invalidate_tables });
    Ok(b.map(|mut txn| {
        if renamed {
            txn.table_names = Some(Arc::new(ctx.state.names.clone()));
        }
        txn
    }))
}

/// RENAME: tables come in (from, to) pairs, judged as one statement
/// ([`TableNames::rename_statement`]): a mapping follows its table to its new name, or stays
/// with its name when the name gets another table (an online schema change cut-over); returns
/// the configured names whose keys are stale. A mapping whose table would move onto the name of
/// another mapping is a definite error ([`DefiniteError::RenameConflict`]).
fn follow_renames(ctx: &mut ReadContext<'_>, placed: BinlogEventHeader, ddl: &TableDdl, t: &str) -> Result<Vec<String>, Error> {
    let pairs: Vec<(String, String)> = ddl.tables.chunks(2).filter_map(|p| p.get(1).map(|to| (p[0].clone(), to.clone()))).collect();
    match ctx.state.names.rename_statement(ctx.mapper, &pairs) {
        Ok(out) => {
            for (mapping, from, to) in &out.followed {
                tracing::info!(mapping = %mapping, from = %from, to = %to, position = %ctx.at(placed), "mapped table renamed: its mapping follows the new name");
            }
            for mapping in &out.stale {
                tracing::info!(mapping = %mapping, position = %ctx.at(placed), "another table took a mapped table's name (online schema change cut-over, or a swap): the mapping stays with the name; its keys are marked stale");
            }
            Ok(out.stale)
        }
        Err(c) => Err(DefiniteError::RenameConflict {
            kind: ddl.kind,
            position: ctx.at(placed),
            conflict: Box::new(c),
            statement: t.chars().take(500).collect(),
        }
        .into()),
    }
}

/// True when the last 4 bytes of the event body are the CRC32 of the event before them
/// (header included), as MySQL/MariaDB compute event checksums.
fn ends_with_own_crc32(ev: &Event) -> bool {
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
