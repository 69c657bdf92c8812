//! Fuzz body of the `invalidation_message` target of binval's `fuzz/` (see its README), kept
//! here so binval's `tests/fuzz_corpus.rs` replays the committed inputs on stable Rust. Not
//! an API: hidden from the docs, may change any time.

use crate::listener::{decode_message, decode_topic_message, TopicMessage, DEFAULT_MAX_MESSAGE_BYTES};

/// `invalidation_message`: `data` as the payload of a topic message, through the listener's
/// parser ([`decode_topic_message`]) as an event (no `binval.kind` header) and as a progress
/// message (header `progress`), with the default and a small size limit. Any bytes must give
/// a message of the kind the header says or a [`crate::BadMessage`], never a panic, and never
/// an event when the header says progress; a message parsed must survive a round trip through
/// its JSON form.
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
            Ok(TopicMessage::Event(_)) => panic!("a message marked as progress was taken for an event"),
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
}
