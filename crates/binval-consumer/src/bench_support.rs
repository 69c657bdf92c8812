//! What the `apply_batch` criterion bench (`benches/apply_batch.rs`) drives: the listener's
//! apply step on a local cache of its own, without Kafka or Redis. Not an API: hidden from the
//! docs, may change any time.

use std::sync::Arc;

use crate::listener::{decode_batch, decode_message};
use crate::state::{BatchScratch, Shared, SharedSettings};

/// A local cache with the builder's defaults (TTL 60 s without jitter, no miss rate limit,
/// no hot-key detection) and the listener's apply step.
pub struct ApplyBench {
    shared: Shared,
    scratch: std::cell::RefCell<BatchScratch>,
}

impl ApplyBench {
    /// A cache bounded at `max_entries`.
    pub fn new(max_entries: u64) -> Self {
        let shared = Shared::new(SharedSettings::plain(max_entries, 100_000, 16));
        ApplyBench { shared, scratch: Default::default() }
    }

    /// Cache `value` for `key` at `version`, as a fill would. `false` if the fill-race guard
    /// refused it.
    pub fn cache(&self, key: &str, value: &str, version: u64) -> bool {
        let v: Arc<str> = Arc::from(value);
        self.shared.try_cache(key, Some(&v), version, self.shared.epoch(), None)
    }

    /// Run the local cache's and the guard's pending maintenance (moka applies the bookkeeping
    /// of writes in batches, later): a bench's untimed setup calls it so the timed part does
    /// not pay for the setup's own inserts.
    pub fn settle(&self) {
        self.shared.local.run_pending_tasks();
        self.shared.guard.run_pending_tasks();
    }

    /// Whether `key` is cached.
    pub fn is_cached(&self, key: &str) -> bool {
        self.shared.local.contains_key(key)
    }

    /// The listener's step for one batch message: check the payload, apply its changes.
    /// Returns the changes applied, or `None` for a bad message.
    pub fn apply_batch_payload(&self, payload: &[u8]) -> Option<usize> {
        let b = decode_batch(Some(payload), usize::MAX).ok()?;
        self.shared.apply_batch_view(&b, &mut self.scratch.borrow_mut(), false);
        Some(b.change_count)
    }

    /// The listener's step for per-key JSON messages: parse each, then apply them as one
    /// batch. Returns the events applied.
    pub fn apply_json(&self, payloads: &[Vec<u8>]) -> usize {
        let events: Vec<_> = payloads.iter().filter_map(|p| decode_message(Some(p), usize::MAX).ok()).collect();
        self.shared.apply_batch(&events);
        events.len()
    }
}
