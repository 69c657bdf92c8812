//! Checkpoint stage: the binlog position after the last transaction whose Redis writes and
//! Kafka events were all acknowledged (invariant I3: the checkpoint never runs ahead of the
//! sinks). A restart resumes there; changes between the checkpoint and a crash are applied
//! again (at-least-once: version tokens only grow, consumers evict once more).
//!
//! Stored in Redis (`binval:{<source name>}:checkpoint`, default) or in a file replaced
//! atomically (write to a temporary file, fsync, rename). Saved at most once per
//! `checkpoint.interval_ms` while transactions flow, and once more on shutdown.
//!
//! In Redis the save is fenced: a script writes the checkpoint only while the saver's fencing
//! token is the newest one handed out for the source (see [`crate::ha::lease`]), so a paused,
//! stale instance can never move the shared checkpoint.

use std::path::PathBuf;

use binval_protocol::{BinlogPosition, MariadbGtid, MariadbGtidPosition, MysqlGtidSet, SourcePosition};
use serde::{Deserialize, Serialize};

use crate::binlog::json_columns::JsonColumns;
use crate::binlog::reader::ReadState;
use crate::binlog::server::ServerIdentity;
use crate::binlog::xa::XaCheckpoint;
use crate::config::{CheckpointConfig, CheckpointStore};
use crate::error::{DefiniteError, Error, TransientError};
use crate::mapping::TableNames;
use crate::redis_conn::RedisConn;

/// What is saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Binlog file of the resume position.
    pub file: String,
    /// Byte offset in `file` just after the last acknowledged commit.
    pub pos: u64,
    /// The GTID state of everything before `file:pos`: MariaDB's GTID position (last
    /// `domain-server-seq` per domain, comma-separated), or the MySQL GTID set
    /// (`uuid:1-100,...`; written by binval before the `server` field existed, the last MySQL
    /// GTID only). Where `file:pos` does not name the same place on the server binval connects
    /// to (a failover), the start plan resumes by it ([`crate::binlog::start_plan`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
    /// The server whose binlog `file:pos` belongs to. `None` in checkpoints of older binval
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerIdentity>,
    /// `source.fence_epoch` of the run that saved it: after a failover with
    /// `source.fence = "file_pos"`, the new server's positions are comparable only under a
    /// higher epoch. `None` in checkpoints of older binval versions (read as 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_epoch: Option<u8>,
    /// When it was saved, Unix ms.
    pub saved_at_ms: u64,
    /// Mapped tables renamed before this position (see [`crate::mapping::TableNames`]).
    #[serde(default, skip_serializing_if = "is_empty_names")]
    pub renamed: TableNames,
    /// MariaDB JSON columns of the mapped tables as the reader knew them here (see
    /// [`crate::binlog::json_columns`]): a restart goes on with them, not with the schema of
    /// the restart's time.
    #[serde(default, skip_serializing_if = "is_empty_json")]
    pub json_columns: JsonColumns,
    /// XA transactions prepared and not decided here (see [`crate::binlog::xa`]). While one
    /// with changes of mapped tables is held, `file`/`pos` is where its event group begins (a
    /// restart reads it again) and `xa.applied` the end of the last transaction applied.
    #[serde(default, skip_serializing_if = "XaCheckpoint::is_empty")]
    pub xa: XaCheckpoint,
}

fn is_empty_json(j: &JsonColumns) -> bool {
    j.0.is_empty()
}

impl Checkpoint {
    /// What the reader starts from at this checkpoint.
    pub fn read_state(&self) -> ReadState {
        ReadState { names: self.renamed.clone(), json: self.json_columns.clone(), xa: self.xa.clone() }
    }
}

fn is_empty_names(n: &TableNames) -> bool {
    n.0.is_empty()
}

