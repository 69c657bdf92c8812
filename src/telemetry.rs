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
//! | `binval_queue_depth` | gauge | items | `stage` | items waiting in each stage's output queue: `source` (transactions read, not yet applied), `apply` (transactions applied to Redis whose events are not yet acknowledged), `checkpoint` (events in the Kafka producer awaiting acknowledgement) |
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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tracing_subscriber::EnvFilter;

/// Metric names, kept in one place so code and docs agree (the table in the module docs).
pub mod names {
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
}

/// Values of the `stage` label of [`names::QUEUE_DEPTH`] and [`names::QUEUE_CAPACITY`].
pub mod stage {
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
}

/// Buckets of the histograms in seconds: 0.5 ms to 60 s.
pub const SECONDS_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of the histograms that count (group sizes): 1 to 10,000.
pub const COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0];

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

/// What this instance is doing, for `/readyz` and [`names::LEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Started, no lease decision yet.
    Starting = 0,
    /// Another instance holds the lease; this one polls it.
    Standby = 1,
    /// This instance holds the lease and writes.
    Leader = 2,
    /// A shutdown was requested.
    Stopping = 3,
}

impl Role {
    /// `starting`, `standby`, `leader`, `stopping`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Standby => "standby",
            Role::Leader => "leader",
            Role::Stopping => "stopping",
        }
    }
}

/// The process-wide state `/readyz` decides on: set by the lease, the reader and the monitor
/// (atomics: readers never block the pipeline).
#[derive(Debug)]
pub struct Health {
    role: AtomicU8,
    connected: AtomicBool,
    lag_ms: AtomicU64,
    lease_checked_ms: AtomicU64,
    lease_ms: AtomicU64,
    max_lag_ms: AtomicU64,
    fencing_token: AtomicU64,
    checkpoint: Mutex<Option<SavedCheckpoint>>,
    /// Why the pipeline last stopped and is restarting (a transient error), until the replica
    /// connection opens again: readiness names it, so a wrong `kafka.brokers` is not reported
    /// as a source problem.
    restart_reason: Mutex<Option<String>>,
}

/// The last checkpoint this instance saved or loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// Binlog file.
    pub file: String,
    /// Offset in `file`.
    pub pos: u64,
    /// When it was saved, Unix ms.
    pub saved_at_ms: u64,
}

static HEALTH: Health = Health {
    role: AtomicU8::new(Role::Starting as u8),
    connected: AtomicBool::new(false),
    lag_ms: AtomicU64::new(0),
    lease_checked_ms: AtomicU64::new(0),
    lease_ms: AtomicU64::new(5000),
    max_lag_ms: AtomicU64::new(30_000),
    fencing_token: AtomicU64::new(0),
    checkpoint: Mutex::new(None),
    restart_reason: Mutex::new(None),
};

/// The process-wide [`Health`].
pub fn health() -> &'static Health {
    &HEALTH
}

/// The answer of `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// Ready (HTTP 200) or not (503).
    pub ready: bool,
    /// [`Role::as_str`].
    pub role: &'static str,
    /// Why, in words.
    pub reason: String,
}

impl Health {
    /// Set the bounds readiness uses: `source.lease_ms` and `metrics.ready_max_lag_ms`.
    pub fn configure(&self, lease_ms: u64, max_lag_ms: u64) {
        self.lease_ms.store(lease_ms, Relaxed);
        self.max_lag_ms.store(max_lag_ms, Relaxed);
    }

    /// The current role.
    pub fn role(&self) -> Role {
        match self.role.load(Relaxed) {
            1 => Role::Standby,
            2 => Role::Leader,
            3 => Role::Stopping,
            _ => Role::Starting,
        }
    }

    /// This instance holds the lease with `fencing_token` (a new tenure, or the same one taken
    /// again after a pipeline restart).
    pub fn became_leader(&self, fencing_token: u64) {
        self.role.store(Role::Leader as u8, Relaxed);
        let previous = self.fencing_token.swap(fencing_token, Relaxed);
        self.lease_checked();
        metrics::gauge!(names::LEADER).set(1.0);
        metrics::gauge!(names::FENCING_TOKEN).set(fencing_token as f64);
        // A restart within the tenure re-acquires the same token: not a new tenure.
        if previous != fencing_token {
            metrics::counter!(names::LEASE_ACQUIRED).increment(1);
        }
    }

    /// Another instance holds the lease (or this one lost or released it). A shutdown in
    /// progress stays [`Role::Stopping`].
    pub fn became_standby(&self) {
        let _ = self.role.fetch_update(Relaxed, Relaxed, |r| (r != Role::Stopping as u8).then_some(Role::Standby as u8));
        self.fencing_token.store(0, Relaxed);
        metrics::gauge!(names::LEADER).set(0.0);
        metrics::gauge!(names::FENCING_TOKEN).set(0.0);
    }

