//! `DEMO_LOAD`: a background writer beside the demo's timed updates, and what the app
//! instances did meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use mysql_async::prelude::Queryable;

/// Rows the background writer updates: ids above the demo's keys.
const FIRST: u32 = 100_001;
const ROWS: u32 = 1_000;
/// Writer connections.
const CONNS: u32 = 2;

/// The running background writer and the serving-locally sampler.
pub struct Background {
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicU64>,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    sampler: tokio::task::JoinHandle<Vec<(u64, u64)>>,
}

/// Create the writer's rows (once) and start writing `rate` commits/s; sample every 20 ms
/// whether each instance serves locally.
pub async fn start(url: &str, rate: u32, apps: &[Consumer]) -> anyhow::Result<Background> {
    let mut c = mysql_async::Conn::from_url(url).await?;
    c.query_drop(format!(
        "INSERT IGNORE INTO items SELECT seq, CONCAT('load ', seq), 1.00, 1000000, NOW(3) FROM seq_{FIRST}_to_{}",
        FIRST + ROWS - 1
    ))
    .await?;
    c.disconnect().await?;
    println!("background writer: {rate} single-row UPDATE commits/s on {ROWS} other rows ({CONNS} connections)");
    let (stop, commits, started) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Instant::now());
    let mut tasks = Vec::new();
    for n in 0..CONNS {
        let (url, stop, commits) = (url.to_string(), stop.clone(), commits.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(url).await?;
            let update = c.prep("UPDATE items SET stock = stock - 1, updated = NOW(3) WHERE id = ?").await?;
            let mut i = n;
            while !stop.load(Relaxed) {
                // Paced together: `rate` commits per second since the start.
                if commits.load(Relaxed) >= (started.elapsed().as_secs_f64() * rate as f64) as u64 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                c.exec_drop(&update, (FIRST + i % ROWS,)).await?;
                commits.fetch_add(1, Relaxed);
                i += CONNS;
            }
            c.disconnect().await?;
            Ok(())
        }));
    }
    let (apps, stop2) = (apps.to_vec(), stop.clone());
    let sampler = tokio::spawn(async move {
        let mut served = vec![(0u64, 0u64); apps.len()];
        while !stop2.load(Relaxed) {
            for (i, a) in apps.iter().enumerate() {
                served[i].0 += a.is_serving_local() as u64;
                served[i].1 += 1;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        served
    });
    Ok(Background { stop, commits, started, tasks, sampler })
}

impl Background {
    /// Stop writing; print the rate reached and the serving-locally share per instance.
    pub async fn stop_and_report(self) -> anyhow::Result<()> {
        self.stop.store(true, Relaxed);
        for t in self.tasks {
            t.await??;
        }
        let served = self.sampler.await?;
        let secs = self.started.elapsed().as_secs_f64();
        println!(
            "background writer: {} commits in {secs:.1} s ({:.0}/s)",
            self.commits.load(Relaxed),
            self.commits.load(Relaxed) as f64 / secs
        );
        for (i, (local, n)) in served.iter().enumerate() {
            println!("app-{i}: served locally in {local} of {n} samples ({:.1}%)", 100.0 * *local as f64 / (*n).max(1) as f64);
        }
        Ok(())
    }
}