/// The GTID state of acknowledged transactions, as the checkpoint saves it: the MariaDB GTID
/// position (last GTID per domain), or the MySQL GTID set of every transaction before the
/// checkpoint (seeded where the run started: the checkpoint's set, `Executed_Gtid_Set` of a
/// `current` start, a file's PREVIOUS_GTIDS event; then every acknowledged GTID added).
#[derive(Debug, Default, Clone)]
pub struct GtidState {
    mariadb: MariadbGtidPosition,
    mysql: MysqlGtidSet,
    /// The MySQL set holds every GTID before the position, not only those read since the start
    /// (a start at `FILE:POS` knows them only after the next PREVIOUS_GTIDS event, at the next
    /// binlog file).
    mysql_complete: bool,
}

impl GtidState {
    /// The state saved in a checkpoint's `gtid` field: a MariaDB GTID position, or a MySQL GTID
    /// set (`complete`: saved with a server identity by a binval that saves whole sets; older
    /// checkpoints hold the last MySQL GTID only).
    pub fn from_saved(saved: &str, complete: bool) -> Self {
        let mut g = GtidState::default();
        if let Ok(p) = saved.parse::<MariadbGtidPosition>() {
            g.mariadb = p;
        } else if let Ok(set) = saved.parse::<MysqlGtidSet>() {
            g.mysql = set;
            g.mysql_complete = complete;
        }
        g
    }

    /// A MariaDB GTID position known to be the whole state at the start.
    pub fn from_mariadb(p: MariadbGtidPosition) -> Self {
        GtidState { mariadb: p, ..Default::default() }
    }

    /// A MySQL GTID set known to be every GTID before the start.
    pub fn from_mysql(set: MysqlGtidSet) -> Self {
        GtidState { mysql: set, mysql_complete: true, ..Default::default() }
    }

    /// Record the GTID of an acknowledged transaction: a MariaDB `domain-server-seq` becomes
    /// the last of its domain; a MySQL `uuid:n` (`uuid:tag:n`) joins the set.
    pub fn record(&mut self, gtid: &str) {
        match gtid.parse::<MariadbGtid>() {
            Ok(g) => self.mariadb.record(g),
            Err(_) => {
                if self.mysql.add_gtid(gtid).is_err() {
                    tracing::warn!(gtid, "a GTID that is neither MariaDB's nor MySQL's form: not kept in the checkpoint");
                }
            }
        }
    }

    /// MySQL: the GTIDs of every transaction before the next one (a PREVIOUS_GTIDS event at the
    /// start of a binlog file) — from here on the set is whole.
    pub fn record_previous(&mut self, previous: &MysqlGtidSet) {
        self.mysql.union(previous);
        self.mysql_complete = true;
    }

    /// The MariaDB GTID position, when one is known.
    pub fn mariadb(&self) -> Option<&MariadbGtidPosition> {
        (!self.mariadb.is_empty()).then_some(&self.mariadb)
    }

    /// The MySQL GTID set, when it holds every GTID before the position.
    pub fn mysql(&self) -> Option<&MysqlGtidSet> {
        (self.mysql_complete && !self.mysql.is_empty()).then_some(&self.mysql)
    }

    /// `0-1-5,1-2-7`, or the MySQL set (whole sets only), or `None`.
    pub fn render(&self) -> Option<String> {
        if let Some(p) = self.mariadb() {
            Some(p.to_string())
        } else {
            self.mysql().map(|s| s.to_string())
        }
    }
}

/// Where the positions of a tenure come from, saved with each checkpoint: the server they
/// belong to and the fence epoch of the writes made from them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The server the tenure reads (see [`ServerIdentity`]).
    pub server: Option<ServerIdentity>,
    /// `source.fence_epoch`.
    pub fence_epoch: u8,
}

/// Where checkpoints are read from and written to.
pub enum CheckpointStoreImpl {
    /// In Redis under `key`; saves are fenced by `fencing_token` against the counter at
    /// `fencing_token_key` (see [`crate::ha::lease`]).
    Redis { conn: RedisConn, source_name: String, key: String, fencing_token_key: String, fencing_token: Option<u64> },
    /// In a file.
    File { path: PathBuf },
}

