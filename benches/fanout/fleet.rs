//! The app instances of one cell: `n` `binval_consumer::Consumer`s in this process, each
//! holding a random sample of the keys (and every probe key), and the probe that times
//! commit -> eviction on some of them.

use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use futures::future::join_all;
use mysql_async::prelude::Queryable;
use rand::seq::index::sample;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::setup::Bench;

/// Instances built (and warmed) at a time.
const BUILD_CONCURRENCY: usize = 10;

/// The instances of one cell.
pub struct Fleet {
    pub instances: Vec<Consumer>,
}

/// What the instances received and applied, summed over them.
#[derive(Clone, Copy, Default, Debug)]
pub struct Received {
    pub messages: u64,
    pub bytes: u64,
    pub events: u64,
    pub evictions: u64,
    /// Invalidations with a commit time, and of those applied within 50/200/1000 ms of it
    /// (`Stats::timed_invalidations`, `Stats::applied_within_*`), summed over the instances.
    pub timed: u64,
    pub within: [u64; 3],
}

impl Received {
    /// The consistency as nines over these counts ([`binval_consumer::Stats::nines`]), for
    /// 50, 200 and 1000 ms, as `"n.n / n.n / n.n"`.
    pub fn nines(&self) -> String {
        let s = binval_consumer::Stats {
            timed_invalidations: self.timed,
            applied_within_50ms: self.within[0],
            applied_within_200ms: self.within[1],
            applied_within_1000ms: self.within[2],
            ..Default::default()
        };
        binval_consumer::CONSISTENCY_THRESHOLDS_MS
            .iter()
            .map(|t| s.nines(*t).map_or("-".to_string(), |n| format!("{n:.1}")))
            .collect::<Vec<_>>()
            .join(" / ")
    }

    /// `self - before`, field by field.
    pub fn since(&self, before: &Received) -> Received {
        Received {
            messages: self.messages - before.messages,
            bytes: self.bytes - before.bytes,
            events: self.events - before.events,
            evictions: self.evictions - before.evictions,
            timed: self.timed - before.timed,
            within: [0, 1, 2].map(|i| self.within[i] - before.within[i]),
        }
    }
}

impl Fleet {
    /// Build `n` instances on `topic` (listening before this returns), each then reading
    /// `held` random rows and every probe row so that it caches them.
    pub async fn start(bench: &Bench, topic: &str, n: usize, held: u32) -> anyhow::Result<Fleet> {
        let mut instances = Vec::with_capacity(n);
        while instances.len() < n {
            let chunk = (n - instances.len()).min(BUILD_CONCURRENCY);
            let built = join_all((0..chunk).map(|_| build(bench, topic, held))).await;
            for c in built {
                instances.push(c?);
            }
        }
        let probes: Vec<String> = bench.probe_ids().into_iter().map(|id| bench.key(id)).collect();
        for chunk in instances.chunks(BUILD_CONCURRENCY) {
            join_all(chunk.iter().map(|c| {
                let ids: Vec<u32> = sample(&mut rand::rng(), bench.rows as usize, (held as usize).min(bench.rows as usize))
                    .into_iter()
                    .map(|i| i as u32 + 1)
                    .collect();
                let keys: Vec<String> = ids.into_iter().map(|id| bench.key(id)).chain(probes.iter().cloned()).collect();
                async move {
                    for k in &keys {
                        let _ = c.get(k).await;
                    }
                }
            }))
            .await;
        }
        Ok(Fleet { instances })
    }

    /// Entries the instances hold, summed.
    pub fn held(&self) -> u64 {
        self.instances.iter().map(|c| c.local_entries()).sum()
    }

    /// The instances' counters, summed.
    pub fn received(&self) -> Received {
        let mut r = Received::default();
        for c in &self.instances {
            let s = c.stats();
            r.messages += s.messages;
            r.bytes += s.message_bytes;
            r.events += s.events;
            r.evictions += s.evictions;
            r.timed += s.timed_invalidations;
            r.within[0] += s.applied_within_50ms;
            r.within[1] += s.applied_within_200ms;
            r.within[2] += s.applied_within_1000ms;
        }
        r
    }

