//! One `binval run` process of the release build: start, readiness, `/metrics`, CPU and
//! peak RSS from `/proc`, lag sampling, SIGTERM.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::setup::Bench;

/// A running `binval run`.
pub struct Binval {
    child: Child,
    log: std::path::PathBuf,
    metrics: Scraper,
}

/// binval's metrics listener (`/metrics`, `/readyz`), over plain HTTP/1.0.
#[derive(Clone)]
pub struct Scraper {
    addr: String,
}

impl Scraper {
    async fn http(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let mut s = tokio::net::TcpStream::connect(&self.addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).as_bytes()).await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Ok((code, body))
    }

    /// One scrape of `/metrics`.
    pub async fn scrape(&self) -> anyhow::Result<Metrics> {
        Ok(Metrics::parse(&self.http("/metrics").await?.1))
    }
}

/// One scrape of `/metrics`: `name` -> every sample `(labels text, value)`.
pub struct Metrics(HashMap<String, Vec<(String, f64)>>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut m: HashMap<String, Vec<(String, f64)>> = HashMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            m.entry(name.to_string()).or_default().push((labels.to_string(), value));
        }
        Metrics(m)
    }

    /// The `q` quantile (0..1) of histogram `name` over the observations made between the
    /// scrape `before` and this one, from the `_bucket` counters, linearly interpolated inside
    /// the bucket as Prometheus' `histogram_quantile` does; `None` without observations.
    pub fn quantile_since(&self, before: &Metrics, name: &str, q: f64) -> Option<f64> {
        let bucket = format!("{name}_bucket");
        let le_of = |labels: &str| -> Option<f64> {
            let v = labels.split("le=\"").nth(1)?.split('"').next()?;
            if v == "+Inf" {
                Some(f64::INFINITY)
            } else {
                v.parse().ok()
            }
        };
        let count = |m: &Metrics, le: f64| -> f64 {
            m.0.get(&bucket).map(|s| s.iter().filter(|(l, _)| le_of(l) == Some(le)).map(|(_, v)| *v).sum()).unwrap_or(0.0)
        };
        let mut bounds: Vec<f64> = self.0.get(&bucket)?.iter().filter_map(|(l, _)| le_of(l)).collect();
        bounds.sort_by(|a, b| a.total_cmp(b));
        bounds.dedup();
        let cum: Vec<(f64, f64)> = bounds.iter().map(|&le| (le, count(self, le) - count(before, le))).collect();
        let total = cum.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let (mut lo, mut below) = (0.0, 0.0);
        for &(le, c) in &cum {
            if c >= rank {
                if le.is_infinite() {
                    return Some(lo);
                }
                let inside = (c - below).max(1e-9);
                return Some(lo + (le - lo) * (rank - below) / inside);
            }
            (lo, below) = (le, c);
        }
        Some(lo)
    }

    /// The mean of histogram `name` over the observations made between `before` and this scrape.
    pub fn mean_since(&self, before: &Metrics, name: &str) -> Option<f64> {
        let d = |suffix: &str| {
            self.get(&format!("{name}{suffix}"), &[]).unwrap_or(0.0) - before.get(&format!("{name}{suffix}"), &[]).unwrap_or(0.0)
        };
        let n = d("_count");
        (n > 0.0).then(|| d("_sum") / n)
    }

    /// The sum of `name`'s samples whose labels contain every `k="v"` of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let samples = self.0.get(name)?;
        let matching: Vec<f64> =
            samples.iter().filter(|(l, _)| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))).map(|(_, v)| *v).collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(binval_testkit::free_port()?)
}

