//! The Redis side of a fill: one small enum over a standalone connection and a Cluster
//! connection, with bounded timeouts and no read retries. Replicas are read in the fenced
//! record format of [`binval_protocol::fence`] (a hash: `d` payload, `t` tombstone, `p` the
//! fence position of the write, `n` the key's replica count), one `HMGET K:rN d t p n` per
//! read. [`RedisConn::query`] sends the few other commands (the hot set, heat reports).
//!
//! Where a read goes: [`RedisConn::placement`] groups a key's replicas by master with the slot
//! map the Cluster client routes by (`slot_map.rs`); the fill picks the replica
//! (`read.rs`); [`RedisConn::replica`] sends the read to the replica's master — or, with reads
//! from replica nodes switched on, to the master or one of its replica nodes, chosen uniformly
//! — and counts it per master (`masters.rs`).

use std::sync::Arc;
use std::time::Duration;

use binval_protocol::adaptive::FIELD_COUNT;
use binval_protocol::fence::{FIELD_DATA, FIELD_POSITION, FIELD_TOMBSTONE};
use binval_protocol::placement::Placement;
use binval_protocol::{hash_slot, ReplicaRecord};
use binval_security::redis_tls::{self, RedisAuth};
use binval_security::{redact_url, redact_urls, TlsSettings};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use crate::error::ConsumerError;
use crate::masters::{master_label, MasterCounters, Read};
use crate::slot_map::{ClusterMap, SlotMap, TopologyTap};

/// Where the suffix replicas live. `Debug` hides URL passwords.
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
pub(crate) enum RedisConn {
    /// Reconnects by itself after a connection loss; commands are not retried.
    Standalone { conn: ConnectionManager, counters: Arc<MasterCounters> },
    /// Routes each key to its slot's master; follows at most one MOVED/ASK redirect.
    Cluster { conn: ClusterConnection, map: Arc<ClusterMap>, unknown: Arc<MasterCounters> },
}

/// Where one key's replicas are: their grouping by master, and the slot map it came from
/// (Cluster) so the reads go where the grouping said.
pub(crate) struct KeyPlacement {
    pub placement: Placement,
    map: Option<Arc<SlotMap>>,
}

type Reply = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

/// What one replica read found: the record, and the key's replica count if the record carries
/// one (field `n`; `None` when absent, or when it is not a count: a warning then names it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplicaRead {
    pub record: ReplicaRecord,
    pub count: Option<u32>,
}

