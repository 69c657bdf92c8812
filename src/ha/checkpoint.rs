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
//!
//! # Copies on other masters (Redis Cluster)
//!
//! The checkpoint key shares the `{<source name>}` hash tag with the lease and the fencing-token
//! counter (the fenced save reads the counter in the same script), so all three live on one
//! master. A master that loses its data (FLUSHALL, a restart without persistence, a failover to
//! an empty replica) would take the checkpoint with it, and the next tenure would not know
//! where the last one stopped (issue #22, cause 4). So on a Cluster every save also writes
//! `checkpoint.copies - 1` **copies** (default 2) to keys whose hash tags put them on *other*
//! masters: `binval:{<name>~cp<n>}:checkpoint` for the first `n` in `1..=64` whose slot a
//! master not yet holding one owns, chosen from the slot map at each save. A copy is a hash
//! `{c: the checkpoint JSON, f: the fencing token of its writer}`, written by a script that
//! refuses a writer with an older token than the one stored (the lease's counter is on another
//! master, so the copy carries its own fence, as replicas do).
//!
//! [`CheckpointStoreImpl::load`] takes the checkpoint key when it is there (every save writes
//! it first, so it is never older than a copy of the same tenure); when it is missing (or
//! unreadable) it reads every candidate copy key and takes the newest valid copy (highest
//! fencing token, then latest `saved_at_ms`), naming it in the log, `binval check` and
//! [`CheckpointStoreImpl::loaded_from`]. Without any copy left (standalone Redis, `copies = 1`,
//! or every master holding one lost), the start plan looks for what an earlier run left and
//! recovers the start from the topic ([`crate::ha::traces`], [`crate::binlog::start_plan`]).
//! A copy that fails to save (its master is down) is logged and skipped: the checkpoint key
//! stays authoritative and the pipeline does not stall for a copy.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use binval_protocol::{hash_slot, BinlogPosition, MariadbGtid, MariadbGtidPosition, MysqlGtidSet, SourcePosition};
use serde::{Deserialize, Serialize};

use crate::binlog::json_columns::JsonColumns;
use crate::binlog::reader::ReadState;
use crate::binlog::server::ServerIdentity;
use crate::binlog::xa::XaCheckpoint;
use crate::config::{CheckpointConfig, CheckpointStore};
use crate::error::{DefiniteError, Error, TransientError};
use crate::mapping::TableNames;
use crate::redis::RedisConn;

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
    /// The fencing token of the tenure that saved it (stamped by [`CheckpointStoreImpl::save`]);
    /// orders copies of different tenures when the checkpoint key is lost. `None` in
    /// checkpoints of older binval versions (read as 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<u64>,
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

/// Most checkpoint copies `checkpoint.copies` may ask for (the checkpoint key included).
pub const MAX_COPIES: usize = 8;

/// Candidate copy keys `binval:{<name>~cp<n>}:checkpoint`, `n` in `1..=COPY_CANDIDATES`: enough
/// that every master of a Cluster owns the slot of one with near certainty (64 keys over 8
/// masters each miss a given one with probability (7/8)^64 < 0.02 %), few enough to read them
/// all in one batch when the checkpoint key is lost.
pub const COPY_CANDIDATES: usize = 64;

/// The Redis store's state (see [`CheckpointStoreImpl::Redis`]).
pub struct RedisStore {
    conn: RedisConn,
    source_name: String,
    key: String,
    fencing_token_key: String,
    fencing_token: Option<u64>,
    /// `checkpoint.copies` on a Cluster, 1 on standalone Redis.
    copies: usize,
    /// The copy key the last load took the checkpoint from (`None`: the checkpoint key).
    loaded_from: Option<String>,
    /// When a failed copy save was last logged (one warning per minute).
    copy_warned: Option<Instant>,
}

/// Where checkpoints are read from and written to.
pub enum CheckpointStoreImpl {
    /// In Redis under `binval:{<name>}:checkpoint`, with copies on other masters of a Cluster
    /// (module docs); saves are fenced by the tenure's fencing token against the counter (see
    /// [`crate::ha::lease`]), copies by the token they hold.
    Redis(Box<RedisStore>),
    /// In a file.
    File { path: PathBuf },
}

