//! `[redis]`: the standalone server or Cluster binval writes replicas and version tokens to.

use std::path::PathBuf;

use binval_security::{Secret, TlsSettings};
use serde::Deserialize;

use super::defaults::*;

/// Redis deployment kind.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One Redis server: each key's replicas and version token are written by one Lua script (`key_apply_script`), atomically.
    Standalone,
    /// Redis Cluster: replicas on different masters, written and acknowledged before the token.
    Cluster,
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `standalone` or `cluster`.
    pub mode: RedisMode,
    /// `redis://host:port` URLs: one for standalone, one or more seed nodes for a cluster. In an
    /// environment override, comma-separated.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub urls: Vec<String>,
    /// Per-command response timeout, ms. Default 2000.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
    /// How long a delete's tombstone stays in the replicas, ms (it refuses late, older writes
    /// of the key; after it expires the replica is simply missing). Default 86400000 (24 h).
    #[serde(default = "default_tombstone_ttl_ms")]
    pub tombstone_ttl_ms: u64,
    /// ACL user (Redis 6+ `AUTH username password`); unset = the `default` user.
    #[serde(default)]
    pub username: Option<String>,
    /// The user's password, instead of writing it into the URLs. Best from the environment:
    /// `BINVAL__REDIS__PASSWORD`. Never printed.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding that password, read at every connect.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `[redis.tls]`: TLS settings for `rediss://` URLs (`crate::security::redis`).
    #[serde(default)]
    pub tls: TlsSettings,
}
