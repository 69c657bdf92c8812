//! Standalone Redis and a 3-master Redis Cluster.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::proc::{new_state_dir, Proc};
use crate::util::{free_cluster_port, free_port, redis_cmd, require_binary, tail, unwrap_started};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A standalone Redis on `127.0.0.1:port` (no persistence).
pub struct Redis {
    pub port: u16,
    _proc: Mutex<Proc>,
}

impl Redis {
    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// A Redis Cluster of 3 masters and no replicas on `127.0.0.1:ports[i]`,
/// ready when returned: all 16384 slots covered and `cluster_state:ok` on
/// every node. Cluster bus ports are `port + 10000`.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    _procs: Mutex<Vec<Proc>>,
}

impl RedisCluster {
    /// `redis://127.0.0.1:PORT` for each node.
    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }
}

/// A standalone Redis of the caller's own with an append-only file fsynced on every write, so
/// [`stop`](Self::stop) + [`start`](Self::start) is a restart that keeps the data (as a
/// production Redis with AOF would). Dropping kills it.
pub struct OwnedRedis {
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    proc: Option<Proc>,
}

impl OwnedRedis {
    /// Start a new one on a free port.
    pub fn start_new() -> anyhow::Result<OwnedRedis> {
        let bin = server_bin()?;
        let dir = new_state_dir("owned-redis")?;
        for _ in 0..3 {
            let port = free_port()?;
            match start_node_with(&bin, &dir, port, false, true) {
                Ok(p) => return Ok(OwnedRedis { port, bin, dir, proc: Some(p) }),
                Err(NodeError::PortClash(_)) => continue,
                Err(NodeError::Other(e)) => return Err(e),
            }
        }
        Err(anyhow!("owned redis-server did not start"))
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kill it (SIGKILL; the AOF is fsynced per write, nothing acknowledged is lost).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Start it again on the same port and directory (no-op when running).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.proc.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match start_node_with(&self.bin, &self.dir, self.port, false, true) {
                Ok(p) => {
                    self.proc = Some(p);
                    return Ok(());
                }
                Err(NodeError::PortClash(_)) if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
                Err(NodeError::PortClash(e)) | Err(NodeError::Other(e)) => return Err(e),
            }
        }
    }
}

/// The shared standalone Redis of this test process, started on first use.
pub fn redis() -> &'static Redis {
    static R: OnceLock<Result<Redis, String>> = OnceLock::new();
    unwrap_started("Redis", R.get_or_init(|| start_standalone().map_err(|e| format!("{e:#}"))))
}

/// The shared Redis Cluster of this test process, started on first use.
pub fn redis_cluster() -> &'static RedisCluster {
    static C: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    unwrap_started("Redis Cluster", C.get_or_init(|| start_cluster().map_err(|e| format!("{e:#}"))))
}

pub(crate) fn server_bin() -> anyhow::Result<PathBuf> {
    require_binary("Redis server", Some("BINVAL_REDIS_SERVER"), &["redis-server"], &[])
}

pub(crate) fn cli_bin() -> anyhow::Result<PathBuf> {
    require_binary("Redis client", Some("BINVAL_REDIS_CLI"), &["redis-cli"], &[])
}

enum NodeError {
    PortClash(anyhow::Error),
    Other(anyhow::Error),
}

fn start_node(bin: &Path, dir: &Path, port: u16, cluster: bool) -> Result<Proc, NodeError> {
    start_node_with(bin, dir, port, cluster, false)
}