/// The RENAMEs of mapped tables `binval run` followed, from its checkpoint (none without one):
/// what bootstrap, verify, inspect and replay read a mapped table's current name from
/// ([`TableNames::live_name`]).
pub async fn followed_renames(cfg: &crate::config::Config, redis: &RedisConn) -> Result<TableNames, Error> {
    let mut store = CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, redis);
    Ok(store.load().await?.map(|c| c.renamed).unwrap_or_default())
}

impl CheckpointStoreImpl {
    /// Build the store for `source_name`.
    pub fn new(cfg: &CheckpointConfig, source_name: &str, redis: &RedisConn) -> Self {
        match cfg.store {
            CheckpointStore::Redis => CheckpointStoreImpl::Redis(Box::new(RedisStore {
                conn: redis.clone(),
                source_name: source_name.to_string(),
                key: checkpoint_key(source_name),
                fencing_token_key: crate::ha::lease::fencing_token_key(source_name),
                fencing_token: None,
                copies: if matches!(redis, RedisConn::Cluster(..)) { cfg.copies.clamp(1, MAX_COPIES) } else { 1 },
                loaded_from: None,
                copy_warned: None,
            })),
            CheckpointStore::File => CheckpointStoreImpl::File { path: cfg.path.clone().expect("validated") },
        }
    }

    /// The copy key the last [`load`](Self::load) took the checkpoint from, when it was not the
    /// checkpoint key itself (that one was missing or unreadable).
    pub fn loaded_from(&self) -> Option<&str> {
        match self {
            CheckpointStoreImpl::Redis(r) => r.loaded_from.as_deref(),
            CheckpointStoreImpl::File { .. } => None,
        }
    }

    /// The keys the next save writes copies to (Redis Cluster, `checkpoint.copies` > 1): one per
    /// master other than the checkpoint key's, from binval's slot map. Empty otherwise.
    pub fn copy_keys(&self) -> Vec<String> {
        match self {
            CheckpointStoreImpl::Redis(r) => r.copy_targets(),
            CheckpointStoreImpl::File { .. } => Vec::new(),
        }
    }

    /// Fence every later save (Redis store) with the fencing token of this instance's lease.
    pub fn set_fencing_token(&mut self, t: u64) {
        if let CheckpointStoreImpl::Redis(r) = self {
            r.fencing_token = Some(t);
        }
    }

    /// Human-readable location, for logs and errors: the checkpoint key (and how many masters
    /// keep copies), or the file.
    pub fn location(&self) -> String {
        match self {
            CheckpointStoreImpl::Redis(r) if r.copies > 1 => {
                format!(
                    "redis key {} (with copies on up to {} other masters: binval:{{{}~cp<n>}}:checkpoint)",
                    r.key,
                    r.copies - 1,
                    r.source_name
                )
            }
            CheckpointStoreImpl::Redis(r) => format!("redis key {}", r.key),
            CheckpointStoreImpl::File { path } => format!("file {}", path.display()),
        }
    }