    /// Wait until the instances received, since `before`, 99% of the `published` messages
    /// each (at most `limit`, or until they stopped receiving for 3 s): how long it took and
    /// whether they got there (the listeners draining what binval already published).
    pub async fn drained(&self, before: &Received, published: u64, limit: Duration) -> (Duration, bool) {
        let t0 = Instant::now();
        let want = published * self.instances.len() as u64 * 99 / 100;
        let (mut last, mut since) = (0, Instant::now());
        loop {
            let now = self.received().since(before).messages;
            if now >= want {
                return (t0.elapsed(), true);
            }
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= Duration::from_secs(3) || t0.elapsed() >= limit {
                return (t0.elapsed(), false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Start the probe on at most `probed` instances spread over the fleet.
    pub fn probe(&self, bench: &Bench, probed: usize) -> Probe {
        let step = (self.instances.len() / probed.max(1)).max(1);
        let instances: Vec<Consumer> = self.instances.iter().step_by(step).take(probed.max(1)).cloned().collect();
        let (stop, rx) = watch::channel(false);
        let keys: Vec<(u32, String)> = bench.probe_ids().into_iter().map(|id| (id, bench.key(id))).collect();
        let task = tokio::spawn(probe_loop(bench.app_url(), keys, instances, rx));
        Probe { stop, task }
    }

    /// Shut every instance down (concurrently).
    pub async fn shutdown(self) {
        join_all(self.instances.iter().map(|c| c.shutdown())).await;
    }
}

async fn build(bench: &Bench, topic: &str, held: u32) -> anyhow::Result<Consumer> {
    let mut b = Consumer::builder();
    if let Ok(ms) = std::env::var("FANOUT_FETCH_WAIT_MS") {
        b = b.kafka_property("fetch.wait.max.ms", ms);
    }
    Ok(b.redis_standalone(bench.cluster[0].clone())
        .brokers(bench.brokers.clone())
        .topic(topic.to_string())
        .replicas(bench.replicas)
        .max_entries(held as u64 + 2 * crate::setup::PROBES as u64 + 1_000)
        .build()
        .await?)
}

/// The running probe of a cell.
pub struct Probe {
    stop: watch::Sender<bool>,
    task: JoinHandle<Evictions>,
}

/// Commit -> eviction on the probed instances.
#[derive(Default)]
pub struct Evictions {
    /// ms from the probe's commit returning to the instance no longer holding the version it
    /// held (polled every ms), pooled over the probed instances.
    pub ms: Vec<f64>,
    /// Probe changes an instance had not applied within 5 s.
    pub missing: usize,
    /// Instances probed.
    pub instances: usize,
    /// Probe rows updated (key changes of their own).
    pub updates: u64,
}

impl Probe {
    /// Stop probing; the latencies.
    pub async fn finish(self) -> Evictions {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// Every 50 ms: the probed instances read a probe row (so they hold it), it is updated, and
/// each instance is polled every ms until it no longer holds that version (the event evicted
/// it). Polling `cached_version` rather than subscribing to eviction notices: a subscriber
/// makes the listener build a notice per event, which would add to the CPU measured.
async fn probe_loop(url: String, keys: Vec<(u32, String)>, instances: Vec<Consumer>, stop: watch::Receiver<bool>) -> Evictions {
    let mut ev = Evictions { instances: instances.len(), ..Default::default() };
    let Ok(mut db) = mysql_async::Conn::from_url(url).await else { return ev };
    let mut n = 0usize;
    while !*stop.borrow() {
        let (id, k) = &keys[n % keys.len()];
        n += 1;
        let mut held = Vec::with_capacity(instances.len());
        for c in &instances {
            let _ = c.get(k).await;
            held.push(c.cached_version(k));
        }
        if db.exec_drop("UPDATE items SET price = price + 1 WHERE id = ?", (*id,)).await.is_err() {
            continue;
        }
        let committed = Instant::now();
        ev.updates += 1;
        let mut pending: Vec<usize> = (0..instances.len()).filter(|&i| held[i].is_some()).collect();
        while !pending.is_empty() && committed.elapsed() < Duration::from_secs(5) {
            pending.retain(|&i| {
                if instances[i].cached_version(k) != held[i] {
                    ev.ms.push(committed.elapsed().as_secs_f64() * 1e3);
                    false
                } else {
                    true
                }
            });
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        ev.missing += pending.len();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = db.disconnect().await;
    ev
}
