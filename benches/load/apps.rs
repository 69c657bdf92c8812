//! Two app instances (`binval-consumer`), each serving reads of random rows from its local
//! cache meanwhile; a probe times commit -> eviction on rows the instances hold; a sampler
//! records whether each instance serves locally.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use mysql_async::prelude::Queryable;
use rand::Rng;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::setup::Bench;

/// App instances per cell.
pub const INSTANCES: usize = 2;
/// Reads per instance per second of the background readers (20 every 10 ms).
const READS_PER_TICK: usize = 20;

/// The app instances of one cell and their readers.
pub struct Apps {
    instances: Vec<Consumer>,
    stop: watch::Sender<bool>,
    readers: Vec<JoinHandle<()>>,
}

/// Commit -> eviction per instance, from the probe.
#[derive(Default, Debug)]
pub struct Evictions {
    /// Latencies (ms) per instance: the probe's commit returned -> the instance applied the
    /// event of that change.
    pub ms: Vec<Vec<f64>>,
    /// Per instance, for the same probe changes: binval handed the event to its producer ->
    /// the instance applied it (`received_at_ms - publish_time_ms` of the eviction notice,
    /// whole ms of the system clock, which binval and the instances share here): the Kafka leg
    /// as the app sees it (producer linger, broker, fetch wait, the listener's batch).
    pub publish_to_applied_ms: Vec<Vec<f64>>,
    /// Probe changes an instance had not applied within 5 s.
    pub missing: usize,
    /// Probe changes whose row an instance did not hold when it was updated (not serving
    /// locally at that moment).
    pub not_held: usize,
}

/// The newest event of a probe key an instance applied.
#[derive(Clone, Copy)]
struct AppliedEvent {
    version: u64,
    /// When the probe's notice subscriber saw it.
    at: Instant,
    /// `received_at_ms - publish_time_ms` of its eviction notice.
    publish_to_applied_ms: u64,
}

/// One instance's newest applied event of each probe key.
type Applied = Arc<Mutex<HashMap<String, AppliedEvent>>>;

/// Per instance: samples serving locally, samples taken.
pub type Served = Vec<(u64, u64)>;

/// A background task that returns `T` when stopped.
pub struct Running<T> {
    stop: watch::Sender<bool>,
    task: JoinHandle<T>,
}

impl<T> Running<T> {
    pub async fn finish(self) -> T {
        let _ = self.stop.send(true);
        self.task.await.expect("task")
    }
}

fn running<T: Send + 'static, F: std::future::Future<Output = T> + Send + 'static>(
    f: impl FnOnce(watch::Receiver<bool>) -> F,
) -> Running<T> {
    let (stop, rx) = watch::channel(false);
    Running { stop, task: tokio::spawn(f(rx)) }
}

impl Apps {
    /// Build the instances (listening before they return) and start their readers.
    pub async fn start(bench: &Bench, topic: &str) -> anyhow::Result<Apps> {
        let mut instances = Vec::new();
        for _ in 0..INSTANCES {
            let mut b = Consumer::builder();
            if let Ok(ms) = std::env::var("BENCH_FETCH_WAIT_MS") {
                b = b.kafka_property("fetch.wait.max.ms", ms);
            }
            instances.push(
                b.redis_cluster(bench.cluster.clone())
                    .brokers(bench.brokers.clone())
                    .topic(topic.to_string())
                    .replicas(bench.replicas)
                    .max_entries(bench.rows as u64 + 1_000)
                    .eviction_channel_capacity(1 << 16)
                    .build()
                    .await?,
            );
        }
        let (stop, rx) = watch::channel(false);
        let keys: Arc<Vec<String>> = Arc::new((1..=bench.rows).map(|id| bench.key(id)).collect());
        let readers = instances
            .iter()
            .map(|c| {
                let (c, keys, mut rx) = (c.clone(), keys.clone(), rx.clone());
                tokio::spawn(async move {
                    while !*rx.borrow() {
                        for _ in 0..READS_PER_TICK {
                            let k = &keys[rand::rng().random_range(0..keys.len())];
                            let _ = c.get(k).await;
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                            _ = rx.changed() => {}
                        }
                    }
                })
            })
            .collect();
        Ok(Apps { instances, stop, readers })
    }

