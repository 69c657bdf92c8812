//! Checks of the settings, run first by [`ConsumerBuilder::build`]: every invalid or missing
//! setting is a [`ConsumerError::Config`] naming the option, before anything connects.

use std::time::Duration;

use super::ConsumerBuilder;
use crate::error::ConsumerError;
use crate::redis_conn::RedisTarget;
use crate::CacheMode;

impl ConsumerBuilder {
    /// Replica reads one fill makes at most: the bound, and one more for the replica-0 rule
    /// (`read.rs`; the count a key has is learned from the records, so the configured counts do
    /// not bound it).
    fn reads_per_fill(&self) -> u32 {
        self.max_replica_reads.max(1).saturating_add(1)
    }

    /// Upper bound of one fill: its replica reads, the loader.
    fn longest_fill(&self) -> Duration {
        let reads = self.redis_response_timeout * self.reads_per_fill();
        reads + if self.loader.is_some() { self.loader_timeout } else { Duration::ZERO }
    }

    /// The first invalid setting, as [`ConsumerError::Config`]; the checks run in a fixed
    /// order (where to read, the local cache, then timeouts and the listener).
    pub(super) fn validate(&self) -> Result<(), ConsumerError> {
        self.validate_targets()?;
        self.validate_cache()?;
        self.validate_timeouts()?;
        self.validate_adaptive()?;
        self.validate_security()
    }

    /// Heat reports and the instance id.
    fn validate_adaptive(&self) -> Result<(), ConsumerError> {
        let cfg = |field, reason: String| Err(ConsumerError::Config { field, reason });
        if self.heat_report_interval < Duration::from_millis(100) {
            return cfg("heat_report_interval", format!("must be at least 100 ms, got {} ms", self.heat_report_interval.as_millis()));
        }
        if !(1..=1024).contains(&self.heat_report_top_keys) {
            return cfg("heat_report_top_keys", format!("must be 1 to 1024 keys, got {}", self.heat_report_top_keys));
        }
        if !(self.heat_report_min_rate.is_finite() && self.heat_report_min_rate >= 0.0) {
            return cfg(
                "heat_report_min_rate",
                format!("must be a finite number of reads per second, at least 0, got {}", self.heat_report_min_rate),
            );
        }
        if let Some(id) = &self.instance_id {
            if id.trim().is_empty() || id.chars().any(char::is_control) {
                return cfg("instance_id", format!("must be non-empty, without control characters, got {id:?}"));
            }
        }
        Ok(())
    }

    /// Redis target, brokers, topic and replica counts.
    fn validate_targets(&self) -> Result<(), ConsumerError> {
        let cfg = |field, reason: &str| Err(ConsumerError::Config { field, reason: reason.to_string() });
        match &self.redis {
            None => return cfg("redis", "no Redis given: call .redis_standalone(url) or .redis_cluster(urls)"),
            Some(RedisTarget::Cluster(urls)) if urls.is_empty() => return cfg("redis_cluster", "at least one seed node URL is needed"),
            Some(RedisTarget::Standalone(_)) if self.read_from_replica_nodes => {
                return cfg(
                    "read_from_replica_nodes",
                    "reads from replica nodes need a Redis Cluster (.redis_cluster(urls)); a standalone server has none",
                )
            }
            _ => {}
        }
        if self.brokers.as_deref().is_none_or(|b| b.trim().is_empty()) {
            return cfg("brokers", "no Kafka bootstrap servers given: call .brokers(\"host:port\")");
        }
        if self.topic.as_deref().is_none_or(|t| t.trim().is_empty()) {
            return cfg("topic", "no invalidation topic given: call .topic(name)");
        }
        if self.max_message_bytes == 0 {
            return cfg("max_message_bytes", "must be at least 1 byte");
        }
        if self.replicas == 0 {
            return cfg("replicas", "must be at least 1");
        }
        if self.max_replica_reads == 0 {
            return cfg("max_replica_reads", "must be at least 1 read");
        }
        if let Some((p, _)) = self.prefix_replicas.iter().find(|(_, n)| *n == 0) {
            return Err(ConsumerError::Config {
                field: "replicas_for_prefix",
                reason: format!("prefix `{p}`: replica count must be at least 1"),
            });
        }
        Ok(())
    }

