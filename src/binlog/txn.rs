//! Transaction stage: groups decoded row changes by transaction and passes a transaction on
//! only when its commit (XID event, or a `COMMIT` query for non-transactional tables) has been
//! read. A transaction cut short by a dropped connection is discarded; the source resumes at
//! the end of the last complete one, so its rows are read again.
//!
//! The row events of the open transaction are held raw ([`RowEvents`]: in memory up to a limit,
//! then in a temporary file) and decoded only after its commit, by the apply stage, in chunks.
//!
//! Boundaries: MariaDB starts a transaction with its GTID event (type 162) — with the
//! `FL_STANDALONE` flag, the group is a single statement (DDL) with no commit event; MySQL
//! writes a GTID (33) or ANONYMOUS_GTID (34) event, then a `BEGIN` query.

use std::sync::Arc;

use binval_protocol::SourcePosition;
use mysql_common::binlog::events::Event;

use crate::binlog::decode::TableSchema;
use crate::binlog::row_events::{RowEvents, RowEventsError, SpillSettings};

/// A committed transaction, in binlog commit order.
#[derive(Debug, Default)]
pub struct Transaction {
    /// Position just after the commit event: where a restart resumes.
    pub position: SourcePosition,
    /// Commit time, Unix ms (see [`Transaction::read_live`]): MySQL 8's
    /// `original_commit_timestamp` (µs, in its GTID event) when the source writes one; else the
    /// commit event header's, whole seconds, which the live reader sharpens to the millisecond
    /// it read the commit at.
    pub commit_time_ms: u64,
    /// `commit_time_ms` came from the source's own commit timestamp (MySQL 8), not the header.
    pub commit_time_exact: bool,
    /// Row events of mapped tables, in binlog order, not decoded yet. Empty for transactions
    /// that touched no mapped table; they still move the checkpoint.
    pub rows: RowEvents,
    /// Mapped tables (`schema.table`) whose rows a DDL statement removed or swapped without
    /// row events (TRUNCATE, DROP TABLE, partition TRUNCATE/DROP/EXCHANGE): every cached key
    /// of them must be invalidated. Empty for ordinary transactions.
    pub invalidate_tables: Vec<String>,
    /// After a RENAME of a mapped table: the renamed-table state as of this transaction, for
    /// the checkpoint. `None` when unchanged.
    pub table_names: Option<Arc<crate::mapping::TableNames>>,
    /// After a DDL statement changed what the reader knows of the mapped tables' MariaDB JSON
    /// columns: all of it as of this transaction, for the checkpoint. `None` when unchanged.
    pub json_columns: Option<Arc<crate::binlog::json_columns::JsonColumns>>,
    /// After an XA PREPARE, COMMIT or ROLLBACK: what the checkpoint keeps of prepared XA
    /// transactions as of this transaction (`binlog::xa`). `None` when unchanged.
    pub xa: Option<Arc<crate::binlog::xa::XaCheckpoint>>,
    /// MySQL: the GTID set of the PREVIOUS_GTIDS event at the start of the binlog file this
    /// transaction is in, when the reader read one since the transaction before (every GTID
    /// before the file: with it the checkpoint's GTID set is whole, see
    /// `ha::checkpoint::GtidState`). `None` otherwise.
    pub gtid_previous: Option<Arc<binval_protocol::MysqlGtidSet>>,
    /// The transaction is binval's own heartbeat row (`source.heartbeat_table`): the primary's
    /// `NOW(6)` it wrote, Unix µs. It gives the lag sub-second precision (binlog headers carry
    /// whole seconds).
    pub heartbeat_us: Option<u64>,
    /// Its share of the memory budget of transactions read but not applied yet (see
    /// `pipeline`); released when the transaction is dropped.
    pub budget: Option<tokio::sync::OwnedSemaphorePermit>,
    /// When the live reader passed it on (`None` for transactions from elsewhere: a binlog
    /// file, a test). The apply loop's linger measures the source's commit rate by it, since
    /// it takes the transactions of a linger window from the channel at once
    /// (`write::apply::Linger`).
    pub read_at: Option<std::time::Instant>,
}

