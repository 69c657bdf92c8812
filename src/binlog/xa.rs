//! Two-phase XA transactions: their changes held from `XA PREPARE` until `XA COMMIT` (then
//! applied) or `XA ROLLBACK` (then dropped).
//!
//! # What the binlog holds
//!
//! MySQL and MariaDB write a prepared XA transaction as an event group of its own that ends
//! with an XA_PREPARE event instead of a commit: `GTID`, `XA START xid`, TABLE_MAPs and row
//! events, `XA END xid`, `XA_PREPARE(xid)`. Its changes are not visible yet. Later (any time:
//! a prepared XA transaction survives its session and even a server restart) a second group
//! decides: `GTID`, `XA COMMIT xid` (the changes become visible now) or `XA ROLLBACK xid`
//! (they never do). Other transactions commit in between; they cannot touch the prepared
//! transaction's rows (it keeps its row locks and metadata locks), so applying its changes at
//! the `XA COMMIT`'s place in the binlog, with that group's GTID and position as their fence
//! position, orders them exactly as readers of the database see them. `XA COMMIT ... ONE
//! PHASE` needs none of this: it is an ordinary commit.
//!
//! # Held until decided
//!
//! At the XA PREPARE, the reader moves the group's row events of mapped tables (raw, as any
//! open transaction's: [`RowEvents`], spilled to a temporary file past the memory limit) into
//! [`PreparedXas`], keyed by the XID, and passes on an empty transaction (its GTID and position
//! move on). Held transactions together keep at most `source.transaction_memory_mb` in memory:
//! one that would go beyond is moved to its spill file whole. At the XA COMMIT the held events
//! become the row events of the XA COMMIT's transaction; at the XA ROLLBACK they are dropped.
//! A held transaction lives as long as the reader: across reconnects of the replica
//! connection, not across restarts (see below).
//!
//! # Restarts
//!
//! A restart resumes from the checkpoint and reads the binlog from there: it must see the XA
//! PREPARE of every transaction still held, or its changes would be lost at its XA COMMIT. So
//! while one is held, the checkpoint does not move past it: every transaction the reader
//! passes on carries the start of the oldest held one ([`XaCheckpoint::hold`]: its GTID
//! event), and the checkpoint saves *that* as its position, with the position actually
//! applied beside it ([`XaCheckpoint::applied`]). The transactions in between are applied
//! again after a restart: fenced writes make that a no-op in Redis (their events are
//! published again with the same versions, which consumers ignore). A prepared transaction
//! left undecided for long therefore keeps the checkpoint (and the binlog files the server
//! must keep for a restart) at its XA PREPARE: `XA RECOVER` on the server lists them.
//!
//! The checkpoint also lists the XIDs prepared and not decided yet ([`XaCheckpoint::open`],
//! with or without changes of mapped tables), so that after a restart an `XA COMMIT` can be
//! told apart: held (read again from the checkpoint), known (prepared before the checkpoint
//! with nothing of a mapped table, or decided before the position applied), or prepared
//! before binval started reading at all (`source.start`, `binval replay --from` after its XA
//! PREPARE): then its changes, if it had any of mapped tables, are not in the binlog binval
//! read, and a warning names it (replay from before its XA PREPARE to apply it).

use std::collections::{BTreeMap, BTreeSet};

use binval_protocol::{BinlogPosition, SourcePosition};
use serde::{Deserialize, Serialize};

use crate::binlog::row_events::{RowEvents, RowEventsError, SpillSettings};

/// An XA transaction id: format id, global transaction id and branch qualifier (MySQL's and
/// MariaDB's `XID`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Xid {
    /// `formatID` (1 unless given).
    pub format_id: i64,
    /// `gtrid`, up to 64 bytes.
    pub gtrid: Vec<u8>,
    /// `bqual`, up to 64 bytes.
    pub bqual: Vec<u8>,
}

impl std::fmt::Display for Xid {
    /// As the servers write it in the binlog: `X'6131',X'',1`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        write!(f, "X'{}',X'{}',{}", hex(&self.gtrid), hex(&self.bqual), self.format_id)
    }
}

