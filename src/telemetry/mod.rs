//! Logs, metrics and the health endpoints.
//!
//! Logs: human-readable lines by default, JSON with `--log-format json` (or
//! `log.format = "json"`); `RUST_LOG` overrides the configured level.
//!
//! # The metrics listener
//!
//! `[metrics] listen = "0.0.0.0:9187"` serves, on one HTTP/1 listener ([`serve`]):
//!
//! | path | answers | use |
//! |---|---|---|
//! | `GET /metrics` | Prometheus text format, every metric below, each with the label `source` (`source.name`) | Prometheus scrape |
//! | `GET /healthz` | `200 ok` while the process runs and its runtime answers | Kubernetes `livenessProbe` |
//! | `GET /readyz` | `200` when ready, else `503`; a JSON body `{"ready", "role", "reason"}` | Kubernetes `readinessProbe`, load balancers |
//!
//! *Ready* ([`Health::readiness`]) means: the leader is streaming (its replica connection is
//! open) with [`names::LAG`] at most `metrics.ready_max_lag_ms`; or a standby checked the lease
//! in Redis within two lease periods (it can take over). Not ready: starting (no lease decision
//! yet), shutting down, a leader whose source connection is down or that is too far behind, a
//! standby that cannot reach Redis. A standby is *ready*: readiness answers "is this instance
//! doing its job", not "is it the one writing" (that is [`names::LEADER`]), so a Deployment of
//! two keeps both pods ready and a PodDisruptionBudget can count them.
//!
//! # Metrics
//!
//! Every name is a constant of [`names`]; this table is their one documentation (README
//! "Operating binval" repeats it for operators). Types are Prometheus types; histograms are
//! exported with buckets ([`SECONDS_BUCKETS`], [`COUNT_BUCKETS`]) so dashboards can use
//! `histogram_quantile`. "Leader" rows stay 0 (or absent) on a standby.
//!
//! | name | type | unit | labels | meaning |
//! |---|---|---|---|---|
//! | `binval_info` | gauge | 1 | `version`, `process` | always 1: the build and this process (`host-pid`, the start of its lease holder id) |
//! | `binval_leader` | gauge | 0/1 | | 1 while this instance holds the source's lease and writes; 0 as standby or while starting |
//! | `binval_fencing_token` | gauge | token | | the fencing token of the current tenure (0 when not leader) |
//! | `binval_lease_acquired_total` | counter | tenures | | tenures this instance began (a rise on a standby = a takeover) |
//! | `binval_ready` | gauge | 0/1 | | what `/readyz` answers, sampled every second |
//! | `binval_source_connected` | gauge | 0/1 | | the replica connection to the source is open (leader) |
//! | `binval_source_reconnects_total` | counter | reconnects | | replica connection failures followed by a reconnect |
//! | `binval_binlog_events_total` | counter | events | | binlog events read (every type, mapped or not) |
//! | `binval_transactions_total` | counter | transactions | | committed transactions applied (incl. those with no mapped rows) |
//! | `binval_rows_total` | counter | rows | | row changes of mapped tables applied |
//! | `binval_key_changes_total` | counter | key changes | | key changes written to Redis (replicas + version token) |
//! | `binval_events_acked_total` | counter | events | | invalidation messages acknowledged by Kafka (`per_key`: one per key change; `batched`: one per batch) |
//! | `binval_lag_seconds` | gauge | s | | seconds behind the source: 0 when everything read is acknowledged and the reader is at the end of the binlog (the primary sent a replication heartbeat since the last transaction); else now minus the commit time of the last acknowledged transaction (of the first one this tenure read while it acknowledged none: a new leader is as far behind as the oldest change it has to apply again). Commit times are binlog header seconds, or the heartbeat row's `NOW(6)` with `source.heartbeat_table` (sub-second). Grows while the pipeline stalls |
//! | `binval_heartbeat_lag_seconds` | gauge | s | | acknowledgement time minus the `NOW(6)` of the last heartbeat row seen back (`source.heartbeat_table`) |
//! | `binval_binlog_file_index` | gauge | index | `position` | file index (`mysql-bin.000042` -> 42) of a position: `read` (end of the last transaction read), `acked` (last acknowledged), `checkpoint` (last saved or loaded), `source` (the primary's `SHOW MASTER STATUS`, every 10 s) |
//! | `binval_binlog_position_bytes` | gauge | bytes | `position` | byte offset in that file, same `position` values |
//! | `binval_binlog_bytes_behind` | gauge | bytes | | binlog bytes between the acknowledged position and the primary's current one (`SHOW BINARY LOGS` sizes, every 10 s) |
//! | `binval_gtid_sequence` | gauge | seq | `position`, `domain` | GTID sequence number of the last transaction `read` / `acked`, per MariaDB GTID domain (MySQL: `domain` = server uuid) |
//! | `binval_queue_depth` | gauge | items | `stage` | items waiting in each stage's output queue: `source` (transactions read, not yet applied), `apply` (transactions applied to Redis whose events are not yet acknowledged), `kafka` (events in the Kafka producer awaiting acknowledgement; also exported as `checkpoint`, its name before stop 31, to be removed) |
//! | `binval_queue_capacity` | gauge | items | `stage` | capacity of that queue (the reader / apply task wait when it is full) |
//! | `binval_apply_group_transactions` | histogram | transactions | | transactions per applied group (1 at low load; grows when binval falls behind) |
//! | `binval_apply_group_keys` | histogram | key changes | | key changes per applied group |
//! | `binval_transactions_spilled_total` | counter | transactions | | transactions whose row events were spilled to a temporary file (past `source.transaction_memory_mb`) |
//! | `binval_xa_held` | gauge | transactions | | prepared XA transactions with changes of mapped tables held until their XA COMMIT / ROLLBACK (while > 0 the checkpoint stays at the oldest one's XA PREPARE, see `binlog::xa`) |
//! | `binval_redis_apply_seconds` | histogram | s | | Redis time per applied group with mapped rows (one transaction at low load): its fenced writes sent to all acknowledged |
//! | `binval_kafka_delivery_seconds` | histogram | s | | enqueue (message timestamp) to the acknowledgement the checkpoint task sees, ms resolution |
//! | `binval_errors_total` | counter | errors | `service`, `kind` | client errors as classified: `service` = `source`, `redis`, `kafka`; `kind` = `definite` (stops binval) or `transient` (retried) |
//! | `binval_restarts_total` | counter | restarts | | pipeline restarts from the checkpoint after transient failures or a lost lease |
//! | `binval_fenced_noops_total` | counter | key changes | | key changes Redis already held (re-applied after a restart or replay: no replica or token moved) |
//! | `binval_redis_retries_total` | counter | groups | | groups whose Redis writes were sent again after a transient failure (a master timing out or failing over); the groups behind keep writing to the masters that answer |
//! | `binval_redis_token_reads_skipped_total` | counter | groups | | Cluster groups whose replicas were written without first reading their version tokens, because a master did not answer within 500 ms (`write::redis_sink`) |
//! | `binval_adaptive_keys` | gauge | keys | | keys of adaptive mappings above their `min` count (`crate::replicas`) |
//! | `binval_adaptive_count_changes_total` | counter | steps | `step` | replica-count steps taken: `grow` (copies added), `announce` (a smaller count told first), `remove` (the extra replicas removed after the grace) |
//! | `binval_adaptive_reporting_instances` | gauge | instances | | app instances whose heat report the leader counted in its last round |
//! | `binval_adaptive_keys_at_max_over_budget` | gauge | keys | | keys at their mapping's `max` count whose fleet read rate is still above what their masters' budget covers: raise `max`, or pin them higher |
//! | `binval_redis_groups_in_flight` | gauge | groups | | groups whose Redis writes are under way at once: 1 normally, more while a master is slow or frozen (`write::apply::apply_loop`) |
//! | `binval_kafka_unacked_seconds` | gauge | s | | how long the oldest event not yet acknowledged by Kafka has waited (0: none waiting); past 3 s a warning repeats every 3 s (a frozen broker is otherwise silent) |
//! | `binval_progress_messages_total` | counter | messages | | progress messages (`kafka.progress_interval_ms`, one per partition per round) the broker acknowledged |
//! | `binval_progress_lag_seconds` | gauge | s | | the lag the last progress round announced: how far what is in Redis and enqueued is behind the source (0 when caught up at the end of the binlog; see [`crate::write::progress`]) |
//! | `binval_checkpoints_total` | counter | saves | | checkpoints saved |
//! | `binval_checkpoint_age_seconds` | gauge | s | | 0 when the saved checkpoint covers everything read; else seconds since the last save (leader) |
//! | `binval_checkpoint_saved_timestamp_seconds` | gauge | Unix s | | when the last checkpoint was saved (or, after a start, when the loaded one was) |
//! | `binval_commit_to_ack_seconds` | histogram | s | | binlog commit time to Kafka acknowledgement (1 s resolution: the binlog header has whole seconds) |
//! | `binval_acked_commit_timestamp_seconds` | gauge | Unix s | | commit time of the last acknowledged transaction |
//! | `binval_replay_transactions_total` | counter | transactions | | `binval replay --metrics-listen`: transactions replayed |
//! | `binval_replay_key_changes_total` | counter | key changes | `result` | replayed key changes, `changed` (moved a replica or token) or `unchanged` (already held) |
//! | `binval_replay_events_total` | counter | events | | events replay published |
//! | `binval_replay_position_bytes` | gauge | bytes | `position` | replay's `read` position and its `end` (`--to`, when a binlog position), offsets in their files |
//! | `binval_replay_file_index` | gauge | index | `position` | file index of those positions |
//! | `binval_verify_runs_total` | counter | runs | `result` | `binval verify --metrics-listen` (or `--every`): runs ended `consistent` or `inconsistent` (confirmed mismatches), or `failed` (an error) |
//! | `binval_verify_last_run_timestamp_seconds` | gauge | Unix s | | when the last verify run ended (alert when it stops moving) |
//! | `binval_verify_duration_seconds` | gauge | s | | wall time of the last run |
//! | `binval_verify_rows_checked` | gauge | rows | | rows the last run read |
//! | `binval_verify_keys_checked` | gauge | keys | | keys the last run checked |
//! | `binval_verify_mismatched_keys` | gauge | keys | | keys with a confirmed mismatch in the last run |
//! | `binval_verify_mismatches` | gauge | findings | `kind` | the last run's confirmed findings: `missing`, `stale`, `extra`, `version` |
//! | `binval_verify_unsettled` | gauge | keys | | keys that differed twice but changed in between (lag, not counted) in the last run |
//! | `binval_verify_nines` | gauge | nines | | the last run's consistency as nines (`-log10(mismatched / checked)`; `log10(checked)` when none) |
//! | `binval_verify_repaired_total` | counter | keys | | keys `--repair` rewrote and found consistent after |
//!
//! Who emits what: the reader ([`crate::binlog::reader`]: connection, read position), the apply
//! task ([`crate::write::apply`]), the checkpoint task and store ([`crate::ha`]), the lease
//! ([`crate::ha::lease`]: leader, token), the error classifiers ([`crate::error`]), and the
//! monitor ([`crate::monitor`]), which samples lag, positions, queues and readiness once a
//! second from the pipeline's shared state.

mod exporter;
mod health;
mod logs;
pub mod names;
mod record;
pub mod stage;

pub use exporter::{install_recorder, serve, MetricsError};
pub use health::{checkpoint_recorded, health, source_connected, ConnectedGuard, Health, Readiness, Role, SavedCheckpoint};
pub use logs::init;
pub use record::{error_classified, group_applied, kafka_delivered, sample_queues, set_position, watch_queues, QueueFill, QueueProbe};

/// Buckets of the histograms in seconds: 0.5 ms to 60 s.
pub const SECONDS_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of the histograms that count (group sizes): 1 to 10,000.
pub const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name of [`names::ALL`] is in the module docs' table, and the other way round.
    #[test]
    fn the_table_documents_every_name() {
        let src = include_str!("mod.rs");
        let table: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("//! | `binval_")).filter_map(|l| l.split('`').next()).collect();
        let documented: std::collections::BTreeSet<String> = table.iter().map(|n| format!("binval_{n}")).collect();
        let defined: std::collections::BTreeSet<String> = names::ALL.iter().map(|n| n.to_string()).collect();
        assert_eq!(documented, defined, "docs table vs names::ALL");
    }
}
