//! The batched event format: one Kafka message carries the key changes of one apply group for
//! one partition, in a compact binary layout a reader can scan without allocating.
//!
//! A batch message has the Kafka header [`KIND_HEADER`](crate::KIND_HEADER) =
//! [`KIND_BATCH`] (`binval.kind: batch`), no message key, and is produced to an explicit
//! partition: the partition the producer's partitioner gives each of its keys, so a key's
//! changes stay on one partition whichever format carried them. Layout (all integers
//! little-endian; `str16` = `u16` byte length, then that many bytes of UTF-8; documented in
//! `schemas/invalidation-batch.md`):
//!
//! ```text
//! u8     format            BATCH_FORMAT_VERSION (1); a reader rejects a higher one
//! u8     flags             0; a reader rejects any bit it does not know
//! u64    publish_time_ms   when binval handed the message to the producer, Unix ms
//! u16    table_count       then table_count x str16: the tables (`schema.table`)
//! u16    txn_count         then txn_count x transaction, in commit order:
//!   u64    commit_time_ms  binlog header commit time, Unix ms (whole seconds)
//!   u64    pos             binlog position (byte offset) just after the commit
//!   str16  file            binlog file name
//!   str16  gtid            the transaction's GTID, empty when none
//!   u32    change_count    then change_count x change:
//!     u8     op            0 insert, 1 update, 2 delete, 3 truncate
//!     u64    version       the change's version (fence position)
//!     u16    table         index into the tables
//!     str16  key           logical key (a key template for truncate)
//! ```
//!
//! Nothing may follow the last change. [`BatchView::parse`] checks all of it in one scan
//! without allocating (lengths, UTF-8 of every string, ops, table indexes, counts);
//! [`BatchView::changes`] then yields every change with its key as a `&str` borrowed from the
//! payload, which is what lets a consumer decide that a key is not cached before any
//! allocation. A change's meaning is that of the per-key [`InvalidationEvent`] it replaces
//! ([`Change::to_event`] builds it).
//!
//! Why fixed-width fields and no varints: a reader scans a change with four loads and one
//! UTF-8 check, and the producer compresses the messages of the batched format (lz4 unless
//! `compression.type` says otherwise), which takes the zeros of the fixed widths and the
//! repeated key prefixes away on the wire.

use crate::event::{InvalidationEvent, Op, SourcePosition, EVENT_SCHEMA_VERSION};
use crate::version::Version;

/// Value of the [`KIND_HEADER`](crate::KIND_HEADER) header of a batch message.
pub const KIND_BATCH: &str = "batch";

/// Version of the batch layout, the payload's first byte. A reader rejects a higher one
/// ([`BatchDecodeError::UnknownFormat`]).
pub const BATCH_FORMAT_VERSION: u8 = 1;

/// Bytes of the fixed header (format, flags, publish time).
const HEADER: usize = 10;
/// Bytes of a transaction's fixed part besides its two strings: commit time, pos, count.
const TXN_FIXED: usize = 8 + 8 + 4;
/// Bytes of a change besides its key: op, version, table index, key length.
const CHANGE_FIXED: usize = 1 + 8 + 2 + 2;
/// The longest string a `str16` holds, bytes.
pub const MAX_STR_BYTES: usize = u16::MAX as usize;