impl Xid {
    /// The XID of an XA_PREPARE event body: `one_phase` (1 byte), `formatID` (4 bytes LE),
    /// `gtrid_length`, `bqual_length` (4 bytes LE each), then the gtrid and bqual bytes
    /// (`XA_prepare_log_event` in MySQL's and MariaDB's log_event.cc). `None` when short.
    pub fn from_prepare_event(body: &[u8]) -> Option<Xid> {
        let word = |i: usize| body.get(i..i + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let format_id = word(1)? as i32 as i64;
        let (g, b) = (word(5)? as usize, word(9)? as usize);
        let data = body.get(13..13 + g + b)?;
        Some(Xid { format_id, gtrid: data[..g].to_vec(), bqual: data[g..].to_vec() })
    }

    /// The XID of the text of an `XA COMMIT` / `XA ROLLBACK` statement after its keywords:
    /// `gtrid[, bqual[, formatID]]`, each string as the servers write it (`X'6131'`) or
    /// quoted (`'a1'`), `formatID` a number. `None` when it is not that.
    pub fn parse_statement(text: &str) -> Option<Xid> {
        let mut parts = Vec::new();
        let mut rest = text.trim_start();
        loop {
            let (value, after) = xid_part(rest)?;
            parts.push(value);
            rest = after.trim_start();
            match rest.strip_prefix(',') {
                Some(r) if parts.len() < 3 => rest = r.trim_start(),
                _ => break,
            }
        }
        let mut it = parts.into_iter();
        let gtrid = it.next()?.bytes()?;
        let bqual = match it.next() {
            Some(p) => p.bytes()?,
            None => Vec::new(),
        };
        let format_id = match it.next() {
            Some(Part::Number(n)) => n,
            Some(_) => return None,
            None => 1,
        };
        Some(Xid { format_id, gtrid, bqual })
    }
}

/// One comma-separated part of an XID in a statement.
enum Part {
    Bytes(Vec<u8>),
    Number(i64),
}

impl Part {
    fn bytes(self) -> Option<Vec<u8>> {
        match self {
            Part::Bytes(b) => Some(b),
            Part::Number(_) => None,
        }
    }
}

/// The XID part at the start of `s`, and what follows it.
fn xid_part(s: &str) -> Option<(Part, &str)> {
    if let Some(r) = s.strip_prefix("X'").or_else(|| s.strip_prefix("x'")) {
        let end = r.find('\'')?;
        let hex = &r[..end];
        if hex.len() % 2 != 0 {
            return None;
        }
        let bytes = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect::<Option<Vec<u8>>>()?;
        return Some((Part::Bytes(bytes), &r[end + 1..]));
    }
    if let Some(r) = s.strip_prefix('\'') {
        let mut out = Vec::new();
        let mut chars = r.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c == '\'' {
                if chars.peek().map(|x| x.1) == Some('\'') {
                    chars.next();
                    out.push(b'\'');
                    continue;
                }
                return Some((Part::Bytes(out), &r[i + 1..]));
            }
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
        return None;
    }
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(s.len());
    let n: i64 = s[..end].parse().ok()?;
    Some((Part::Number(n), &s[end..]))
}

/// What the checkpoint keeps of XA transactions prepared and not decided (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XaCheckpoint {
    /// XIDs prepared and not yet committed or rolled back (as [`Xid`]'s `Display`), with or
    /// without changes of mapped tables.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub open: BTreeSet<String>,
    /// Where the oldest held XA transaction (one with changes of mapped tables) begins: its
    /// GTID event. A restart must read from there, so the checkpoint's position is this (not
    /// saved on its own: it is the checkpoint's `file`/`pos`).
    #[serde(skip)]
    pub hold: Option<SourcePosition>,
    /// In a saved checkpoint whose position is held back: the end of the last transaction the
    /// run had applied. An `XA COMMIT` up to here whose XID is unknown after a restart was
    /// applied before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<SourcePosition>,
}

impl XaCheckpoint {
    /// Nothing prepared, nothing held.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.hold.is_none() && self.applied.is_none()
    }
}

/// A held XA transaction: where its event group begins, and its row events of mapped tables.
#[derive(Debug)]
struct Held {
    start: SourcePosition,
    rows: RowEvents,
}

