//! Fuzz body of the `invalidation_message` target of binval's `fuzz/` (see its README), kept
//! here so binval's `tests/fuzz_corpus.rs` replays the committed inputs on stable Rust. Not
//! an API: hidden from the docs, may change any time.

use crate::listener::{decode_message, DEFAULT_MAX_MESSAGE_BYTES};

/// `invalidation_message`: `data` as the payload of a topic message, through the listener's
/// parser ([`decode_message`]) with the default and a small size limit. Any bytes must give
/// an event or a [`crate::BadMessage`], never a panic; an event parsed must survive a round
/// trip through its JSON form.
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
    }
}
