//! Mapping stage: config rules turn a row change of `schema.table` into changes of logical
//! cache keys.
//!
//! * INSERT -> `insert` of the key rendered from the after image.
//! * DELETE -> `delete` of the key rendered from the before image.
//! * UPDATE -> `update` of the key when it is the same before and after; when a key column
//!   changed, `delete` of the old key and `insert` of the new one.
//! * A key column that is NULL renders no key (nothing to cache under).
//! * A mapping with `allow_non_unique_keys` (invalidate mode; its templates may render one
//!   key from several rows): a `delete` becomes an `update` without payload, a stale marker
//!   instead of a tombstone, since another row may still render the key.
//!
//! Tables without a rule are never decoded (the source asks [`Mapper::is_mapped`] at TABLE_MAP
//! time).

use std::sync::Arc;

use binval_protocol::Op;

mod collapse;
mod mapper;
mod tables;

pub use collapse::{collapse_per_key, collapse_per_key_with};
pub use mapper::Mapper;
pub use tables::{RenameConflict, RenameOutcome, TableNames};

/// One change of one logical key, ready for the Redis stage.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyChange {
    /// Logical key (no replica suffix).
    pub key: String,
    /// What happened to it.
    pub op: Op,
    /// Source table, `schema.table`.
    pub table: Arc<str>,
    /// JSON document to store in every replica; `None` deletes the replicas (delete, or
    /// invalidate mode).
    pub payload: Option<String>,
    /// Suffix replicas this change writes (`K:r0..K:r{replicas-1}`).
    pub replicas: u32,
    /// The key's replica count recorded in every replica written (field `n`, see
    /// `binval_protocol::adaptive`): equal to `replicas`, except while a shrink is announced
    /// and not done (`crate::replicas`), when it is smaller.
    pub count: u32,
    /// Replica TTL in seconds, 0 = none.
    pub ttl_secs: u64,
}

#[cfg(test)]
mod tests;
