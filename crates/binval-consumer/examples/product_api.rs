//! `product_api`: a small HTTP service (axum) that serves product details through
//! `binval-consumer` — local cache in front of binval's suffix replicas, kept in step by the
//! invalidation topic. Used by the demo and as a template for an app instance.
//!
//! Routes:
//! - `GET /products/{id}` — the product's payload JSON (as binval wrote it from the row), read
//!   through the consumer under the logical key `{BINVAL_KEY_PREFIX}{id}`. 404 when the row
//!   does not exist, 503 when the miss rate limit refused the read (`Overloaded`) or binval's
//!   side is behind the bound without a loader (`SourceBehind`), 502 for a
//!   Redis / decode error, 504 for a timeout.
//! - `GET /stats` — whether it serves locally now and the fail safe's lags (`stream_lag_ms`,
//!   `source_lag_ms` from binval's progress messages,
//!   against `max_staleness_ms`), the share of reads served locally, the eviction lag of the
//!   events of the last 10 s (publish -> applied here, p50 / p99 / max), the consumer's
//!   counters (`bypass_reads`, `fail_safe_engaged`, `listener_rebuilds`, `stream_gaps`, …) and
//!   local entries/bytes.
//! - `GET /hot` — this instance's top hot keys with their read rates.
//! - `GET /metrics` — every `binval_consumer_*` metric, Prometheus text format.
//!
//! Configuration (environment variables; required ones have no default):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `BINVAL_REDIS_URLS` | required | comma-separated Redis URLs; several = a Cluster |
//! | `BINVAL_REDIS_CLUSTER` | `false` | `true`: treat a single URL as a Cluster seed |
//! | `BINVAL_BROKERS` | required | Kafka bootstrap servers |
//! | `BINVAL_TOPIC` | `binval.invalidations` | invalidation topic |
//! | `BINVAL_KEY_PREFIX` | `item:detail:` | logical key = prefix + id (binval's key template) |
//! | `BINVAL_REPLICAS` | `1` | the replica count N a read starts with; the records correct it (adaptive counts) |
//! | `BINVAL_CACHE_MODE` | `all` | `all`, `hot`, or `prefix:<p1>,<p2>` |
//! | `BINVAL_HOT_THRESHOLD` | `1000` | reads/s at which a key is hot |
//! | `BINVAL_TTL_MS` | `60000` | safety-net TTL of a local entry |
//! | `BINVAL_MAX_BYTES` | `67108864` | local cache bound, bytes (plus 100 000 entries) |
//! | `BINVAL_MAX_FILLS_PER_KEY_PER_SEC` | `0` (off) | per-key miss rate limit |
//! | `BINVAL_MAX_STALENESS_MS` | `2000` | the fail safe's lag bound (`0` = off) |
//! | `BINVAL_FETCH_WAIT_MS` | crate default (10) | librdkafka `fetch.wait.max.ms` of the listener (on a large Kafka cluster: 100-500) |
//! | `LISTEN_ADDR` | `127.0.0.1:8080` | HTTP listen address |
//! | `BINVAL_REDIS_USERNAME` | unset (`default` user) | Redis ACL user |
//! | `BINVAL_REDIS_PASSWORD` / `BINVAL_REDIS_PASSWORD_FILE` | unset | its password, or a file holding it (a mounted Secret) |
//! | `BINVAL_REDIS_TLS_MODE` | `verify-identity` for `rediss://` URLs | `required`, `verify-ca`, `verify-identity` |
//! | `BINVAL_REDIS_TLS_CA_FILE`, `BINVAL_REDIS_TLS_CERT_FILE`, `BINVAL_REDIS_TLS_KEY_FILE` | unset | CA, client certificate and key (PEM) |
//! | `BINVAL_KAFKA_TLS_MODE` | `verify-identity` when a Kafka TLS file is set, else `disabled` | as for Redis |
//! | `BINVAL_KAFKA_TLS_CA_FILE`, `BINVAL_KAFKA_TLS_CERT_FILE`, `BINVAL_KAFKA_TLS_KEY_FILE` | unset | CA, client certificate and key (PEM) |
//! | `BINVAL_KAFKA_SASL_MECHANISM` | unset (no SASL) | `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` |
//! | `BINVAL_KAFKA_SASL_USERNAME`, `BINVAL_KAFKA_SASL_PASSWORD` / `_PASSWORD_FILE` | unset | SASL user and password |
//!
//! Run: `BINVAL_REDIS_URLS=redis://127.0.0.1:6379 BINVAL_BROKERS=127.0.0.1:9092 cargo run -p
//! binval-consumer --example product_api`, then `curl localhost:8080/products/6666`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use binval_consumer::{CacheMode, Consumer, ConsumerError};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[derive(Clone)]
struct App {
    consumer: Consumer,
    key_prefix: String,
    metrics: PrometheusHandle,
    max_staleness: Option<Duration>,
    lags: Arc<Mutex<RecentLags>>,
}

