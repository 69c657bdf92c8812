//! Reads per Redis master: `binval_consumer_redis_reads_total{master, command}`, the metric
//! that shows whether suffix replicas spread a hot key's reads over the masters (the point of
//! binval, see the crate docs).
//!
//! A Cluster client routes each key to its hash slot's master but does not say which one, so
//! this keeps its own slot map: `CLUSTER SLOTS` when the consumer is built, again at most every
//! [`REFRESH`] (in the background, by the read that noticed the map is old), and the master of
//! a key is the one whose slot range holds [`binval_protocol::hash_slot`] of it. The label
//! set is bounded by the masters of the cluster (plus `unknown` for a slot no range covered
//! at the last refresh). Standalone Redis has one `master`: the URL's `host:port`.
//!
//! Cost per read (fills only, never a local hit): a CRC16 of the key, a binary search over
//! the slot ranges under a read lock, one atomic add on a pre-registered counter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use metrics::Counter;
use redis::cluster_async::ClusterConnection;

/// The metric name.
pub const REDIS_READS: &str = "binval_consumer_redis_reads_total";

/// How old the slot map may get before a read refreshes it.
pub const REFRESH: Duration = Duration::from_secs(30);

/// What a read asked for (the `command` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    /// `GET K:ver`.
    Version,
    /// `HMGET K:rN d t`.
    Replica,
}

/// The counters of one master.
pub(crate) struct MasterCounters {
    version: Counter,
    replica: Counter,
}

impl MasterCounters {
    fn new(master: &str) -> Self {
        MasterCounters {
            version: metrics::counter!(REDIS_READS, "master" => master.to_string(), "command" => "version"),
            replica: metrics::counter!(REDIS_READS, "master" => master.to_string(), "command" => "replica"),
        }
    }

    fn count(&self, read: Read) {
        match read {
            Read::Version => self.version.increment(1),
            Read::Replica => self.replica.increment(1),
        }
    }
}

/// Slot ranges `(first, last, index into masters)`, sorted by `first`.
#[derive(Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, usize)>,
    masters: Vec<MasterCounters>,
}

impl SlotMap {
    fn master_of(&self, slot: u16) -> Option<&MasterCounters> {
        let i = self.ranges.partition_point(|r| r.0 <= slot).checked_sub(1)?;
        let (first, last, m) = self.ranges[i];
        (first <= slot && slot <= last).then(|| &self.masters[m])
    }
}

/// Per-master read counters of one consumer's Redis connection.
pub(crate) enum MasterReads {
    /// Standalone: one master.
    One(MasterCounters),
    /// Cluster: the slot map and how to refresh it.
    Cluster(Arc<ClusterReads>),
}

pub(crate) struct ClusterReads {
    conn: ClusterConnection,
    map: RwLock<SlotMap>,
    unknown: MasterCounters,
    /// Unix-epoch-independent: ms since `epoch` of the last refresh start.
    refreshed_ms: AtomicU64,
    epoch: Instant,
    refreshing: AtomicBool,
}

impl MasterReads {
    /// Standalone Redis at `url`.
    pub(crate) fn standalone(url: &str) -> Self {
        MasterReads::One(MasterCounters::new(&master_label(url)))
    }

    /// A Cluster reached through `conn`; reads the slot map now.
    pub(crate) async fn cluster(conn: ClusterConnection) -> Self {
        let c = Arc::new(ClusterReads {
            conn,
            map: RwLock::new(SlotMap::default()),
            unknown: MasterCounters::new("unknown"),
            refreshed_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            refreshing: AtomicBool::new(true),
        });
        c.refresh().await;
        MasterReads::Cluster(c)
    }

    /// Count one read of `key`.
    pub(crate) fn count(&self, key: &str, read: Read) {
        match self {
            MasterReads::One(m) => m.count(read),
            MasterReads::Cluster(c) => {
                let slot = binval_protocol::hash_slot(key.as_bytes());
                {
                    let map = c.map.read().unwrap_or_else(|e| e.into_inner());
                    map.master_of(slot).unwrap_or(&c.unknown).count(read);
                }
                c.refresh_if_old();
            }
        }
    }
}

