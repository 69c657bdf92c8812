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
//! # The short window of heat reports
//!
//! binval's leader spreads a key within two seconds of its rise only if the heat reports
//! (`heat.rs`) follow a step in about one: a 10 s window takes 10 s to show a key that went
//! from idle to 30,000 reads/s (the sliding estimate grows linearly over the window). So the
//! same reads are also counted in a second pair of summaries over [`SHORT_WINDOW`] (150 ms).
//! Their rate is not the sliding estimate (which smears a step over two windows and shows
//! only two thirds of it after one) but the larger of the last complete short window's rate
//! and the current one's so far (divided by at least half a window, so a few reads at its
//! start do not extrapolate). A step then shows in full within 1.25 short windows (190 ms),
//! and a report gives each key the larger of that and its heat-window rate (below,
//! [`HotKeys::heat`]), both guaranteed rates (the sketch's lower bound).
//!
//! # The heat window
//!
//! The other rate of a report is not the hot-key window's (10 s by default, made for deciding
//! what to cache) but a third pair over [`HEAT_WINDOW`] (2 s), by the sliding estimate. A key
//! read at a modest rate by many instances is reported from it within a window or two, and a
//! key whose reads stop is reported cool within two windows (4 s) instead of two hot-key
//! windows (20 s). Each reported key also carries its recent rate, the short window's alone
//! (`HeatReport::now`): it shows a stop within two short windows, and binval's cool-down clock
//! runs from it (back-dated to the last report that still saw the key hot), so the cool-down
//! starts when the load drops, not 4 s later.
//!
//! A short window's count is used only when it holds at least [`SHORT_MIN_SAMPLES`] samples
//! (by default 16 reads each): below that its noise would make the larger-of-two rate
//! overstate keys read at a modest rate, in every instance alike, and binval's leader sums
//! the reports of the fleet. So the fast path covers keys this instance reads at a few
//! thousand reads per second and up (the step that must spread within 2 s); keys read more
//! slowly follow the hot-key window.
//!
//! # Sampling
//!
//! Counting takes a mutex. To keep a local hit cheap under contention, only every
//! `sample_every`-th read of each thread is counted, with weight `sample_every` (a hot key is
//! read thousands of times a second, so the estimate barely moves; a key read a handful of
//! times may be missed, which is fine: it is not hot). `sample_every = 1` counts every read.

use crate::metric_names;
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

/// Length of the short window (see "The short window of heat reports").
pub(crate) const SHORT_WINDOW: Duration = Duration::from_millis(150);

/// The window of heat reports' steady rates (see "The heat window"): short enough that a key
/// whose reads stop is reported cool within two of it, long enough that a key each instance
/// reads at the report minimum (100 reads/s) holds a few hundred reads in it.
pub(crate) const HEAT_WINDOW: Duration = Duration::from_secs(2);

/// Samples a short window must hold for its rate to count (see "The short window of heat
/// reports").
pub(crate) const SHORT_MIN_SAMPLES: u64 = 32;

/// Two consecutive windows of one length: `prev` complete, `cur` filling since `cur_start`.
struct Pair {
    cur: SpaceSaving,
    prev: SpaceSaving,
    cur_start: Instant,
    len: Duration,
    capacity: usize,
}

impl Pair {
    fn new(len: Duration, capacity: usize, now: Instant) -> Self {
        Pair { cur: SpaceSaving::new(capacity), prev: SpaceSaving::new(capacity), cur_start: now, len, capacity }
    }

    fn rotate(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.cur_start);
        if age < self.len {
            return;
        }
        let fresh = SpaceSaving::new(self.capacity);
        if age >= self.len * 2 {
            // Nothing was read during a whole window: the previous one is empty too.
            self.prev = SpaceSaving::new(self.capacity);
            self.cur = fresh;
            self.cur_start = now;
        } else {
            self.prev = std::mem::replace(&mut self.cur, fresh);
            self.cur_start += self.len;
        }
    }

    /// Fraction of the current window that has elapsed, in `[0, 1]`.
    fn elapsed_fraction(&self, now: Instant) -> f64 {
        (now.saturating_duration_since(self.cur_start).as_secs_f64() / self.len.as_secs_f64()).min(1.0)
    }

    /// (estimated, guaranteed) reads per second of `key` over the last window.
    fn rates(&self, now: Instant, key: &str) -> (f64, f64) {
        let keep = 1.0 - self.elapsed_fraction(now);
        let (c, ce) = self.cur.get(key);
        let (p, pe) = self.prev.get(key);
        let secs = self.len.as_secs_f64();
        let est = c as f64 + p as f64 * keep;
        let min = (c - ce) as f64 + (p - pe) as f64 * keep;
        (est / secs, min / secs)
    }

    /// Guaranteed reads per second of `key` over the recent past (the short window's rate,
    /// module docs): the larger of the last complete window's and the current one's so far
    /// (over at least half a window); a window counts only with at least `min_count` reads.
    fn recent(&self, now: Instant, key: &str, min_count: u64) -> f64 {
        let (c, ce) = self.cur.get(key);
        let (p, pe) = self.prev.get(key);
        let elapsed = now.saturating_duration_since(self.cur_start).max(self.len / 2).as_secs_f64();
        let cur = if c >= min_count { (c - ce) as f64 / elapsed } else { 0.0 };
        let prev = if p >= min_count { (p - pe) as f64 / self.len.as_secs_f64() } else { 0.0 };
        cur.max(prev)
    }

    /// Every key either summary tracks (once).
    fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        let cur = self.cur.iter_desc().map(|(k, _, _)| k);
        cur.chain(self.prev.iter_desc().map(|(k, _, _)| k).filter(|k| self.cur.get(k).0 == 0))
    }
}

