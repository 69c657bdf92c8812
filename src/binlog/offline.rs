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

use std::collections::HashMap;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use mysql_common::binlog::consts::{BinlogVersion, EventType};
use mysql_common::binlog::events::{Event, EventData};
use mysql_common::binlog::EventStreamReader;
use serde_json::{json, Value as Json};

use crate::binlog::decode::{decode_rows, RowKind, TableSchema};

/// Binlog file magic: `\xfe` `bin`.
const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
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

/// Read `path` from `start` (an event boundary; default 4, the first event) to `stop`
/// (exclusive; default end of file), calling `emit` with one JSON object per event and per
/// row. Returns counts, or the first error with file and position.
pub fn read_file(path: &Path, start: Option<u64>, stop: Option<u64>, mut emit: impl FnMut(Json)) -> Result<Summary, OfflineError> {
    let file = path.display().to_string();
    let io = |e: std::io::Error| OfflineError::Io { file: file.clone(), source: e };
    let mut f = BufReader::new(std::fs::File::open(path).map_err(io)?);
    let len = f.get_ref().metadata().map_err(io)?.len();
    let mut magic = [0u8; 4];
    if f.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(OfflineError::NotABinlog { file });
    }
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    let mut tables: HashMap<u64, Arc<TableSchema>> = HashMap::new();
    let mut sum = Summary::default();
    let mut pos: u64 = 4;
    let start = start.unwrap_or(4);
    let stop = stop.unwrap_or(u64::MAX);
    // The FORMAT_DESCRIPTION at 4 is always read, so a later start knows checksums and sizes.
    let mut skipping = start > 4;
    loop {
        if pos >= stop {
            break;
        }
        if pos >= len {
            break;
        }
        if len - pos < HEADER_LEN as u64 {
            return Err(OfflineError::Truncated {
                file,
                pos,
                detail: format!("{} bytes left, an event header needs {HEADER_LEN}", len - pos),
            });
        }
        let mut buf = vec![0u8; HEADER_LEN];
        f.read_exact(&mut buf).map_err(io)?;
        let size = u32::from_le_bytes(buf[9..13].try_into().unwrap()) as u64;
        if size < HEADER_LEN as u64 {
            return Err(OfflineError::Corrupt { file, pos, detail: format!("event length {size} is shorter than its header") });
        }
        if pos + size > len {
            return Err(OfflineError::Truncated {
                file,
                pos,
                detail: format!("event of {size} bytes, only {} left in the file", len - pos),
            });
        }
        buf.resize(size as usize, 0);
        f.read_exact(&mut buf[HEADER_LEN..]).map_err(io)?;
        let ev = esr.read(&buf[..]).map_err(|e| OfflineError::Corrupt { file: file.clone(), pos, detail: e.to_string() })?;
        let Some(ev) = ev else { break };
        verify_checksum(&ev).map_err(|detail| OfflineError::Corrupt { file: file.clone(), pos, detail })?;
        let here = pos;
        pos += size;
        if skipping {
            // The FORMAT_DESCRIPTION at 4 has been read; jump to the requested start.
            skipping = false;
            f.seek(SeekFrom::Start(start)).map_err(io)?;
            pos = start;
            continue;
        }
        handle(&file, here, &ev, &mut esr, &mut tables, &mut sum, &mut emit)?;
    }
    sum.end_pos = pos;
    Ok(sum)
}

/// Check an event's CRC32 checksum, when the file's FORMAT_DESCRIPTION announces them
/// (`binlog_checksum=CRC32`). mysql_common strips checksums without checking them.
fn verify_checksum(ev: &Event) -> Result<(), String> {
    use mysql_common::binlog::consts::BinlogChecksumAlg;
    let footer = ev.footer();
    if !footer.get_checksum_enabled() || footer.get_checksum_alg() != Ok(Some(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32)) {
        return Ok(());
    }
    let Some(stored) = ev.checksum() else { return Ok(()) };
    let stored = u32::from_le_bytes(stored);
    let computed = ev.calc_checksum(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32);
    if stored != computed {
        return Err(format!("CRC32 checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"));
    }
    Ok(())
}

