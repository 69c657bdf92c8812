//! Redis stage: per changed key, in commit order, write all N suffix replicas, wait for every
//! acknowledgement, then bump the version token with `INCR K:ver`.
//!
//! * Standalone: replicas and token in one `MULTI`/`EXEC` per key change, so a reader sees all
//!   of it or none of it.
//! * Cluster: replicas live in different hash slots, usually on different masters, and Redis
//!   has no atomicity across slots (the redis crate refuses cross-slot pipelines). So binval
//!   sends each replica write to its own slot's master concurrently (the multiplexed cluster
//!   connection batches the commands per node), waits until every one is acknowledged, and only
//!   then sends `INCR K:ver`. Order and idempotence carry correctness instead of atomicity: a
//!   reader reads the token first, so it can pair a newer value with an older version (which
//!   the next invalidation evicts) but never an older value with a newer version.
//!
//! Changes of different keys within one transaction are applied concurrently; changes of the
//! same key strictly in order. Errors are classified transient (connection, timeout, cluster
//! re-sharding) or definite (e.g. `WRONGTYPE`).

use std::collections::HashMap;
use std::time::Duration;

use binval_protocol::{replica_key, version_key};
use futures::stream::{self, StreamExt, TryStreamExt};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, RedisError};

use crate::config::{RedisConfig, RedisMode};
use crate::error::{DefiniteError, Error, TransientError};
use crate::mapping::KeyChange;

/// How many keys of one transaction are written concurrently.
const KEY_CONCURRENCY: usize = 64;