impl ClusterReads {
    fn refresh_if_old(self: &Arc<Self>) {
        let age = (self.epoch.elapsed().as_millis() as u64).saturating_sub(self.refreshed_ms.load(Relaxed));
        if age < REFRESH.as_millis() as u64 || self.refreshing.swap(true, Relaxed) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move { me.refresh().await });
    }

    /// `CLUSTER SLOTS` -> the slot map (kept as it was when the command fails).
    async fn refresh(&self) {
        self.refreshed_ms.store(self.epoch.elapsed().as_millis() as u64, Relaxed);
        let mut conn = self.conn.clone();
        let reply: Result<redis::Value, _> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await;
        if let Ok(v) = reply {
            let ranges = parse_slots(&v);
            if !ranges.is_empty() {
                let (mut names, mut masters, mut sorted) = (Vec::<String>::new(), Vec::new(), Vec::new());
                for (first, last, master) in ranges {
                    let i = match names.iter().position(|n| *n == master) {
                        Some(i) => i,
                        None => {
                            masters.push(MasterCounters::new(&master));
                            names.push(master);
                            names.len() - 1
                        }
                    };
                    sorted.push((first, last, i));
                }
                sorted.sort_unstable();
                *self.map.write().unwrap_or_else(|e| e.into_inner()) = SlotMap { ranges: sorted, masters };
            }
        }
        self.refreshing.store(false, Relaxed);
    }
}

/// `host:port` of a `redis://[user:password@]host:port[/db]` URL (never the password).
fn master_label(url: &str) -> String {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// `(first slot, last slot, "host:port" of the master)` of a `CLUSTER SLOTS` reply.
fn parse_slots(v: &redis::Value) -> Vec<(u16, u16, String)> {
    use redis::Value::{Array, BulkString, Int, SimpleString};
    let Array(ranges) = v else { return Vec::new() };
    let mut out = Vec::new();
    for r in ranges {
        let Array(items) = r else { continue };
        let (Some(Int(first)), Some(Int(last)), Some(Array(master))) = (items.first(), items.get(1), items.get(2)) else {
            continue;
        };
        let host = match master.first() {
            Some(BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(SimpleString(h)) => h.clone(),
            _ => continue,
        };
        let Some(Int(port)) = master.get(1) else { continue };
        out.push((*first as u16, *last as u16, format!("{host}:{port}")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value::{Array, BulkString, Int};

    #[test]
    fn parses_cluster_slots_and_finds_the_master() {
        let node = |h: &str, p: i64| Array(vec![BulkString(h.as_bytes().to_vec()), Int(p), BulkString(b"id".to_vec())]);
        let reply = Array(vec![
            Array(vec![Int(5461), Int(10922), node("10.0.0.2", 7002)]),
            Array(vec![Int(0), Int(5460), node("10.0.0.1", 7001), node("10.0.0.4", 7004)]),
            Array(vec![Int(10923), Int(16383), node("10.0.0.3", 7003)]),
        ]);
        let parsed = parse_slots(&reply);
        assert_eq!(parsed[1], (0, 5460, "10.0.0.1:7001".to_string()));
        let mut ranges: Vec<(u16, u16, usize)> = parsed.iter().enumerate().map(|(i, (a, b, _))| (*a, *b, i)).collect();
        ranges.sort_unstable();
        let map = SlotMap { ranges, masters: parsed.iter().map(|p| MasterCounters::new(&p.2)).collect() };
        assert!(std::ptr::eq(map.master_of(0).unwrap(), &map.masters[1]));
        assert!(std::ptr::eq(map.master_of(5461).unwrap(), &map.masters[0]));
        assert!(std::ptr::eq(map.master_of(16383).unwrap(), &map.masters[2]));
    }

    #[test]
    fn standalone_master_is_host_port() {
        assert_eq!(master_label("redis://user:pw@10.0.0.9:6380/2"), "10.0.0.9:6380");
        assert_eq!(master_label("rediss://cache:6379"), "cache:6379");
    }
}
