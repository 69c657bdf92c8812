//! The consumer's map of a Redis Cluster: which master (and which replica nodes) serve each
//! hash slot. It decides where a fill's reads go ([`binval_protocol::placement`]: a key's
//! replicas grouped by master, a master chosen uniformly) and labels the per-master read
//! counters (`masters.rs`).
//!
//! # Why it is the routing truth
//!
//! The replica a fill reads is chosen by master, so the consumer must group replicas by the
//! masters its Cluster client actually sends them to. It therefore takes the map *from the
//! client*: [`TopologyTap`] is installed as the client's read routing strategy (redis-rs
//! `ReadRoutingStrategy`), and redis-rs hands it every slot map it builds — at connect, and
//! again after each refresh it makes when a node answers `MOVED` (a slot moved: resharding,
//! failover) or a connection fails. `ASK` (a slot being migrated) is followed by the client
//! for the one command and changes no map, as the Redis Cluster specification says. Besides,
//! the consumer reads `CLUSTER SLOTS` itself when it is built and at most every [`REFRESH`]
//! (in the background, started by a read that finds the map old), so a topology change that
//! no read has run into yet (replica nodes added, a failover of an idle master) is seen too.
//! Each new map replaces the whole previous one and bumps [`ClusterMap::generation`].
//!
//! Installing a routing strategy makes redis-rs send `READONLY` on every node connection; a
//! master ignores it, and the strategy routes every read to the master unless reads from
//! replica nodes are switched on ([`crate::ConsumerBuilder::read_from_replica_nodes`]).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::NodeAddress;
use redis::cluster_async::ClusterConnection;
use redis::cluster_read_routing::{ClusterTopology, ReadCandidates, ReadRoutingStrategy, ReadRoutingStrategyFactory};

use binval_protocol::topology::{parse_cluster_slots, NodeAddr, SlotRange};

use crate::masters::MasterCounters;

/// How old the map may get before a read refreshes it with `CLUSTER SLOTS`.
pub const REFRESH: Duration = Duration::from_secs(30);

/// One master and the replica nodes that copy it.
pub(crate) struct Shard {
    /// `host:port` of the master (the `master` label of the read counters).
    pub label: String,
    /// Replica nodes of the master, as the cluster announces them.
    pub nodes: Vec<Node>,
    pub counters: MasterCounters,
}

/// A replica node.
pub(crate) type Node = NodeAddr;

/// Slot ranges `(first, last, shard index)`, sorted by `first`, and the shards.
#[derive(Default)]
pub(crate) struct SlotMap {
    ranges: Vec<(u16, u16, usize)>,
    shards: Vec<Shard>,
}

impl SlotMap {
    /// Build from the ranges of `CLUSTER SLOTS` or of the client's topology.
    fn from_ranges(ranges: Vec<SlotRange>) -> SlotMap {
        let mut map = SlotMap::default();
        for SlotRange { first, last, master, replicas: nodes } in ranges {
            let master = master.to_string();
            let i = match map.shards.iter().position(|s| s.label == master) {
                Some(i) => i,
                None => {
                    map.shards.push(Shard { counters: MasterCounters::new(&master), label: master, nodes });
                    map.shards.len() - 1
                }
            };
            map.ranges.push((first, last, i));
        }
        map.ranges.sort_unstable();
        map
    }

    /// From redis-rs's topology (the map its routing uses).
    fn from_topology(t: &ClusterTopology) -> SlotMap {
        let mut ranges = Vec::new();
        for shard in t.shards() {
            let master = node(shard.primary());
            let nodes: Vec<Node> = shard.replicas().iter().map(node).collect();
            for &(first, last) in shard.slot_ranges() {
                ranges.push(SlotRange { first, last, master: master.clone(), replicas: nodes.clone() });
            }
        }
        SlotMap::from_ranges(ranges)
    }

    /// The index of the shard serving `slot`, `None` if no range covers it.
    pub(crate) fn shard_of(&self, slot: u16) -> Option<usize> {
        let i = self.ranges.partition_point(|r| r.0 <= slot).checked_sub(1)?;
        let (first, last, s) = self.ranges[i];
        (first <= slot && slot <= last).then_some(s)
    }

    pub(crate) fn shard(&self, i: usize) -> Option<&Shard> {
        self.shards.get(i)
    }

    /// Number of masters.
    #[cfg(test)]
    pub(crate) fn masters(&self) -> usize {
        self.shards.len()
    }
}

