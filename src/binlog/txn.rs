//! Transaction stage: groups decoded row changes by transaction and passes a transaction on
//! only when its commit (XID event, or a `COMMIT` query for non-transactional tables) has been
//! read. A transaction cut short by a dropped connection is discarded; the source resumes at
//! the end of the last complete one, so its rows are read again.
//!
//! Boundaries: MariaDB starts a transaction with its GTID event (type 162) — with the
//! `FL_STANDALONE` flag, the group is a single statement (DDL) with no commit event; MySQL
//! writes a GTID (33) or ANONYMOUS_GTID (34) event, then a `BEGIN` query.

use binval_protocol::SourcePosition;

use crate::binlog::decode::RowChange;

/// A committed transaction, in binlog commit order.
#[derive(Debug, Clone, Default)]
pub struct Transaction {
    /// Position just after the commit event: where a restart resumes.
    pub position: SourcePosition,
    /// Commit time from the commit event header, Unix ms (whole seconds).
    pub commit_time_ms: u64,
    /// Row changes of mapped tables, in binlog order. Empty for transactions that touched no
    /// mapped table; they still move the checkpoint.
    pub rows: Vec<RowChange>,
    /// Mapped tables (`schema.table`) whose rows a DDL statement removed or swapped without
    /// row events (TRUNCATE, DROP TABLE, partition TRUNCATE/DROP/EXCHANGE): every cached key
    /// of them must be invalidated. Empty for ordinary transactions.
    pub invalidate_tables: Vec<String>,
    /// After a RENAME of a mapped table: the renamed-table state as of this transaction, for
    /// the checkpoint. `None` when unchanged.
    pub table_names: Option<std::sync::Arc<crate::mapping::TableNames>>,
}

impl Transaction {
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
    rows: Vec<RowChange>,
    events: u32,
}

impl Assembler {
    /// An assembler with no open transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add decoded rows to the open transaction (rows outside one are kept too: MySQL 5.x
    /// binlogs may carry row events for non-transactional tables between BEGIN/COMMIT only).
    pub fn push_rows(&mut self, rows: impl IntoIterator<Item = RowChange>) {
        let event = self.events;
        self.events += 1;
        self.rows.extend(rows.into_iter().map(|mut r| {
            r.event = event;
            r
        }));
    }

    /// Rows held right now (for memory accounting).
    pub fn held_rows(&self) -> usize {
        self.rows.len()
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
                    self.rows.clear();
                    self.events = 0;
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
        self.rows.clear();
        self.events = 0;
    }

    fn finish(&mut self, mut end: SourcePosition, timestamp_s: u32) -> Transaction {
        end.gtid = self.gtid.take();
        let rows = std::mem::take(&mut self.rows);
        self.events = 0;
        self.open = false;
        self.standalone = false;
        Transaction { position: end, commit_time_ms: timestamp_s as u64 * 1000, rows, invalidate_tables: Vec::new(), table_names: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::decode::{RowChange, RowKind};

    fn row() -> RowChange {
        RowChange { table: "a.b".into(), kind: RowKind::Insert, before: None, after: Some(Default::default()), event: 0 }
    }
    fn pos(p: u64) -> SourcePosition {
        SourcePosition { file: "f".into(), pos: p, gtid: None }
    }

    #[test]
    fn commit_passes_rows_on() {
        let mut a = Assembler::new();
        assert!(a.boundary(Boundary::Begin { gtid: Some("0-1-5".into()), standalone: false }).is_none());
        a.push_rows([row(), row()]);
        let t = a.boundary(Boundary::Commit { end: pos(100), timestamp_s: 3 }).unwrap();
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.position.gtid.as_deref(), Some("0-1-5"));
        assert_eq!(t.commit_time_ms, 3000);
        assert!(!a.in_transaction());
    }

    #[test]
    fn rollback_drops_rows() {
        let mut a = Assembler::new();
        a.boundary(Boundary::Begin { gtid: None, standalone: false });
        a.push_rows([row()]);
        a.boundary(Boundary::Rollback);
        assert_eq!(a.held_rows(), 0);
    }

    #[test]
    fn statement_inside_txn_is_not_a_boundary() {
        let mut a = Assembler::new();
        a.boundary(Boundary::Begin { gtid: None, standalone: false });
        assert!(a.boundary(Boundary::Statement { end: pos(5), timestamp_s: 0, invalidate_tables: vec![] }).is_none());
        let mut a = Assembler::new();
        a.boundary(Boundary::Begin { gtid: Some("0-1-9".into()), standalone: true });
        let t = a.boundary(Boundary::Statement { end: pos(9), timestamp_s: 0, invalidate_tables: vec![] }).unwrap();
        assert_eq!(t.position.gtid.as_deref(), Some("0-1-9"));
    }
}
