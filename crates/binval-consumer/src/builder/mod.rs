//! [`ConsumerBuilder`]: every setting of a [`Consumer`], with its default, and `build()`.
//!
//! The setters are grouped by where their internals live, one documented `impl` block per
//! file: `connection.rs` (Redis, Kafka, timeouts), `read.rs` (replicas, cache mode, loader),
//! `adaptive.rs` (heat reports, instance id, the hot set),
//! `bounds.rs` (local cache bounds and lifetimes), `limits.rs` (miss rate limits and stale
//! fallback), `fail_safe.rs` (fill-race guard, lag bound, listener), `hot_keys.rs` (hot-key
//! detection), `security.rs` (TLS, users and passwords). `validate.rs` checks the settings;
//! this file holds the struct, its defaults and `build()`, which turns the settings into the
//! internals' own settings types.

mod adaptive;
mod bounds;
mod connection;
mod fail_safe;
mod hot_keys;
mod limits;
mod read;
mod security;
mod validate;

use std::num::NonZeroU32;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::consumer::Inner;
use crate::counts::{ReplicaCounts, LEARNED_COUNT_ENTRIES};
use crate::error::ConsumerError;
use crate::heat::{Background, BackgroundSettings, HeatSettings};
use crate::hot::HotSettings;
use crate::listener::{self, ListenerSettings};
use crate::loader::LoaderFn;
use crate::redis_conn::{RedisConn, RedisTarget};
use crate::state::{Bounds, JitteredTtl, LimitSettings, Shared, SharedSettings};
use crate::{CacheMode, Consumer};