/// Why a payload is not a batch ([`BatchView::parse`]). Offsets are byte offsets into the
/// payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchDecodeError {
    /// The payload ends inside a field.
    #[error("invalidation batch truncated: {field} at byte {at} needs {need} bytes, the payload has {len}")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Where it starts.
        at: usize,
        /// Bytes it needs.
        need: usize,
        /// Payload length.
        len: usize,
    },
    /// The payload comes from a newer binval than this reader understands.
    #[error("invalidation batch has format {found}, this reader knows up to {known}")]
    UnknownFormat {
        /// The payload's format byte.
        found: u8,
        /// [`BATCH_FORMAT_VERSION`].
        known: u8,
    },
    /// Flag bits this reader does not know.
    #[error("invalidation batch has unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// A string field that is not UTF-8.
    #[error("invalidation batch: {field} at byte {at} is not UTF-8")]
    NotUtf8 {
        /// The field.
        field: &'static str,
        /// Where its bytes start.
        at: usize,
    },
    /// An op byte other than 0..=3.
    #[error("invalidation batch: unknown op {op} at byte {at}")]
    BadOp {
        /// The byte.
        op: u8,
        /// Where it is.
        at: usize,
    },
    /// A change naming a table the batch does not list.
    #[error("invalidation batch: table index {index} at byte {at}, the batch lists {tables}")]
    BadTable {
        /// The index.
        index: u16,
        /// Where it is.
        at: usize,
        /// Tables listed.
        tables: u16,
    },
    /// Bytes after the last change.
    #[error("invalidation batch: {extra} bytes after the last change (at byte {at})")]
    TrailingBytes {
        /// How many.
        extra: usize,
        /// Where they start.
        at: usize,
    },
}

/// A cursor over the payload: every read checks the length and names the field.
#[derive(Clone, Copy)]
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BatchDecodeError> {
        match self.b.get(self.at..self.at.saturating_add(n)) {
            Some(s) if s.len() == n => {
                self.at += n;
                Ok(s)
            }
            _ => Err(BatchDecodeError::Truncated { field, at: self.at, need: n, len: self.b.len() }),
        }
    }

    #[inline]
    fn u8(&mut self, field: &'static str) -> Result<u8, BatchDecodeError> {
        Ok(self.take(1, field)?[0])
    }

    #[inline]
    fn u16(&mut self, field: &'static str) -> Result<u16, BatchDecodeError> {
        let s = self.take(2, field)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    #[inline]
    fn u32(&mut self, field: &'static str) -> Result<u32, BatchDecodeError> {
        let s = self.take(4, field)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    #[inline]
    fn u64(&mut self, field: &'static str) -> Result<u64, BatchDecodeError> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }

    /// A `str16`, checked to be UTF-8.
    #[inline]
    fn str16(&mut self, field: &'static str) -> Result<&'a str, BatchDecodeError> {
        let n = self.u16(field)? as usize;
        let at = self.at;
        let s = self.take(n, field)?;
        std::str::from_utf8(s).map_err(|_| BatchDecodeError::NotUtf8 { field, at })
    }
}

fn op_of(b: u8) -> Option<Op> {
    Some(match b {
        0 => Op::Insert,
        1 => Op::Update,
        2 => Op::Delete,
        3 => Op::Truncate,
        _ => return None,
    })
}

fn op_byte(op: Op) -> u8 {
    match op {
        Op::Insert => 0,
        Op::Update => 1,
        Op::Delete => 2,
        Op::Truncate => 3,
    }
}

/// A checked batch payload, borrowed ([`BatchView::parse`]). Cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    /// When binval handed the message to the producer, Unix epoch ms.
    pub publish_time_ms: u64,
    /// Number of key changes in the batch.
    pub change_count: usize,
    /// Number of transactions in the batch.
    pub txn_count: u16,
    table_count: u16,
    /// The payload from the table list on.
    tables: &'a [u8],
    /// The payload from the first transaction on.
    txns: &'a [u8],
}

/// One transaction of a batch: where it committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnRef<'a> {
    /// Commit time from the binlog event header, Unix epoch ms (a multiple of 1000).
    pub commit_time_ms: u64,
    /// Binlog file name.
    pub file: &'a str,
    /// Byte offset in `file` just after the transaction's commit event.
    pub pos: u64,
    /// The transaction's GTID, if the source wrote one.
    pub gtid: Option<&'a str>,
    /// Key changes of this transaction in the batch.
    pub change_count: u32,
}

impl TxnRef<'_> {
    /// The owned [`SourcePosition`].
    pub fn position(&self) -> SourcePosition {
        SourcePosition { file: self.file.to_string(), pos: self.pos, gtid: self.gtid.map(str::to_string) }
    }
}

