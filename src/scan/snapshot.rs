//! Consistent snapshots whose binlog position is known: what makes a row read from a table
//! comparable with (and writable beside) the changes `binval run` applies from the binlog.
//!
//! # How
//!
//! `START TRANSACTION WITH CONSISTENT SNAPSHOT` (isolation level REPEATABLE READ; READ ONLY)
//! opens an InnoDB read view, and MariaDB takes the binlog position at the same moment, under
//! the commit lock of its group commit: the status variables `binlog_snapshot_file` and
//! `binlog_snapshot_position` then name the binlog position the snapshot corresponds to, and
//! keep naming it for the life of the transaction, however many transactions commit meanwhile
//! (MariaDB docs, "Enhancements for START TRANSACTION WITH CONSISTENT SNAPSHOT"; Percona Server
//! ported the same variables). Every transaction that ends at or before that position is
//! visible in the snapshot; none after it is.
//!
//! With `fence = "gtid"` the fence position is a GTID sequence number, so the snapshot's GTID
//! position is needed: `BINLOG_GTID_POS(binlog_snapshot_file, binlog_snapshot_position)`, the
//! GTID position at that binlog position (what `mariadb-dump --single-transaction --gtid`
//! records for the same purpose). `@@gtid_binlog_pos` read inside the snapshot is **not** it:
//! it is the server's current state, which moves on as other transactions commit (measured: a
//! snapshot at `0-1-3` reads `@@gtid_binlog_pos = 0-1-4` after another session committed).
//! `BINLOG_GTID_POS` reads the binlog file from its start up to the position (MariaDB before
//! 11.4 has no GTID index), so its cost grows with the file; [`SnapshotConn`] therefore keeps a
//! snapshot for up to [`SNAPSHOT_MAX_AGE`] across chunks.
//!
//! # Why a snapshot's rows may be written beside a live `binval run`
//!
//! A row read in the snapshot is the row as of the snapshot's fence position `S` (see
//! [`crate::write::fence`]): every transaction visible in it has a fence position `<= S`, every
//! one after it `> S` (binlog order is commit order, and in `gtid` mode sequence numbers grow
//! in binlog order within the fence domain). Written through the fenced scripts at `S`, the
//! row replaces only what is older than the snapshot, and any change committed after the
//! snapshot (position `> S`) wins whether `binval run` applies it before or after. No
//! watermark table is needed (README, "Putting binval in front of an existing database").
//!
//! MySQL has no such status variables: its consistent snapshot does not tell its binlog
//! position. [`SnapshotConn::begin`] refuses with an error saying so.

use std::time::{Duration, Instant};

use binval_protocol::{FencePosition, MariadbGtidPosition, SourcePosition};
use mysql_async::prelude::Queryable;
use mysql_async::Conn;

use crate::config::{FenceMode, SourceConfig};
use crate::error::{classify_mysql, DefiniteError, Error};
use crate::write::fence::FenceRule;

/// How long one snapshot serves consecutive chunks: long enough to amortize
/// `BINLOG_GTID_POS`, short enough that InnoDB's purge is never held back noticeably.
pub const SNAPSHOT_MAX_AGE: Duration = Duration::from_secs(1);

/// Where a snapshot stands in the binlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPosition {
    /// `binlog_snapshot_file`:`binlog_snapshot_position`, and in `gtid` mode the GTID of the
    /// fence domain at that position (the snapshot's last transaction of the domain).
    pub position: SourcePosition,
    /// The fence position rows of this snapshot are written at.
    pub fence: FencePosition,
}

/// A connection for reading tables in consistent snapshots (module docs). Sessions use
/// `SET NAMES utf8mb4` and `time_zone = '+00:00'` (see `binlog::decode::result_set`).
pub struct SnapshotConn {
    conn: Conn,
    rule: FenceRule,
    open: Option<(SnapshotPosition, Instant)>,
}

impl SnapshotConn {
    /// Connect to the source and prepare the session. Errors: connection failures
    /// (classified), a source without binlog.
    pub async fn connect(cfg: &SourceConfig, rule: FenceRule) -> Result<Self, Error> {
        let mut conn = crate::binlog::server::connect(cfg).await?;
        for sql in ["SET NAMES utf8mb4, time_zone = '+00:00'", "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"] {
            conn.query_drop(sql).await.map_err(|e| classify_mysql(e, "session setup"))?;
        }
        Ok(SnapshotConn { conn, rule, open: None })
    }

