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
//! | 2 | [`binlog::resume`], [`binlog::reader`] | where reading starts; the replica connection with heartbeats and reconnects |
//! | 3 | [`binlog::framing`] | events as stored -> events to handle (MariaDB GTID, compressed events, TRANSACTION_PAYLOAD, the TABLE_MAP cache), shared with the offline reader |
//! | 4 | [`binlog::ddl`], [`binlog::json_columns`], [`binlog::row_events`], [`binlog::txn`], [`binlog::xa`] | table DDL on mapped tables (and the MariaDB JSON columns after it); row events held raw (in memory, then in a temporary file) and grouped by transaction, only committed ones go on (prepared XA transactions held until their XA COMMIT) |
//! | 5 | [`write::group`] | every transaction already read as one group (or a large one alone, in chunks), decoded by [`binlog::decode`] (canonical JSON values) and mapped by [`mapping`] to one change per key |
//! | 6 | [`write::apply`] | a group applied (`run`; one transaction for `replay`): the next three steps in order |
//! | 6a | [`write::fence`] | each transaction's fence position: the order every write is checked against |
//! | 6b | [`write::redis_sink`] | every suffix replica, then the version tokens, fenced, one pipeline per Redis master per step ([`redis::RedisConn::run_batch`]) |
//! | 6c | [`kafka::KafkaSink`] | one invalidation event per key |
//! | 7 | [`ha::checkpoint_task`], [`ha::checkpoint`] | the resume position, moved only after both sinks acknowledged a whole group |
//! | - | [`ha::lease`] | one active instance per source; a fencing token per tenure |
//! | - | [`pipeline`] | wiring of the steps into tasks, supervision, graceful shutdown |
//! | - | [`monitor`] | `binval run`'s gauges sampled once a second from the pipeline's state: lag, positions, queues, readiness |
//! | - | [`scan`] | the mapped tables read now, in consistent snapshots with a known binlog position (bootstrap, verify, inspect) |
//! | - | [`commands`] | the `binval` subcommands: run, check (with the replica placement report, [`commands::placement`]), replay, republish, decode, status, bootstrap, verify, inspect |
//!
//! Shared by every step: [`config`] (with [`start_point`], the positions an operator writes),
//! [`error`], [`security`] (TLS, authentication and secrets of the three connections; least
//! privilege), [`redis`] (the Redis client, its slot map and node addresses), [`kafka`] (the producer and its partitioner), [`telemetry`] (metric names, the metrics
//! listener with `/healthz` and `/readyz`) and [`failpoint`].
//!
//! Imports run one way, with no cycle between files: `config`, `start_point`, `telemetry`,
//! `failpoint` and `binlog::decode` import nothing of binval's; `error`, then `security`, then
//! `redis`, `kafka` and `mapping` build on them; then the rest of `binlog` <- `write` <- `ha` <- `pipeline` <-
//! `monitor` <- `commands` <- `main`, and `scan` (on `binlog`, `mapping`, `write`) <-
//! `commands`. The key layout, the invalidation event, the fenced scripts and the
//! typed binlog coordinates (`BinlogPosition`, `MariadbGtid`, `MariadbGtidPosition`) live in
//! the `binval-protocol` crate, shared with `binval-consumer` (the reader side).
//!
//! What the reader side relies on: every replica record carries the fence position of the
//! change that wrote it (`p`), written in one script with the payload, and the change's event
//! is published only after every replica holds it. The consumer reads one replica
//! (`HMGET K:rN d t p`) and caches that exact pair, so no read depends on the version token
//! `K:ver` (one key on one master: it would be the next hot key); the token is for the writers
//! (a key whose token is newer is skipped), `replay` and operators.
//!
//! Two numbers keep writes in order and are never confused: the **fence position** of a
//! change (its place in the binlog: GTID sequence number, or file index and offset), which
//! versions and replicas carry and every write is compared against; and the **fencing token**
//! of a tenure (from [`ha::lease`]), which refuses writes of an instance that lost its lease.
//!
//! # Where each invariant is enforced
//!
//! The invariants are those of `docs/design.md`:
//!
//! * I1 order: [`write::redis_sink`] writes every replica before the version token;
//!   [`write::apply`] enqueues a transaction's events only after its Redis writes are
//!   acknowledged.
//! * I2 no regression: every write is fenced by the change's fence position ([`write::fence`],
//!   scripts in `binval_protocol::fence`) and by the tenure's fencing token ([`ha::lease`]);
//!   rows a table scan writes (`binval bootstrap`, `verify --repair`) are fenced by the fence
//!   position of the consistent snapshot they were read in ([`scan::snapshot`]).
//! * I3 no loss: [`ha::checkpoint_task`] moves the checkpoint only past transactions whose
//!   writes and events were all acknowledged, and never past the XA PREPARE of a prepared XA
//!   transaction whose changes are held ([`binlog::xa`]); [`binlog::reader`] resumes from the
//!   end of the last whole transaction; an operator's start position inside a transaction is
//!   moved back to its start ([`binlog::boundary`]).
//! * I6 bounded memory: bounded channels and a memory budget between the tasks of [`pipeline`];
//!   raw row events spilled past a limit ([`binlog::row_events`]); large transactions in chunks
//!   ([`write::group`]).
//! * I7 bad input: [`config`] errors name the field, decode errors name the binlog position,
//!   [`error`] classifies MySQL, Redis and Kafka failures.
//!
//! # Errors
//!
//! [`error::Error`] is either *definite* (about the data or the setup: retrying cannot help;
//! binval stops and names the setting, table or position, and acknowledges nothing after it) or
//! *transient* (about the world: a connection dropped, a service is briefly away; the
//! pipeline restarts from its checkpoint with backoff). One classifier per client decides
//! which: [`error::classify_mysql`], [`error::classify_redis`], [`error::classify_kafka`].

pub mod binlog;
pub mod commands;
pub mod config;
pub mod error;
pub mod failpoint;
#[doc(hidden)]
pub mod fuzzing;
pub mod ha;
pub mod kafka;
pub mod mapping;
pub mod monitor;
pub mod pipeline;
pub mod redis;
pub mod replicas;
pub mod scan;
pub mod security;
pub mod start_point;
pub mod telemetry;
pub mod write;

/// Wall clock as Unix epoch milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
