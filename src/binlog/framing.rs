//! Framing: from the events as they are stored in a binlog (file or replica stream) to the
//! plain events binval handles, once for both readers.
//!
//! The live reader ([`crate::binlog::reader`]) and the offline reader
//! ([`crate::binlog::offline`]) see the same binlog events, so they share one set of rules for
//! what mysql_common 0.37 does not do by itself:
//!
//! * MariaDB's own GTID event (type 162) is not parsed by mysql_common, so binval reads its
//!   fixed 13-byte body (seq_no u64 LE, domain_id u32 LE, flags u8; MariaDB `Gtid_log_event`)
//!   itself ([`MariadbGtidEvent`]).
//! * MariaDB compressed events (`log_bin_compress=ON`, types 165-171) are decompressed into the
//!   plain QUERY / row events they wrap ([`uncompress_mariadb_event`]) and handled like those.
//! * MySQL 8 TRANSACTION_PAYLOAD events (`binlog_transaction_compression=ON`) are cut into their
//!   inner events (BEGIN, TABLE_MAPs, rows, XID: [`transaction_payload_events`]), handled in order
//!   at the payload event's position, right after the payload event itself.
//! * An event type mysql_common cannot read is passed over only when it carries no rows
//!   ([`skippable_unknown_event`]); any other one is an error.
//! * A TABLE_MAP precedes the row events of every statement; an identical one keeps its
//!   prepared schema ([`TableMaps`]).
//!
//! [`Framer`] applies these rules to the events one reader gives it, and yields [`Framed`]
//! events; [`Framed::body`] says what each one is. Errors are [`FramingError`]s with the
//! headers needed to place them; each reader turns them into its own errors (the live reader
//! into definite or transient errors, the offline reader into
//! [`crate::binlog::offline::OfflineError`]s with the file position).

mod compressed;
mod payload;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use binval_protocol::MariadbGtid;
use mysql_common::binlog::consts::EventType;
use mysql_common::binlog::events::{BinlogEventHeader, Event, EventData, TableMapEvent};

pub use compressed::{mariadb_compressed_name, mariadb_compressed_plain_type, uncompress_mariadb_event};
pub use payload::transaction_payload_events;

use crate::binlog::decode::{DecodeError, TableSchema};

/// MariaDB GTID_EVENT type code.
pub const MARIADB_GTID_EVENT: u8 = 162;
/// MariaDB Gtid_log_event flag: the group is one statement with no COMMIT.
pub const MARIADB_FL_STANDALONE: u8 = 1;

/// Whether an event of a type mysql_common 0.37 does not parse (`read_data` gives `None`) may be
/// passed over: MySQL's HEARTBEAT_LOG_EVENT_V2 (41) and MariaDB's ANNOTATE_ROWS (160),
/// BINLOG_CHECKPOINT (161), GTID_LIST (163) and START_ENCRYPTION (164) carry no rows; any
/// other type only when its header has `LOG_EVENT_IGNORABLE_F` (0x80, MySQL/MariaDB
/// log_event.h: "a replica that does not know the event may skip it"). MariaDB's GTID (162)
/// and compressed events (165-171) are decoded by binval before this question arises.
pub fn skippable_unknown_event(raw: u8, flags: u16) -> bool {
    const LOG_EVENT_IGNORABLE_F: u16 = 0x80;
    matches!(raw, 41 | 160 | 161 | 163 | 164) || flags & LOG_EVENT_IGNORABLE_F != 0
}

/// A MariaDB GTID event (type 162): the GTID that starts an event group, and its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MariadbGtidEvent {
    /// `domain-server-seq`; the server is the event header's `server_id`.
    pub gtid: MariadbGtid,
    /// `Gtid_log_event` flags byte (`FL_STANDALONE` = 1, ...).
    pub flags: u8,
}

impl MariadbGtidEvent {
    /// Size of the fixed part of the body that binval reads: seq_no u64 LE, domain_id u32 LE,
    /// flags u8.
    pub const LEN: usize = 13;

