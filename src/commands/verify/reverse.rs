//! The reverse check, and `--keys`: keys in Redis back to their rows. A key whose row no
//! longer exists (or no longer renders it) must not hold a payload.
//!
//! Full runs `SCAN` every template of the checked tables on every master
//! (`scan::keyspace`); a key that a row checked by the forward pass maps to is skipped (its
//! 64-bit hash was kept), every other one is looked up in the database by its template's
//! columns and checked like a forward key: against the row that renders it, or as a key
//! without row. With `--sample PCT` only keys whose hash falls in the sample are looked up.

use std::collections::HashSet;

use super::forward::{judge, key_check, rows_by_key};
use super::Ctx;
use crate::error::Error;
use crate::scan::keyspace::KeyResolver;
use crate::scan::snapshot::SNAPSHOT_MAX_AGE;

/// Keys looked up per snapshot and Redis batch.
const LOOKUP_BATCH: usize = 512;

/// `SCAN` the templates of table `t` and check the keys no checked row maps to.
pub async fn check_table(ctx: &mut Ctx<'_>, resolver: &KeyResolver, t: usize) -> Result<(), Error> {
    let Some(m) = resolver.mappings.iter().position(|m| m.table == *ctx.scanner.tables[t].table) else { return Ok(()) };
    for j in 0..resolver.templates[m].len() {
        let mut candidates: HashSet<String> = HashSet::new();
        let (expected, sample) = (ctx.expected_keys.take(), ctx.sample);
        let mut keep = |batch: Vec<String>| {
            for k in batch {
                let h = super::key_hash(&k);
                if expected.as_ref().is_some_and(|s| s.contains(&h)) || !in_sample(h, sample) {
                    continue;
                }
                candidates.insert(k);
            }
        };
        let scanned = resolver.scan_template(&ctx.redis, m, j, &mut keep).await;
        ctx.expected_keys = expected;
        scanned?;
        let mut keys: Vec<String> = candidates.into_iter().collect();
        keys.sort();
        tracing::debug!(table = %ctx.scanner.tables[t].table, template = %resolver.templates[m][j], keys = keys.len(), "reverse check: keys no checked row maps to");
        for batch in keys.chunks(LOOKUP_BATCH) {
            if *ctx.shutdown.borrow() {
                return Ok(());
            }
            check_keys(ctx, resolver, t, m, j, batch).await?;
        }
    }
    Ok(())
}

/// Check `keys` of template `j` of mapping `m` (table `t`): each against the row that renders
/// it, or as a key without row. Keys that belong to another template are left to it.
pub async fn check_keys(ctx: &mut Ctx<'_>, resolver: &KeyResolver, t: usize, m: usize, j: usize, keys: &[String]) -> Result<(), Error> {
    let snap = ctx.scanner.snap.fresh_within(SNAPSHOT_MAX_AGE).await?;
    ctx.summary.snapshot.get_or_insert_with(|| snap.position.to_string());
    let mut checks = Vec::with_capacity(keys.len());
    for k in keys {
        let Some(owner) = resolver.owner(k) else { continue };
        if (owner.mapping, owner.template) != (m, j) {
            continue;
        }
        let values: Vec<(String, String)> = owner.values.iter().map(|(c, v)| (c.clone(), v.to_string())).collect();
        let rows = rows_by_key(&mut ctx.scanner, t, &resolver.templates[m][j], &values).await?;
        ctx.summary.tables[t].reverse_keys_checked += 1;
        checks.push(key_check(&ctx.scanner, t, k, j, values, &rows));
    }
    ctx.scanner.snap.end().await?;
    judge(ctx, t, checks, &snap).await
}

/// Whether a key with hash `h` is in a `sample` (a fraction; `None` = everything).
fn in_sample(h: u64, sample: Option<f64>) -> bool {
    sample.is_none_or(|p| (h % 1_000_000) as f64 / 1_000_000.0 < p)
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_by_hash() {
        assert!(super::in_sample(999_999, None));
        assert!(super::in_sample(5_000_004, Some(0.01)));
        assert!(!super::in_sample(20_000, Some(0.01)));
    }
}