/// redis-rs's node address as the protocol crate spells it.
fn node(n: &NodeAddress) -> NodeAddr {
    NodeAddr::new(n.host(), n.port())
}

/// The slot map of one consumer's Cluster connection, kept current (see the module docs).
pub(crate) struct ClusterMap {
    map: RwLock<Arc<SlotMap>>,
    generation: AtomicU64,
    /// The connection `CLUSTER SLOTS` is read through; set once the client is connected (the
    /// map exists before, to be handed to the client's routing strategy).
    conn: OnceLock<ClusterConnection>,
    /// ms since `epoch` of the last refresh start.
    refreshed_ms: AtomicU64,
    epoch: Instant,
    refreshing: AtomicBool,
    /// Route reads of the HMGET kind to any node of the slot's shard (replica nodes included).
    replica_nodes: bool,
    /// Replica nodes in the client's own topology: the only ones a read is sent to by address
    /// (the client holds a connection to exactly those; one that only `CLUSTER SLOTS` announced
    /// yet would make the client rebuild all its connections).
    client_nodes: RwLock<HashSet<Node>>,
}

impl ClusterMap {
    pub(crate) fn new(replica_nodes: bool) -> Arc<ClusterMap> {
        Arc::new(ClusterMap {
            map: RwLock::new(Arc::new(SlotMap::default())),
            generation: AtomicU64::new(0),
            conn: OnceLock::new(),
            refreshed_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            refreshing: AtomicBool::new(false),
            replica_nodes,
            client_nodes: RwLock::new(HashSet::new()),
        })
    }

    /// The current map.
    pub(crate) fn current(&self) -> Arc<SlotMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Bumped on every map replacement.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// The replica nodes of `shard` a read may be sent to: none unless reads from replica
    /// nodes are on, and only those the client is connected to.
    pub(crate) fn readable_nodes<'a>(&self, shard: &'a Shard) -> Vec<&'a Node> {
        if !self.replica_nodes || shard.nodes.is_empty() {
            return Vec::new();
        }
        let known = self.client_nodes.read().unwrap_or_else(|e| e.into_inner());
        shard.nodes.iter().filter(|n| known.contains(*n)).collect()
    }

    fn replace(&self, fresh: SlotMap) {
        if fresh.ranges.is_empty() {
            return;
        }
        *self.map.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        self.generation.fetch_add(1, Relaxed);
    }

    /// Connected: keep `conn` for `CLUSTER SLOTS`, and read it now.
    pub(crate) async fn attach(&self, conn: ClusterConnection) {
        let _ = self.conn.set(conn);
        self.refreshing.store(true, Relaxed);
        self.refresh().await;
    }

    /// Start a background `CLUSTER SLOTS` refresh if the last one is older than [`REFRESH`].
    pub(crate) fn refresh_if_old(self: &Arc<Self>) {
        let age = (self.epoch.elapsed().as_millis() as u64).saturating_sub(self.refreshed_ms.load(Relaxed));
        if age < REFRESH.as_millis() as u64 || self.refreshing.swap(true, Relaxed) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move { me.refresh().await });
    }

    /// `CLUSTER SLOTS` -> the map (kept as it was when the command fails).
    async fn refresh(&self) {
        self.refreshed_ms.store(self.epoch.elapsed().as_millis() as u64, Relaxed);
        if let Some(conn) = self.conn.get() {
            let reply: Result<redis::Value, _> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn.clone()).await;
            if let Ok(v) = reply {
                self.replace(SlotMap::from_ranges(parse_cluster_slots(&v)));
            }
        }
        self.refreshing.store(false, Relaxed);
    }
}

/// The read routing strategy installed on the consumer's Cluster client: it receives every
/// slot map redis-rs builds (the routing truth, see the module docs) and routes reads to the
/// master; reads to replica nodes are chosen by the consumer itself and sent by address.
pub(crate) struct TopologyTap(pub Arc<ClusterMap>);

impl ReadRoutingStrategyFactory for TopologyTap {
    fn create_strategy(&self) -> Box<dyn ReadRoutingStrategy> {
        Box::new(TopologyTap(self.0.clone()))
    }
}

