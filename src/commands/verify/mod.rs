//! `binval verify`: does Redis hold what the database says? For each row checked (every row,
//! a `--sample`, or the rows behind `--keys`), read in a consistent snapshot: the keys it maps
//! to, every replica's payload and position, and the version token ([`compare`]); and the
//! reverse: keys in Redis whose row no longer exists ([`reverse`]). Differences are judged
//! again after `--recheck-ms` and counted only when nothing newer happened in between
//! ([`recheck`]): lag is not inconsistency.
//!
//! Output: the JSON summary on stdout ([`report::VerifySummary`]: rows and keys checked,
//! mismatches by kind, consistency in nines), one JSON line per confirmed mismatch on stderr
//! or `--mismatches FILE`. Exit 0 when consistent, 3 when confirmed mismatches were found
//! (also when `--repair` fixed them: the next run says whether it did), 1/2 on errors.
//! `--repair` rewrites them through the fenced path ([`repair`]). `--every` repeats the run,
//! with the `binval_verify_*` metrics on `--metrics-listen`.
//!
//! Cost: reads every row of the checked tables (in key order, 1000 a snapshot) and every key
//! they map to (pipelines per master); the reverse check `SCAN`s each template over every
//! master and keeps an 8-byte hash per key checked (about 40 MB for a million keys).
//! MariaDB (or Percona Server) only, like `bootstrap`.

pub mod compare;
pub mod forward;
pub mod recheck;
pub mod repair;
pub mod report;
mod reverse;

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use mysql_async::Value;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::Error;
use crate::mapping::KeyChange;
use crate::redis::RedisConn;
use crate::scan::keyspace::KeyResolver;
use crate::scan::Scanner;
use crate::write::apply::{ApplyOptions, Writer};
use forward::Check;
use report::{LineSink, MismatchLine, TableCounts, VerifySummary};

/// Suspects rechecked at most per run; beyond, keys are counted in `not_rechecked`.
pub const MAX_SUSPECTS: usize = 100_000;

/// The flags of `binval verify` (clap; the field docs are the `--help` text).
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyCli {
    /// Only this mapped table (`schema.table`); repeat for several. Default: every mapped table.
    #[arg(long = "table", value_name = "SCHEMA.TABLE")]
    pub tables: Vec<String>,
    /// Check about this percentage of the rows (0 < PCT <= 100), chosen at random by the
    /// server, and of the keys of the reverse check.
    #[arg(long, value_name = "PCT", conflicts_with = "keys")]
    pub sample: Option<f64>,
    /// Check only these logical keys (no table scan, no SCAN).
    #[arg(long, value_name = "KEY", num_args = 1..)]
    pub keys: Vec<String>,
    /// Judge a difference again after this many ms; count it only if it is still there with no
    /// newer change in between.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub recheck_ms: u64,
    /// Rewrite confirmed mismatches through the fenced writes at a fresh snapshot's position and
    /// publish their invalidation events.
    #[arg(long)]
    pub repair: bool,
    /// Skip the reverse check (keys in Redis whose row no longer exists; a SCAN of every master).
    #[arg(long)]
    pub no_reverse: bool,
    /// Write mismatch lines to this file (appended) instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub mismatches: Option<std::path::PathBuf>,
    /// Run again this long after each run ends (e.g. 15m), until SIGTERM; exit 0 then.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub every: Option<Duration>,
    /// Serve the binval_verify_* metrics and /healthz on this ip:port.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_listen: Option<String>,
}

/// How a key is found again in the database.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// By the row's scan key.
    Key(Vec<Value>),
    /// By the columns of key template `.0` of the table's mapping (no row mapped to the key).
    Columns(usize, Vec<(String, String)>),
}

/// A key that differed at its first check.
#[derive(Debug, Clone)]
pub struct Suspect {
    /// Index of its table in the scanner.
    pub table: usize,
    /// The logical key.
    pub key: String,
    /// Its replica count.
    pub replicas: u32,
    /// How to read its row again.
    pub lookup: Lookup,
    /// The row's canonical JSON at the first check (`None`: no row mapped to the key).
    pub row: Option<String>,
    /// The key's token and replica positions at the first check.
    pub positions: (Option<u64>, Vec<Option<u64>>),
    /// The first check's snapshot fence position.
    pub fence: u64,
    /// When it was first seen.
    pub seen: Instant,
}

