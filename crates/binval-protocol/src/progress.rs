//! The progress message: binval's own word on how far the source side is behind, sent to every
//! partition of the invalidation topic, so that a consumer can tell a quiet source from a
//! stalled writer (issue #22).
//!
//! An invalidation event says "this key changed"; when no event arrives, a consumer cannot
//! tell whether nothing changed or binval cannot write (a Redis master frozen, the source out
//! of reach). So every `kafka.progress_interval_ms` (default 200) binval sends one progress
//! message to each partition, **explicitly addressed** to it (`partition` below), with a Kafka
//! header [`KIND_HEADER`] = [`KIND_PROGRESS`] that marks it, so a reader can tell it from an
//! event before decoding the value. Events have no such header.
//!
//! What it says: at `publish_time_ms`, everything of the source up to `position` is in Redis
//! and its events are enqueued *before* this message in the partition (the producer is
//! idempotent: one partition's messages are delivered in the order enqueued), and
//! `lag_ms` is how far that is behind the source: 0 when binval is caught up at the end of the
//! binlog, else the age of the oldest change whose Redis writes or events are not done yet.
//! A reader that receives it at `r` (its own monotonic clock) knows the source side is at most
//! `lag_ms + (now - r)` behind, without comparing clocks of two hosts.
//!
//! JSON Schema: `schemas/progress-message.schema.json`. Example:
//!
//! ```json
//! {"schema":1,"source":"shop","partition":2,
//!  "position":{"file":"mysql-bin.000003","pos":4711,"gtid":"0-1-42"},
//!  "commit_time_ms":1764540000000,"lag_ms":0,"fencing_token":7,"publish_time_ms":1764540000212}
//! ```

use serde::{Deserialize, Serialize};

use crate::event::SourcePosition;

/// Version of the progress layout, carried in every message as `schema`. Readers reject a
/// higher one than they know.
pub const PROGRESS_SCHEMA_VERSION: u32 = 1;

/// The Kafka header that names what a message on the invalidation topic is. Absent on
/// invalidation events; [`KIND_PROGRESS`] on progress messages. A reader should skip (and
/// count) a message with a kind it does not know.
pub const KIND_HEADER: &str = "binval.kind";

/// The value of [`KIND_HEADER`] on a progress message.
pub const KIND_PROGRESS: &str = "progress";

/// Lag of the replicas in one range of hash slots: every change of the source older than
/// `lag_ms` whose replicas live in `first_slot..=last_slot` has been written there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MasterLag {
    /// First hash slot of the range (0..=16383).
    pub first_slot: u16,
    /// Last hash slot of the range, inclusive (`first_slot..=16383`).
    pub last_slot: u16,
    /// How far the writes to these slots are behind the source, ms.
    pub lag_ms: u64,
}

/// One progress message (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressMessage {
    /// Layout version, [`PROGRESS_SCHEMA_VERSION`].
    pub schema: u32,
    /// `source.name` of the binval that sent it (several sources may share a topic; a reader
    /// tracks each on its own).
    pub source: String,
    /// The partition it was sent to. A reader that finds it on another partition refuses it.
    pub partition: i32,
    /// End of the last transaction whose Redis writes are done and whose events are enqueued
    /// ahead of this message, in this tenure. Absent before the tenure applied anything (it
    /// resumed from a checkpoint, which every earlier change is acknowledged below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<SourcePosition>,
    /// Commit time of the transaction at `position`, Unix epoch ms (binlog header seconds, or
    /// the heartbeat row's `NOW(6)`); 0 when unknown or without a position.
    pub commit_time_ms: u64,
    /// How far what is in Redis and enqueued is behind the source at `publish_time_ms`, ms: 0
    /// when caught up at the end of the binlog.
    pub lag_ms: u64,
    /// The fencing token of the tenure that sent it. A reader ignores messages of a source with
    /// a lower token than the highest it has seen (an old leader that has not noticed yet that
    /// it lost the lease).
    pub fencing_token: u64,
    /// When binval enqueued it, Unix epoch ms (for humans: readers measure age by when they
    /// received it, not by comparing clocks).
    pub publish_time_ms: u64,
    /// Optional lag per hash-slot range (Redis Cluster): a frozen master holds back only its
    /// slots. Absent when binval does not measure it; then `lag_ms` holds for every slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub masters: Option<Vec<MasterLag>>,
}

/// Why a Kafka message marked as progress could not be read as a [`ProgressMessage`].
#[derive(Debug, thiserror::Error)]
pub enum ProgressDecodeError {
    /// The payload is not the JSON described by the schema.
    #[error("progress message is not valid JSON of the expected shape: {0}")]
    Json(#[from] serde_json::Error),
    /// The payload comes from a newer binval than this reader understands.
    #[error("progress message has schema {found}, this reader knows up to {known}")]
    UnknownSchema {
        /// The message's `schema`.
        found: u32,
        /// [`PROGRESS_SCHEMA_VERSION`].
        known: u32,
    },
    /// A field is out of its range.
    #[error("progress message field `{field}`: {reason}")]
    Invalid {
        /// The field, e.g. `masters[1].last_slot`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl ProgressMessage {
    /// Serialize to the JSON bytes published to Kafka.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("ProgressMessage serializes")
    }

    /// Parse a Kafka message payload. Errors name what is wrong: bad JSON or a missing field, a
    /// schema newer than [`PROGRESS_SCHEMA_VERSION`], an empty `source`, a negative
    /// `partition`, a slot range outside `0..=16383` or with `first_slot > last_slot`.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ProgressDecodeError> {
        let m: ProgressMessage = serde_json::from_slice(bytes)?;
        if m.schema > PROGRESS_SCHEMA_VERSION {
            return Err(ProgressDecodeError::UnknownSchema { found: m.schema, known: PROGRESS_SCHEMA_VERSION });
        }
        let invalid = |field: String, reason: &str| Err(ProgressDecodeError::Invalid { field, reason: reason.to_string() });
        if m.source.is_empty() {
            return invalid("source".into(), "must not be empty");
        }
        if m.partition < 0 {
            return invalid("partition".into(), "must be 0 or more");
        }
        for (i, r) in m.masters.iter().flatten().enumerate() {
            if r.last_slot > 16383 {
                return invalid(format!("masters[{i}].last_slot"), "must be at most 16383");
            }
            if r.first_slot > r.last_slot {
                return invalid(format!("masters[{i}].first_slot"), "must not exceed last_slot");
            }
        }
        Ok(m)
    }

