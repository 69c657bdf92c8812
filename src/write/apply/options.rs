//! [`ApplyOptions`]: what differs between `binval run` and `binval replay` when they apply.

use crate::error::Error;
use crate::redis::RedisConn;
use crate::write::group::Group;

/// A rate limiter of key changes per second (`binval replay --rate`).
pub type RateLimiter = governor::DefaultDirectRateLimiter;

/// How [`Writer::apply_transaction`] behaves; [`ApplyOptions::run`] and
/// [`ApplyOptions::replay`] are the two uses.
pub struct ApplyOptions {
    /// Read the key's version token and replica positions, print one [`DryRunLine`] per key
    /// change, and write nothing (no Redis writes, no events, no table invalidations).
    pub dry_run: bool,
    /// Publish events only for key changes that moved a replica or a version token (replay:
    /// consumers need no notice of a no-op). Run publishes every key change's event.
    pub events_only_if_moved: bool,
    /// Publish a `truncate` event per key template of a table-wide invalidation (run). Replay
    /// publishes none: the live run published them.
    pub table_events: bool,
    /// Await the deliveries of each group (and of each chunk of a large transaction) before
    /// returning (replay); run hands them to the checkpoint task instead ([`Pending`]).
    pub await_deliveries: bool,
    /// At most this many key changes per second (a transaction larger than one second's quota
    /// passes alone).
    pub limiter: Option<RateLimiter>,
    /// Redis key of the source's fencing token counter: when set, a write refused under an
    /// older fencing token ([`TransientError::LeaseLost`]: a new tenure began) reads the
    /// current token and retries once (replay, which holds no lease). Unset: the error ends
    /// the tenure (run).
    pub refresh_fencing_token: Option<String>,
    /// Publish invalidation events at all (run, replay, verify's repair). `false`: Redis only,
    /// no Kafka needed (`binval bootstrap` without `--publish`: no app instance holds a value
    /// of a key that was never written).
    pub publish_events: bool,
    /// Reviews each group's key changes before the fenced writes and may replace them
    /// (`binval replay`: never write a payload the database no longer has; see
    /// `commands::replay::guard`). `None`: written as they are.
    pub guard: Option<Box<dyn ChangeGuard>>,
}

/// What [`ApplyOptions::guard`] is: given a group about to be written, `Ok(None)` writes it as
/// it is, `Ok(Some(g))` writes `g` instead (its changes, positions and event transactions).
pub trait ChangeGuard: Send + Sync {
    /// Review `group` (read Redis through `redis` as needed).
    fn review<'a>(&'a mut self, redis: &'a RedisConn, group: &'a Group) -> futures::future::BoxFuture<'a, Result<Option<Group>, Error>>;
}

impl ApplyOptions {
    /// `binval run`: every event published, deliveries handed on, a lost lease stops.
    pub fn run() -> Self {
        ApplyOptions {
            dry_run: false,
            events_only_if_moved: false,
            table_events: true,
            await_deliveries: false,
            limiter: None,
            refresh_fencing_token: None,
            publish_events: true,
            guard: None,
        }
    }

    /// `binval replay`: events only for changes that moved something, no table events,
    /// deliveries awaited per transaction, the fencing token refreshed on a takeover.
    pub fn replay(dry_run: bool, rate: Option<u32>, fencing_token_key: String) -> Self {
        let limiter = rate.and_then(std::num::NonZeroU32::new).map(|r| governor::RateLimiter::direct(governor::Quota::per_second(r)));
        ApplyOptions {
            dry_run,
            events_only_if_moved: true,
            table_events: false,
            await_deliveries: true,
            limiter,
            refresh_fencing_token: Some(fencing_token_key),
            publish_events: true,
            guard: None,
        }
    }

    /// `binval bootstrap` and `binval verify --repair`: rows read in a consistent snapshot,
    /// written at the snapshot's fence position beside a live run (like replay: no lease, the
    /// fencing token refreshed on a takeover, deliveries awaited); events only for keys that
    /// moved, and only when `publish` (bootstrap's `--publish`; repair always). The rate is
    /// limited by the caller, per row.
    pub fn snapshot_writes(dry_run: bool, publish: bool, fencing_token_key: String) -> Self {
        ApplyOptions {
            dry_run,
            events_only_if_moved: true,
            table_events: false,
            await_deliveries: true,
            limiter: None,
            refresh_fencing_token: Some(fencing_token_key),
            publish_events: publish,
            guard: None,
        }
    }
}