/// Builds a [`Consumer`]. Create it with [`Consumer::builder`]; the Redis target, the brokers
/// and the topic are required, everything else has a default.
///
/// ```no_run
/// # async fn f() -> Result<(), binval_consumer::ConsumerError> {
/// use std::time::Duration;
/// let consumer = binval_consumer::Consumer::builder()
///     .redis_standalone("redis://127.0.0.1:6379")
///     .brokers("127.0.0.1:9092")
///     .topic("binval.invalidations")
///     .replicas(8)
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
///
/// The options, by what they change (each setter has its own example):
///
/// - **connection**: [`redis_standalone`](Self::redis_standalone) /
///   [`redis_cluster`](Self::redis_cluster), [`brokers`](Self::brokers), [`topic`](Self::topic)
///   (required), [`kafka_property`](Self::kafka_property), the Redis and Kafka timeouts
///   ([`replica_read_timeout`](Self::replica_read_timeout) among them),
///   [`group_id_prefix`](Self::group_id_prefix), [`shutdown_timeout`](Self::shutdown_timeout),
///   [`read_from_replica_nodes`](Self::read_from_replica_nodes);
/// - **read-through**: [`replicas`](Self::replicas),
///   [`replicas_for_prefix`](Self::replicas_for_prefix), [`cache_mode`](Self::cache_mode),
///   [`loader`](Self::loader), [`loader_timeout`](Self::loader_timeout),
///   [`cache_loaded`](Self::cache_loaded), [`max_replica_reads`](Self::max_replica_reads),
///   [`missing_ttl`](Self::missing_ttl);
/// - **bounds and lifetimes** of the local cache: [`max_entries`](Self::max_entries),
///   [`max_bytes`](Self::max_bytes), [`ttl`](Self::ttl), [`ttl_jitter`](Self::ttl_jitter),
///   [`refresh_ahead`](Self::refresh_ahead), [`thread_front`](Self::thread_front);
/// - **miss rate limits**: [`max_fills_per_sec`](Self::max_fills_per_sec),
///   [`max_fills_per_key_per_sec`](Self::max_fills_per_key_per_sec),
///   [`stale_ttl`](Self::stale_ttl), [`stale_max_entries`](Self::stale_max_entries);
/// - **invalidation and the fail safe**: [`fill_guard_entries`](Self::fill_guard_entries),
///   [`fill_guard_ttl`](Self::fill_guard_ttl), [`max_staleness`](Self::max_staleness),
///   [`on_source_behind`](Self::on_source_behind), [`require_progress`](Self::require_progress),
///   [`metadata_refresh`](Self::metadata_refresh),
///   [`eviction_channel_capacity`](Self::eviction_channel_capacity);
/// - **security**: [`redis_tls`](Self::redis_tls), [`redis_user`](Self::redis_user),
///   [`kafka_tls`](Self::kafka_tls), [`kafka_sasl`](Self::kafka_sasl);
/// - **hot keys**: [`hot_key_detection`](Self::hot_key_detection),
///   [`hot_key_window`](Self::hot_key_window), [`hot_key_threshold`](Self::hot_key_threshold),
///   [`hot_key_capacity`](Self::hot_key_capacity),
///   [`hot_key_sample_every`](Self::hot_key_sample_every), [`hot_key_top_k`](Self::hot_key_top_k);
/// - **adaptive replica counts**: [`heat_reports`](Self::heat_reports),
///   [`heat_report_interval`](Self::heat_report_interval),
///   [`heat_report_top_keys`](Self::heat_report_top_keys),
///   [`heat_report_min_rate`](Self::heat_report_min_rate), [`instance_id`](Self::instance_id),
///   [`hot_set`](Self::hot_set), [`hot_set_refresh`](Self::hot_set_refresh).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .build().await"]
pub struct ConsumerBuilder {
    redis: Option<RedisTarget>,
    brokers: Option<String>,
    topic: Option<String>,
    replicas: u32,
    prefix_replicas: Vec<(String, u32)>,
    max_entries: u64,
    ttl: Duration,
    kafka_properties: Vec<(String, String)>,
    redis_response_timeout: Duration,
    redis_connection_timeout: Duration,
    fill_guard_entries: u64,
    fill_guard_ttl: Duration,
    metadata_refresh: Duration,
    kafka_request_timeout: Duration,
    max_message_bytes: usize,
    max_staleness: Option<Duration>,
    require_progress: bool,
    on_source_behind: crate::OnSourceBehind,
    replica_read_timeout: Duration,
    shutdown_timeout: Duration,
    eviction_channel_capacity: usize,
    group_id_prefix: String,
    ttl_jitter: f64,
    max_fills_per_sec: u32,
    max_fills_per_key_per_sec: u32,
    stale_ttl: Duration,
    stale_max_entries: u64,
    max_bytes: Option<u64>,
    refresh_ahead: Option<f64>,
    cache_mode: CacheMode,
    loader: Option<LoaderFn>,
    loader_timeout: Duration,
    cache_loaded: bool,
    max_replica_reads: u32,
    missing_ttl: Duration,
    read_from_replica_nodes: bool,
    hot_key_detection: bool,
    hot_key_window: Duration,
    hot_key_threshold: f64,
    hot_key_capacity: usize,
    hot_key_sample_every: u32,
    hot_key_top_k: usize,
    heat_reports: bool,
    heat_report_interval: Duration,
    heat_report_top_keys: usize,
    heat_report_min_rate: f64,
    instance_id: Option<String>,
    hot_set: bool,
    hot_set_refresh: Duration,
    thread_front: bool,
    redis_tls: binval_security::TlsSettings,
    redis_auth: binval_security::RedisAuth,
    kafka_tls: binval_security::TlsSettings,
    kafka_sasl: Option<binval_security::KafkaSasl>,
}

