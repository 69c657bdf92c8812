//! Replay never writes a payload the database no longer has.
//!
//! # Why
//!
//! A replayed change is fenced by its source position against what Redis holds: the version
//! token first (a key whose token is newer is skipped), then each replica. That is exact while
//! Redis holds what binval wrote. After a Redis master lost its data it is not: a deleted row's
//! token (and some of its tombstones) may be gone, and a replay of its older UPDATE then passes
//! the token check and writes the old payload into every replica that is missing — the
//! deleted row is served again, and stays so when the range ends before the DELETE (issue #22,
//! cause 5). The same goes for a row updated since: its newest value's records lost, a bounded
//! replay leaves an older value.
//!
//! # What the guard does
//!
//! Before the fenced writes of each transaction (or chunk of a large one), for the key changes
//! that would move something — the rule of the fenced scripts, [`would_change`]: the token is
//! not newer than the change and a replica is missing or older — it reads each key's row as
//! the database holds it *now*, in one consistent snapshot at fence position `S` (as `binval
//! verify` finds a key's row: by the key template's columns), and writes:
//!
//! * the change **as logged**, at its own position, when the database still holds exactly
//!   what it says (the same payload, or no row for a delete) and no record of the key is newer
//!   than the change (else the token would end older than a replica);
//! * otherwise the database's **present** state of the key (its row's payload, or a delete)
//!   at `S`, with its event at `S` — what `binval verify --repair` would write. `S` is newer
//!   than every change the snapshot shows, so a later replay of an older range is skipped by
//!   the token, and a change committed after the snapshot still wins.
//!
//! Changes that would move nothing are left alone (fenced no-ops). `binval replay --as-logged`
//! switches the guard off (the behaviour before it; MySQL sources, whose consistent snapshots
//! have no binlog position, need it to write anything at all). Counts: [`GuardStats`].
//!
//! The row is found by the texts the key was rendered from, as verify's reverse check does: a
//! key over a TIMESTAMP or binary column is not found again and would be written as deleted.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::binlog::txn::Transaction;
use crate::config::{Config, MappingConfig};
use crate::error::{DefiniteError, Error};
use crate::mapping::KeyChange;
use crate::redis::RedisConn;
use crate::scan::keyspace::KeyResolver;
use crate::scan::Scanner;
use crate::write::apply::{would_change, ChangeGuard};
use crate::write::group::Group;

/// What the guard did over a replay (shared with the summary).
#[derive(Debug, Default)]
pub struct GuardStats {
    /// Key changes that would have moved something, checked against the database.
    pub checked: AtomicU64,
    /// Of those, written with the database's present state instead of the logged image.
    pub present: AtomicU64,
    /// Of those, the logged change would have written a payload of a row the database no
    /// longer has (it was deleted since, or moved to another key).
    pub deleted_since: AtomicU64,
}

/// The guard of one replay (module docs). The scanner is opened at the first key to check.
pub struct PresentGuard {
    cfg: Config,
    mappings: Vec<MappingConfig>,
    resolver: KeyResolver,
    scanner: Option<Scanner>,
    stats: Arc<GuardStats>,
}

impl PresentGuard {
    /// A guard for a replay of `mappings` of `cfg`, counting into `stats`.
    pub fn new(cfg: &Config, mappings: &[MappingConfig], stats: Arc<GuardStats>) -> Self {
        PresentGuard { cfg: cfg.clone(), mappings: mappings.to_vec(), resolver: KeyResolver::new(&cfg.mappings), scanner: None, stats }
    }

    async fn scanner(&mut self, redis: &RedisConn) -> Result<&mut Scanner, Error> {
        if self.scanner.is_none() {
            let renamed = crate::ha::checkpoint::followed_renames(&self.cfg, redis).await?;
            self.scanner = Some(Scanner::open(&self.cfg, &self.mappings, &renamed).await?);
        }
        Ok(self.scanner.as_mut().expect("opened"))
    }

