//! Writing a committed transaction's key changes: fenced Redis writes (every suffix replica,
//! then the version token), then one invalidation event per key to Kafka.
//!
//! | module | step |
//! |---|---|
//! | [`group`] | transactions applied together (a group), large transactions in chunks |
//! | [`apply`] | a group (run) or one transaction (replay): decode, map, collapse, fenced writes, events |
//! | [`fence`] | the fence position of a transaction: the order every write is checked against |
//! | [`redis_sink`] | replicas first, then the version token, fenced by position and fencing token |
//! | [`crate::kafka`] (the producer, beside [`crate::redis`]) | one invalidation event per key change |
//! | [`progress`] | one progress message per partition every `kafka.progress_interval_ms`: how far the writes are behind the source |
//! | [`key_state`] | what Redis holds for keys, read back in batches (dry runs, verify, inspect) |

pub mod apply;
pub mod fence;
pub mod group;
pub mod key_state;
pub mod progress;
pub mod redis_sink;
