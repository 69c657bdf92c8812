//! `binval check`'s placement report: per mapping and key template, how the N suffix replicas
//! of sampled keys spread over the Redis Cluster's current masters, and warnings where they
//! cannot spread a hot key's reads.
//!
//! # Why
//!
//! A key's replicas live in the hash slots of `K:r0..K:r{N-1}`, so on the masters that own those
//! slots — effectively at random. App instances read master-balanced (binval-consumer picks a
//! master uniformly among those holding one of the key's replicas, then a replica on it,
//! `binval_protocol::placement`), so a hot key's reads load evenly exactly the masters its
//! replicas cover, and none of the others. With N below the number of masters M no key can
//! cover them all; with N = M a key covers them all only when its N slots fall on N different
//! masters. (Replica keys differ only in their index digits, which CRC16 spreads over the slot
//! range in a fixed pattern, so the real figures are not those of random slots: 8 replicas of
//! sequential ids covered all 3 masters of a 3-master cluster for every sampled key.) The report
//! shows, per template, how many sampled keys cover how many masters and what that means for
//! the busiest master (max/mean of reads per master), next to what uniform replica choice
//! would give.
//!
//! # Which keys
//!
//! Keys that exist: `SCAN MATCH <template glob>:ver` on every master (a key's version token
//! names it once, whatever N), at most [`SCAN_CALLS`] calls per master and template, until
//! [`SAMPLE_KEYS`] keys. A template with no key in Redis yet (a new mapping) is reported on
//! keys rendered with `1..=SAMPLE_KEYS` for every column, and says so: slots are a hash of the
//! key text, so any plausible keys show the same distribution.

use std::borrow::Cow;

use binval_protocol::placement::Placement;
use binval_protocol::KeyTemplate;

use crate::config::MappingConfig;
use crate::error::{Error, TransientError};
use crate::redis::RedisConn;

/// Keys sampled per key template.
pub const SAMPLE_KEYS: usize = 200;

/// `SCAN` calls per master and template at most (`COUNT 1000` each).
pub const SCAN_CALLS: usize = 20;

/// The placement of one key template's sampled keys.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplatePlacement {
    /// `mappings[i].keys[k]`.
    pub field: String,
    /// The key template.
    pub template: String,
    /// The mapping's replica count N.
    pub replicas: u32,
    /// Masters of the cluster M.
    pub masters: usize,
    /// Keys looked at.
    pub sampled: usize,
    /// `true` when no key of the template was found in Redis and rendered keys were used.
    pub synthetic: bool,
    /// `covering[c]`: keys whose replicas are on exactly `c` masters (`c` = 0..=M).
    pub covering: Vec<usize>,
    /// Mean over the keys of max/mean reads per master with master-balanced reads (1.0: every
    /// master equally loaded by every key).
    pub balanced_mean: f64,
    /// The worst key's max/mean with master-balanced reads.
    pub balanced_worst: f64,
    /// Mean over the keys of max/mean with a replica chosen uniformly (for comparison).
    pub uniform_mean: f64,
}

impl TemplatePlacement {
    /// Keys whose replicas cover fewer masters than they could (`min(N, M)`).
    pub fn under_covered(&self) -> usize {
        let could = (self.replicas as usize).min(self.masters);
        self.covering.iter().take(could).sum()
    }

    /// The report line.
    pub fn line(&self) -> String {
        let mut spread: Vec<String> = Vec::new();
        for (c, &n) in self.covering.iter().enumerate().rev() {
            if n > 0 {
                let what = if c == 1 { "1 master".to_string() } else { format!("{c} masters") };
                spread.push(format!("{what} for {n} ({:.0}%)", 100.0 * n as f64 / self.sampled.max(1) as f64));
            }
        }
        format!(
            "placement: {} `{}`: {} replicas over {} masters, {} keys {}: replicas on {}; reads per master max/mean {:.2} (worst key {:.2}), uniform replica choice would give {:.2}",
            self.field,
            self.template,
            self.replicas,
            self.masters,
            self.sampled,
            if self.synthetic { "rendered with ids 1.. (none in Redis yet)" } else { "sampled from Redis" },
            spread.join(", "),
            self.balanced_mean,
            self.balanced_worst,
            self.uniform_mean,
        )
    }

    /// Warnings: N below the masters (N > 1: a mapping with one replica does not spread keys
    /// at all and is reported as such), keys whose replicas cover too few masters.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let (n, m) = (self.replicas as usize, self.masters);
        if n == 1 && m > 1 {
            out.push(format!(
                "note: {} `{}`: replicas = 1, each key's reads go to one master (set replicas >= {m} for tables with hot keys)",
                self.field, self.template
            ));
        } else if n < m {
            out.push(format!(
                "warning: {} `{}`: replicas = {n} is below the {m} masters: a key's reads reach at most {n} of them; set replicas >= {m} (8 or more for an even spread)",
                self.field, self.template
            ));
        }
        let under = self.under_covered();
        if n > 1 && under > 0 {
            out.push(format!(
                "warning: {} `{}`: {under} of {} keys ({:.0}%) have their {n} replicas on fewer than {} masters: their reads load only those (worst max/mean {:.2}); raise replicas",
                self.field,
                self.template,
                self.sampled,
                100.0 * under as f64 / self.sampled.max(1) as f64,
                n.min(m),
                self.balanced_worst,
            ));
        }
        out
    }
}

