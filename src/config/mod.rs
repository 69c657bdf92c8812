//! Configuration: one file (TOML or YAML, by extension) plus environment overrides
//! `BINVAL__<SECTION>__<FIELD>` (e.g. `BINVAL__SOURCE__SERVER_ID=4001`), loaded with the
//! `config` crate and checked before anything connects. Every error names the field
//! (`mappings[1].keys[0]`) and says what is wrong. JSON Schema: `schemas/config.schema.json`;
//! examples: `config/`.

use serde::Deserialize;

pub use crate::start_point::{StartForms, StartPoint};

mod checkpoint;
mod defaults;
mod errors;
mod kafka;
mod load;
mod mappings;
mod redis;
mod source;

pub use checkpoint::*;
use defaults::*;
pub use errors::*;
pub use kafka::*;
pub use mappings::*;
pub use redis::*;
pub use source::*;

/// The whole configuration of one `binval run`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The MySQL/MariaDB primary to read the binlog of.
    pub source: SourceConfig,
    /// Where the suffix replicas and version tokens go.
    pub redis: RedisConfig,
    /// Where invalidation events go.
    pub kafka: KafkaConfig,
    /// Where the resume position is kept.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Table -> logical key rules. Tables without a rule are skipped before their rows are decoded.
    #[serde(default)]
    pub mappings: Vec<MappingConfig>,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// Prometheus metrics endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// How transactions are grouped when they are applied.
    #[serde(default)]
    pub apply: ApplyConfig,
    /// How adaptive replica counts (`replicas = { min, max }`) follow the fleet's reads.
    #[serde(default)]
    pub adaptive: crate::replicas::AdaptiveConfig,
}

/// `[apply]`: group apply. The apply stage takes every committed transaction already read
/// (up to `max_group_rows` rows) as one group, keeps one change per key (the newest), writes
/// all of the group's keys with one pipeline per Redis master per step, publishes one event
/// per key and moves the checkpoint once the whole group is acknowledged. At low load a group
/// is one transaction.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyConfig {
    /// Decoded rows per group (a larger transaction is applied alone, in chunks of this many
    /// rows). Default 4096.
    #[serde(default = "default_max_group_rows")]
    pub max_group_rows: usize,
    /// Milliseconds a group may wait for more transactions before its Redis writes are sent,
    /// while transactions arrive at least twice per this long (`crate::write::apply::Linger`):
    /// fewer, larger groups at ordinary rates, for up to this much latency; nothing waits at
    /// low rates. 0: never wait. Default 5, at most 100.
    #[serde(default = "default_linger_ms")]
    pub linger_ms: u64,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        ApplyConfig { max_group_rows: default_max_group_rows(), linger_ms: default_linger_ms() }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve Prometheus metrics (`GET /metrics`) and the health probes
    /// (`/healthz`, `/readyz`) on; unset = no endpoint.
    #[serde(default)]
    pub listen: Option<String>,
    /// `/readyz` answers 503 for a leader more than this many ms behind the source
    /// (`binval_lag_seconds`). Default 30000.
    #[serde(default = "default_ready_max_lag_ms")]
    pub ready_max_lag_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: None, ready_max_lag_ms: default_ready_max_lag_ms() }
    }
}

fn default_ready_max_lag_ms() -> u64 {
    30_000
}

/// `[log]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: Option<String>,
    /// tracing-subscriber filter, default `info`. `RUST_LOG` wins when set.
    #[serde(default)]
    pub level: Option<String>,
}

/// The longest TTL a config may give (replicas, tombstones), ms: 100 years, far inside what
/// Redis takes (`PX` is a signed 64-bit count) and what binval computes in ms.
pub const MAX_TTL_MS: u64 = 100 * 365 * 86_400_000;

/// Hide the password of a `scheme://user:password@host` URL for logs and errors
/// ([`binval_security::redact_url`]).
pub fn redact(url: &str) -> String {
    binval_security::redact_url(url)
}

#[cfg(test)]
mod tests;
