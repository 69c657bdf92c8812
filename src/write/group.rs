//! Groups of transactions, and large transactions in chunks: what the apply stage writes at once.
//!
//! # A group
//!
//! Applying one transaction at a time waits for Redis round trips per transaction (three on a
//! Cluster: read the tokens, write the replicas, move the tokens), so a busy source outruns
//! it. The apply stage therefore takes every committed transaction already read (bounded by
//! `apply.max_group_rows` decoded rows) as one [`Group`]:
//!
//! * each transaction's rows are decoded, checked (every key column in the row image) and
//!   mapped to key changes at the transaction's fence position;
//! * key changes are collapsed per key across the group: the newest change of each key wins
//!   ([`collapse_per_key_with`]). Writes are fenced and consumers evict by version, so the
//!   intermediate versions need neither be written nor published: a reader that cached an
//!   older one is evicted by the newest event, which has a higher version;
//! * the whole group is written with one pipeline per master per step and publishes one event
//!   per key; the checkpoint moves past the group's last transaction once every event of the
//!   group is acknowledged (I3).
//!
//! Invariants per key: I1 holds because each key's token moves only after all of its replicas
//! of the group are written; I2 because every write is fenced by its own transaction's
//! position. At low load a group is one transaction, so latency does not grow.
//!
//! A transaction with a table-wide DDL (TRUNCATE, DROP TABLE...) ends its group: the rows of
//! the transactions before it are written first, then its table invalidation, so a key the
//! group wrote before the statement is found (and marked stale) by the statement's scan.
//!
//! # A large transaction
//!
//! A transaction larger than a group (more than [`SMALL_TRANSACTION_BYTES`] of row events) is
//! applied alone, in chunks of whole row events, and is read twice from its held events
//! (`binlog::row_events`): first to learn the last change of every key ([`KeyIndex`]), then
//! to write only those, chunk by chunk. All of a transaction's changes share its fence
//! position, so a key changed twice must be written once, with its last value: a second
//! write at the same position would be refused by the fenced scripts, and a reader that
//! cached the first would never be evicted. The index keeps 16 bytes of hash and 4 of
//! position per distinct key (about 40 bytes with the table's overhead), not the keys: a
//! 1,000,000-row transaction needs about 40 MB for it, and one chunk of decoded rows.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use binval_protocol::{FencePosition, Op, SourcePosition};

use crate::binlog::decode::RowChange;
use crate::binlog::txn::Transaction;
use crate::error::{DefiniteError, Error};
use crate::mapping::{collapse_per_key, collapse_per_key_with, KeyChange, Mapper};
use crate::write::fence::FenceRule;

/// A transaction holding more row-event bytes than this is applied alone, in chunks (module
/// docs). Below it, it is decoded whole into a group.
pub const SMALL_TRANSACTION_BYTES: u64 = 256 << 10;

/// Committed transactions applied together (module docs).
#[derive(Default)]
pub struct Group {
    /// The transactions, in commit order.
    pub txns: Vec<Transaction>,
    /// One change per key (after [`Group::finish`]).
    pub changes: Vec<KeyChange>,
    /// Per change: its fence position and the index of its transaction in `txns`.
    pub tags: Vec<(FencePosition, u32)>,
    /// Rows decoded.
    pub rows: usize,
    /// Scratch buffers, kept between transactions.
    decoded: Vec<RowChange>,
    mapped: Vec<KeyChange>,
}

impl Group {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when it holds no transaction.
    pub fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// True when a transaction of it invalidates whole tables: it is the group's last.
    pub fn ends_with_ddl(&self) -> bool {
        self.txns.last().is_some_and(|t| !t.invalidate_tables.is_empty())
    }

    /// Add a committed transaction (decoded whole: callers write large ones in chunks,
    /// see "A large transaction" in the module docs).
    ///
    /// Errors: a row event that does not decode, a row image without a key column
    /// ([`DefiniteError::MappingBroken`]), a fence position that cannot be derived.
    pub fn add(&mut self, mut txn: Transaction, mapper: &Mapper, fence: &FenceRule) -> Result<(), Error> {
        self.decoded.clear();
        txn.rows.decode_all(&mut self.decoded).map_err(|e| decode_error(&txn.position, e))?;
        self.rows += self.decoded.len();
        check_key_columns(mapper, &txn.position, &self.decoded)?;
        self.mapped.clear();
        mapper.map_rows(&self.decoded, &mut self.mapped);
        self.decoded.clear();
        if !self.mapped.is_empty() {
            collapse_per_key(&mut self.mapped);
            let pos = fence.position(&txn.position)?;
            let t = self.txns.len() as u32;
            self.tags.extend(std::iter::repeat_n((pos, t), self.mapped.len()));
            self.changes.append(&mut self.mapped);
        }
        self.txns.push(txn);
        Ok(())
    }