/// The state of one verify run.
pub struct Ctx<'c> {
    /// The configuration.
    pub cfg: &'c Config,
    /// The source side.
    pub scanner: Scanner,
    /// Redis.
    pub redis: RedisConn,
    /// The counts so far.
    pub summary: VerifySummary,
    /// Keys that differed, to recheck.
    pub suspects: Vec<Suspect>,
    /// Hashes of the keys the forward check covered (for the reverse check).
    pub expected_keys: Option<HashSet<u64, foldhash::fast::FixedState>>,
    /// `--sample` as a fraction.
    pub sample: Option<f64>,
    /// `--recheck-ms`.
    pub recheck_ms: u64,
    /// Stop early.
    pub shutdown: watch::Receiver<bool>,
}

impl Ctx<'_> {
    /// What a check expects (see [`compare::compare`]).
    pub fn expected<'a>(&self, t: usize, c: &'a Check) -> compare::Expected<'a> {
        forward::expected_of(&self.scanner.tables[t].mapping, c)
    }

    /// The change that says "no row maps to `key`" (a delete) for table `t`.
    pub fn delete_change(&self, t: usize, key: &str) -> KeyChange {
        self.scanner.delete_change(t, key)
    }
}

/// A 64-bit hash of a key (fixed seed).
pub fn key_hash(key: &str) -> u64 {
    let mut s = foldhash::quality::FixedState::with_seed(0x5eed_b1a5_7e11_0001).build_hasher();
    s.write(key.as_bytes());
    s.finish()
}

/// `binval verify` from the command line. Returns whether the (last) run found Redis
/// consistent; the caller exits 3 when not.
pub async fn cli(cfg: Config, args: VerifyCli) -> Result<bool, Error> {
    validate(&args)?;
    if let Some(l) = &args.metrics_listen {
        crate::telemetry::serve(l, "--metrics-listen", &[("source", cfg.source.name.as_str())])
            .await
            .map_err(|e| Error::config("--metrics-listen", e.to_string()))?;
    }
    let shutdown = super::shutdown_signal("verify: stopping");
    let mut sink = LineSink::open(args.mismatches.as_deref())?;
    loop {
        let result = run(&cfg, &args, &mut sink, shutdown.clone()).await;
        let consistent = match result {
            Ok(s) => {
                s.record_metrics();
                println!("{}", serde_json::to_string(&s).expect("summary serializes"));
                s.mismatches == 0
            }
            Err(e) if args.every.is_some() && e.is_transient() => {
                metrics::counter!(crate::telemetry::names::VERIFY_RUNS, "result" => "failed").increment(1);
                tracing::warn!(error = %e, "verify run failed; trying again at the next run");
                false
            }
            Err(e) => {
                metrics::counter!(crate::telemetry::names::VERIFY_RUNS, "result" => "failed").increment(1);
                return Err(e);
            }
        };
        let Some(every) = args.every else { return Ok(consistent) };
        let mut stop = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return Ok(true),
        }
    }
}

/// Flag checks that clap cannot express; errors name the flag (exit 2).
fn validate(args: &VerifyCli) -> Result<(), Error> {
    if let Some(p) = args.sample {
        if !(p > 0.0 && p <= 100.0) {
            return Err(Error::config("--sample", format!("{p} is not a percentage in (0, 100]")));
        }
    }
    if args.recheck_ms > 600_000 {
        return Err(Error::config("--recheck-ms", "must be at most 600000 (10 minutes)"));
    }
    Ok(())
}

