//! Metric names, kept in one place so code and docs agree (the table in the module docs).

/// gauge, labels `version`, `process`.
pub const INFO: &str = "binval_info";
/// gauge 0/1.
pub const LEADER: &str = "binval_leader";
/// gauge.
pub const FENCING_TOKEN: &str = "binval_fencing_token";
/// counter.
pub const LEASE_ACQUIRED: &str = "binval_lease_acquired_total";
/// gauge 0/1.
pub const READY: &str = "binval_ready";
/// gauge 0/1.
pub const SOURCE_CONNECTED: &str = "binval_source_connected";
/// counter.
pub const RECONNECTS: &str = "binval_source_reconnects_total";
/// counter.
pub const BINLOG_EVENTS: &str = "binval_binlog_events_total";
/// counter.
pub const TRANSACTIONS: &str = "binval_transactions_total";
/// counter.
pub const ROWS: &str = "binval_rows_total";
/// counter.
pub const KEY_CHANGES: &str = "binval_key_changes_total";
/// counter.
pub const EVENTS_ACKED: &str = "binval_events_acked_total";
/// gauge, seconds.
pub const LAG: &str = "binval_lag_seconds";
/// gauge, seconds (issue #15).
pub const HEARTBEAT_LAG: &str = "binval_heartbeat_lag_seconds";
/// gauge, label `position`.
pub const BINLOG_FILE_INDEX: &str = "binval_binlog_file_index";
/// gauge, bytes, label `position`.
pub const BINLOG_POSITION: &str = "binval_binlog_position_bytes";
/// gauge, bytes.
pub const BINLOG_BYTES_BEHIND: &str = "binval_binlog_bytes_behind";
/// gauge, labels `position`, `domain`.
pub const GTID_SEQUENCE: &str = "binval_gtid_sequence";
/// gauge, label `stage`.
pub const QUEUE_DEPTH: &str = "binval_queue_depth";
/// gauge, label `stage`.
pub const QUEUE_CAPACITY: &str = "binval_queue_capacity";
/// histogram, transactions.
pub const APPLY_GROUP_TRANSACTIONS: &str = "binval_apply_group_transactions";
/// histogram, key changes.
pub const APPLY_GROUP_KEYS: &str = "binval_apply_group_keys";
/// counter (issue #15).
pub const TRANSACTIONS_SPILLED: &str = "binval_transactions_spilled_total";
/// gauge, transactions.
pub const XA_HELD: &str = "binval_xa_held";
/// histogram, seconds.
pub const REDIS_APPLY_SECONDS: &str = "binval_redis_apply_seconds";
/// histogram, seconds.
pub const KAFKA_DELIVERY_SECONDS: &str = "binval_kafka_delivery_seconds";
/// counter, labels `service`, `kind`.
pub const ERRORS: &str = "binval_errors_total";
/// counter.
pub const RESTARTS: &str = "binval_restarts_total";
/// counter.
pub const FENCED_NOOPS: &str = "binval_fenced_noops_total";
/// counter (issue #22).
pub const REDIS_RETRIES: &str = "binval_redis_retries_total";
/// counter (issue #22).
pub const TOKEN_READS_SKIPPED: &str = "binval_redis_token_reads_skipped_total";
/// gauge, keys (issue #23).
pub const ADAPTIVE_KEYS: &str = "binval_adaptive_keys";
/// counter, label `step` (issue #23).
pub const ADAPTIVE_COUNT_CHANGES: &str = "binval_adaptive_count_changes_total";
/// gauge, instances (issue #23).
pub const ADAPTIVE_REPORTING_INSTANCES: &str = "binval_adaptive_reporting_instances";
/// gauge, keys (issue #23).
pub const ADAPTIVE_AT_MAX: &str = "binval_adaptive_keys_at_max_over_budget";
/// gauge, groups (issue #22).
pub const GROUPS_IN_FLIGHT: &str = "binval_redis_groups_in_flight";
/// gauge, seconds (issue #22).
pub const KAFKA_WAIT: &str = "binval_kafka_unacked_seconds";
/// counter (issue #22).
pub const PROGRESS_MESSAGES: &str = "binval_progress_messages_total";
/// gauge, seconds (issue #22).
pub const PROGRESS_LAG: &str = "binval_progress_lag_seconds";
/// counter.
pub const CHECKPOINTS: &str = "binval_checkpoints_total";
/// gauge, seconds.
pub const CHECKPOINT_AGE: &str = "binval_checkpoint_age_seconds";
/// gauge, Unix seconds.
pub const CHECKPOINT_SAVED_TS: &str = "binval_checkpoint_saved_timestamp_seconds";
/// histogram, seconds.
pub const COMMIT_TO_ACK_S: &str = "binval_commit_to_ack_seconds";
/// gauge, Unix seconds.
pub const ACKED_COMMIT_TS: &str = "binval_acked_commit_timestamp_seconds";
/// counter.
pub const REPLAY_TRANSACTIONS: &str = "binval_replay_transactions_total";
/// counter, label `result`.
pub const REPLAY_KEY_CHANGES: &str = "binval_replay_key_changes_total";
/// counter.
pub const REPLAY_EVENTS: &str = "binval_replay_events_total";
/// gauge, bytes, label `position` (`read`, `end`).
pub const REPLAY_POSITION: &str = "binval_replay_position_bytes";
/// gauge, label `position` (`read`, `end`).
pub const REPLAY_FILE_INDEX: &str = "binval_replay_file_index";
/// counter, label `result` (`consistent`, `inconsistent`, `failed`).
pub const VERIFY_RUNS: &str = "binval_verify_runs_total";
/// gauge, Unix seconds.
pub const VERIFY_LAST_RUN_TS: &str = "binval_verify_last_run_timestamp_seconds";
/// gauge, seconds.
pub const VERIFY_DURATION: &str = "binval_verify_duration_seconds";
/// gauge, rows.
pub const VERIFY_ROWS_CHECKED: &str = "binval_verify_rows_checked";
/// gauge, keys.
pub const VERIFY_KEYS_CHECKED: &str = "binval_verify_keys_checked";
/// gauge, keys.
pub const VERIFY_MISMATCHED_KEYS: &str = "binval_verify_mismatched_keys";
/// gauge, label `kind`.
pub const VERIFY_MISMATCHES: &str = "binval_verify_mismatches";
/// gauge, keys.
pub const VERIFY_UNSETTLED: &str = "binval_verify_unsettled";
/// gauge, nines.
pub const VERIFY_NINES: &str = "binval_verify_nines";
/// counter, keys.
pub const VERIFY_REPAIRED: &str = "binval_verify_repaired_total";

