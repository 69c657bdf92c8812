//! Turning one topic message into an event, a batch or a progress message, or a counted
//! [`BadMessage`]: the decoding is pure (fuzzed, benched); only [`parse_message`] logs.

use super::*;

/// The longest invalidation message taken by default, bytes: 1 MiB, Kafka's default
/// `message.max.bytes`. binval's events are a few hundred bytes (a key, a table, a position).
pub(crate) const DEFAULT_MAX_MESSAGE_BYTES: usize = 1 << 20;

/// Why a topic message is not an invalidation event (it is counted and skipped).
#[derive(Debug, thiserror::Error)]
pub enum BadMessage {
    /// A message with no payload (a tombstone record).
    #[error("message has no payload")]
    NoPayload,
    /// A payload longer than [`crate::ConsumerBuilder::max_message_bytes`]; not parsed.
    #[error("message of {len} bytes exceeds the {max}-byte limit (max_message_bytes)")]
    TooLarge {
        /// Payload length, bytes.
        len: usize,
        /// The limit, bytes.
        max: usize,
    },
    /// A payload that is not an invalidation event: not JSON, a missing or mistyped field, a
    /// newer schema.
    #[error("message is not an invalidation event: {0}")]
    NotAnEvent(#[from] binval_protocol::event::EventDecodeError),
    /// A message marked as a progress message (header `binval.kind: progress`) whose payload
    /// is not one: not JSON, a missing or mistyped field, a newer schema, a slot range out of
    /// bounds. Never taken for an invalidation either.
    #[error("message marked as progress is not a progress message: {0}")]
    NotProgress(#[from] binval_protocol::ProgressDecodeError),
    /// A progress message read from another partition than the one it names.
    #[error("progress message for partition {sent_to} was read from partition {found_on}")]
    WrongPartition {
        /// The message's `partition`.
        sent_to: i32,
        /// Where it was read.
        found_on: i32,
    },
    /// A message marked as a batch (header `binval.kind: batch`) whose payload is not one
    /// (truncated, a newer format, bad UTF-8, an unknown op...; the error names the field and
    /// byte offset).
    #[error("message marked as batch is not an invalidation batch: {0}")]
    NotABatch(#[from] binval_protocol::BatchDecodeError),
    /// A `binval.kind` header this version does not know (a newer binval's message kind).
    #[error("message of unknown kind `{kind}` (header binval.kind)")]
    UnknownKind {
        /// The header's value, as text (lossy).
        kind: String,
    },
}

/// A message of the invalidation topic ([`decode_topic_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicMessage {
    /// An invalidation event (no `binval.kind` header).
    Event(InvalidationEvent),
    /// binval's progress message (header `binval.kind: progress`).
    Progress(ProgressMessage),
    /// A batch of key changes (header `binval.kind: batch`,
    /// [`binval_protocol::batch`]), as the per-key events it stands for, in order. The listener
    /// itself never builds these: it applies a batch from the payload ([`decode_batch`]).
    Batch(Vec<InvalidationEvent>),
}

/// Check one batch message payload (header `binval.kind: batch`) and borrow it as a
/// [`BatchView`], without allocating: no payload, one longer than `max_bytes`, or a payload
/// that is not a batch ([`BadMessage::NotABatch`]) is an error.
pub fn decode_batch(payload: Option<&[u8]>, max_bytes: usize) -> Result<BatchView<'_>, BadMessage> {
    let payload = payload.ok_or(BadMessage::NoPayload)?;
    if payload.len() > max_bytes {
        return Err(BadMessage::TooLarge { len: payload.len(), max: max_bytes });
    }
    Ok(BatchView::parse(payload)?)
}

/// Decode one topic message payload into an event, or say why it is not one (a message
/// without a `binval.kind` header; [`decode_topic_message`] takes the header into account).
pub fn decode_message(payload: Option<&[u8]>, max_bytes: usize) -> Result<InvalidationEvent, BadMessage> {
    let payload = payload.ok_or(BadMessage::NoPayload)?;
    if payload.len() > max_bytes {
        return Err(BadMessage::TooLarge { len: payload.len(), max: max_bytes });
    }
    Ok(InvalidationEvent::from_json(payload)?)
}

/// Decode one topic message given its `binval.kind` header value (`None` when it has none):
/// no header, an invalidation event ([`decode_message`]); `progress`, a
/// [`ProgressMessage`]; `batch`, the events of a [`BatchView`] (owned: for tools and tests;
/// the listener borrows the payload instead, [`decode_batch`]); any other kind is
/// [`BadMessage::UnknownKind`]. The whole of the
/// listener's message parsing (fuzzed by the `invalidation_message` target); the size bound
/// applies to both kinds.
pub fn decode_topic_message(kind: Option<&[u8]>, payload: Option<&[u8]>, max_bytes: usize) -> Result<TopicMessage, BadMessage> {
    match kind {
        None => Ok(TopicMessage::Event(decode_message(payload, max_bytes)?)),
        Some(k) if k == KIND_PROGRESS.as_bytes() => {
            let payload = payload.ok_or(BadMessage::NoPayload)?;
            if payload.len() > max_bytes {
                return Err(BadMessage::TooLarge { len: payload.len(), max: max_bytes });
            }
            Ok(TopicMessage::Progress(ProgressMessage::from_json(payload)?))
        }
        Some(k) if k == KIND_BATCH.as_bytes() => Ok(TopicMessage::Batch(decode_batch(payload, max_bytes)?.to_events())),
        Some(k) => Err(BadMessage::UnknownKind { kind: String::from_utf8_lossy(k).chars().take(64).collect() }),
    }
}

/// The value of the `binval.kind` header of `msg`, if it has one.
pub(super) fn kind_header<M: rdkafka::message::Message>(msg: &M) -> Option<&[u8]> {
    use rdkafka::message::Headers;
    let headers = msg.headers()?;
    // A header without a value counts as an empty kind (unknown), not as no header.
    headers.iter().find(|h| h.key == KIND_HEADER).map(|h| h.value.unwrap_or_default())
}

/// Parse one topic message into an event or a progress message (the latter checked against
/// the `partition` it was read from); a message without payload, longer than `max_bytes`, of
/// an unknown kind, or that does not parse is logged (topic, partition, offset, error),
/// counted and skipped: the stream goes on with the next message.
pub(crate) fn parse_message(
    shared: &Shared,
    max_bytes: usize,
    topic: &str,
    partition: i32,
    offset: i64,
    kind: Option<&[u8]>,
    payload: Option<&[u8]>,
) -> Option<TopicMessage> {
    let decoded = decode_topic_message(kind, payload, max_bytes).and_then(|m| match m {
        TopicMessage::Progress(p) if p.partition != partition => {
            Err(BadMessage::WrongPartition { sent_to: p.partition, found_on: partition })
        }
        m => Ok(m),
    });
    match decoded {
        Ok(m) => Some(m),
        Err(e) => {
            shared.counters.bad_message();
            warn!(topic, partition, offset, error = %e, "skipping invalidation message");
            None
        }
    }
}