    /// Read the fixed part of a GTID event body (`header` gives the server id). `None` when
    /// the body is shorter than [`Self::LEN`].
    pub fn parse(header: &BinlogEventHeader, data: &[u8]) -> Option<Self> {
        if data.len() < Self::LEN {
            return None;
        }
        let seq = u64::from_le_bytes(data[0..8].try_into().ok()?);
        let domain = u32::from_le_bytes(data[8..12].try_into().ok()?);
        Some(MariadbGtidEvent { gtid: MariadbGtid { domain, server: header.server_id(), seq }, flags: data[12] })
    }

    /// `FL_STANDALONE`: the group is a single statement (DDL) with no commit event.
    pub fn standalone(&self) -> bool {
        self.flags & MARIADB_FL_STANDALONE != 0
    }
}

/// Event bytes that must not reach mysql_common's `Event::read` ([`check_event_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShortEvent {
    /// Fewer bytes than the 19-byte event header.
    #[error("{len} bytes, shorter than an event header")]
    NoHeader {
        /// The event's length, bytes.
        len: usize,
    },
    /// A body shorter than the 4-byte CRC32 checksum the format announces.
    #[error("event of {len} bytes has no room for its checksum")]
    NoChecksum {
        /// The event's length, bytes.
        len: usize,
    },
}

/// Check that an event's bytes (`bytes`: header, body and checksum, as long as the header's
/// event size) can be handed to mysql_common's `Event::read` under `fde`: it subtracts the
/// checksum length from the body without checking it (an overflow panic, found by fuzzing),
/// so a body shorter than its checksum is refused here. `Err` says why.
pub fn check_event_bytes(fde: &mysql_common::binlog::events::FormatDescriptionEvent<'_>, bytes: &[u8]) -> Result<(), ShortEvent> {
    use mysql_common::binlog::events::BinlogEventFooter;
    if bytes.len() < BinlogEventHeader::LEN {
        return Err(ShortEvent::NoHeader { len: bytes.len() });
    }
    if bytes[4] == EventType::FORMAT_DESCRIPTION_EVENT as u8 {
        // Its own footer decides; mysql_common checks its length before using it.
        return Ok(());
    }
    let footer = fde.footer();
    let checksum = footer.get_checksum_enabled()
        && !matches!(
            footer.get_checksum_alg(),
            Ok(None) | Ok(Some(mysql_common::binlog::consts::BinlogChecksumAlg::BINLOG_CHECKSUM_ALG_OFF))
        );
    if checksum && bytes.len() < BinlogEventHeader::LEN + BinlogEventFooter::BINLOG_CHECKSUM_LEN {
        return Err(ShortEvent::NoChecksum { len: bytes.len() });
    }
    Ok(())
}

/// One event to handle, as the [`Framer`] yields it.
#[derive(Debug)]
pub struct Framed {
    /// The event: as read, the plain event a MariaDB compressed event wraps, or an event from
    /// inside a TRANSACTION_PAYLOAD.
    pub event: Event,
    /// The type the event was stored with: a MariaDB compressed event's own type (165-171)
    /// while `event` is the plain event it wraps; else `event`'s type.
    pub stored_type: u8,
    /// For an event from inside a TRANSACTION_PAYLOAD: the payload event's header, whose
    /// position and time the inner events take (they have none of their own).
    pub outer: Option<BinlogEventHeader>,
}

/// What a [`Framed`] event is.
#[derive(Debug)]
pub enum Body<'a> {
    /// A MariaDB GTID event, read by binval.
    MariadbGtid(MariadbGtidEvent),
    /// An event mysql_common reads.
    Data(EventData<'a>),
    /// An event passed over unparsed: a type mysql_common does not read that may be passed
    /// over ([`skippable_unknown_event`]), a damaged PREVIOUS_GTIDS event (its counts exceed
    /// its length: mysql_common's parser would allocate for them first; binval needs the set
    /// only to make a MySQL checkpoint's GTID set whole, which the next file's event does), or
    /// a TRANSACTION_PAYLOAD (its inner events are what is handled; the [`Framer`] read it).
    Skipped,
}

