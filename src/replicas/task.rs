//! The leader's loop: every `poll_interval_ms`, read the fleet's heat, decide each key's
//! count, store the decision, and hand the change to the apply loop, which applies it between
//! groups ([`apply`]); remove the extra replicas of an announced shrink once its grace is over.
//! At the start of a tenure it first finishes what the stored decisions started (a crash or a
//! lease handover may have cut a change short; each step is idempotent).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::counts::{self, KeyCount, Stored};
use super::decide::{Decider, KeyRate};
use super::resize::{self, Resized};
use super::{heat, AdaptiveConfig};
use crate::config::Replicas;
use crate::error::{Error, TransientError};
use crate::mapping::Mapper;
use crate::redis::RedisConn;
use crate::telemetry::names;

/// One step of a count change, applied by the apply loop between groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountOp {
    /// Changes write `to` replicas from now on; replicas `from..to` are copied from replica 0,
    /// then `n = to` is set on `0..from`.
    Grow {
        /// Replicas that exist (and every change writes) now.
        from: u32,
        /// The new count.
        to: u32,
    },
    /// Changes keep writing `write` replicas but record `n = to`, and `n = to` is set on the
    /// replicas `0..write` (the first step of a shrink, or taking back part of one).
    Announce {
        /// Replicas every change writes.
        write: u32,
        /// The count readers are told.
        to: u32,
    },
    /// Changes write `to` replicas from now on; replicas `to..write` are removed (the second
    /// step of a shrink, after its grace).
    Remove {
        /// Replicas that exist now.
        write: u32,
        /// The count, already announced.
        to: u32,
    },
}

impl CountOp {
    /// What the key's changes write once this step is taken; `None` when that is the mapping's
    /// `min` with nothing extra (the key leaves [`super::ReplicaCounts`]).
    pub fn after(self, min: u32) -> Option<KeyCount> {
        let c = match self {
            CountOp::Grow { to, .. } | CountOp::Remove { to, .. } => KeyCount { count: to, write: to },
            CountOp::Announce { write, to } => KeyCount { count: to, write: write.max(to) },
        };
        (c.count != min || c.write != min).then_some(c)
    }

    fn label(self) -> &'static str {
        match self {
            CountOp::Grow { .. } => "grow",
            CountOp::Announce { .. } => "announce",
            CountOp::Remove { .. } => "remove",
        }
    }
}

/// A count change handed to the apply loop, answered through `done`.
#[derive(Debug)]
pub struct CountCommand {
    /// The logical key.
    pub key: String,
    /// The key's mapping's `min`.
    pub min: u32,
    /// The step.
    pub op: CountOp,
    /// The outcome.
    pub done: oneshot::Sender<Result<Resized, Error>>,
}

/// Take the step `op` for `key` in Redis (the apply loop calls this after setting the key's
/// count in the mapping and finishing the groups in flight).
pub async fn apply(redis: &RedisConn, source: &str, token: u64, key: &str, op: CountOp) -> Result<Resized, Error> {
    let r = match op {
        CountOp::Grow { from, to } => resize::grow(redis, source, key, from, to, token).await?,
        CountOp::Announce { write, to } => {
            Resized { announced: resize::announce(redis, source, key, 0..write, to, token).await?, ..Resized::default() }
        }
        CountOp::Remove { write, to } => {
            Resized { removed: resize::remove(redis, source, key, to..write, token).await?, ..Resized::default() }
        }
    };
    metrics::counter!(names::ADAPTIVE_COUNT_CHANGES, "step" => op.label()).increment(1);
    tracing::info!(key, step = op.label(), ?op, copied = r.copied, announced = r.announced, removed = r.removed, "replica count changed");
    Ok(r)
}

/// The leader's adaptive-count task (module docs).
pub struct Leader {
    /// `[adaptive]`.
    pub cfg: AdaptiveConfig,
    /// The mapping (its adaptive rules, and the counts it writes with).
    pub mapper: Arc<Mapper>,
    /// Redis.
    pub redis: RedisConn,
    /// `source.name`.
    pub source: String,
    /// To the apply loop.
    pub tx: mpsc::Sender<CountCommand>,
}

