//! `binval bootstrap`: fill the suffix replicas and version tokens of every row of the mapped
//! tables from a table scan, while `binval run` keeps streaming, so the keys nobody changes
//! have replicas too (without them every app instance misses on them and stampedes the
//! loader).
//!
//! # Race-free by construction
//!
//! Each chunk of rows (in scan-key order, `--chunk-rows` at a time) is read in a consistent
//! snapshot whose binlog position is known (`scan::snapshot`) and written through the same
//! fenced writes as `binval run` and `binval replay` (`write::apply::Writer`) at the
//! snapshot's fence position. A change committed after the snapshot has a higher fence
//! position, so whichever lands first, the newer value stays; a bootstrap row never
//! overwrites a newer one, and replaces an older one only with the row as of a later point.
//! No watermark table (DBLog) is needed: the snapshot's position is the exact cut the
//! watermarks approximate (README, "Putting binval in front of an existing database").
//!
//! # Runs
//!
//! * Resumable: progress per table (last scan key written) in Redis ([`progress`]); a rerun
//!   continues after it, a finished table is skipped (`--restart` starts over).
//! * `--rate ROWS_PER_S` (governor), `--where SQL` (only those rows; a resume must use the
//!   same), `--dry-run` (reads, compares, writes nothing, not even progress).
//! * No invalidation events unless `--publish`: an app instance holds no value of a key that
//!   was never written; with apps that filled from their loader before binval, `--publish`
//!   evicts what they cached (events only for keys the bootstrap changed).
//! * Memory: one chunk of rows and their key changes at a time.
//! * SIGINT/SIGTERM: the chunk in flight is finished and saved, the summary says
//!   `interrupted`; a second signal exits at once (130).
//!
//! MariaDB (or Percona Server) only: MySQL does not tell a snapshot's binlog position.

pub mod progress;
pub mod report;
mod table;

use std::time::Instant;

use crate::config::Config;
use crate::error::Error;
use crate::redis::RedisConn;
use crate::scan::Scanner;
use crate::write::apply::{ApplyOptions, Writer};
use progress::ProgressStore;
use report::BootstrapSummary;

/// The flags of `binval bootstrap` (clap; the field docs are the `--help` text).
#[derive(Debug, Clone, clap::Args)]
pub struct BootstrapCli {
    /// Only this mapped table (`schema.table`); repeat for several. Default: every mapped table.
    #[arg(long = "table", value_name = "SCHEMA.TABLE")]
    pub tables: Vec<String>,
    /// Only rows matching this SQL condition (ANDed to the scan, e.g. "updated_at > NOW() - INTERVAL 30 DAY").
    #[arg(long = "where", value_name = "SQL")]
    pub filter: Option<String>,
    /// At most this many rows per second (default: as fast as Redis takes them).
    #[arg(long, value_name = "ROWS_PER_S")]
    pub rate: Option<u32>,
    /// Rows per chunk: read in one snapshot, written in one batch, saved as progress after it.
    /// Bounds memory.
    #[arg(long, value_name = "ROWS", default_value_t = 1000)]
    pub chunk_rows: u32,
    /// Read and compare, write nothing (no replicas, tokens, events or progress).
    #[arg(long)]
    pub dry_run: bool,
    /// Publish an invalidation event for each key the bootstrap changed (for app instances
    /// that cached values from their loader before binval ran).
    #[arg(long)]
    pub publish: bool,
    /// Forget the saved progress of the tables and start from their first row.
    #[arg(long)]
    pub restart: bool,
    /// No progress bar or progress log lines.
    #[arg(long)]
    pub quiet: bool,
}

/// `binval bootstrap` from the command line: validate, bootstrap, print the JSON summary.
pub async fn cli(cfg: Config, args: BootstrapCli) -> Result<(), Error> {
    if args.rate == Some(0) {
        return Err(Error::config("--rate", "must be at least 1 row per second"));
    }
    if !(1..=100_000).contains(&args.chunk_rows) {
        return Err(Error::config("--chunk-rows", format!("{} is out of range 1..=100000", args.chunk_rows)));
    }
    if args.filter.as_deref().is_some_and(|w| w.trim().is_empty()) {
        return Err(Error::config("--where", "is empty"));
    }
    let shutdown = super::shutdown_signal("bootstrap: finishing the chunk in flight and saving its progress (rerun to resume)");
    let summary = run(&cfg, &args, shutdown).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

/// Bootstrap the selected tables one after the other; stops after the chunk in flight when
/// `shutdown` turns true.
///
/// Errors: unknown `--table` (config), a table that cannot be scanned (no key, missing,
/// `--where` refused: [`crate::error::DefiniteError::Scan`]), a resume with another
/// `--where`, a source without a snapshot position (MySQL), Redis/Kafka/MySQL failures as
/// classified (rerun: the bootstrap resumes).
pub async fn run(cfg: &Config, args: &BootstrapCli, shutdown: tokio::sync::watch::Receiver<bool>) -> Result<BootstrapSummary, Error> {
    let started = Instant::now();
    let mappings = crate::scan::selected_mappings(cfg, &args.tables)?;
    let redis = RedisConn::connect(&cfg.redis).await?;
    let renamed = crate::ha::checkpoint::followed_renames(cfg, &redis).await?;
    let mut scanner = Scanner::open(cfg, &mappings, &renamed).await?;
    crate::replicas::counts::load_for(&scanner.mapper, &redis, &cfg.source.name).await?;
    let publish = args.publish && !args.dry_run;
    let (mapper, fence) = (scanner.mapper.clone(), scanner.fence);
    let mut writer = Writer::without_lease(cfg, "bootstrap", mapper, redis.clone(), fence, publish, |key| {
        ApplyOptions::snapshot_writes(args.dry_run, args.publish, key)
    })
    .await?;
    let store = ProgressStore::new(redis, &cfg.source.name);
    tracing::info!(tables = ?mappings.iter().map(|m| &m.table).collect::<Vec<_>>(), dry_run = args.dry_run, publish = args.publish, rate = ?args.rate, "bootstrap starting");
    let mut summary = BootstrapSummary { dry_run: args.dry_run, ..BootstrapSummary::default() };
    for t in 0..scanner.tables.len() {
        if *shutdown.borrow() {
            break;
        }
        let s = table::bootstrap_table(&mut scanner, t, &mut writer, &store, args, &shutdown).await?;
        tracing::info!(table = %s.table, status = s.status, rows = s.rows, changed = s.changed, unchanged = s.unchanged, elapsed_ms = s.elapsed_ms, "bootstrap of table ended");
        summary.add(s);
    }
    scanner.snap.close().await;
    summary.finish(started);
    Ok(summary)
}
