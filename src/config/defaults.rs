//! The defaults of optional fields (serde `default = "..."`) and the list-or-comma-separated
//! reader of environment overrides.

use serde::Deserialize;

pub(super) fn list_or_comma_separated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrText {
        List(Vec<String>),
        Text(String),
    }
    Ok(match ListOrText::deserialize(d)? {
        ListOrText::List(l) => l,
        ListOrText::Text(t) => t.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect(),
    })
}

pub(super) fn default_source_name() -> String {
    "default".into()
}

pub(super) fn default_heartbeat_ms() -> u64 {
    1000
}

pub(super) fn default_start() -> String {
    "current".into()
}

pub(super) fn default_reconnect_max_ms() -> u64 {
    30_000
}

pub(super) fn default_replication_factor() -> i32 {
    1
}

pub(super) fn default_lease_ms() -> u64 {
    1500
}

pub(super) fn default_tombstone_ttl_ms() -> u64 {
    86_400_000
}

pub(super) fn default_redis_timeout_ms() -> u64 {
    2000
}

pub(super) fn default_topic() -> String {
    "binval.invalidations".into()
}

pub(super) fn default_true() -> bool {
    true
}

pub(super) fn default_progress_interval_ms() -> u64 {
    200
}

pub(super) fn default_partitions() -> i32 {
    3
}

pub(super) fn default_interval_ms() -> u64 {
    1000
}

pub(super) fn default_heartbeat_interval_ms() -> u64 {
    500
}

pub(super) fn default_transaction_memory_mb() -> u64 {
    32
}

pub(super) fn default_max_group_rows() -> usize {
    4096
}

pub(super) fn default_linger_ms() -> u64 {
    5
}
