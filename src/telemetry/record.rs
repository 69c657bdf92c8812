//! What the parts of binval call to record what happened: positions, applied groups, Kafka
//! deliveries, classified errors, and the stage queues the monitor samples.

use std::sync::Mutex;

use super::{names, stage};

/// Set [`names::BINLOG_FILE_INDEX`] and [`names::BINLOG_POSITION`] for one `position` label.
pub fn set_position(which: &'static str, file: &str, pos: u64) {
    if let Some(i) = binval_protocol::file_index(file) {
        metrics::gauge!(names::BINLOG_FILE_INDEX, "position" => which).set(i as f64);
    }
    metrics::gauge!(names::BINLOG_POSITION, "position" => which).set(pos as f64);
}

/// One group applied: its transactions and key changes (today one transaction per group).
pub fn group_applied(transactions: u64, key_changes: u64) {
    metrics::histogram!(names::APPLY_GROUP_TRANSACTIONS).record(transactions as f64);
    metrics::histogram!(names::APPLY_GROUP_KEYS).record(key_changes as f64);
}

/// A Kafka delivery acknowledged; `message_timestamp_ms` is the message's create time (set by
/// the producer at enqueue), when it has one.
pub fn kafka_delivered(message_timestamp_ms: Option<i64>) {
    if let Some(t) = message_timestamp_ms.filter(|t| *t > 0) {
        metrics::histogram!(names::KAFKA_DELIVERY_SECONDS).record(crate::now_ms().saturating_sub(t as u64) as f64 / 1000.0);
    }
}

/// A client error was classified: `service` is `source`, `redis` or `kafka`.
pub fn error_classified(service: &'static str, definite: bool) {
    metrics::counter!(names::ERRORS, "service" => service, "kind" => if definite { "definite" } else { "transient" }).increment(1);
}

/// How full one queue is: `(depth, capacity)`, or `None` once the queue is gone.
pub type QueueFill = Box<dyn Fn() -> Option<(usize, usize)> + Send + Sync>;

/// One stage's output queue, sampled by the monitor ([`sample_queues`]).
pub struct QueueProbe {
    /// A [`stage`] value.
    pub stage: &'static str,
    /// Reads the queue's fill.
    pub fill: QueueFill,
}

impl QueueProbe {
    /// A bounded tokio channel, through a weak sender (the probe does not keep it open).
    pub fn channel<T: Send + 'static>(stage: &'static str, tx: &tokio::sync::mpsc::Sender<T>) -> QueueProbe {
        let weak = tx.downgrade();
        QueueProbe {
            stage,
            fill: Box::new(move || {
                let tx = weak.upgrade()?;
                Some((tx.max_capacity() - tx.capacity(), tx.max_capacity()))
            }),
        }
    }
}

static QUEUES: Mutex<Vec<QueueProbe>> = Mutex::new(Vec::new());

/// The queues of the running tenure (replaces those of the previous one).
pub fn watch_queues(probes: Vec<QueueProbe>) {
    *QUEUES.lock().unwrap_or_else(|e| e.into_inner()) = probes;
}

/// Set [`names::QUEUE_DEPTH`] and [`names::QUEUE_CAPACITY`] from the registered probes (a
/// queue that is gone reads 0 deep).
pub fn sample_queues() {
    let queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    for q in queues.iter() {
        let (depth, capacity) = (q.fill)().unwrap_or_default();
        // The Kafka queue is also exported under its name before stop 31 (see `stage`).
        let names_of_stage: &[&'static str] =
            if q.stage == stage::KAFKA { &[stage::KAFKA, stage::KAFKA_ALIAS] } else { std::slice::from_ref(&q.stage) };
        for &name in names_of_stage {
            metrics::gauge!(names::QUEUE_DEPTH, "stage" => name).set(depth as f64);
            if capacity > 0 {
                metrics::gauge!(names::QUEUE_CAPACITY, "stage" => name).set(capacity as f64);
            }
        }
    }
}
