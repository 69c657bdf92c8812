//! Applying committed transactions: the one implementation of decode -> map -> collapse ->
//! fenced Redis writes -> one event per key change, shared by `binval run` (through
//! [`apply_loop`], in groups) and `binval replay` (one transaction at a time, through
//! [`Writer::apply_transaction`]).
//!
//! The steps, in order (invariant I1: events are enqueued only after the Redis writes they
//! announce are acknowledged):
//!
//! 1. the transactions of a group ([`crate::write::group`]) are decoded, every row image
//!    checked for the columns the key templates use (else [`crate::error::DefiniteError::MappingBroken`]: a
//!    dropped or renamed key column would silently stop invalidation), mapped to key changes
//!    ([`Mapper::map_rows`]) and collapsed to one change per key;
//! 2. the fenced writes, each change at its transaction's fence position
//!    ([`crate::write::fence`]), under the tenure's fencing token ([`RedisConn::apply_batch`]);
//! 3. one invalidation event per key change (`kafka.event_format = "per_key"`), or one batch
//!    message per partition carrying the group's changes for it (`"batched"`; see
//!    [`crate::kafka::Publisher`]);
//! 4. table-wide invalidations (TRUNCATE / DROP TABLE / partition operations on mapped
//!    tables): every key of the table marked stale, with one `truncate` event per key template.
//!
//! A large transaction is applied alone, in chunks (see [`crate::write::group`]).
//!
//! What differs between run and replay is spelled out in [`ApplyOptions`]; the differences
//! exist because replay runs beside a live `binval run` (see `commands::replay`).

mod apply_loop;
mod linger;
mod options;
mod writer;

pub use apply_loop::*;
pub use linger::Linger;
pub use options::*;
pub use writer::*;
