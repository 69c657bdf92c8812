//! The recheck: lag is not inconsistency. A key that differed at its first check is judged
//! again after `--recheck-ms`, against its row read in a new snapshot, and counted only when
//! nothing newer happened in between:
//!
//! 1. `binval run` has applied everything up to the first check's snapshot: its checkpoint's
//!    fence position is at least the snapshot's (waited for up to [`checkpoint_wait`]; a
//!    source without checkpoint has no `binval run` whose changes could be in flight);
//! 2. the row is the same in both snapshots (else a newer change is on its way through the
//!    binlog);
//! 3. the key's version token and replica positions are the same as at the first check (else
//!    binval wrote the key in between) and not newer than the new snapshot;
//! 4. it still differs.
//!
//! A key that still differs but fails 1-3 is `unsettled` (reported as a count, not as a
//! mismatch); one that no longer differs was lag.

use std::time::{Duration, Instant};

use binval_protocol::{FencePosition, MariadbGtidPosition, SourcePosition};

use super::compare::{compare, Finding};
use super::forward::{expected_of, key_check, row_checks, rows_by_key, Check};
use super::{Ctx, Lookup, Suspect};
use crate::config::FenceMode;
use crate::error::Error;
use crate::ha::checkpoint::{Checkpoint, CheckpointStoreImpl};
use crate::scan::keyspace::KeyResolver;
use crate::scan::snapshot::SnapshotPosition;
use crate::write::key_state::KeyState;

/// A mismatch that held through the recheck.
pub struct Confirmed {
    /// The suspect as first seen.
    pub suspect: Suspect,
    /// What is wrong now.
    pub findings: Vec<Finding>,
    /// The key as read at the recheck.
    pub state: KeyState,
    /// The recheck's snapshot.
    pub snapshot: SnapshotPosition,
    /// The row's scan key columns and values (when a row maps to the key).
    pub row_key: Option<std::collections::BTreeMap<String, serde_json::Value>>,
}

/// How long the recheck waits for `binval run`'s checkpoint to reach the suspects' snapshots.
pub fn checkpoint_wait(recheck_ms: u64) -> Duration {
    Duration::from_millis((recheck_ms.saturating_mul(5)).clamp(1000, 60_000))
}

/// Recheck every suspect (module docs); returns the confirmed ones, counting the rest as
/// `unsettled` in the summary.
pub async fn recheck(ctx: &mut Ctx<'_>, resolver: &KeyResolver) -> Result<Vec<Confirmed>, Error> {
    let suspects = std::mem::take(&mut ctx.suspects);
    let Some(latest) = suspects.iter().map(|s| s.seen).max() else { return Ok(Vec::new()) };
    let due = latest + Duration::from_millis(ctx.recheck_ms);
    tokio::time::sleep_until(due.into()).await;
    let newest_fence = suspects.iter().map(|s| s.fence).max().unwrap_or(0);
    let applied = wait_for_checkpoint(ctx, newest_fence).await?;
    let mut confirmed = Vec::new();
    for t in 0..ctx.scanner.tables.len() {
        let mine: Vec<Suspect> = suspects.iter().filter(|s| s.table == t).cloned().collect();
        if mine.is_empty() {
            continue;
        }
        let snap = ctx.scanner.snap.begin().await?;
        let checks = reread(ctx, resolver, t, &mine).await?;
        ctx.scanner.snap.end().await?;
        let keys: Vec<(&str, u32)> = mine.iter().map(|s| (s.key.as_str(), s.replicas)).collect();
        let states = ctx.redis.read_key_states(&keys).await?;
        for ((s, check), state) in mine.into_iter().zip(checks).zip(states) {
            let findings = compare(&expected_of(&ctx.scanner.tables[t].mapping, &check), &state);
            if findings.is_empty() {
                continue;
            }
            let behind = applied.is_some_and(|a| a < s.fence);
            let row_same = check.row.as_ref().map(|r| &r.0) == s.row.as_ref();
            let still = super::forward::same_positions(&s.positions, &state) && state.newest_position() <= snap.fence.0;
            if behind || !row_same || !still {
                ctx.summary.unsettled += 1;
                continue;
            }
            let row_key = check.row.as_ref().map(|_| row_key(ctx, t, &check));
            confirmed.push(Confirmed { suspect: s, findings, state, snapshot: snap.clone(), row_key });
        }
    }
    Ok(confirmed)
}

