//! Hot-key detection: which keys this instance reads most, and how fast.
//!
//! # Why
//!
//! A hot key is a key read so often that its one Redis master becomes the bottleneck (see the
//! design note). An instance can see its own hot keys: it counts its reads per key. Counting
//! every key exactly would need memory per distinct key ever read; a **top-K sketch** keeps a
//! fixed number of counters and still finds the heavy hitters. This module uses
//! **SpaceSaving** (Metwally, Agrawal, El Abbadi, 2005): `capacity` counters; a read of a
//! tracked key increments its counter; a read of an untracked key, when all counters are taken,
//! replaces the key with the smallest count `m` and starts at `m + 1`, remembering `m` as that
//! counter's possible over-count (`error`). Every key read more than `total / capacity` times is
//! guaranteed to be tracked, and for every tracked key `count - error <= true count <= count`.
//! (No crate of the Rust ecosystem offered a maintained SpaceSaving or HeavyKeeper with
//! weights and error bounds; the structure is ~80 lines and tested below.)
//!
//! # Sliding window
//!
//! Rates must follow the traffic: a key hot an hour ago is not hot now. Two summaries cover
//! consecutive windows of length `window`: `prev` (complete) and `cur` (filling). A key's reads
//! in the last `window` are estimated as `cur + prev × (1 − f)`, where `f` is the fraction of
//! the current window already elapsed (the usual sliding-window-counter approximation), and
//! its rate is that divided by `window`. When `cur` is a full window old, it becomes `prev`.
//!
//! # Sampling
//!
//! Counting takes a mutex. To keep a local hit cheap under contention, only every
//! `sample_every`-th read of each thread is counted, with weight `sample_every` (a hot key is
//! read thousands of times a second, so the estimate barely moves; a key read a handful of
//! times may be missed, which is fine: it is not hot). `sample_every = 1` counts every read.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One entry of [`crate::Consumer::hot_keys`]: a key and its read rate in this instance over
/// the last hot-key window. Serializes (serde) as an object of these field names.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HotKey {
    /// The logical key, e.g. `item:detail:6666`.
    pub key: String,
    /// Estimated reads per second (`get` calls, hits and misses) over the last window. An upper
    /// bound: SpaceSaving may over-count a key by what it inherited when it replaced another.
    pub reads_per_sec: f64,
    /// Guaranteed reads per second (the estimate minus the possible over-count); this is what
    /// is compared with [`crate::ConsumerBuilder::hot_key_threshold`].
    pub min_reads_per_sec: f64,
    /// `true` when `min_reads_per_sec` is at or above the threshold.
    pub hot: bool,
}

/// Settings of hot-key detection (see [`crate::ConsumerBuilder`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HotSettings {
    pub window: Duration,
    /// Reads per second at or above which a key is hot.
    pub threshold: f64,
    /// Counters of the SpaceSaving summary.
    pub capacity: usize,
    /// Count one read of every `sample_every` per thread, weighted by it.
    pub sample_every: u32,
    /// How many keys [`HotKeys::top`] reports by default and the gauges cover.
    pub top_k: usize,
}

/// A SpaceSaving summary: at most `capacity` (key, count, error) counters.
#[derive(Debug)]
pub(crate) struct SpaceSaving {
    capacity: usize,
    counts: HashMap<Arc<str>, (u64, u64)>,
    /// (count, key) of every counter, so the smallest is found in O(log capacity).
    order: BTreeSet<(u64, Arc<str>)>,
}

impl SpaceSaving {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SpaceSaving { capacity, counts: HashMap::with_capacity(capacity), order: BTreeSet::new() }
    }

    /// Count `weight` reads of `key`.
    pub(crate) fn add(&mut self, key: &str, weight: u64) {
        if let Some((k, c)) = self.counts.get_key_value(key) {
            let (k, count, error) = (k.clone(), c.0, c.1);
            self.order.remove(&(count, k.clone()));
            self.order.insert((count + weight, k.clone()));
            self.counts.insert(k, (count + weight, error));
            return;
        }
        let k: Arc<str> = Arc::from(key);
        if self.counts.len() < self.capacity {
            self.counts.insert(k.clone(), (weight, 0));
            self.order.insert((weight, k));
            return;
        }
        // Full: the key with the smallest count gives its counter to `key`.
        let Some((min, victim)) = self.order.pop_first() else { return };
        self.counts.remove(&victim);
        self.counts.insert(k.clone(), (min + weight, min));
        self.order.insert((min + weight, k));
    }

    /// (count, error) of `key`, `(0, 0)` when not tracked.
    pub(crate) fn get(&self, key: &str) -> (u64, u64) {
        self.counts.get(key).copied().unwrap_or((0, 0))
    }

    /// Every tracked key with (count, error), largest count first.
    pub(crate) fn iter_desc(&self) -> impl Iterator<Item = (&Arc<str>, u64, u64)> {
        self.order.iter().rev().map(|(c, k)| (k, *c, self.counts.get(k).map_or(0, |e| e.1)))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }
}