impl CheckpointStoreImpl {
    /// Build the store for `source_name`.
    pub fn new(cfg: &CheckpointConfig, source_name: &str, redis: &RedisConn) -> Self {
        match cfg.store {
            CheckpointStore::Redis => CheckpointStoreImpl::Redis {
                conn: redis.clone(),
                source_name: source_name.to_string(),
                key: checkpoint_key(source_name),
                fencing_token_key: crate::ha::lease::fencing_token_key(source_name),
                fencing_token: None,
            },
            CheckpointStore::File => CheckpointStoreImpl::File { path: cfg.path.clone().expect("validated") },
        }
    }

    /// Fence every later save (Redis store) with the fencing token of this instance's lease.
    pub fn set_fencing_token(&mut self, t: u64) {
        if let CheckpointStoreImpl::Redis { fencing_token, .. } = self {
            *fencing_token = Some(t);
        }
    }

    /// Human-readable location, for logs and errors.
    pub fn location(&self) -> String {
        match self {
            CheckpointStoreImpl::Redis { key, .. } => format!("redis key {key}"),
            CheckpointStoreImpl::File { path } => format!("file {}", path.display()),
        }
    }

    /// Load the saved checkpoint, if any. A present but unreadable one is a definite error
    /// (binval never guesses a start position).
    pub async fn load(&mut self) -> Result<Option<Checkpoint>, Error> {
        let loc = self.location();
        let text = match self {
            CheckpointStoreImpl::Redis { conn, key, .. } => {
                conn.get(key).await.map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?
            }
            CheckpointStoreImpl::File { path } => match tokio::fs::read_to_string(&*path).await {
                Ok(t) => Some(t),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(file_error(&loc, e)),
            },
        };
        match text {
            None => Ok(None),
            Some(t) => {
                let cp: Checkpoint =
                    serde_json::from_str(&t).map_err(|e| DefiniteError::BadCheckpoint { location: loc, message: e.to_string() })?;
                crate::telemetry::checkpoint_recorded(&cp.file, cp.pos, cp.saved_at_ms);
                Ok(Some(cp))
            }
        }
    }

    /// Save `cp`.
    pub async fn save(&mut self, cp: &Checkpoint) -> Result<(), Error> {
        let loc = self.location();
        let text = serde_json::to_string(cp).expect("checkpoint serializes");
        match self {
            CheckpointStoreImpl::Redis { conn, key, fencing_token: None, .. } => {
                conn.set(key, &text).await.map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?
            }
            CheckpointStoreImpl::Redis { conn, source_name, key, fencing_token_key, fencing_token: Some(t) } => {
                let ok: i64 = conn
                    .eval(SAVE_FENCED, &[key.clone(), fencing_token_key.clone()], &[text, t.to_string()])
                    .await
                    .map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?;
                if ok != 1 {
                    return Err(TransientError::LeaseLost {
                        source_name: source_name.clone(),
                        message: format!("checkpoint save refused: fencing token {t} is no longer the newest"),
                    }
                    .into());
                }
            }
            CheckpointStoreImpl::File { path } => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_atomically(&path, text.as_bytes()))
                    .await
                    .expect("checkpoint write task")
                    .map_err(|e| file_error(&loc, e))?
            }
        }
        crate::telemetry::checkpoint_recorded(&cp.file, cp.pos, cp.saved_at_ms);
        Ok(())
    }
}

/// A file store error: a path that can never work (permission denied, a parent that is a file,
/// a read-only file system) is a definite configuration error naming `checkpoint.path`;
/// anything else (disk full, I/O) is retried.
fn file_error(loc: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind::*;
    match e.kind() {
        PermissionDenied | NotADirectory | ReadOnlyFilesystem | IsADirectory | InvalidFilename => {
            Error::config("checkpoint.path", format!("{loc}: {e}"))
        }
        _ => TransientError::Checkpoint(format!("{loc}: {e}")).into(),
    }
}

/// Save the checkpoint only when `ARGV[2]` is still the newest fencing token (`KEYS[2]`).
const SAVE_FENCED: &str = r#"
if redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"#;

