//! Logs and metrics.
//!
//! Logs: human-readable lines by default, JSON with `--log-format json` (or
//! `log.format = "json"`); `RUST_LOG` overrides the configured level.
//!
//! Metrics go through the `metrics` facade; `[metrics] listen = "127.0.0.1:9187"` serves them
//! for Prometheus at `GET /metrics`. Names (all prefixed `binval_`):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `binval_transactions_total` | counter | committed transactions applied (incl. those with no mapped rows) |
//! | `binval_rows_total` | counter | row changes of mapped tables decoded |
//! | `binval_key_changes_total` | counter | key changes written to Redis (replicas + version token) |
//! | `binval_events_acked_total` | counter | invalidation events acknowledged by Kafka |
//! | `binval_checkpoints_total` | counter | checkpoints saved |
//! | `binval_restarts_total` | counter | pipeline restarts after transient failures |
//! | `binval_source_reconnects_total` | counter | replica connection reconnects |
//! | `binval_fenced_noops_total` | counter | key changes Redis already held (re-applied after a restart or replay: no replica or token moved) |
//! | `binval_redis_apply_ms` | histogram | Redis time per transaction with mapped rows, ms |
//! | `binval_commit_to_ack_seconds` | histogram | binlog commit time to Kafka ack, s (1 s resolution: the binlog header has whole seconds) |
//! | `binval_acked_commit_timestamp_seconds` | gauge | commit time of the last acknowledged transaction, Unix s |
//! | `binval_lag_seconds` | gauge | seconds behind the source: now minus the commit time of the last acknowledged transaction while transactions read are not all acknowledged, else 0 (sub-second with `source.heartbeat_table`) |
//! | `binval_heartbeat_lag_seconds` | gauge | acknowledgement time minus the `NOW(6)` of the last heartbeat row seen back, s |
//! | `binval_apply_group_transactions` | histogram | transactions per applied group |
//! | `binval_apply_group_keys` | histogram | key changes per applied group (after the per-key collapse) |
//! | `binval_queue_depth{stage}` | gauge | items waiting before a stage: `apply` (transactions read, not yet applied), `checkpoint` (groups applied, events not yet all acknowledged) |
//! | `binval_queue_capacity{stage}` | gauge | capacity of that queue |
//! | `binval_transactions_spilled_total` | counter | transactions whose row events went to a temporary file (`source.transaction_memory_mb`) |
//! | `binval_xa_held` | gauge | prepared XA transactions with changes of mapped tables held until their XA COMMIT / ROLLBACK (while > 0 the checkpoint stays at the oldest one's XA PREPARE, see `binlog::xa`) |

use tracing_subscriber::EnvFilter;

/// Metric names, kept in one place so code and docs agree.
pub mod names {
    pub const TRANSACTIONS: &str = "binval_transactions_total";
    pub const ROWS: &str = "binval_rows_total";
    pub const KEY_CHANGES: &str = "binval_key_changes_total";
    pub const EVENTS_ACKED: &str = "binval_events_acked_total";
    pub const CHECKPOINTS: &str = "binval_checkpoints_total";
    pub const RESTARTS: &str = "binval_restarts_total";
    pub const RECONNECTS: &str = "binval_source_reconnects_total";
    pub const FENCED_NOOPS: &str = "binval_fenced_noops_total";
    pub const REDIS_APPLY_MS: &str = "binval_redis_apply_ms";
    pub const COMMIT_TO_ACK_S: &str = "binval_commit_to_ack_seconds";
    pub const ACKED_COMMIT_TS: &str = "binval_acked_commit_timestamp_seconds";
    pub const LAG_S: &str = "binval_lag_seconds";
    pub const HEARTBEAT_LAG_S: &str = "binval_heartbeat_lag_seconds";
    pub const APPLY_GROUP_TRANSACTIONS: &str = "binval_apply_group_transactions";
    pub const APPLY_GROUP_KEYS: &str = "binval_apply_group_keys";
    pub const QUEUE_DEPTH: &str = "binval_queue_depth";
    pub const QUEUE_CAPACITY: &str = "binval_queue_capacity";
    pub const TRANSACTIONS_SPILLED: &str = "binval_transactions_spilled_total";
    pub const XA_HELD: &str = "binval_xa_held";
}

/// Install the global log subscriber. `json`: one JSON object per line. `level`: default filter.
pub fn init(json: bool, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}

/// Serve Prometheus metrics on `listen` (`ip:port`). Must run inside a tokio runtime. Errors
/// when the address cannot be bound.
pub fn serve_metrics(listen: &str) -> Result<(), String> {
    let addr: std::net::SocketAddr = listen.parse().map_err(|e| format!("metrics.listen `{listen}`: {e}"))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| format!("metrics.listen `{listen}`: {e}"))?;
    describe();
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    use names::*;
    describe_counter!(TRANSACTIONS, "committed transactions applied");
    describe_counter!(ROWS, "row changes of mapped tables decoded");
    describe_counter!(KEY_CHANGES, "key changes written to Redis");
    describe_counter!(EVENTS_ACKED, "invalidation events acknowledged by Kafka");
    describe_counter!(CHECKPOINTS, "checkpoints saved");
    describe_counter!(RESTARTS, "pipeline restarts after transient failures");
    describe_counter!(RECONNECTS, "replica connection reconnects");
    describe_histogram!(REDIS_APPLY_MS, Unit::Milliseconds, "Redis time per transaction");
    describe_histogram!(COMMIT_TO_ACK_S, Unit::Seconds, "binlog commit to Kafka ack");
    describe_gauge!(ACKED_COMMIT_TS, Unit::Seconds, "commit time of the last acknowledged transaction");
    describe_gauge!(LAG_S, Unit::Seconds, "seconds behind the source");
    describe_gauge!(HEARTBEAT_LAG_S, Unit::Seconds, "acknowledgement time minus the NOW(6) of the last heartbeat row");
    describe_histogram!(APPLY_GROUP_TRANSACTIONS, "transactions per applied group");
    describe_histogram!(APPLY_GROUP_KEYS, "key changes per applied group");
    describe_gauge!(QUEUE_DEPTH, "items waiting before a stage");
    describe_gauge!(QUEUE_CAPACITY, "capacity of the queue before a stage");
    describe_counter!(TRANSACTIONS_SPILLED, "transactions whose row events went to a temporary file");
    describe_gauge!(XA_HELD, "prepared XA transactions held until their XA COMMIT or ROLLBACK");
}
