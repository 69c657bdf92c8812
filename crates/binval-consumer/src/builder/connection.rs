//! Options of the connections: where the replicas and version tokens are read (Redis), where
//! the invalidation events come from (Kafka brokers and topic), and the bounds of every
//! request on them. The internals are `redis_conn.rs` and `listener.rs`.

use std::time::Duration;

use super::ConsumerBuilder;
use crate::redis_conn::RedisTarget;

/// # Connection: Redis, Kafka and their timeouts
///
/// The Redis target ([`ConsumerBuilder::redis_standalone`] or
/// [`ConsumerBuilder::redis_cluster`]), the [`ConsumerBuilder::brokers`] and the
/// [`ConsumerBuilder::topic`] are required; the rest bounds each request and the shutdown.
impl ConsumerBuilder {
    /// Read replicas and version tokens from one standalone Redis server. Required (or
    /// [`ConsumerBuilder::redis_cluster`]); the last call wins.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_standalone("redis://127.0.0.1:6379");
    /// ```
    pub fn redis_standalone(mut self, url: impl Into<String>) -> Self {
        self.redis = Some(RedisTarget::Standalone(url.into()));
        self
    }

    /// Read replicas and version tokens from a Redis Cluster, given by seed node URLs (one is
    /// enough; the slot map is discovered). Required (or [`ConsumerBuilder::redis_standalone`]).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_cluster(vec!["redis://10.0.0.1:7000".to_string(), "redis://10.0.0.2:7000".to_string()]);
    /// ```
    pub fn redis_cluster<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.redis = Some(RedisTarget::Cluster(urls.into_iter().map(Into::into).collect()));
        self
    }

    /// Kafka bootstrap servers (`host:port[,host:port…]`) of the invalidation topic. Required.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.brokers("kafka-1:9092,kafka-2:9092");
    /// ```
    pub fn brokers(mut self, brokers: impl Into<String>) -> Self {
        self.brokers = Some(brokers.into());
        self
    }

    /// The topic binval publishes invalidation events to. Required; it must exist when
    /// `build()` runs.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.topic("binval.invalidations");
    /// ```
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Pass a librdkafka setting to the listener's consumer (applied after this crate's own
    /// settings, so it can override them; do not override `group.id` or enable commits).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_property("fetch.wait.max.ms", "5").kafka_property("security.protocol", "ssl");
    /// ```
    pub fn kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka_properties.push((key.into(), value.into()));
        self
    }

    /// Bound of each Redis read of a fill (version token, one replica). Default 200 ms. A read that
    /// exceeds it fails with [`ConsumerError::Timeout`](crate::ConsumerError::Timeout); reads are
    /// never retried.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_response_timeout(Duration::from_millis(50));
    /// ```
    pub fn redis_response_timeout(mut self, timeout: Duration) -> Self {
        self.redis_response_timeout = timeout;
        self
    }

    /// Bound of one Redis connection attempt. Default 1 s. `build()` fails if it cannot
    /// connect within three times this.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.redis_connection_timeout(Duration::from_millis(500));
    /// ```
    pub fn redis_connection_timeout(mut self, timeout: Duration) -> Self {
        self.redis_connection_timeout = timeout;
        self
    }

    /// Bound of each Kafka metadata / watermark request (at `build()` and on refresh).
    /// Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.kafka_request_timeout(Duration::from_secs(2));
    /// ```
    pub fn kafka_request_timeout(mut self, timeout: Duration) -> Self {
        self.kafka_request_timeout = timeout;
        self
    }

    /// Prefix of the listener's unique Kafka `group.id` (the rest is pid, time and a random
    /// number). Default `binval-consumer`. Useful to recognise instances in broker tooling.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.group_id_prefix("shop-api");
    /// ```
    pub fn group_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.group_id_prefix = prefix.into();
        self
    }

    /// How long [`Consumer::shutdown`](crate::Consumer::shutdown) waits for the listener (and
    /// librdkafka's teardown) before giving up on it. Default 5 s.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let b = binval_consumer::Consumer::builder();
    /// let b = b.shutdown_timeout(Duration::from_secs(2));
    /// ```
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }
}
