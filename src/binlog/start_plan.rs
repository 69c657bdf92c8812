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
//!
//! # No checkpoint, but an earlier run left traces
//!
//! The checkpoint is kept on several Redis Cluster masters ([`crate::ha::checkpoint`]); when
//! no copy of it is found, the caller looks for what an earlier run of the source left
//! ([`Earlier`]: keys of the mappings' templates, bootstrap progress, messages on the topic).
//! A first start finds nothing and goes on as above. Otherwise, with `source.start =
//! "current"` (the default, which means "a first start"):
//!
//! 4. **Recovered from the topic**: the oldest of the partitions' newest events of `binval run`
//!    ([`crate::ha::topic_marks`] says why that is the safe point) names a transaction; the
//!    tenure starts at that transaction's first event ([`boundary::transaction_start`]), if
//!    this server's binlog still holds it (the file is listed, and on MariaDB
//!    `BINLOG_GTID_POS` there names the event's GTID), and pins it as the checkpoint. A warning
//!    names the partitions, the position and the traces.
//! 5. **Refused** otherwise ([`DefiniteError::EarlierRunLost`]): the error names what was
//!    found, where the checkpoint was looked for, why the topic does not help, and the exact
//!    commands that recover (start once at the primary's position now, then `binval verify
//!    --repair`).
//!
//! An explicit `source.start` (`FILE:POS`, a GTID) is the operator's decision and is used as
//! given; the traces are named in a warning.

use binval_protocol::{BinlogPosition, MariadbGtidPosition, MysqlGtidSet, SourcePosition};
use mysql_async::Conn;

use crate::binlog::boundary;
use crate::binlog::reader::ReadState;
use crate::binlog::resume::Resume;
use crate::binlog::server::{self, ServerIdentity, ServerInfo};
use crate::config::{FenceMode, SourceConfig, StartForms, StartPoint};
use crate::error::{DefiniteError, Error};
use crate::ha::checkpoint::{Checkpoint, GtidState, Origin};
use crate::ha::topic_marks::Mark;
pub use crate::ha::traces::Earlier;
use crate::write::fence::FenceRule;

/// Why a checkpoint's `file:pos` does not name the same place on the server binval is
/// connected to (after a failover, a restore, or a virtual IP moved to another server).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotHere {
    /// The checkpoint's binlog file is not among this server's binary logs (`SHOW BINARY LOGS`).
    #[error("this server has no binlog file {file} (its binary logs: {})", .logs.join(", "))]
    NoFile { file: String, logs: Vec<String> },
    /// MariaDB: the GTID position at the checkpoint's place (`BINLOG_GTID_POS`) differs from the
    /// checkpoint's GTIDs.
    #[error("at {place} this server's binlog is at GTID position {here}, not the checkpoint's {want}")]
    OtherGtids { place: BinlogPosition, here: MariadbGtidPosition, want: MariadbGtidPosition },
    /// MariaDB: `BINLOG_GTID_POS` returned nothing for the checkpoint's place.
    #[error("this server does not know the GTID position at {place}")]
    NoGtidAt { place: BinlogPosition },
    /// The checkpoint records another server (`@@server_id`, and `@@server_uuid` on MySQL).
    #[error("the checkpoint was read from {saved}, this is {this}")]
    OtherServer { saved: ServerIdentity, this: ServerIdentity },
}

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
        why: NotHere,
    },
    /// No checkpoint: `source.start`, which is the primary's current position when `current`.
    Configured {
        /// `source.start = "current"`.
        current: bool,
        /// What an earlier run left, when something was found (an explicit `source.start` is
        /// used all the same).
        traces: Option<String>,
    },
    /// No checkpoint, and an earlier run left traces: the start recovered from the topic
    /// (module docs, rule 4).
    Recovered {
        /// The traces found.
        traces: String,
        /// The event the start comes from: partition, offset, position.
        from: String,
        /// The topic's newest event of `binval run` per partition.
        topic: String,
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
            How::Configured { traces: None, .. } => format!("{} (no checkpoint; source.start)", self.resume),
            How::Configured { traces: Some(t), .. } => {
                format!("{} (no checkpoint; source.start as given, although an earlier run left traces: {t})", self.resume)
            }
            How::Recovered { from, .. } => {
                format!("{} (no checkpoint: recovered from the topic, the start of the transaction of {from})", self.resume)
            }
        }
    }

    /// The log line of the decision (`binval run`, at the start of each tenure). `server`: the
    /// server read; `store`: where the checkpoint is kept; `loaded_from`: the copy it was read
    /// from when the checkpoint key was missing.
    pub fn log(&self, server: &ServerIdentity, store: &str, loaded_from: Option<&str>) {
        match &self.how {
            How::Checkpoint => match loaded_from {
                None => tracing::info!(from = %self.resume, server = %server, store = %store, "resuming from checkpoint"),
                Some(copy) => {
                    tracing::warn!(from = %self.resume, server = %server, copy = %copy, store = %store, "resuming from a copy of the checkpoint: the checkpoint key was missing (its master lost its data?); keys lost with that master are restored by `binval verify --repair`")
                }
            },
            How::CheckpointByGtid { checkpoint, why } => tracing::warn!(
                from = %self.resume,
                checkpoint = %checkpoint,
                server = %server,
                reason = %why,
                copy = loaded_from.unwrap_or("-"),
                "resuming from the checkpoint by its GTIDs: its binlog position does not name the same place on this server (a failover, or a purged file)"
            ),
            How::Configured { current: true, traces: None } => {
                tracing::info!(from = %self.resume, server = %server, store = %store, "no checkpoint and no trace of an earlier run: a first start, at the primary's current position (source.start = \"current\")")
            }
            How::Configured { traces: None, .. } => {
                tracing::info!(from = %self.resume, server = %server, store = %store, "no checkpoint; starting at source.start")
            }
            How::Configured { traces: Some(t), .. } => tracing::warn!(
                from = %self.resume,
                server = %server,
                store = %store,
                traces = %t,
                "no checkpoint, although an earlier run left traces: starting at source.start as given (an operator's position)"
            ),
            How::Recovered { traces, from, topic } => tracing::warn!(
                from = %self.resume,
                event = %from,
                topic = %topic,
                traces = %traces,
                store = %store,
                "no checkpoint, but an earlier run left traces: resuming where the topic shows it stopped (the oldest of the partitions' newest events of binval run). Keys lost with the checkpoint's Redis data are restored by `binval verify --repair`"
            ),
        }
    }
}