    /// The lag of hash slot `slot`, ms: that of the `masters` range holding it, else `lag_ms`.
    pub fn slot_lag_ms(&self, slot: u16) -> u64 {
        self.masters.iter().flatten().find(|r| (r.first_slot..=r.last_slot).contains(&slot)).map_or(self.lag_ms, |r| r.lag_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg() -> ProgressMessage {
        ProgressMessage {
            schema: PROGRESS_SCHEMA_VERSION,
            source: "shop".into(),
            partition: 2,
            position: Some(SourcePosition { file: "mysql-bin.000003".into(), pos: 4711, gtid: Some("0-1-42".into()) }),
            commit_time_ms: 1_764_540_000_000,
            lag_ms: 0,
            fencing_token: 7,
            publish_time_ms: 1_764_540_000_212,
            masters: None,
        }
    }

    #[test]
    fn round_trip_with_and_without_optional_fields() {
        let m = msg();
        let j = m.to_json();
        let s = String::from_utf8(j.clone()).unwrap();
        assert!(!s.contains("masters"), "absent when not measured: {s}");
        assert_eq!(ProgressMessage::from_json(&j).unwrap(), m);
        let mut m2 = msg();
        m2.position = None;
        m2.masters = Some(vec![MasterLag { first_slot: 0, last_slot: 5460, lag_ms: 3 }]);
        assert_eq!(ProgressMessage::from_json(&m2.to_json()).unwrap(), m2);
        assert!(!String::from_utf8(m2.to_json()).unwrap().contains("position"));
    }

    #[test]
    fn bad_messages_are_named() {
        let e = ProgressMessage::from_json(br#"{"schema":1}"#).unwrap_err();
        assert!(matches!(e, ProgressDecodeError::Json(_)), "{e}");
        let mut m = msg();
        m.schema = 9;
        assert!(matches!(ProgressMessage::from_json(&m.to_json()), Err(ProgressDecodeError::UnknownSchema { found: 9, .. })));
        let mut m = msg();
        m.masters = Some(vec![MasterLag { first_slot: 10, last_slot: 5, lag_ms: 0 }]);
        let e = ProgressMessage::from_json(&m.to_json()).unwrap_err().to_string();
        assert!(e.contains("masters[0].first_slot"), "{e}");
        let mut m = msg();
        m.masters = Some(vec![MasterLag { first_slot: 0, last_slot: 16384, lag_ms: 0 }]);
        assert!(ProgressMessage::from_json(&m.to_json()).unwrap_err().to_string().contains("last_slot"));
        let mut m = msg();
        m.source.clear();
        assert!(ProgressMessage::from_json(&m.to_json()).unwrap_err().to_string().contains("`source`"));
        let mut m = msg();
        m.partition = -1;
        assert!(ProgressMessage::from_json(&m.to_json()).unwrap_err().to_string().contains("`partition`"));
        // An invalidation event is not a progress message.
        let ev = br#"{"schema":1,"key":"k","version":1,"op":"delete","table":"a.b","position":{"file":"f","pos":4},"commit_time_ms":0,"publish_time_ms":0}"#;
        assert!(ProgressMessage::from_json(ev).is_err());
    }

    #[test]
    fn slot_lag_uses_the_range_or_the_overall_lag() {
        let mut m = msg();
        m.lag_ms = 900;
        assert_eq!(m.slot_lag_ms(100), 900);
        m.masters = Some(vec![
            MasterLag { first_slot: 0, last_slot: 5460, lag_ms: 5 },
            MasterLag { first_slot: 5461, last_slot: 10922, lag_ms: 900 },
        ]);
        assert_eq!(m.slot_lag_ms(0), 5);
        assert_eq!(m.slot_lag_ms(5460), 5);
        assert_eq!(m.slot_lag_ms(5461), 900);
        assert_eq!(m.slot_lag_ms(16000), 900, "no range: the overall lag");
    }

    /// The JSON Schema in schemas/ lists exactly the fields the writer emits, and marks the
    /// optional ones as not required.
    #[test]
    fn schema_file_matches_the_type() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/progress-message.schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut m = msg();
        m.masters = Some(vec![MasterLag { first_slot: 0, last_slot: 1, lag_ms: 0 }]);
        let v: serde_json::Value = serde_json::from_slice(&m.to_json()).unwrap();
        let mut emitted: Vec<&str> = v.as_object().unwrap().keys().map(|s| s.as_str()).collect();
        let mut props: Vec<&str> = schema["properties"].as_object().unwrap().keys().map(|s| s.as_str()).collect();
        emitted.sort();
        props.sort();
        assert_eq!(emitted, props);
        let mut required: Vec<&str> = schema["required"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        required.sort();
        let optional = ["masters", "position"];
        let want: Vec<&str> = emitted.iter().copied().filter(|f| !optional.contains(f)).collect();
        assert_eq!(required, want);
        let range: Vec<&str> =
            schema["properties"]["masters"]["items"]["required"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(range, ["first_slot", "last_slot", "lag_ms"]);
    }
}
