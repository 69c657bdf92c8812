//! From a key's fleet read rate to its replica count.
//!
//! # The rule
//!
//! A key read at `R` reads/s over the fleet should not give any master more than
//! `read_budget_per_master` of them. Reads of a key are spread evenly over the masters that
//! hold one of its replicas (master-balanced reads, `binval_protocol::placement`), so the key
//! needs `m = ceil(R / budget)` masters, at most every master of the Cluster. Its count is the
//! smallest `n` in `min..=max` whose replicas `0..n` cover `m` masters (slots are random: 8
//! replicas land on 3 masters 4/2/2 as easily as 3/3/2, so the count is chosen from the real
//! slot map, not as `m`). A key that needs one master stays at `min`. On standalone Redis (one
//! server) the count is `m`, within `min..=max`: it spreads nothing, but the same config works
//! on both.
//!
//! # Hysteresis
//!
//! A key grows as soon as its rate needs more copies than it has: a hot key must spread within
//! seconds. It shrinks only when `R × shrink_headroom` fits a smaller count, and has fitted it
//! for `cool_down_secs` without a break; then it goes to that smaller count (announced first,
//! see `resize`). A key that is no longer reported reads at 0. A pin
//! (`[[adaptive.pin]]`) fixes the count.
//!
//! Each key has two rates ([`KeyRate`]): the steady one, which follows a rise within a fifth
//! of a second but a stop only within about 4 s (the instances' heat window), and the recent
//! one, the instances' last fraction of a second. Growing follows the steady rate. The
//! cool-down clock starts when the recent rate fits the smaller count and restarts whenever
//! it does not; the shrink happens once the clock has run `cool_down_secs` and the steady rate
//! agrees. A clock starts at the time of the last report that still saw the key at its steady
//! rate ([`KeyRate::hot_ago`]: its reads fell after that; at most [`MAX_REPORT_LAG`] before what
//! the round's reports may lag), else as far back as the round's reports may lag the reads (the
//! oldest report's age, at most [`MAX_REPORT_LAG`], plus the instances' recent window,
//! [`KeyRate::behind`]). So a key whose reads fell is back at the smaller count about a
//! cool-down after the fall (within a report interval and a poll), not a cool-down after the
//! steady rate caught up (about 4 s more) nor after the reports and the leader's poll saw it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::AdaptiveConfig;
use crate::config::Replicas;

/// The count a key read at `rate` needs, per the module rule. `covered(n)` is the number of
/// distinct masters holding replicas `0..n` of the key; `masters` the masters of the Cluster
/// (1 for standalone Redis).
///
/// ```
/// use binval::config::Replicas;
/// use binval::replicas::decide::needed;
/// let r = Replicas { min: 1, max: 16 };
/// // 3 masters; replica i on master i % 3.
/// let covered = |n: u32| (n as usize).min(3);
/// assert_eq!(needed(10_000.0, 50_000.0, r, 3, covered), 1);
/// assert_eq!(needed(120_000.0, 50_000.0, r, 3, covered), 3);
/// assert_eq!(needed(1e9, 50_000.0, r, 3, covered), 3); // every master is enough
/// ```
pub fn needed(rate: f64, budget: f64, r: Replicas, masters: usize, covered: impl Fn(u32) -> usize) -> u32 {
    let m = (rate / budget).ceil().max(1.0);
    if m <= 1.0 {
        return r.min;
    }
    if masters <= 1 {
        return (m.min(f64::from(r.max)) as u32).clamp(r.min, r.max);
    }
    let want = (m as usize).min(masters);
    (r.min.max(2)..=r.max).find(|&n| covered(n) >= want).unwrap_or(r.max)
}

/// A key's fleet read rates, reads per second (module docs, "Hysteresis").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeyRate {
    /// The steady rate: counts grow from it, and a shrink waits for it.
    pub steady: f64,
    /// The recent rate: the cool-down clock runs from it.
    pub recent: f64,
    /// How long before the round the recent rate may describe the reads: the age of the
    /// oldest report counted plus the instances' recent window ([`RECENT_WINDOW`]): the
    /// furthest back a clock started by this round may start.
    pub behind: Duration,
    /// The age of the newest report counted that still saw the key at its steady rate (its
    /// recent rate at least half its steady one), if any: the key's reads had not fallen yet
    /// as of that long ago.
    pub hot_ago: Option<Duration>,
}

