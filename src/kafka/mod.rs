//! The crate-wide Kafka side: the producer of invalidation events, batches and progress
//! messages ([`KafkaSink`], used by the write stage, `replay`, `bootstrap`, `verify`'s repairs
//! and `republish`), and the partition librdkafka gives a key ([`Partitioner`]), which the
//! batched format must reproduce. It sits beside [`crate::redis`], the Redis client, so the
//! write stage, HA and the commands import the same client of each service.
//!
//! # Files
//!
//! * `sink.rs`: [`KafkaSink`] — connect (and create the topic), enqueue per-key events or
//!   batches ([`Publisher`]), deliveries, progress messages; why the producer is idempotent
//!   and how errors are classified.
//! * `producer.rs`: [`EventProducer`] — librdkafka's producer with its delivery reports served
//!   by a tokio task that librdkafka wakes through its queue's IO event, not a polling thread;
//!   [`DeliveryFuture`].
//! * `partitioner.rs`: [`Partitioner`] — librdkafka's deterministic partitioners, computed
//!   binval-side.
//!
//! Reading the topic back lives where it is used: the recovery reader in
//! [`crate::ha::topic_marks`], `binval republish` in [`crate::commands::republish`]. TLS and
//! SASL settings are [`crate::security::kafka`]; the message formats are `binval_protocol`'s
//! (`event`, `batch`, `progress`).

pub mod partitioner;
pub mod producer;
pub mod sink;

pub use partitioner::Partitioner;
pub use producer::{DeliveryFuture, EventProducer};
pub(crate) use sink::no_broker_answered;
pub use sink::{KafkaSink, Publisher, BATCH_MAX_BYTES, REPUBLISHED_HEADER, WRITER_HEADER};