/// The index of a binlog file name (`mysql-bin.000042` -> 42).
fn file_index(name: &str) -> u64 {
    name.rsplit('.').next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

impl Binval {
    /// Write the cell's config and start `binval run` (returns at once).
    pub fn spawn(bench: &Bench, cell: &str, start: &str, topic: &str) -> anyhow::Result<Binval> {
        let port = free_port()?;
        let cfg = bench.config(cell, start, topic, port)?;
        let log = binval_testkit::state_root().join(format!("{}_{cell}.log", bench.prefix));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_binval"));
        cmd.arg("run").arg("--config").arg(&cfg).env("RUST_LOG", "binval=info");
        // `BENCH_BINVAL_WORKERS=N`: binval's tokio worker threads (tokio's TOKIO_WORKER_THREADS),
        // for binval alone, not for the bench's own writer and app instances.
        if let Ok(n) = std::env::var("BENCH_BINVAL_WORKERS") {
            cmd.env("TOKIO_WORKER_THREADS", n);
        }
        let child = cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log)?).spawn()?;
        Ok(Binval { child, log, metrics: Scraper { addr: format!("127.0.0.1:{port}") } })
    }

    /// Wait until `/readyz` says ready (streaming, lag under its bound).
    pub async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + limit;
        loop {
            if let Ok((200, _)) = self.metrics.http("/readyz").await {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < until, "binval not ready within {limit:?} (log: {})", self.log.display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One scrape of `/metrics`.
    pub async fn scrape(&self) -> anyhow::Result<Metrics> {
        self.metrics.scrape().await
    }

    /// User + system CPU seconds of the process (all threads).
    pub fn cpu_secs(&self) -> f64 {
        binval_testkit::procfs::cpu_secs(self.child.id()).unwrap_or(0.0)
    }

    /// CPU seconds and voluntary context switches of `binval run`'s threads by kind: tokio's
    /// workers, librdkafka's threads (`rdk:`), the rest. The fan-out bench's; the load bench
    /// reads the whole machine's CPU instead (`cpu.rs`).
    #[allow(dead_code)]
    pub fn thread_kinds(&self) -> binval_testkit::procfs::ThreadKinds {
        binval_testkit::procfs::ThreadKinds::of(self.child.id())
    }

    /// Peak resident set (VmHWM), MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        binval_testkit::procfs::peak_rss_kib(self.child.id()).unwrap_or(0) as f64 / 1024.0
    }

    /// Sample `binval_heartbeat_lag_seconds` every `every` until [`LagSampler::finish`].
    pub fn sample_every(&self, every: Duration) -> LagSampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (me, out) = (self.metrics.clone(), samples.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.wait_for(|v| *v) => break,
                }
                if let Ok(m) = me.scrape().await {
                    if let Some(lag) = m.get("binval_heartbeat_lag_seconds", &[]) {
                        out.lock().unwrap().push(lag);
                    }
                }
            }
        });
        LagSampler { samples, stop, task }
    }

    /// Wait until binval acknowledged everything up to `at` (file, pos); how long it took.
    pub async fn wait_acked(&self, at: &(String, u64), limit: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        let want = (file_index(&at.0), at.1);
        while t0.elapsed() < limit {
            if let Ok(m) = self.scrape().await {
                let file = m.get("binval_binlog_file_index", &[("position", "acked")]).unwrap_or(0.0) as u64;
                let pos = m.get("binval_binlog_position_bytes", &[("position", "acked")]).unwrap_or(0.0) as u64;
                if (file, pos) >= want {
                    return Some(t0.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGKILL (a crash), without waiting for anything (the fault benchmark).
    #[allow(dead_code)]
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait (30 s at most, then SIGKILL); the exit code.
    pub async fn stop(mut self) -> i32 {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code().unwrap_or(-1);
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                return -9;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The lag samples of a running cell.
pub struct LagSampler {
    samples: Arc<Mutex<Vec<f64>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl LagSampler {
    /// Stop sampling; the samples, seconds.
    pub async fn finish(self) -> Vec<f64> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *self.samples.lock().unwrap())
    }
}

/// Apply the rows' INSERT (one transaction) with a binval run started before it, so every key
/// has its replicas before the cells start (the app instances read existing rows, as in
/// production). Errors: the run did not acknowledge the binlog's end within 10 min.
pub async fn seed(bench: &Bench) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let topic = bench.fresh_topic("seed")?;
    let bv = Binval::spawn(bench, "seed", &format!("{}:{}", bench.before_rows.0, bench.before_rows.1), &topic)?;
    let now = bench.binlog_now().await?;
    let done = bv.wait_acked(&now, Duration::from_secs(600)).await;
    bv.stop().await;
    anyhow::ensure!(done.is_some(), "the seeding run did not apply the rows within 10 min");
    println!("replicas of every row written by a seeding binval run in {:.1} s\n", t0.elapsed().as_secs_f64());
    Ok(())
}
