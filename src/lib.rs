//! binval keeps hot Redis keys, and the in-process caches in front of them, in step with
//! MySQL/MariaDB by reading the binlog.
//!
//! One module per pipeline stage, in data-flow order:
//!
//! | module | stage |
//! |---|---|
//! | [`source`] | replica connection, preflight, start/resume, heartbeats, reconnect |
//! | [`decode`] | TABLE_MAP + row events -> rows with named columns, canonical JSON values |
//! | [`ddl`] | table-level DDL (TRUNCATE, DROP, RENAME) on mapped tables |
//! | [`txn`] | rows grouped by transaction; only committed transactions go on |
//! | [`mapping`] | `schema.table` -> logical key changes |
//! | [`redis_sink`] | replicas first, then the version token |
//! | [`kafka_sink`] | one invalidation event per key change |
//! | [`checkpoint`] | resume position saved only after both sinks acknowledged |
//! | [`pipeline`] | wiring, supervisor, graceful shutdown |
//! | [`offline`] | the same decoding over a binlog file (`binval decode`) |
//!
//! [`config`], [`charset`] and [`error`] serve all stages; errors are split into definite (halt) and
//! transient (retry).

pub mod charset;
pub mod checkpoint;
pub mod config;
pub mod ddl;
pub mod decode;
pub mod error;
pub mod failpoint;
pub mod fence;
pub mod kafka_sink;
pub mod lease;
pub mod mapping;
pub mod offline;
pub mod pipeline;
pub mod redis_sink;
pub mod replay;
pub mod republish;
pub mod source;
pub mod telemetry;
pub mod txn;

/// Wall clock as Unix epoch milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
