//! Where a start position an operator gave (`source.start = "FILE:POS"`, `binval replay --from
//! FILE:POS`) lies in the binlog, checked before anything is read from it.
//!
//! A replica connection opened in the middle of an event group (at a TABLE_MAP, a row event,
//! the XID...) sees the rest of that transaction but not its start: the row events before the
//! position, and the GTID event that orders it, are behind it. Read from there, that
//! transaction's earlier rows would be lost without a word. So:
//!
//! * a position where an event group begins (or between two groups, or at the end of the file)
//!   is used as it is;
//! * a position inside an event group is moved back to the group's first event (its GTID
//!   event, or its `BEGIN`), with a warning naming both positions: the whole transaction is
//!   applied (fenced writes make that safe even where some of it was applied before);
//! * a position inside an event, or beyond the end of the file, is refused
//!   ([`DefiniteError::StartPosition`]) naming the events around it.
//!
//! The check reads the file over its own replica connection: first only the event at the
//! position (a GTID event there starts a group: nothing more to read), else the file from its
//! start up to the position, through the same event handlers the reader uses
//! (`binlog::events`), so "inside a group" means exactly what it means to the reader.
//! Checkpoints are never checked: binval saves only positions between transactions.

use binval_protocol::{BinlogPosition, SourcePosition};
use futures::StreamExt;
use mysql_async::BinlogStreamRequest;

use crate::binlog::events::{self, ReadContext};
use crate::binlog::framing::MARIADB_GTID_EVENT;
use crate::binlog::reader::{ReadSettings, ReadState};
use crate::binlog::resume::{Resume, SourceStats};
use crate::binlog::server::connect;
use crate::binlog::xa::PreparedXas;
use crate::config::SourceConfig;
use crate::error::{classify_mysql, DefiniteError, Error};
use crate::mapping::Mapper;

/// MySQL GTID_LOG_EVENT and ANONYMOUS_GTID_LOG_EVENT: each starts an event group.
const MYSQL_GTID_EVENTS: [u8; 2] = [33, 34];
/// FORMAT_DESCRIPTION_EVENT: sent first on every replica connection (not at its position).
const FORMAT_DESCRIPTION_EVENT: u8 = 15;

/// The position to start reading at for the operator's `position` (from `origin`:
/// `source.start`, `--from`): `position` itself, or the first event of the event group it lies
/// in (a warning says so). Uses `cfg.server_id` for its replica connection.
///
/// Errors: [`DefiniteError::StartPosition`] for a position inside an event or past the end of
/// its file; a file the server does not have as the server reports it (see
/// [`classify_mysql`]); connection failures (transient).
pub async fn group_start(cfg: &SourceConfig, position: &BinlogPosition, origin: &str) -> Result<BinlogPosition, Error> {
    if position.pos <= 4 || starts_a_group(cfg, position).await {
        return Ok(position.clone());
    }
    let start = scan(cfg, position, origin).await?;
    if start.pos != position.pos {
        tracing::warn!(
            origin,
            position = %position,
            transaction_start = %start,
            "the start position is inside a transaction: starting at the transaction's first event, so none of its rows are lost"
        );
    }
    Ok(start)
}

/// Where the transaction whose last event ends at `end` begins (its GTID event, or `BEGIN`):
/// a position to re-read that transaction from, when only its end is known (an invalidation
/// event's position, [`crate::ha::topic_marks`]). Reads `end.file` from its start to `end`
/// over its own replica connection (`cfg.server_id`), through the reader's event handlers.
///
/// Errors: [`DefiniteError::StartPosition`] (naming `origin`) when no event of the file ends
/// at `end` (another server's position, or the file was rewritten); a file the server does
/// not have (see [`classify_mysql`]); connection failures (transient).
pub async fn transaction_start(cfg: &SourceConfig, end: &BinlogPosition, origin: &str) -> Result<BinlogPosition, Error> {
    let refuse = |message: String| -> Error {
        DefiniteError::StartPosition { origin: origin.to_string(), position: end.to_string(), message }.into()
    };
    let at = end.to_string();
    let mut stream = open_file(cfg, &end.file, &at).await?;
    let mut scratch = Scratch::new(&end.file);
    let mut ctx = scratch.ctx();
    let result = loop {
        let ev = match stream.next().await {
            None => break Err(refuse("no event of the file ends there (the binlog ends before it)".into())),
            Some(Err(e)) => break Err(classify_mysql(e, &at)),
            Some(Ok(ev)) => ev,
        };
        let h = ev.header();
        if h.log_pos() != 0 && h.event_type_raw() != FORMAT_DESCRIPTION_EVENT {
            let (begins, ends) = ((h.log_pos() as u64).saturating_sub(h.event_size() as u64), h.log_pos() as u64);
            if ends == end.pos {
                // The transaction's last event: its group began at the last group start seen
                // (an event of its own when none came before it).
                let start = ctx.group_start.as_ref().map(|s| s.pos).filter(|&s| s <= begins).unwrap_or(begins);
                break Ok(BinlogPosition::new(end.file.clone(), start));
            }
            if begins >= end.pos {
                break Err(refuse(format!("no event of the file ends there: the event at {begins} ends at {ends}")));
            }
        }
        feed(&mut ctx, ev);
    };
    drop(ctx);
    let _ = stream.close().await;
    result
}

