//! What the binval service (the writer) and `binval-consumer` (the reader) must agree on,
//! kept in one crate so the two sides cannot drift:
//!
//! * [`keys`]: the key layout — logical key templates such as `item:detail:{id}`, suffix
//!   replicas `K:r0..K:r{N-1}`, the version token `K:ver`, and the Redis Cluster hash slot rule
//!   that makes replicas land on different masters.
//! * [`event`]: the invalidation event published to Kafka, one per changed key, as JSON
//!   (schema in `schemas/invalidation-event.schema.json`).
//! * [`adaptive`]: adaptive replica counts — the count each replica record carries (field
//!   `n`), the fleet's heat reports and the hot set readers load at start.
//! * [`batch`]: the batched event format (`kafka.event_format = "batched"`): one message per
//!   partition per apply group, a compact binary layout read without allocating (layout in
//!   `schemas/invalidation-batch.md`), with the Kafka header `binval.kind: batch`.
//! * [`progress`]: the progress message binval sends to every partition of the same topic, so
//!   a reader can tell a quiet source from a stalled writer (schema in
//!   `schemas/progress-message.schema.json`).
//! * [`fence`]: version-fenced writes — the replica record (a hash with payload, fence
//!   position, tombstone flag, fencing token), the version token's value (the fence position of
//!   the newest change), and the Lua scripts that only ever move a key forward.
//! * [`payload`]: the payload a replica holds — a row as canonical JSON, one implementation for
//!   the binlog decoder, bootstrap and app loaders (`payload::result_set::row_payload` with
//!   feature `mysql`), so a loaded value and a written one are byte-identical.
//! * [`placement`]: which master holds each of a key's replicas, and the master-balanced
//!   order in which a read tries them (used by the consumer and by `binval check`).
//! * [`position`]: binlog coordinates as types (`FILE:POS`, MariaDB GTIDs), one parser and one
//!   `Display` each.
//! * [`topology`]: where Redis nodes are — a node's `host:port` from a `redis://` URL or a
//!   `CLUSTER SLOTS` reply (feature `redis`), one parser for binval and the consumer.
//! * [`version`]: the evict rule — an event with version `v` evicts a cached entry whose
//!   version is lower than `v`.
//!
//! See `docs/design.md` ("Protocol between the parts") for why writes go replicas-then-version,
//! and why a read takes one replica with the position it was written at (no read touches the
//! version token).

pub mod adaptive;
pub mod batch;
pub mod event;
pub mod fence;
pub mod keys;
pub mod payload;
pub mod placement;
pub mod position;
pub mod progress;
pub mod topology;
pub mod version;

pub use batch::{BatchBuilder, BatchDecodeError, BatchEncodeError, BatchView, BATCH_FORMAT_VERSION, KIND_BATCH};
pub use event::{InvalidationEvent, Op, SourcePosition, EVENT_SCHEMA_VERSION};
pub use fence::{parse_version, FencePosition, FieldError, ReplicaRecord};
pub use keys::{hash_slot, replica_key, version_key, KeyTemplate, TemplateError, REPLICA_SEPARATOR};
pub use position::{file_index, BinlogPosition, MariadbGtid, MariadbGtidPosition, MysqlGtidSet, PositionParseError};
pub use progress::{MasterLag, ProgressDecodeError, ProgressMessage, KIND_HEADER, KIND_PROGRESS, PROGRESS_SCHEMA_VERSION};
pub use version::{should_evict, Version};