impl Default for ConsumerBuilder {
    fn default() -> Self {
        ConsumerBuilder {
            redis: None,
            brokers: None,
            topic: None,
            replicas: 1,
            prefix_replicas: Vec::new(),
            max_entries: 100_000,
            ttl: Duration::from_secs(60),
            kafka_properties: Vec::new(),
            redis_response_timeout: Duration::from_millis(200),
            redis_connection_timeout: Duration::from_secs(1),
            fill_guard_entries: 100_000,
            fill_guard_ttl: Duration::from_secs(30),
            metadata_refresh: Duration::from_secs(5),
            kafka_request_timeout: Duration::from_secs(5),
            max_message_bytes: crate::listener::DEFAULT_MAX_MESSAGE_BYTES,
            max_staleness: Some(Duration::from_secs(2)),
            require_progress: false,
            on_source_behind: crate::OnSourceBehind::LoadOrRefuse,
            replica_read_timeout: Duration::from_millis(100),
            shutdown_timeout: Duration::from_secs(5),
            eviction_channel_capacity: 4096,
            group_id_prefix: "binval-consumer".into(),
            ttl_jitter: 0.0,
            max_fills_per_sec: 0,
            max_fills_per_key_per_sec: 0,
            stale_ttl: Duration::from_secs(10),
            stale_max_entries: 10_000,
            max_bytes: None,
            refresh_ahead: None,
            cache_mode: CacheMode::All,
            loader: None,
            loader_timeout: Duration::from_secs(1),
            cache_loaded: true,
            max_replica_reads: 2,
            missing_ttl: Duration::from_secs(1),
            read_from_replica_nodes: false,
            hot_key_detection: true,
            hot_key_window: Duration::from_secs(10),
            hot_key_threshold: 1000.0,
            hot_key_capacity: 256,
            hot_key_sample_every: 16,
            hot_key_top_k: 10,
            heat_reports: true,
            heat_report_interval: Duration::from_secs(1),
            heat_report_top_keys: 32,
            heat_report_min_rate: 100.0,
            instance_id: None,
            hot_set: true,
            hot_set_refresh: Duration::from_secs(30),
            thread_front: true,
            redis_tls: Default::default(),
            redis_auth: Default::default(),
            kafka_tls: Default::default(),
            kafka_sasl: None,
        }
    }
}

/// # Building
impl ConsumerBuilder {
    /// Connect to Redis, load the hot set ([`ConsumerBuilder::hot_set`]), start the
    /// invalidation listener and the heat reports ([`ConsumerBuilder::heat_reports`]), and
    /// return once the listener is assigned every partition of the topic at its newest offset:
    /// every event published after `build()` returns will be seen. Must be called within a
    /// tokio runtime (the heat reports run as a tokio task).
    ///
    /// Fails with [`ConsumerError::Config`] for a missing/invalid setting or a topic that does
    /// not exist, [`ConsumerError::Redis`]/[`ConsumerError::Timeout`] if Redis is unreachable,
    /// [`ConsumerError::Kafka`] if the brokers do not answer.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), binval_consumer::ConsumerError> {
    /// let consumer = binval_consumer::Consumer::builder()
    ///     .redis_standalone("redis://127.0.0.1:6379")
    ///     .brokers("127.0.0.1:9092")
    ///     .topic("binval.invalidations")
    ///     .build()
    ///     .await?; // the listener now sees every event published from here on
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<Consumer, ConsumerError> {
        self.validate()?;
        binval_security::install_crypto_provider();
        let redis_target = self.redis.clone().expect("validated");
        let security = crate::redis_conn::Security { tls: &self.redis_tls, auth: &self.redis_auth };
        let redis = RedisConn::connect(
            &redis_target,
            &security,
            self.redis_response_timeout,
            self.redis_connection_timeout,
            self.read_from_replica_nodes,
        )
        .await?;

        let counts = Arc::new(ReplicaCounts::new(self.replicas, self.prefix_replicas.clone(), LEARNED_COUNT_ENTRIES));

        let (consumer, known, confirmed_at, settings) =
            listener::start_assigned(self.listener_settings()?).await.map_err(|e| self.explain_kafka_failure(e))?;

        let shared = Arc::new(Shared::new(self.shared_settings()));
        let stop = Arc::new(AtomicBool::new(false));
        let topic = settings.topic.clone();
        let group_id = settings.group_id.clone();
        let timeout = self.redis_response_timeout;
        if self.hot_set {
            match crate::heat::load_hot_set(&redis, &counts, &shared.counters, timeout).await {
                Ok(n) => tracing::debug!(key = binval_protocol::adaptive::HOT_SET_KEY, entries = n, "hot set loaded"),
                Err(e) => tracing::warn!(
                    key = binval_protocol::adaptive::HOT_SET_KEY,
                    error = %e,
                    "hot set not loaded (the ACL user needs HGETALL on it); keys start at their configured replica counts and reads correct them"
                ),
            }
        }
        let done = listener::spawn(consumer, known, confirmed_at, settings, shared.clone(), stop.clone())?;
        if self.heat_reports && !self.hot_key_detection {
            tracing::warn!("heat_reports(true) with hot_key_detection(false): no reads are counted, so no heat report is written");
        }
        let instance_id = self.instance_id.clone().unwrap_or_else(crate::heat::default_instance_id);
        let background = Background::spawn(
            redis.clone(),
            shared.clone(),
            counts.clone(),
            BackgroundSettings {
                instance_id: instance_id.clone(),
                heat: (self.heat_reports && self.hot_key_detection).then_some(HeatSettings {
                    interval: self.heat_report_interval,
                    top_keys: self.heat_report_top_keys,
                    min_rate: self.heat_report_min_rate,
                }),
                hot_set_refresh: Some(self.hot_set_refresh).filter(|d| self.hot_set && !d.is_zero()),
                timeout,
            },
        );

        Ok(Consumer {
            inner: Arc::new(Inner {
                shared,
                redis,
                counts,
                background,
                instance_id,
                mode: self.cache_mode.clone(),
                loader: self.loader.clone(),
                loader_timeout: self.loader_timeout,
                cache_loaded: self.cache_loaded,
                max_replica_reads: self.max_replica_reads,
                missing_ttl: Some(self.missing_ttl).filter(|t| !t.is_zero()),
                thread_front: self.thread_front,
                response_timeout: self.redis_response_timeout,
                replica_read_timeout: self.replica_read_timeout,
                on_source_behind: self.on_source_behind,
                shutdown_timeout: self.shutdown_timeout,
                stop,
                done: Mutex::new(Some(done)),
                topic,
                group_id,
            }),
        })
    }

