//! Fuzz bodies: what each cargo-fuzz target of `fuzz/` runs on one input, kept here so the
//! regression test `tests/fuzz_corpus.rs` replays the committed crash inputs and seeds on
//! stable Rust (see `fuzz/README.md`). Not an API: hidden from the docs, may change any time.
//!
//! Every body must return normally on any input: a panic, an abort or an allocation beyond
//! libFuzzer's limits is a bug of binval (a malformed binlog or config is an error value
//! naming where it is, never a crash).

use mysql_common::binlog::consts::{BinlogChecksumAlg, BinlogVersion, EventFlags, EventType};
use mysql_common::binlog::events::{BinlogEventHeader, Event, EventData, FormatDescriptionEvent};
use mysql_common::binlog::EventStreamReader;
use mysql_common::proto::MySerialize;

use crate::binlog::decode::{decode_rows, TableSchema};
use crate::binlog::events::{self, ReadContext};
use crate::binlog::framing::{Body, TableMaps};
use crate::binlog::offline::{read_bytes, DecodeOptions, OfflineError};
use crate::binlog::reader::{ReadSettings, ReadState};
use crate::binlog::resume::{Resume, SourceStats};
use crate::binlog::xa::PreparedXas;
use crate::mapping::Mapper;

/// The name a fuzzed binlog file goes by in errors.
pub const FUZZ_FILE: &str = "fuzz-bin.000001";

/// `binlog_file`: `data` as a whole binlog file through the offline reader (`binval decode`):
/// magic, event lengths, checksums, framing (MariaDB GTID and compressed events, MySQL
/// TRANSACTION_PAYLOAD), TABLE_MAPs and rows to JSON. Also read again from the second event
/// on and to a stop position, and with hidden columns shown.
///
/// Panics (the fuzz finding) when reading panics, or when an error fails to name the file and
/// the position of the event concerned.
pub fn binlog_file(data: &[u8]) {
    let whole = DecodeOptions::default();
    let check = |r: Result<crate::binlog::offline::Summary, OfflineError>| match r {
        Ok(s) => Some(s),
        Err(e) => {
            let text = e.to_string();
            assert!(text.starts_with(FUZZ_FILE), "error does not name the file: {text}");
            match e {
                OfflineError::NotABinlog { .. } | OfflineError::Io { .. } => {}
                _ => assert!(text.contains("position"), "error does not name the position: {text}"),
            }
            None
        }
    };
    let Some(sum) = check(read_bytes(FUZZ_FILE, data, &whole, |_| {})) else { return };
    // Again from the second event and up to the middle, with hidden columns: the paths of
    // `decode --start/--stop/--hidden-columns`.
    if data.len() > 4 + 19 {
        let second = 4 + u32::from_le_bytes([data[13], data[14], data[15], data[16]]) as u64;
        let opts = DecodeOptions { start: Some(second), stop: Some(sum.end_pos / 2 + 2), hidden_columns: true };
        check(read_bytes(FUZZ_FILE, data, &opts, |_| {}));
    }
}

/// `binlog_events`: `data` as the events a replica connection receives, through the live
/// reader's handlers (framing, GTIDs, transactions, XA, DDL statements) and through the row
/// decoder (every TABLE_MAP prepared, then every row event of a prepared table decoded).
///
/// Layout: byte 0 picks the FORMAT_DESCRIPTION the events are read with (`% 5`: 0 = none,
/// the events bring their own; 1 / 2 = MySQL 8.0 with / without CRC32 checksums; 3 / 4 =
/// MariaDB 10.11 with / without) and, with bit 7, a MariaDB source; then events one after
/// the other, each as long as its header says (a last partial event is dropped, as a
/// connection would never deliver one).
pub fn binlog_events(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let flavour = mode % 5;
    let mut esr = EventStreamReader::new(BinlogVersion::Version4);
    if flavour != 0 {
        let fde = format_description(flavour >= 3, flavour % 2 == 1);
        esr.read(&fde[..]).expect("the fuzz FORMAT_DESCRIPTION reads");
    }
    let mariadb = flavour >= 3 || mode & 0x80 != 0;
    let mapper = Mapper::default();
    let mut state = ReadState::default();
    let mut xa = PreparedXas::default();
    let stats = SourceStats::default();
    let resume = Resume::FilePos(binval_protocol::SourcePosition { file: FUZZ_FILE.into(), pos: 4, gtid: None });
    let mut ctx = ReadContext::new(&mapper, &mut state, &mut xa, &stats, mariadb, &resume, ReadSettings::default());
    let mut tables = TableMaps::new();
    let mut out = Vec::new();
    for bytes in whole_events(rest) {
        // The replica connection's parser (mysql_async) reads each event the same way; the
        // live reader catches what it cannot (see `binlog::reader`).
        if crate::binlog::framing::check_event_bytes(esr.get_fde(), bytes).is_err() {
            return;
        }
        let ev = match esr.read(bytes) {
            Ok(Some(ev)) => ev,
            Ok(None) => return,
            Err(e) => {
                let _ = e.to_string();
                return;
            }
        };
        if let Err(e) = events::check_end_position(&mut ctx, ev.header()) {
            let _ = e.to_string();
            return;
        }
        ctx.framer.push(ev);
        while let Some(framed) = ctx.framer.next() {
            let framed = match framed {
                Ok(f) => f,
                Err(e) => {
                    let _ = events::framing_error(&ctx, e).to_string();
                    return;
                }
            };
            // The row decoder on every table, mapped or not.
            match framed.body() {
                Ok(Body::Data(EventData::TableMapEvent(tme))) => {
                    let _ = tables.table_map(tme, None, |t| TableSchema::from_table_map_positional(t, mariadb)).map_err(|e| e.to_string());
                }
                Ok(Body::Data(EventData::RowsEvent(rows))) => {
                    if let Some(t) = tables.get(rows.table_id()).cloned() {
                        out.clear();
                        let _ = decode_rows(&t, &rows, &mut out).map_err(|e| e.to_string());
                    }
                }
                _ => {}
            }
            // The live handlers (no table mapped: the mapping is the config's business).
            match events::handle(&mut ctx, &framed) {
                Ok(Some(mut txn)) => {
                    out.clear();
                    let _ = txn.rows.decode_all(&mut out).map_err(|e| e.to_string());
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = e.to_string();
                    return;
                }
            }
        }
    }
}

