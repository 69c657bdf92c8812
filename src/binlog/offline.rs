//! Offline reader: decodes a binlog *file* (MySQL 5.x-8.x, MariaDB) into JSON lines with the
//! same canonical values as the live pipeline — for operators (`binval decode`) and tests.
//!
//! Every file is read from its first event to its last, or the reader stops with an
//! [`OfflineError`] that names the file, the byte position of the event, and why: a file that
//! is not a binlog, a truncated event, a corrupt event (bad checksum, bad length), or a row
//! that cannot be decoded. A row event is never skipped: a row event whose table has no
//! preceding TABLE_MAP is an error too. MySQL 8 TRANSACTION_PAYLOAD events (zstd) are unwrapped
//! and their inner events decoded in place; a payload that cannot be read stops the reader.
//! MariaDB compressed events (`log_bin_compress=ON`: QUERY_COMPRESSED, the compressed row
//! events) are decompressed and decoded as the plain events they wrap, keeping their own event
//! name in the output; one that cannot be decompressed stops the reader.
//!
//! The rules for those events, for MariaDB GTID events, for unknown event types and for
//! repeated TABLE_MAPs are the live reader's ([`crate::binlog::framing`]); what is the offline
//! reader's own is reading the file (event lengths, CRC32 checksums) and the JSON lines.

use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek};
use std::path::Path;

use mysql_common::binlog::consts::{BinlogVersion, EventType};
use mysql_common::binlog::events::{Event, EventData, RowsEventData};
use mysql_common::binlog::EventStreamReader;
use serde_json::{json, Value as Json};

use crate::binlog::decode::{decode_rows, RowKind, TableSchema};
use crate::binlog::framing::{Body, Framed, Framer, FramingError, FramingErrorKind, TableMaps, MARIADB_GTID_EVENT};

/// Binlog file magic: `\xfe` `bin`.
pub(crate) const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
/// Size of a v4 event header, bytes.
const HEADER_LEN: usize = 19;

/// Why a file could not be read to its end.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// Open or read failure.
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the binlog magic.
    #[error("{file}: not a binlog file (no \\xfebin magic)")]
    NotABinlog { file: String },
    /// The file ends inside an event.
    #[error("{file}: truncated event at position {pos}: {detail}")]
    Truncated { file: String, pos: u64, detail: String },
    /// An event could not be parsed (bad checksum, impossible length, bad body).
    #[error("{file}: corrupt event at position {pos}: {detail}")]
    Corrupt { file: String, pos: u64, detail: String },
    /// A start position that is not where an event begins (`decode --start` in the middle of
    /// an event): the event at `before` runs to `after`.
    #[error("{file}: position {pos} is not an event boundary (the event at {before} ends at {after}): start at {before} or {after}")]
    NotABoundary { file: String, pos: u64, before: u64, after: u64 },
    /// A start position past the end of the file (`len` bytes).
    #[error("{file}: position {pos} is beyond the end of the file ({len} bytes)")]
    BeyondEnd { file: String, pos: u64, len: u64 },
    /// A row could not be decoded exactly.
    #[error("{file}: at position {pos}: {source}")]
    Decode {
        file: String,
        pos: u64,
        #[source]
        source: crate::binlog::decode::DecodeError,
    },
}

/// What was read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Events read (inner events of TRANSACTION_PAYLOAD included).
    pub events: u64,
    /// Row events read.
    pub row_events: u64,
    /// Rows decoded.
    pub rows: u64,
    /// Byte position after the last event read.
    pub end_pos: u64,
}

/// What [`read_file_with`] reads and shows.
#[derive(Debug, Clone, Default)]
pub struct DecodeOptions {
    /// First event position (an event boundary); default 4, the first event.
    pub start: Option<u64>,
    /// Stop before this position (exclusive); default the end of the file.
    pub stop: Option<u64>,
    /// Show columns the server keeps for itself (MariaDB's long-UNIQUE hash columns
    /// `DB_ROW_HASH_<n>`, see `decode::ColumnSchema::hidden`), left out by default as in the
    /// live pipeline's payloads.
    pub hidden_columns: bool,
}

/// Read `path` from `start` (an event boundary; default 4, the first event) to `stop`
/// (exclusive; default end of file), calling `emit` with one JSON object per event and per
/// row. Returns counts, or the first error with file and position.
pub fn read_file(path: &Path, start: Option<u64>, stop: Option<u64>, emit: impl FnMut(Json)) -> Result<Summary, OfflineError> {
    read_file_with(path, &DecodeOptions { start, stop, ..DecodeOptions::default() }, emit)
}