/// What an `XA COMMIT` found ([`PreparedXas::commit`]).
#[derive(Debug)]
pub enum Decided {
    /// Its held row events: apply them as the XA COMMIT's transaction.
    Held(RowEvents),
    /// Prepared with no change of a mapped table, or decided before the position a restart
    /// knows was applied: nothing to do.
    Known,
    /// Never seen prepared: its XA PREPARE lies before where binval started reading.
    Unknown,
}

/// The prepared XA transactions the reader holds (module docs), and what the checkpoint
/// keeps of them.
#[derive(Debug, Default)]
pub struct PreparedXas {
    held: BTreeMap<Xid, Held>,
    state: XaCheckpoint,
    changed: bool,
}

impl PreparedXas {
    /// Start from what a checkpoint saved (`open`, `applied`; the held transactions are read
    /// again from the checkpoint's position).
    pub fn from_checkpoint(saved: &XaCheckpoint) -> Self {
        PreparedXas { held: BTreeMap::new(), state: XaCheckpoint { hold: None, ..saved.clone() }, changed: false }
    }

    /// XA PREPARE of `xid`: hold `rows` (its row events of mapped tables, from the group that
    /// began at `start`), or only remember it as open when it has none. Held transactions
    /// beyond `settings.memory_bytes` in memory together go to their spill file.
    ///
    /// Errors: the spill file could not be written.
    pub fn prepare(
        &mut self,
        xid: Xid,
        start: SourcePosition,
        mut rows: RowEvents,
        settings: &SpillSettings,
    ) -> Result<(), RowEventsError> {
        self.state.open.insert(xid.to_string());
        self.changed = true;
        if rows.is_empty() {
            // Read again after a reconnect: whatever was held under it is replaced.
            self.held.remove(&xid);
        } else {
            let in_memory: usize = self.held.iter().filter(|(x, _)| **x != xid).map(|(_, h)| h.rows.memory_bytes()).sum();
            if in_memory + rows.memory_bytes() > settings.memory_bytes {
                rows.move_to_disk(settings)?;
            }
            self.held.insert(xid, Held { start, rows });
        }
        self.update_hold();
        Ok(())
    }

    /// XA COMMIT of `xid` at `at` (the end of its event): what was held, if anything.
    pub fn commit(&mut self, xid: &Xid, at: &SourcePosition) -> Decided {
        let was_open = self.state.open.remove(&xid.to_string());
        self.changed |= was_open;
        let held = self.held.remove(xid);
        self.update_hold();
        match held {
            Some(h) => Decided::Held(h.rows),
            None if was_open => Decided::Known,
            None if self
                .state
                .applied
                .as_ref()
                .is_some_and(|a| BinlogPosition::from(at).order_key() <= BinlogPosition::from(a).order_key()) =>
            {
                Decided::Known
            }
            None => Decided::Unknown,
        }
    }

    /// XA ROLLBACK of `xid`: whatever was held is dropped.
    pub fn rollback(&mut self, xid: &Xid) {
        self.changed |= self.state.open.remove(&xid.to_string());
        self.held.remove(xid);
        self.update_hold();
    }

    /// Transactions held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The state for the checkpoint when it changed since the last call.
    pub fn take_changed(&mut self) -> Option<XaCheckpoint> {
        std::mem::take(&mut self.changed).then(|| self.state.clone())
    }

