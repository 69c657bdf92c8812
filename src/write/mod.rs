//! Writing a committed transaction's key changes: fenced Redis writes (every suffix replica,
//! then the version token), then one invalidation event per key to Kafka.
//!
//! | module | step |
//! |---|---|
//! | [`apply`] | one transaction: map, collapse, fenced writes, events (run and replay) |
//! | [`fence`] | the fence position of a transaction: the order every write is checked against |
//! | [`redis_sink`] | replicas first, then the version token, fenced by position and fencing token |
//! | [`kafka_sink`] | one invalidation event per key change |

pub mod apply;
pub mod fence;
pub mod kafka_sink;
pub mod redis_sink;