    /// Collapse the changes per key across the group (the newest wins); call once, before
    /// writing.
    pub fn finish(&mut self) {
        collapse_per_key_with(&mut self.changes, &mut self.tags);
    }

    /// The fence positions of the changes, index for index.
    pub fn positions(&self) -> Vec<FencePosition> {
        self.tags.iter().map(|t| t.0).collect()
    }
}

/// The error of the held row events of the transaction ending at `txn_end`: a row event that
/// does not decode is definite (naming its position); a spill file that fails is transient
/// (the transaction is read again after a restart).
pub fn decode_error(txn_end: &SourcePosition, e: crate::binlog::row_events::RowEventsError) -> Error {
    use crate::binlog::row_events::RowEventsError;
    match e {
        RowEventsError::Decode { position, source } => DefiniteError::Decode { position, source }.into(),
        e @ RowEventsError::Spill { .. } => crate::error::TransientError::LocalDisk(format!("transaction ending at {txn_end}: {e}")).into(),
    }
}

/// Every row image of `rows` (of the transaction ending at `txn_end`) must carry the columns
/// the key templates of its table use: a dropped or renamed key column would silently stop
/// invalidation.
pub fn check_key_columns(mapper: &Mapper, txn_end: &SourcePosition, rows: &[RowChange]) -> Result<(), Error> {
    let Some((table, missing)) = mapper.missing_key_columns(rows) else { return Ok(()) };
    Err(DefiniteError::MappingBroken {
        table,
        position: txn_end.to_string(),
        message: format!(
            "key column(s) {} are not in the row image (renamed or dropped by ALTER TABLE, or a session wrote a MINIMAL/NOBLOB row image): its keys would no longer be written or invalidated. Change the mapping's keys (or the writer's binlog_row_image), then restart",
            missing.join(", ")
        ),
    }
    .into())
}

/// Which changes of a large transaction to write: the last change of each key (module docs),
/// found without holding every key.
///
/// Pass 1 ([`KeyIndex::record`]) puts a 64-bit hash of every key into a Bloom filter
/// (fastbloom, 1% false positives) and keeps the hashes it had seen before: keys that may
/// repeat. Most large transactions (`INSERT ... SELECT`, a bulk `UPDATE`) change each key once,
/// and then nothing else is kept: about 10 bits per key. Otherwise pass 1b
/// ([`KeyIndex::record_repeated`]) reads the transaction again and keeps, for the keys whose
/// hash may repeat (true repeats and the filter's false positives), the key itself with the
/// number of its last change and whether its first was an insert: exact, whatever the hashes
/// do. Pass 2 ([`KeyIndex::keep_last`]) writes every change of a key that does not repeat, and
/// only the last one of a key that does.
pub struct KeyIndex {
    seen: fastbloom::BloomFilter,
    maybe_repeated: std::collections::HashSet<u64, foldhash::fast::FixedState>,
    last: HashMap<String, (u32, bool)>,
    changes: u32,
}

/// A 64-bit hash of `key` (fixed seed: the same in every pass).
fn key_hash(key: &str) -> u64 {
    let mut s = foldhash::quality::FixedState::with_seed(0x9e37_79b9_7f4a_7c15).build_hasher();
    s.write(key.as_bytes());
    s.finish()
}

impl KeyIndex {
    /// An index sized for about `expected_keys` keys (more only raise the false-positive rate,
    /// never the error: see the type's docs).
    pub fn new(expected_keys: usize) -> Self {
        KeyIndex {
            seen: fastbloom::BloomFilter::with_false_pos(0.01).expected_items(expected_keys.max(1024)),
            maybe_repeated: Default::default(),
            last: HashMap::new(),
            changes: 0,
        }
    }

    /// Pass 1: record the changes of the next chunk. Errors when a transaction has more than
    /// 2^32 key changes.
    pub fn record(&mut self, changes: &[KeyChange]) -> Result<(), Error> {
        for c in changes {
            self.changes = self
                .changes
                .checked_add(1)
                .ok_or_else(|| DefiniteError::UnsupportedEvent("a transaction with more than 2^32 key changes".into()))?;
            let h = key_hash(&c.key);
            // `insert_hash` answers whether the hash may have been in the filter already.
            if self.seen.insert_hash(h) {
                self.maybe_repeated.insert(h);
            }
        }
        Ok(())
    }

    /// Key changes recorded in pass 1.
    pub fn changes(&self) -> u32 {
        self.changes
    }

    /// Some key may change more than once: pass 1b is needed.
    pub fn may_repeat(&self) -> bool {
        !self.maybe_repeated.is_empty()
    }

