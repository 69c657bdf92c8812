//! Errors, split the way an operator acts on them:
//!
//! * [`Error::Definite`]: retrying cannot help (bad config, wrong server settings, a purged
//!   start position, a row binval cannot decode exactly). The pipeline halts with a message
//!   naming the setting, table or position, and exits non-zero. Nothing after the failing
//!   position is acknowledged.
//! * [`Error::Transient`]: the network or a service is briefly unavailable. The stage retries
//!   with exponential backoff and resumes from the last acknowledged position; nothing is lost.
//!
//! The classifiers of the three outside services live here together, so one table says what
//! binval retries: [`classify_mysql`] (server error codes), [`classify_redis`] (error kinds and
//! server error prefixes) and [`classify_kafka`] (librdkafka / Kafka protocol error codes, see
//! [`kafka_is_definite`]). Everything a classifier does not know is transient: an unknown
//! failure is retried (and logged) rather than stopping a pipeline that may recover.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use redis::RedisError;

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
    #[error("the source does not have binlog position {position}: {message}. The position was purged, is not an event boundary, or lies beyond the end, and no GTID of it can be resumed by here, so binval cannot read the changes since then (it never silently starts from now). To recover without serving stale rows: delete the checkpoint (Redis key binval:{{<source.name>}}:checkpoint and its copies binval:{{<source.name>~cp<n>}}:checkpoint, or the checkpoint file), set source.start to the primary's position now (`SHOW MASTER STATUS`, e.g. BINVAL__SOURCE__START=mysql-bin.000042:4 for that one start), start `binval run`, then run `binval bootstrap --restart` (rewrites every mapped row at a fenced position) and `binval verify --repair` (removes keys of rows deleted meanwhile); see README \"Incidents\"")]
    PositionGone { position: String, message: String },
    /// No checkpoint (nor a copy of it) was found, `source.start` is `current`, and an earlier
    /// run of the source left traces (`ha::traces`) from which the start cannot be recovered
    /// (`binlog::start_plan`): starting at the primary's position now would skip whatever
    /// that run had not applied.
    #[error("no checkpoint of source {source_name} in {location}, but an earlier run of it left traces: {found}. {message}")]
    EarlierRunLost { source_name: String, location: String, found: String, message: String },
    /// The checkpoint's position belongs to another server and cannot be translated to this
    /// one (see `binlog::start_plan`).
    #[error("the checkpoint {checkpoint} cannot be resumed on this server ({server}): {message}")]
    ResumeElsewhere { checkpoint: String, server: String, message: String },
    /// A start position an operator gave cannot be read from (see `binlog::boundary`).
    #[error("{origin} {position} is not a place to start reading: {message}")]
    StartPosition { origin: String, position: String, message: String },
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
    /// The source account lacks privileges a command needs (`binval check`, see
    /// `security::grants`): each one with the statement that grants it.
    #[error("the source account {account} lacks privileges binval needs: {missing}")]
    MissingPrivileges { account: String, missing: String },
    /// Redis refused a write for a reason retrying cannot fix (wrong type, OOM with noeviction, ...).
    #[error("redis refused a write of key {key}: {message}")]
    RedisRefused { key: String, message: String },
    /// Kafka refused an event for a reason retrying cannot fix.
    #[error("kafka refused the event for key {key} on topic {topic}: {message}")]
    KafkaRefused { key: String, topic: String, message: String },
    /// A RENAME that moves a mapped table onto the name of another mapping (see
    /// `mapping::TableNames::rename_statement`).
    #[error(
        "{kind} at binlog position {position} moves table {table} (mapped by the mapping of {mapping}) onto {onto}, where the mapping of {other} applies: two mappings on one table would mix their keys, and the binlog does not say which one you mean, so binval stops before the statement. Statement: {statement}. Remove one of the two mappings and restart: binval reads the statement again (with only {other} mapped, it stays with the name {onto} and its keys are marked stale; with only {mapping}, it follows its table to {onto})",
        table = conflict.table, mapping = conflict.mapping, onto = conflict.onto, other = conflict.other
    )]
    RenameConflict { kind: &'static str, position: String, conflict: Box<crate::mapping::RenameConflict>, statement: String },
    /// The source writes events binval cannot decode or must not pass over (an unknown
    /// non-ignorable event type, an INCIDENT, MariaDB legacy temporal columns, a binlog file
    /// past 4 GiB).
    #[error("{0}")]
    UnsupportedEvent(String),
    /// The metrics endpoint could not be started (address in use, bad address).
    #[error("metrics endpoint: {0}")]
    MetricsListen(#[source] crate::telemetry::MetricsError),
    /// A mapping no longer fits the table the binlog describes (e.g. a key column was dropped).
    #[error("mapping of table {table} at binlog position {position}: {message}")]
    MappingBroken { table: String, position: String, message: String },
    /// The fence position (the order of writes) of a transaction cannot be derived.
    #[error("cannot order the writes of the transaction at {position}: {message}")]
    Fence { position: String, message: String },
    /// A task of the pipeline panicked. A panic is a bug in binval, not a state of the world:
    /// restarting would most likely hit it again at the same transaction (a restart resumes
    /// from the checkpoint), looping forever while hiding it. So binval stops and names the
    /// task and the panic message, for a bug report; nothing after the checkpoint is
    /// acknowledged.
    #[error("internal error (a bug, please report it): the {task} task panicked: {message}")]
    TaskPanicked { task: &'static str, message: String },
    /// The checkpoint store holds something that is not a checkpoint.
    #[error("checkpoint at {location} is unreadable: {message}")]
    BadCheckpoint { location: String, message: String },
    /// A mapped table cannot be read by a table scan (`binval bootstrap`, `verify`,
    /// `inspect`): it does not exist, has no key to scan in order, or the source refused the
    /// query (a `--where` filter it cannot run, a missing SELECT grant).
    #[error("table {table}: {message}")]
    Scan { table: String, message: String },
    /// Key templates that do not identify a row of their table, and whose mapping does not
    /// accept that (`binlog::server::judge_key_templates`): one line per template, `; `-joined.
    /// Not a config error (the file is valid; the table's keys do not fit it), so exit 1.
    #[error("mapping keys that do not identify a row: {0}")]
    KeysNotUnique(String),
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
    /// One of binval's own tasks (`apply`, `checkpoint`, the pipeline of a tenure) stopped or
    /// was cancelled while another still needed it: the tenure restarts from its checkpoint.
    /// What failed is reported by the task itself; this is what its partner saw.
    #[error("the {task} task stopped: {message}")]
    Task { task: &'static str, message: String },
    /// binval's local disk: a large transaction's row events or an XA transaction could not be
    /// held in `source.spill_dir`, or output could not be written.
    #[error("local disk: {0}")]
    LocalDisk(String),
    /// The server behind `source.url` is another one than the tenure planned its start on (a
    /// failover behind a DNS name or virtual IP): the tenure restarts, and its new start plan
    /// resumes by GTID (`binlog::start_plan`).
    #[error("the source server changed from {from} to {to}: restarting from the checkpoint, resumed by GTID on the new server")]
    SourceChanged { from: String, to: String },
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
    counted("source", classify_mysql_inner(e, position))
}

fn classify_mysql_inner(e: mysql_async::Error, position: &str) -> Error {
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

/// Classify a Redis error of a command on `key` (a key or a SCAN pattern).
///
/// Transient: I/O, timeouts, dropped or refused connections, cluster moves/down/try-again,
/// LOADING, BUSY, MASTERDOWN, READONLY, OOM, NOSCRIPT. Definite ([`DefiniteError::RedisRefused`]):
/// everything the server refuses for the data itself (WRONGTYPE, ...).
pub fn classify_redis(e: RedisError, key: &str) -> Error {
    let retry = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(e.kind(), redis::ErrorKind::Server(_)) && {
            let s = e.to_string();
            ["LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM", "NOSCRIPT"].iter().any(|c| s.contains(c))
        };
    counted(
        "redis",
        if retry {
            TransientError::Redis(format!("key {key}: {e}")).into()
        } else {
            DefiniteError::RedisRefused { key: key.into(), message: e.to_string() }.into()
        },
    )
}

/// Whether a Kafka error code means retrying cannot help (librdkafka's
/// `rd_kafka_resp_err_t`: Kafka protocol errors >= 0, librdkafka's own errors < 0).
///
/// | code | definite because |
/// |---|---|
/// | `MSG_SIZE_TOO_LARGE` (10) | the event is larger than the producer's or the broker's `message.max.bytes`: it never fits |
/// | `TOPIC_AUTHORIZATION_FAILED` (29), `GROUP_AUTHORIZATION_FAILED` (30), `CLUSTER_AUTHORIZATION_FAILED` (31) | the broker's ACLs refuse binval's principal until an operator changes them |
/// | `SASL_AUTHENTICATION_FAILED` (58), `_AUTHENTICATION` (-169) | wrong credentials in `kafka.properties` |
/// | `UNKNOWN_TOPIC_OR_PART` (3), `_UNKNOWN_TOPIC` (-188), `_UNKNOWN_PARTITION` (-190), only when `kafka.create_topic` is false | nobody creates the topic; with `create_topic` true it is being created (metadata propagation): transient |
/// | `INVALID_CONFIG` (40), `_INVALID_ARG` (-186) | a setting binval passes (`kafka.properties`) is refused |
///
/// Everything else (broker down, leader moves, timeouts, a full queue, throttling, ...) is
/// transient.
pub fn kafka_is_definite(code: RDKafkaErrorCode, create_topic: bool) -> bool {
    use RDKafkaErrorCode::*;
    match code {
        MessageSizeTooLarge
        | TopicAuthorizationFailed
        | GroupAuthorizationFailed
        | ClusterAuthorizationFailed
        | SaslAuthenticationFailed
        | Authentication
        | InvalidConfig
        | InvalidArgument => true,
        UnknownTopicOrPartition | UnknownTopic | UnknownPartition => !create_topic,
        _ => false,
    }
}

/// Classify a Kafka error met while publishing the event of `key` to `topic` (enqueueing it
/// or awaiting its delivery): definite per [`kafka_is_definite`] as
/// [`DefiniteError::KafkaRefused`] naming key and topic, else [`TransientError::Kafka`] with
/// `context` (what was being done) and the error. A client configuration error
/// (`KafkaError::ClientConfig`, a bad `kafka.properties` entry) is definite too.
pub fn classify_kafka(e: &KafkaError, key: &str, topic: &str, create_topic: bool, context: &str) -> Error {
    let definite = match e {
        KafkaError::ClientConfig(..) => true,
        e => e.rdkafka_error_code().is_some_and(|c| kafka_is_definite(c, create_topic)),
    };
    counted(
        "kafka",
        if definite {
            DefiniteError::KafkaRefused { key: key.into(), topic: topic.into(), message: e.to_string() }.into()
        } else {
            TransientError::Kafka(format!("{context}: {e}")).into()
        },
    )
}

/// Count a classified error in `binval_errors_total{service, kind}` and return it.
fn counted(service: &'static str, e: Error) -> Error {
    crate::telemetry::error_classified(service, !e.is_transient());
    e
}

/// The outcome of a pipeline task that did not return by itself: a panic becomes
/// [`DefiniteError::TaskPanicked`] (a bug, see there); a cancelled task (the runtime shutting
/// down) is transient.
pub fn task_failed(task: &'static str, e: tokio::task::JoinError) -> Error {
    if e.is_panic() {
        let p = e.into_panic();
        let message = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        DefiniteError::TaskPanicked { task, message }.into()
    } else {
        TransientError::Task { task, message: format!("cancelled: {e}") }.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_codes_definite_or_transient() {
        use RDKafkaErrorCode::*;
        for c in [
            MessageSizeTooLarge,
            TopicAuthorizationFailed,
            GroupAuthorizationFailed,
            ClusterAuthorizationFailed,
            SaslAuthenticationFailed,
            Authentication,
            InvalidConfig,
            InvalidArgument,
        ] {
            assert!(kafka_is_definite(c, true) && kafka_is_definite(c, false), "{c:?} is definite");
        }
        for c in [UnknownTopicOrPartition, UnknownTopic, UnknownPartition] {
            assert!(kafka_is_definite(c, false), "{c:?} without topic creation is definite");
            assert!(!kafka_is_definite(c, true), "{c:?} while the topic is created is transient");
        }
        for c in [
            QueueFull,
            MessageTimedOut,
            AllBrokersDown,
            BrokerTransportFailure,
            NotLeaderForPartition,
            RequestTimedOut,
            LeaderNotAvailable,
            NetworkException,
            NotEnoughReplicas,
            Fail,
        ] {
            assert!(!kafka_is_definite(c, false), "{c:?} is transient");
        }
        let e = classify_kafka(&KafkaError::MessageProduction(MessageSizeTooLarge), "item:1", "t", true, "enqueue");
        assert!(matches!(e, Error::Definite(DefiniteError::KafkaRefused { .. })), "{e}");
        assert!(e.to_string().contains("item:1") && e.to_string().contains("topic t"), "{e}");
        let e =
            classify_kafka(&KafkaError::MessageProduction(RequestTimedOut), "item:1", "t", true, "delivery of event for key item:1 failed");
        assert!(e.is_transient() && e.to_string().contains("delivery of event for key item:1"), "{e}");
    }

    #[tokio::test]
    async fn a_panicked_task_is_a_definite_error_naming_task_and_message() {
        let e = tokio::spawn(async { panic!("boom at 42") }).await.unwrap_err();
        let e = task_failed("apply", e);
        assert!(!e.is_transient());
        assert!(e.to_string().contains("apply task panicked: boom at 42"), "{e}");
    }
}