/// A connection to standalone Redis or a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, reconnecting connection manager.
    Standalone(ConnectionManager),
    /// Cluster, slot-routed multiplexed connection.
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Connect per `cfg`. Connection failures are transient.
    pub async fn connect(cfg: &RedisConfig) -> Result<Self, Error> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        match cfg.mode {
            RedisMode::Standalone => {
                let client = redis::Client::open(cfg.urls[0].as_str()).map_err(|e| {
                    DefiniteError::Config(crate::config::ConfigError::Invalid {
                        path: String::new(),
                        field: "redis.urls[0]".into(),
                        reason: e.to_string(),
                    })
                })?;
                let mc = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2);
                let mut cm = client.get_connection_manager_with_config(mc).await.map_err(transient)?;
                let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut cm).await.map_err(transient)?;
                if info.contains("cluster_enabled:1") {
                    return Err(mode_mismatch("standalone", "is a Redis Cluster node; set redis.mode = \"cluster\""));
                }
                Ok(RedisConn::Standalone(cm))
            }
            RedisMode::Cluster => {
                let client = redis::cluster::ClusterClientBuilder::new(cfg.urls.clone())
                    .response_timeout(timeout)
                    .connection_timeout(timeout)
                    .build()
                    .map_err(transient)?;
                match client.get_async_connection().await {
                    Ok(c) => Ok(RedisConn::Cluster(c)),
                    Err(e) if e.to_string().contains("cluster support disabled") => {
                        Err(mode_mismatch("cluster", "is a standalone server (cluster support disabled); set redis.mode = \"standalone\""))
                    }
                    Err(e) => Err(transient(e)),
                }
            }
        }
    }

    /// Run one command, routed by its key in cluster mode.
    pub async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T, RedisError> {
        match self {
            RedisConn::Standalone(c) => cmd.query_async(c).await,
            RedisConn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// GET a string key.
    pub async fn get(&mut self, key: &str) -> Result<Option<String>, RedisError> {
        match self {
            RedisConn::Standalone(c) => c.get(key).await,
            RedisConn::Cluster(c) => c.get(key).await,
        }
    }

    /// SET a string key.
    pub async fn set(&mut self, key: &str, value: &str) -> Result<(), RedisError> {
        match self {
            RedisConn::Standalone(c) => c.set(key, value).await,
            RedisConn::Cluster(c) => c.set(key, value).await,
        }
    }

    /// Apply one key change: replicas first, then the token. Returns the new version (what
    /// `INCR` returned).
    pub async fn apply(&self, ch: &KeyChange) -> Result<u64, Error> {
        let vkey = version_key(&ch.key);
        match self {
            RedisConn::Standalone(c) => {
                let mut c = c.clone();
                let mut p = redis::pipe();
                p.atomic();
                for i in 0..ch.replicas {
                    replica_cmd(&mut p, &replica_key(&ch.key, i), ch);
                }
                p.incr(&vkey, 1u64);
                let (v,): (u64,) = p.query_async(&mut c).await.map_err(|e| classify(e, &ch.key))?;
                Ok(v)
            }
            RedisConn::Cluster(c) => {
                let writes = (0..ch.replicas).map(|i| {
                    let mut c = c.clone();
                    let rk = replica_key(&ch.key, i);
                    async move {
                        let mut p = redis::pipe();
                        replica_cmd(&mut p, &rk, ch);
                        p.query_async::<()>(&mut c).await.map_err(|e| classify(e, &rk))
                    }
                });
                futures::future::try_join_all(writes).await?;
                let mut c = c.clone();
                let v: u64 = c.incr(&vkey, 1u64).await.map_err(|e| classify(e, &vkey))?;
                Ok(v)
            }
        }
    }

    async fn apply_group(&self, changes: &[KeyChange], idx: Vec<usize>) -> Result<Vec<(usize, u64)>, Error> {
        let mut out = Vec::with_capacity(idx.len());
        for i in idx {
            out.push((i, self.apply(&changes[i]).await?));
        }
        Ok(out)
    }

    /// Apply the key changes of one transaction; returns the version of each change, index for
    /// index. Same-key changes are applied in order, different keys concurrently.
    pub async fn apply_all(&self, changes: &[KeyChange]) -> Result<Vec<u64>, Error> {
        let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for (i, c) in changes.iter().enumerate() {
            by_key
                .entry(c.key.as_str())
                .or_insert_with(|| {
                    order.push(c.key.as_str());
                    Vec::new()
                })
                .push(i);
        }
        let groups: Vec<Vec<usize>> = order.into_iter().map(|k| by_key.remove(k).unwrap_or_default()).collect();
        let mut versions = vec![0u64; changes.len()];
        let results: Vec<Vec<(usize, u64)>> = stream::iter(groups)
            .map(|idx| self.apply_group(changes, idx))
            .buffer_unordered(KEY_CONCURRENCY)
            .try_collect()
            .await?;
        for (i, v) in results.into_iter().flatten() {
            versions[i] = v;
        }
        Ok(versions)
    }
}

fn replica_cmd(p: &mut redis::Pipeline, rk: &str, ch: &KeyChange) {
    match &ch.payload {
        Some(v) if ch.ttl_secs > 0 => {
            p.set_ex(rk, v, ch.ttl_secs).ignore();
        }
        Some(v) => {
            p.set(rk, v).ignore();
        }
        None => {
            p.del(rk).ignore();
        }
    }
}

fn mode_mismatch(mode: &str, what: &str) -> Error {
    DefiniteError::Config(crate::config::ConfigError::Invalid {
        path: String::new(),
        field: "redis.mode".into(),
        reason: format!("mode is {mode} but the server {what}"),
    })
    .into()
}

fn transient(e: RedisError) -> Error {
    TransientError::Redis(e.to_string()).into()
}

/// Transient: I/O, timeouts, dropped connections, cluster moves/down/try-again, LOADING, BUSY.
/// Definite: everything the server refuses for the data itself (WRONGTYPE, ...).
fn classify(e: RedisError, key: &str) -> Error {
    use redis::ErrorKind::*;
    let retry = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(e.kind(), Server(_)) && {
            let s = e.to_string();
            ["LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM"].iter().any(|c| s.contains(c))
        };
    let _ = (Io, Client);
    if retry {
        TransientError::Redis(format!("key {key}: {e}")).into()
    } else {
        DefiniteError::RedisRefused { key: key.into(), message: e.to_string() }.into()
    }
}