    /// Pass 1b: for the keys that may repeat, the number of their last change (chunks in the
    /// same order as in pass 1; `seen` counts the changes of the chunks before).
    pub fn record_repeated(&mut self, changes: &[KeyChange], seen: &mut u32) {
        for c in changes {
            let me = *seen;
            *seen += 1;
            if self.maybe_repeated.contains(&key_hash(&c.key)) {
                self.last.entry(c.key.clone()).and_modify(|e| e.0 = me).or_insert((me, c.op == Op::Insert));
            }
        }
    }

    /// Keys that may repeat, and how many of them really do change more than once (after pass
    /// 1b).
    pub fn repeated(&self) -> usize {
        self.last.len()
    }

    /// Pass 2: keep, in the next chunk's `changes`, every change of a key that does not repeat
    /// and only the last one of a key that does, with the op rule of [`collapse_per_key`].
    /// `seen` counts the changes of the chunks before.
    pub fn keep_last(&self, changes: &mut Vec<KeyChange>, seen: &mut u32) {
        let mut n = *seen;
        changes.retain_mut(|c| {
            let me = n;
            n += 1;
            if self.last.is_empty() {
                return true;
            }
            match self.last.get(&c.key) {
                None => true,
                Some(&(last, first_insert)) if last == me => {
                    if first_insert && c.op == Op::Update {
                        c.op = Op::Insert;
                    }
                    true
                }
                Some(_) => false,
            }
        });
        *seen = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ch(key: &str, op: Op, payload: &str) -> KeyChange {
        KeyChange { key: key.into(), op, table: Arc::from("db.t"), payload: Some(payload.into()), replicas: 1, count: 1, ttl_secs: 0 }
    }

    /// Chunked, the index keeps exactly what one collapse of the whole transaction keeps.
    #[test]
    fn key_index_matches_a_whole_collapse() {
        let run = |all: &[KeyChange], chunk: usize| {
            let mut index = KeyIndex::new(all.len());
            for c in all.chunks(chunk) {
                index.record(c).unwrap();
            }
            let mut seen = 0;
            if index.may_repeat() {
                for c in all.chunks(chunk) {
                    index.record_repeated(c, &mut seen);
                }
            }
            let mut kept = Vec::new();
            let mut seen = 0;
            for c in all.chunks(chunk) {
                let mut c = c.to_vec();
                index.keep_last(&mut c, &mut seen);
                kept.extend(c);
            }
            kept
        };
        let all = vec![
            ch("a", Op::Insert, "1"),
            ch("b", Op::Update, "x"),
            ch("a", Op::Update, "2"),
            ch("c", Op::Update, "y"),
            ch("c", Op::Delete, ""),
            ch("a", Op::Update, "3"),
            ch("d", Op::Delete, ""),
        ];
        let key_op = |v: &[KeyChange]| {
            let mut x: Vec<(String, Op, Option<String>)> = v.iter().map(|c| (c.key.clone(), c.op, c.payload.clone())).collect();
            x.sort_by(|a, b| a.0.cmp(&b.0));
            x
        };
        let mut whole = all.clone();
        collapse_per_key(&mut whole);
        for chunk in 1..=all.len() {
            assert_eq!(key_op(&run(&all, chunk)), key_op(&whole), "chunks of {chunk}");
        }
        // 200,000 keys, a few changed twice: the filter's false positives (about 1%) are
        // tracked exactly, so only the true repeats collapse.
        let mut many: Vec<KeyChange> = (0..200_000).map(|i| ch(&format!("k{i}"), Op::Insert, "1")).collect();
        many.extend((0..50).map(|i| ch(&format!("k{}", i * 997), Op::Update, "2")));
        let mut whole = many.clone();
        collapse_per_key(&mut whole);
        assert_eq!(whole.len(), 200_000);
        assert_eq!(key_op(&run(&many, 4096)), key_op(&whole));
        // No repeats at all: nothing beyond the filter is kept.
        let once: Vec<KeyChange> = (0..10_000).map(|i| ch(&format!("u{i}"), Op::Insert, "1")).collect();
        let mut index = KeyIndex::new(10_000);
        index.record(&once).unwrap();
        assert!(index.maybe_repeated.len() < 500, "{} false positives", index.maybe_repeated.len());
    }

    #[test]
    fn group_collapse_keeps_the_newest_change_and_its_tag() {
        let mut changes = vec![ch("a", Op::Insert, "1"), ch("b", Op::Update, "x"), ch("a", Op::Update, "2")];
        let mut tags = vec![(FencePosition(10), 0u32), (FencePosition(10), 0), (FencePosition(11), 1)];
        collapse_per_key_with(&mut changes, &mut tags);
        let got: Vec<(&str, Op, &str, u64, u32)> =
            changes.iter().zip(&tags).map(|(c, t)| (c.key.as_str(), c.op, c.payload.as_deref().unwrap(), t.0 .0, t.1)).collect();
        assert_eq!(got, vec![("b", Op::Update, "x", 10, 0), ("a", Op::Insert, "2", 11, 1)]);
    }
}
