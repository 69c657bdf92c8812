//! The crate-wide Redis client: one connection type for standalone Redis and Redis Cluster,
//! shared by the write stage ([`crate::write::redis_sink`]), the lease and the checkpoint store
//! ([`crate::ha`]) and `binval check`.
//!
//! It lives apart from the write stage so that HA and the commands need not import the write
//! path to talk to Redis (imports run one way: shared modules <- `binlog` <- `write`, `ha`).
//!
//! * Standalone: a reconnecting [`ConnectionManager`](::redis::aio::ConnectionManager) (response and connection timeouts of
//!   `redis.timeout_ms`, two retries).
//! * Cluster: a slot-routed multiplexed [`ClusterConnection`](::redis::cluster_async::ClusterConnection); commands are routed by their
//!   first key. `SCAN` is per node, so [`RedisConn::scan_match`] opens a connection to
//!   every master found with `CLUSTER SLOTS`.
//!
//! Batches ([`RedisConn::run_batch`]): the write stage sends thousands of single-key commands
//! per group of transactions. Sent one by one through the cluster client, each costs a routing
//! step, a channel hop and a future (about 25 µs of CPU measured under load); a Redis Cluster
//! also refuses pipelines whose keys are in different slots. So binval keeps its own copy of
//! the slot map (`CLUSTER SLOTS`), groups the commands by the master that owns their key's
//! slot, and sends each master's commands as one pipeline (one round trip; all masters at
//! once). A pipeline may hold keys of many slots: a master runs each command on its own and
//! answers `MOVED`/`ASK` only for a key it does not own. When a pipeline fails (a slot moved,
//! a failover, a dropped connection), binval refreshes its slot map and sends that pipeline's
//! commands again one by one through the cluster client, which follows `MOVED`/`ASK` itself:
//! binval's writes are fenced, so sending a command twice is harmless.
//!
//! Connection failures are transient, except TLS and authentication failures, which name the
//! setting ([`crate::security::redis`]); a `redis.mode` that does not match the server is a
//! definite configuration error naming `redis.mode`. Every client, including the per-master
//! connections of `SCAN`, gets `[redis.tls]` and the ACL user.
//!
//! # Files
//!
//! * `conn.rs`: [`RedisConn`] — connect, commands, `SCAN`, per-master batches.
//! * `slots.rs`: [`SlotMap`] — binval's copy of the slot map the batches are grouped by.
//!
//! Node addresses (`host:port` of a URL or of a `CLUSTER SLOTS` entry) and the `CLUSTER SLOTS`
//! parser are [`binval_protocol::topology`], shared with `binval-consumer`, so a master is
//! spelled the same in `binval check`, `binval inspect` and the consumer's `master` label. TLS
//! and ACL settings of every client are [`crate::security::redis`].

mod conn;
mod slots;

pub use binval_protocol::topology::{NodeAddr, SlotRange};
pub use conn::{ClusterState, RedisConn};
pub use slots::SlotMap;
