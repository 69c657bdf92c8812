//! Catch-up: a backlog of single-row transactions written while no binval runs, then read by
//! python-mysql-replication (decode only) and applied by `binval run` (8 suffix replicas on the
//! Cluster, events to Kafka), over the same binlog range, in one run.

use std::time::{Duration, Instant};

use crate::binval::Binval;
use crate::setup::Bench;
use crate::writer;

/// The catch-up figures.
pub struct Catchup {
    pub transactions: u64,
    pub from: (String, u64),
    pub to: (String, u64),
    /// binval: seconds from start to everything acknowledged, CPU seconds, peak RSS MiB.
    pub binval_secs: Option<f64>,
    pub binval_cpu_secs: f64,
    pub binval_rss_mib: f64,
    /// python-mysql-replication: rows decoded and seconds, or why it did not run.
    pub python: Result<(u64, f64), String>,
}

/// Write `backlog` transactions, then time python-mysql-replication and binval over them.
pub async fn run(bench: &Bench, backlog: u64, writers: usize) -> anyhow::Result<Catchup> {
    let from = bench.binlog_now().await?;
    eprintln!("== catch-up: writing {backlog} single-row transactions (no binval running)");
    let w = writer::run(&bench.app_url(), bench.rows, None, writers, Duration::from_secs(3600), Some(backlog)).await?;
    let to = bench.binlog_now().await?;
    eprintln!("   {} commits in {:.1} s; binlog {}:{} .. {}:{}", w.commits, w.secs, from.0, from.1, to.0, to.1);

    let python = python_decode(&from, &to);
    if let Err(why) = &python {
        eprintln!("   python-mysql-replication: {why}");
    }

    let topic = bench.fresh_topic("catchup")?;
    let t0 = Instant::now();
    let bv = Binval::spawn(bench, "catchup", &format!("{}:{}", from.0, from.1), &topic)?;
    let done = bv.wait_acked(&to, Duration::from_secs(900)).await;
    let binval_secs = done.map(|_| t0.elapsed().as_secs_f64());
    let (cpu, rss) = (bv.cpu_secs(), bv.peak_rss_mib());
    bv.stop().await;
    Ok(Catchup { transactions: w.commits, from, to, binval_secs, binval_cpu_secs: cpu, binval_rss_mib: rss, python })
}

/// Run `scripts/pyrepl_decode.py` with `$BENCH_PYTHON` over the range: (rows, seconds).
fn python_decode(from: &(String, u64), to: &(String, u64)) -> Result<(u64, f64), String> {
    let python =
        std::env::var("BENCH_PYTHON").map_err(|_| "skipped: BENCH_PYTHON not set (scripts/loadbench.sh sets it up)".to_string())?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pyrepl_decode.py");
    let port = binval_testkit::mariadb().repl_url().rsplit(':').next().unwrap_or_default().to_string();
    let mut child = std::process::Command::new(&python)
        .arg(&script)
        .args(["--port", &port, "--user", "binval", "--password", "binval", "--server-id", "30001"])
        .args(["--file", &from.0, "--pos", &from.1.to_string(), "--end-file", &to.0, "--end-pos", &to.1.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{python}: {e}"))?;
    let until = Instant::now() + Duration::from_secs(900);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            return Err("did not finish within 15 min (killed)".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("{} exited {}: {}", script.display(), out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("its output: {e}"))?;
    Ok((v["rows"].as_u64().unwrap_or(0), v["seconds"].as_f64().unwrap_or(f64::NAN)))
}