/// One key change of a batch, borrowed from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<'a> {
    /// What happened to the key.
    pub op: Op,
    /// The change's version (what `K:ver` holds once it is applied).
    pub version: Version,
    /// Index of its table in the batch's table list ([`BatchView::table`]).
    pub table: u16,
    /// The logical key (for [`Op::Truncate`], the key template).
    pub key: &'a str,
    /// Its transaction.
    pub txn: TxnRef<'a>,
}

impl<'a> BatchView<'a> {
    /// Check `payload` as a batch: the whole layout in one scan, without allocating. Errors
    /// name the field and byte offset ([`BatchDecodeError`]); never panics on any input.
    pub fn parse(payload: &'a [u8]) -> Result<Self, BatchDecodeError> {
        let mut r = Reader { b: payload, at: 0 };
        let format = r.u8("format")?;
        if format > BATCH_FORMAT_VERSION || format == 0 {
            return Err(BatchDecodeError::UnknownFormat { found: format, known: BATCH_FORMAT_VERSION });
        }
        let flags = r.u8("flags")?;
        if flags != 0 {
            return Err(BatchDecodeError::UnknownFlags(flags));
        }
        let publish_time_ms = r.u64("publish_time_ms")?;
        let tables_at = r.at;
        let table_count = r.u16("table_count")?;
        for _ in 0..table_count {
            r.str16("table")?;
        }
        let txns_at = r.at;
        let txn_count = r.u16("txn_count")?;
        let mut change_count = 0usize;
        for _ in 0..txn_count {
            r.u64("commit_time_ms")?;
            r.u64("pos")?;
            r.str16("file")?;
            r.str16("gtid")?;
            let n = r.u32("change_count")?;
            // Each change takes at least CHANGE_FIXED bytes: a count the rest cannot hold is
            // truncated, whatever it claims.
            let rest = payload.len() - r.at;
            if (n as usize) > rest / CHANGE_FIXED {
                return Err(BatchDecodeError::Truncated {
                    field: "change",
                    at: r.at,
                    need: (n as usize).saturating_mul(CHANGE_FIXED),
                    len: payload.len(),
                });
            }
            for _ in 0..n {
                let at = r.at;
                let op = r.u8("op")?;
                if op_of(op).is_none() {
                    return Err(BatchDecodeError::BadOp { op, at });
                }
                r.u64("version")?;
                let t_at = r.at;
                let t = r.u16("table")?;
                if t >= table_count {
                    return Err(BatchDecodeError::BadTable { index: t, at: t_at, tables: table_count });
                }
                r.str16("key")?;
            }
            change_count += n as usize;
        }
        if r.at != payload.len() {
            return Err(BatchDecodeError::TrailingBytes { extra: payload.len() - r.at, at: r.at });
        }
        Ok(BatchView {
            publish_time_ms,
            change_count,
            txn_count,
            table_count,
            tables: &payload[tables_at..txns_at],
            txns: &payload[txns_at..],
        })
    }

    /// Table `i` of the batch's table list (`schema.table`), if it has one.
    pub fn table(&self, i: u16) -> Option<&'a str> {
        let mut r = Reader { b: self.tables, at: 2 };
        for _ in 0..i {
            r.str16("table").ok()?;
        }
        if i >= self.table_count {
            return None;
        }
        r.str16("table").ok()
    }

    /// Every change, in the batch's order (transactions in commit order), keys borrowed from
    /// the payload; one linear scan.
    pub fn changes(&self) -> Changes<'a> {
        Changes { r: Reader { b: self.txns, at: 2 }, txns_left: self.txn_count, left: 0, txn: None }
    }

    /// Every change as an owned per-key [`InvalidationEvent`] (for tools and tests; a consumer
    /// uses [`BatchView::changes`]).
    pub fn to_events(&self) -> Vec<InvalidationEvent> {
        self.changes().map(|c| c.to_event(self)).collect()
    }
}