/// The hot-key window, and the short window and the heat window of heat reports.
struct Windows {
    long: Pair,
    short: Pair,
    heat: Pair,
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
            w: Mutex::new(Windows {
                long: Pair::new(s.window, s.capacity, Instant::now()),
                short: Pair::new(SHORT_WINDOW, s.capacity, Instant::now()),
                heat: Pair::new(HEAT_WINDOW, s.capacity, Instant::now()),
            }),
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
        w.long.rotate(now);
        w.short.rotate(now);
        w.heat.rotate(now);
        w.long.cur.add(key, weight);
        w.short.cur.add(key, weight);
        w.heat.cur.add(key, weight);
    }

    /// (estimated, guaranteed) reads per second of `key` over the last hot-key window.
    fn rates(&self, w: &Windows, now: Instant, key: &str) -> (f64, f64) {
        w.long.rates(now, key)
    }

    /// The keys of a heat report ([`binval_protocol::adaptive::HeatReport`]): at most `top`
    /// keys whose read rate (reads per second of this instance) is at least `min_rate`, highest
    /// first, as `(key, steady rate, recent rate)`. The steady rate is the larger of the key's
    /// guaranteed rates over the heat window and over the short window (module docs), so a step
    /// shows within [`SHORT_WINDOW`] and a stop within two [`HEAT_WINDOW`]s; the recent rate
    /// is the short window's alone, counted from every sample, so a stop shows in it within two
    /// short windows (binval's cool-down clock starts from it).
    pub(crate) fn heat(&self, top: usize, min_rate: f64) -> Vec<(String, f64, f64)> {
        self.heat_at(top, min_rate, Instant::now())
    }

    fn heat_at(&self, top: usize, min_rate: f64, now: Instant) -> Vec<(String, f64, f64)> {
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        w.heat.rotate(now);
        w.short.rotate(now);
        let min_count = SHORT_MIN_SAMPLES * u64::from(self.s.sample_every.max(1));
        let mut out: HashMap<&Arc<str>, (f64, f64)> = HashMap::new();
        for k in w.heat.keys().chain(w.short.keys()) {
            if out.contains_key(k) {
                continue;
            }
            let rate = w.heat.rates(now, k).1.max(w.short.recent(now, k, min_count));
            out.insert(k, (rate, w.short.recent(now, k, 0)));
        }
        let mut out: Vec<(String, f64, f64)> =
            out.into_iter().filter(|(_, (r, _))| *r >= min_rate && *r > 0.0).map(|(k, (r, recent))| (k.to_string(), r, recent)).collect();
        drop(w);
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out.truncate(top);
        out
    }

    /// `true` when `key`'s guaranteed read rate is at or above the threshold.
    pub(crate) fn is_hot(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        w.long.rotate(now);
        self.rates(&w, now, key).1 >= self.s.threshold
    }

    /// The `k` keys with the highest estimated rate, highest first.
    pub(crate) fn top(&self, k: usize) -> Vec<HotKey> {
        let now = Instant::now();
        let mut w = self.w.lock().unwrap_or_else(|p| p.into_inner());
        w.long.rotate(now);
        let keys: Vec<Arc<str>> = w.long.keys().cloned().collect();
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
                metrics::gauge!(metric_names::HOT_KEY_READS_PER_SEC, "key" => old.clone()).set(0.0);
            }
        }
        for h in &top {
            metrics::gauge!(metric_names::HOT_KEY_READS_PER_SEC, "key" => h.key.clone()).set(h.reads_per_sec);
        }
        metrics::gauge!(metric_names::HOT_KEYS).set(top.iter().filter(|h| h.hot).count() as f64);
        // The bounded view (K series whatever the churn): the rate at each rank of the top K.
        for rank in 0..self.s.top_k {
            let rate = top.get(rank).map(|h| h.reads_per_sec).unwrap_or(0.0);
            metrics::gauge!(metric_names::HOT_KEY_RANK_READS_PER_SEC, "rank" => (rank + 1).to_string()).set(rate);
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
        let t0 = h.w.lock().unwrap().long.cur_start;
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
        assert_eq!(h.w.lock().unwrap().long.cur.get("k"), (100, 0));
    }

    /// A key that goes from idle to 30,000 reads/s (sampled 1 in 16, as by default) is in a
    /// heat report at >= 25,000 reads/s from 200 ms after the step on, so with reports 1 s
    /// apart one of them shows it within 1.2 s whatever their phase; a key read steadily at
    /// 1,000 reads/s is reported near that rate; a cold one is not reported.
    #[test]
    fn heat_follows_a_step_within_a_fifth_of_a_second() {
        // Steps at several phases of the short windows (150 ms).
        for step_us in [20_337_000u64, 20_400_000, 20_425_000, 20_474_000, 20_512_500] {
            heat_after_step(step_us);
        }
    }

    fn heat_after_step(step_us: u64) {
        let h = HotKeys::new(HotSettings { sample_every: 16, ..settings(10_000, 1000.0) });
        let t0 = {
            let mut w = h.w.lock().unwrap();
            let t0 = w.long.cur_start;
            w.short.cur_start = t0;
            t0
        };
        let at = |us: u64| t0 + Duration::from_micros(us);
        // 20 s of a steady key (1,000 reads/s: a sample of 16 every 16 ms) and a cold one.
        let steady_every_us = 16_000;
        let mut next_steady = 0u64;
        let hot_every_us = 16_000_000 / 30_000; // 30,000 reads/s in samples of 16
        let mut next_hot = step_us;
        let mut t = 0u64;
        while t < step_us + 1_300_000 {
            t += 5_000;
            while next_steady <= t {
                h.record_weighted("steady", 16, at(next_steady));
                next_steady += steady_every_us;
            }
            while t >= step_us && next_hot <= t {
                h.record_weighted("hot", 16, at(next_hot));
                next_hot += hot_every_us;
            }
            if t.is_multiple_of(500_000) {
                h.record_weighted("cold", 1, at(t));
            }
            let heat = h.heat_at(32, 100.0, at(t));
            let rate = |k: &str| heat.iter().find(|(key, _, _)| key == k).map(|(_, r, _)| *r);
            assert_eq!(rate("cold"), None, "{heat:?}");
            if t >= 12_000_000 {
                let r = rate("steady").unwrap_or(0.0);
                assert!((800.0..=1400.0).contains(&r), "steady key at {t} us: {r} {heat:?}");
            }
            if t >= step_us + 200_000 {
                let recent = heat.iter().find(|(key, _, _)| key == "hot").map_or(0.0, |(_, _, n)| *n);
                assert!(recent >= 25_000.0, "recent rate {} ms after the step: {recent}", (t - step_us) / 1000);
                let r = rate("hot").unwrap_or(0.0);
                assert!(r >= 25_000.0, "step at {step_us} us, {} ms after it: {r} reads/s {heat:?}", (t - step_us) / 1000);
                assert!(r <= 33_000.0, "{r}");
                assert_eq!(heat[0].0, "hot");
            }
        }
        assert_eq!(h.heat_at(1, 100.0, at(t)).len(), 1, "top bounds the report");
        // The reads stop: within two heat windows the key is no longer reported (the hot-key
        // window, 10 s, would take up to 20 s).
        // The recent rate shows the stop within two short windows (300 ms).
        let stop = t;
        let recent = |t: u64| h.heat_at(32, 100.0, at(t)).into_iter().find(|(k, _, _)| k == "hot").map(|(_, _, n)| n);
        assert!(recent(stop + 2 * SHORT_WINDOW.as_micros() as u64 + 1_000).is_some_and(|n| n == 0.0), "recent rate after the stop");
        let cool = loop {
            t += 100_000;
            if h.heat_at(32, 100.0, at(t)).iter().all(|(k, _, _)| k != "hot") {
                break t - stop;
            }
            assert!(t - stop <= 2 * HEAT_WINDOW.as_micros() as u64, "still reported {} ms after the stop", (t - stop) / 1000);
        };
        assert!(cool >= 1_000_000, "a stop takes about a heat window to show: {cool} us");
    }
}