/// The longest span an instance's recent rate covers (two of binval-consumer's 150 ms short
/// windows, `HeatReport::now`).
pub const RECENT_WINDOW: Duration = Duration::from_millis(300);

/// The most a report's age back-dates a cool-down clock: two of binval-consumer's 1 s report
/// intervals. An instance that reports more slowly (or a report near `report_max_age_ms`)
/// must not make the cool-down shorter than that.
pub const MAX_REPORT_LAG: Duration = Duration::from_secs(2);

impl KeyRate {
    /// Both rates the same (a key read at a constant `rate`), nothing behind.
    pub fn flat(rate: f64) -> Self {
        KeyRate { steady: rate, recent: rate, behind: Duration::ZERO, hot_ago: None }
    }
}

/// A count change the leader decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The new count.
    pub to: u32,
    /// Why, in words (`binval inspect`, `binval status`, the log).
    pub why: String,
}

/// The hysteresis state of every key the leader has seen (module docs).
#[derive(Debug, Default)]
pub struct Decider {
    /// Since when each key has needed fewer copies than it has.
    low_since: HashMap<String, Instant>,
    /// When the newest report that still saw each key at its steady rate began its recent
    /// window ([`KeyRate::hot_ago`] back-dated by [`RECENT_WINDOW`]; keys above `min` only).
    hot_seen: HashMap<String, Instant>,
}

impl Decider {
    /// The change, if any, for `key` of a mapping with `r`, now at `current` copies, read at
    /// `rate` over the fleet. `covered` and `masters` as for [`needed`].
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        cfg: &AdaptiveConfig,
        key: &str,
        r: Replicas,
        current: u32,
        rate: KeyRate,
        masters: usize,
        covered: impl Fn(u32) -> usize + Copy,
        now: Instant,
    ) -> Option<Decision> {
        if let Some(pin) = cfg.pin_of(key) {
            self.low_since.remove(key);
            self.hot_seen.remove(key);
            return (pin != current).then(|| Decision { to: pin, why: format!("pinned to {pin} by [[adaptive.pin]]") });
        }
        let budget = cfg.read_budget_per_master;
        let up = needed(rate.steady, budget, r, masters, covered);
        if up > current {
            self.low_since.remove(key);
            return Some(Decision { to: up, why: why(rate.steady, budget, up, masters, covered) });
        }
        if let Some(ago) = rate.hot_ago.filter(|_| current > r.min) {
            // That report's recent rate covers up to RECENT_WINDOW before it was made.
            let at = now.checked_sub(ago + RECENT_WINDOW).unwrap_or(now);
            let seen = self.hot_seen.entry(key.to_string()).or_insert(at);
            *seen = (*seen).max(at);
        }
        if needed(rate.recent * cfg.shrink_headroom, budget, r, masters, covered) >= current {
            self.low_since.remove(key);
            return None;
        }
        // The clock starts when a report last saw the key hot (the reads fell after that; an
        // earlier round's evidence, at most a report lag before this round's reports), else as
        // far back as this round's reports may lag.
        let earliest = now.checked_sub(rate.behind).unwrap_or(now);
        let floor = now.checked_sub(rate.behind + MAX_REPORT_LAG).unwrap_or(now);
        let start = self.hot_seen.get(key).map_or(earliest, |seen| (*seen).max(floor));
        let since = *self.low_since.entry(key.to_string()).or_insert(start);
        let down = needed(rate.steady * cfg.shrink_headroom, budget, r, masters, covered);
        if now.duration_since(since) < Duration::from_secs(cfg.cool_down_secs) || down >= current {
            return None;
        }
        self.low_since.remove(key);
        self.hot_seen.remove(key);
        Some(Decision {
            to: down,
            why: format!(
                "cooled: fleet reads {:.0}/s (x{} headroom) fit {down} copies for {} s",
                rate.steady, cfg.shrink_headroom, cfg.cool_down_secs
            ),
        })
    }

    /// The earliest time a running cool-down clock reaches `cool_down`, if it is still ahead:
    /// the leader runs a round then rather than at its next poll, so a shrink is decided when
    /// the cool-down has run, not up to a poll interval later.
    pub fn next_due(&self, cool_down: Duration, now: Instant) -> Option<Instant> {
        self.low_since.values().map(|since| *since + cool_down).filter(|due| *due > now).min()
    }

    /// Forget the hysteresis state of keys not in `keep`.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.low_since.retain(|k, _| keep(k));
        self.hot_seen.retain(|k, _| keep(k));
    }
}

