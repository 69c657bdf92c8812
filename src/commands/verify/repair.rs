//! `--repair`: confirmed mismatches rewritten through the fenced path at a fresh snapshot's
//! position, with their invalidation events (app instances may have cached the wrong value).
//!
//! Per table: a new snapshot; each key's row read again; the key change it should have (the
//! row's payload, or a delete when no row maps to the key) written at the snapshot's fence
//! position by the same `Writer` as `binval run` and `binval replay`, so a change committed
//! after the snapshot still wins. A fenced write does not replace a record at its own
//! position, and a corrupted replica usually keeps the position of its last good write: so a
//! replica found holding a wrong payload (or a tombstone for a live row) is first removed by
//! a compare-and-delete script that deletes it only if it still holds exactly what the
//! recheck read (a write of `binval run` in between makes it a no-op, and that newer write
//! stays). A key whose token or replica holds a position newer than the source's own (written
//! by something else) cannot be moved back this way: it counts as `repair_failed`.

use std::collections::BTreeMap;

use binval_protocol::replica_key;

use super::compare::{compare, Kind};
use super::forward::expected_of;
use super::recheck::{reread, Confirmed};
use super::Ctx;
use crate::error::{classify_redis, Error};
use crate::scan::keyspace::KeyResolver;
use crate::scan::snapshot_group;
use crate::write::apply::Writer;
use crate::write::key_state::ReplicaState;

/// Delete `KEYS[1]` only if it holds what was read: `ARGV` = position (`""` absent), payload
/// present (`1`/`0`), payload, tombstone flag (`""` absent). Returns 1 when deleted.
const DELETE_IF_UNCHANGED: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'p', 'd', 't')
if (cur[1] or '') ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then
  if cur[2] ~= ARGV[3] then return 0 end
elseif cur[2] then
  return 0
end
if (cur[3] or '') ~= ARGV[4] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// What a repair did.
#[derive(Debug, Default)]
pub struct Repaired {
    /// Keys consistent after the rewrite.
    pub repaired: u64,
    /// Keys still inconsistent.
    pub failed: u64,
    /// Events published.
    pub events: u64,
}

/// Repair `confirmed` (module docs).
pub async fn repair(ctx: &mut Ctx<'_>, resolver: &KeyResolver, writer: &mut Writer, confirmed: &[Confirmed]) -> Result<Repaired, Error> {
    let mut out = Repaired::default();
    let by_table: BTreeMap<usize, Vec<&Confirmed>> = confirmed.iter().fold(BTreeMap::new(), |mut m, c| {
        m.entry(c.suspect.table).or_default().push(c);
        m
    });
    for (t, list) in by_table {
        let suspects: Vec<super::Suspect> = list.iter().map(|c| c.suspect.clone()).collect();
        let snap = ctx.scanner.snap.begin().await?;
        let checks = reread(ctx, resolver, t, &suspects).await?;
        ctx.scanner.snap.end().await?;
        for c in &list {
            for f in c.findings.iter().filter(|f| matches!(f.kind, Kind::Stale | Kind::Extra)) {
                if let Some(r) = f.replica {
                    delete_if_unchanged(ctx, &replica_key(&c.suspect.key, r), &c.state.replicas[r as usize]).await?;
                }
            }
        }
        let changes: Vec<_> = checks.iter().map(|c| c.change.clone()).collect();
        let mut group = snapshot_group(changes, &snap);
        let o = writer.apply_group(&mut group, &mut |_| {}).await?;
        out.events += o.events_acked;
        let keys: Vec<(&str, u32)> = checks.iter().map(|c| (c.change.key.as_str(), c.change.replicas)).collect();
        let states = ctx.redis.read_key_states(&keys).await?;
        for ((check, state), c) in checks.iter().zip(&states).zip(&list) {
            let left = compare(&expected_of(&ctx.scanner.tables[t].mapping, check), state);
            if left.is_empty() {
                out.repaired += 1;
                tracing::info!(key = %c.suspect.key, position = snap.fence.0, op = check.change.op.as_str(), "repaired");
            } else {
                out.failed += 1;
                tracing::warn!(key = %c.suspect.key, findings = ?left, "not repaired: the key holds a position newer than the source's snapshot (written by something else than binval?); fix it by hand (binval inspect shows it)");
            }
        }
    }
    Ok(out)
}

/// Remove replica `name` if it still holds `seen` (see [`DELETE_IF_UNCHANGED`]).
async fn delete_if_unchanged(ctx: &mut Ctx<'_>, name: &str, seen: &ReplicaState) -> Result<(), Error> {
    let args = vec![
        seen.position.map(|p| p.to_string()).unwrap_or_default(),
        if seen.payload.is_some() { "1".into() } else { "0".into() },
        seen.payload.as_deref().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default(),
        if seen.tombstone { "1".into() } else { String::new() },
    ];
    let deleted: i64 = ctx.redis.eval(DELETE_IF_UNCHANGED, &[name.to_string()], &args).await.map_err(|e| classify_redis(e, name))?;
    if deleted == 0 {
        tracing::info!(replica = %name, "changed since the recheck: left to the fenced write");
    }
    Ok(())
}