/// [`read_file`] with every option.
///
/// Errors: as [`read_file`]; a start inside an event ([`OfflineError::NotABoundary`]) or past
/// the end ([`OfflineError::BeyondEnd`]).
pub fn read_file_with(path: &Path, opts: &DecodeOptions, emit: impl FnMut(Json)) -> Result<Summary, OfflineError> {
    let file = path.display().to_string();
    let io = |e: std::io::Error| OfflineError::Io { file: file.clone(), source: e };
    let f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    read_from(BufReader::new(f), len, file, opts, emit)
}

/// [`read_file_with`] over a binlog file's bytes in memory; `name` stands for the file in
/// errors (fuzzing, tests). Errors as [`read_file_with`]'s, with `name` and the position.
pub fn read_bytes(name: &str, bytes: &[u8], opts: &DecodeOptions, emit: impl FnMut(Json)) -> Result<Summary, OfflineError> {
    read_from(Cursor::new(bytes), bytes.len() as u64, name.to_string(), opts, emit)
}

/// Read the binlog `f` (`len` bytes, named `file` in errors) as [`read_file_with`] does.
fn read_from<R: Read + Seek>(
    mut f: R,
    len: u64,
    file: String,
    opts: &DecodeOptions,
    mut emit: impl FnMut(Json),
) -> Result<Summary, OfflineError> {
    let mut magic = [0u8; 4];
    if f.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(OfflineError::NotABinlog { file });
    }
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut framer = Framer::new();
    let mut tables = TableMaps::new();
    let mut sum = Summary::default();
    let mut pos: u64 = 4;
    let start = opts.start.unwrap_or(4);
    let stop = opts.stop.unwrap_or(u64::MAX);
    // The FORMAT_DESCRIPTION at 4 is always read, so a later start knows checksums and sizes.
    let mut skipping = start > 4;
    while pos < stop && pos < len {
        let Some((ev, size)) = read_event(&mut f, &mut esr, &file, pos, len)? else { break };
        let here = pos;
        pos += size;
        if skipping {
            // The FORMAT_DESCRIPTION at 4 has been read; go to the requested start, from event
            // header to event header, so a start inside an event is named as such.
            skipping = false;
            skip_to_boundary(&mut f, &file, pos, start, len)?;
            pos = start;
            continue;
        }
        framer.push(ev);
        for framed in framer.by_ref() {
            let framed = framed.map_err(|e| framing_error(&file, here, e))?;
            handle(&file, here, &framed, &esr, opts, &mut tables, &mut sum, &mut emit)?;
        }
    }
    sum.end_pos = pos;
    Ok(sum)
}

/// Walk the event headers from `pos` (just after the FORMAT_DESCRIPTION) to `start`: errors
/// when `start` lies inside an event or past the end of the file (`len` bytes). Leaves `f` at
/// `start`.
fn skip_to_boundary(f: &mut (impl Read + Seek), file: &str, mut pos: u64, start: u64, len: u64) -> Result<(), OfflineError> {
    let io = |e: std::io::Error| OfflineError::Io { file: file.to_string(), source: e };
    if start > len {
        return Err(OfflineError::BeyondEnd { file: file.to_string(), pos: start, len });
    }
    let mut header = [0u8; HEADER_LEN];
    while pos < start {
        if len - pos < HEADER_LEN as u64 {
            return Err(OfflineError::Truncated {
                file: file.to_string(),
                pos,
                detail: format!("{} bytes left, an event header needs {HEADER_LEN}", len - pos),
            });
        }
        f.read_exact(&mut header).map_err(io)?;
        let size = u32::from_le_bytes(header[9..13].try_into().expect("4 bytes")) as u64;
        if size < HEADER_LEN as u64 {
            return Err(OfflineError::Corrupt {
                file: file.to_string(),
                pos,
                detail: format!("event length {size} is shorter than its header"),
            });
        }
        if pos + size > start {
            return Err(OfflineError::NotABoundary { file: file.to_string(), pos: start, before: pos, after: pos + size });
        }
        f.seek_relative((size - HEADER_LEN as u64) as i64).map_err(io)?;
        pos += size;
    }
    Ok(())
}

