//! [`Config::load`] and [`Config::validate`]: reading a file with its environment overrides,
//! then checking every field before anything connects.

use std::path::Path;

use binval_protocol::KeyTemplate;

use super::*;

impl Config {
    /// Load `path` (TOML or YAML by extension) with `BINVAL__*` environment overrides, then
    /// validate. Errors name the file and the field.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let p = path.display().to_string();
        if !path.exists() {
            return Err(ConfigError::Load { path: p, message: "file not found".into() });
        }
        let cfg = config::Config::builder()
            .add_source(config::File::from(path))
            .add_source(
                // No type guessing: `BINVAL__SOURCE__NAME=007` stays the string "007"; numeric
                // fields still parse from their text. Lists are comma-separated.
                config::Environment::with_prefix("BINVAL").prefix_separator("__").separator("__"),
            )
            .build()
            .map_err(|e| {
                let text = std::fs::read_to_string(path).ok();
                ConfigError::Load { path: p.clone(), message: parse_message(text.as_deref(), e.to_string()) }
            })?;
        let c: Config = cfg.try_deserialize().map_err(|e| ConfigError::Load { path: p.clone(), message: explain(&e.to_string()) })?;
        c.validate(&p)?;
        Ok(c)
    }

    /// Parse from TOML text (tests, embedded configs), then validate.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .map_err(|e| ConfigError::Load { path: "<inline>".into(), message: parse_message(Some(text), e.to_string()) })?;
        let c: Config =
            cfg.try_deserialize().map_err(|e| ConfigError::Load { path: "<inline>".into(), message: explain(&e.to_string()) })?;
        c.validate("<inline>")?;
        Ok(c)
    }

    /// Check values that types alone cannot.
    pub fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |field: String, reason: String| ConfigError::Invalid { path: path.into(), field, reason };
        if !self.source.url.starts_with("mysql://") {
            return Err(bad("source.url".into(), format!("`{}` must start with mysql://", redact(&self.source.url))));
        }
        if let Some(reason) = crate::security::mysql::url_tls_param(&self.source.url) {
            return Err(bad("source.url".into(), reason));
        }
        if self.source.server_id == 0 {
            return Err(bad("source.server_id".into(), "must be a non-zero server_id unique in the topology".into()));
        }
        if self.source.heartbeat_ms == 0 || self.source.heartbeat_ms > 4_294_967 {
            return Err(bad("source.heartbeat_ms".into(), "must be 1..=4294967 ms".into()));
        }
        StartPoint::parse(&self.source.start, StartForms::SOURCE_START).map_err(|r| bad("source.start".into(), r.to_string()))?;
        if self.source.name.is_empty() || !self.source.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(bad("source.name".into(), "must be non-empty and use only [A-Za-z0-9._-]".into()));
        }
        if !(100..=3_600_000).contains(&self.source.reconnect_max_ms) {
            return Err(bad("source.reconnect_max_ms".into(), "must be 100..=3600000 ms".into()));
        }
        if !(300..=600_000).contains(&self.source.lease_ms) {
            return Err(bad("source.lease_ms".into(), "must be 300..=600000 ms".into()));
        }
        if let Some(t) = &self.source.heartbeat_table {
            if !is_schema_table(t) {
                return Err(bad("source.heartbeat_table".into(), format!("`{t}` must be `schema.table` (letters, digits, _ and $)")));
            }
            if self.mappings.iter().any(|m| m.table == *t) {
                return Err(bad("source.heartbeat_table".into(), format!("`{t}` is also a mapped table; use a table of its own")));
            }
        }
        if !(10..=60_000).contains(&self.source.heartbeat_interval_ms) {
            return Err(bad("source.heartbeat_interval_ms".into(), "must be 10..=60000 ms".into()));
        }
        if !(1..=65_536).contains(&self.source.transaction_memory_mb) {
            return Err(bad("source.transaction_memory_mb".into(), "must be 1..=65536 MiB".into()));
        }
        if let Some(d) = &self.source.spill_dir {
            if !d.is_dir() {
                return Err(bad("source.spill_dir".into(), format!("`{}` is not a folder", d.display())));
            }
        }
        if !(1..=1_000_000).contains(&self.apply.max_group_rows) {
            return Err(bad("apply.max_group_rows".into(), "must be 1..=1000000 rows".into()));
        }
        if self.apply.linger_ms > 100 {
            return Err(bad("apply.linger_ms".into(), "must be 0..=100 ms".into()));
        }
        if self.redis.tombstone_ttl_ms == 0 {
            return Err(bad("redis.tombstone_ttl_ms".into(), "must be > 0 (a tombstone without TTL would never leave Redis)".into()));
        }
        if self.redis.tombstone_ttl_ms > MAX_TTL_MS {
            return Err(bad("redis.tombstone_ttl_ms".into(), format!("must be at most {MAX_TTL_MS} ms (100 years)")));
        }
        if !(1..=600_000).contains(&self.redis.timeout_ms) {
            return Err(bad("redis.timeout_ms".into(), "must be 1..=600000 ms".into()));
        }
        if self.redis.urls.is_empty() {
            return Err(bad("redis.urls".into(), "needs at least one redis:// URL".into()));
        }
        for (i, u) in self.redis.urls.iter().enumerate() {
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(bad(format!("redis.urls[{i}]"), format!("`{}` must start with redis:// or rediss://", redact(u))));
            }
        }
        if self.redis.mode == RedisMode::Standalone && self.redis.urls.len() != 1 {
            return Err(bad("redis.urls".into(), "standalone mode takes exactly one URL (use mode = \"cluster\" for several)".into()));
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(bad("kafka.brokers".into(), "must list at least one host:port".into()));
        }
        if self.kafka.topic.is_empty()
            || self.kafka.topic.len() > 249
            || !self.kafka.topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            // Kafka topic names: [a-zA-Z0-9._-], at most 249 characters (Kafka docs, topic naming).
            return Err(bad(
                "kafka.topic".into(),
                format!("`{}` is not a legal Kafka topic name ([a-zA-Z0-9._-], 1..249 chars)", self.kafka.topic),
            ));
        }
        if !(1..=i16::MAX as i32).contains(&self.kafka.replication_factor) {
            // Kafka's CreateTopics request carries it as an INT16.
            return Err(bad("kafka.replication_factor".into(), "must be 1..=32767".into()));
        }
        if self.kafka.partitions < 1 {
            return Err(bad("kafka.partitions".into(), "must be >= 1".into()));
        }
        if self.kafka.event_format == EventFormat::Batched {
            crate::kafka::Partitioner::from_property(self.kafka.properties.get("partitioner").map(String::as_str))
                .map_err(|e| bad("kafka.event_format".into(), e.to_string()))?;
        }
        if self.kafka.progress_interval_ms > 60_000 {
            return Err(bad("kafka.progress_interval_ms".into(), "must be 0 (off) or at most 60000 ms".into()));
        }
        if self.checkpoint.store == CheckpointStore::File && self.checkpoint.path.is_none() {
            return Err(bad("checkpoint.path".into(), "required when checkpoint.store = \"file\"".into()));
        }
        if self.checkpoint.interval_ms == 0 {
            return Err(bad("checkpoint.interval_ms".into(), "must be > 0".into()));
        }
        if !(1..=crate::ha::checkpoint::MAX_COPIES).contains(&self.checkpoint.copies) {
            return Err(bad("checkpoint.copies".into(), format!("must be 1..={}", crate::ha::checkpoint::MAX_COPIES)));
        }
        if self.metrics.ready_max_lag_ms == 0 {
            return Err(bad("metrics.ready_max_lag_ms".into(), "must be > 0".into()));
        }
        if let Some(l) = &self.metrics.listen {
            if l.parse::<std::net::SocketAddr>().is_err() {
                return Err(bad("metrics.listen".into(), format!("`{l}` is not an ip:port socket address")));
            }
        }
        self.validate_security().map_err(|e| bad(e.field, e.reason))?;
        self.adaptive.validate().map_err(|(field, reason)| bad(format!("adaptive.{field}"), reason))?;
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.mappings.iter().enumerate() {
            let f = |name: &str| format!("mappings[{i}].{name}");
            match m.table.split_once('.') {
                Some((s, t)) if !s.is_empty() && !t.is_empty() && !t.contains('.') => {}
                _ => return Err(bad(f("table"), format!("`{}` must be `schema.table`", m.table))),
            }
            if !seen.insert(m.table.clone()) {
                return Err(bad(f("table"), format!("`{}` is mapped twice; list all its keys in one mapping", m.table)));
            }
            if m.keys.is_empty() {
                return Err(bad(f("keys"), "needs at least one key template".into()));
            }
            let r = m.replicas;
            if r.min == 0 || r.max > binval_protocol::adaptive::MAX_REPLICAS {
                return Err(bad(f("replicas"), format!("{r} is out of range 1..={}", binval_protocol::adaptive::MAX_REPLICAS)));
            }
            if r.min > r.max {
                return Err(bad(f("replicas"), format!("min = {} is above max = {}", r.min, r.max)));
            }
            if m.ttl_secs > MAX_TTL_MS / 1000 {
                return Err(bad(f("ttl_secs"), format!("{} is out of range 0..={} s (100 years)", m.ttl_secs, MAX_TTL_MS / 1000)));
            }
            if m.allow_non_unique_keys && m.mode != MappingMode::Invalidate {
                return Err(bad(
                    f("allow_non_unique_keys"),
                    "needs mode = \"invalidate\": in write-through mode two rows rendering one key would overwrite each other's payload, and a delete of one would tombstone the key while the other exists".into(),
                ));
            }
            for (k, key) in m.keys.iter().enumerate() {
                let t = KeyTemplate::parse(key).map_err(|e| bad(format!("mappings[{i}].keys[{k}]"), e.to_string()))?;
                t.check_replicas(m.replicas.max).map_err(|e| bad(format!("mappings[{i}].keys[{k}]"), e.to_string()))?;
            }
            match &m.payload {
                Payload::Whole(w) if w != "row" => return Err(bad(f("payload"), format!("`{w}`: use \"row\" or a list of column names"))),
                Payload::Columns(c) if c.is_empty() => return Err(bad(f("payload"), "column list is empty".into())),
                _ => {}
            }
        }
        Ok(())
    }
}

impl Config {
    /// The security settings (`binval_security::checks`; files are read when binval connects).
    fn validate_security(&self) -> Result<(), binval_security::FieldError> {
        let (s, r, k) = (&self.source, &self.redis, &self.kafka);
        binval_security::checks::source(&s.url, s.password.as_ref(), s.password_file.as_deref(), &s.tls)?;
        binval_security::checks::redis(&r.urls, r.username.as_deref(), r.password.as_ref(), r.password_file.as_deref(), &r.tls)?;
        binval_security::checks::kafka(&k.tls, k.sasl.as_ref(), k.properties.keys().map(String::as_str))
    }
}

/// `schema.table` with plain identifiers (the heartbeat table is written in SQL by binval, so
/// its name must need no quoting).
pub(super) fn is_schema_table(t: &str) -> bool {
    let ok = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    matches!(t.split_once('.'), Some((s, n)) if ok(s) && ok(n))
}