    /// `hold` = the start of the oldest held transaction.
    fn update_hold(&mut self) {
        let hold = self.held.values().map(|h| &h.start).min_by_key(|p| BinlogPosition::from(*p).order_key()).cloned();
        if hold != self.state.hold {
            self.state.hold = hold;
            self.changed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xids_from_events_and_statements_agree() {
        let mut body = vec![0u8];
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&2u32.to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(b"a1z");
        let x = Xid::from_prepare_event(&body).unwrap();
        assert_eq!(x.to_string(), "X'6131',X'7a',1");
        assert_eq!(Xid::parse_statement(" X'6131',X'7a',1").unwrap(), x);
        assert_eq!(Xid::parse_statement("'a1','z'").unwrap(), x);
        assert_eq!(Xid::parse_statement("'a1'").unwrap().to_string(), "X'6131',X'',1");
        assert_eq!(Xid::parse_statement("X'6131',X'',7 ONE PHASE").unwrap().format_id, 7);
        assert_eq!(Xid::parse_statement("'it''s'").unwrap().gtrid, b"it's".to_vec());
        assert!(Xid::parse_statement("nonsense").is_none());
        assert!(Xid::from_prepare_event(&body[..15]).is_none());
    }

    #[test]
    fn the_oldest_held_transaction_holds_the_checkpoint() {
        use crate::binlog::row_events::tests::sample_row_events;
        let (schema, events) = sample_row_events();
        let rows = |n: usize| {
            let mut r = RowEvents::new();
            for e in events.iter().take(n) {
                r.push(&schema, "f", 9, e.clone(), &SpillSettings::default()).unwrap();
            }
            r
        };
        let pos = |p: u64| SourcePosition { file: "mysql-bin.000002".into(), pos: p, gtid: None };
        let x = |s: &str| Xid::parse_statement(s).unwrap();
        let mut p = PreparedXas::default();
        p.prepare(x("'a'"), pos(100), rows(1), &SpillSettings::default()).unwrap();
        p.prepare(x("'b'"), pos(200), rows(2), &SpillSettings::default()).unwrap();
        p.prepare(x("'c'"), pos(300), RowEvents::new(), &SpillSettings::default()).unwrap();
        let s = p.take_changed().unwrap();
        assert_eq!((s.hold, s.open.len()), (Some(pos(100)), 3));
        assert!(p.take_changed().is_none());
        assert!(matches!(p.commit(&x("'b'"), &pos(400)), Decided::Held(r) if r.events() == 2));
        assert_eq!(p.take_changed().unwrap().hold, Some(pos(100)));
        p.rollback(&x("'a'"));
        assert_eq!(p.take_changed().unwrap().hold, None, "nothing held: the checkpoint moves freely");
        assert!(matches!(p.commit(&x("'c'"), &pos(500)), Decided::Known), "prepared without mapped rows");
        assert!(matches!(p.commit(&x("'d'"), &pos(600)), Decided::Unknown));
        // After a restart: XIDs the checkpoint knew, and decisions up to the applied position.
        let saved = XaCheckpoint { open: [x("'e'").to_string()].into(), hold: None, applied: Some(pos(700)) };
        let mut p = PreparedXas::from_checkpoint(&saved);
        assert!(matches!(p.commit(&x("'e'"), &pos(800)), Decided::Known));
        assert!(matches!(p.commit(&x("'f'"), &pos(650)), Decided::Known), "decided before the position applied");
        assert!(matches!(p.commit(&x("'g'"), &pos(900)), Decided::Unknown));
    }

    #[test]
    fn held_transactions_beyond_the_memory_limit_go_to_disk() {
        use crate::binlog::row_events::tests::sample_row_events;
        let (schema, events) = sample_row_events();
        let dir = tempfile::tempdir().unwrap();
        let small = SpillSettings { memory_bytes: events[0].data().len() * 2, dir: Some(dir.path().to_path_buf()) };
        let mut p = PreparedXas::default();
        for (i, name) in ["'a'", "'b'"].iter().enumerate() {
            let mut r = RowEvents::new();
            r.push(&schema, "f", 9, events[i].clone(), &SpillSettings::default()).unwrap();
            r.push(&schema, "f", 9, events[i].clone(), &SpillSettings::default()).unwrap();
            p.prepare(Xid::parse_statement(name).unwrap(), SourcePosition::default(), r, &small).unwrap();
        }
        let in_memory: usize = p.held.values().map(|h| h.rows.memory_bytes()).sum();
        assert!(in_memory <= small.memory_bytes, "{in_memory} bytes held in memory");
        assert!(p.held.values().any(|h| h.rows.spilled()));
        let Decided::Held(mut r) = p.commit(&Xid::parse_statement("'b'").unwrap(), &SourcePosition::default()) else { panic!() };
        let mut out = Vec::new();
        r.decode_all(&mut out).unwrap();
        assert!(!out.is_empty(), "spilled events decode");
    }
}
