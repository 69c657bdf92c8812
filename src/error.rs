//! Errors, split the way an operator acts on them:
//!
//! * [`Error::Definite`]: retrying cannot help (bad config, wrong server settings, a purged
//!   start position, a row binval cannot decode exactly). The pipeline halts with a message
//!   naming the setting, table or position, and exits non-zero. Nothing after the failing
//!   position is acknowledged.
//! * [`Error::Transient`]: the network or a service is briefly unavailable. The stage retries
//!   with exponential backoff and resumes from the last acknowledged position; nothing is lost.

use crate::binlog::decode::DecodeError;
use crate::config::ConfigError;

/// Every failure of the pipeline, classified as definite (halt) or transient (retry).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Retrying cannot help; halt and tell the operator.
    #[error(transparent)]
    Definite(#[from] DefiniteError),
    /// Retry with backoff.
    #[error(transparent)]
    Transient(#[from] TransientError),
}

impl Error {
    /// A definite configuration error: `field` (a config field such as `redis.urls[0]`, or a
    /// command-line flag such as `--from`) cannot be used, because of `reason`. Exit code 2.
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Error {
        DefiniteError::Config(crate::config::ConfigError::Invalid { path: String::new(), field: field.into(), reason: reason.into() })
            .into()
    }

    /// True when the failure may go away by itself.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Transient(_))
    }
}

/// Failures that stop the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum DefiniteError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A server setting binval depends on has the wrong value.
    #[error("source setting {setting} is {found:?}, binval needs {want}: set `{setting}={want}` in the server configuration (my.cnf [mysqld]) or SET GLOBAL {setting}='{want}', then restart binval")]
    SourceSetting { setting: &'static str, found: String, want: &'static str },
    /// The start position is no longer (or never was) in the primary's binlog.
    #[error("the source does not have binlog position {position}: {message}. The position was purged, is not an event boundary, or lies beyond the end. For `run`: the checkpoint (if one exists) wins over source.start, so delete it (Redis key binval:{{<source.name>}}:checkpoint, or the checkpoint file) and set source.start to a position the server has; changes in between are not replayed, so delete the cached keys of the mapped tables first. binval never silently starts from now")]
    PositionGone { position: String, message: String },
    /// A row could not be decoded exactly.
    #[error("at binlog position {position}: {source}")]
    Decode {
        position: String,
        #[source]
        source: DecodeError,
    },
    /// The source rejected binval's request for another definite reason (access denied, bad server_id...).
    #[error("source refused replication: {0}")]
    SourceRefused(String),
    /// Redis refused a write for a reason retrying cannot fix (wrong type, OOM with noeviction, ...).
    #[error("redis refused a write of key {key}: {message}")]
    RedisRefused { key: String, message: String },
    /// Kafka refused an event for a reason retrying cannot fix.
    #[error("kafka refused the event for key {key} on topic {topic}: {message}")]
    KafkaRefused { key: String, topic: String, message: String },
    /// A table-level DDL statement on a mapped table that binval cannot follow (a RENAME onto
    /// the name of another mapped table).
    #[error("{kind} of mapped table {table} at binlog position {position} would leave its cached keys stale; binval stops instead of skipping it. Statement: {statement}. Change the mapping (or unmap the table), then restart")]
    UnsupportedDdl { kind: &'static str, table: String, position: String, statement: String },
    /// The source writes events binval cannot decode or must not pass over (an unknown
    /// non-ignorable event type, an INCIDENT, MariaDB legacy temporal columns, a binlog file
    /// past 4 GiB).
    #[error("{0}")]
    UnsupportedEvent(String),
    /// The metrics endpoint could not be started (address in use, bad address).
    #[error("metrics endpoint: {0}")]
    MetricsListen(String),
    /// A mapping no longer fits the table the binlog describes (e.g. a key column was dropped).
    #[error("mapping of table {table} at binlog position {position}: {message}")]
    MappingBroken { table: String, position: String, message: String },
    /// The fence position (the order of writes) of a transaction cannot be derived.
    #[error("cannot order the writes of the transaction at {position}: {message}")]
    Fence { position: String, message: String },
    /// The checkpoint store holds something that is not a checkpoint.
    #[error("checkpoint at {location} is unreadable: {message}")]
    BadCheckpoint { location: String, message: String },
}

/// Failures that are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum TransientError {
    /// The replica connection failed or dropped.
    #[error("source connection: {0}")]
    Source(String),
    /// The replica connection went silent for longer than three heartbeat periods.
    #[error("source connection silent for {silent_ms} ms (3 heartbeat periods); reconnecting")]
    SourceSilent { silent_ms: u64 },
    /// A Redis command failed for a retryable reason.
    #[error("redis: {0}")]
    Redis(String),
    /// A Kafka delivery failed for a retryable reason.
    #[error("kafka: {0}")]
    Kafka(String),
    /// The checkpoint could not be saved.
    #[error("checkpoint save: {0}")]
    Checkpoint(String),
    /// Another instance holds the lease of this source (its fencing token is newer): this
    /// instance stops writing and waits as standby.
    #[error("lease of source {source_name} lost: {message}; continuing as standby")]
    LeaseLost { source_name: String, message: String },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Classify a mysql_async error. Server errors that name a missing binlog or a refused
/// replica are definite; I/O and driver errors are transient.
pub fn classify_mysql(e: mysql_async::Error, position: &str) -> Error {
    match &e {
        mysql_async::Error::Server(se) => match se.code {
            // ER_MASTER_FATAL_ERROR_READING_BINLOG: purged or unknown log / position.
            1236 => DefiniteError::PositionGone { position: position.into(), message: se.message.clone() }.into(),
            // ER_ACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
            1044 | 1045 | 1227 => DefiniteError::SourceRefused(se.message.clone()).into(),
            _ => TransientError::Source(e.to_string()).into(),
        },
        _ => TransientError::Source(e.to_string()).into(),
    }
}