/// Whether the SID and interval counts of a PREVIOUS_GTIDS event body (checksum included or
/// not) fit its length, walked as MySQL writes it (`Gtid_set::encode`, untagged: 8-byte SID
/// count, then per SID its 16-byte UUID, 8-byte interval count and 16 bytes per interval;
/// tagged (MySQL 8.4, format byte in the top byte of the first 8): a varlen tag length and the
/// tag after each UUID). A body whose counts fit is safe for mysql_common's parser.
fn previous_gtids_counts_fit(body: &[u8]) -> bool {
    let take = |buf: &mut &[u8], n: usize| -> Option<()> {
        if buf.len() < n {
            return None;
        }
        *buf = &buf[n..];
        Some(())
    };
    let u64_at = |buf: &[u8]| buf.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let walk = || -> Option<()> {
        let mut buf = body;
        let header = u64_at(buf)?;
        take(&mut buf, 8)?;
        let tagged = (header >> 56) != 0;
        let n_sids = if tagged { (header >> 8) & ((1 << 48) - 1) } else { header & ((1 << 56) - 1) };
        if n_sids > (buf.len() / 24) as u64 {
            return None;
        }
        for _ in 0..n_sids {
            take(&mut buf, 16)?;
            if tagged {
                // MySQL's varlen unsigned integer: the first byte's trailing ones say how many
                // more bytes follow (all 8 of them for 0xFF).
                let first = *buf.first()?;
                let width = if first == 0xFF { 9 } else { first.trailing_ones() as usize + 1 };
                let mut raw = [0u8; 8];
                let bytes = buf.get(..width)?;
                let len = if width == 9 {
                    u64::from_le_bytes(bytes[1..9].try_into().expect("8 bytes"))
                } else {
                    raw[..width].copy_from_slice(bytes);
                    u64::from_le_bytes(raw) >> width
                };
                take(&mut buf, width)?;
                take(&mut buf, usize::try_from(len).ok()?)?;
            }
            let n_intervals = u64_at(buf)?;
            take(&mut buf, 8)?;
            take(&mut buf, usize::try_from(n_intervals).ok()?.checked_mul(16)?)?;
        }
        Some(())
    };
    walk().is_some()
}

impl Framed {
    /// The header whose position (`log_pos`) and time place the event in the binlog: the
    /// payload event's for an event inside a TRANSACTION_PAYLOAD, else its own.
    pub fn placed(&self) -> BinlogEventHeader {
        self.outer.unwrap_or_else(|| self.event.header())
    }

    /// Read the event. Errors: a MariaDB GTID event shorter than 13 bytes, an event
    /// mysql_common cannot parse, an unknown type that may not be passed over.
    pub fn body(&self) -> Result<Body<'_>, FramingError> {
        let header = self.event.header();
        let error = |kind| FramingError { header, outer: self.outer, kind: Box::new(kind) };
        if header.event_type_raw() == MARIADB_GTID_EVENT {
            let data = self.event.data();
            return MariadbGtidEvent::parse(&header, data)
                .map(Body::MariadbGtid)
                .ok_or_else(|| error(FramingErrorKind::ShortMariadbGtid { len: data.len() }));
        }
        if header.event_type_raw() == EventType::PREVIOUS_GTIDS_EVENT as u8 && !previous_gtids_counts_fit(self.event.data()) {
            // mysql_common 0.37 reserves memory for the SID and interval counts it announces
            // (up to 2^56) before checking them against the event's length: a damaged one
            // would make it allocate without bound (found by fuzzing). Its counts are checked
            // first; one whose counts do not fit its bytes is passed over.
            tracing::warn!(position = header.log_pos(), "a PREVIOUS_GTIDS event whose counts exceed its length: passed over");
            return Ok(Body::Skipped);
        }
        if header.event_type_raw() == EventType::TRANSACTION_PAYLOAD_EVENT as u8 {
            // MySQL 8 binlog_transaction_compression=ON. The Framer has read it already (header
            // checked, cut into its inner events: BEGIN, TABLE_MAPs, rows, XID, reported at the
            // payload's position, which come next; or the error that stops a payload that cannot
            // be read to its end, so a damaged payload passes none of its rows on). Nothing of
            // the payload event itself is used: it is not parsed a second time.
            return Ok(Body::Skipped);
        }
        match self.event.read_data() {
            Ok(Some(data)) => Ok(Body::Data(data)),
            // Types mysql_common does not know: passed over only when they carry no rows.
            Ok(None) if skippable_unknown_event(header.event_type_raw(), header.flags_raw()) => Ok(Body::Skipped),
            Ok(None) => Err(error(FramingErrorKind::Unknown)),
            Err(e) => Err(error(FramingErrorKind::Unreadable(e))),
        }
    }
}

