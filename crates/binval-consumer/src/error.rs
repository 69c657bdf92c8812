//! The one error type of this crate.

/// Everything that can go wrong in [`crate::Consumer::builder`]`.build()`, [`crate::Consumer::get`]
/// and [`crate::Consumer::get_json`] (and the other `get_*` variants). Each message names what was being done and on which key,
/// topic or setting. `Clone`, because one fill's outcome is handed to every caller that awaited
/// it (single-flight).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsumerError {
    /// A Redis command or connection failed (not a timeout; see [`ConsumerError::Timeout`]).
    /// `op` names the command and key, e.g. ``HMGET `item:detail:7:r3` d t p``.
    #[error("redis {op} failed: {source}")]
    Redis {
        /// What was being done, e.g. ``HMGET `item:detail:7:r3` d t p`` or `connect to redis://…`.
        op: String,
        /// The client's error.
        #[source]
        source: redis::RedisError,
    },
    /// A Kafka request of the invalidation listener failed (metadata, watermarks, assign,
    /// creating the consumer).
    #[error("kafka {op} failed: {source}")]
    Kafka {
        /// What was being done, e.g. ``fetch metadata of topic `binval.invalidations` ``.
        op: String,
        /// The client's error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// A builder setting is missing or invalid, or the environment does not match it (e.g. the
    /// topic does not exist on the brokers).
    #[error("invalid setting `{field}`: {reason}")]
    Config {
        /// The builder method / setting at fault, e.g. `topic`, `replicas`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// An operation did not complete within its bound. Reads are never retried: the caller
    /// decides what to do (serve a default, fail the request).
    #[error("{op} timed out after {after_ms} ms")]
    Timeout {
        /// What timed out, e.g. ``HMGET `item:detail:7:r3` d t p``.
        op: String,
        /// The bound that was exceeded, milliseconds.
        after_ms: u64,
    },
    /// A value read from Redis is not what it should be: a replica record whose payload is not
    /// UTF-8 or whose position (field `p`) is not an unsigned integer, or (for [`crate::Consumer::get_json`])
    /// a payload that does not deserialize into the requested type.
    #[error("cannot decode {what} of key `{key}`: {reason}")]
    Decode {
        /// The Redis key or logical key whose value is bad.
        key: String,
        /// Which value: `replica`, `payload`.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The miss rate limit ([`crate::ConsumerBuilder::max_fills_per_sec`] /
    /// [`crate::ConsumerBuilder::max_fills_per_key_per_sec`]) refused to read `key` from Redis
    /// and no stale copy of it is held. Nothing was read; retry later or serve a default.
    #[error("fill of key `{key}` refused by the miss rate limit (max_fills_per_sec / max_fills_per_key_per_sec) and no stale copy is held; retry later")]
    Overloaded {
        /// The logical key whose fill was refused.
        key: String,
    },
    /// The app-supplied loader ([`crate::ConsumerBuilder::loader`]) returned an error for
    /// `key` (its timeout is [`ConsumerError::Timeout`] with `op` naming the loader).
    #[error("loader failed for key `{key}`: {reason}")]
    Loader {
        /// The logical key being loaded.
        key: String,
        /// The loader's error, as text (`Display` of the error it returned).
        reason: String,
    },
    /// binval's progress messages say the source side is behind
    /// [`crate::ConsumerBuilder::max_staleness`] for every replica of `key` (its Redis writes
    /// stalled: a frozen Redis master, the source out of reach, binval itself stopped, or its
    /// progress no longer arriving), so no replica may be served as fresh, and
    /// [`crate::ConsumerBuilder::on_source_behind`] says to refuse (the default does when no
    /// loader is set). Nothing was read from Redis. Retry later, serve a default, or fail the
    /// request; see [`crate::OnSourceBehind`] for the other choices.
    #[error("key `{key}`: the source side is {lag_ms} ms behind (bound {bound_ms} ms, max_staleness), so no replica is fresh enough to serve; refused (on_source_behind)")]
    SourceBehind {
        /// The logical key that was read.
        key: String,
        /// The source lag of the key's freshest replica, ms (progress `lag_ms` + time since
        /// it was received).
        lag_ms: u64,
        /// The bound, ms.
        bound_ms: u64,
    },
}

impl ConsumerError {
    pub(crate) fn redis(op: impl Into<String>, source: redis::RedisError, timeout_ms: u64) -> Self {
        if source.is_timeout() {
            ConsumerError::Timeout { op: op.into(), after_ms: timeout_ms }
        } else {
            ConsumerError::Redis { op: op.into(), source }
        }
    }

    /// `true` for a read that failed because its node did not answer in time or could not be
    /// reached (timeout, connection refused or dropped, no connection to the node): another
    /// master may still answer. `false` for answers that are wrong in themselves (`WRONGTYPE`,
    /// a record that does not decode), which another replica must not hide.
    pub(crate) fn is_unreachable(&self) -> bool {
        match self {
            ConsumerError::Timeout { .. } => true,
            ConsumerError::Redis { source, .. } => {
                source.is_timeout()
                    || source.is_io_error()
                    || source.is_connection_dropped()
                    || source.is_connection_refusal()
                    || source.kind() == redis::ErrorKind::ClusterConnectionNotFound
            }
            _ => false,
        }
    }

    pub(crate) fn kafka(op: impl Into<String>, source: rdkafka::error::KafkaError) -> Self {
        ConsumerError::Kafka { op: op.into(), source }
    }
}