/// Read the event at `pos` (`len`: the file's length): its header, then the rest of its
/// length, parsed and its checksum checked. Returns the event and its size, or `None` when
/// mysql_common reads no event there.
fn read_event(
    f: &mut impl Read,
    esr: &mut EventStreamReader,
    file: &str,
    pos: u64,
    len: u64,
) -> Result<Option<(Event, u64)>, OfflineError> {
    let file = file.to_string();
    if len - pos < HEADER_LEN as u64 {
        return Err(OfflineError::Truncated { file, pos, detail: format!("{} bytes left, an event header needs {HEADER_LEN}", len - pos) });
    }
    let io = |e: std::io::Error| OfflineError::Io { file: file.clone(), source: e };
    let mut buf = vec![0u8; HEADER_LEN];
    f.read_exact(&mut buf).map_err(io)?;
    let size = u32::from_le_bytes(buf[9..13].try_into().unwrap()) as u64;
    if size < HEADER_LEN as u64 {
        return Err(OfflineError::Corrupt { file, pos, detail: format!("event length {size} is shorter than its header") });
    }
    if pos + size > len {
        return Err(OfflineError::Truncated { file, pos, detail: format!("event of {size} bytes, only {} left in the file", len - pos) });
    }
    buf.resize(size as usize, 0);
    f.read_exact(&mut buf[HEADER_LEN..]).map_err(io)?;
    crate::binlog::framing::check_event_bytes(esr.get_fde(), &buf).map_err(|e| OfflineError::Corrupt {
        file: file.clone(),
        pos,
        detail: e.to_string(),
    })?;
    let ev = esr.read(&buf[..]).map_err(|e| OfflineError::Corrupt { file: file.clone(), pos, detail: e.to_string() })?;
    let Some(ev) = ev else { return Ok(None) };
    verify_checksum(&ev).map_err(|e| OfflineError::Corrupt { file: file.clone(), pos, detail: e.to_string() })?;
    Ok(Some((ev, size)))
}

/// An event whose stored CRC32 differs from the one computed over its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("CRC32 checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
struct ChecksumMismatch {
    stored: u32,
    computed: u32,
}

/// Check an event's CRC32 checksum, when the file's FORMAT_DESCRIPTION announces them
/// (`binlog_checksum=CRC32`). mysql_common strips checksums without checking them.
fn verify_checksum(ev: &Event) -> Result<(), ChecksumMismatch> {
    use mysql_common::binlog::consts::BinlogChecksumAlg;
    let footer = ev.footer();
    if !footer.get_checksum_enabled() || footer.get_checksum_alg() != Ok(Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32)) {
        return Ok(());
    }
    let Some(stored) = ev.checksum() else { return Ok(()) };
    let stored = u32::from_le_bytes(stored);
    let computed = ev.calc_checksum(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32);
    if stored != computed {
        return Err(ChecksumMismatch { stored, computed });
    }
    Ok(())
}

/// A framing error of the event at `pos` as the offline reader reports it: a MariaDB
/// compressed event that cannot be decompressed is a decode error; a payload that cannot be
/// read, an unreadable event and an unknown event type are corrupt events.
fn framing_error(file: &str, pos: u64, e: FramingError) -> OfflineError {
    let corrupt = |detail: String| OfflineError::Corrupt { file: file.into(), pos, detail };
    match *e.kind {
        FramingErrorKind::Compressed(source) => OfflineError::Decode { file: file.into(), pos, source },
        FramingErrorKind::Payload(e) => corrupt(e.to_string()),
        FramingErrorKind::Unreadable(e) => corrupt(e.to_string()),
        FramingErrorKind::Unknown => corrupt(format!(
            "unknown event type {}, not marked ignorable: binval does not pass over events it cannot read",
            e.header.event_type_raw()
        )),
        // Never an error here: a short MariaDB GTID event is reported without its GTID.
        FramingErrorKind::ShortMariadbGtid { len } => corrupt(format!("MariaDB GTID event of {len} bytes")),
    }
}

fn event_name(raw: u8) -> String {
    match EventType::try_from(raw) {
        Ok(t) => format!("{t:?}"),
        Err(_) => match raw {
            160 => "MARIADB_ANNOTATE_ROWS".into(),
            161 => "MARIADB_BINLOG_CHECKPOINT".into(),
            MARIADB_GTID_EVENT => "MARIADB_GTID".into(),
            163 => "MARIADB_GTID_LIST".into(),
            164 => "MARIADB_START_ENCRYPTION".into(),
            165 => "MARIADB_QUERY_COMPRESSED".into(),
            166 => "MARIADB_WRITE_ROWS_COMPRESSED_V1".into(),
            167 => "MARIADB_UPDATE_ROWS_COMPRESSED_V1".into(),
            168 => "MARIADB_DELETE_ROWS_COMPRESSED_V1".into(),
            169 => "MARIADB_WRITE_ROWS_COMPRESSED".into(),
            170 => "MARIADB_UPDATE_ROWS_COMPRESSED".into(),
            171 => "MARIADB_DELETE_ROWS_COMPRESSED".into(),
            _ => format!("UNKNOWN_{raw}"),
        },
    }
}

