//! The crate-wide Redis client: one connection type for standalone Redis and Redis Cluster,
//! shared by the write stage ([`crate::write::redis_sink`]), the lease and the checkpoint store
//! ([`crate::ha`]) and `binval check`.
//!
//! It lives apart from the write stage so that HA and the commands need not import the write
//! path to talk to Redis (imports run one way: shared modules <- `binlog` <- `write`, `ha`).
//!
//! * Standalone: a reconnecting [`ConnectionManager`] (response and connection timeouts of
//!   `redis.timeout_ms`, two retries).
//! * Cluster: a slot-routed multiplexed [`ClusterConnection`]; commands are routed by their
//!   first key. `SCAN` is per node, so [`RedisConn::scan_match`] opens a plain connection to
//!   every master found with `CLUSTER SLOTS`.
//!
//! Connection failures are transient; a `redis.mode` that does not match the server is a
//! definite configuration error naming `redis.mode`.

use std::time::Duration;

use binval_protocol::fence;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncCommands, RedisError};

use crate::config::{RedisConfig, RedisMode};
use crate::error::{classify_redis, Error, TransientError};

/// A connection to standalone Redis or a Redis Cluster.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, reconnecting connection manager.
    Standalone(ConnectionManager),
    /// Cluster, slot-routed multiplexed connection.
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Connect per `cfg`. Connection failures are transient; a server of the other mode is a
    /// definite error naming `redis.mode`.
    pub async fn connect(cfg: &RedisConfig) -> Result<Self, Error> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        match cfg.mode {
            RedisMode::Standalone => {
                let client = redis::Client::open(cfg.urls[0].as_str()).map_err(|e| Error::config("redis.urls[0]", e.to_string()))?;
                let mc = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(timeout))
                    .set_connection_timeout(Some(timeout))
                    .set_number_of_retries(2);
                let mut cm = client.get_connection_manager_with_config(mc).await.map_err(transient)?;
                let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut cm).await.map_err(transient)?;
                if info.contains("cluster_enabled:1") {
                    return Err(mode_mismatch("standalone", "is a Redis Cluster node; set redis.mode = \"cluster\""));
                }
                for code in [fence::key_apply_script()] {
                    let _: String = redis::cmd("SCRIPT").arg("LOAD").arg(code).query_async(&mut cm).await.map_err(transient)?;
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

    /// Run a Lua script (EVALSHA, loading it on NOSCRIPT), routed by its first key.
    pub async fn eval<T: redis::FromRedisValue>(&mut self, code: &str, keys: &[String], args: &[String]) -> Result<T, RedisError> {
        let script = redis::Script::new(code);
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        match self {
            RedisConn::Standalone(c) => inv.invoke_async(c).await,
            RedisConn::Cluster(c) => inv.invoke_async(c).await,
        }
    }

    /// Every key matching the glob `pattern`: `SCAN MATCH` over the server, or over every
    /// master of a cluster, in no particular order. `SCAN` may return a key more than once (a
    /// rehash, a slot moving between masters): callers that need each key once sort and dedup.
    /// Errors are classified per [`classify_redis`], naming the pattern.
    pub async fn scan_match(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let mut keys: Vec<String> = Vec::new();
        match self {
            RedisConn::Standalone(c) => scan_into(&mut c.clone(), pattern, &mut keys).await?,
            RedisConn::Cluster(_) => {
                for mut node in self.cluster_masters().await? {
                    scan_into(&mut node, pattern, &mut keys).await?;
                }
            }
        }
        Ok(keys)
    }

    /// A plain connection to every Cluster master (`CLUSTER SLOTS`); empty for standalone.
    pub async fn cluster_masters(&self) -> Result<Vec<redis::aio::MultiplexedConnection>, Error> {
        let RedisConn::Cluster(c) = self else { return Ok(Vec::new()) };
        let mut c = c.clone();
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await.map_err(transient)?;
        let mut urls = Vec::new();
        if let redis::Value::Array(ranges) = slots {
            for r in ranges {
                let redis::Value::Array(items) = r else { continue };
                let Some(redis::Value::Array(master)) = items.get(2) else { continue };
                let (Some(redis::Value::BulkString(host)), Some(redis::Value::Int(port))) = (master.first(), master.get(1)) else {
                    continue;
                };
                urls.push(format!("redis://{}:{port}", String::from_utf8_lossy(host)));
            }
        }
        urls.sort();
        urls.dedup();
        let mut out = Vec::new();
        for u in urls {
            let client = redis::Client::open(u.as_str()).map_err(transient)?;
            out.push(client.get_multiplexed_async_connection().await.map_err(transient)?);
        }
        Ok(out)
    }
}

/// `SCAN MATCH pattern` over one node, appending the keys found.
async fn scan_into<C: redis::aio::ConnectionLike>(conn: &mut C, pattern: &str, keys: &mut Vec<String>) -> Result<(), Error> {
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| classify_redis(e, pattern))?;
        keys.extend(batch);
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

fn mode_mismatch(mode: &str, what: &str) -> Error {
    Error::config("redis.mode", format!("mode is {mode} but the server {what}"))
}

/// A connection-level failure: always transient.
fn transient(e: RedisError) -> Error {
    crate::telemetry::error_classified("redis", false);
    TransientError::Redis(e.to_string()).into()
}