/// Why an event could not be framed, with the headers that place it.
#[derive(Debug)]
pub struct FramingError {
    /// The header of the event concerned (of the compressed event, of the payload event...).
    pub header: BinlogEventHeader,
    /// For an event inside a TRANSACTION_PAYLOAD: the payload event's header.
    pub outer: Option<BinlogEventHeader>,
    /// What is wrong (boxed: errors are rare, events are not).
    pub kind: Box<FramingErrorKind>,
}

impl FramingError {
    /// The header that places the event in the binlog (see [`Framed::placed`]).
    pub fn placed(&self) -> BinlogEventHeader {
        self.outer.unwrap_or(self.header)
    }
}

/// What is wrong with an event (see [`FramingError`]).
#[derive(Debug)]
pub enum FramingErrorKind {
    /// A MariaDB compressed event that cannot be decompressed ([`DecodeError::Compressed`]).
    Compressed(DecodeError),
    /// A TRANSACTION_PAYLOAD that cannot be read to its end ([`DecodeError::Payload`]); none of
    /// its inner events are yielded.
    Payload(DecodeError),
    /// A MariaDB GTID event whose body (`len` bytes) is shorter than 13 bytes.
    ShortMariadbGtid {
        /// Body length, bytes.
        len: usize,
    },
    /// mysql_common cannot parse the event.
    Unreadable(std::io::Error),
    /// An event type mysql_common does not know, not marked ignorable.
    Unknown,
}

/// Turns the events a reader reads into the events to handle, in order: an event as it is;
/// a MariaDB compressed event as the plain event it wraps; a TRANSACTION_PAYLOAD event, then
/// each of its inner events.
///
/// A reader [`push`](Framer::push)es one event it read, then takes events from the framer (an
/// [`Iterator`]) until there are none left.
#[derive(Debug, Default)]
pub struct Framer {
    /// Events still to yield, with the payload header of the inner ones.
    queue: VecDeque<(Event, Option<BinlogEventHeader>)>,
    /// The error that ends the payload event just yielded, yielded next.
    failed: Option<FramingError>,
}

impl Framer {
    /// A framer with nothing to yield.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add an event as read from the binlog.
    pub fn push(&mut self, event: Event) {
        self.queue.push_back((event, None));
    }
}

impl Iterator for Framer {
    type Item = Result<Framed, FramingError>;

    /// The next event to handle, or `None` when every event pushed has been yielded.
    ///
    /// A TRANSACTION_PAYLOAD is yielded itself, then its inner events; when it cannot be read
    /// to its end, the error comes right after it instead (the whole payload is read before
    /// any inner event is yielded, so a damaged payload passes none of its rows on).
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        let (event, outer) = self.queue.pop_front()?;
        let header = event.header();
        let stored_type = header.event_type_raw();
        let error = |kind| FramingError { header, outer, kind: Box::new(kind) };
        if mariadb_compressed_plain_type(stored_type).is_some() {
            return Some(match uncompress_mariadb_event(&event) {
                Ok(plain) => Ok(Framed { event: plain, stored_type, outer }),
                Err(e) => Err(error(FramingErrorKind::Compressed(e))),
            });
        }
        if stored_type == EventType::TRANSACTION_PAYLOAD_EVENT as u8 {
            match transaction_payload_events(&event) {
                Ok(inner) => {
                    for e in inner.into_iter().rev() {
                        self.queue.push_front((e, Some(header)));
                    }
                }
                Err(e) => self.failed = Some(error(FramingErrorKind::Payload(e))),
            }
        }
        Some(Ok(Framed { event, stored_type, outer }))
    }
}