/// Decide where to start on the server behind `conn` (`info`: its preflight, `logs`: its
/// binary logs), from the saved checkpoint, else from what an earlier run left (`earlier`,
/// gathered by the caller when there is no checkpoint; [`Earlier::default`] otherwise), else
/// `cfg.start`. See the module docs.
///
/// Errors: [`DefiniteError::ResumeElsewhere`] where the checkpoint can be resumed neither by
/// position nor by GTID here (or only under a higher `source.fence_epoch`);
/// [`DefiniteError::PositionGone`] for a `source.start` file the server does not have;
/// [`DefiniteError::EarlierRunLost`] where an earlier run left traces and the start cannot be
/// recovered from the topic; config errors for a `source.start` that does not parse or does
/// not fit the server; connection failures (transient).
pub async fn plan(
    cfg: &SourceConfig,
    saved: Option<&Checkpoint>,
    earlier: &Earlier,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
) -> Result<StartPlan, Error> {
    let origin = Origin { server: Some(info.identity.clone()), fence_epoch: cfg.fence_epoch };
    match saved {
        Some(c) => from_checkpoint(cfg, c, conn, info, logs, origin).await,
        None => from_configured(cfg, earlier, conn, info, logs, origin).await,
    }
}

/// [`plan`] for `binval run` and `binval check`: the checkpoint loaded from `store` (a copy when
/// the key is missing), else the traces of an earlier run looked for ([`Earlier::gather`]), then
/// the decision. Returns the plan and the checkpoint it started from.
pub async fn plan_start(
    cfg: &crate::config::Config,
    saved: Option<&Checkpoint>,
    store_location: &str,
    redis: &crate::redis::RedisConn,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
) -> Result<StartPlan, Error> {
    let earlier = match saved {
        Some(_) => Earlier::default(),
        None => Earlier::gather(cfg, redis, store_location).await?,
    };
    plan(&cfg.source, saved, &earlier, conn, info, logs).await
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
    let holds: Result<(), NotHere> = if !has_file {
        Err(NotHere::NoFile { file: c.file.clone(), logs: logs.to_vec() })
    } else if same_server == Some(true) {
        // The server that wrote the position: the fast path of every restart and takeover
        // (BINLOG_GTID_POS reads the file up to the position, up to max_binlog_size).
        Ok(())
    } else if let (true, Some(want)) = (info.mariadb, gtids.mariadb()) {
        match server::mariadb_gtid_at(conn, &gtid_place).await? {
            Some(here) if want.iter().all(|g| here.get(g.domain) == Some(g)) => Ok(()),
            Some(here) => Err(NotHere::OtherGtids { place: gtid_place.clone(), here, want: want.clone() }),
            None => Err(NotHere::NoGtidAt { place: gtid_place.clone() }),
        }
    } else if same_server == Some(false) {
        Err(NotHere::OtherServer { saved: c.server.clone().expect("compared"), this: info.identity.clone() })
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
            holds.as_ref().err().map(ToString::to_string).unwrap_or_else(|| format!("the checkpoint was read from another server than {}", info.identity)),
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
            "{why}; a prepared XA transaction is held at {at} (its changes are applied at its XA COMMIT), and that place cannot be found by GTID: replay it with `binval replay --from` a position of this server before its XA PREPARE, then delete the checkpoint and its copies (keys listed by `binval check`)"
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
            "{why}, {missing}: set source.start to the position on this server that follows the checkpoint's last transaction, delete the checkpoint and its copies (keys listed by `binval check`) and start again (docs/faults.md, \"Primary failover\")"
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
    earlier: &Earlier,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
    origin: Origin,
) -> Result<StartPlan, Error> {
    let start = StartPoint::parse(&cfg.start, StartForms::SOURCE_START).map_err(|r| Error::config("source.start", r.to_string()))?;
    let current = start == StartPoint::Current;
    if current && earlier.any() {
        return recover(cfg, earlier, conn, info, logs, origin).await;
    }
    let traces = earlier.any().then(|| earlier.describe());
    let plan = |resume: Resume, gtids: GtidState, pin: Option<SourcePosition>| StartPlan {
        resume,
        gtids,
        state: ReadState::default(),
        origin: origin.clone(),
        pin,
        how: How::Configured { current, traces: traces.clone() },
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

/// Rules 4 and 5 of the module docs: no checkpoint, `source.start = "current"`, and `earlier`
/// found traces.
async fn recover(
    cfg: &SourceConfig,
    earlier: &Earlier,
    conn: &mut Conn,
    info: &ServerInfo,
    logs: &[String],
    origin: Origin,
) -> Result<StartPlan, Error> {
    let now = format!("{}:{}", info.current.file, info.current.pos);
    let refuse = |why: String| -> Error {
        DefiniteError::EarlierRunLost {
            source_name: cfg.name.clone(),
            location: earlier.location.clone(),
            found: earlier.describe(),
            message: format!(
                "{why}; starting at the primary's position now would skip what that run had not applied. To recover: start `binval run` once with source.start = \"{now}\" (the primary's position now; e.g. BINVAL__SOURCE__START={now} binval run --config <file>), then run `binval verify --config <file> --repair` beside it (it rewrites every key the database disagrees with, deleted rows included) and `binval verify --config <file>` until it exits 0 (README \"Incidents\")"
            ),
        }
        .into()
    };
    let Some(topic) = &earlier.topic else {
        return Err(refuse(
            "the invalidation topic holds no event of binval run for this source's mappings to recover the start from".into(),
        ));
    };
    let fence = FenceRule::resolve(cfg, info.mariadb);
    let Some(m) = topic.resume_mark(&fence) else {
        return Err(refuse(format!("no partition of the {} holds an event of binval run", topic.describe())));
    };
    let p = m.mark.position().clone();
    let from = format!("partition {} offset {} at {p}", m.partition, m.offset);
    if !logs.contains(&p.file) {
        return Err(refuse(format!(
            "the safe point the topic gives (the oldest of the partitions' newest events, {from}) is in binlog file {}, which this server no longer has (its binary logs: {})",
            p.file,
            logs.join(", ")
        )));
    }
    let end = BinlogPosition::new(p.file.clone(), p.pos);
    if let (true, Some(g)) = (info.mariadb, p.gtid.as_deref().and_then(|g| g.parse::<binval_protocol::MariadbGtid>().ok())) {
        match server::mariadb_gtid_at(conn, &end).await? {
            Some(here) if here.get(g.domain) == Some(g) => {}
            here => {
                return Err(refuse(format!(
                    "the safe point the topic gives ({from}) does not name the same place on this server: its binlog is at GTID position {} there, not at the event's GTID {g} (another server's binlog: a failover?)",
                    here.map(|h| h.to_string()).unwrap_or_else(|| "(none)".into())
                )))
            }
        }
    }
    let at = match &m.mark {
        Mark::Before(_) => boundary::transaction_start(cfg, &end, "the topic's recovery point").await?,
        Mark::Through(_) => end,
    };
    let gtids = gtids_at(conn, info, &at, None).await?;
    let at = SourcePosition { file: at.file, pos: at.pos, gtid: None };
    Ok(StartPlan {
        resume: Resume::FilePos(at.clone()),
        gtids,
        state: ReadState::default(),
        origin,
        pin: Some(at),
        how: How::Recovered { traces: earlier.describe(), from, topic: topic.describe() },
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