/// The changes of a batch ([`BatchView::changes`]).
pub struct Changes<'a> {
    r: Reader<'a>,
    txns_left: u16,
    /// Changes left in the current transaction.
    left: u32,
    txn: Option<TxnRef<'a>>,
}

impl<'a> Iterator for Changes<'a> {
    type Item = Change<'a>;

    #[inline]
    fn next(&mut self) -> Option<Change<'a>> {
        // The payload was checked by `parse`: the reads below cannot fail; if one did, the
        // iteration would simply end.
        while self.left == 0 {
            if self.txns_left == 0 {
                return None;
            }
            self.txns_left -= 1;
            let commit_time_ms = self.r.u64("commit_time_ms").ok()?;
            let pos = self.r.u64("pos").ok()?;
            let file = self.r.str16("file").ok()?;
            let gtid = self.r.str16("gtid").ok()?;
            let change_count = self.r.u32("change_count").ok()?;
            self.txn = Some(TxnRef { commit_time_ms, file, pos, gtid: (!gtid.is_empty()).then_some(gtid), change_count });
            self.left = change_count;
        }
        self.left -= 1;
        let op = op_of(self.r.u8("op").ok()?)?;
        let version = self.r.u64("version").ok()?;
        let table = self.r.u16("table").ok()?;
        let key = self.r.str16("key").ok()?;
        Some(Change { op, version, table, key, txn: self.txn? })
    }
}

impl Change<'_> {
    /// The per-key event this change stands for, with the batch's publish time.
    pub fn to_event(&self, batch: &BatchView<'_>) -> InvalidationEvent {
        InvalidationEvent {
            schema: EVENT_SCHEMA_VERSION,
            key: self.key.to_string(),
            version: self.version,
            op: self.op,
            table: batch.table(self.table).unwrap_or_default().to_string(),
            position: self.txn.position(),
            commit_time_ms: self.txn.commit_time_ms,
            publish_time_ms: batch.publish_time_ms,
        }
    }
}

/// Why a change cannot go into a batch ([`BatchBuilder::push`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchEncodeError {
    /// A string longer than a `str16` holds.
    #[error("invalidation batch: {field} `{start}...` is {len} bytes, at most {max} fit", max = MAX_STR_BYTES)]
    TooLong {
        /// Which string.
        field: &'static str,
        /// Its first 64 characters.
        start: String,
        /// Its length, bytes.
        len: usize,
    },
    /// More tables or transactions than a batch holds ([`u16::MAX`] each).
    #[error("invalidation batch: more than {max} {what} in one batch")]
    TooMany {
        /// `tables` or `transactions`.
        what: &'static str,
        /// The limit.
        max: usize,
    },
}

fn check_len(field: &'static str, s: &str) -> Result<(), BatchEncodeError> {
    if s.len() > MAX_STR_BYTES {
        return Err(BatchEncodeError::TooLong { field, start: s.chars().take(64).collect(), len: s.len() });
    }
    Ok(())
}

/// Builds one batch payload: push changes (transactions in commit order), then
/// [`BatchBuilder::finish`]. Consecutive changes of one transaction (same position and commit
/// time) share one transaction entry; a change of another transaction starts a new entry (a
/// transaction pushed again later is listed twice: the batch stays valid).
#[derive(Debug, Default, Clone)]
pub struct BatchBuilder {
    tables: Vec<String>,
    /// Encoded transactions; `txn_open` is the byte offset of the open one's change count.
    body: Vec<u8>,
    txn_count: u16,
    /// (position and commit time the open transaction was pushed with, offset of its
    /// change_count, count).
    open: Option<(SourcePosition, u64, usize, u32)>,
    changes: usize,
}