impl Transaction {
    /// The live reader read this transaction's commit at `read_ms` (Unix ms): give the commit
    /// time the millisecond, which invalidation events carry so that app instances can count
    /// how many invalidations they applied within 50/200/1000 ms of the commit.
    ///
    /// Binlog event headers carry whole seconds (MariaDB, MySQL before 8.0.1). The primary
    /// sends a replica each event as soon as it is in the binlog (before the engine commit
    /// returns to the client), so when binval keeps up it reads the commit within a millisecond
    /// or so of it, and the read time is the estimate, capped at the end of the header's
    /// second. When binval reads behind (the read is over a second past the header's second:
    /// a catch-up, a restart), the read time says nothing of the commit and the header's second
    /// stays. MySQL 8's own timestamp (`commit_time_exact`) is kept as it is.
    ///
    /// ```
    /// use binval::binlog::txn::Transaction;
    /// let mut t = Transaction { commit_time_ms: 1_764_000_000_000, ..Transaction::default() };
    /// t.read_live(1_764_000_000_412);
    /// assert_eq!(t.commit_time_ms, 1_764_000_000_412);
    /// let mut late = Transaction { commit_time_ms: 1_764_000_000_000, ..Transaction::default() };
    /// late.read_live(1_764_000_000_950 + 1_000);
    /// assert_eq!(late.commit_time_ms, 1_764_000_000_999, "read in the next second: the end of the header's");
    /// let mut behind = Transaction { commit_time_ms: 1_764_000_000_000, ..Transaction::default() };
    /// behind.read_live(1_764_000_005_000);
    /// assert_eq!(behind.commit_time_ms, 1_764_000_000_000, "read behind: the header's second");
    /// ```
    pub fn read_live(&mut self, read_ms: u64) {
        let header_ms = self.commit_time_ms;
        if self.commit_time_exact || header_ms == 0 || read_ms < header_ms || read_ms >= header_ms + 2_000 {
            return;
        }
        self.commit_time_ms = read_ms.min(header_ms + 999);
    }

    /// The invalidation event of one key change of this transaction (its position and commit
    /// time; published now).
    pub fn event(&self, key: &str, version: u64, op: binval_protocol::Op, table: &str) -> binval_protocol::InvalidationEvent {
        binval_protocol::InvalidationEvent {
            schema: binval_protocol::EVENT_SCHEMA_VERSION,
            key: key.to_string(),
            version,
            op,
            table: table.to_string(),
            position: self.position.clone(),
            commit_time_ms: self.commit_time_ms,
            publish_time_ms: crate::now_ms(),
        }
    }
}

/// What the assembler was told about an event.
#[derive(Debug)]
pub enum Boundary {
    /// A transaction starts (GTID event or `BEGIN`). `standalone`: MariaDB FL_STANDALONE, the next
    /// statement is the whole group.
    Begin { gtid: Option<String>, standalone: bool },
    /// Commit read (XID or `COMMIT`), with the end position and header time (s).
    Commit { end: SourcePosition, timestamp_s: u32 },
    /// `ROLLBACK` query: drop what was collected.
    Rollback,
    /// A statement outside any transaction (DDL) ended at `end`; `invalidate_tables`: mapped
    /// tables whose every key it makes stale.
    Statement { end: SourcePosition, timestamp_s: u32, invalidate_tables: Vec<String> },
}

/// Collects row changes of the open transaction.
#[derive(Debug, Default)]
pub struct Assembler {
    open: bool,
    standalone: bool,
    gtid: Option<String>,
    rows: RowEvents,
    spill: SpillSettings,
    heartbeat_us: Option<u64>,
    commit_us: Option<u64>,
}

impl Assembler {
    /// An assembler with no open transaction; row events beyond `spill.memory_bytes` per
    /// transaction go to a temporary file.
    pub fn new(spill: SpillSettings) -> Self {
        Assembler { spill, ..Self::default() }
    }

    /// Add a row event of a mapped table (`schema`), read in binlog file `file` from the event
    /// ending at `end_pos`, to the open transaction (row events outside one are kept too:
    /// MySQL 5.x binlogs may carry row events for non-transactional tables between BEGIN/COMMIT
    /// only). Errors when the spill file fails.
    pub fn push_rows(&mut self, schema: &Arc<TableSchema>, file: &str, end_pos: u32, event: Event) -> Result<(), RowEventsError> {
        self.rows.push(schema, file, end_pos, event, &self.spill)
    }

    /// The open transaction's source commit timestamp, Unix µs (MySQL 8's GTID event).
    pub fn commit_timestamp(&mut self, us: u64) {
        self.commit_us = Some(us);
    }

    /// The open transaction is binval's heartbeat row written at `now_us` (Unix µs).
    pub fn heartbeat(&mut self, now_us: u64) {
        self.heartbeat_us = Some(now_us);
    }

    /// Row events held right now.
    pub fn held_events(&self) -> u64 {
        self.rows.events()
    }

    /// Take the row events of the open transaction (an XA PREPARE hands them to
    /// `binlog::xa`); it goes on with none.
    pub fn take_rows(&mut self) -> RowEvents {
        std::mem::take(&mut self.rows)
    }