/// A FORMAT_DESCRIPTION event of a MySQL 8.0 or MariaDB 10.11 server, with or without CRC32
/// checksums, as the first event of a binlog (`binlog_events` seeds the reader with it).
pub fn format_description(mariadb: bool, crc32: bool) -> Vec<u8> {
    let version: &[u8] = if mariadb { b"10.11.6-MariaDB-log" } else { b"8.0.36" };
    let mut server_version = version.to_vec();
    server_version.resize(FormatDescriptionEvent::SERVER_VER_LEN, 0);
    let fde =
        FormatDescriptionEvent::new(BinlogVersion::Version4).with_server_version(server_version).with_event_type_header_lengths(Vec::new());
    let mut body = Vec::new();
    fde.serialize(&mut body);
    // The event header length (19) follows the creation time; mysql_common leaves it 0.
    body[2 + FormatDescriptionEvent::SERVER_VER_LEN + 4] = BinlogEventHeader::LEN as u8;
    let alg = if crc32 { BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32 } else { BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_OFF };
    body.push(alg as u8);
    body.extend_from_slice(&[0; 4]);
    let size = (BinlogEventHeader::LEN + body.len()) as u32;
    let header = BinlogEventHeader::new(0, EventType::FORMAT_DESCRIPTION_EVENT, 1, size, 4 + size, EventFlags::empty());
    let mut bytes = Vec::with_capacity(size as usize);
    header.serialize(&mut bytes);
    bytes.extend_from_slice(&body);
    // The checksum of the event itself, so a file reader that checks checksums takes it.
    let fresh = EventStreamReader::new(BinlogVersion::Version4);
    if let Ok(ev) = Event::read(fresh.get_fde(), &bytes[..]) {
        let crc = ev.calc_checksum(BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_CRC32);
        let n = bytes.len();
        bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

/// `config`: `data` as the text of a TOML config file, loaded and validated as `binval run`
/// loads it. Any text must give a config or an error naming the file, never a panic.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = crate::config::Config::from_toml(text) {
        let _ = e.to_string();
    }
}

/// How many events follow the FORMAT_DESCRIPTION in one `binlog_events` seed.
pub const EVENTS_PER_SEED: usize = 8;

/// The `binlog_events` seeds of a binlog file's bytes (`scripts/fuzz.sh` writes these, by
/// `examples/fuzz_seeds.rs`): mode byte 0, the file's FORMAT_DESCRIPTION, then each run of [`EVENTS_PER_SEED`]
/// events in turn. Cutting stops at the first event whose length does not fit; a file without
/// the binlog magic gives none.
pub fn binlog_event_seeds(file: &[u8]) -> Vec<Vec<u8>> {
    let Some(rest) = file.strip_prefix(&crate::binlog::offline::MAGIC[..]) else { return Vec::new() };
    let events: Vec<&[u8]> = whole_events(rest).collect();
    let Some((fde, others)) = events.split_first() else { return Vec::new() };
    others
        .chunks(EVENTS_PER_SEED)
        .map(|chunk| {
            let mut seed = vec![0u8];
            seed.extend_from_slice(fde);
            chunk.iter().for_each(|e| seed.extend_from_slice(e));
            seed
        })
        .collect()
}

/// The events of `bytes` laid one after the other, each as long as its header's event size
/// (bytes 9..13), up to the first whose size is shorter than a header or runs past the end.
fn whole_events(mut bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let size = u32::from_le_bytes(bytes.get(9..13)?.try_into().ok()?) as usize;
        if size < BinlogEventHeader::LEN || size > bytes.len() {
            return None;
        }
        let (event, tail) = bytes.split_at(size);
        bytes = tail;
        Some(event)
    })
}
