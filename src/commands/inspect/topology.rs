//! Where keys live: the hash slot of a key and the Redis node that serves it, with that
//! master's replicas (Redis Cluster: `CLUSTER SLOTS`, whose entries are `[start, end, master,
//! replica...]`, each node `[host, port, id, ...]`; standalone: the one server).

use redis::Value;

use crate::error::{classify_redis, Error};
use crate::redis::{NodeAddr, RedisConn, SlotRange};

/// The node serving a hash slot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotOwner {
    /// `host:port` of the master (standalone: the server).
    pub master: String,
    /// `host:port` of the master's replicas (Redis replication, not binval's suffix replicas).
    pub replicas: Vec<String>,
}

/// The slot ranges of a cluster, or the standalone server.
#[derive(Debug, Clone)]
pub enum Topology {
    /// One server.
    Standalone(String),
    /// The ranges of `CLUSTER SLOTS`.
    Cluster(Vec<SlotRange>),
}

impl Topology {
    /// Read it: `CLUSTER SLOTS` on a cluster; `standalone_addr` (`host:port`) otherwise.
    pub async fn read(redis: &RedisConn, standalone_addr: &str) -> Result<Self, Error> {
        match redis {
            RedisConn::Standalone(_) => Ok(Topology::Standalone(standalone_addr.to_string())),
            RedisConn::Cluster(c, _) => {
                let reply: Value =
                    redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c.clone()).await.map_err(|e| classify_redis(e, "CLUSTER SLOTS"))?;
                Ok(Topology::Cluster(binval_protocol::topology::parse_cluster_slots(&reply)))
            }
        }
    }

    /// The owner of `slot` (`None`: a slot no master serves).
    pub fn owner(&self, slot: u16) -> Option<SlotOwner> {
        match self {
            Topology::Standalone(a) => Some(SlotOwner { master: a.clone(), replicas: Vec::new() }),
            Topology::Cluster(ranges) => ranges
                .iter()
                .find(|r| r.contains(slot))
                .map(|r| SlotOwner { master: r.master.to_string(), replicas: r.replicas.iter().map(NodeAddr::to_string).collect() }),
        }
    }
}

/// `host:port` of a Redis URL ([`NodeAddr::from_url`]); a URL that has none (a Unix socket)
/// is shown as it is, without its password.
pub fn host_port(url: &str) -> String {
    NodeAddr::from_url(url).map_or_else(|_| binval_security::redact_url(url), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(host.as_bytes().to_vec()), Value::Int(port), Value::BulkString(b"id".to_vec())])
    }

    #[test]
    fn cluster_slots_with_replicas() {
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("10.0.0.1", 7000), node("10.0.0.4", 7003)]),
            Value::Array(vec![Value::Int(5461), Value::Int(16383), node("10.0.0.2", 7001)]),
        ]);
        let t = Topology::Cluster(binval_protocol::topology::parse_cluster_slots(&reply));
        assert_eq!(t.owner(5460), Some(SlotOwner { master: "10.0.0.1:7000".into(), replicas: vec!["10.0.0.4:7003".into()] }));
        assert_eq!(t.owner(16383).unwrap().master, "10.0.0.2:7001");
        assert_eq!(Topology::Cluster(Vec::new()).owner(1), None);
    }

    #[test]
    fn addresses_leave_credentials_out() {
        assert_eq!(host_port("redis://127.0.0.1:6379"), "127.0.0.1:6379");
        assert_eq!(host_port("rediss://user:se@cret@h:6380/2?x=1"), "h:6380");
        assert_eq!(host_port("redis://h"), "h:6379");
        assert_eq!(host_port("redis+unix://u:pw@/tmp/r.sock"), "redis+unix://u:***@/tmp/r.sock");
    }
}