fn start_node_with(bin: &Path, dir: &Path, port: u16, cluster: bool, persistent: bool) -> Result<Proc, NodeError> {
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(if persistent { ["--appendonly", "yes"] } else { ["--appendonly", "no"] })
        .args(["--appendfsync", "always"])
        .args(["--daemonize", "no"])
        .args(["--logfile", ""])
        .arg("--dir")
        .arg(dir);
    if cluster {
        cmd.args(["--cluster-enabled", "yes"]).args(["--cluster-config-file", "nodes.conf"]).args(["--cluster-node-timeout", "5000"]);
    }
    cmd.current_dir(dir);
    let log = dir.join("redis.log");
    let mut proc = Proc::spawn(cmd, &log).map_err(NodeError::Other)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(st) = proc.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let e = anyhow!("redis-server on port {port} exited during start-up ({st})\n{}", tail(&log, 20));
            return Err(if text.contains("Address already in use") { NodeError::PortClash(e) } else { NodeError::Other(e) });
        }
        if matches!(redis_cmd(port, "PING").as_deref(), Ok("PONG")) {
            return Ok(proc);
        }
        if Instant::now() > deadline {
            return Err(NodeError::Other(anyhow!(
                "redis-server did not answer PING on 127.0.0.1:{port} within {}s\n{}",
                START_TIMEOUT.as_secs(),
                tail(&log, 20)
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Start a node on a fresh free port, retrying on port clashes.
pub(crate) fn start_node_retrying(bin: &Path, kind: &str, cluster: bool, taken: &[u16]) -> anyhow::Result<(u16, Proc)> {
    let dir = new_state_dir(kind)?;
    let mut last = None;
    for _ in 0..3 {
        let port = if cluster { free_cluster_port(taken)? } else { free_port()? };
        match start_node(bin, &dir, port, cluster) {
            Ok(p) => return Ok((port, p)),
            Err(NodeError::PortClash(e)) => {
                let _ = std::fs::remove_file(dir.join("nodes.conf"));
                last = Some(e)
            }
            Err(NodeError::Other(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("redis-server did not start")))
}

fn start_standalone() -> anyhow::Result<Redis> {
    let bin = server_bin()?;
    let (port, proc) = start_node_retrying(&bin, "redis", false, &[])?;
    Ok(Redis { port, _proc: Mutex::new(proc) })
}

/// A 3-master Redis Cluster of the caller's own, with append-only files fsynced per write, so a
/// master can be stopped ([`stop_node`](Self::stop_node)) and started again
/// ([`start_node`](Self::start_node)) with its data and cluster identity — a master outage.
pub struct OwnedCluster {
    pub ports: Vec<u16>,
    bin: PathBuf,
    dirs: Vec<PathBuf>,
    procs: Vec<Option<Proc>>,
}

impl OwnedCluster {
    /// Start 3 masters and form the cluster; returns when `cluster_state:ok`.
    pub fn start_new() -> anyhow::Result<OwnedCluster> {
        let bin = server_bin()?;
        let mut ports = Vec::new();
        let mut procs = Vec::new();
        let mut dirs = Vec::new();
        for i in 0..3 {
            let mut taken = ports.clone();
            taken.extend(ports.iter().map(|p| p + 10000));
            let dir = new_state_dir(&format!("owned-cluster-{i}"))?;
            let mut started = None;
            for _ in 0..3 {
                let port = free_cluster_port(&taken)?;
                match start_node_with(&bin, &dir, port, true, true) {
                    Ok(p) => {
                        started = Some((port, p));
                        break;
                    }
                    Err(NodeError::PortClash(_)) => {
                        let _ = std::fs::remove_file(dir.join("nodes.conf"));
                    }
                    Err(NodeError::Other(e)) => return Err(e),
                }
            }
            let (port, proc) = started.ok_or_else(|| anyhow!("owned cluster node {i} did not start"))?;
            ports.push(port);
            procs.push(Some(proc));
            dirs.push(dir);
        }
        form_cluster(&ports)?;
        Ok(OwnedCluster { ports, bin, dirs, procs })
    }

    /// `redis://127.0.0.1:PORT` for each node.
    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect()
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) master `i`: its connections stay open and
    /// nothing answers — a hung master, not a refused connection. Past the cluster's
    /// `cluster-node-timeout` the other masters mark it failed (with no replica, the cluster
    /// then refuses every slot until it is back: `cluster-require-full-coverage`).
    pub fn freeze_node(&self, i: usize, frozen: bool) {
        if let Some(p) = &self.procs[i] {
            p.signal(if frozen { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Kill master `i` (SIGKILL).
    pub fn stop_node(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.kill();
        }
    }

    /// Restart master `i` with no data (SIGKILL, its append-only files removed, started again
    /// with its node id and slots): what a master without persistence, or one restored from
    /// nothing, comes back as. Returns when every node reports `cluster_state:ok` again.
    pub fn restart_empty(&mut self, i: usize) -> anyhow::Result<()> {
        self.stop_node(i);
        for name in ["appendonlydir", "appendonly.aof", "dump.rdb"] {
            let p = self.dirs[i].join(name);
            if p.is_dir() {
                std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
            } else if p.exists() {
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
        self.start_node(i)
    }

    /// Start master `i` again (same port, data and node id); returns when every node reports
    /// `cluster_state:ok` again.
    pub fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        if self.procs[i].is_none() {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match start_node_with(&self.bin, &self.dirs[i], self.ports[i], true, true) {
                    Ok(p) => {
                        self.procs[i] = Some(p);
                        break;
                    }
                    Err(NodeError::PortClash(_)) if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
                    Err(NodeError::PortClash(e)) | Err(NodeError::Other(e)) => return Err(e),
                }
            }
        }
        wait_cluster_ok(&self.ports)
    }
}

fn start_cluster() -> anyhow::Result<RedisCluster> {
    let bin = server_bin()?;
    let mut ports = Vec::new();
    let mut procs = Vec::new();
    for i in 0..3 {
        let mut taken = ports.clone();
        taken.extend(ports.iter().map(|p| p + 10000));
        let (port, proc) = start_node_retrying(&bin, &format!("redis-cluster-{i}"), true, &taken)?;
        ports.push(port);
        procs.push(proc);
    }
    form_cluster(&ports)?;
    Ok(RedisCluster { ports, _procs: Mutex::new(procs) })
}

/// `redis-cli --cluster create` over `ports` (no replicas), then wait for `cluster_state:ok`.
fn form_cluster(ports: &[u16]) -> anyhow::Result<()> {
    create_cluster(ports, 0)?;
    wait_cluster_ok(ports)
}

/// `redis-cli --cluster create --cluster-replicas N` over `ports` (redis-cli makes masters and
/// replica nodes of them); returns when the command did, not when the cluster is ready.
pub(crate) fn create_cluster(ports: &[u16], replicas_per_master: usize) -> anyhow::Result<()> {
    let cli = cli_bin()?;
    let mut cmd = Command::new(&cli);
    cmd.arg("--cluster").arg("create");
    for p in ports {
        cmd.arg(format!("127.0.0.1:{p}"));
    }
    let out = cmd
        .args(["--cluster-replicas", &replicas_per_master.to_string(), "--cluster-yes"])
        .output()
        .with_context(|| format!("running {} --cluster create", cli.display()))?;
    if !out.status.success() {
        bail!(
            "redis-cli --cluster create --cluster-replicas {replicas_per_master} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn wait_cluster_ok(ports: &[u16]) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let mut not_ready = Vec::new();
        for &p in ports {
            let info = redis_cmd(p, "CLUSTER INFO").unwrap_or_default();
            let ok = info.contains("cluster_state:ok")
                && info.contains("cluster_slots_assigned:16384")
                && info.contains("cluster_known_nodes:3");
            if !ok {
                not_ready.push((p, info));
            }
        }
        if not_ready.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("Redis Cluster {ports:?} not ready within {}s: {not_ready:?}", START_TIMEOUT.as_secs());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