    /// The open transaction's row events are `rows` (an XA COMMIT gets back what its XA
    /// PREPARE held).
    pub fn set_rows(&mut self, rows: RowEvents) {
        self.rows = rows;
    }

    /// True inside a transaction.
    pub fn in_transaction(&self) -> bool {
        self.open
    }

    /// Feed a boundary; returns a finished transaction on commit or on the end of a
    /// standalone statement.
    pub fn boundary(&mut self, b: Boundary) -> Option<Transaction> {
        match b {
            Boundary::Begin { gtid, standalone } => {
                if gtid.is_some() || !self.open {
                    // A new event group: nothing held from an earlier, unterminated group
                    // (an XA PREPARE, a cut stream) may leak into it.
                    self.rows = RowEvents::new();
                    self.heartbeat_us = None;
                    self.commit_us = None;
                }
                if gtid.is_some() {
                    self.gtid = gtid;
                }
                self.open = true;
                self.standalone = standalone;
                None
            }
            Boundary::Rollback => {
                self.reset();
                None
            }
            Boundary::Commit { end, timestamp_s } => Some(self.finish(end, timestamp_s)),
            Boundary::Statement { end, timestamp_s, invalidate_tables } => {
                if self.open && !self.standalone {
                    // A statement inside a transaction (e.g. SAVEPOINT): not a boundary.
                    return None;
                }
                let mut t = self.finish(end, timestamp_s);
                t.invalidate_tables = invalidate_tables;
                Some(t)
            }
        }
    }

    /// Forget a partial transaction (after a dropped connection).
    pub fn reset(&mut self) {
        self.open = false;
        self.standalone = false;
        self.gtid = None;
        self.rows = RowEvents::new();
        self.heartbeat_us = None;
        self.commit_us = None;
    }

    fn finish(&mut self, mut end: SourcePosition, timestamp_s: u32) -> Transaction {
        end.gtid = self.gtid.take();
        let rows = std::mem::take(&mut self.rows);
        self.open = false;
        self.standalone = false;
        let commit_us = self.commit_us.take();
        Transaction {
            position: end,
            commit_time_ms: commit_us.map_or(timestamp_s as u64 * 1000, |us| us / 1000),
            commit_time_exact: commit_us.is_some(),
            rows,
            heartbeat_us: self.heartbeat_us.take(),
            ..Transaction::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::row_events::tests::sample_row_events;

    fn pos(p: u64) -> SourcePosition {
        SourcePosition { file: "f".into(), pos: p, gtid: None }
    }

    #[test]
    fn commit_passes_rows_on() {
        let (schema, events) = sample_row_events();
        let mut a = Assembler::new(SpillSettings::default());
        assert!(a.boundary(Boundary::Begin { gtid: Some("0-1-5".into()), standalone: false }).is_none());
        for e in events.into_iter().take(2) {
            a.push_rows(&schema, "f", 7, e).unwrap();
        }
        let t = a.boundary(Boundary::Commit { end: pos(100), timestamp_s: 3 }).unwrap();
        assert_eq!(t.rows.events(), 2);
        assert_eq!(t.position.gtid.as_deref(), Some("0-1-5"));
        assert_eq!(t.commit_time_ms, 3000);
        assert!(!a.in_transaction());
    }

    #[test]
    fn rollback_drops_rows() {
        let (schema, events) = sample_row_events();
        let mut a = Assembler::new(SpillSettings::default());
        a.boundary(Boundary::Begin { gtid: None, standalone: false });
        a.push_rows(&schema, "f", 7, events.into_iter().next().unwrap()).unwrap();
        a.heartbeat(5);
        a.boundary(Boundary::Rollback);
        assert_eq!(a.held_events(), 0);
        a.boundary(Boundary::Begin { gtid: None, standalone: false });
        let t = a.boundary(Boundary::Commit { end: pos(100), timestamp_s: 3 }).unwrap();
        assert_eq!(t.heartbeat_us, None, "a rolled-back heartbeat is not the next transaction's");
    }

    #[test]
    fn statement_inside_txn_is_not_a_boundary() {
        let mut a = Assembler::new(SpillSettings::default());
        a.boundary(Boundary::Begin { gtid: None, standalone: false });
        assert!(a.boundary(Boundary::Statement { end: pos(5), timestamp_s: 0, invalidate_tables: vec![] }).is_none());
        let mut a = Assembler::new(SpillSettings::default());
        a.boundary(Boundary::Begin { gtid: Some("0-1-9".into()), standalone: true });
        let t = a.boundary(Boundary::Statement { end: pos(9), timestamp_s: 0, invalidate_tables: vec![] }).unwrap();
        assert_eq!(t.position.gtid.as_deref(), Some("0-1-9"));
    }
}