    /// Load the saved checkpoint, if any: the checkpoint key, else (Redis Cluster) the newest
    /// valid copy (module docs; [`loaded_from`](Self::loaded_from) names it). A present but
    /// unreadable checkpoint with no valid copy beside it is a definite error (binval never
    /// guesses a start position).
    pub async fn load(&mut self) -> Result<Option<Checkpoint>, Error> {
        let loc = self.location();
        let cp = match self {
            CheckpointStoreImpl::Redis(r) => r.load(&loc).await?,
            CheckpointStoreImpl::File { path } => match tokio::fs::read_to_string(&*path).await {
                Ok(t) => {
                    Some(serde_json::from_str(&t).map_err(|e| DefiniteError::BadCheckpoint { location: loc, message: e.to_string() })?)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(file_error(&loc, e)),
            },
        };
        if let Some(cp) = &cp {
            crate::telemetry::checkpoint_recorded(&cp.file, cp.pos, cp.saved_at_ms);
        }
        Ok(cp)
    }

    /// Save `cp` (stamped with the store's fencing token): the checkpoint key, then (Redis
    /// Cluster) its copies. Errors: the checkpoint key's save failed (transient) or was refused
    /// under a newer fencing token ([`TransientError::LeaseLost`]); copies that fail are logged.
    pub async fn save(&mut self, cp: &Checkpoint) -> Result<(), Error> {
        let loc = self.location();
        match self {
            CheckpointStoreImpl::Redis(r) => r.save(cp, &loc).await?,
            CheckpointStoreImpl::File { path } => {
                let text = serde_json::to_string(cp).expect("checkpoint serializes");
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

impl RedisStore {
    async fn load(&mut self, loc: &str) -> Result<Option<Checkpoint>, Error> {
        self.loaded_from = None;
        let text = self.conn.get(&self.key).await.map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?;
        let unreadable = match text.as_deref().map(serde_json::from_str::<Checkpoint>) {
            Some(Ok(cp)) => return Ok(Some(cp)),
            Some(Err(e)) => Some(e.to_string()),
            None => None,
        };
        if !matches!(self.conn, RedisConn::Cluster(..)) {
            return match unreadable {
                Some(message) => Err(DefiniteError::BadCheckpoint { location: loc.to_string(), message }.into()),
                None => Ok(None),
            };
        }
        let (copy, bad, unreachable) = self.newest_copy().await?;
        if copy.is_none() && !unreachable.is_empty() {
            // A master that is down may hold the newest copy: try again rather than go on
            // without one.
            return Err(TransientError::Checkpoint(format!(
                "{loc}: the checkpoint key is {} and its copies cannot all be read now: {}",
                if unreadable.is_some() { "unreadable" } else { "missing" },
                unreachable.join("; ")
            ))
            .into());
        }
        match (copy, unreadable) {
            (Some((key, cp)), why) => {
                tracing::warn!(
                    copy = %key,
                    checkpoint_key = %self.key,
                    position = %format!("{}:{}", cp.file, cp.pos),
                    fencing_token = cp.fencing_token.unwrap_or(0),
                    saved_at_ms = cp.saved_at_ms,
                    "the checkpoint key is {}: using its newest copy",
                    match &why { Some(e) => format!("unreadable ({e})"), None => "missing (its master lost its data?)".into() }
                );
                self.loaded_from = Some(key);
                Ok(Some(cp))
            }
            (None, Some(message)) => Err(DefiniteError::BadCheckpoint { location: loc.to_string(), message }.into()),
            (None, None) if !bad.is_empty() => Err(DefiniteError::BadCheckpoint {
                location: loc.to_string(),
                message: format!("the checkpoint key is missing and every copy found is unreadable: {}", bad.join("; ")),
            }
            .into()),
            (None, None) => Ok(None),
        }
    }

    /// Every candidate copy key read in one batch: the newest valid copy (fencing token, then
    /// `saved_at_ms`), the unreadable ones and those that could not be read now (a master
    /// down), each as `key: why`.
    #[allow(clippy::type_complexity)]
    async fn newest_copy(&self) -> Result<(Option<(String, Checkpoint)>, Vec<String>, Vec<String>), Error> {
        let keys: Vec<String> = (1..=COPY_CANDIDATES).map(|n| copy_key(&self.source_name, n)).collect();
        let make = |i: usize| {
            let mut cmd = redis::cmd("HGET");
            cmd.arg(&keys[i]).arg("c");
            (hash_slot(keys[i].as_bytes()), cmd)
        };
        let replies = self.conn.run_batch(keys.len(), &make, None).await;
        let (mut best, mut bad, mut unreachable): (Option<(String, Checkpoint)>, Vec<String>, Vec<String>) = (None, Vec::new(), Vec::new());
        for (key, reply) in keys.iter().zip(replies) {
            let text: Option<String> = match reply.and_then(|v| redis::from_redis_value(v).map_err(redis::RedisError::from)) {
                Ok(t) => t,
                // A master that is down: its copies cannot be read now (the others may do).
                Err(e) if crate::error::classify_redis(e.clone(), key).is_transient() => {
                    unreachable.push(format!("{key}: {e}"));
                    continue;
                }
                // WRONGTYPE and the like: something else holds the key.
                Err(e) => {
                    bad.push(format!("{key}: {e}"));
                    continue;
                }
            };
            let Some(text) = text else { continue };
            match serde_json::from_str::<Checkpoint>(&text) {
                Ok(cp) => {
                    let rank = |c: &Checkpoint| (c.fencing_token.unwrap_or(0), c.saved_at_ms);
                    if best.as_ref().is_none_or(|(_, b)| rank(&cp) > rank(b)) {
                        best = Some((key.clone(), cp));
                    }
                }
                Err(e) => bad.push(format!("{key}: {e}")),
            }
        }
        Ok((best, bad, unreachable))
    }

    /// The keys to write copies to: for each master other than the checkpoint key's, the
    /// first candidate key whose slot it owns, until `copies - 1` masters have one.
    fn copy_targets(&self) -> Vec<String> {
        if self.copies <= 1 {
            return Vec::new();
        }
        self.conn
            .with_slot_map(|map| {
                let mut used = vec![map.master_of_slot(hash_slot(self.key.as_bytes()))];
                let mut out = Vec::new();
                for n in 1..=COPY_CANDIDATES {
                    if out.len() + 1 >= self.copies || used.len() >= map.masters().len() {
                        break;
                    }
                    let k = copy_key(&self.source_name, n);
                    let m = map.master_of_slot(hash_slot(k.as_bytes()));
                    if !used.contains(&m) {
                        used.push(m);
                        out.push(k);
                    }
                }
                out
            })
            .unwrap_or_default()
    }

    async fn save(&mut self, cp: &Checkpoint, loc: &str) -> Result<(), Error> {
        let mut stamped = cp.clone();
        stamped.fencing_token = self.fencing_token.or(cp.fencing_token);
        let text = serde_json::to_string(&stamped).expect("checkpoint serializes");
        match self.fencing_token {
            None => self.conn.set(&self.key, &text).await.map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?,
            Some(t) => {
                let ok: i64 = self
                    .conn
                    .eval(SAVE_FENCED, &[self.key.clone(), self.fencing_token_key.clone()], &[text.clone(), t.to_string()])
                    .await
                    .map_err(|e| TransientError::Checkpoint(format!("{loc}: {e}")))?;
                if ok != 1 {
                    return Err(TransientError::LeaseLost {
                        source_name: self.source_name.clone(),
                        message: format!("checkpoint save refused: fencing token {t} is no longer the newest"),
                    }
                    .into());
                }
            }
        }
        let targets = self.copy_targets();
        if targets.is_empty() {
            return Ok(());
        }
        let token = self.fencing_token.unwrap_or(0).to_string();
        let make = |i: usize| {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(SAVE_COPY).arg(1).arg(&targets[i]).arg(&text).arg(&token);
            (hash_slot(targets[i].as_bytes()), cmd)
        };
        let replies = self.conn.run_batch(targets.len(), &make, None).await;
        let mut failed = Vec::new();
        for (key, reply) in targets.iter().zip(replies) {
            match reply.and_then(|v| redis::from_redis_value::<i64>(v).map_err(redis::RedisError::from)) {
                Ok(1) => {}
                Ok(_) => failed.push(format!("{key}: holds a copy of a newer fencing token than {token}")),
                Err(e) => failed.push(format!("{key}: {e}")),
            }
        }
        if !failed.is_empty() && self.copy_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
            self.copy_warned = Some(Instant::now());
            tracing::warn!(failed = %failed.join("; "), "checkpoint copies not saved (the checkpoint key was): a loss of its master now would fall back to an older copy or the topic");
        }
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

/// Write a checkpoint copy (module docs): `KEYS[1]` = the copy key, `ARGV` = the checkpoint
/// JSON, the writer's fencing token. Refused (0) when the copy holds a newer token.
const SAVE_COPY: &str = r#"
local function newer(a, b)
  if #a ~= #b then return #a > #b end
  return a > b
end
local f = redis.call('HGET', KEYS[1], 'f')
if f and newer(f, ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'c', ARGV[1], 'f', ARGV[2])
return 1
"#;

/// Redis key of the checkpoint of source `name`; shares the `{name}` hash tag with the lease
/// keys so the fenced save script can read the fencing token in a cluster.
pub fn checkpoint_key(name: &str) -> String {
    format!("binval:{{{name}}}:checkpoint")
}

/// Redis key of candidate copy `n` (1-based) of the checkpoint of source `name` (module docs).
pub fn copy_key(name: &str, n: usize) -> String {
    format!("binval:{{{name}~cp{n}}}:checkpoint")
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
        fencing_token: None,
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
            fencing_token: None,
        };
        s.save(&cp).await.unwrap();
        assert_eq!(s.load().await.unwrap(), Some(cp));
        std::fs::write(dir.join("cp.json"), "nonsense").unwrap();
        let e = s.load().await.unwrap_err().to_string();
        assert!(e.contains("cp.json") && e.contains("unreadable"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
