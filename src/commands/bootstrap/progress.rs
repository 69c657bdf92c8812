//! Where a bootstrap stands, per table, kept in Redis beside the checkpoint: the hash
//! `binval:{<source.name>}:bootstrap`, one field per table (`schema.table`), its value a JSON
//! [`TableProgress`]. Saved after every chunk whose writes (and events) were acknowledged, so a
//! bootstrap stopped at any point (SIGTERM, kill -9, a lost connection) resumes after the last
//! key saved; the chunk in flight is written again, a no-op where Redis already holds it (the
//! writes are fenced).

use serde::{Deserialize, Serialize};

use crate::error::{classify_redis, DefiniteError, Error};
use crate::redis::RedisConn;
use crate::scan::table::KeyValue;

/// Redis key of source `name`'s bootstrap progress; shares the `{name}` hash tag with the
/// checkpoint and the lease.
pub fn progress_key(name: &str) -> String {
    format!("binval:{{{name}}}:bootstrap")
}

/// One table's progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableProgress {
    /// The scan key of the last row written (`None`: nothing yet).
    #[serde(default)]
    pub last_key: Option<Vec<KeyValue>>,
    /// Rows written so far, over every run of this bootstrap.
    #[serde(default)]
    pub rows: u64,
    /// Key changes written so far.
    #[serde(default)]
    pub key_changes: u64,
    /// The `--where` filter the bootstrap was started with: a resume must use the same.
    #[serde(default)]
    pub filter: Option<String>,
    /// The whole table is done.
    #[serde(default)]
    pub done: bool,
    /// When the bootstrap of the table began, Unix ms.
    #[serde(default)]
    pub started_ms: u64,
    /// When this was saved, Unix ms.
    #[serde(default)]
    pub updated_ms: u64,
    /// The binlog position of the last chunk's snapshot.
    #[serde(default)]
    pub snapshot: Option<String>,
}

/// The progress hash of one source.
pub struct ProgressStore {
    redis: RedisConn,
    key: String,
}

impl ProgressStore {
    /// The store of source `source_name`.
    pub fn new(redis: RedisConn, source_name: &str) -> Self {
        ProgressStore { redis, key: progress_key(source_name) }
    }

    /// The saved progress of `table`, if any. Errors: Redis (classified), a field that is not
    /// a progress record (definite, naming key and field).
    pub async fn load(&self, table: &str) -> Result<Option<TableProgress>, Error> {
        let mut c = self.redis.clone();
        let raw: Option<String> = c.query(redis::cmd("HGET").arg(&self.key).arg(table)).await.map_err(|e| classify_redis(e, &self.key))?;
        raw.map(|t| {
            serde_json::from_str(&t).map_err(|e| {
                DefiniteError::Scan {
                    table: table.to_string(),
                    message: format!("bootstrap progress in {} is unreadable ({e}); remove it with --restart", self.key),
                }
                .into()
            })
        })
        .transpose()
    }

    /// Save the progress of `table`.
    pub async fn save(&self, table: &str, p: &TableProgress) -> Result<(), Error> {
        let text = serde_json::to_string(p).expect("progress serializes");
        let mut c = self.redis.clone();
        let _: i64 = c.query(redis::cmd("HSET").arg(&self.key).arg(table).arg(text)).await.map_err(|e| classify_redis(e, &self.key))?;
        Ok(())
    }

    /// Forget the progress of `table` (`--restart`).
    pub async fn forget(&self, table: &str) -> Result<(), Error> {
        let mut c = self.redis.clone();
        let _: i64 = c.query(redis::cmd("HDEL").arg(&self.key).arg(table)).await.map_err(|e| classify_redis(e, &self.key))?;
        Ok(())
    }
}