/// One verify run (module docs). Mismatch lines go to `sink`.
///
/// Errors: unknown `--table` or a `--keys` key of no mapping (config), tables that cannot be
/// scanned, a source without snapshot positions (MySQL), Redis/Kafka/MySQL failures.
pub async fn run(cfg: &Config, args: &VerifyCli, sink: &mut LineSink, shutdown: watch::Receiver<bool>) -> Result<VerifySummary, Error> {
    let started = Instant::now();
    let mappings = crate::scan::selected_mappings(cfg, &args.tables)?;
    let resolver = KeyResolver::new(&cfg.mappings);
    let keys = resolve_keys(&resolver, &mappings, &args.keys)?;
    let redis = RedisConn::connect(&cfg.redis).await?;
    // binval run's checkpoint: the renames it followed, and where it was when verify began.
    let saved = crate::ha::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis).load().await?;
    let renamed = saved.as_ref().map(|c| c.renamed.clone()).unwrap_or_default();
    let scanner = Scanner::open(cfg, &mappings, &renamed).await?;
    crate::replicas::counts::load_for(&scanner.mapper, &redis, &cfg.source.name).await?;
    let summary = VerifySummary {
        tables: scanner.tables.iter().map(|t| TableCounts { table: t.table.to_string(), ..TableCounts::default() }).collect(),
        sample_pct: args.sample,
        recheck_ms: args.recheck_ms,
        checkpoint: saved.as_ref().map(|c| format!("{}:{}", c.file, c.pos)),
        ..VerifySummary::default()
    };
    let reverse = !args.no_reverse && args.keys.is_empty();
    let mut ctx = Ctx {
        cfg,
        scanner,
        redis,
        summary,
        suspects: Vec::new(),
        expected_keys: reverse.then(HashSet::default),
        sample: args.sample.map(|p| p / 100.0),
        recheck_ms: args.recheck_ms,
        shutdown,
    };
    if !args.keys.is_empty() {
        for (t, m, j, key) in &keys {
            reverse::check_keys(&mut ctx, &resolver, *t, *m, *j, std::slice::from_ref(key)).await?;
        }
    } else {
        for t in 0..ctx.scanner.tables.len() {
            forward::check_table(&mut ctx, t).await?;
        }
        if reverse {
            for t in 0..ctx.scanner.tables.len() {
                reverse::check_table(&mut ctx, &resolver, t).await?;
            }
        }
    }
    ctx.expected_keys = None;
    ctx.summary.interrupted = *ctx.shutdown.borrow();
    let confirmed = recheck::recheck(&mut ctx, &resolver).await?;
    for c in &confirmed {
        ctx.summary.confirmed(c.suspect.table, &c.findings);
        sink.line(&mismatch_line(&ctx, c));
    }
    if args.repair && !confirmed.is_empty() {
        let mut writer = repair_writer(cfg, &ctx).await?;
        let r = repair::repair(&mut ctx, &resolver, &mut writer, &confirmed).await?;
        (ctx.summary.repaired, ctx.summary.repair_failed, ctx.summary.repair_events) = (r.repaired, r.failed, r.events);
    }
    ctx.scanner.snap.close().await;
    let mut summary = ctx.summary;
    summary.finish(started.elapsed());
    Ok(summary)
}

/// `--keys`: each key's (table index among `mappings`, mapping index, template index, key).
/// A key of no mapping's template, or of a table not selected, is an error naming `--keys`.
fn resolve_keys(
    resolver: &KeyResolver,
    mappings: &[crate::config::MappingConfig],
    keys: &[String],
) -> Result<Vec<(usize, usize, usize, String)>, Error> {
    keys.iter()
        .map(|k| {
            let o = resolver.owner(k).ok_or_else(|| Error::config("--keys", format!("`{k}` fits no mapping's key template")))?;
            let table = &resolver.mappings[o.mapping].table;
            let t = mappings
                .iter()
                .position(|m| &m.table == table)
                .ok_or_else(|| Error::config("--keys", format!("`{k}` is a key of {table}, which --table leaves out")))?;
            Ok((t, o.mapping, o.template, k.clone()))
        })
        .collect()
}

/// The writer of a repair: events published, the source's current fencing token.
async fn repair_writer(cfg: &Config, ctx: &Ctx<'_>) -> Result<Writer, Error> {
    let (mapper, redis, fence) = (ctx.scanner.mapper.clone(), ctx.redis.clone(), ctx.scanner.fence);
    Writer::without_lease(cfg, "repair", mapper, redis, fence, true, |key| ApplyOptions::snapshot_writes(false, true, key)).await
}

/// The JSON line of a confirmed mismatch.
fn mismatch_line<'a>(ctx: &'a Ctx<'_>, c: &'a recheck::Confirmed) -> MismatchLine<'a> {
    MismatchLine {
        key: &c.suspect.key,
        table: &ctx.scanner.tables[c.suspect.table].table,
        row_key: c.row_key.clone(),
        findings: &c.findings,
        replicas: c
            .findings
            .iter()
            .map(|f| match f.replica {
                Some(r) => binval_protocol::replica_key(&c.suspect.key, r),
                None => binval_protocol::version_key(&c.suspect.key),
            })
            .collect(),
        version: c.state.version,
        replica_positions: c.state.replicas.iter().map(|r| r.position).collect(),
        snapshot: c.snapshot.position.to_string(),
        snapshot_fence_position: c.snapshot.fence.0,
    }
}