/// Publish -> applied lag (ms) of the events applied in the last [`RecentLags::WINDOW`],
/// from the consumer's eviction notices.
#[derive(Default)]
struct RecentLags {
    samples: VecDeque<(Instant, u64)>,
}

impl RecentLags {
    const WINDOW: Duration = Duration::from_secs(10);
    const MAX_SAMPLES: usize = 100_000;

    fn push(&mut self, now: Instant, lag_ms: u64) {
        if self.samples.len() == Self::MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((now, lag_ms));
    }

    /// `{events, p50_ms, p99_ms, max_ms}` over the window.
    fn summary(&mut self, now: Instant) -> serde_json::Value {
        while self.samples.front().is_some_and(|(at, _)| now.duration_since(*at) > Self::WINDOW) {
            self.samples.pop_front();
        }
        let mut v: Vec<u64> = self.samples.iter().map(|(_, l)| *l).collect();
        v.sort_unstable();
        let pct = |p: f64| v.get(((v.len().saturating_sub(1)) as f64 * p).round() as usize).copied();
        serde_json::json!({ "window_s": Self::WINDOW.as_secs(), "events": v.len(), "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": v.last() })
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match env(name) {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e| anyhow::anyhow!("{name}={v:?}: {e}")),
    }
}

fn cache_mode(spec: &str) -> anyhow::Result<CacheMode> {
    Ok(match spec.trim() {
        "all" => CacheMode::All,
        "hot" => CacheMode::HotOnly,
        s if s.starts_with("prefix:") => CacheMode::Prefixes(s["prefix:".len()..].split(',').map(|p| p.trim().to_string()).collect()),
        other => bail!("BINVAL_CACHE_MODE={other:?}: expected all, hot or prefix:<p1>,<p2>"),
    })
}

async fn build_consumer(key_prefix: &str, max_staleness: Option<Duration>) -> anyhow::Result<Consumer> {
    let urls: Vec<String> = env("BINVAL_REDIS_URLS")
        .context("BINVAL_REDIS_URLS is required (comma-separated Redis URLs)")?
        .split(',')
        .map(|u| u.trim().to_string())
        .collect();
    let brokers = env("BINVAL_BROKERS").context("BINVAL_BROKERS is required (Kafka bootstrap servers)")?;
    let mut b = Consumer::builder()
        .brokers(brokers)
        .topic(env("BINVAL_TOPIC").unwrap_or_else(|| "binval.invalidations".into()))
        .replicas_for_prefix(key_prefix, env_or("BINVAL_REPLICAS", 1u32)?)
        .cache_mode(cache_mode(&env("BINVAL_CACHE_MODE").unwrap_or_else(|| "all".into()))?)
        .hot_key_threshold(env_or("BINVAL_HOT_THRESHOLD", 1000.0f64)?)
        .ttl(Duration::from_millis(env_or("BINVAL_TTL_MS", 60_000u64)?))
        .ttl_jitter(0.1)
        .max_entries(100_000)
        .max_bytes(env_or("BINVAL_MAX_BYTES", 64u64 << 20)?)
        .max_fills_per_key_per_sec(env_or("BINVAL_MAX_FILLS_PER_KEY_PER_SEC", 0u32)?)
        .max_staleness(max_staleness);
    if let Some(wait) = env("BINVAL_FETCH_WAIT_MS") {
        b = b.kafka_property("fetch.wait.max.ms", wait.trim());
    }
    b = if urls.len() > 1 || env_or("BINVAL_REDIS_CLUSTER", false)? { b.redis_cluster(urls) } else { b.redis_standalone(&urls[0]) };
    Ok(security(b)?.build().await?)
}

/// TLS, users and passwords from the `BINVAL_REDIS_*` / `BINVAL_KAFKA_*` variables above.
fn security(mut b: binval_consumer::ConsumerBuilder) -> anyhow::Result<binval_consumer::ConsumerBuilder> {
    use binval_consumer::{KafkaSasl, Secret, TlsSettings};
    let password = |name: &str| -> anyhow::Result<Option<Secret>> {
        match (env(name), env(&format!("{name}_FILE"))) {
            (Some(p), _) => Ok(Some(Secret::new(p))),
            (None, Some(f)) => Secret::from_file(std::path::Path::new(&f)).map(Some).map_err(|e| anyhow::anyhow!("{name}_FILE: {e}")),
            (None, None) => Ok(None),
        }
    };
    let tls = |svc: &str| -> anyhow::Result<TlsSettings> {
        let mode = env(&format!("BINVAL_{svc}_TLS_MODE"))
            .map(|m| m.parse())
            .transpose()
            .map_err(|e: binval_consumer::UnknownValue| anyhow::anyhow!("BINVAL_{svc}_TLS_MODE={e}"))?;
        let file = |n: &str| env(&format!("BINVAL_{svc}_TLS_{n}_FILE")).map(std::path::PathBuf::from);
        Ok(TlsSettings { mode, ca_file: file("CA"), client_cert_file: file("CERT"), client_key_file: file("KEY"), server_name: None })
    };
    b = b.redis_tls(tls("REDIS")?).kafka_tls(tls("KAFKA")?);
    if let Some(p) = password("BINVAL_REDIS_PASSWORD")? {
        b = b.redis_user(env("BINVAL_REDIS_USERNAME").as_deref(), p);
    }
    if let Some(m) = env("BINVAL_KAFKA_SASL_MECHANISM") {
        let mechanism = m.parse().map_err(|e: binval_consumer::UnknownValue| anyhow::anyhow!("BINVAL_KAFKA_SASL_MECHANISM={e}"))?;
        let username =
            env("BINVAL_KAFKA_SASL_USERNAME").context("BINVAL_KAFKA_SASL_USERNAME is required with BINVAL_KAFKA_SASL_MECHANISM")?;
        let password = password("BINVAL_KAFKA_SASL_PASSWORD")?
            .context("BINVAL_KAFKA_SASL_PASSWORD(_FILE) is required with BINVAL_KAFKA_SASL_MECHANISM")?;
        b = b.kafka_sasl(KafkaSasl { mechanism, username, password });
    }
    Ok(b)
}

