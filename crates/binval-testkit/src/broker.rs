//! tansu, a Kafka-compatible broker, with in-memory storage.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::proc::{new_state_dir, Proc};
use crate::util::{connect, free_port, require_binary, tail, unwrap_started};

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variables tansu reads as defaults for its flags; removed so a
/// developer's shell cannot redirect the test broker.
pub(crate) const TANSU_ENV: &[&str] =
    &["CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT"];

/// The shared broker on `127.0.0.1:port` (in-memory storage).
pub struct Broker {
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    _proc: Mutex<Proc>,
}

impl Broker {
    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Create a topic with `tansu topic create` (tansu does not auto-create
    /// topics on produce the way Kafka's default config does).
    pub fn create_topic(&self, name: &str, partitions: u32) -> anyhow::Result<()> {
        create_topic(&self.bin, &self.dir, self.port, name, partitions)
    }
}

/// The shared broker of this test process, started on first use.
pub fn broker() -> &'static Broker {
    static B: OnceLock<Result<Broker, String>> = OnceLock::new();
    unwrap_started(
        "the tansu broker",
        B.get_or_init(|| {
            (|| {
                let bin = tansu_bin()?;
                let dir = new_state_dir("broker")?;
                let (port, proc) = start_retrying(&bin, &dir, None)?;
                Ok::<_, anyhow::Error>(Broker { port, bin, dir, _proc: Mutex::new(proc) })
            })()
            .map_err(|e| format!("{e:#}"))
        }),
    )
}

/// A broker of the caller's own, for fault tests: [`stop`](Self::stop)
/// kills it, [`start`](Self::start) restarts it on the same port. Storage is
/// in memory, so topics and messages are gone after a restart (re-create
/// topics with [`create_topic`](Self::create_topic)). Dropping kills it.
pub struct OwnedBroker {
    pub port: u16,
    bin: PathBuf,
    dir: PathBuf,
    proc: Option<Proc>,
}

impl OwnedBroker {
    /// Start a new broker on a free port.
    pub fn start_new() -> anyhow::Result<OwnedBroker> {
        let bin = tansu_bin()?;
        let dir = new_state_dir("owned-broker")?;
        let (port, proc) = start_retrying(&bin, &dir, None)?;
        Ok(OwnedBroker { port, bin, dir, proc: Some(proc) })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn is_running(&mut self) -> bool {
        match self.proc.as_mut() {
            Some(p) => p.try_wait().is_none(),
            None => false,
        }
    }

    /// Freeze (`SIGSTOP`) or thaw (`SIGCONT`) the broker: connections stay open, nothing
    /// answers — a hung broker or a network black hole, not a refused connection.
    pub fn freeze(&self, frozen: bool) {
        if let Some(p) = &self.proc {
            p.signal(if frozen { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Kill the broker (SIGKILL) and wait until it is gone. No-op if stopped.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Start it again on the same port (no-op if it is running).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        self.proc = None;
        // The port may linger for a moment after the kill; retry briefly.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match start_tansu(&self.bin, &self.dir, self.port) {
                Ok(p) => {
                    self.proc = Some(p);
                    return Ok(());
                }
                Err(StartError::PortClash(e)) if Instant::now() < deadline => {
                    let _ = e;
                    thread::sleep(Duration::from_millis(200));
                }
                Err(StartError::PortClash(e)) | Err(StartError::Other(e)) => return Err(e),
            }
        }
    }

    /// See [`Broker::create_topic`].
    pub fn create_topic(&self, name: &str, partitions: u32) -> anyhow::Result<()> {
        create_topic(&self.bin, &self.dir, self.port, name, partitions)
    }
}

pub(crate) fn tansu_bin() -> anyhow::Result<PathBuf> {
    let mut extra = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        extra.push(PathBuf::from(home).join(".cargo/bin/tansu"));
    }
    extra.push(PathBuf::from("/root/.cargo/bin/tansu"));
    require_binary("Kafka-compatible broker (tansu)", Some("BINVAL_TANSU"), &["tansu"], &extra)
}

enum StartError {
    PortClash(anyhow::Error),
    Other(anyhow::Error),
}

fn start_retrying(bin: &Path, dir: &Path, port: Option<u16>) -> anyhow::Result<(u16, Proc)> {
    let mut last = None;
    for _ in 0..3 {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        match start_tansu(bin, dir, port) {
            Ok(p) => return Ok((port, p)),
            Err(StartError::PortClash(e)) => last = Some(e),
            Err(StartError::Other(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("tansu did not start")))
}

fn start_tansu(bin: &Path, dir: &Path, port: u16) -> Result<Proc, StartError> {
    // tansu reads `.env` from its working directory: give it an empty one.
    let cwd = dir.join("cwd");
    std::fs::create_dir_all(&cwd).map_err(|e| StartError::Other(e.into()))?;
    let url = format!("tcp://127.0.0.1:{port}");
    let mut cmd = Command::new(bin);
    cmd.arg("broker")
        .args(["--listener-url", &url])
        .args(["--advertised-listener-url", &url])
        .args(["--storage-engine", "memory://tansu/"])
        .current_dir(&cwd);
    for v in TANSU_ENV {
        cmd.env_remove(v);
    }
    cmd.env("RUST_LOG", std::env::var("BINVAL_TANSU_LOG").unwrap_or_else(|_| "warn".to_string()));
    let log = dir.join("tansu.log");
    let mut proc = Proc::spawn(cmd, &log).map_err(StartError::Other)?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(st) = proc.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let e = anyhow!("tansu on port {port} exited during start-up ({st})\n{}", tail(&log, 20));
            return Err(if text.contains("Address already in use") || text.contains("AddrInUse") {
                StartError::PortClash(e)
            } else {
                StartError::Other(e)
            });
        }
        if api_versions_ok(port) {
            return Ok(proc);
        }
        if Instant::now() > deadline {
            return Err(StartError::Other(anyhow!(
                "tansu did not answer on 127.0.0.1:{port} within {}s\n{}",
                START_TIMEOUT.as_secs(),
                tail(&log, 20)
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The port accepts TCP and answers a Kafka ApiVersions (v0) request.
pub(crate) fn api_versions_ok(port: u16) -> bool {
    let Ok(mut s) = connect(port, Duration::from_millis(500)) else { return false };
    let client_id = b"binval-testkit";
    let mut req = Vec::new();
    req.extend_from_slice(&18i16.to_be_bytes()); // api_key ApiVersions
    req.extend_from_slice(&0i16.to_be_bytes()); // api_version
    req.extend_from_slice(&7i32.to_be_bytes()); // correlation_id
    req.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    req.extend_from_slice(client_id);
    let mut frame = (req.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&req);
    if s.write_all(&frame).is_err() {
        return false;
    }
    let mut head = [0u8; 8];
    s.read_exact(&mut head).is_ok() && i32::from_be_bytes([head[4], head[5], head[6], head[7]]) == 7
}

fn create_topic(bin: &Path, dir: &Path, port: u16, name: &str, partitions: u32) -> anyhow::Result<()> {
    let cwd = dir.join("cwd");
    let mut cmd = Command::new(bin);
    cmd.args(["topic", "create", "--broker", &format!("tcp://127.0.0.1:{port}")])
        .args(["--partitions", &partitions.to_string()])
        .arg(name)
        .current_dir(&cwd);
    for v in TANSU_ENV {
        cmd.env_remove(v);
    }
    let out = cmd.output().with_context(|| format!("running {} topic create", bin.display()))?;
    if !out.status.success() {
        bail!(
            "tansu topic create {name} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