/// The placement of every key template of `mappings` on the cluster behind `redis`; empty for
/// standalone Redis (one server: nothing to spread over). Errors are Redis errors naming the
/// command.
pub async fn report(redis: &RedisConn, mappings: &[MappingConfig]) -> Result<Vec<TemplatePlacement>, Error> {
    if !matches!(redis, RedisConn::Cluster(..)) {
        return Ok(Vec::new());
    }
    let mut nodes = redis.cluster_masters().await?;
    let map = redis.refresh_slots().await.map_err(|e| TransientError::Redis(format!("CLUSTER SLOTS: {e}")))?;
    let masters = map.masters().len();
    let mut out = Vec::new();
    for (i, m) in mappings.iter().enumerate() {
        for (k, text) in m.keys.iter().enumerate() {
            let field = format!("mappings[{i}].keys[{k}]");
            let template = KeyTemplate::parse(text).map_err(|e| Error::config(field.clone(), e.to_string()))?;
            let mut keys = sample_keys(&mut nodes, &template).await?;
            let synthetic = keys.is_empty();
            if synthetic {
                keys = (1..=SAMPLE_KEYS).filter_map(|n| template.render(|_| Some(Cow::Owned(n.to_string())))).collect();
            }
            let placements: Vec<Placement> =
                keys.iter().map(|key| Placement::of(key, m.replicas.max, |slot| map.master_of_slot(slot))).collect();
            out.push(summarize(field, text, m.replicas.max, masters, &placements, synthetic));
        }
    }
    Ok(out)
}

/// Up to [`SAMPLE_KEYS`] logical keys of `template` found by their version tokens.
async fn sample_keys(nodes: &mut [redis::aio::MultiplexedConnection], template: &KeyTemplate) -> Result<Vec<String>, Error> {
    let pattern = format!("{}:ver", template.glob());
    let mut keys: Vec<String> = Vec::new();
    'nodes: for node in nodes.iter_mut() {
        let mut cursor: u64 = 0;
        for _ in 0..SCAN_CALLS {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(node)
                .await
                .map_err(|e| TransientError::Redis(format!("SCAN MATCH {pattern}: {e}")))?;
            keys.extend(batch.into_iter().filter_map(|k| k.strip_suffix(":ver").map(str::to_string)));
            if keys.len() >= SAMPLE_KEYS {
                break 'nodes;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    keys.truncate(SAMPLE_KEYS);
    Ok(keys)
}

/// The figures of one template from its keys' placements.
fn summarize(field: String, template: &str, replicas: u32, masters: usize, placements: &[Placement], synthetic: bool) -> TemplatePlacement {
    let mut covering = vec![0usize; masters.max(1) + 1];
    let (mut balanced_sum, mut balanced_worst, mut uniform_sum) = (0.0, 0.0f64, 0.0);
    for p in placements {
        covering[p.masters().min(masters.max(1))] += 1;
        let b = p.balanced_max_over_mean(masters);
        balanced_sum += b;
        balanced_worst = balanced_worst.max(b);
        uniform_sum += p.uniform_max_over_mean(masters);
    }
    let n = placements.len().max(1) as f64;
    TemplatePlacement {
        field,
        template: template.to_string(),
        replicas,
        masters,
        sampled: placements.len(),
        synthetic,
        covering,
        balanced_mean: balanced_sum / n,
        balanced_worst,
        uniform_mean: uniform_sum / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three(slot: u16) -> usize {
        usize::from(slot / 5461).min(2)
    }

    fn of(template: &str, replicas: u32) -> TemplatePlacement {
        let t = KeyTemplate::parse(template).unwrap();
        let placements: Vec<Placement> =
            (1..=SAMPLE_KEYS).map(|n| Placement::of(&t.render(|_| Some(Cow::Owned(n.to_string()))).unwrap(), replicas, three)).collect();
        summarize("mappings[0].keys[0]".into(), template, replicas, 3, &placements, true)
    }

    /// N = 8 over 3 masters: most keys cover all three (balanced 1.0), some two (1.5);
    /// N = 2: every key covers at most two, and the report warns; N = 1: a note.
    #[test]
    fn figures_and_warnings() {
        let p8 = of("item:detail:{id}", 8);
        assert_eq!(p8.sampled, SAMPLE_KEYS);
        assert_eq!(p8.covering.iter().sum::<usize>(), SAMPLE_KEYS);
        assert!(p8.covering[3] > SAMPLE_KEYS * 3 / 4, "{p8:?}");
        assert!(p8.balanced_mean < 1.15 && p8.uniform_mean > p8.balanced_mean, "{p8:?}");
        assert_eq!(p8.under_covered(), p8.covering[1] + p8.covering[2]);
        println!("{}", p8.line());
        assert!(p8.line().contains("8 replicas over 3 masters") && p8.line().contains("3 masters for"), "{}", p8.line());

        let p2 = of("cart:{user}", 2);
        let w = p2.warnings();
        println!("{}\n{w:?}", p2.line());
        assert!(w[0].starts_with("warning:") && w[0].contains("replicas = 2 is below the 3 masters"), "{w:?}");
        assert_eq!(p2.covering[3], 0);
        assert!(p2.balanced_worst >= 1.5);

        let p1 = of("user:{id}", 1);
        assert!(p1.warnings()[0].starts_with("note:"), "{:?}", p1.warnings());
        assert_eq!(p1.covering[1], SAMPLE_KEYS);
    }
}