impl Leader {
    /// Run until `stop`; `stored` are the decisions loaded at the start of the tenure (already
    /// in the mapping's counts). Ends with an error only when the lease is lost; Redis errors
    /// of a round are logged and the round is tried again at the next interval.
    pub async fn run(self, stored: Vec<(String, Stored)>, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
        let mut stored: HashMap<String, Stored> = stored.into_iter().collect();
        let mut decider = Decider::default();
        // Finish what the stored decisions started (the first round takes these steps).
        let mut pending: Vec<(String, u32, CountOp)> = Vec::new();
        for (key, s) in &stored {
            let Some(r) = self.mapper.adaptive_rule_of(key) else { continue };
            let op = if s.w > s.n { CountOp::Announce { write: s.w, to: s.n } } else { CountOp::Grow { from: r.min, to: s.n } };
            if s.n.max(s.w) > r.min {
                pending.push((key.clone(), r.min, op));
            }
        }
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.poll_interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut warned = false;
        let cool_down = Duration::from_secs(self.cfg.cool_down_secs);
        loop {
            // A round at the next poll, or when a cool-down clock runs out before it.
            let due = decider.next_due(cool_down, Instant::now());
            let at_due = async move {
                match due {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                _ = at_due => {}
                _ = stop.wait_for(|v| *v) => return Ok(()),
            }
            match self.round(&mut stored, &mut decider, &mut pending, &mut stop).await {
                Ok(true) => warned = false,
                Ok(false) => return Ok(()),
                Err(e @ Error::Transient(TransientError::LeaseLost { .. })) => return Err(e),
                Err(e) if !warned => {
                    tracing::warn!(error = %e, "adaptive replica counts: this round failed; trying again at the next interval");
                    warned = true;
                }
                Err(_) => {}
            }
        }
    }

    /// One round: heat, decisions, removals; `false` when the tenure stopped meanwhile.
    async fn round(
        &self,
        stored: &mut HashMap<String, Stored>,
        decider: &mut Decider,
        pending: &mut Vec<(String, u32, CountOp)>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, Error> {
        // Steps that failed in an earlier round (or that a restart must finish) come first.
        while let Some((key, min, op)) = pending.first().cloned() {
            if self.send(&key, min, op, stop).await?.is_none() {
                return Ok(false);
            }
            pending.remove(0);
        }
        let now_ms = unix_ms();
        let heat = heat::read(&self.redis, now_ms, self.cfg.report_max_age_ms).await?;
        for (hash, field, reason) in &heat.bad {
            tracing::warn!(hash = %hash, instance = %field, reason = %reason, "a heat report does not parse; not counted");
        }
        metrics::gauge!(names::ADAPTIVE_REPORTING_INSTANCES).set(heat.instances as f64);
        let keys: BTreeSet<String> = heat
            .rates
            .keys()
            .filter(|k| self.mapper.adaptive_rule_of(k).is_some())
            .chain(stored.keys())
            .chain(self.cfg.pin.iter().filter_map(|p| p.key.as_ref()))
            .cloned()
            .collect();
        let masters = self.redis.with_slot_map(|m| m.masters().len()).unwrap_or(1).max(1);
        let now = Instant::now();
        // How far behind the reads this round's reports may be (the same for every key).
        let behind = Duration::from_millis(heat.oldest_report_age_ms).min(super::decide::MAX_REPORT_LAG) + super::decide::RECENT_WINDOW;
        let mut at_max = 0usize;
        for key in &keys {
            let Some(r) = self.mapper.adaptive_rule_of(key) else { continue };
            let steady = heat.rates.get(key).copied().unwrap_or(0.0);
            let hot_ago =
                heat.hot_at_ms.get(key).map(|at| Duration::from_millis(now_ms.saturating_sub(*at)).min(super::decide::MAX_REPORT_LAG));
            let rate = KeyRate { steady, recent: heat.recent.get(key).copied().unwrap_or(steady), behind, hot_ago };
            let cur = self.mapper.counts().get(key).unwrap_or(KeyCount { count: r.min, write: r.min });
            let covered = |n: u32| self.covered(key, n);
            if cur.count >= r.max && steady > self.cfg.read_budget_per_master * covered(cur.count) as f64 {
                at_max += 1;
            }
            if let Some(d) = decider.step(&self.cfg, key, r, cur.count, rate, masters, covered, now) {
                let (op, s) = if d.to > cur.count {
                    let op = if d.to <= cur.write {
                        CountOp::Announce { write: cur.write, to: d.to }
                    } else {
                        CountOp::Grow { from: cur.write, to: d.to }
                    };
                    let w = cur.write.max(d.to);
                    let remove_at_ms = (w > d.to).then(|| stored.get(key).and_then(|s| s.remove_at_ms).unwrap_or(now_ms));
                    (op, Stored { n: d.to, w, at_ms: now_ms, why: d.why, reads_per_sec: steady, remove_at_ms })
                } else {
                    let remove_at_ms = Some(now_ms + self.cfg.shrink_grace_ms);
                    let s = Stored { n: d.to, w: cur.write, at_ms: now_ms, why: d.why, reads_per_sec: steady, remove_at_ms };
                    (CountOp::Announce { write: cur.write, to: d.to }, s)
                };
                tracing::info!(key = %key, from = cur.count, to = s.n, why = %s.why, "replica count decided");
                // Stored before it is applied: a restart finishes it.
                counts::store(&self.redis, &self.source, key, Some(&s)).await?;
                stored.insert(key.clone(), s);
                pending.push((key.clone(), r.min, op));
                if self.send(key, r.min, op, stop).await?.is_none() {
                    return Ok(false);
                }
                pending.pop();
            } else if let Some(s) = stored.get_mut(key) {
                s.reads_per_sec = steady;
            }
            // The grace of an announced shrink is over: remove the extra replicas.
            let due = stored.get(key).filter(|s| s.w > s.n && s.remove_at_ms.is_some_and(|t| t <= now_ms)).cloned();
            if let Some(s) = due {
                let op = CountOp::Remove { write: s.w, to: s.n };
                pending.push((key.clone(), r.min, op));
                if self.send(key, r.min, op, stop).await?.is_none() {
                    return Ok(false);
                }
                pending.pop();
                if s.n == r.min {
                    counts::store(&self.redis, &self.source, key, None).await?;
                    stored.remove(key);
                } else {
                    let s = Stored { w: s.n, remove_at_ms: None, ..s };
                    counts::store(&self.redis, &self.source, key, Some(&s)).await?;
                    stored.insert(key.clone(), s);
                }
            }
        }
        decider.retain(|k| keys.contains(k));
        metrics::gauge!(names::ADAPTIVE_AT_MAX).set(at_max as f64);
        Ok(true)
    }

    /// Masters holding replicas `0..n` of `key` (per the slot map; `n` on standalone Redis).
    fn covered(&self, key: &str, n: u32) -> usize {
        self.redis
            .with_slot_map(|m| binval_protocol::placement::Placement::of(key, n, |s| m.master_of_slot(s)).masters())
            .unwrap_or(n as usize)
    }

    /// Hand `op` to the apply loop and wait for it; `None` when the tenure stopped first.
    async fn send(&self, key: &str, min: u32, op: CountOp, stop: &mut watch::Receiver<bool>) -> Result<Option<Resized>, Error> {
        let (done, rx) = oneshot::channel();
        let cmd = CountCommand { key: key.to_string(), min, op, done };
        if self.tx.send(cmd).await.is_err() {
            return Ok(None);
        }
        tokio::select! {
            r = rx => match r {
                Ok(r) => r.map(Some),
                Err(_) => Ok(None),
            },
            _ = stop.wait_for(|v| *v) => Ok(None),
        }
    }
}

/// Now, Unix ms.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The replicas of `r` a key has when nothing is stored for it.
pub fn default_count(r: Replicas) -> KeyCount {
    KeyCount { count: r.min, write: r.min }
}
