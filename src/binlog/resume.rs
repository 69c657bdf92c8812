//! Where a replica connection starts ([`Resume`], decided by [`crate::binlog::start_plan`]) and what the
//! reader counts across reconnects ([`SourceStats`]): the state the reader keeps between
//! connections, shared by the reader loop ([`crate::binlog::reader`]) and its per-event
//! handlers.

use binval_protocol::{MariadbGtidPosition, MysqlGtidSet, SourcePosition};

/// Where the source begins reading.
#[derive(Debug, Clone)]
pub enum Resume {
    /// A binlog position (from a checkpoint or `FILE:POS`).
    FilePos(SourcePosition),
    /// A MariaDB GTID position: reading starts after it (`@slave_connect_state`).
    Gtid(MariadbGtidPosition),
    /// A MySQL GTID set: the server sends every transaction not in it (`COM_BINLOG_DUMP_GTID`).
    MysqlGtid(MysqlGtidSet),
}

impl std::fmt::Display for Resume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resume::FilePos(p) => write!(f, "{}:{}", p.file, p.pos),
            Resume::Gtid(g) => write!(f, "gtid {g}"),
            Resume::MysqlGtid(s) => write!(f, "gtid set {s}"),
        }
    }
}

/// Counters the source shares with the progress log.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// Binlog events read.
    pub events: std::sync::atomic::AtomicU64,
    /// Row changes of mapped tables decoded.
    pub rows: std::sync::atomic::AtomicU64,
    /// Reconnects after a failure.
    pub reconnects: std::sync::atomic::AtomicU64,
    /// Transactions passed on and not yet acknowledged (the checkpoint task subtracts; reset
    /// when a tenure's tasks start).
    pub in_flight: std::sync::atomic::AtomicI64,
    /// The reader is at the end of the binlog: the primary sent a replication heartbeat (it
    /// sends one only after `source.heartbeat_ms` without events) since the last transaction.
    pub at_end: std::sync::atomic::AtomicBool,
    /// The end position and commit time (Unix ms; the heartbeat row's `NOW(6)` for a
    /// heartbeat) of the last transaction passed on.
    read: std::sync::Mutex<Option<(SourcePosition, u64)>>,
    /// The commit time (Unix ms) of the first transaction passed on in this tenure: while
    /// nothing is acknowledged yet, the oldest change that may not be in Redis and Kafka.
    first_read_ms: std::sync::atomic::AtomicU64,
}

impl SourceStats {
    /// The reader passes on the transaction ending at `position`, committed at
    /// `commit_time_ms`: the `read` position of the monitor's lag and position gauges.
    pub fn transaction_read(&self, position: &SourcePosition, commit_time_ms: u64) {
        let _ = self.first_read_ms.compare_exchange(
            0,
            commit_time_ms,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some((position.clone(), commit_time_ms));
    }

    /// A tenure begins: forget what the previous one read (its position, `at_end`, the
    /// transactions in flight), so the lag gauge measures this tenure from its first second
    /// (a stale `at_end` read as "caught up" while a takeover was 10 s behind).
    pub fn new_tenure(&self) {
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.at_end.store(false, std::sync::atomic::Ordering::Relaxed);
        self.in_flight.store(0, std::sync::atomic::Ordering::Relaxed);
        self.first_read_ms.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// The commit time (Unix ms) of the first transaction passed on in this tenure (0: none
    /// yet, or unknown).
    pub fn first_read_ms(&self) -> u64 {
        self.first_read_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The end position and commit time (Unix ms) of the last transaction passed on.
    pub fn last_read(&self) -> Option<(SourcePosition, u64)> {
        self.read.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