fn event_name(raw: u8) -> String {
    match EventType::try_from(raw) {
        Ok(t) => format!("{t:?}"),
        Err(_) => match raw {
            160 => "MARIADB_ANNOTATE_ROWS".into(),
            161 => "MARIADB_BINLOG_CHECKPOINT".into(),
            162 => "MARIADB_GTID".into(),
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

fn handle(
    file: &str,
    pos: u64,
    ev: &Event,
    esr: &mut EventStreamReader,
    tables: &mut HashMap<u64, Arc<TableSchema>>,
    sum: &mut Summary,
    emit: &mut impl FnMut(Json),
) -> Result<(), OfflineError> {
    handle_named(file, pos, ev, None, esr, tables, sum, emit)
}

/// [`handle`], with `shown_type`: the event type to report (a MariaDB compressed event is
/// decoded as the plain event it wraps, and reported under its own type).
#[allow(clippy::too_many_arguments)]
fn handle_named(
    file: &str,
    pos: u64,
    ev: &Event,
    shown_type: Option<u8>,
    esr: &mut EventStreamReader,
    tables: &mut HashMap<u64, Arc<TableSchema>>,
    sum: &mut Summary,
    emit: &mut impl FnMut(Json),
) -> Result<(), OfflineError> {
    let corrupt = |detail: String| OfflineError::Corrupt { file: file.into(), pos, detail };
    sum.events += 1;
    let h = ev.header();
    let raw = h.event_type_raw();
    let mut line = json!({"pos": pos, "event": event_name(shown_type.unwrap_or(raw)), "server_id": h.server_id(), "timestamp": h.timestamp(), "next_pos": h.log_pos()});
    if crate::binlog::decode::mariadb_compressed_plain_type(raw).is_some() {
        // MariaDB log_bin_compress=ON: decode the plain event it wraps, reported under the
        // compressed event's name and position.
        let plain =
            crate::binlog::decode::uncompress_mariadb_event(ev).map_err(|e| OfflineError::Decode { file: file.into(), pos, source: e })?;
        sum.events -= 1;
        return handle_named(file, pos, &plain, Some(raw), esr, tables, sum, emit);
    }
    if raw == 162 {
        let d = ev.data();
        if d.len() >= 13 {
            let seq = u64::from_le_bytes(d[0..8].try_into().unwrap());
            let domain = u32::from_le_bytes(d[8..12].try_into().unwrap());
            line["gtid"] = json!(format!("{domain}-{}-{seq}", h.server_id()));
        }
        emit(line);
        return Ok(());
    }
    let data = ev.read_data().map_err(|e| corrupt(e.to_string()))?;
    if data.is_none() && !crate::binlog::decode::skippable_unknown_event(raw, h.flags_raw()) {
        return Err(corrupt(format!("unknown event type {raw}, not marked ignorable: binval does not pass over events it cannot read")));
    }
    match data {
        Some(EventData::TableMapEvent(tme)) => {
            line["table"] = json!(format!("{}.{}", tme.database_name(), tme.table_name()));
            line["table_id"] = json!(tme.table_id());
            let id = tme.table_id();
            // An identical TABLE_MAP (one precedes every statement's rows) keeps its schema.
            if !tables.get(&id).is_some_and(|t| t.same_table_map(&tme)) {
                let mariadb = esr.get_fde().server_version().to_ascii_lowercase().contains("mariadb");
                let schema = TableSchema::from_table_map_positional(tme.into_owned(), mariadb).map_err(|e| OfflineError::Decode {
                    file: file.into(),
                    pos,
                    source: e,
                })?;
                tables.insert(id, Arc::new(schema));
            }
            emit(line);
        }
        Some(EventData::RowsEvent(rows)) => {
            sum.row_events += 1;
            let t = tables.get(&rows.table_id()).cloned().ok_or_else(|| OfflineError::Decode {
                file: file.into(),
                pos,
                source: crate::binlog::decode::DecodeError::NoTableMap { table_id: rows.table_id() },
            })?;
            let mut out = Vec::new();
            decode_rows(&t, &rows, &mut out).map_err(|e| OfflineError::Decode { file: file.into(), pos, source: e })?;
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
        }
        Some(EventData::TransactionPayloadEvent(_)) => {
            emit(line);
            // Decode every inner event (reported at the payload's position) only once the
            // whole payload has been read: a damaged payload emits none of its rows.
            let inner = crate::binlog::decode::transaction_payload_events(ev).map_err(|e| corrupt(e.to_string()))?;
            for e in &inner {
                handle(file, pos, e, esr, tables, sum, emit)?;
            }
        }
        Some(EventData::QueryEvent(q)) => {
            line["query"] = json!(q.query());
            emit(line);
        }
        Some(EventData::RotateEvent(r)) => {
            line["next_file"] = json!(r.name());
            emit(line);
        }
        Some(EventData::XidEvent(x)) => {
            line["xid"] = json!(x.xid);
            emit(line);
        }
        Some(EventData::IncidentEvent(i)) => {
            // Reported, not fatal, in a file read (the live source stops on it).
            line["incident"] = json!(format!("{:?}", i.incident_type()));
            line["message"] = json!(i.message());
            emit(line);
        }
        Some(EventData::GtidEvent(g)) => {
            line["gno"] = json!(g.gno());
            emit(line);
        }
        _ => emit(line),
    }
    Ok(())
}
