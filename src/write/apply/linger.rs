//! [`Linger`]: at ordinary rates, let a group gather transactions for a moment before its Redis
//! writes are sent (`apply.linger_ms`).
//!
//! # Why
//!
//! At 1,000 single-row commits/s the apply stage is idle most of the time, so each transaction
//! is a group of its own: one Lua script call per master, one Kafka produce, one checkpoint
//! step, and between them the wake-ups of the tasks and threads that carry them (tokio workers,
//! librdkafka's broker and polling threads). Measured with `perf` at that rate, those wake-ups,
//! not binval's own code, were most of the ~200 µs of CPU each transaction cost
//! (docs/benchmarks.md, "Where binval's CPU goes at 1,000 commits/s"). At the maximum rate the
//! same transactions cost ~50 µs because groups are large. Lingering makes groups large at
//! ordinary rates too: a group is sent at most every `linger_ms` while transactions arrive
//! faster than that, so at 1,000/s with the default 5 ms up to five transactions share one
//! script call, one produce and one checkpoint step (2.3 on average in the fan-out benchmark,
//! whose commits come in bursts).
//!
//! It is the same trade as Kafka's `linger.ms` and MySQL's `binlog_group_commit_sync_delay`:
//! up to `linger_ms` of added latency for fewer, larger writes. It is only made while
//! transactions arrive at least twice per `linger_ms` (the mean gap between them, an
//! exponentially weighted moving average, is at most half of it): at low rates nothing waits,
//! so a lone commit is applied as soon as it is read. While a group is in Redis, transactions
//! queue anyway, and a group that took longer than `linger_ms` is followed at once.

use std::time::{Duration, Instant};

/// The weight of the newest gap in the moving average of gaps between transactions (1/8, like
/// TCP's smoothed round-trip time, RFC 6298).
const NEWEST_GAP_WEIGHT: f64 = 0.125;

/// The mean gap assumed before any transaction was seen: longer than any linger, so the first
/// transactions of a tenure never wait.
const START_GAP: Duration = Duration::from_secs(1);

/// When the apply loop lets a group gather more transactions (see the module docs).
#[derive(Debug, Clone)]
pub struct Linger {
    /// `apply.linger_ms`; zero: never.
    linger: Duration,
    /// When the last transaction was received.
    last_arrival: Option<Instant>,
    /// Moving average of the gaps between transactions, seconds.
    mean_gap_secs: f64,
    /// When the last group was sent to Redis.
    last_group: Option<Instant>,
}

impl Linger {
    /// A linger of `linger` (zero: groups never wait).
    pub fn new(linger: Duration) -> Self {
        Linger { linger, last_arrival: None, mean_gap_secs: START_GAP.as_secs_f64(), last_group: None }
    }

    /// A transaction was received at `at`.
    pub fn arrived(&mut self, at: Instant) {
        if let Some(last) = self.last_arrival {
            let gap = at.saturating_duration_since(last).as_secs_f64();
            self.mean_gap_secs += NEWEST_GAP_WEIGHT * (gap - self.mean_gap_secs);
        }
        self.last_arrival = Some(at);
    }

    /// The mean gap between transactions received (the moving average).
    pub fn mean_gap(&self) -> Duration {
        Duration::from_secs_f64(self.mean_gap_secs.max(0.0))
    }

    /// Until when the group about to be sent at `now` may gather more transactions: `None`
    /// when it is sent at once (no linger, transactions arrive less often than twice per
    /// linger, or the last group was sent at least a linger ago).
    pub fn gather_until(&self, now: Instant) -> Option<Instant> {
        if self.linger.is_zero() || self.mean_gap() * 2 > self.linger {
            return None;
        }
        let until = self.last_group? + self.linger;
        (until > now).then_some(until)
    }

    /// A group was sent to Redis at `at`.
    pub fn sent(&mut self, at: Instant) {
        self.last_group = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Transactions every `gap` from `t0`, `n` of them; returns the time of the last.
    fn feed(l: &mut Linger, t0: Instant, gap: Duration, n: u32) -> Instant {
        let mut t = t0;
        for i in 0..n {
            t = t0 + gap * i;
            l.arrived(t);
        }
        t
    }

    #[test]
    fn zero_never_waits() {
        let mut l = Linger::new(Duration::ZERO);
        let t0 = Instant::now();
        let t = feed(&mut l, t0, Duration::from_micros(100), 200);
        l.sent(t);
        assert_eq!(l.gather_until(t), None);
    }

    #[test]
    fn a_lone_commit_never_waits() {
        let mut l = Linger::new(ms(5));
        let t0 = Instant::now();
        l.arrived(t0);
        assert_eq!(l.gather_until(t0), None, "no gap measured yet: the start gap is 1 s");
        // 10 commits/s: the mean gap stays far above half the linger.
        let t = feed(&mut l, t0, ms(100), 100);
        l.sent(t);
        assert_eq!(l.gather_until(t), None);
    }

    #[test]
    fn a_steady_rate_waits_until_a_linger_after_the_last_group() {
        let mut l = Linger::new(ms(5));
        let t0 = Instant::now();
        // 1,000 commits/s for 100 ms: the moving average comes down from 1 s to ~1 ms.
        let t = feed(&mut l, t0, ms(1), 100);
        assert!(l.mean_gap() < ms(2), "{:?}", l.mean_gap());
        l.sent(t);
        assert_eq!(l.gather_until(t + ms(1)), Some(t + ms(5)));
        // A group that took longer than the linger is followed at once.
        assert_eq!(l.gather_until(t + ms(6)), None);
    }

    #[test]
    fn the_rate_falling_stops_the_wait() {
        let mut l = Linger::new(ms(5));
        let t0 = Instant::now();
        let t = feed(&mut l, t0, ms(1), 100);
        l.sent(t);
        // Then 20 commits/s: a few gaps of 50 ms lift the average above 2.5 ms.
        let t = feed(&mut l, t + ms(50), ms(50), 3);
        l.sent(t);
        assert_eq!(l.gather_until(t + ms(1)), None, "{:?}", l.mean_gap());
    }

    #[test]
    fn nothing_sent_yet_never_waits() {
        let mut l = Linger::new(ms(5));
        let t0 = Instant::now();
        let t = feed(&mut l, t0, ms(1), 100);
        assert_eq!(l.gather_until(t), None);
    }
}
