//! The invalidation event: one JSON message per changed logical key, published to the Kafka
//! topic with the logical key as the Kafka message key (so every change of one key lands on one
//! partition, in order).
//!
//! JSON Schema: `schemas/invalidation-event.schema.json`. Example:
//!
//! ```json
//! {"schema":1,"key":"item:detail:6666","version":7,"op":"update","table":"shop.items",
//!  "position":{"file":"mysql-bin.000003","pos":4711,"gtid":"0-1-42"},
//!  "commit_time_ms":1764540000000,"publish_time_ms":1764540000012}
//! ```

use serde::{Deserialize, Serialize};

use crate::version::Version;

/// Version of the event layout, carried in every event as `schema`. Consumers reject events
/// with a higher major schema than they know.
pub const EVENT_SCHEMA_VERSION: u32 = 1;

/// What happened to the logical key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A row now maps to this key that did not before (INSERT, or UPDATE that moved a key
    /// column onto this key). Replicas hold the new payload (write-through mode) or are gone
    /// (invalidate mode).
    Insert,
    /// The row behind this key changed; the key stayed the same.
    Update,
    /// No row maps to this key any more (DELETE, or UPDATE that moved the key column away).
    /// Replicas hold a tombstone.
    Delete,
    /// A statement removed or swapped the rows of a whole table without row events (TRUNCATE,
    /// DROP TABLE, partition TRUNCATE/DROP/EXCHANGE). The event's `key` is then a **key
    /// template** (e.g. `item:detail:{id}`), not a key: every key of the template is stale at
    /// `version`. Consumers evict every cached key starting with the template's literal prefix
    /// ([`crate::KeyTemplate::literal_prefix`]) whose version is lower, and refuse fills older
    /// than `version` for those keys. Replicas of the table's keys hold a stale marker (no
    /// payload: readers fall back to their loader or answer "no row").
    Truncate,
}

impl Op {
    /// Lower-case name as it appears in JSON (`insert`, `update`, `delete`).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

/// Where in the source's binlog a change was committed: the binlog position (file:pos) just
/// after the transaction's commit event, and the transaction's GTID when the source has one
/// (MariaDB `domain-server-seq`, MySQL `uuid:n`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct SourcePosition {
    /// Binlog file name, e.g. `mysql-bin.000003`.
    pub file: String,
    /// Byte offset in `file` just after the transaction's commit event.
    pub pos: u64,
    /// The transaction's GTID, if the source wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gtid: Option<String>,
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)?;
        if let Some(g) = &self.gtid {
            write!(f, " (gtid {g})")?;
        }
        Ok(())
    }
}

/// One invalidation event: the logical key `key` moved to version token `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidationEvent {
    /// Event layout version, [`EVENT_SCHEMA_VERSION`].
    pub schema: u32,
    /// Logical key, e.g. `item:detail:6666` (no replica suffix); for [`Op::Truncate`] the key
    /// template, e.g. `item:detail:{id}`.
    pub key: String,
    /// The version of this change: its fence position ([`crate::FencePosition`]), which is what
    /// the version token `K:ver` holds once this change is applied.
    pub version: Version,
    /// What happened to the key.
    pub op: Op,
    /// Source table as `schema.table`.
    pub table: String,
    /// Source position of the transaction that made the change.
    pub position: SourcePosition,
    /// Commit time, Unix epoch milliseconds: MySQL 8's `original_commit_timestamp` when the
    /// source writes one; else the binlog event header's (whole seconds), sharpened to the
    /// millisecond binval read the commit at when it read it within that second or the next
    /// (while binval keeps up, within about a millisecond of the commit). binval-consumer
    /// counts the invalidations applied within 50/200/1000 ms of it (`Stats::nines`).
    pub commit_time_ms: u64,
    /// When binval handed the event to the producer, Unix epoch milliseconds.
    pub publish_time_ms: u64,
}

/// Why a Kafka message could not be read as an [`InvalidationEvent`].
#[derive(Debug, thiserror::Error)]
pub enum EventDecodeError {
    /// The payload is not the JSON described by the schema.
    #[error("invalidation event is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    /// The payload comes from a newer binval than this reader understands.
    #[error("invalidation event has schema {found}, this reader knows up to {known}")]
    UnknownSchema { found: u32, known: u32 },
}

impl InvalidationEvent {
    /// Serialize to the JSON bytes published to Kafka.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("InvalidationEvent serializes")
    }

    /// Parse a Kafka message payload. Errors name what is wrong (bad JSON, missing field, or a
    /// schema newer than [`EVENT_SCHEMA_VERSION`]).
    pub fn from_json(bytes: &[u8]) -> Result<Self, EventDecodeError> {
        let ev: InvalidationEvent = serde_json::from_slice(bytes)?;
        if ev.schema > EVENT_SCHEMA_VERSION {
            return Err(EventDecodeError::UnknownSchema { found: ev.schema, known: EVENT_SCHEMA_VERSION });
        }
        Ok(ev)
    }
}

pub use EventDecodeError as DecodeError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let ev = InvalidationEvent {
            schema: 1,
            key: "item:detail:1".into(),
            version: 7,
            op: Op::Update,
            table: "shop.items".into(),
            position: SourcePosition { file: "mysql-bin.000001".into(), pos: 42, gtid: Some("0-1-5".into()) },
            commit_time_ms: 1000,
            publish_time_ms: 1010,
        };
        let j = ev.to_json();
        let s = String::from_utf8(j.clone()).unwrap();
        assert!(s.contains(r#""op":"update""#), "{s}");
        assert_eq!(InvalidationEvent::from_json(&j).unwrap(), ev);
    }

    #[test]
    fn newer_schema_rejected() {
        let s = br#"{"schema":9,"key":"k","version":1,"op":"delete","table":"a.b","position":{"file":"f","pos":4},"commit_time_ms":0,"publish_time_ms":0}"#;
        assert!(matches!(InvalidationEvent::from_json(s), Err(EventDecodeError::UnknownSchema { found: 9, .. })));
    }
}

#[cfg(test)]
mod schema_tests {
    use super::*;

    /// The JSON Schema in schemas/ lists exactly the fields the writer emits.
    #[test]
    fn schema_file_matches_the_type() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/invalidation-event.schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ev = InvalidationEvent {
            schema: EVENT_SCHEMA_VERSION,
            key: "k".into(),
            version: 1,
            op: Op::Insert,
            table: "a.b".into(),
            position: SourcePosition { file: "f".into(), pos: 4, gtid: Some("0-1-1".into()) },
            commit_time_ms: 0,
            publish_time_ms: 0,
        };
        let v: serde_json::Value = serde_json::from_slice(&ev.to_json()).unwrap();
        let mut emitted: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
        let mut required: Vec<&str> = schema["required"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        emitted.sort();
        required.sort();
        assert_eq!(emitted, required);
        let mut props: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(|s| s.as_str()).collect();
        props.sort();
        assert_eq!(props, required);
        let ops: Vec<&str> = schema["properties"]["op"]["enum"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(ops, [Op::Insert.as_str(), Op::Update.as_str(), Op::Delete.as_str(), Op::Truncate.as_str()]);
    }
}