/// A replica connection reading `file` from its start, without blocking at its end; `at`
/// names the position the caller looks for in errors.
async fn open_file(cfg: &SourceConfig, file: &str, at: &str) -> Result<mysql_async::BinlogStream, Error> {
    let conn = connect(cfg).await?;
    let name = file.as_bytes().to_vec();
    let req = BinlogStreamRequest::new(cfg.server_id).with_filename(&name).with_pos(4).with_non_blocking();
    conn.get_binlog_stream(req).await.map_err(|e| classify_mysql(e, at))
}

/// What the reader's event handlers need to follow a file's event groups with no table
/// mapped: the state of a read that began at the file's start.
struct Scratch {
    mapper: Mapper,
    state: ReadState,
    xa: PreparedXas,
    stats: SourceStats,
    resume: Resume,
}

impl Scratch {
    fn new(file: &str) -> Self {
        Scratch {
            mapper: Mapper::default(),
            state: ReadState::default(),
            xa: PreparedXas::default(),
            stats: SourceStats::default(),
            resume: Resume::FilePos(SourcePosition { file: file.to_string(), pos: 4, gtid: None }),
        }
    }

    fn ctx(&mut self) -> ReadContext<'_> {
        ReadContext::new(&self.mapper, &mut self.state, &mut self.xa, &self.stats, false, &self.resume, ReadSettings::default())
    }
}

/// Hand one event to the reader's handlers. Errors of events before the position looked for
/// (an INCIDENT, say) are the reader's to report when it gets there; here only the group
/// boundaries matter.
fn feed(ctx: &mut ReadContext<'_>, ev: mysql_common::binlog::events::Event) {
    ctx.framer.push(ev);
    while let Some(framed) = ctx.framer.next() {
        if let Ok(framed) = framed {
            let _ = events::handle(ctx, &framed);
        }
    }
}

/// True when the event at `position` is a GTID event (it begins an event group). Any failure
/// (an impossible position the server refuses, a connection error) is `false`: the full scan
/// then says what is wrong.
async fn starts_a_group(cfg: &SourceConfig, position: &BinlogPosition) -> bool {
    let Ok(conn) = connect(cfg).await else { return false };
    let name = position.file.clone().into_bytes();
    let req = BinlogStreamRequest::new(cfg.server_id).with_filename(&name).with_pos(position.pos).with_non_blocking();
    let Ok(mut stream) = conn.get_binlog_stream(req).await else { return false };
    let mut found = false;
    while let Some(Ok(ev)) = stream.next().await {
        let h = ev.header();
        // The fake ROTATE, the FORMAT_DESCRIPTION and other announcements come first.
        if h.log_pos() == 0 || h.event_type_raw() == FORMAT_DESCRIPTION_EVENT {
            continue;
        }
        let begins = (h.log_pos() as u64).saturating_sub(h.event_size() as u64);
        let ty = h.event_type_raw();
        found = begins == position.pos && (ty == MARIADB_GTID_EVENT || MYSQL_GTID_EVENTS.contains(&ty));
        break;
    }
    let _ = stream.close().await;
    found
}

/// Read `position.file` from its start to `position`, handling every event as the reader
/// does (with no table mapped), and return where the event group around `position` begins
/// (`position` itself when it lies between groups).
async fn scan(cfg: &SourceConfig, position: &BinlogPosition, origin: &str) -> Result<BinlogPosition, Error> {
    let refuse = |message: String| -> Error {
        DefiniteError::StartPosition { origin: origin.to_string(), position: position.to_string(), message }.into()
    };
    let at = position.to_string();
    let mut stream = open_file(cfg, &position.file, &at).await?;
    let mut scratch = Scratch::new(&position.file);
    let mut ctx = scratch.ctx();
    let mut end = 4u64;
    let result = loop {
        let ev = match stream.next().await {
            None => break None,
            Some(Err(e)) => break Some(Err(classify_mysql(e, &at))),
            Some(Ok(ev)) => ev,
        };
        let h = ev.header();
        let mut last_of_file = false;
        if h.log_pos() != 0 {
            let (begins, ends) = ((h.log_pos() as u64).saturating_sub(h.event_size() as u64), h.log_pos() as u64);
            if begins == position.pos {
                break Some(Ok(if ctx.in_group() { ctx.group_start.clone().map(|s| s.pos) } else { None }));
            }
            if begins < position.pos && position.pos < ends {
                break Some(Err(refuse(format!(
                    "it is not an event boundary: the event at {begins} ends at {ends}; start at one of those"
                ))));
            }
            if begins > position.pos {
                break Some(Err(refuse(format!("it is not an event boundary: the next event begins at {begins}"))));
            }
            end = ends;
            // A real ROTATE is the last event of its file.
            last_of_file = h.event_type_raw() == mysql_common::binlog::consts::EventType::ROTATE_EVENT as u8;
        }
        feed(&mut ctx, ev);
        if last_of_file {
            break None;
        }
    };
    drop(ctx);
    let _ = stream.close().await;
    match result {
        Some(Ok(None)) => Ok(position.clone()),
        Some(Ok(Some(start))) => Ok(BinlogPosition::new(position.file.clone(), start)),
        Some(Err(e)) => Err(e),
        None if position.pos == end => Ok(position.clone()),
        None => Err(refuse(format!("it is beyond the end of the file (its last event ends at {end})"))),
    }
}