/// Redis key of the checkpoint of source `name`; shares the `{name}` hash tag with the lease
/// keys so the fenced save script can read the fencing token in a cluster.
pub fn checkpoint_key(name: &str) -> String {
    format!("binval:{{{name}}}:checkpoint")
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(if dir.as_os_str().is_empty() { std::path::Path::new(".") } else { dir }) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Build a checkpoint for an acknowledged position, with the reader's state as of it. While an
/// XA transaction with changes of mapped tables is held (`state.xa.hold`), the position saved
/// is where it begins, and `pos` (or, if later, the applied position of the checkpoint the run
/// started from) is saved as `xa.applied` (see [`crate::binlog::xa`]).
pub fn checkpoint_at(pos: &SourcePosition, gtids: &GtidState, state: &ReadState, origin: &Origin) -> Checkpoint {
    let (at, applied) = match &state.xa.hold {
        Some(hold) => {
            let key = |p: &SourcePosition| BinlogPosition::from(p).order_key();
            let applied = match &state.xa.applied {
                Some(a) if key(a) > key(pos) => a.clone(),
                _ => SourcePosition { gtid: None, ..pos.clone() },
            };
            (hold, Some(applied))
        }
        None => (pos, None),
    };
    Checkpoint {
        file: at.file.clone(),
        pos: at.pos,
        gtid: gtids.render(),
        server: origin.server.clone(),
        fence_epoch: Some(origin.fence_epoch),
        saved_at_ms: crate::now_ms(),
        renamed: state.names.clone(),
        json_columns: state.json.clone(),
        xa: XaCheckpoint { open: state.xa.open.clone(), hold: None, applied },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtid_state_keeps_last_per_domain() {
        let mut g = GtidState::default();
        g.record("0-1-5");
        g.record("1-2-3");
        g.record("0-1-6");
        assert_eq!(g.render().as_deref(), Some("0-1-6,1-2-3"));
    }

    #[test]
    fn gtid_state_keeps_the_mysql_set_once_whole_and_reads_what_it_saved() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let mut g = GtidState::default();
        assert_eq!(g.render(), None);
        g.record(&format!("{u}:22"));
        g.record(&format!("{u}:23"));
        assert_eq!(g.render(), None, "GTIDs read since a FILE:POS start are not the whole set");
        g.record_previous(&format!("{u}:1-21").parse().unwrap());
        assert_eq!(g.render(), Some(format!("{u}:1-23")));
        let saved = GtidState::from_saved(&format!("{u}:1-23"), true);
        assert_eq!(saved.mysql().map(|s| s.to_string()), Some(format!("{u}:1-23")));
        assert_eq!(GtidState::from_saved(&format!("{u}:23"), false).mysql(), None, "an older checkpoint's last GTID is no set");
        assert_eq!(GtidState::from_saved("1-2-3,0-1-6", false).render().as_deref(), Some("0-1-6,1-2-3"));
    }

    #[tokio::test]
    async fn file_round_trip() {
        let dir = std::env::temp_dir().join(format!("binval-cp-{}", std::process::id()));
        let mut s = CheckpointStoreImpl::File { path: dir.join("cp.json") };
        assert_eq!(s.load().await.unwrap(), None);
        let mut renamed = TableNames::default();
        renamed.0.insert("shop.goods".into(), Some("shop.items".into()));
        let cp = Checkpoint {
            file: "mysql-bin.000002".into(),
            pos: 1234,
            gtid: Some("0-1-9".into()),
            server: Some(ServerIdentity { server_id: 7, server_uuid: None }),
            fence_epoch: Some(0),
            saved_at_ms: 1,
            renamed,
            json_columns: JsonColumns::default(),
            xa: XaCheckpoint::default(),
        };
        s.save(&cp).await.unwrap();
        assert_eq!(s.load().await.unwrap(), Some(cp));
        std::fs::write(dir.join("cp.json"), "nonsense").unwrap();
        let e = s.load().await.unwrap_err().to_string();
        assert!(e.contains("cp.json") && e.contains("unreadable"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