impl ReadRoutingStrategy for TopologyTap {
    fn on_topology_changed(&self, topology: ClusterTopology) {
        let map = SlotMap::from_topology(&topology);
        if !map.ranges.is_empty() {
            let nodes: HashSet<Node> = map.shards.iter().flat_map(|s| s.nodes.iter().cloned()).collect();
            *self.0.client_nodes.write().unwrap_or_else(|e| e.into_inner()) = nodes;
        }
        self.0.replace(map);
    }

    fn route_read<'a>(&self, candidates: &ReadCandidates<'a>) -> &'a NodeAddress {
        match candidates {
            ReadCandidates::AnyNode(c) => c.primary(),
            // Never asked for by the consumer (it sends no replica-required reads).
            ReadCandidates::ReplicasOnly(c) => c.replicas().first(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_read_routing::Shard as RShard;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn parses_cluster_slots_with_replica_nodes() {
        let node = |h: &str, p: i64| Array(vec![BulkString(h.as_bytes().to_vec()), Int(p), BulkString(b"id".to_vec())]);
        let reply = Array(vec![
            Array(vec![Int(5461), Int(10922), node("10.0.0.2", 7002)]),
            Array(vec![Int(0), Int(5460), node("10.0.0.1", 7001), node("10.0.0.4", 7004)]),
            Array(vec![Int(10923), Int(16383), node("10.0.0.3", 7003)]),
        ]);
        let map = SlotMap::from_ranges(parse_cluster_slots(&reply));
        assert_eq!(map.masters(), 3);
        let s0 = map.shard(map.shard_of(0).unwrap()).unwrap();
        assert_eq!((s0.label.as_str(), s0.nodes.as_slice()), ("10.0.0.1:7001", &[NodeAddr::new("10.0.0.4", 7004)][..]));
        assert_eq!(map.shard(map.shard_of(5461).unwrap()).unwrap().label, "10.0.0.2:7002");
        assert_eq!(map.shard(map.shard_of(16383).unwrap()).unwrap().label, "10.0.0.3:7003");
        let partial = SlotMap::from_ranges(vec![SlotRange { first: 0, last: 99, master: NodeAddr::new("a", 1), replicas: vec![] }]);
        assert_eq!(partial.shard_of(100), None);
    }

    /// The map redis-rs hands to the strategy replaces the consumer's; an empty one (a failed
    /// refresh) leaves it as it was.
    #[test]
    fn the_clients_topology_is_the_map() {
        let cm = ClusterMap::new(false);
        let tap = TopologyTap(cm.clone());
        let a = NodeAddress::new("10.0.0.1", 7001);
        let b = NodeAddress::new("10.0.0.2", 7002);
        let b2 = NodeAddress::new("10.0.0.5", 7005);
        let topology = ClusterTopology::from_shards(vec![
            RShard::new(vec![(0, 8191)], a.clone(), Vec::new()),
            RShard::new(vec![(8192, 16383)], b.clone(), vec![b2.clone()]),
        ]);
        tap.on_topology_changed(topology);
        assert_eq!(cm.generation(), 1);
        let map = cm.current();
        assert_eq!(map.shard(map.shard_of(9000).unwrap()).unwrap().label, "10.0.0.2:7002");
        assert_eq!(map.shard(map.shard_of(9000).unwrap()).unwrap().nodes, vec![NodeAddr::new("10.0.0.5", 7005)]);
        // Reads from replica nodes are off: none is readable.
        let shard = map.shard(map.shard_of(9000).unwrap()).unwrap();
        assert!(cm.readable_nodes(shard).is_empty());
        let on = ClusterMap::new(true);
        TopologyTap(on.clone()).on_topology_changed(ClusterTopology::from_shards(vec![RShard::new(
            vec![(0, 16383)],
            NodeAddress::new("10.0.0.2", 7002),
            vec![NodeAddress::new("10.0.0.5", 7005)],
        )]));
        let announced_later = Shard {
            label: "10.0.0.2:7002".into(),
            nodes: vec![NodeAddr::new("10.0.0.5", 7005), NodeAddr::new("10.0.0.6", 7006)],
            counters: MasterCounters::new("10.0.0.2:7002"),
        };
        assert_eq!(on.readable_nodes(&announced_later), vec![&NodeAddr::new("10.0.0.5", 7005)], "only nodes the client knows");
        // An empty topology (a failed refresh) keeps the map.
        tap.on_topology_changed(ClusterTopology::from_shards(Vec::new()));
        assert_eq!((cm.generation(), cm.current().masters()), (1, 2));
    }
}
