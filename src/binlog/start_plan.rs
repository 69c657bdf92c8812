//! Where a tenure of `binval run` starts reading: the one owner of that decision. `run`
//! (`pipeline::prepare`) and `binval check` both ask [`plan`], so `check` says exactly what
//! `run` will do (including a refusal).
//!
//! # The rule
//!
//! A binlog position `file:pos` names a place in *one server's* binlog. A replica promoted to
//! primary has files of the same names, but they were flushed at other moments: the same
//! `file:pos` there is another transaction, or nothing. A GTID names the transaction itself,
//! on every server of the topology (MariaDB docs, "Global Transaction ID"; MySQL docs, "GTID
//! Auto-Positioning"). So, with a checkpoint:
//!
//! 1. **Its `file:pos` still names the same place here**: resume there (exact, and what a
//!    restart on the same primary does). The checkpoint names the server it was read from
//!    (`server_id`, MySQL `server_uuid`): the same server, and the file still there, is the
//!    fast path. For another or an unknown server (a checkpoint of an older binval) MariaDB is
//!    asked, not assumed: its `BINLOG_GTID_POS(file, pos)` must equal the checkpoint's GTID
//!    position in every domain it holds. On MySQL another `server_uuid` never holds.
//! 2. **Otherwise, by GTID** (the server is another one, or the file was purged): MariaDB reads
//!    after the checkpoint's GTID position (`@slave_connect_state`), MySQL sends the
//!    checkpoint's GTID set (`COM_BINLOG_DUMP_GTID`) and gets every transaction not in it. A
//!    warning names both servers and both coordinates.
//! 3. **Neither**: refused ([`DefiniteError::ResumeElsewhere`]), naming the checkpoint, its
//!    server and this one. binval never starts anywhere else in silence.
//!
//! With `source.fence = "file_pos"` the versions are positions of one server's binlog: after a
//! change of server they are comparable only under a higher `source.fence_epoch`, so a resume
//! on another server is refused until the epoch is raised (the checkpoint records the epoch it
//! was written under).
//!
//! Without a checkpoint, `source.start` decides (`current`, `FILE:POS` moved to the start of
//! its transaction by [`crate::binlog::boundary`], or a GTID position), and the start is pinned
//! into the checkpoint at once together with the GTID state at that position, so a failover
//! before the first transaction is still resumed by GTID.

use binval_protocol::{BinlogPosition, MariadbGtidPosition, MysqlGtidSet, SourcePosition};
use mysql_async::Conn;

use crate::binlog::boundary;
use crate::binlog::reader::ReadState;
use crate::binlog::resume::Resume;
use crate::binlog::server::{self, ServerIdentity, ServerInfo};
use crate::config::{FenceMode, SourceConfig, StartForms, StartPoint};
use crate::error::{DefiniteError, Error};
use crate::ha::checkpoint::{Checkpoint, GtidState, Origin};
use crate::write::fence::FenceRule;

/// How the start was chosen, for the log line and `binval check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// The checkpoint's `file:pos`, which names the same place on this server.
    Checkpoint,
    /// The checkpoint's GTIDs, because its `file:pos` does not name the same place here;
    /// `why` says what differs.
    CheckpointByGtid {
        /// The checkpoint's coordinates and server, as text.
        checkpoint: String,
        /// What makes `file:pos` unusable here.
        why: String,
    },
    /// No checkpoint: `source.start`, which is the primary's current position when `current`.
    Configured {
        /// `source.start = "current"`.
        current: bool,
    },
}

/// Where a tenure starts and what it starts from.
#[derive(Debug, Clone)]
pub struct StartPlan {
    /// Where the replica connection starts.
    pub resume: Resume,
    /// The GTID state before `resume`, which every checkpoint of the tenure builds on.
    pub gtids: GtidState,
    /// Renamed tables, JSON columns and held XA transactions as of the start.
    pub state: ReadState,
    /// The server the tenure reads (the reader refuses any other) and the fence epoch.
    pub origin: Origin,
    /// A start without a checkpoint at a binlog position: saved as the checkpoint before
    /// anything is read, so a crash before the first transaction does not move it.
    pub pin: Option<SourcePosition>,
    /// How it was chosen.
    pub how: How,
}

