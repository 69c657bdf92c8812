//! The Redis side of a fill: one small enum over a standalone connection and a Cluster
//! connection, with bounded timeouts and no read retries. Replicas are read in the fenced
//! record format of [`binval_protocol::fence`] (a hash: `d` payload, `t` tombstone).

use std::time::Duration;

use binval_protocol::fence::{FIELD_DATA, FIELD_TOMBSTONE};
use binval_protocol::ReplicaRecord;
use binval_security::redis_tls::{self, RedisAuth};
use binval_security::{redact_url, redact_urls, TlsSettings};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use crate::error::ConsumerError;
use crate::masters::{MasterReads, Read};

/// Where the suffix replicas and version tokens live. `Debug` hides URL passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server, e.g. `redis://127.0.0.1:6379` (`rediss://` for TLS).
    Standalone(String),
    /// A Redis Cluster, given by one or more seed node URLs.
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// The URL(s).
    pub fn urls(&self) -> &[String] {
        match self {
            RedisTarget::Standalone(u) => std::slice::from_ref(u),
            RedisTarget::Cluster(u) => u,
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(u) => f.debug_tuple("Standalone").field(&redact_url(u)).finish(),
            RedisTarget::Cluster(u) => f.debug_tuple("Cluster").field(&u.iter().map(|u| redact_url(u)).collect::<Vec<_>>()).finish(),
        }
    }
}

/// The TLS settings and the ACL user of the Redis connections.
pub(crate) struct Security<'a> {
    pub tls: &'a TlsSettings,
    pub auth: &'a RedisAuth,
}

/// A connection to either kind of Redis, with its per-master read counters. Cheap to clone
/// (shared, multiplexed).
#[derive(Clone)]
pub(crate) struct RedisConn {
    conn: Conn,
    reads: std::sync::Arc<MasterReads>,
}

#[derive(Clone)]
enum Conn {
    /// Reconnects by itself after a connection loss; commands are not retried.
    Standalone(ConnectionManager),
    /// Routes each key to its slot's master; follows at most one MOVED/ASK redirect.
    Cluster(ClusterConnection),
}

impl RedisConn {
    /// Connect; a TLS or authentication failure is [`ConsumerError::Config`] naming the
    /// setting (`redis_tls`, `redis_user`), other failures [`ConsumerError::Redis`] or
    /// [`ConsumerError::Timeout`]. URLs in errors have their password hidden.
    pub(crate) async fn connect(
        target: &RedisTarget,
        security: &Security<'_>,
        response_timeout: Duration,
        connection_timeout: Duration,
    ) -> Result<Self, ConsumerError> {
        let ms = |d: Duration| d.as_millis() as u64;
        let failed = |op: String, e: redis::RedisError| match redis_tls::explain_failure(&e, "redis_tls", "redis_user") {
            Some(f) => ConsumerError::Config {
                field: if f.field == "redis_user" { "redis_user" } else { "redis_tls" },
                reason: format!("{op}: {f}"),
            },
            None => ConsumerError::redis(op, e, ms(connection_timeout)),
        };
        match target {
            RedisTarget::Standalone(url) => {
                let op = format!("connect to {}", redact_url(url));
                let client = redis_tls::standalone_client(url, security.tls, security.auth, "redis_tls", "redis_standalone")
                    .map_err(|f| ConsumerError::Config { field: "redis_standalone", reason: f.to_string() })?;
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(response_timeout))
                    .set_connection_timeout(Some(connection_timeout))
                    // Reconnect attempts of the manager itself (not command retries).
                    .set_number_of_retries(1);
                let bound = connection_timeout * 3;
                match tokio::time::timeout(bound, ConnectionManager::new_with_config(client, config)).await {
                    Ok(Ok(m)) => Ok(RedisConn { conn: Conn::Standalone(m), reads: std::sync::Arc::new(MasterReads::standalone(url)) }),
                    Ok(Err(e)) => Err(failed(op, e)),
                    Err(_) => Err(ConsumerError::Timeout { op, after_ms: ms(bound) }),
                }
            }
            RedisTarget::Cluster(urls) => {
                let op = format!("connect to cluster {}", redact_urls(urls));
                let client = redis_tls::cluster_builder(urls, security.tls, security.auth, "redis_tls", "redis_cluster")
                    .map_err(|f| ConsumerError::Config { field: "redis_cluster", reason: f.to_string() })?
                    .response_timeout(response_timeout)
                    .connection_timeout(connection_timeout)
                    // One "retry" is what lets the client follow a single MOVED/ASK redirect
                    // after a resharding or failover; the overall timeout (= response timeout)
                    // still bounds the whole read.
                    .retries(1)
                    .build()
                    .map_err(|e| ConsumerError::Config { field: "redis_cluster", reason: format!("{}: {e}", redact_urls(urls)) })?;
                let bound = connection_timeout * 3;
                match tokio::time::timeout(bound, client.get_async_connection()).await {
                    Ok(Ok(c)) => {
                        let reads = MasterReads::cluster(c.clone()).await;
                        Ok(RedisConn { conn: Conn::Cluster(c), reads: std::sync::Arc::new(reads) })
                    }
                    Ok(Err(e)) => Err(failed(op, e)),
                    Err(_) => Err(ConsumerError::Timeout { op, after_ms: ms(bound) }),
                }
            }
        }
    }

    /// `GET key`, bounded by `timeout` (in addition to the client's own response timeout).
    pub(crate) async fn get(&self, key: &str, timeout: Duration) -> Result<Option<Vec<u8>>, ConsumerError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        self.reads.count(key, Read::Version);
        let fut = async {
            match &self.conn {
                Conn::Standalone(c) => cmd.query_async::<Option<Vec<u8>>>(&mut c.clone()).await,
                Conn::Cluster(c) => cmd.query_async::<Option<Vec<u8>>>(&mut c.clone()).await,
            }
        };
        let after_ms = timeout.as_millis() as u64;
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ConsumerError::redis(format!("GET `{key}`"), e, after_ms)),
            Err(_) => Err(ConsumerError::Timeout { op: format!("GET `{key}`"), after_ms }),
        }
    }

    /// `HMGET key d t` of a suffix replica record, interpreted as a [`ReplicaRecord`], bounded
    /// by `timeout`. A key that is not a hash (e.g. a replica written in the old plain-string
    /// format) is a [`ConsumerError::Redis`] (`WRONGTYPE`), never silently a miss.
    pub(crate) async fn replica(&self, key: &str, timeout: Duration) -> Result<ReplicaRecord, ConsumerError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(key).arg(FIELD_DATA).arg(FIELD_TOMBSTONE);
        type Reply = (Option<Vec<u8>>, Option<Vec<u8>>);
        self.reads.count(key, Read::Replica);
        let fut = async {
            match &self.conn {
                Conn::Standalone(c) => cmd.query_async::<Reply>(&mut c.clone()).await,
                Conn::Cluster(c) => cmd.query_async::<Reply>(&mut c.clone()).await,
            }
        };
        let after_ms = timeout.as_millis() as u64;
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok((d, t))) => Ok(ReplicaRecord::from_fields(d, t)),
            Ok(Err(e)) => Err(ConsumerError::redis(format!("HMGET `{key}` d t"), e, after_ms)),
            Err(_) => Err(ConsumerError::Timeout { op: format!("HMGET `{key}` d t"), after_ms }),
        }
    }
}