/// `GET /products/{id}`: the payload JSON text, served as is.
async fn product(State(app): State<App>, Path(id): Path<u64>) -> Response {
    let key = format!("{}{id}", app.key_prefix);
    match app.consumer.get_shared(&key).await {
        Ok(Some(json)) => ([(header::CONTENT_TYPE, "application/json")], json.to_string()).into_response(),
        Ok(None) => (StatusCode::NOT_FOUND, Json(serde_json::json!({ "error": "no such product", "key": key }))).into_response(),
        Err(e) => {
            let status = match &e {
                // binval's side is behind the bound: no fresh value to give (retry later).
                ConsumerError::Overloaded { .. } | ConsumerError::SourceBehind { .. } => StatusCode::SERVICE_UNAVAILABLE,
                ConsumerError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::BAD_GATEWAY,
            };
            (status, Json(serde_json::json!({ "error": e.to_string(), "key": key }))).into_response()
        }
    }
}

/// `GET /stats`: whether it serves locally and why (the fail safe's lag), how the reads went,
/// the recent eviction lag, counters and cache state.
async fn stats(State(app): State<App>) -> Json<serde_json::Value> {
    let c = &app.consumer;
    let s = c.stats();
    let reads = s.hits + s.misses + s.bypass_reads + s.uncached_reads;
    Json(serde_json::json!({
        "serving_local": c.is_serving_local(),
        "stream_lag_ms": c.stream_lag().as_millis() as u64,
        "source_lag_ms": c.source_lag().map(|l| l.as_millis() as u64),
        "max_staleness_ms": app.max_staleness.map(|d| d.as_millis() as u64),
        "served_locally_share": if reads == 0 { None } else { Some(s.hits as f64 / reads as f64) },
        "eviction_lag_publish_to_applied": app.lags.lock().unwrap_or_else(|p| p.into_inner()).summary(Instant::now()),
        "stats": s,
        "local_entries": c.local_entries(),
        "local_bytes": c.local_weighted_size(),
        "topic": c.topic(),
        "group_id": c.group_id(),
    }))
}

/// `GET /hot`: the top hot keys of this instance.
async fn hot(State(app): State<App>) -> Json<Vec<binval_consumer::HotKey>> {
    Json(app.consumer.hot_keys())
}

/// `GET /metrics`: Prometheus text format.
async fn metrics_text(State(app): State<App>) -> String {
    app.metrics.render()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    // Buckets for the consumer's histograms, so the app dashboard's quantiles work.
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in binval_consumer::HISTOGRAM_BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets).context("histogram buckets")?;
    }
    let prometheus = builder.install_recorder().context("install the Prometheus recorder")?;
    let key_prefix = env("BINVAL_KEY_PREFIX").unwrap_or_else(|| "item:detail:".into());
    let max_staleness = match env_or("BINVAL_MAX_STALENESS_MS", 2000u64)? {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    };
    let consumer = build_consumer(&key_prefix, max_staleness).await?;
    let listen = env("LISTEN_ADDR").unwrap_or_else(|| "127.0.0.1:8080".into());
    let lags = Arc::new(Mutex::new(RecentLags::default()));
    // The eviction lag of every applied event, for /stats.
    let mut notices = consumer.subscribe_evictions();
    let lags2 = lags.clone();
    tokio::spawn(async move {
        loop {
            match notices.recv().await {
                Ok(n) => {
                    lags2.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now(), n.received_at_ms.saturating_sub(n.publish_time_ms))
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
    let app = App { consumer: consumer.clone(), key_prefix, metrics: prometheus, max_staleness, lags };
    let router = Router::new()
        .route("/products/{id}", get(product))
        .route("/stats", get(stats))
        .route("/hot", get(hot))
        .route("/metrics", get(metrics_text))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("bind {listen}"))?;
    tracing::info!(%listen, topic = consumer.topic(), "product_api listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            // Ctrl-C, or SIGTERM from a container runtime.
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        })
        .await?;
    consumer.shutdown().await;
    Ok(())
}
