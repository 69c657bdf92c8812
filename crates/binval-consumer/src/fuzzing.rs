//! Fuzz body of the `invalidation_message` target of binval's `fuzz/` (see its README), kept
//! here so binval's `tests/fuzz_corpus.rs` replays the committed inputs on stable Rust. Not
//! an API: hidden from the docs, may change any time.

use crate::listener::{decode_batch, decode_message, decode_topic_message, TopicMessage, DEFAULT_MAX_MESSAGE_BYTES};

/// `invalidation_message`: `data` as the payload of a topic message, through the listener's
/// parser ([`decode_topic_message`]) as an event (no `binval.kind` header) and as a progress
/// message (header `progress`), with the default and a small size limit. Any bytes must give
/// a message of the kind the header says or a [`crate::BadMessage`], never a panic, and never
/// an event when the header says progress; a message parsed must survive a round trip through
/// its JSON form. As a batch (header `batch`): a batch or a [`crate::BadMessage`], never a
/// panic; a batch parsed must encode back to the same changes.
pub fn invalidation_message(data: &[u8]) {
    for max in [DEFAULT_MAX_MESSAGE_BYTES, 64] {
        match decode_message(Some(data), max) {
            Ok(ev) => {
                let again = decode_message(Some(&ev.to_json()), DEFAULT_MAX_MESSAGE_BYTES).expect("an event's own JSON parses");
                assert_eq!(again, ev, "round trip");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
        match decode_topic_message(Some(b"progress"), Some(data), max) {
            Ok(TopicMessage::Progress(p)) => {
                let again = decode_topic_message(Some(b"progress"), Some(&p.to_json()), DEFAULT_MAX_MESSAGE_BYTES)
                    .expect("a progress message's own JSON parses");
                assert_eq!(again, TopicMessage::Progress(p), "round trip");
            }
            Ok(TopicMessage::Event(_) | TopicMessage::Batch(_)) => panic!("a message marked as progress was taken for events"),
            Err(e) => {
                let _ = e.to_string();
            }
        }
        match decode_batch(Some(data), max) {
            Ok(b) => {
                let events = b.to_events();
                assert_eq!(events.len(), b.change_count);
                let mut again = binval_protocol::BatchBuilder::new();
                for ev in &events {
                    again
                        .push(&ev.position, ev.commit_time_ms, ev.op, ev.version, &ev.table, &ev.key)
                        .expect("fits: it was read from a batch");
                }
                let bytes = again.finish(b.publish_time_ms);
                let reread = decode_batch(Some(&bytes), DEFAULT_MAX_MESSAGE_BYTES).expect("a batch's own encoding parses").to_events();
                assert_eq!(reread, events, "round trip");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}
