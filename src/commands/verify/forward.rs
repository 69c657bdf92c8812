//! The forward check: rows of the mapped tables (all, a `--sample`, or those behind
//! `--keys`), read in consistent snapshots, against the keys they map to. A key that differs
//! becomes a [`Suspect`], judged again after the recheck delay (`recheck`).

use std::time::Instant;

use binval_protocol::KeyTemplate;
use mysql_async::Value;

use super::compare::{compare, not_cached, Expected};
use super::{Ctx, Lookup, Suspect};
use crate::error::Error;
use crate::mapping::KeyChange;
use crate::scan::snapshot::{SnapshotPosition, SNAPSHOT_MAX_AGE};
use crate::scan::table::{ChunkQuery, ScannedRow};
use crate::scan::Scanner;
use crate::write::key_state::KeyState;

/// Rows per chunk of the forward check.
pub const CHUNK_ROWS: usize = 1000;

/// A key to check and where its expectation comes from.
pub struct Check {
    /// The key (and what it should hold: a change from a row, or a delete when no row maps).
    pub change: KeyChange,
    /// A row maps to the key.
    pub row: Option<(String, Vec<Value>)>,
    /// How to find the row again.
    pub lookup: Lookup,
}

/// Check every row of table `t` (or a `--sample` of them), chunk by chunk.
pub async fn check_table(ctx: &mut Ctx<'_>, t: usize) -> Result<(), Error> {
    let mut after: Option<Vec<Value>> = None;
    loop {
        if *ctx.shutdown.borrow() {
            return Ok(());
        }
        let snap = ctx.scanner.snap.fresh_within(SNAPSHOT_MAX_AGE).await?;
        ctx.summary.snapshot.get_or_insert_with(|| snap.position.to_string());
        let q = ChunkQuery { after: after.as_deref(), filter: None, sample: ctx.sample, limit: CHUNK_ROWS };
        let rows = ctx.scanner.tables[t].layout.chunk(ctx.scanner.snap.conn(), &q).await?;
        let Some(last) = rows.last() else { break };
        after = Some(last.key.clone());
        ctx.summary.tables[t].rows_checked += rows.len() as u64;
        let full = rows.len() == CHUNK_ROWS;
        let checks = row_checks(ctx, t, &rows);
        judge(ctx, t, checks, &snap).await?;
        if !full {
            break;
        }
    }
    ctx.scanner.snap.end().await
}

/// The checks of scanned rows of table `t`: one per key each row maps to.
pub fn row_checks(ctx: &Ctx, t: usize, rows: &[ScannedRow]) -> Vec<Check> {
    let mut out = Vec::with_capacity(rows.len());
    let mut changes = Vec::new();
    for r in rows {
        changes.clear();
        ctx.scanner.row_keys(t, &r.row, &mut changes);
        let row_json = serde_json::to_string(&r.row).expect("row serializes");
        for c in changes.drain(..) {
            out.push(Check { change: c, row: Some((row_json.clone(), r.key.clone())), lookup: Lookup::Key(r.key.clone()) });
        }
    }
    out
}

/// The check of key `key` of table `t` given the rows found by its key-template columns
/// (`rows`): the row that renders it, else no row. Also what `binval replay` writes for a key
/// whose row moved on since the change it replays (`commands::replay::guard`).
pub fn key_check(scanner: &Scanner, t: usize, key: &str, template: usize, values: Vec<(String, String)>, rows: &[ScannedRow]) -> Check {
    let mut changes = Vec::new();
    for r in rows {
        changes.clear();
        scanner.row_keys(t, &r.row, &mut changes);
        if let Some(c) = changes.iter().find(|c| c.key == key) {
            let row_json = serde_json::to_string(&r.row).expect("row serializes");
            return Check { change: c.clone(), row: Some((row_json, r.key.clone())), lookup: Lookup::Key(r.key.clone()) };
        }
    }
    Check { change: scanner.delete_change(t, key), row: None, lookup: Lookup::Columns(template, values) }
}

/// Read the keys of `checks` from Redis and compare; differing ones become suspects.
pub async fn judge(ctx: &mut Ctx<'_>, t: usize, checks: Vec<Check>, snap: &SnapshotPosition) -> Result<(), Error> {
    if checks.is_empty() {
        return Ok(());
    }
    let keys: Vec<(&str, u32)> = checks.iter().map(|c| (c.change.key.as_str(), c.change.replicas)).collect();
    let states = ctx.redis.read_key_states(&keys).await?;
    let now = Instant::now();
    for (c, state) in checks.into_iter().zip(states) {
        ctx.summary.keys_checked += 1;
        ctx.summary.tables[t].keys_checked += 1;
        ctx.summary.replicas_checked += u64::from(c.change.replicas);
        if let Some(set) = &mut ctx.expected_keys {
            set.insert(super::key_hash(&c.change.key));
        }
        let expected = ctx.expected(t, &c);
        let findings = compare(&expected, &state);
        if findings.is_empty() {
            ctx.summary.not_cached += u64::from(not_cached(&expected, &state));
            continue;
        }
        if ctx.suspects.len() >= super::MAX_SUSPECTS {
            ctx.summary.not_rechecked += 1;
            continue;
        }
        ctx.suspects.push(Suspect {
            table: t,
            key: c.change.key,
            replicas: c.change.replicas,
            lookup: c.lookup,
            row: c.row.map(|r| r.0),
            positions: state.positions(),
            fence: snap.fence.0,
            seen: now,
        });
    }
    Ok(())
}

/// The expectation of a check (see `compare`).
pub fn expected_of<'a>(mapping: &crate::config::MappingConfig, c: &'a Check) -> Expected<'a> {
    Expected { payload: c.change.payload.as_deref(), row: c.row.is_some(), mode: mapping.mode, ttl: mapping.ttl_secs > 0 }
}

/// The rows of table `t` holding the column texts of a key of `template`, at most 2 (a key
/// template should name a unique row).
pub async fn rows_by_key(
    scanner: &mut Scanner,
    t: usize,
    template: &KeyTemplate,
    values: &[(String, String)],
) -> Result<Vec<ScannedRow>, Error> {
    if !scanner.tables[t].layout.has_columns(template) {
        return Ok(Vec::new());
    }
    let v: Vec<(&str, &str)> = values.iter().map(|(c, v)| (c.as_str(), v.as_str())).collect();
    scanner.tables[t].layout.by_columns(scanner.snap.conn(), &v, 2).await
}

/// Whether a check's key state is what it was (no write in between).
pub fn same_positions(a: &(Option<u64>, Vec<Option<u64>>), b: &KeyState) -> bool {
    *a == b.positions()
}