struct Windows {
    cur: SpaceSaving,
    prev: SpaceSaving,
    cur_start: Instant,
}

/// Read counter of one instance: sampled, two-window SpaceSaving (see the module docs).
pub(crate) struct HotKeys {
    s: HotSettings,
    w: Mutex<Windows>,
    /// Keys whose gauge was last set above 0, so they can be set to 0 when they leave the top.
    published: Mutex<Vec<String>>,
}

thread_local! {
    static TICK: Cell<u32> = const { Cell::new(0) };
}

impl HotKeys {
    pub(crate) fn new(s: HotSettings) -> Self {
        HotKeys {
            s,
            w: Mutex::new(Windows { cur: SpaceSaving::new(s.capacity), prev: SpaceSaving::new(s.capacity), cur_start: Instant::now() }),
            published: Mutex::new(Vec::new()),
        }
    }

    /// Count one read of `key` (sampled: see the module docs).
    #[inline]
    pub(crate) fn record(&self, key: &str) {
        let n = self.s.sample_every;
        if n > 1 {
            let t = TICK.with(|t| {
                let v = t.get().wrapping_add(1);
                t.set(v);
                v
            });
            if !t.is_multiple_of(n) {
                return;
            }
        }
        self.record_weighted(key, u64::from(n.max(1)), Instant::now());
    }

    pub(crate) fn record_weighted(&self, key: &str, weight: u64, now: Instant) {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.rotate(&mut w, now);
        w.cur.add(key, weight);
    }

    fn rotate(&self, w: &mut Windows, now: Instant) {
        let age = now.saturating_duration_since(w.cur_start);
        if age < self.s.window {
            return;
        }
        let fresh = SpaceSaving::new(self.s.capacity);
        if age >= self.s.window * 2 {
            // Nothing was read during a whole window: the previous one is empty too.
            w.prev = SpaceSaving::new(self.s.capacity);
            w.cur = fresh;
            w.cur_start = now;
        } else {
            w.prev = std::mem::replace(&mut w.cur, fresh);
            w.cur_start += self.s.window;
        }
    }

    /// Fraction of the current window that has elapsed, in `[0, 1]`.
    fn elapsed_fraction(&self, w: &Windows, now: Instant) -> f64 {
        (now.saturating_duration_since(w.cur_start).as_secs_f64() / self.s.window.as_secs_f64()).min(1.0)
    }

    /// (estimated, guaranteed) reads per second of `key` over the last window.
    fn rates(&self, w: &Windows, now: Instant, key: &str) -> (f64, f64) {
        let keep = 1.0 - self.elapsed_fraction(w, now);
        let (c, ce) = w.cur.get(key);
        let (p, pe) = w.prev.get(key);
        let secs = self.s.window.as_secs_f64();
        let est = c as f64 + p as f64 * keep;
        let min = (c - ce) as f64 + (p - pe) as f64 * keep;
        (est / secs, min / secs)
    }

    /// `true` when `key`'s guaranteed read rate is at or above the threshold.
    pub(crate) fn is_hot(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.rotate(&mut w, now);
        self.rates(&w, now, key).1 >= self.s.threshold
    }

    /// The `k` keys with the highest estimated rate, highest first.
    pub(crate) fn top(&self, k: usize) -> Vec<HotKey> {
        let now = Instant::now();
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        self.rotate(&mut w, now);
        let mut keys: Vec<Arc<str>> = w.cur.iter_desc().map(|(k, _, _)| k.clone()).collect();
        for (k, _, _) in w.prev.iter_desc() {
            if w.cur.get(k).0 == 0 {
                keys.push(k.clone());
            }
        }
        let mut out: Vec<HotKey> = keys
            .iter()
            .map(|k| {
                let (est, min) = self.rates(&w, now, k);
                HotKey { key: k.to_string(), reads_per_sec: est, min_reads_per_sec: min, hot: min >= self.s.threshold }
            })
            .filter(|h| h.reads_per_sec > 0.0)
            .collect();
        drop(w);
        out.sort_by(|a, b| b.reads_per_sec.total_cmp(&a.reads_per_sec).then_with(|| a.key.cmp(&b.key)));
        out.truncate(k);
        out
    }

    /// Set the hot-key gauges from the current top K: `binval_consumer_hot_key_reads_per_sec`
    /// per key (keys that left the top are set to 0) and `binval_consumer_hot_keys` (how many
    /// are at or above the threshold). Returns that top K.
    pub(crate) fn publish_metrics(&self) -> Vec<HotKey> {
        let top = self.top(self.s.top_k);
        let mut published = self.published.lock().unwrap_or_else(|p| p.into_inner());
        for old in published.iter() {
            if !top.iter().any(|h| &h.key == old) {
                metrics::gauge!("binval_consumer_hot_key_reads_per_sec", "key" => old.clone()).set(0.0);
            }
        }
        for h in &top {
            metrics::gauge!("binval_consumer_hot_key_reads_per_sec", "key" => h.key.clone()).set(h.reads_per_sec);
        }
        metrics::gauge!("binval_consumer_hot_keys").set(top.iter().filter(|h| h.hot).count() as f64);
        // The bounded view (K series whatever the churn): the rate at each rank of the top K.
        for rank in 0..self.s.top_k {
            let rate = top.get(rank).map(|h| h.reads_per_sec).unwrap_or(0.0);
            metrics::gauge!("binval_consumer_hot_key_rank_reads_per_sec", "rank" => (rank + 1).to_string()).set(rate);
        }
        *published = top.iter().map(|h| h.key.clone()).collect();
        top
    }

