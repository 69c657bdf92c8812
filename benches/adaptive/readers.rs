//! The app instances of the adaptive benchmark and what they read: `binval_consumer::Consumer`s
//! in this process with their local cache off (every read goes to Redis, as when the fail safe
//! bypasses the cache), a Zipf read load over the whole table, and one key read as fast as the
//! instances go, each read checked (error, missing row, or older than the row committed
//! [`STALE_MS`] before the read began).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_consumer::{CacheMode, Consumer};
use rand::Rng;
use tokio::task::JoinHandle;

use crate::setup::Bench;

/// A read is stale when the row it returned had been replaced by a change committed this long
/// before the read began (binval applies a change within tens of ms at these rates).
pub const STALE_MS: u64 = 1_000;

/// `n` app instances on `topic`, local cache off, default heat reporting.
pub async fn instances(bench: &Bench, topic: &str, n: usize) -> anyhow::Result<Vec<Consumer>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            Consumer::builder()
                .redis_cluster(bench.cluster.clone())
                .brokers(bench.brokers.clone())
                .topic(topic.to_string())
                .replicas(bench.replicas)
                .cache_mode(CacheMode::Prefixes(vec!["-nothing-".into()]))
                .max_staleness(Some(Duration::from_secs(30)))
                .instance_id(format!("{}-app{i}", bench.prefix))
                .build()
                .await?,
        );
    }
    Ok(out)
}

/// Zipf(`s`) over ranks `1..=n` by inverse CDF (a table of the cumulative weights).
pub struct Zipf {
    cum: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut cum = Vec::with_capacity(n);
        let mut acc = 0.0;
        for r in 1..=n {
            acc += 1.0 / (r as f64).powf(s);
            cum.push(acc);
        }
        Zipf { cum }
    }

    /// A rank, 1-based.
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let u = rng.random::<f64>() * self.cum.last().copied().unwrap_or(0.0);
        self.cum.partition_point(|&c| c < u) + 1
    }

    /// The share of the reads rank `r` gets.
    pub fn share(&self, r: usize) -> f64 {
        let prev = if r >= 2 { self.cum[r - 2] } else { 0.0 };
        (self.cum[r - 1] - prev) / self.cum.last().copied().unwrap_or(1.0)
    }
}

/// What a group of readers saw.
#[derive(Default)]
pub struct Tally {
    pub reads: AtomicU64,
    pub failed: AtomicU64,
    pub missing: AtomicU64,
    pub stale: AtomicU64,
}

impl Tally {
    pub fn line(&self) -> String {
        format!(
            "{} reads: {} failed, {} missing (\"no row\"), {} stale",
            self.reads.load(Relaxed),
            self.failed.load(Relaxed),
            self.missing.load(Relaxed),
            self.stale.load(Relaxed)
        )
    }
}

/// Zipf readers: `tasks` per instance, `rate` reads/s over all of them (paced), rank `r` is
/// the key of row `r`, until `stop` is set. Failed and missing reads are counted.
pub fn zipf(
    apps: &[Consumer],
    bench: &Bench,
    z: Arc<Zipf>,
    rate: f64,
    tasks: usize,
    stop: Arc<AtomicU8>,
) -> (Arc<Tally>, Vec<JoinHandle<()>>) {
    let tally = Arc::new(Tally::default());
    let per_task = rate / (apps.len() * tasks) as f64;
    let mut handles = Vec::new();
    for app in apps {
        for _ in 0..tasks {
            let (app, z, stop, tally, prefix) = (app.clone(), z.clone(), stop.clone(), tally.clone(), bench.prefix.clone());
            handles.push(tokio::spawn(async move {
                let t0 = Instant::now();
                let mut done = 0u64;
                while stop.load(Relaxed) == 0 {
                    let due = (t0.elapsed().as_secs_f64() * per_task) as u64;
                    if done >= due {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        continue;
                    }
                    let r = z.sample(&mut rand::rng());
                    match app.get(&format!("{prefix}:item:{r}")).await {
                        Ok(Some(_)) => {}
                        Ok(None) => _ = tally.missing.fetch_add(1, Relaxed),
                        Err(_) => _ = tally.failed.fetch_add(1, Relaxed),
                    }
                    tally.reads.fetch_add(1, Relaxed);
                    done += 1;
                }
            }));
        }
    }
    (tally, handles)
}

/// The hot row's changes: `(committed at, stock)`, in commit order.
pub type Commits = Arc<Mutex<Vec<(Instant, i64)>>>;

/// The hot readers' pace: as fast as they go, slow (one task per instance, ~20 reads/s
/// each), or stopped.
pub const FAST: u8 = 0;
pub const SLOW: u8 = 1;
pub const STOP: u8 = 2;

/// Readers of `key` (row `stock` values in `commits`): `tasks` per instance while `pace` is
/// [`FAST`], the first task of each instance at ~20 reads/s while [`SLOW`]. Each read is checked
/// against the newest change committed [`STALE_MS`] before it began.
pub fn hot(apps: &[Consumer], key: &str, tasks: usize, pace: Arc<AtomicU8>, commits: Commits) -> (Arc<Tally>, Vec<JoinHandle<()>>) {
    let tally = Arc::new(Tally::default());
    let mut handles = Vec::new();
    for app in apps {
        for t in 0..tasks {
            let (app, key, pace, tally, commits) = (app.clone(), key.to_string(), pace.clone(), tally.clone(), commits.clone());
            handles.push(tokio::spawn(async move {
                loop {
                    let p = pace.load(Relaxed);
                    if p == STOP {
                        break;
                    }
                    if p == SLOW && t > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    let began = Instant::now();
                    let floor = {
                        let c = commits.lock().unwrap();
                        c.iter()
                            .rev()
                            .find(|(at, _)| began.saturating_duration_since(*at) >= Duration::from_millis(STALE_MS))
                            .map(|(_, s)| *s)
                    };
                    match app.get_json::<serde_json::Value>(&key).await {
                        Ok(Some(v)) => {
                            let stock = v["stock"].as_i64().or_else(|| v["stock"].as_str().and_then(|s| s.parse().ok()));
                            if let (Some(floor), Some(stock)) = (floor, stock) {
                                if stock < floor {
                                    tally.stale.fetch_add(1, Relaxed);
                                }
                            }
                        }
                        Ok(None) => _ = tally.missing.fetch_add(1, Relaxed),
                        Err(_) => _ = tally.failed.fetch_add(1, Relaxed),
                    }
                    tally.reads.fetch_add(1, Relaxed);
                    if p == SLOW {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }));
        }
    }
    (tally, handles)
}