impl BatchBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Key changes pushed so far.
    pub fn len(&self) -> usize {
        self.changes
    }

    /// True when no change was pushed.
    pub fn is_empty(&self) -> bool {
        self.changes == 0
    }

    /// Bytes the payload would have now (approximately: the table list as it is).
    pub fn encoded_len(&self) -> usize {
        HEADER + 4 + self.tables.iter().map(|t| 2 + t.len()).sum::<usize>() + self.body.len()
    }

    /// Add one key change of the transaction at `position`, committed at `commit_time_ms`.
    /// Errors: a key, table, file or GTID longer than [`MAX_STR_BYTES`], or more than
    /// 65,535 tables or transactions in the batch.
    pub fn push(
        &mut self,
        position: &SourcePosition,
        commit_time_ms: u64,
        op: Op,
        version: Version,
        table: &str,
        key: &str,
    ) -> Result<(), BatchEncodeError> {
        check_len("key", key)?;
        let t = match self.tables.iter().position(|x| x == table) {
            Some(t) => t,
            None => {
                check_len("table", table)?;
                if self.tables.len() >= u16::MAX as usize {
                    return Err(BatchEncodeError::TooMany { what: "tables", max: u16::MAX as usize });
                }
                self.tables.push(table.to_string());
                self.tables.len() - 1
            }
        };
        let same = self.open.as_ref().is_some_and(|(p, t, _, _)| p == position && *t == commit_time_ms);
        if !same {
            check_len("file", &position.file)?;
            check_len("gtid", position.gtid.as_deref().unwrap_or(""))?;
            if self.txn_count == u16::MAX {
                return Err(BatchEncodeError::TooMany { what: "transactions", max: u16::MAX as usize });
            }
            self.close_txn();
            self.body.extend_from_slice(&commit_time_ms.to_le_bytes());
            self.body.extend_from_slice(&position.pos.to_le_bytes());
            put_str(&mut self.body, &position.file);
            put_str(&mut self.body, position.gtid.as_deref().unwrap_or(""));
            let at = self.body.len();
            self.body.extend_from_slice(&0u32.to_le_bytes());
            self.open = Some((position.clone(), commit_time_ms, at, 0));
            self.txn_count += 1;
        }
        self.body.push(op_byte(op));
        self.body.extend_from_slice(&version.to_le_bytes());
        self.body.extend_from_slice(&(t as u16).to_le_bytes());
        put_str(&mut self.body, key);
        if let Some((_, _, _, n)) = &mut self.open {
            *n += 1;
        }
        self.changes += 1;
        Ok(())
    }

    fn close_txn(&mut self) {
        if let Some((_, _, at, n)) = self.open.take() {
            self.body[at..at + 4].copy_from_slice(&n.to_le_bytes());
        }
    }

    /// The payload, published at `publish_time_ms` (Unix ms). The builder is empty afterwards.
    pub fn finish(&mut self, publish_time_ms: u64) -> Vec<u8> {
        self.close_txn();
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(BATCH_FORMAT_VERSION);
        out.push(0);
        out.extend_from_slice(&publish_time_ms.to_le_bytes());
        out.extend_from_slice(&(self.tables.len() as u16).to_le_bytes());
        for t in &self.tables {
            put_str(&mut out, t);
        }
        out.extend_from_slice(&self.txn_count.to_le_bytes());
        out.extend_from_slice(&self.body);
        *self = BatchBuilder::default();
        out
    }
}

/// Append a `str16` (the caller checked the length).
fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The bytes a change takes in a batch besides its transaction: for sizing batches.
pub fn change_bytes(key: &str) -> usize {
    CHANGE_FIXED + key.len()
}

