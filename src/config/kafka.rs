//! `[kafka]`: the brokers and topic invalidation events are published to.

use std::collections::BTreeMap;

use binval_security::TlsSettings;
use serde::Deserialize;

use super::defaults::*;

/// `[kafka]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port]` bootstrap servers.
    pub brokers: String,
    /// Topic of invalidation events. Default `binval.invalidations`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Create the topic at start if it does not exist. Default true.
    #[serde(default = "default_true")]
    pub create_topic: bool,
    /// Partitions of a topic binval creates. Default 3.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor of a topic binval creates. Default 1 (a single test broker); set 3
    /// (or your cluster's usual) in production, or create the topic yourself.
    #[serde(default = "default_replication_factor")]
    pub replication_factor: i32,
    /// Extra librdkafka producer settings, e.g. `"linger.ms" = "5"`. binval always sets
    /// `enable.idempotence=true` and `acks=all`. A property that `[kafka.tls]` or
    /// `[kafka.sasl]` also sets is refused, naming both.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// `[kafka.tls]`: SSL to the brokers (`crate::security::kafka`).
    #[serde(default)]
    pub tls: TlsSettings,
    /// `[kafka.sasl]`: SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    #[serde(default)]
    pub sasl: Option<binval_security::SaslSettings>,
    /// Every this many ms the leader sends one progress message
    /// (`schemas/progress-message.schema.json`) to every partition of the topic: how far its
    /// Redis writes and enqueued events are behind the source, so app instances can tell a
    /// quiet source from a stalled writer ([`crate::write::progress`]). Default 200; 0 = off.
    /// Consumers older than the progress message count each one as a bad message: upgrade them
    /// first, or keep this 0 until then.
    #[serde(default = "default_progress_interval_ms")]
    pub progress_interval_ms: u64,
    /// How invalidation events are published ([`EventFormat`]): `per_key` (default: one JSON
    /// message per key change) or `batched` (one binary message per partition per apply
    /// group, `binval_protocol::batch`). Consumers older than the batched format skip its
    /// messages (as bad messages) and so miss invalidations: upgrade every app first, then
    /// switch (docs/design.md, "Batched events").
    #[serde(default)]
    pub event_format: EventFormat,
}

/// `kafka.event_format`: the format of the invalidation events binval publishes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EventFormat {
    /// One JSON message per key change (`schemas/invalidation-event.schema.json`), keyed by
    /// the logical key. Readable by every consumer version and by consumers in other languages.
    #[default]
    PerKey,
    /// One binary message per partition per apply group (`schemas/invalidation-batch.md`,
    /// header `binval.kind: batch`), produced to the partition the producer's partitioner
    /// gives each of its keys, compressed (`compression.type` lz4 unless set). Needs
    /// binval-consumer with batch support in every app.
    Batched,
}

impl EventFormat {
    /// The config value (`per_key`, `batched`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventFormat::PerKey => "per_key",
            EventFormat::Batched => "batched",
        }
    }
}
