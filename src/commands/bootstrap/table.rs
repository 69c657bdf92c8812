//! One table of a bootstrap: chunks in scan-key order, each read in a consistent snapshot and
//! written at its fence position, progress saved after each (module docs of
//! [`super`]).

use std::num::NonZeroU32;
use std::time::Instant;

use mysql_async::Value;
use tokio::sync::watch;

use super::progress::{ProgressStore, TableProgress};
use super::report::{Progress, TableSummary};
use super::BootstrapCli;
use crate::error::Error;
use crate::scan::snapshot::SNAPSHOT_MAX_AGE;
use crate::scan::table::{ChunkQuery, KeyValue};
use crate::scan::{snapshot_group, Scanner};
use crate::write::apply::Writer;

/// Bootstrap table `t` of `scanner` (module docs); returns its totals.
///
/// Errors: a resume with another `--where` than the saved progress (config error naming
/// `--where`), and what reading, writing and saving progress return.
pub async fn bootstrap_table(
    scanner: &mut Scanner,
    t: usize,
    writer: &mut Writer,
    store: &ProgressStore,
    args: &BootstrapCli,
    shutdown: &watch::Receiver<bool>,
) -> Result<TableSummary, Error> {
    let started = Instant::now();
    let table = scanner.tables[t].table.to_string();
    let mut summary = TableSummary { table: table.clone(), status: "done", ..TableSummary::default() };
    if args.restart && !args.dry_run {
        store.forget(&table).await?;
    }
    let mut saved = if args.restart { None } else { store.load(&table).await? };
    if let Some(p) = &saved {
        if p.filter != args.filter {
            return Err(Error::config(
                "--where",
                format!(
                    "the bootstrap of {table} was started with {} and has written {} rows; rerun it with the same --where to resume, or add --restart",
                    p.filter.as_deref().map(|f| format!("--where {f:?}")).unwrap_or_else(|| "no --where".into()),
                    p.rows
                ),
            ));
        }
        if p.done {
            tracing::info!(table = %table, rows = p.rows, "bootstrap of this table finished in an earlier run; --restart to do it again");
            summary.status = "skipped";
            return Ok(summary);
        }
    }
    let mut progress = saved.take().unwrap_or_else(|| TableProgress {
        filter: args.filter.clone(),
        started_ms: crate::now_ms(),
        ..TableProgress::default()
    });
    let mut after: Option<Vec<Value>> = progress.last_key.as_ref().map(|k| k.iter().map(KeyValue::to_value).collect());
    summary.resumed_after = progress.last_key.as_ref().map(|k| serde_json::to_value(k).expect("key serializes"));
    if let Some(k) = &summary.resumed_after {
        tracing::info!(table = %table, after = %k, rows_before = progress.rows, "resuming the bootstrap");
    }
    let chunk = args.rate.map_or(args.chunk_rows, |r| r.min(args.chunk_rows)) as usize;
    let limiter = args.rate.and_then(NonZeroU32::new).map(|r| governor::RateLimiter::direct(governor::Quota::per_second(r)));
    let estimate = scanner.tables[t].layout.estimated_rows(scanner.snap.conn()).await?;
    let mut shown = Progress::start(&table, estimate, progress.rows, args.quiet);
    let mut changes = Vec::new();
    loop {
        if *shutdown.borrow() {
            summary.status = "interrupted";
            break;
        }
        if let Some(l) = &limiter {
            let n = NonZeroU32::new(chunk as u32).expect("chunk >= 1");
            let _ = l.until_n_ready(n).await;
        }
        let snap = scanner.snap.fresh_within(SNAPSHOT_MAX_AGE).await?;
        let q = ChunkQuery { after: after.as_deref(), filter: args.filter.as_deref(), sample: None, limit: chunk };
        let rows = scanner.tables[t].layout.chunk(scanner.snap.conn(), &q).await?;
        let Some(last) = rows.last() else { break };
        let last_key = last.key.clone();
        changes.clear();
        scanner.key_changes(t, &rows, &mut changes);
        let mut group = snapshot_group(std::mem::take(&mut changes), &snap);
        let o = writer.apply_group(&mut group, &mut |_| {}).await?;
        summary.rows += rows.len() as u64;
        summary.key_changes += o.key_changes;
        summary.changed += o.changed;
        summary.unchanged += o.unchanged;
        summary.events += o.events_acked;
        summary.chunks += 1;
        let at = snap.position.to_string();
        summary.first_snapshot.get_or_insert_with(|| at.clone());
        summary.last_snapshot = Some(at.clone());
        progress.rows += rows.len() as u64;
        progress.key_changes += o.key_changes;
        progress.last_key = Some(last_key.iter().map(KeyValue::from_value).collect());
        progress.snapshot = Some(at);
        progress.updated_ms = crate::now_ms();
        if !args.dry_run {
            store.save(&table, &progress).await?;
        }
        crate::failpoint::hit("bootstrap.after_chunk");
        shown.advance(rows.len() as u64);
        let full = rows.len() == chunk;
        after = Some(last_key);
        if !full {
            break;
        }
    }
    scanner.snap.end().await?;
    shown.finish();
    if summary.status == "done" {
        progress.done = true;
        progress.updated_ms = crate::now_ms();
        if !args.dry_run {
            store.save(&table, &progress).await?;
        }
    }
    summary.elapsed_ms = started.elapsed().as_millis() as u64;
    if summary.rows == 0 && progress.rows == 0 && summary.status == "done" {
        tracing::info!(table = %table, "no rows to bootstrap");
    }
    Ok(summary)
}