    /// The connection, for reads inside the snapshot (and, outside one, for schema reads).
    pub fn conn(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The open snapshot if it is younger than `max_age`, else a new one (the old one is
    /// committed first).
    pub async fn fresh_within(&mut self, max_age: Duration) -> Result<SnapshotPosition, Error> {
        if let Some((p, at)) = &self.open {
            if at.elapsed() < max_age {
                return Ok(p.clone());
            }
        }
        self.begin().await
    }

    /// Open a new consistent snapshot (committing an open one) and return its position.
    ///
    /// Errors: a server without `binlog_snapshot_file` (MySQL; the message says what binval
    /// needs); in `gtid` mode, a position whose GTID position the server cannot give, or a
    /// GTID the fence rule refuses; connection failures (classified).
    pub async fn begin(&mut self) -> Result<SnapshotPosition, Error> {
        self.end().await?;
        let q = |e| classify_mysql(e, "consistent snapshot");
        self.conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY").await.map_err(q)?;
        let vars: Vec<(String, String)> = self.conn.query("SHOW STATUS LIKE 'binlog_snapshot_%'").await.map_err(q)?;
        let get = |name: &str| vars.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
        let (Some(file), Some(pos)) = (get("binlog_snapshot_file"), get("binlog_snapshot_position").and_then(|p| p.parse::<u64>().ok()))
        else {
            return Err(DefiniteError::SourceSetting {
                setting: "binlog_snapshot_file",
                found: "not reported (MySQL has no binlog position of a consistent snapshot)".into(),
                want: "a MariaDB (or Percona Server) source",
            }
            .into());
        };
        let mut position = SourcePosition { file, pos, gtid: None };
        let fence = match self.rule.mode {
            FenceMode::Gtid => {
                let (gtid, fence) = self.gtid_at(&position).await?;
                position.gtid = gtid;
                fence
            }
            _ => self.rule.position(&position)?,
        };
        let p = SnapshotPosition { position, fence };
        self.open = Some((p.clone(), Instant::now()));
        Ok(p)
    }

    /// The GTID of the fence domain at `at` and the fence position it gives; a domain with no
    /// transaction up to there gives sequence 0.
    async fn gtid_at(&mut self, at: &SourcePosition) -> Result<(Option<String>, FencePosition), Error> {
        let sql = "SELECT BINLOG_GTID_POS(?, ?)";
        let row: Option<Option<String>> =
            self.conn.exec_first(sql, (at.file.as_str(), at.pos)).await.map_err(|e| classify_mysql(e, &at.to_string()))?;
        let Some(Some(list)) = row else {
            return Err(DefiniteError::Fence {
                position: at.to_string(),
                message: "BINLOG_GTID_POS gives no GTID position for the snapshot's binlog position; set source.fence = \"file_pos\""
                    .into(),
            }
            .into());
        };
        let state: MariadbGtidPosition =
            list.parse().map_err(|e| DefiniteError::Fence { position: at.to_string(), message: format!("BINLOG_GTID_POS: {e}") })?;
        match state.get(self.rule.domain) {
            Some(g) => {
                let gtid = g.to_string();
                let fence = self.rule.position(&SourcePosition { gtid: Some(gtid.clone()), ..at.clone() })?;
                Ok((Some(gtid), fence))
            }
            None => {
                let fence = FencePosition::from_gtid_seq(self.rule.epoch, 0).expect("0 fits");
                Ok((None, fence))
            }
        }
    }

    /// Commit the open snapshot, if any.
    pub async fn end(&mut self) -> Result<(), Error> {
        if self.open.take().is_some() {
            self.conn.query_drop("COMMIT").await.map_err(|e| classify_mysql(e, "end of snapshot"))?;
        }
        Ok(())
    }

    /// Commit and disconnect.
    pub async fn close(mut self) {
        let _ = self.end().await;
        let _ = self.conn.disconnect().await;
    }
}
