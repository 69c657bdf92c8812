//! binval's Redis clients with `[redis.tls]` and the ACL user `redis.username` /
//! `redis.password(_file)` applied (the mechanics are `binval_security::redis_tls`, shared
//! with the consumer), and connection failures that name the setting.
//!
//! Every client binval opens goes through here: the standalone connection manager, the Cluster
//! client and the per-master connections `SCAN` uses ([`crate::redis::RedisConn`]).

use binval_security::redis_tls::{self, RedisAuth};
use redis::cluster::ClusterClientBuilder;
use redis::RedisError;

use crate::config::RedisConfig;
use crate::error::{Error, TransientError};

/// The credentials, with the password read (from the file when one is set).
pub fn auth(cfg: &RedisConfig) -> Result<RedisAuth, Error> {
    Ok(RedisAuth {
        username: cfg.username.clone(),
        password: super::password(cfg.password.as_ref(), cfg.password_file.as_deref(), "redis")?,
    })
}

/// A client for `url` (a configured URL, or a Cluster master's `host:port` made into one
/// with the configured scheme), named `field` in errors.
pub fn client(cfg: &RedisConfig, url: &str, field: &str) -> Result<redis::Client, Error> {
    redis_tls::standalone_client(url, &cfg.tls, &auth(cfg)?, "redis.tls", field).map_err(|f| Error::config(f.field, f.reason))
}

/// A client for a Cluster master at `host:port` (from `CLUSTER SLOTS`), with the scheme of the
/// configured URLs.
pub fn node_client(cfg: &RedisConfig, host_port: &str) -> Result<redis::Client, Error> {
    let scheme = if cfg.urls.iter().any(|u| u.starts_with("rediss://")) { "rediss" } else { "redis" };
    client(cfg, &format!("{scheme}://{host_port}"), "redis.urls")
}

/// The Cluster client builder of the configured seed URLs.
pub fn cluster_builder(cfg: &RedisConfig) -> Result<ClusterClientBuilder, Error> {
    redis_tls::cluster_builder(&cfg.urls, &cfg.tls, &auth(cfg)?, "redis.tls", "redis.urls").map_err(|f| Error::config(f.field, f.reason))
}

/// A failure while connecting (or running the first commands): definite, naming the setting,
/// when it is TLS or authentication (`binval_security::redis_tls::explain_failure`); else
/// transient (the server may come back).
pub fn connect_error(e: RedisError, cfg: &RedisConfig) -> Error {
    let auth_field = if cfg.username.is_some() { "redis.username" } else { "redis.password" };
    match redis_tls::explain_failure(&e, "redis.tls", auth_field) {
        Some(f) => {
            crate::telemetry::error_classified("redis", true);
            Error::config(f.field, f.reason)
        }
        None => {
            crate::telemetry::error_classified("redis", false);
            TransientError::Redis(e.to_string()).into()
        }
    }
}
