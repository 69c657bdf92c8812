//! The writer: `conns` connections, each one autocommit single-row `UPDATE` of a random row at
//! a time, paced together to `rate` commits/s (or unpaced).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use rand::Rng;

/// What the writer did.
pub struct Written {
    pub commits: u64,
    pub secs: f64,
}

/// Write for `secs`, or until `limit` commits when given; `rate` None = as fast as the
/// connections go.
pub async fn run(url: &str, rows: u32, rate: Option<u32>, conns: usize, secs: Duration, limit: Option<u64>) -> anyhow::Result<Written> {
    run_rows(url, rows, rate, conns, secs, limit, 1).await
}

/// [`run`] with `per_commit` rows per autocommit `UPDATE` (consecutive ids from a random
/// one: `per_commit` distinct keys per commit); `rate` counts commits.
pub async fn run_rows(
    url: &str,
    rows: u32,
    rate: Option<u32>,
    conns: usize,
    secs: Duration,
    limit: Option<u64>,
    per_commit: u32,
) -> anyhow::Result<Written> {
    let per_commit = per_commit.clamp(1, rows);
    let done = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (url, done) = (url.to_string(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(url).await?;
            let update =
                c.prep("UPDATE items SET price = price + 0.01, stock = stock - 1, updated = NOW(3) WHERE id BETWEEN ? AND ?").await?;
            while t0.elapsed() < secs && limit.is_none_or(|l| done.load(Relaxed) < l) {
                if let Some(r) = rate {
                    // Paced: all connections together stay at `r` commits since t0.
                    let due = (t0.elapsed().as_secs_f64() * r as f64) as u64;
                    if done.load(Relaxed) >= due {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                }
                let id = rand::rng().random_range(1..=rows - per_commit + 1);
                c.exec_drop(&update, (id, id + per_commit - 1)).await?;
                done.fetch_add(1, Relaxed);
            }
            c.disconnect().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(Written { commits: done.load(Relaxed), secs: t0.elapsed().as_secs_f64() })
}
