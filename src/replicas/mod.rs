//! Adaptive replica counts: a key of a mapping with `replicas = { min, max }` lives in `min`
//! suffix replicas until the fleet reads it faster than one Redis master should serve, then
//! gets as many as its read rate needs, and goes back to `min` once it has cooled.
//!
//! # Why
//!
//! A static `replicas = 8` gives every row 8 copies (a 1,000,000-row table: 8,000,000 hashes)
//! and costs 9 fenced script calls per change, while a few keys of a table are ever hot, and
//! a key that turns hot in a table mapped with one replica pins one master: the incident
//! binval exists for. The practice this automates: shard *the* hot key, sized as "its read
//! rate / what one master should serve of it", found from sampled per-key read counts.
//!
//! # The parts (one file each)
//!
//! | file | what |
//! |------|------|
//! | [`counts`] | the count of every key above `min`, shared with the mapping (each change writes that many replicas and records the count in field `n`), and where it is kept: `binval:{<source>}:replicas` (decisions, survive restarts and lease handovers) and `binval:hot` (the index app instances load at start) |
//! | [`heat`] | the fleet's heat reports (`binval:heat:{0..15}`, written by `binval-consumer`), summed per key |
//! | [`decide`] | from a key's fleet read rate to its count: the per-master read budget, hysteresis, cool-down, pins |
//! | [`resize`] | the Redis side of a count change: copy replica 0 into new replicas, announce a count, remove replicas a smaller count no longer has |
//! | [`task`] | the leader's loop: read the heat, decide, hand count changes to the apply loop, keep the decisions |
//!
//! # How a count changes without readers noticing
//!
//! Count changes run *inside* the apply loop (`write::apply::apply_loop`), between groups,
//! after every group sent before them is done, so each change of a key is written with one
//! count and no copy races a change in flight:
//!
//! * **grow** `a -> b`: from now on every change of the key writes `b` replicas with
//!   `n = b`; replicas `a..b` are copied from replica 0 *at its own fence position* through the
//!   fenced replica script (a change committed meanwhile has a newer position and wins, and the
//!   copy of a record that a newer change already reached is refused); then `n = b` is set on
//!   replicas `0..a`. Readers use replica `i` only once a record told them `n > i`, and a
//!   replica they find missing sends them to replica 0, which exists whenever the key does.
//! * **shrink** `b -> a`: first announced: `n = a` on every replica and in the hot set, while
//!   changes still write all `b` replicas (with `n = a`); after `shrink_grace_ms` (longer than
//!   the readers' staleness bound), changes write `a` replicas and replicas `a..b` are removed.
//!   A reader that still reads a removed replica finds it missing and reads replica 0.
//!
//! Invariants (`docs/design.md`): I1 holds because the version token of a change moves only
//! after the replicas *of that change's count* are written; copies never move a token. I2:
//! copies and writes are fenced by position and fencing token. I3/kill -9: a decision is
//! stored before it is applied, and applying it again is a no-op (copies at an equal position
//! are refused, removals of absent keys count 0), so a restart finishes what a crash cut short.

pub mod counts;
pub mod decide;
pub mod heat;
pub mod resize;
pub mod task;

use serde::Deserialize;

pub use counts::{KeyCount, ReplicaCounts};