impl StartPlan {
    /// One line: where and why, e.g. `checkpoint mysql-bin.000002:6560` or `gtid 0-21-54 (the
    /// checkpoint's GTID position: ...)`.
    pub fn describe(&self) -> String {
        match &self.how {
            How::Checkpoint => format!("checkpoint position {}", self.resume),
            How::CheckpointByGtid { checkpoint, why } => {
                format!("{} (the checkpoint {checkpoint} by its GTIDs: {why})", self.resume)
            }
            How::Configured { .. } => format!("{} (no checkpoint; source.start)", self.resume),
        }
    }
}

/// Decide where to start on the server behind `conn` (`info`: its preflight, `logs`: its
/// binary logs), from the saved checkpoint or else `cfg.start`. See the module docs.
///
/// Errors: [`DefiniteError::ResumeElsewhere`] where the checkpoint can be resumed neither by
/// position nor by GTID here (or only under a higher `source.fence_epoch`);
/// [`DefiniteError::PositionGone`] for a `source.start` file the server does not have;
/// config errors for a `source.start` that does not parse or does not fit the server;
/// connection failures (transient).
pub async fn plan(
    cfg: &SourceConfig,
    saved: Option<&Checkpoint>,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
) -> Result<StartPlan, Error> {
    let origin = Origin { server: Some(info.identity.clone()), fence_epoch: cfg.fence_epoch };
    match saved {
        Some(c) => from_checkpoint(cfg, c, conn, info, logs, origin).await,
        None => from_configured(cfg, conn, info, logs, origin).await,
    }
}

