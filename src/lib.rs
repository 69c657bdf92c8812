//! binval keeps hot Redis keys, and the in-process caches in front of them, in step with
//! MySQL/MariaDB by reading the binlog.
//!
//! # The data path
//!
//! The folders read in the order data flows through them:
//!
//! | step | module | what happens |
//! |---|---|---|
//! | 1 | [`binlog::server`] | connect, preflight of the binlog settings, binary logs, schema checks |
//! | 2 | [`binlog::reader`] | the replica connection: start/resume, heartbeats, reconnect with backoff |
//! | 3 | [`binlog::decode`] | TABLE_MAP + row events -> rows with named columns and canonical JSON values |
//! | 4 | [`binlog::ddl`], [`binlog::txn`] | table DDL on mapped tables; rows grouped by transaction, only committed ones go on |
//! | 5 | [`mapping`] | `schema.table` rows -> logical key changes (one per key per transaction) |
//! | 6 | [`write::fence`], [`write::redis_sink`] | fence position of the transaction; every replica, then the version token |
//! | 7 | [`write::kafka_sink`] | one invalidation event per key change |
//! | 8 | [`ha::checkpoint`] | the resume position, moved only after both sinks acknowledged |
//! | - | [`ha::lease`] | one active instance per source; a fencing token per tenure |
//! | - | [`pipeline`] | wiring of the steps into tasks, supervision, graceful shutdown |
//! | - | [`commands`] | the `binval` subcommands: run, check, replay, republish, decode |
//!
//! [`config`], [`error`], [`telemetry`] and [`failpoint`] serve every step. Imports run one
//! way: the shared modules <- `binlog` <- `write`, `ha` <- `pipeline` <- `commands` <- `main`.
//! The key layout, the invalidation event, the fenced scripts and the typed binlog coordinates
//! live in the `binval-protocol` crate, shared with `binval-consumer` (the reader side).
//!
//! # Where each invariant is enforced
//!
//! The invariants are those of `docs/design.md`:
//!
//! * I1 order: [`write::redis_sink`] writes every replica before the version token; [`pipeline`]
//!   enqueues a transaction's events only after its Redis writes are acknowledged.
//! * I2 no regression: every write is fenced by the change's fence position ([`write::fence`],
//!   scripts in `binval_protocol::fence`) and by the tenure's fencing token ([`ha::lease`]).
//! * I3 no loss: [`ha::checkpoint`] moves only past transactions whose writes and events were all
//!   acknowledged; [`binlog::reader`] resumes from the end of the last whole transaction.
//! * I6 bounded memory: bounded channels between the tasks of [`pipeline`].
//! * I7 bad input: [`config`] errors name the field; decode errors name the binlog position.
//!
//! # Errors
//!
//! [`error::Error`] is either *definite* (about the data or the setup: retrying cannot help;
//! binval stops and names the setting, table or position, and acknowledges nothing after it) or
//! *transient* (about the world: a connection dropped, a service is briefly away; the
//! pipeline restarts from its checkpoint with backoff).

pub mod binlog;
pub mod commands;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod ha;
pub mod mapping;
pub mod pipeline;
pub mod redis_conn;
pub mod start_point;
pub mod telemetry;
pub mod write;

/// Wall clock as Unix epoch milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