/// `[adaptive]`: how the counts of adaptive mappings (`replicas = { min, max }`) follow the
/// fleet's reads. Only the leader (`binval run` holding the lease) decides; every other command
/// uses the decisions it finds.
///
/// ```toml
/// [adaptive]
/// read_budget_per_master = 50000   # reads/s of one key that one master should serve
/// cool_down_secs = 60              # a key must need fewer copies this long before it shrinks
/// [[adaptive.pin]]
/// key = "item:detail:6666"          # or prefix = "item:detail:"
/// replicas = 8
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConfig {
    /// Reads per second of *one key* that one Redis master should serve. A key read at `R`
    /// reads/s over the fleet gets enough replicas to cover `ceil(R / budget)` masters (every
    /// master of the Cluster, at most). Default 50,000: a master serves ~100k-150k simple
    /// commands/s on one core and was pinned at 92-98 % CPU by one key at 380k-480k reads/s in
    /// the incident reports behind `docs/design.md`, so 50k leaves room for the rest of its
    /// keys; a key at 400k reads/s gets 8 copies, the usual manual sharding (`:shard:0..7`).
    #[serde(default = "default_budget")]
    pub read_budget_per_master: f64,
    /// How long a key must need fewer copies than it has before it shrinks, seconds. Default 60.
    #[serde(default = "default_cool_down_secs")]
    pub cool_down_secs: u64,
    /// A key grows when its rate exceeds what its copies cover; it shrinks only when its rate
    /// times this factor fits fewer copies (hysteresis, so a key at the edge does not flap).
    /// Default 1.5.
    #[serde(default = "default_shrink_headroom")]
    pub shrink_headroom: f64,
    /// Between announcing a smaller count and removing the replicas it no longer has, ms:
    /// longer than the readers' staleness bound, so every reader has had the chance to learn
    /// it. Default 10,000.
    #[serde(default = "default_shrink_grace_ms")]
    pub shrink_grace_ms: u64,
    /// How often the leader reads the fleet's heat reports, ms. Default 500.
    #[serde(default = "default_poll_interval_ms")]
    pub poll_interval_ms: u64,
    /// Heat reports older than this are not counted, ms (an instance that stopped reporting
    /// reads nothing). Default 5,000; fields 10 times older are deleted.
    #[serde(default = "default_report_max_age_ms")]
    pub report_max_age_ms: u64,
    /// Keys or key prefixes whose count is fixed by the operator, whatever their reads.
    #[serde(default)]
    pub pin: Vec<Pin>,
}

/// `[[adaptive.pin]]`: one key (`key`) or every key starting with `prefix`, held at `replicas`
/// copies (within `1..=64`; a pin may go above its mapping's `max`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// An exact logical key.
    #[serde(default)]
    pub key: Option<String>,
    /// A key prefix.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The count.
    pub replicas: u32,
}

impl Pin {
    /// True when the pin applies to `key`.
    pub fn matches(&self, key: &str) -> bool {
        self.key.as_deref() == Some(key) || self.prefix.as_deref().is_some_and(|p| key.starts_with(p))
    }
}

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            read_budget_per_master: default_budget(),
            cool_down_secs: default_cool_down_secs(),
            shrink_headroom: default_shrink_headroom(),
            shrink_grace_ms: default_shrink_grace_ms(),
            poll_interval_ms: default_poll_interval_ms(),
            report_max_age_ms: default_report_max_age_ms(),
            pin: Vec::new(),
        }
    }
}

impl AdaptiveConfig {
    /// Check the values; the error is `(field, reason)`, the field relative to `[adaptive]`.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |f: &str, r: String| Err((f.to_string(), r));
        if !(self.read_budget_per_master.is_finite() && self.read_budget_per_master >= 1.0) {
            return bad("read_budget_per_master", format!("{} must be a number of reads/s >= 1", self.read_budget_per_master));
        }
        if !(self.shrink_headroom.is_finite() && self.shrink_headroom >= 1.0) {
            return bad("shrink_headroom", format!("{} must be >= 1", self.shrink_headroom));
        }
        if self.poll_interval_ms == 0 {
            return bad("poll_interval_ms", "must be > 0".into());
        }
        if self.report_max_age_ms < self.poll_interval_ms {
            return bad(
                "report_max_age_ms",
                format!("{} must be at least poll_interval_ms ({})", self.report_max_age_ms, self.poll_interval_ms),
            );
        }
        for (i, p) in self.pin.iter().enumerate() {
            if p.key.is_some() == p.prefix.is_some() {
                return bad(&format!("pin[{i}]"), "give exactly one of `key` and `prefix`".into());
            }
            if p.replicas == 0 || p.replicas > binval_protocol::adaptive::MAX_REPLICAS {
                return bad(
                    &format!("pin[{i}].replicas"),
                    format!("{} is out of range 1..={}", p.replicas, binval_protocol::adaptive::MAX_REPLICAS),
                );
            }
        }
        Ok(())
    }

    /// The pin that applies to `key`, the first listed.
    pub fn pin_of(&self, key: &str) -> Option<u32> {
        self.pin.iter().find(|p| p.matches(key)).map(|p| p.replicas)
    }
}

fn default_budget() -> f64 {
    50_000.0
}
fn default_cool_down_secs() -> u64 {
    60
}
fn default_shrink_headroom() -> f64 {
    1.5
}
fn default_shrink_grace_ms() -> u64 {
    10_000
}
fn default_poll_interval_ms() -> u64 {
    500
}
fn default_report_max_age_ms() -> u64 {
    5_000
}