    /// Local cache bounds and lifetimes, loader, cache mode, hot-key detection, stale copies.
    fn validate_cache(&self) -> Result<(), ConsumerError> {
        let cfg = |field, reason: &str| Err(ConsumerError::Config { field, reason: reason.to_string() });
        if self.max_entries == 0 {
            return cfg("max_entries", "must be at least 1 entry");
        }
        if self.ttl.is_zero() {
            return cfg("ttl", "must be longer than 0 ms");
        }
        if self.missing_ttl > self.ttl {
            return Err(ConsumerError::Config {
                field: "missing_ttl",
                reason: format!(
                    "must not exceed ttl ({} ms), got {} ms (Duration::ZERO caches no missing key)",
                    self.ttl.as_millis(),
                    self.missing_ttl.as_millis()
                ),
            });
        }
        if !(0.0..1.0).contains(&self.ttl_jitter) {
            return Err(ConsumerError::Config {
                field: "ttl_jitter",
                reason: format!("must be a fraction in 0.0..1.0, got {}", self.ttl_jitter),
            });
        }
        if let Some(bytes) = self.max_bytes {
            if bytes < 1024 || bytes < self.max_entries {
                return Err(ConsumerError::Config {
                    field: "max_bytes",
                    reason: format!("must be at least 1024 and at least max_entries ({}), got {bytes}", self.max_entries),
                });
            }
        }
        if let Some(f) = self.refresh_ahead {
            if !(0.0..1.0).contains(&f) {
                return Err(ConsumerError::Config {
                    field: "refresh_ahead",
                    reason: format!("must be a fraction of the TTL in 0.0..1.0, got {f}"),
                });
            }
        }
        if self.loader_timeout.is_zero() {
            return cfg("loader_timeout", "must be longer than 0 ms");
        }
        if self.cache_mode == CacheMode::HotOnly && !self.hot_key_detection {
            return cfg("cache_mode", "CacheMode::HotOnly needs hot_key_detection(true)");
        }
        if let CacheMode::Prefixes(p) = &self.cache_mode {
            if p.is_empty() || p.iter().any(|p| p.is_empty()) {
                return cfg("cache_mode", "CacheMode::Prefixes needs at least one non-empty prefix (use CacheMode::All for every key)");
            }
        }
        if self.hot_key_window < Duration::from_millis(10) {
            return cfg("hot_key_window", "must be at least 10 ms");
        }
        if !(self.hot_key_threshold.is_finite() && self.hot_key_threshold > 0.0) {
            return Err(ConsumerError::Config {
                field: "hot_key_threshold",
                reason: format!("must be a positive number of reads per second, got {}", self.hot_key_threshold),
            });
        }
        if self.hot_key_capacity == 0 {
            return cfg("hot_key_capacity", "must be at least 1 counter");
        }
        if self.hot_key_sample_every == 0 {
            return cfg("hot_key_sample_every", "must be at least 1 (1 = count every read)");
        }
        if self.stale_ttl.is_zero() {
            return cfg("stale_ttl", "must be longer than 0 ms");
        }
        if self.stale_max_entries == 0 {
            return cfg("stale_max_entries", "must be at least 1 entry");
        }
        Ok(())
    }

    /// Redis timeouts, the fill-race guard (it must outlive the longest fill) and the listener.
    fn validate_timeouts(&self) -> Result<(), ConsumerError> {
        let cfg = |field, reason: &str| Err(ConsumerError::Config { field, reason: reason.to_string() });
        if self.redis_response_timeout.is_zero() {
            return cfg("redis_response_timeout", "must be longer than 0 ms");
        }
        if self.replica_read_timeout.is_zero() {
            return cfg("replica_read_timeout", "must be longer than 0 ms");
        }
        if self.redis_connection_timeout.is_zero() {
            return cfg("redis_connection_timeout", "must be longer than 0 ms");
        }
        if self.fill_guard_entries == 0 {
            return cfg("fill_guard_entries", "must be at least 1 entry");
        }
        let longest = self.longest_fill();
        if self.fill_guard_ttl <= longest {
            return Err(ConsumerError::Config {
                field: "fill_guard_ttl",
                reason: format!(
                    "must exceed the longest fill, {} ms (redis_response_timeout x {} replica reads{})",
                    longest.as_millis(),
                    self.reads_per_fill(),
                    if self.loader.is_some() { " + loader_timeout" } else { "" }
                ),
            });
        }
        if self.metadata_refresh.is_zero() {
            return cfg("metadata_refresh", "must be longer than 0 ms");
        }
        if self.max_staleness.is_some_and(|b| b < Duration::from_millis(100)) {
            return cfg("max_staleness", "must be at least 100 ms (or None to turn the check off)");
        }
        if self.kafka_request_timeout.is_zero() {
            return cfg("kafka_request_timeout", "must be longer than 0 ms");
        }
        Ok(())
    }
}