/// The checks of `suspects` of table `t` as of now: each key against its row read again (by
/// scan key, or by its template's columns when no row mapped to it).
pub async fn reread(ctx: &mut Ctx<'_>, resolver: &KeyResolver, t: usize, suspects: &[Suspect]) -> Result<Vec<Check>, Error> {
    let keys: Vec<Vec<mysql_async::Value>> =
        suspects.iter().filter_map(|s| if let Lookup::Key(k) = &s.lookup { Some(k.clone()) } else { None }).collect();
    let rows = ctx.scanner.tables[t].layout.by_keys(ctx.scanner.snap.conn(), keys.as_slice()).await?;
    let by_key = row_checks(ctx, t, &rows);
    let m = resolver.mappings.iter().position(|m| m.table == *ctx.scanner.tables[t].table);
    let mut out = Vec::with_capacity(suspects.len());
    for s in suspects {
        let check = match &s.lookup {
            Lookup::Key(_) => match by_key.iter().find(|c| c.change.key == s.key) {
                Some(c) => Check { change: c.change.clone(), row: c.row.clone(), lookup: s.lookup.clone() },
                None => Check { change: ctx.delete_change(t, &s.key), row: None, lookup: s.lookup.clone() },
            },
            Lookup::Columns(j, values) => {
                let template = m.map(|m| resolver.templates[m][*j].clone());
                let rows = match &template {
                    Some(tpl) => rows_by_key(&mut ctx.scanner, t, tpl, values).await?,
                    None => Vec::new(),
                };
                key_check(&ctx.scanner, t, &s.key, *j, values.clone(), &rows)
            }
        };
        out.push(check);
    }
    Ok(out)
}

/// The scan key columns and values of a check's row.
fn row_key(ctx: &Ctx, t: usize, check: &Check) -> std::collections::BTreeMap<String, serde_json::Value> {
    let row: serde_json::Map<String, serde_json::Value> =
        check.row.as_ref().and_then(|r| serde_json::from_str(&r.0).ok()).unwrap_or_default();
    ctx.scanner.tables[t].layout.key.iter().map(|k| (k.clone(), row.get(k).cloned().unwrap_or(serde_json::Value::Null))).collect()
}

/// The fence position `binval run` has applied everything up to (its checkpoint), waiting up
/// to [`checkpoint_wait`] for it to reach `fence`; `None` when there is no checkpoint (or its
/// position does not translate: no GTID of the fence domain saved).
async fn wait_for_checkpoint(ctx: &mut Ctx<'_>, fence: u64) -> Result<Option<u64>, Error> {
    let deadline = Instant::now() + checkpoint_wait(ctx.recheck_ms);
    loop {
        let cp = CheckpointStoreImpl::new(&ctx.cfg.checkpoint, &ctx.cfg.source.name, &ctx.redis).load().await?;
        if let Some(c) = &cp {
            ctx.summary.checkpoint = Some(format!("{}:{}", c.file, c.pos));
        }
        let applied = cp.as_ref().and_then(|c| checkpoint_fence(ctx, c));
        match applied {
            Some(a) if a < fence && Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => return Ok(applied),
        }
    }
}

/// A checkpoint's fence position under the source's fence rule.
fn checkpoint_fence(ctx: &Ctx, c: &Checkpoint) -> Option<u64> {
    let rule = ctx.scanner.fence;
    let mut at = SourcePosition { file: c.file.clone(), pos: c.pos, gtid: None };
    if rule.mode == FenceMode::Gtid {
        let state: MariadbGtidPosition = c.gtid.as_deref()?.parse().ok()?;
        match state.get(rule.domain) {
            Some(g) => at.gtid = Some(g.to_string()),
            None => return FencePosition::from_gtid_seq(rule.epoch, 0).map(|p| p.0),
        }
    }
    rule.position(&at).ok().map(|p| p.0)
}
