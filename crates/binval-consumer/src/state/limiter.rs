//! The miss rate limit of an instance's fills and its stale fallback (governor).

use super::*;

/// Settings of the miss rate limit and its stale fallback.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitSettings {
    /// Fills per second of the whole instance (burst: the same number); `None` = no limit.
    pub per_instance: Option<NonZeroU32>,
    /// Fills per second of one key (burst: the same number); `None` = no limit.
    pub per_key: Option<NonZeroU32>,
    /// How long the stale copy of an evicted entry is kept.
    pub stale_ttl: Duration,
    /// Bound of the stale copies, entries.
    pub stale_entries: u64,
    /// Bound of the per-key limiter states, entries.
    pub key_limiter_entries: u64,
}

impl LimitSettings {
    pub(super) fn enabled(&self) -> bool {
        self.per_instance.is_some() || self.per_key.is_some()
    }
}

/// The miss rate limit: an optional instance-wide GCRA limiter and optional per-key ones.
/// Per-key states live in a bounded moka cache and are dropped after 1 s without use — a
/// limiter idle that long has refilled its whole burst, so dropping it changes nothing.
pub(crate) struct Limiter {
    per_instance: Option<DefaultDirectRateLimiter>,
    per_key: Option<(Quota, Cache<String, Arc<DefaultDirectRateLimiter>>)>,
}

impl Limiter {
    pub(super) fn new(s: &LimitSettings) -> Self {
        Limiter {
            per_instance: s.per_instance.map(|n| RateLimiter::direct(Quota::per_second(n))),
            per_key: s.per_key.map(|n| {
                let states = Cache::builder().max_capacity(s.key_limiter_entries).time_to_idle(Duration::from_secs(1)).build();
                (Quota::per_second(n), states)
            }),
        }
    }

    /// `true` if a fill of `key` may read Redis now (and uses up one cell of each limit).
    /// The per-key limit is checked first, so a hot key that is over its own limit does not
    /// use up the instance-wide budget.
    pub(crate) fn admit(&self, key: &str) -> bool {
        if let Some((quota, states)) = &self.per_key {
            let l = states.get_with_by_ref(key, || Arc::new(RateLimiter::direct(*quota)));
            if l.check().is_err() {
                return false;
            }
        }
        if let Some(l) = &self.per_instance {
            if l.check().is_err() {
                return false;
            }
        }
        true
    }
}