/// Every name, for the docs test and the dashboards' check.
pub const ALL: &[&str] = &[
    INFO,
    LEADER,
    FENCING_TOKEN,
    LEASE_ACQUIRED,
    READY,
    SOURCE_CONNECTED,
    RECONNECTS,
    BINLOG_EVENTS,
    TRANSACTIONS,
    ROWS,
    KEY_CHANGES,
    EVENTS_ACKED,
    LAG,
    HEARTBEAT_LAG,
    BINLOG_FILE_INDEX,
    BINLOG_POSITION,
    BINLOG_BYTES_BEHIND,
    GTID_SEQUENCE,
    QUEUE_DEPTH,
    QUEUE_CAPACITY,
    APPLY_GROUP_TRANSACTIONS,
    APPLY_GROUP_KEYS,
    TRANSACTIONS_SPILLED,
    XA_HELD,
    REDIS_APPLY_SECONDS,
    KAFKA_DELIVERY_SECONDS,
    ERRORS,
    RESTARTS,
    FENCED_NOOPS,
    REDIS_RETRIES,
    TOKEN_READS_SKIPPED,
    ADAPTIVE_KEYS,
    ADAPTIVE_COUNT_CHANGES,
    ADAPTIVE_REPORTING_INSTANCES,
    ADAPTIVE_AT_MAX,
    GROUPS_IN_FLIGHT,
    KAFKA_WAIT,
    PROGRESS_MESSAGES,
    PROGRESS_LAG,
    CHECKPOINTS,
    CHECKPOINT_AGE,
    CHECKPOINT_SAVED_TS,
    COMMIT_TO_ACK_S,
    ACKED_COMMIT_TS,
    REPLAY_TRANSACTIONS,
    REPLAY_KEY_CHANGES,
    REPLAY_EVENTS,
    REPLAY_POSITION,
    REPLAY_FILE_INDEX,
    VERIFY_RUNS,
    VERIFY_LAST_RUN_TS,
    VERIFY_DURATION,
    VERIFY_ROWS_CHECKED,
    VERIFY_KEYS_CHECKED,
    VERIFY_MISMATCHED_KEYS,
    VERIFY_MISMATCHES,
    VERIFY_UNSETTLED,
    VERIFY_NINES,
    VERIFY_REPAIRED,
];

/// Names defined and not emitted by the code of today (the dashboards and alerts may
/// reference none of them). Empty since the heartbeat table (issue #15) emits the last one.
pub const NOT_YET_EMITTED: &[&str] = &[];