    /// The pipeline stopped on transient error `reason` and restarts (cleared when the replica
    /// connection opens).
    pub fn restarting(&self, reason: String) {
        *self.restart_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }

    /// A shutdown was requested: not ready from now on.
    pub fn stopping(&self) {
        self.role.store(Role::Stopping as u8, Relaxed);
    }

    /// The lease was read or renewed in Redis just now.
    pub fn lease_checked(&self) {
        self.lease_checked_ms.store(crate::now_ms(), Relaxed);
    }

    /// The fencing token of the current tenure (0 when not leader).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token.load(Relaxed)
    }

    /// Whether the replica connection is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Relaxed)
    }

    /// Record the lag the monitor computed.
    pub fn set_lag_ms(&self, lag_ms: u64) {
        self.lag_ms.store(lag_ms, Relaxed);
    }

    /// The last checkpoint saved or loaded.
    pub fn checkpoint(&self) -> Option<SavedCheckpoint> {
        self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ready or not at `now_ms`, and why (the rules in the module docs).
    pub fn readiness(&self, now_ms: u64) -> Readiness {
        let role = self.role();
        let (ready, reason) = match role {
            Role::Starting => (false, "starting: no lease decision yet".to_string()),
            Role::Stopping => (false, "shutting down".to_string()),
            Role::Leader => {
                let (lag, max) = (self.lag_ms.load(Relaxed), self.max_lag_ms.load(Relaxed));
                if !self.connected() {
                    match self.restart_reason.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
                        Some(why) => (false, format!("leader, but the pipeline is restarting after: {why}")),
                        None => (false, "leader, but the replica connection to the source is not open".to_string()),
                    }
                } else if lag > max {
                    (false, format!("leader, {lag} ms behind the source (metrics.ready_max_lag_ms = {max})"))
                } else {
                    (true, format!("leader streaming, {lag} ms behind the source"))
                }
            }
            Role::Standby => {
                let bound = self.lease_ms.load(Relaxed) * 2;
                let age = now_ms.saturating_sub(self.lease_checked_ms.load(Relaxed));
                if age > bound {
                    (false, format!("standby, but the lease was not read in Redis for {age} ms (bound {bound} ms)"))
                } else {
                    (true, "standby, polling the lease".to_string())
                }
            }
        };
        Readiness { ready, role: role.as_str(), reason }
    }
}

/// The replica connection is open until the returned guard drops (hold it for the life of the
/// connection): sets [`names::SOURCE_CONNECTED`] and the readiness flag.
#[must_use = "the connection counts as open only while the guard lives"]
pub fn source_connected() -> ConnectedGuard {
    HEALTH.connected.store(true, Relaxed);
    *HEALTH.restart_reason.lock().unwrap_or_else(|e| e.into_inner()) = None;
    metrics::gauge!(names::SOURCE_CONNECTED).set(1.0);
    ConnectedGuard(())
}

/// See [`source_connected`].
#[derive(Debug)]
pub struct ConnectedGuard(());

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        HEALTH.connected.store(false, Relaxed);
        metrics::gauge!(names::SOURCE_CONNECTED).set(0.0);
    }
}

/// A checkpoint was saved, or loaded at start: the `checkpoint` position gauges and
/// the state [`crate::monitor`] computes the checkpoint age from.
pub fn checkpoint_recorded(file: &str, pos: u64, saved_at_ms: u64) {
    set_position("checkpoint", file, pos);
    metrics::gauge!(names::CHECKPOINT_SAVED_TS).set(saved_at_ms as f64 / 1000.0);
    *HEALTH.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) = Some(SavedCheckpoint { file: file.to_string(), pos, saved_at_ms });
}

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
        let names_of_stage: &[&'static str] = if q.stage == stage::KAFKA { &[stage::KAFKA, stage::KAFKA_ALIAS] } else { std::slice::from_ref(&q.stage) };
        for &name in names_of_stage {
            metrics::gauge!(names::QUEUE_DEPTH, "stage" => name).set(depth as f64);
            if capacity > 0 {
                metrics::gauge!(names::QUEUE_CAPACITY, "stage" => name).set(capacity as f64);
            }
        }
    }
}

static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();