/// The tables announced by the TABLE_MAP events read so far, by table id, each with the
/// schema prepared from its last TABLE_MAP.
///
/// MySQL and MariaDB write a TABLE_MAP before the row events of every statement; an identical
/// one (under the same name) keeps its prepared schema instead of preparing it again.
#[derive(Debug, Default)]
pub struct TableMaps {
    tables: HashMap<u64, Arc<TableSchema>>,
}

impl TableMaps {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take in a TABLE_MAP. `name`: the `schema.table` its rows go on under (the configured
    /// name of a renamed mapped table), or `None` for the TABLE_MAP's own. A new or changed
    /// TABLE_MAP is prepared with `prepare`; its errors are returned.
    pub fn table_map(
        &mut self,
        tme: TableMapEvent<'_>,
        name: Option<&str>,
        prepare: impl FnOnce(TableMapEvent<'static>) -> Result<TableSchema, DecodeError>,
    ) -> Result<(), DecodeError> {
        let id = tme.table_id();
        if self.tables.get(&id).is_some_and(|t| t.same_table_map(&tme) && name.is_none_or(|n| *t.name == *n)) {
            return Ok(());
        }
        let mut schema = prepare(tme.into_owned())?;
        if let Some(n) = name {
            if *schema.name != *n {
                // A renamed mapped table: its rows go on under the configured rule.
                schema.name = Arc::from(n);
            }
        }
        self.tables.insert(id, Arc::new(schema));
        Ok(())
    }

    /// Forget every table id whose TABLE_MAP named `table` (`schema.table` as in the TABLE_MAP):
    /// its next TABLE_MAP is prepared anew, even if it is byte for byte the same (what binval
    /// knows of the table changed, see `binlog::json_columns`).
    pub fn forget_named(&mut self, table: &str) {
        self.tables.retain(|_, t| format!("{}.{}", t.tme.database_name(), t.tme.table_name()) != table);
    }

    /// Forget a table id (its last TABLE_MAP named a table that is not read).
    pub fn forget(&mut self, table_id: u64) {
        self.tables.remove(&table_id);
    }

    /// The prepared schema of a table id.
    pub fn get(&self, table_id: u64) -> Option<&Arc<TableSchema>> {
        self.tables.get(&table_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_gtids_counts_are_checked_before_parsing() {
        use mysql_common::binlog::events::{PreviousGtidsEvent, PreviousGtidsSid};
        use mysql_common::packets::{GnoInterval, Tag};
        use mysql_common::proto::MySerialize;
        let plain =
            PreviousGtidsEvent::new(vec![PreviousGtidsSid::new([7; 16], None, vec![GnoInterval::new(1, 6), GnoInterval::new(9, 10)])]);
        let tagged = PreviousGtidsEvent::new(vec![
            PreviousGtidsSid::new([7; 16], None, vec![GnoInterval::new(1, 6)]),
            PreviousGtidsSid::new([7; 16], Some(Tag::new("mytag").unwrap()), vec![GnoInterval::new(2, 4)]),
        ]);
        for ev in [plain, tagged] {
            let mut body = Vec::new();
            ev.serialize(&mut body);
            assert!(previous_gtids_counts_fit(&body), "{ev:?}");
            assert!(!previous_gtids_counts_fit(&body[..body.len() - 1]), "one byte short");
            let mut huge = body.clone();
            huge[0] = 0xFF;
            huge[6] = 0x7F;
            assert!(!previous_gtids_counts_fit(&huge), "a SID count far beyond the length");
        }
        assert!(previous_gtids_counts_fit(&0u64.to_le_bytes()), "the empty set");
        assert!(!previous_gtids_counts_fit(&[1, 2, 3]));
    }

    #[test]
    fn mariadb_gtid_body() {
        let h = BinlogEventHeader::new(0, EventType::UNKNOWN_EVENT, 7, 32, 0, mysql_common::binlog::consts::EventFlags::empty());
        let mut body = 42u64.to_le_bytes().to_vec();
        body.extend_from_slice(&3u32.to_le_bytes());
        body.push(MARIADB_FL_STANDALONE);
        let g = MariadbGtidEvent::parse(&h, &body).unwrap();
        assert_eq!(g.gtid.to_string(), "3-7-42");
        assert!(g.standalone());
        assert_eq!(MariadbGtidEvent::parse(&h, &body[..12]), None);
    }
}
