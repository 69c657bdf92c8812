//! A Redis Cluster whose masters have replica nodes: for tests of reads served by replica
//! nodes (`READONLY`), which the 3-master cluster of [`crate::redis_cluster`] cannot show.
//!
//! Kept apart from `redis.rs` (it only borrows that file's node start-up) so cluster variants
//! can be added without touching the shared cluster.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::proc::Proc;
use crate::redis::{cli_bin, create_cluster, server_bin, start_node_retrying};
use crate::util::redis_cmd;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A Redis Cluster of the caller's own: 3 masters with `replicas_per_master` replica nodes
/// each, on `127.0.0.1`, no persistence. Ready when returned: every slot covered,
/// `cluster_state:ok` on every node, every replica node's link to its master up. Dropping it
/// kills every node.
pub struct ReplicatedCluster {
    /// Ports of the masters.
    pub masters: Vec<u16>,
    /// Ports of the replica nodes.
    pub replicas: Vec<u16>,
    _procs: Vec<Proc>,
}

impl ReplicatedCluster {
    /// Start `3 * (1 + replicas_per_master)` nodes and form the cluster with
    /// `redis-cli --cluster create --cluster-replicas N`.
    pub fn start_new(replicas_per_master: usize) -> anyhow::Result<ReplicatedCluster> {
        let bin = server_bin()?;
        let total = 3 * (1 + replicas_per_master);
        let (mut ports, mut procs) = (Vec::new(), Vec::new());
        for i in 0..total {
            let mut taken = ports.clone();
            taken.extend(ports.iter().map(|p| p + 10000));
            let (port, proc) = start_node_retrying(&bin, &format!("redis-replicated-{i}"), true, &taken)?;
            ports.push(port);
            procs.push(proc);
        }
        create_cluster(&ports, replicas_per_master)?;
        let (masters, replicas) = wait_ready(&ports, replicas_per_master)?;
        wait_replicas_announced(&cli_bin()?, &ports, &masters, &replicas)?;
        Ok(ReplicatedCluster { masters, replicas, _procs: procs })
    }

    /// `redis://127.0.0.1:PORT` of each master (the seed nodes for a client).
    pub fn urls(&self) -> Vec<String> {
        self.masters.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// `redis://127.0.0.1:PORT` of each replica node.
    pub fn replica_urls(&self) -> Vec<String> {
        self.replicas.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }
}

/// Wait until every node reports `cluster_state:ok` with all nodes known and every replica
/// node's master link is up; returns the ports of the masters and of the replica nodes.
fn wait_ready(ports: &[u16], replicas_per_master: usize) -> anyhow::Result<(Vec<u16>, Vec<u16>)> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let known = format!("cluster_known_nodes:{}", ports.len());
    loop {
        let mut masters = Vec::new();
        let mut replicas = Vec::new();
        let mut not_ready = Vec::new();
        for &p in ports {
            let cluster = redis_cmd(p, "CLUSTER INFO").unwrap_or_default();
            let repl = redis_cmd(p, "INFO replication").unwrap_or_default();
            let ok = cluster.contains("cluster_state:ok") && cluster.contains("cluster_slots_assigned:16384") && cluster.contains(&known);
            if repl.contains("role:master") {
                masters.push(p);
                if !ok || !repl.contains(&format!("connected_slaves:{replicas_per_master}")) {
                    not_ready.push(p);
                }
            } else if repl.contains("role:slave") {
                replicas.push(p);
                if !ok || !repl.contains("master_link_status:up") {
                    not_ready.push(p);
                }
            } else {
                not_ready.push(p);
            }
        }
        if not_ready.is_empty() && masters.len() == 3 {
            return Ok((masters, replicas));
        }
        if Instant::now() > deadline {
            return Err(anyhow!(
                "replicated Redis Cluster {ports:?} not ready within {}s: nodes {not_ready:?} (masters {masters:?}, replicas {replicas:?})",
                READY_TIMEOUT.as_secs()
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until every node's `CLUSTER SLOTS` lists every replica node. Redis leaves a replica
/// out of `CLUSTER SLOTS` while the replication offset the cluster bus last announced for it is
/// 0 (`isReplicaAvailable` in Redis 7's cluster.c), which on a fresh cluster lasts until its
/// master has written something: `FLUSHALL` on each master (a write, replicated, of an empty
/// cluster) moves the offsets, and the bus announces them within a few pings.
fn wait_replicas_announced(cli: &std::path::Path, ports: &[u16], masters: &[u16], replicas: &[u16]) -> anyhow::Result<()> {
    for &m in masters {
        redis_cmd(m, "FLUSHALL").with_context(|| format!("FLUSHALL on master {m}"))?;
    }
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut missing = Vec::new();
        for &p in ports {
            let out = std::process::Command::new(cli)
                .args(["-h", "127.0.0.1", "-p", &p.to_string(), "CLUSTER", "SLOTS"])
                .output()
                .with_context(|| format!("{} CLUSTER SLOTS", cli.display()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let listed: Vec<&str> = text.lines().map(str::trim).collect();
            for r in replicas {
                if !listed.contains(&r.to_string().as_str()) {
                    missing.push((p, *r));
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("replica nodes not in CLUSTER SLOTS within {}s: (node, replica) {missing:?}", READY_TIMEOUT.as_secs());
        }
        thread::sleep(Duration::from_millis(100));
    }
}