async fn from_checkpoint(
    cfg: &SourceConfig,
    c: &Checkpoint,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
    origin: Origin,
) -> Result<StartPlan, Error> {
    let at = BinlogPosition::new(c.file.clone(), c.pos);
    let state = c.read_state();
    // While a prepared XA transaction is held, `file:pos` is where it begins and the GTIDs are
    // those up to `xa.applied`.
    let gtid_place = c.xa.applied.as_ref().map(BinlogPosition::from).unwrap_or_else(|| at.clone());
    let whole_set = c.server.is_some();
    let gtids = c.gtid.as_deref().map(|g| GtidState::from_saved(g, whole_set)).unwrap_or_default();
    let mut checkpoint_text = format!("{at}");
    if let Some(g) = &c.gtid {
        checkpoint_text.push_str(&format!(" (GTID {g})"));
    }
    match &c.server {
        Some(s) => checkpoint_text.push_str(&format!(" of {s}")),
        None => checkpoint_text.push_str(" (server not recorded: saved by an older binval)"),
    }
    let same_server = c.server.as_ref().map(|s| s.same_server(&info.identity));
    let has_file = logs.contains(&c.file);
    let holds: Result<(), String> = if !has_file {
        Err(format!("this server has no binlog file {} (its binary logs: {})", c.file, logs.join(", ")))
    } else if same_server == Some(true) {
        // The server that wrote the position: the fast path of every restart and takeover
        // (BINLOG_GTID_POS reads the file up to the position, up to max_binlog_size).
        Ok(())
    } else if let (true, Some(want)) = (info.mariadb, gtids.mariadb()) {
        match server::mariadb_gtid_at(conn, &gtid_place).await? {
            Some(here) if want.iter().all(|g| here.get(g.domain) == Some(g)) => Ok(()),
            Some(here) => Err(format!("at {gtid_place} this server's binlog is at GTID position {here}, not the checkpoint's {want}")),
            None => Err(format!("this server does not know the GTID position at {gtid_place}")),
        }
    } else if same_server == Some(false) {
        Err(format!("the checkpoint was read from {}, this is {}", c.server.as_ref().expect("compared"), info.identity))
    } else {
        Ok(())
    };
    let server_changed = same_server == Some(false);
    let fence = FenceRule::resolve(cfg, info.mariadb);
    let saved_epoch = c.fence_epoch.unwrap_or(0);
    let refuse = |message: String| -> Error {
        DefiniteError::ResumeElsewhere { checkpoint: checkpoint_text.clone(), server: info.identity.to_string(), message }.into()
    };
    if (server_changed || holds.is_err()) && fence.mode == FenceMode::FilePos && cfg.fence_epoch <= saved_epoch {
        return Err(refuse(format!(
            "{}; with source.fence = \"file_pos\" the versions binval writes are positions in one server's binlog, which this server's positions do not continue: set source.fence_epoch = {} (above the checkpoint's {saved_epoch}) and start again, or use source.fence = \"gtid\" on MariaDB",
            holds.as_ref().err().cloned().unwrap_or_else(|| format!("the checkpoint was read from another server than {}", info.identity)),
            saved_epoch + 1
        )));
    }
    let why = match holds {
        Ok(()) => {
            return Ok(StartPlan {
                resume: Resume::FilePos(SourcePosition { file: c.file.clone(), pos: c.pos, gtid: None }),
                gtids,
                state,
                origin,
                pin: None,
                how: How::Checkpoint,
            })
        }
        Err(why) => why,
    };
    if state.xa.hold.is_some() || c.xa.applied.is_some() {
        return Err(refuse(format!(
            "{why}; a prepared XA transaction is held at {at} (its changes are applied at its XA COMMIT), and that place cannot be found by GTID: replay it with `binval replay --from` a position of this server before its XA PREPARE, then delete the checkpoint"
        )));
    }
    let resume = if info.mariadb {
        gtids.mariadb().cloned().map(Resume::Gtid)
    } else if info.gtids {
        gtids.mysql().cloned().map(Resume::MysqlGtid)
    } else {
        None
    };
    let Some(resume) = resume else {
        let missing = if info.mariadb || info.gtids {
            "and the checkpoint holds no GTID state to resume by (saved before binval recorded it, or read without GTIDs)"
        } else {
            "and this server has gtid_mode OFF, so nothing names the checkpoint's transaction here"
        };
        return Err(refuse(format!(
            "{why}, {missing}: set source.start to the position on this server that follows the checkpoint's last transaction, delete the checkpoint and start again (README \"Failover\")"
        )));
    };
    gtids_still_there(conn, &resume, logs, &checkpoint_text).await?;
    Ok(StartPlan { resume, gtids, state, origin, pin: None, how: How::CheckpointByGtid { checkpoint: checkpoint_text, why } })
}

/// Refuse a GTID resume whose following transactions the server no longer has (purged
/// binlogs), before the replica connection would fail on it: MariaDB, the checkpoint's
/// sequence number of a domain is below where the oldest binlog file starts (its GTID_LIST
/// event, [`server::mariadb_gtid_list`]); MySQL, `@@gtid_purged` is not within the set
/// (`GTID_SUBSET`). So `binval check` says what `run` would meet.
async fn gtids_still_there(conn: &mut Conn, resume: &Resume, logs: &[String], checkpoint: &str) -> Result<(), Error> {
    use mysql_async::prelude::Queryable;
    let gone = |message: String| -> Error {
        DefiniteError::PositionGone { position: format!("{resume} (the checkpoint {checkpoint})"), message }.into()
    };
    match resume {
        Resume::Gtid(want) => {
            let Some(oldest) = logs.first() else { return Ok(()) };
            let Some(start) = server::mariadb_gtid_list(conn, oldest).await? else { return Ok(()) };
            for g in want.iter() {
                if let Some(first) = start.get(g.domain) {
                    if g.seq < first.seq {
                        return Err(gone(format!(
                            "the transactions after it were purged: the oldest binlog file {oldest} starts after GTID {first}"
                        )));
                    }
                }
            }
            Ok(())
        }
        Resume::MysqlGtid(set) => {
            let inside: Option<Option<i64>> = conn
                .exec_first("SELECT GTID_SUBSET(@@gtid_purged, ?)", (set.to_string(),))
                .await
                .map_err(|e| crate::error::classify_mysql(e, "GTID_SUBSET(@@gtid_purged, ...)"))?;
            if inside.flatten() == Some(0) {
                return Err(gone("transactions not in it were purged (@@gtid_purged is not within the set)".into()));
            }
            Ok(())
        }
        Resume::FilePos(_) => Ok(()),
    }
}