    async fn review_group(&mut self, redis: &RedisConn, group: &Group) -> Result<Option<Group>, Error> {
        let keys: Vec<(&str, u32)> = group.changes.iter().map(|c| (c.key.as_str(), c.replicas)).collect();
        let states = redis.read_key_states(&keys).await?;
        let suspects: Vec<usize> = (0..group.changes.len())
            .filter(|&i| {
                let s = &states[i];
                let replicas: Vec<Option<u64>> = s.replicas.iter().map(|r| r.position).collect();
                would_change(s.version.unwrap_or(0), &replicas, group.tags[i].0)
            })
            .collect();
        if suspects.is_empty() {
            return Ok(None);
        }
        self.stats.checked.fetch_add(suspects.len() as u64, Relaxed);
        let lookups: Vec<Option<RowLookup>> = suspects.iter().map(|&i| self.lookup(&group.changes[i].key)).collect();
        let scanner = match self.scanner(redis).await {
            Ok(s) => s,
            Err(e) => return Err(unusable(e)),
        };
        let snap = scanner.snap.begin().await.map_err(unusable)?;
        let mut present: Vec<Option<KeyChange>> = Vec::with_capacity(suspects.len());
        for (&i, l) in suspects.iter().zip(&lookups) {
            let Some((l, t)) = l.as_ref().and_then(|l| Some((l, scanner.tables.iter().position(|st| *st.table == *l.table)?))) else {
                present.push(None);
                continue;
            };
            let rows = crate::commands::verify::forward::rows_by_key(scanner, t, &l.template, &l.values).await?;
            let check = crate::commands::verify::forward::key_check(scanner, t, &group.changes[i].key, l.index, l.values.clone(), &rows);
            present.push(Some(check.change));
        }
        scanner.snap.end().await?;
        // The group to write: every change as it is, but those whose row moved on.
        let mut out = Group::new();
        out.txns = group
            .txns
            .iter()
            .map(|t| Transaction { position: t.position.clone(), commit_time_ms: t.commit_time_ms, ..Transaction::default() })
            .collect();
        let snapshot_txn = out.txns.len() as u32;
        out.txns.push(Transaction { position: snap.position.clone(), commit_time_ms: crate::now_ms(), ..Transaction::default() });
        let mut replaced = std::collections::HashMap::new();
        for ((&i, p), state) in suspects.iter().zip(present).zip(suspects.iter().map(|&i| &states[i])) {
            let logged = &group.changes[i];
            let Some(now) = p else {
                tracing::warn!(key = %logged.key, table = %logged.table, "replay: the key's row cannot be looked up (no mapping of the key is replayed); not written");
                replaced.insert(i, None);
                continue;
            };
            let same =
                (logged.op == binval_protocol::Op::Delete) == (now.op == binval_protocol::Op::Delete) && logged.payload == now.payload;
            if same && state.newest_position() <= group.tags[i].0 .0 {
                continue;
            }
            if logged.op != binval_protocol::Op::Delete && now.op == binval_protocol::Op::Delete {
                self.stats.deleted_since.fetch_add(1, Relaxed);
            }
            self.stats.present.fetch_add(1, Relaxed);
            tracing::info!(
                key = %logged.key,
                logged = %group.txns[group.tags[i].1 as usize].position,
                present_at = %snap.position,
                op = now.op.as_str(),
                "replay: the database moved on since the logged change (or a record of the key is newer): writing its present state at the snapshot's position instead"
            );
            // The scanner's mapper knows the configured counts only; the logged change carries
            // the key's stored adaptive count (the writer's mapper loaded it), which the
            // present state must write too (every copy readers may use, the same `n`).
            let now = KeyChange { replicas: logged.replicas, count: logged.count, ..now };
            replaced.insert(i, Some(now));
        }
        for (i, c) in group.changes.iter().enumerate() {
            match replaced.remove(&i) {
                None => {
                    out.changes.push(c.clone());
                    out.tags.push(group.tags[i]);
                }
                Some(Some(now)) => {
                    out.changes.push(now);
                    out.tags.push((snap.fence, snapshot_txn));
                }
                Some(None) => {}
            }
        }
        out.rows = group.rows;
        Ok(Some(out))
    }
}

/// How a key's row is found: the mapping's table, the key template (its index in the mapping)
/// and the column texts the key was rendered from.
struct RowLookup {
    table: String,
    index: usize,
    template: binval_protocol::KeyTemplate,
    values: Vec<(String, String)>,
}

impl PresentGuard {
    fn lookup(&self, key: &str) -> Option<RowLookup> {
        let o = self.resolver.owner(key)?;
        Some(RowLookup {
            table: self.resolver.mappings[o.mapping].table.clone(),
            index: o.template,
            template: self.resolver.templates[o.mapping][o.template].clone(),
            values: o.values.iter().map(|(c, v)| (c.clone(), v.to_string())).collect(),
        })
    }
}

impl ChangeGuard for PresentGuard {
    fn review<'a>(&'a mut self, redis: &'a RedisConn, group: &'a Group) -> BoxFuture<'a, Result<Option<Group>, Error>> {
        Box::pin(self.review_group(redis, group))
    }
}

/// The guard cannot read the database's present rows (a MySQL source has no binlog position
/// of a consistent snapshot; a mapped table renamed away): say how to replay anyway.
fn unusable(e: Error) -> Error {
    match e {
        Error::Definite(d) => DefiniteError::Scan {
            table: "(replay's check of the present rows)".into(),
            message: format!(
                "{d}. Replay checks each key it would change against the database's present row so it never brings a deleted row back; without that check, `binval replay --as-logged` writes the logged images (safe only while Redis has lost nothing: see README \"Incidents\")"
            ),
        }
        .into(),
        t => t,
    }
}
