//! The Prometheus recorder and the HTTP listener of `/metrics`, `/healthz` and `/readyz`.

use std::sync::OnceLock;
use std::time::Duration;

use super::health::HEALTH;
use super::{names, COUNT_BUCKETS, SECONDS_BUCKETS};

/// Why the metrics exporter could not start ([`install_recorder`], [`serve`]).
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The exporter refused a histogram's buckets (binval's own bucket lists: a bug).
    #[error("metrics buckets: {0}")]
    Buckets(#[from] metrics_exporter_prometheus::BuildError),
    /// Another metrics recorder was installed in this process first.
    #[error("installing the metrics recorder: {0}")]
    Recorder(String),
    /// The listen address is not `ip:port`. `setting` names where it came from
    /// (`metrics.listen`, or a command's `--metrics-listen`).
    #[error("{setting} `{listen}`: {source}")]
    Address { setting: &'static str, listen: String, source: std::net::AddrParseError },
    /// The listen address could not be bound (in use, not local, no permission).
    #[error("{setting} `{listen}`: {source}")]
    Bind { setting: &'static str, listen: String, source: std::io::Error },
}

static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();

/// Install the Prometheus recorder (once per process; later calls return the first handle),
/// with `labels` on every metric and buckets for every histogram.
pub fn install_recorder(labels: &[(&str, &str)]) -> Result<metrics_exporter_prometheus::PrometheusHandle, MetricsError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let mut b = PrometheusBuilder::new();
    for (k, v) in labels {
        b = b.add_global_label(*k, *v);
    }
    b = b.set_buckets(SECONDS_BUCKETS)?;
    for name in [names::APPLY_GROUP_TRANSACTIONS, names::APPLY_GROUP_KEYS] {
        b = b.set_buckets_for_metric(Matcher::Full(name.into()), COUNT_BUCKETS)?;
    }
    let recorder = b.build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|e| MetricsError::Recorder(e.to_string()))?;
    let _ = HANDLE.set(handle.clone());
    describe();
    Ok(handle)
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listen` (`ip:port`), installing the
/// recorder with `labels` first. Must run inside a tokio runtime. Errors name `setting`
/// (`metrics.listen`, or a command's `--metrics-listen`) when the address cannot be parsed or
/// bound.
pub async fn serve(listen: &str, setting: &'static str, labels: &[(&str, &str)]) -> Result<(), MetricsError> {
    let addr: std::net::SocketAddr =
        listen.parse().map_err(|source| MetricsError::Address { setting, listen: listen.to_string(), source })?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|source| MetricsError::Bind { setting, listen: listen.to_string(), source })?;
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