    /// Every 20 ms, whether each instance serves locally.
    pub fn sample_serving(&self, every: Duration) -> Running<Served> {
        let instances = self.instances.clone();
        running(move |mut stop| async move {
            let mut served = vec![(0u64, 0u64); instances.len()];
            while !*stop.borrow() {
                for (i, c) in instances.iter().enumerate() {
                    served[i].0 += c.is_serving_local() as u64;
                    served[i].1 += 1;
                }
                tokio::select! { _ = tokio::time::sleep(every) => {} _ = stop.changed() => {} }
            }
            served
        })
    }

    /// Every 50 ms: both instances hold a probe row, it is updated, and the time until each
    /// instance applies its event is recorded.
    pub fn probe(&self, url: String, ids: Vec<u32>, key: impl Fn(u32) -> String + Send + 'static) -> Running<Evictions> {
        let instances = self.instances.clone();
        // Per instance: the newest version applied per probe key, and when.
        let seen: Vec<Applied> = instances.iter().map(|_| Arc::default()).collect();
        let probe_keys: std::collections::HashSet<String> = ids.iter().map(|&id| key(id)).collect();
        for (c, seen) in instances.iter().zip(&seen) {
            let (mut rx, seen, keys) = (c.subscribe_evictions(), seen.clone(), probe_keys.clone());
            tokio::spawn(async move {
                loop {
                    match rx.recv().await {
                        Ok(n) if keys.contains(&n.key) => {
                            let mut s = seen.lock().unwrap();
                            let applied = AppliedEvent {
                                version: n.version,
                                at: Instant::now(),
                                publish_to_applied_ms: n.received_at_ms.saturating_sub(n.publish_time_ms),
                            };
                            let e = s.entry(n.key).or_insert(applied);
                            if n.version > e.version {
                                *e = applied;
                            }
                        }
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(_) => break,
                    }
                }
            });
        }
        running(move |stop| probe_loop(url, ids, key, instances, seen, stop))
    }

    /// Stop the readers and the instances.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for r in self.readers {
            let _ = r.await;
        }
        for c in &self.instances {
            c.shutdown().await;
        }
    }
}

async fn probe_loop(
    url: String,
    ids: Vec<u32>,
    key: impl Fn(u32) -> String,
    instances: Vec<Consumer>,
    seen: Vec<Applied>,
    stop: watch::Receiver<bool>,
) -> Evictions {
    let mut ev =
        Evictions { ms: vec![Vec::new(); instances.len()], publish_to_applied_ms: vec![Vec::new(); instances.len()], ..Default::default() };
    let Ok(mut db) = mysql_async::Conn::from_url(url).await else { return ev };
    let mut n = 0usize;
    while !*stop.borrow() {
        let id = ids[n % ids.len()];
        n += 1;
        let k = key(id);
        let mut held = Vec::new();
        for c in &instances {
            let _ = c.get(&k).await;
            held.push(c.cached_version(&k).is_some());
        }
        if db.exec_drop("UPDATE items SET price = price + 1 WHERE id = ?", (id,)).await.is_err() {
            continue;
        }
        let committed = Instant::now();
        let gtid: Option<String> = db.query_first("SELECT @@last_gtid").await.ok().flatten();
        let v: u64 = gtid.and_then(|g| g.rsplit('-').next().and_then(|s| s.parse().ok())).unwrap_or(u64::MAX);
        for (i, s) in seen.iter().enumerate() {
            if !held[i] {
                ev.not_held += 1;
            }
            let until = committed + Duration::from_secs(5);
            loop {
                let applied = s.lock().unwrap().get(&k).filter(|a| a.version >= v).copied();
                if let Some(a) = applied {
                    ev.ms[i].push(a.at.saturating_duration_since(committed).as_secs_f64() * 1000.0);
                    ev.publish_to_applied_ms[i].push(a.publish_to_applied_ms as f64);
                    break;
                }
                if Instant::now() > until {
                    ev.missing += 1;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = db.disconnect().await;
    ev
}
