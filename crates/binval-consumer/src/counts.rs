//! Adaptive replica counts, the reader's side ([`binval_protocol::adaptive`], issue #23): how
//! many suffix replicas this instance believes a key has, learned from the records it reads.
//!
//! # Why the data decides
//!
//! binval's leader grows a hot key's count and shrinks it when the key cools; every replica
//! record carries the key's current count in field `n`. A reader's configured count
//! ([`crate::ConsumerBuilder::replicas`], [`crate::ConsumerBuilder::replicas_for_prefix`]) is
//! only where it starts: each replica read that carries `n` corrects it at once, so a key that
//! grew spreads from the next fill, and one that shrank stops reading removed replicas. The
//! hot set (`binval:hot`, loaded at start and refreshed) seeds the counts of keys that are
//! already hot before this instance reads them.
//!
//! # Bounded
//!
//! Only keys whose learned count differs from the configured one take an entry, in a bounded
//! moka cache ([`LEARNED_COUNT_ENTRIES`]): a key that falls out of it is read with its
//! configured count again until its next read corrects it. A count that is too large is
//! harmless (a missing replica sends the read to replica 0, see `read.rs`); one that is too
//! small spreads less until the next read.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use moka::sync::Cache;
use tracing::warn;

use crate::state::{now_ms, LocalHasher};

/// Bound of the learned replica counts, entries (keys whose count differs from the configured
/// one). A few ten thousand: the keys an instance reads that binval spread are its hot keys,
/// far fewer than that.
pub const LEARNED_COUNT_ENTRIES: u64 = 50_000;

/// The replica count of every key as this instance knows it.
pub(crate) struct ReplicaCounts {
    default: u32,
    /// Sorted longest prefix first.
    prefixes: Vec<(String, u32)>,
    learned: Cache<String, u32, LocalHasher>,
}

impl ReplicaCounts {
    /// `prefixes` in any order; `capacity` bounds the learned entries.
    pub(crate) fn new(default: u32, mut prefixes: Vec<(String, u32)>, capacity: u64) -> Self {
        // Longest prefix first, so the first match is the longest.
        prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        let learned = Cache::builder().max_capacity(capacity.max(1)).build_with_hasher(LocalHasher::default());
        ReplicaCounts { default, prefixes, learned }
    }

    /// The configured count of `key`: the longest matching prefix, else the default.
    pub(crate) fn configured(&self, key: &str) -> u32 {
        self.prefixes.iter().find(|(p, _)| key.starts_with(p.as_str())).map_or(self.default, |(_, n)| *n)
    }

    /// The count a fill of `key` uses now: the learned one (from a record or the hot set), else
    /// the configured one.
    pub(crate) fn count(&self, key: &str) -> u32 {
        self.learned.get(key).unwrap_or_else(|| self.configured(key))
    }

    /// A record (or the hot set) said `key` has `n` replicas (already checked to be in
    /// `1..=MAX_REPLICAS`).
    pub(crate) fn learn(&self, key: &str, n: u32) {
        if n == self.configured(key) {
            if self.learned.contains_key(key) {
                self.learned.invalidate(key);
            }
        } else if self.learned.get(key) != Some(n) {
            self.learned.insert(key.to_string(), n);
        }
    }

    /// A hot-set entry: taken unless a record already told this instance the key's count (the
    /// records are at least as new as the hot set, which the leader writes after them).
    pub(crate) fn seed(&self, key: &str, n: u32) {
        if !self.learned.contains_key(key) {
            self.learn(key, n);
        }
    }

    /// Number of learned entries (after moka's pending work: exact at the time of the call).
    pub(crate) fn entries(&self) -> u64 {
        self.learned.run_pending_tasks();
        self.learned.entry_count()
    }
}

/// At most one warning per `every_ms` of one kind (bad data on a hot key would otherwise log on
/// every read).
pub(crate) struct WarnEvery {
    last_ms: AtomicU64,
    every_ms: u64,
}

impl WarnEvery {
    pub(crate) const fn new(every_ms: u64) -> Self {
        WarnEvery { last_ms: AtomicU64::new(0), every_ms }
    }

    /// `true` when a warning may be logged now (and then not again for `every_ms`).
    pub(crate) fn ready(&self) -> bool {
        let now = now_ms();
        let last = self.last_ms.load(Relaxed);
        (last == 0 || now.saturating_sub(last) >= self.every_ms)
            && self.last_ms.compare_exchange(last, now.max(1), Relaxed, Relaxed).is_ok()
    }
}

static BAD_COUNT: WarnEvery = WarnEvery::new(10_000);

/// Field `n` of the replica record `rkey` as read (`None` = absent), parsed; a value that is
/// not a count is a warning naming the key and the value (at most one per 10 s) and counts as
/// "no count information", never as a failed read.
pub(crate) fn record_count(rkey: &str, raw: Option<&[u8]>) -> Option<u32> {
    match binval_protocol::adaptive::parse_count(raw) {
        Ok(n) => n,
        Err(reason) => {
            if BAD_COUNT.ready() {
                warn!(key = rkey, "replica record ignored as a replica count source: {reason}");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learned_counts_override_the_configured_ones_and_stay_bounded() {
        let c = ReplicaCounts::new(1, vec![("item:".into(), 2), ("item:detail:".into(), 8)], 100);
        assert_eq!((c.count("item:detail:1"), c.count("item:x"), c.count("other")), (8, 2, 1));
        c.learn("other", 8);
        c.learn("item:detail:1", 1);
        assert_eq!((c.count("other"), c.count("item:detail:1")), (8, 1));
        assert_eq!(c.entries(), 2);
        // Back to the configured count: the entry goes, the count stays right.
        c.learn("other", 1);
        assert_eq!(c.count("other"), 1);
        assert_eq!(c.entries(), 1);
        // The hot set does not override what a record said.
        c.seed("item:detail:1", 16);
        assert_eq!(c.count("item:detail:1"), 1);
        c.seed("hot:1", 16);
        assert_eq!(c.count("hot:1"), 16);
        // Bounded: many keys, at most the capacity kept.
        for i in 0..1000 {
            c.learn(&format!("k:{i}"), 4);
        }
        assert!(c.entries() <= 100, "{}", c.entries());
    }

    #[test]
    fn record_counts_parse_and_bad_ones_are_no_information() {
        assert_eq!(record_count("k:r0", Some(b"8")), Some(8));
        assert_eq!(record_count("k:r0", None), None);
        for bad in [&b"0"[..], b"65", b"x", b"-1", b"8 ", b"\xff"] {
            assert_eq!(record_count("k:r0", Some(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn warnings_are_rate_limited() {
        let w = WarnEvery::new(60_000);
        assert!(w.ready());
        assert!(!w.ready());
    }
}