async fn from_configured(
    cfg: &SourceConfig,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
    origin: Origin,
) -> Result<StartPlan, Error> {
    let start = StartPoint::parse(&cfg.start, StartForms::SOURCE_START).map_err(|r| Error::config("source.start", r))?;
    let current = start == StartPoint::Current;
    let plan = |resume: Resume, gtids: GtidState, pin: Option<SourcePosition>| StartPlan {
        resume,
        gtids,
        state: ReadState::default(),
        origin: origin.clone(),
        pin,
        how: How::Configured { current },
    };
    Ok(match start {
        StartPoint::Current => {
            let at = info.current.clone();
            server::require_binlog_file(logs, &(&at).into(), "source.start")?;
            let gtids = gtids_at(conn, info, &(&at).into(), info.executed.clone()).await?;
            plan(Resume::FilePos(at.clone()), gtids, Some(at))
        }
        StartPoint::Binlog(p) => {
            server::require_binlog_file(logs, &p, "source.start")?;
            // An operator's position may lie inside a transaction: start at its first event.
            let at = boundary::group_start(cfg, &p, "source.start").await?;
            let gtids = gtids_at(conn, info, &at, None).await?;
            let at = SourcePosition { file: at.file, pos: at.pos, gtid: None };
            plan(Resume::FilePos(at.clone()), gtids, Some(at))
        }
        StartPoint::Gtid(g) if info.mariadb => plan(Resume::Gtid(g.clone()), GtidState::from_mariadb(g), None),
        StartPoint::MysqlGtidSet(set) if !info.mariadb && info.gtids => {
            plan(Resume::MysqlGtid(set.clone()), GtidState::from_mysql(set), None)
        }
        StartPoint::Gtid(_) => {
            return Err(Error::config(
                "source.start",
                format!(
                    "a MariaDB GTID position needs a MariaDB source; {} is MySQL: use a MySQL GTID set (gtid:uuid:1-100) or FILE:POS",
                    info.version
                ),
            ))
        }
        StartPoint::MysqlGtidSet(_) => {
            return Err(Error::config(
                "source.start",
                format!(
                    "a MySQL GTID set needs a MySQL source with gtid_mode = ON; {} is not one: use FILE:POS (or gtid:D-S-N on MariaDB)",
                    info.version
                ),
            ))
        }
        StartPoint::Time(_) => return Err(Error::config("source.start", "a date-time is not a start position here")),
    })
}

/// The GTID state of everything before `at` on this server: MariaDB's `BINLOG_GTID_POS`, or the
/// MySQL set given (`Executed_Gtid_Set` read with a `current` position); otherwise unknown
/// until the reader meets the next PREVIOUS_GTIDS event (MySQL, the next binlog file).
async fn gtids_at(conn: &mut Conn, info: &ServerInfo, at: &BinlogPosition, executed: Option<MysqlGtidSet>) -> Result<GtidState, Error> {
    if info.mariadb {
        let here: Option<MariadbGtidPosition> = server::mariadb_gtid_at(conn, at).await?;
        return Ok(here.map(GtidState::from_mariadb).unwrap_or_default());
    }
    Ok(executed.map(GtidState::from_mysql).unwrap_or_default())
}

/// The reader's check on every replica connection: the server behind `source.url` must still
/// be the one the tenure planned its start on (`expected`); after a failover behind a DNS name
/// or a virtual IP it is not, and the positions the reader holds mean nothing there. Returns
/// the transient error that restarts the tenure, whose new plan resumes by GTID.
pub fn same_server(expected: Option<&ServerIdentity>, here: &ServerIdentity) -> Result<(), Error> {
    match expected {
        Some(e) if !e.same_server(here) => {
            Err(crate::error::TransientError::SourceChanged { from: e.to_string(), to: here.to_string() }.into())
        }
        _ => Ok(()),
    }
}