/// Install the Prometheus recorder (once per process; later calls return the first handle),
/// with `labels` on every metric and buckets for every histogram.
pub fn install_recorder(labels: &[(&str, &str)]) -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut b = PrometheusBuilder::new();
    for (k, v) in labels {
        b = b.add_global_label(*k, *v);
    }
    let bucket_err = |e: metrics_exporter_prometheus::BuildError| e.to_string();
    b = b.set_buckets(SECONDS_BUCKETS).map_err(bucket_err)?;
    for name in [names::APPLY_GROUP_TRANSACTIONS, names::APPLY_GROUP_KEYS] {
        b = b.set_buckets_for_metric(Matcher::Full(name.into()), COUNT_BUCKETS).map_err(bucket_err)?;
    }
    let recorder = b.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| format!("installing the metrics recorder: {e}"))?;
    let _ = HANDLE.set(handle.clone());
    describe();
    Ok(handle)
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listen` (`ip:port`), installing the
/// recorder with `labels` first. Must run inside a tokio runtime. Errors name `metrics.listen`
/// when the address cannot be parsed or bound.
pub async fn serve(listen: &str, labels: &[(&str, &str)]) -> Result<(), String> {
    let addr: std::net::SocketAddr = listen.parse().map_err(|e| format!("metrics.listen `{listen}`: {e}"))?;
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("metrics.listen `{listen}`: {e}"))?;
    let handle = install_recorder(labels)?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let h = handle.clone();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|| async {
                let r = HEALTH.readiness(crate::now_ms());
                let code = if r.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                (code, axum::Json(r))
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    use names::*;
    describe_gauge!(INFO, "always 1: build version and lease holder id");
    describe_gauge!(LEADER, "1 while this instance holds the lease and writes");
    describe_gauge!(FENCING_TOKEN, "fencing token of the current tenure (0 when not leader)");
    describe_counter!(LEASE_ACQUIRED, "tenures this instance began");
    describe_gauge!(READY, "what /readyz answers (1 ready)");
    describe_gauge!(SOURCE_CONNECTED, "the replica connection to the source is open");
    describe_counter!(RECONNECTS, "replica connection reconnects");
    describe_counter!(BINLOG_EVENTS, "binlog events read");
    describe_counter!(TRANSACTIONS, "committed transactions applied");
    describe_counter!(ROWS, "row changes of mapped tables applied");
    describe_counter!(KEY_CHANGES, "key changes written to Redis");
    describe_counter!(EVENTS_ACKED, "invalidation messages acknowledged by Kafka (per_key: one per key change; batched: one per batch)");
    describe_gauge!(LAG, Unit::Seconds, "seconds behind the source (0 when everything read is acknowledged)");
    describe_gauge!(HEARTBEAT_LAG, Unit::Seconds, "ack time minus NOW(6) of the last heartbeat row seen back");
    describe_gauge!(BINLOG_FILE_INDEX, "binlog file index of the read/acked/checkpoint/source position");
    describe_gauge!(BINLOG_POSITION, Unit::Bytes, "binlog offset of the read/acked/checkpoint/source position");
    describe_gauge!(BINLOG_BYTES_BEHIND, Unit::Bytes, "binlog bytes between the acknowledged position and the primary's");
    describe_gauge!(GTID_SEQUENCE, "GTID sequence number of the last transaction read/acked, per domain");
    describe_gauge!(QUEUE_DEPTH, "items waiting in a stage's output queue");
    describe_gauge!(QUEUE_CAPACITY, "capacity of a stage's output queue");
    describe_histogram!(APPLY_GROUP_TRANSACTIONS, "transactions per applied group");
    describe_histogram!(APPLY_GROUP_KEYS, "key changes per applied group");
    describe_gauge!(XA_HELD, "prepared XA transactions held until their XA COMMIT or ROLLBACK");
    describe_counter!(TRANSACTIONS_SPILLED, "transactions whose row events were spilled to a temporary file");
    describe_histogram!(REDIS_APPLY_SECONDS, Unit::Seconds, "Redis time per applied group (its fenced writes sent to acknowledged)");
    describe_histogram!(KAFKA_DELIVERY_SECONDS, Unit::Seconds, "Kafka enqueue to acknowledgement");
    describe_counter!(ERRORS, "client errors by service and kind (definite/transient)");
    describe_counter!(RESTARTS, "pipeline restarts after transient failures");
    describe_counter!(FENCED_NOOPS, "key changes Redis already held");
    describe_counter!(REDIS_RETRIES, "groups whose Redis writes were sent again after a transient failure (a master timing out)");
    describe_counter!(
        TOKEN_READS_SKIPPED,
        "Cluster groups written without reading their version tokens first (a master did not answer within 500 ms)"
    );
    describe_gauge!(ADAPTIVE_KEYS, "keys of adaptive mappings above their min replica count");
    describe_counter!(ADAPTIVE_COUNT_CHANGES, "replica-count steps taken (grow, announce, remove)");
    describe_gauge!(ADAPTIVE_REPORTING_INSTANCES, "app instances whose heat report the leader counted in its last round");
    describe_gauge!(ADAPTIVE_AT_MAX, "keys at their max replica count whose fleet read rate is still over budget");
    describe_gauge!(GROUPS_IN_FLIGHT, "groups whose Redis writes are under way at once (more than 1: a master is slow)");
    describe_gauge!(KAFKA_WAIT, Unit::Seconds, "how long the oldest event not yet acknowledged by Kafka has waited (0: none waiting)");
    describe_counter!(CHECKPOINTS, "checkpoints saved");
    describe_gauge!(CHECKPOINT_AGE, Unit::Seconds, "seconds since the last save while something read is not saved (0 otherwise)");
    describe_gauge!(CHECKPOINT_SAVED_TS, Unit::Seconds, "when the last checkpoint was saved, Unix s");
    describe_histogram!(COMMIT_TO_ACK_S, Unit::Seconds, "binlog commit to Kafka ack");
    describe_gauge!(ACKED_COMMIT_TS, Unit::Seconds, "commit time of the last acknowledged transaction");
    describe_counter!(REPLAY_TRANSACTIONS, "transactions replayed");
    describe_counter!(REPLAY_KEY_CHANGES, "replayed key changes by result (changed/unchanged)");
    describe_counter!(REPLAY_EVENTS, "events replay published");
    describe_gauge!(REPLAY_POSITION, Unit::Bytes, "replay's read and end positions (offsets)");
    describe_gauge!(REPLAY_FILE_INDEX, "file index of replay's read and end positions");
    describe_counter!(VERIFY_RUNS, "verify runs by result (consistent/inconsistent/failed)");
    describe_gauge!(VERIFY_LAST_RUN_TS, Unit::Seconds, "when the last verify run ended, Unix s");
    describe_gauge!(VERIFY_DURATION, Unit::Seconds, "wall time of the last verify run");
    describe_gauge!(VERIFY_ROWS_CHECKED, "rows the last verify run read");
    describe_gauge!(VERIFY_KEYS_CHECKED, "keys the last verify run checked");
    describe_gauge!(VERIFY_MISMATCHED_KEYS, "keys with a confirmed mismatch in the last verify run");
    describe_gauge!(VERIFY_MISMATCHES, "confirmed findings of the last verify run by kind");
    describe_gauge!(VERIFY_UNSETTLED, "keys that differed twice but changed in between (lag) in the last verify run");
    describe_gauge!(VERIFY_NINES, "consistency of the last verify run in nines");
    describe_counter!(VERIFY_REPAIRED, "keys verify --repair rewrote and found consistent");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name of [`names::ALL`] is in the module docs' table, and the other way round.
    #[test]
    fn the_table_documents_every_name() {
        let src = include_str!("telemetry.rs");
        let table: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("//! | `binval_")).filter_map(|l| l.split('`').next()).collect();
        let documented: std::collections::BTreeSet<String> = table.iter().map(|n| format!("binval_{n}")).collect();
        let defined: std::collections::BTreeSet<String> = names::ALL.iter().map(|n| n.to_string()).collect();
        assert_eq!(documented, defined, "docs table vs names::ALL");
    }

    #[test]
    fn readiness_rules() {
        let h = Health {
            role: AtomicU8::new(Role::Starting as u8),
            connected: AtomicBool::new(false),
            lag_ms: AtomicU64::new(0),
            lease_checked_ms: AtomicU64::new(0),
            lease_ms: AtomicU64::new(5000),
            max_lag_ms: AtomicU64::new(30_000),
            fencing_token: AtomicU64::new(0),
            checkpoint: Mutex::new(None),
            restart_reason: Mutex::new(None),
        };
        let now = crate::now_ms();
        assert!(!h.readiness(now).ready, "starting");
        h.became_standby();
        assert!(!h.readiness(now).ready, "standby that never read the lease");
        h.lease_checked();
        assert_eq!(h.readiness(now).role, "standby");
        assert!(h.readiness(now).ready);
        assert!(!h.readiness(now + 20_000).ready, "standby whose lease check is older than two lease periods");
        h.became_leader(7);
        assert_eq!(h.fencing_token(), 7);
        assert!(!h.readiness(now).ready, "leader without a source connection");
        h.restarting("kafka: kafka.brokers = \"x:1\": no broker answered".into());
        let r = h.readiness(now);
        assert!(!r.ready && r.reason.contains("kafka.brokers"), "the restart's cause is the reason: {r:?}");
        h.connected.store(true, Relaxed);
        assert!(h.readiness(now).ready);
        h.set_lag_ms(30_001);
        let r = h.readiness(now);
        assert!(!r.ready && r.reason.contains("30001 ms behind"), "{r:?}");
        h.set_lag_ms(10);
        h.stopping();
        h.became_standby();
        assert_eq!(h.readiness(now).role, "stopping", "a shutdown stays stopping");
    }
}