impl RedisConn {
    /// Connect. `replica_nodes`: reads may go to the replica nodes of a Cluster's masters.
    /// A TLS or authentication failure is [`ConsumerError::Config`] naming the setting
    /// (`redis_tls`, `redis_user`), other failures [`ConsumerError::Redis`] or
    /// [`ConsumerError::Timeout`]. URLs in errors have their password hidden.
    pub(crate) async fn connect(
        target: &RedisTarget,
        security: &Security<'_>,
        response_timeout: Duration,
        connection_timeout: Duration,
        replica_nodes: bool,
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
                    Ok(Ok(conn)) => Ok(RedisConn::Standalone { conn, counters: Arc::new(MasterCounters::new(&master_label(url))) }),
                    Ok(Err(e)) => Err(failed(op, e)),
                    Err(_) => Err(ConsumerError::Timeout { op, after_ms: ms(bound) }),
                }
            }
            RedisTarget::Cluster(urls) => {
                let op = format!("connect to cluster {}", redact_urls(urls));
                let map = ClusterMap::new(replica_nodes);
                let client = redis_tls::cluster_builder(urls, security.tls, security.auth, "redis_tls", "redis_cluster")
                    .map_err(|f| ConsumerError::Config { field: "redis_cluster", reason: f.to_string() })?
                    .response_timeout(response_timeout)
                    .connection_timeout(connection_timeout)
                    // One "retry" is what lets the client follow a single MOVED/ASK redirect
                    // after a resharding or failover; the overall timeout (= response timeout)
                    // still bounds the whole read.
                    .retries(1)
                    // The client's slot map becomes the consumer's (see `slot_map.rs`).
                    .read_routing_strategy(TopologyTap(map.clone()))
                    .build()
                    .map_err(|e| ConsumerError::Config { field: "redis_cluster", reason: format!("{}: {e}", redact_urls(urls)) })?;
                let bound = connection_timeout * 3;
                match tokio::time::timeout(bound, client.get_async_connection()).await {
                    Ok(Ok(conn)) => {
                        map.attach(conn.clone()).await;
                        Ok(RedisConn::Cluster { conn, map, unknown: Arc::new(MasterCounters::new("unknown")) })
                    }
                    Ok(Err(e)) => Err(failed(op, e)),
                    Err(_) => Err(ConsumerError::Timeout { op, after_ms: ms(bound) }),
                }
            }
        }
    }

    /// `key`'s replicas `0..n` grouped by the master of their hash slot in the current slot map
    /// (a slot no range covers groups as its own "unknown" master). Standalone: one group.
    pub(crate) fn placement(&self, key: &str, n: u32) -> KeyPlacement {
        match self {
            RedisConn::Standalone { .. } => KeyPlacement { placement: Placement::single(n), map: None },
            RedisConn::Cluster { map, .. } => {
                map.refresh_if_old();
                let current = map.current();
                let placement = Placement::of(key, n, |slot| current.shard_of(slot).unwrap_or(usize::MAX));
                KeyPlacement { placement, map: Some(current) }
            }
        }
    }

    /// `HMGET rkey d t p n` of suffix replica `rkey` (placed per `at`), interpreted as a
    /// [`ReplicaRecord`] and the key's replica count, bounded by `timeout`. A key that is not a
    /// hash (e.g. a replica written in the old plain-string format) is a
    /// [`ConsumerError::Redis`] (`WRONGTYPE`), and a `p` that is not a number a
    /// [`ConsumerError::Decode`]; never silently a miss. An `n` that is not a count is only a
    /// warning (the read answers, without count information).
    pub(crate) async fn replica(&self, rkey: &str, at: &KeyPlacement, timeout: Duration) -> Result<ReplicaRead, ConsumerError> {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(rkey).arg(FIELD_DATA).arg(FIELD_TOMBSTONE).arg(FIELD_POSITION).arg(FIELD_COUNT);
        let op = || format!("HMGET `{rkey}` d t p n");
        let after_ms = timeout.as_millis() as u64;
        let fut = async {
            match self {
                RedisConn::Standalone { conn, counters } => {
                    counters.count(Read::Replica);
                    cmd.query_async::<Reply>(&mut conn.clone()).await
                }
                RedisConn::Cluster { conn, map, unknown } => {
                    let slot_map = at.map.as_deref();
                    let shard = slot_map.and_then(|m| m.shard_of(hash_slot(rkey.as_bytes())).and_then(|s| m.shard(s)));
                    let node = shard.and_then(|s| {
                        // Uniform over the master and its replica nodes: 0 is the master.
                        let nodes = map.readable_nodes(s);
                        rand::random_range(0..=nodes.len()).checked_sub(1).map(|i| nodes[i])
                    });
                    let counters = shard.map_or(&**unknown, |s| &s.counters);
                    match node {
                        None => {
                            counters.count(Read::Replica);
                            cmd.query_async::<Reply>(&mut conn.clone()).await
                        }
                        Some(n) => {
                            counters.count(Read::ReplicaNode);
                            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host: n.host.clone(), port: n.port });
                            match conn.clone().route_command(cmd.clone(), route).await {
                                Ok(v) => redis::from_redis_value::<Reply>(v).map_err(redis::RedisError::from),
                                Err(e) => Err(e),
                            }
                        }
                    }
                }
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok((d, t, p, n))) => {
                let record = ReplicaRecord::from_fields(d, t, p).map_err(|reason| ConsumerError::Decode {
                    key: rkey.to_string(),
                    what: "replica",
                    reason: reason.to_string(),
                })?;
                Ok(ReplicaRead { record, count: crate::counts::record_count(rkey, n.as_deref()) })
            }
            Ok(Err(e)) => Err(ConsumerError::redis(op(), e, after_ms)),
            Err(_) => Err(ConsumerError::Timeout { op: op(), after_ms }),
        }
    }

    /// Send `cmd` (a single-key command: on a Cluster it goes to the master of its first key's
    /// slot) and convert the reply, bounded by `timeout`. `op` names it in errors, e.g.
    /// ``HGETALL `binval:hot` ``. Not counted as a replica read.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd, op: &str, timeout: Duration) -> Result<T, ConsumerError> {
        let after_ms = timeout.as_millis() as u64;
        let fut = async {
            match self {
                RedisConn::Standalone { conn, .. } => cmd.query_async::<T>(&mut conn.clone()).await,
                RedisConn::Cluster { conn, .. } => cmd.query_async::<T>(&mut conn.clone()).await,
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ConsumerError::redis(op, e, after_ms)),
            Err(_) => Err(ConsumerError::Timeout { op: op.to_string(), after_ms }),
        }
    }
}