/// Handle one framed event of the file at `pos`: one JSON line for it, and one per row of a
/// row event. A MariaDB compressed event is decoded as the plain event it wraps and reported
/// under its own type; the inner events of a TRANSACTION_PAYLOAD at the payload's position.
#[allow(clippy::too_many_arguments)]
fn handle(
    file: &str,
    pos: u64,
    framed: &Framed,
    esr: &EventStreamReader,
    opts: &DecodeOptions,
    tables: &mut TableMaps,
    sum: &mut Summary,
    emit: &mut impl FnMut(Json),
) -> Result<(), OfflineError> {
    sum.events += 1;
    let h = framed.event.header();
    let mut line = json!({"pos": pos, "event": event_name(framed.stored_type), "server_id": h.server_id(), "timestamp": h.timestamp(), "next_pos": h.log_pos()});
    let data = match framed.body() {
        Ok(Body::Data(data)) => data,
        Ok(Body::MariadbGtid(g)) => {
            line["gtid"] = json!(g.gtid.to_string());
            emit(line);
            return Ok(());
        }
        Ok(Body::Skipped) => {
            emit(line);
            return Ok(());
        }
        // A short MariaDB GTID event is reported without its GTID, not refused.
        Err(e) if matches!(*e.kind, FramingErrorKind::ShortMariadbGtid { .. }) => {
            emit(line);
            return Ok(());
        }
        Err(e) => return Err(framing_error(file, pos, e)),
    };
    match data {
        EventData::TableMapEvent(tme) => {
            line["table"] = json!(format!("{}.{}", tme.database_name(), tme.table_name()));
            line["table_id"] = json!(tme.table_id());
            let prepare = |tme| {
                let mariadb = esr.get_fde().server_version().to_ascii_lowercase().contains("mariadb");
                let mut t = TableSchema::from_table_map_positional(tme, mariadb)?;
                t.keep_hidden = opts.hidden_columns;
                Ok(t)
            };
            let id = tme.table_id();
            tables.table_map(tme, None, prepare).map_err(|e| OfflineError::Decode { file: file.into(), pos, source: e })?;
            if tables.get(id).is_some_and(|t| !t.has_column_names && !t.columns.is_empty()) {
                // binlog_row_metadata=MINIMAL (or MySQL < 8.0.1): positional names, no labels.
                line["column_names"] = json!(false);
            }
        }
        EventData::RowsEvent(rows) => return on_rows(file, pos, &rows, line, tables, sum, emit),
        other => describe(&other, &mut line),
    }
    emit(line);
    Ok(())
}

/// Add what the JSON line of a QUERY, ROTATE, XID, INCIDENT, MySQL GTID (`gno`, and `gtid` as
/// `uuid[:tag]:gno` unless anonymous) or PREVIOUS_GTIDS event (`previous_gtids`, a set) shows.
fn describe(data: &EventData<'_>, line: &mut Json) {
    match data {
        EventData::QueryEvent(q) => line["query"] = json!(q.query()),
        EventData::RotateEvent(r) => line["next_file"] = json!(r.name()),
        EventData::XidEvent(x) => line["xid"] = json!(x.xid),
        EventData::IncidentEvent(i) => {
            // Reported, not fatal, in a file read (the live source stops on it).
            line["incident"] = json!(format!("{:?}", i.incident_type()));
            line["message"] = json!(i.message());
        }
        EventData::GtidEvent(g) => {
            line["gno"] = json!(g.gno());
            if let Some(gtid) = crate::binlog::gtid::gtid_text(g) {
                line["gtid"] = json!(gtid);
            }
        }
        EventData::PreviousGtidsEvent(p) => line["previous_gtids"] = json!(crate::binlog::gtid::previous_gtids(p).to_string()),
        _ => {}
    }
}

/// A row event: its line (with the table and the number of rows), then one line per row. A row
/// event whose table has no preceding TABLE_MAP is an error.
fn on_rows(
    file: &str,
    pos: u64,
    rows: &RowsEventData<'_>,
    mut line: Json,
    tables: &TableMaps,
    sum: &mut Summary,
    emit: &mut impl FnMut(Json),
) -> Result<(), OfflineError> {
    sum.row_events += 1;
    let t = tables.get(rows.table_id()).cloned().ok_or_else(|| OfflineError::Decode {
        file: file.into(),
        pos,
        source: crate::binlog::decode::DecodeError::NoTableMap { table_id: rows.table_id() },
    })?;
    let mut out = Vec::new();
    decode_rows(&t, rows, &mut out).map_err(|e| OfflineError::Decode { file: file.into(), pos, source: e })?;
    line["table"] = json!(&*t.name);
    line["rows"] = json!(out.len());
    emit(line);
    for r in out {
        sum.rows += 1;
        let kind = match r.kind {
            RowKind::Insert => "insert",
            RowKind::Update => "update",
            RowKind::Delete => "delete",
        };
        let mut row = json!({"pos": pos, "table": &*r.table, "kind": kind});
        if let Some(b) = r.before {
            row["before"] = Json::Object(b);
        }
        if let Some(a) = r.after {
            row["after"] = Json::Object(a);
        }
        emit(row);
    }
    Ok(())
}