    pub(crate) fn window(&self) -> Duration {
        self.s.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_saving_keeps_heavy_hitters_with_error_bounds() {
        let mut s = SpaceSaving::new(8);
        // 1000 cold keys read once each, interleaved with two heavy keys.
        let mut truth: HashMap<String, u64> = HashMap::new();
        for i in 0..1000u64 {
            let cold = format!("cold:{i}");
            s.add(&cold, 1);
            *truth.entry(cold).or_default() += 1;
            if i % 2 == 0 {
                s.add("hot:a", 1);
                *truth.entry("hot:a".into()).or_default() += 1;
            }
            if i % 5 == 0 {
                s.add("hot:b", 3);
                *truth.entry("hot:b".into()).or_default() += 3;
            }
        }
        assert_eq!(s.len(), 8);
        let top: Vec<_> = s.iter_desc().map(|(k, c, e)| (k.to_string(), c, e)).collect();
        assert_eq!(top[0].0, "hot:b", "{top:?}");
        assert_eq!(top[1].0, "hot:a", "{top:?}");
        for (k, c, e) in &top {
            let t = truth[k.as_str()];
            assert!(c - e <= t && t <= *c, "{k}: count {c} error {e} true {t}");
        }
        // Counts are exact for keys never evicted.
        let (c, e) = s.get("hot:a");
        assert!(c - e <= 500 && c >= 500);
    }

    #[test]
    fn space_saving_replaces_the_smallest_counter() {
        let mut s = SpaceSaving::new(2);
        s.add("a", 5);
        s.add("b", 2);
        s.add("c", 1);
        assert_eq!(s.get("b"), (0, 0));
        assert_eq!(s.get("c"), (3, 2));
        assert_eq!(s.get("a"), (5, 0));
    }

    fn settings(window_ms: u64, threshold: f64) -> HotSettings {
        HotSettings { window: Duration::from_millis(window_ms), threshold, capacity: 16, sample_every: 1, top_k: 10 }
    }

    #[test]
    fn sliding_window_rates_follow_traffic() {
        let h = HotKeys::new(settings(1000, 50.0));
        let t0 = h.w.lock().unwrap().cur_start;
        for _ in 0..100 {
            h.record_weighted("k", 1, t0 + Duration::from_millis(100));
        }
        h.record_weighted("cold", 1, t0 + Duration::from_millis(100));
        {
            let w = h.w.lock().unwrap();
            let (est, min) = h.rates(&w, t0 + Duration::from_millis(500), "k");
            assert_eq!((est, min), (100.0, 100.0));
        }
        // Half-way into the next window: prev (100 reads) counts half.
        let w = h.w.lock().unwrap();
        drop(w);
        h.record_weighted("other", 1, t0 + Duration::from_millis(1500));
        let w = h.w.lock().unwrap();
        let (est, _) = h.rates(&w, t0 + Duration::from_millis(1500), "k");
        assert!((est - 50.0).abs() < 1e-9, "{est}");
        drop(w);
        // Two idle windows later everything is forgotten.
        h.record_weighted("other", 1, t0 + Duration::from_millis(4000));
        let w = h.w.lock().unwrap();
        assert_eq!(h.rates(&w, t0 + Duration::from_millis(4000), "k"), (0.0, 0.0));
    }

    #[test]
    fn top_and_threshold() {
        let h = HotKeys::new(settings(60_000, 1.0));
        for _ in 0..120 {
            h.record("hot");
        }
        for _ in 0..30 {
            h.record("warm");
        }
        h.record("cold");
        let top = h.top(2);
        assert_eq!(top.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), ["hot", "warm"]);
        assert!((top[0].reads_per_sec - 2.0).abs() < 1e-6, "{top:?}");
        assert!(top[0].hot && !top[1].hot, "{top:?}");
        assert!(h.is_hot("hot"));
        assert!(!h.is_hot("warm"));
        assert!(!h.is_hot("never"));
    }

    #[test]
    fn sampling_counts_one_in_n_with_weight_n() {
        let h = HotKeys::new(HotSettings { sample_every: 4, ..settings(60_000, 1.0) });
        // On a fresh thread the tick starts at 0, so exactly 100 / 4 samples of weight 4.
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..100 {
                    h.record("k");
                }
            });
        });
        assert_eq!(h.w.lock().unwrap().cur.get("k"), (100, 0));
    }
}
