//! Values of the `stage` label of [`names::QUEUE_DEPTH`] and [`names::QUEUE_CAPACITY`].

/// Transactions read from the binlog, waiting for the apply task.
pub const SOURCE: &str = "source";
/// Transactions applied to Redis whose events the checkpoint task has not seen acknowledged.
pub const APPLY: &str = "apply";
/// Events enqueued in the Kafka producer, not yet acknowledged.
pub const KAFKA: &str = "kafka";
/// The name the [`KAFKA`] queue had before stop 31. [`sample_queues`](super::sample_queues)
/// still exports the Kafka queue under it too (same value), for dashboards and alerts
/// written against it; it will be removed in a later release.
#[deprecated(note = "the Kafka producer's queue is stage `kafka`; `checkpoint` is its old name")]
pub const CHECKPOINT: &str = "checkpoint";
/// The deprecated alias of [`KAFKA`], without the deprecation warning, for the exporter.
pub(crate) const KAFKA_ALIAS: &str = "checkpoint";