    /// The listener's settings, with a fresh unique `group.id` (prefix, pid, time, random) and
    /// the typed security properties before the raw ones.
    fn listener_settings(&self) -> Result<ListenerSettings, ConsumerError> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let group_id = format!("{}-{}-{:x}-{:08x}", self.group_id_prefix, std::process::id(), nanos, rand::random::<u32>());
        let mut properties = self.kafka_security_properties()?;
        properties.extend(self.kafka_properties.iter().cloned());
        Ok(ListenerSettings {
            brokers: self.brokers.clone().expect("validated"),
            topic: self.topic.clone().expect("validated"),
            group_id,
            properties,
            metadata_refresh: self.metadata_refresh,
            request_timeout: self.kafka_request_timeout,
            max_staleness: self.max_staleness,
            max_message_bytes: self.max_message_bytes,
        })
    }

    /// The settings of the state the read path and the listener share: local cache bounds and
    /// TTL, fill-race guard, eviction notices, miss rate limits, hot-key detection.
    fn shared_settings(&self) -> SharedSettings {
        SharedSettings {
            bounds: Bounds { max_entries: self.max_entries, max_bytes: self.max_bytes },
            ttl: JitteredTtl { ttl: self.ttl, jitter: self.ttl_jitter },
            refresh_ahead: self.refresh_ahead,
            guard_entries: self.fill_guard_entries,
            guard_ttl: self.fill_guard_ttl,
            notice_capacity: self.eviction_channel_capacity,
            limits: LimitSettings {
                per_instance: NonZeroU32::new(self.max_fills_per_sec),
                per_key: NonZeroU32::new(self.max_fills_per_key_per_sec),
                stale_ttl: self.stale_ttl,
                stale_entries: self.stale_max_entries,
                key_limiter_entries: self.max_entries,
            },
            hot: self.hot_key_detection.then_some(HotSettings {
                window: self.hot_key_window,
                threshold: self.hot_key_threshold,
                capacity: self.hot_key_capacity,
                sample_every: self.hot_key_sample_every,
                top_k: self.hot_key_top_k,
            }),
            max_staleness: self.max_staleness,
            require_progress: self.require_progress,
            guard_every_key: self.read_from_replica_nodes,
        }
    }
}