fn why(rate: f64, budget: f64, n: u32, masters: usize, covered: impl Fn(u32) -> usize) -> String {
    let m = (rate / budget).ceil() as usize;
    if masters <= 1 {
        return format!("fleet reads {rate:.0}/s over a budget of {budget:.0}/s per master: {n} copies (standalone Redis: one master)");
    }
    format!(
        "fleet reads {rate:.0}/s over a budget of {budget:.0}/s per master need {} of {masters} masters: {n} copies cover {}",
        m.min(masters),
        covered(n)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AdaptiveConfig {
        AdaptiveConfig { cool_down_secs: 10, ..AdaptiveConfig::default() }
    }
    const R: Replicas = Replicas { min: 1, max: 16 };
    fn cov(n: u32) -> usize {
        (n as usize).min(3)
    }

    #[test]
    fn grows_at_once_and_shrinks_after_the_cool_down() {
        let (c, mut d, t0) = (cfg(), Decider::default(), Instant::now());
        assert_eq!(d.step(&c, "k", R, 1, KeyRate::flat(1_000.0), 3, cov, t0), None);
        let g = d.step(&c, "k", R, 1, KeyRate::flat(120_000.0), 3, cov, t0).unwrap();
        assert_eq!(g.to, 3);
        assert!(g.why.contains("120000"), "{}", g.why);
        // Still hot, then at the edge: 40k x 1.5 = 60k needs 2 masters: no shrink below 2.
        assert_eq!(d.step(&c, "k", R, 3, KeyRate::flat(120_000.0), 3, cov, t0), None);
        assert_eq!(d.step(&c, "k", R, 3, KeyRate::flat(40_000.0), 3, cov, t0 + Duration::from_secs(1)), None);
        assert_eq!(d.step(&c, "k", R, 3, KeyRate::flat(40_000.0), 3, cov, t0 + Duration::from_secs(12)).unwrap().to, 2);
        // Idle: waits the cool-down from the first idle step, any rise resets it.
        assert_eq!(d.step(&c, "k", R, 2, KeyRate::flat(0.0), 3, cov, t0 + Duration::from_secs(20)), None);
        assert_eq!(d.step(&c, "k", R, 2, KeyRate::flat(45_000.0), 3, cov, t0 + Duration::from_secs(25)), None);
        assert_eq!(d.step(&c, "k", R, 2, KeyRate::flat(0.0), 3, cov, t0 + Duration::from_secs(26)), None);
        assert_eq!(d.step(&c, "k", R, 2, KeyRate::flat(0.0), 3, cov, t0 + Duration::from_secs(35)), None);
        assert_eq!(d.step(&c, "k", R, 2, KeyRate::flat(0.0), 3, cov, t0 + Duration::from_secs(36)).unwrap().to, 1);
    }

    /// The clock runs from the recent rate: a key whose reads stopped at t0 shrinks at
    /// t0 + cool-down even though its steady rate lagged 4 s behind; a recent rise restarts it;
    /// a steady rate that still needs the copies holds the shrink back.
    #[test]
    fn the_cool_down_runs_from_the_recent_rate() {
        let (c, mut d, t0) = (cfg(), Decider::default(), Instant::now());
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let lagging = KeyRate { steady: 120_000.0, recent: 0.0, behind: Duration::ZERO, hot_ago: None };
        assert_eq!(d.step(&c, "k", R, 3, lagging, 3, cov, s(0)), None);
        assert_eq!(d.step(&c, "k", R, 3, lagging, 3, cov, s(4)), None);
        assert_eq!(d.step(&c, "k", R, 3, KeyRate { steady: 0.0, recent: 0.0, behind: Duration::ZERO, hot_ago: None }, 3, cov, s(9)), None);
        let shrink = d.step(&c, "k", R, 3, KeyRate::flat(0.0), 3, cov, s(10)).unwrap();
        assert_eq!(shrink.to, 1);
        assert!(shrink.why.contains("cooled"), "{}", shrink.why);
        // A recent rise restarts the clock.
        assert_eq!(d.step(&c, "k", R, 3, lagging, 3, cov, s(20)), None);
        assert_eq!(
            d.step(&c, "k", R, 3, KeyRate { steady: 120_000.0, recent: 120_000.0, behind: Duration::ZERO, hot_ago: None }, 3, cov, s(25)),
            None
        );
        assert_eq!(d.step(&c, "k", R, 3, KeyRate::flat(0.0), 3, cov, s(34)), None);
        // The clock has run but the steady rate still needs 3 copies: wait for it.
        assert_eq!(d.step(&c, "k", R, 3, lagging, 3, cov, s(44)), None);
        assert_eq!(d.step(&c, "k", R, 3, KeyRate::flat(0.0), 3, cov, s(45)).unwrap().to, 1);
    }

    /// The clock starts at the last report that showed the key hot, within what the reports
    /// may lag.
    #[test]
    fn the_clock_starts_at_the_last_hot_report() {
        let (c, mut d, t0) = (cfg(), Decider::default(), Instant::now() + Duration::from_secs(60));
        let ms = Duration::from_millis;
        let hot = KeyRate { steady: 120_000.0, recent: 120_000.0, behind: ms(600), hot_ago: Some(ms(400)) };
        // A report 0.4 s old saw it hot.
        assert_eq!(d.step(&c, "k", R, 3, hot, 3, cov, t0), None);
        // The next round: the newest report that saw it hot is the same one, 0.9 s old now.
        let mixed = KeyRate { steady: 120_000.0, recent: 60_000.0, behind: ms(900), hot_ago: Some(ms(900)) };
        assert_eq!(d.step(&c, "k", R, 3, mixed, 3, cov, t0 + ms(500)), None);
        let cool = KeyRate { steady: 0.0, recent: 0.0, behind: ms(1_500), hot_ago: None };
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0 + ms(1_000)), None);
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0 + ms(9_200)), None);
        assert_eq!(d.next_due(Duration::from_secs(10), t0 + ms(9_200)), Some(t0 + ms(9_300)));
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0 + ms(9_300)).unwrap().to, 1, "10 s after t0 - 0.4 s - the report's window");
    }

    /// A clock started by a round whose reports are 1.2 s old starts 1.5 s back.
    #[test]
    fn the_clock_starts_as_far_back_as_the_reports_lag() {
        let (c, mut d, t0) = (cfg(), Decider::default(), Instant::now() + Duration::from_secs(60));
        let cool = KeyRate { steady: 0.0, recent: 0.0, behind: Duration::from_millis(1_200) + RECENT_WINDOW, hot_ago: None };
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0), None);
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0 + Duration::from_millis(8_400)), None);
        assert_eq!(d.step(&c, "k", R, 3, cool, 3, cov, t0 + Duration::from_millis(8_500)).unwrap().to, 1);
    }

    #[test]
    fn the_count_covers_the_masters_the_rate_needs() {
        // Replicas 0..4 on master 0, the rest spread: covering 3 masters needs 6.
        let skewed = |n: u32| match n {
            0..=4 => 1,
            5 => 2,
            _ => 3,
        };
        assert_eq!(needed(150_000.0, 50_000.0, R, 3, skewed), 6);
        assert_eq!(needed(90_000.0, 50_000.0, R, 3, skewed), 5);
        assert_eq!(needed(150_000.0, 50_000.0, Replicas { min: 1, max: 4 }, 3, skewed), 4, "at most max");
        assert_eq!(needed(150_000.0, 50_000.0, Replicas { min: 4, max: 16 }, 1, cov), 4, "standalone: at least min");
        assert_eq!(needed(150_000.0, 50_000.0, R, 1, cov), 3, "standalone: the masters' worth");
    }

    #[test]
    fn pins_win() {
        let mut c = cfg();
        c.pin.push(super::super::Pin { key: None, prefix: Some("item:".into()), replicas: 8 });
        let mut d = Decider::default();
        assert_eq!(d.step(&c, "item:1", R, 1, KeyRate::flat(0.0), 3, cov, Instant::now()).unwrap().to, 8);
        assert_eq!(d.step(&c, "item:1", R, 8, KeyRate::flat(1e9), 3, cov, Instant::now()), None);
        assert_eq!(d.step(&c, "user:1", R, 1, KeyRate::flat(0.0), 3, cov, Instant::now()), None);
    }
}