/// The bytes a transaction entry takes besides its changes.
pub fn txn_bytes(position: &SourcePosition) -> usize {
    TXN_FIXED + 4 + position.file.len() + position.gtid.as_ref().map_or(0, |g| g.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(file: &str, p: u64, gtid: Option<&str>) -> SourcePosition {
        SourcePosition { file: file.into(), pos: p, gtid: gtid.map(Into::into) }
    }

    fn sample() -> Vec<u8> {
        let mut b = BatchBuilder::new();
        let p1 = pos("mysql-bin.000003", 4711, Some("0-1-42"));
        let p2 = pos("mysql-bin.000003", 5000, None);
        b.push(&p1, 1_764_540_000_000, Op::Update, 42, "shop.items", "item:detail:1").unwrap();
        b.push(&p1, 1_764_540_000_000, Op::Insert, 42, "shop.tags", "tag:9").unwrap();
        b.push(&p2, 1_764_540_001_000, Op::Delete, 43, "shop.items", "item:detail:2").unwrap();
        b.push(&p2, 1_764_540_001_000, Op::Truncate, 43, "shop.items", "item:detail:{id}").unwrap();
        b.finish(1_764_540_001_012)
    }

    #[test]
    fn round_trip() {
        let bytes = sample();
        let v = BatchView::parse(&bytes).unwrap();
        assert_eq!((v.change_count, v.txn_count, v.publish_time_ms), (4, 2, 1_764_540_001_012));
        let evs = v.to_events();
        assert_eq!(evs.len(), 4);
        assert_eq!(evs[0].key, "item:detail:1");
        assert_eq!(evs[0].table, "shop.items");
        assert_eq!(evs[0].position, pos("mysql-bin.000003", 4711, Some("0-1-42")));
        assert_eq!(evs[1].table, "shop.tags");
        assert_eq!((evs[1].op, evs[1].version), (Op::Insert, 42));
        assert_eq!(evs[2].position.gtid, None);
        assert_eq!((evs[2].op, evs[2].commit_time_ms, evs[2].publish_time_ms), (Op::Delete, 1_764_540_001_000, 1_764_540_001_012));
        assert_eq!((evs[3].op, evs[3].key.as_str()), (Op::Truncate, "item:detail:{id}"));
        let keys: Vec<&str> = v.changes().map(|c| c.key).collect();
        assert_eq!(keys, ["item:detail:1", "tag:9", "item:detail:2", "item:detail:{id}"]);
        assert_eq!(v.table(2), None);
    }

    #[test]
    fn compact_next_to_json() {
        let mut b = BatchBuilder::new();
        let p = pos("mysql-bin.000003", 4711, Some("0-1-42"));
        let mut json = 0;
        for i in 0..100 {
            let key = format!("item:detail:{i}");
            b.push(&p, 1_764_540_000_000, Op::Update, 42, "shop.items", &key).unwrap();
            json += InvalidationEvent {
                schema: 1,
                key,
                version: 42,
                op: Op::Update,
                table: "shop.items".into(),
                position: p.clone(),
                commit_time_ms: 1_764_540_000_000,
                publish_time_ms: 1_764_540_000_012,
            }
            .to_json()
            .len();
        }
        let bin = b.finish(0).len();
        assert!(bin * 5 < json, "batch {bin} bytes, JSON {json} bytes");
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let bytes = sample();
        for n in 0..bytes.len() {
            assert!(BatchView::parse(&bytes[..n]).is_err(), "prefix of {n} bytes accepted");
        }
        for i in 0..bytes.len() {
            for x in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] = x;
                if let Ok(v) = BatchView::parse(&b) {
                    assert_eq!(v.changes().count(), v.change_count);
                }
            }
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(BatchView::parse(&extra), Err(BatchDecodeError::TrailingBytes { extra: 1, .. })));
        let mut newer = bytes;
        newer[0] = 2;
        assert!(matches!(BatchView::parse(&newer), Err(BatchDecodeError::UnknownFormat { found: 2, .. })));
    }

    #[test]
    fn too_long_a_key_is_refused() {
        let mut b = BatchBuilder::new();
        let long = "k".repeat(MAX_STR_BYTES + 1);
        let e = b.push(&pos("f", 4, None), 0, Op::Update, 1, "a.b", &long).unwrap_err();
        assert!(matches!(e, BatchEncodeError::TooLong { field: "key", .. }), "{e}");
        assert!(b.is_empty());
    }
}
