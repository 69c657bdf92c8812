//! `binval`: the service and its operator commands.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use binval::config::Config;
use binval::error::Error;

#[derive(Parser)]
#[command(name = "binval", version, about = "Keeps hot Redis keys and app-local caches in step with MySQL/MariaDB via the binlog")]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, global = true, env = "BINVAL_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pipeline: binlog -> Redis replicas + version tokens -> Kafka invalidation events.
    /// Stops cleanly on SIGINT/SIGTERM (drains, saves the checkpoint, exits 0).
    Run {
        /// Config file (TOML or YAML). Environment BINVAL__SECTION__FIELD overrides it.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
    },
    /// Preflight: validate the config, check the source's binlog settings, Redis and Kafka.
    Check {
        /// Config file (TOML or YAML).
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
    },
    /// Re-apply a binlog range through the same version-fenced writes as `run` (safe beside a
    /// live `run`: changes Redis already holds are no-ops). Prints one JSON summary line; with
    /// --dry-run also one JSON line per key change (key, op, version now and new, replica
    /// positions, would_change) and writes nothing.
    Replay {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        /// Start: FILE:POS, gtid:D-S-N (the first transaction after it) or a UTC date-time
        /// "YYYY-MM-DD HH:MM:SS".
        #[arg(long)]
        from: String,
        /// End, inclusive (same forms). Default: the primary's position when replay starts.
        #[arg(long)]
        to: Option<String>,
        /// Only this mapped table (`schema.table`); repeat for several. Default: all mapped tables.
        #[arg(long = "table")]
        tables: Vec<String>,
        /// Print what would change and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// At most this many key changes per second.
        #[arg(long)]
        rate: Option<u32>,
        /// server_id of replay's replica connection (default: source.server_id + 1000000).
        #[arg(long)]
        server_id: Option<u32>,
        /// No progress line on stderr.
        #[arg(long)]
        quiet: bool,
        /// When the checkpoint records renamed mapped tables: `checkpoint` (they were renamed
        /// before --from) or `none` (start with the configured names).
        #[arg(long, value_parser = ["checkpoint", "none"])]
        renames: Option<String>,
    },
    /// Publish the invalidation events of a past range again, so app instances that missed
    /// them (e.g. partitioned from the broker) apply them now. Idempotent for consumers (the
    /// evict rule); Redis is not touched. Prints one JSON summary line.
    Republish {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        /// Start: a UTC date-time "YYYY-MM-DD HH:MM:SS" (Kafka message time) or
        /// PARTITION:OFFSET[,PARTITION:OFFSET...].
        #[arg(long)]
        from: String,
        /// End (message time, UTC, inclusive). Default: the end of each partition at start.
        #[arg(long)]
        to: Option<String>,
        /// Count what would be re-published, publish nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Decode a binlog file offline: one JSON line per event and per row (canonical values).
    /// Exits 1 with the file and position when the file is truncated, corrupt or undecodable.
    Decode {
        /// The binlog file (MySQL 5.x-8.x or MariaDB).
        #[arg(long)]
        binlog_file: PathBuf,
        /// First event position (an event boundary). Default: the first event (4).
        #[arg(long)]
        start: Option<u64>,
        /// Stop before this position. Default: end of file.
        #[arg(long)]
        stop: Option<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let path = match &cli.command {
        Command::Run { config } | Command::Check { config } | Command::Replay { config, .. } | Command::Republish { config, .. } => config.clone(),
        Command::Decode { binlog_file, start, stop } => return decode(binlog_file, *start, *stop),
    };
    let cfg = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let json = match cli.log_format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Text) => false,
        None => cfg.log.format.as_deref() == Some("json"),
    };
    binval::telemetry::init(json, cfg.log.level.as_deref().unwrap_or("info"));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = rt.block_on(async move {
        match cli.command {
            Command::Run { .. } => run(cfg).await,
            Command::Check { .. } => check(cfg).await,
            Command::Replay { from, to, tables, dry_run, rate, server_id, quiet, renames, .. } => {
                let renames = renames.map(|r| r == "checkpoint");
                replay(cfg, from, to, tables, dry_run, rate, server_id, !quiet, renames).await
            }
            Command::Republish { from, to, dry_run, .. } => republish(cfg, from, to, dry_run).await,
            Command::Decode { .. } => unreachable!("handled without a config"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                tracing::error!(error = %e, "binval stopped");
            } else {
                eprintln!("error: {e}");
            }
            // 2: bad configuration or arguments (like a config file error), 1: anything else.
            match e {
                Error::Definite(binval::error::DefiniteError::Config(_)) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

async fn run(cfg: Config) -> Result<(), Error> {
    if let Some(listen) = &cfg.metrics.listen {
        binval::telemetry::serve_metrics(listen).map_err(binval::error::DefiniteError::MetricsListen)?;
        tracing::info!(listen = %listen, "serving Prometheus metrics at /metrics");
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested: draining and saving the checkpoint (signal again to exit at once)");
        let _ = tx.send(true);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::warn!("second signal: exiting without draining; the checkpoint is where it was last saved");
        std::process::exit(130);
    });
    let stats = Arc::new(binval::pipeline::Stats::default());
    binval::pipeline::run(cfg, rx, stats).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn replay(
    cfg: Config,
    from: String,
    to: Option<String>,
    tables: Vec<String>,
    dry_run: bool,
    rate: Option<u32>,
    server_id: Option<u32>,
    progress: bool,
    renames_from_checkpoint: Option<bool>,
) -> Result<(), Error> {
    use binval::replay::{ReplayArgs, ReplayPoint};
    let from = ReplayPoint::parse("--from", &from).map_err(|r| Error::config("--from", r))?;
    let to = to.map(|t| ReplayPoint::parse("--to", &t)).transpose().map_err(|r| Error::config("--to", r))?;
    if rate == Some(0) {
        return Err(Error::config("--rate", "must be at least 1 key change per second"));
    }
    if server_id == Some(cfg.source.server_id) {
        return Err(Error::config("--server-id", format!("{} is source.server_id, which the live `binval run` uses: the server would disconnect one of them", cfg.source.server_id)));
    }
    if let Some(to) = &to {
        ReplayPoint::check_range(&from, to).map_err(|r| Error::config("--to", r))?;
    }
    let args = ReplayArgs { from, to, tables, dry_run, rate, server_id, progress, renames_from_checkpoint };
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::warn!("interrupted: stopping replay after the current transaction (rerun it: replay is idempotent)");
        let _ = tx.send(true);
    });
    let summary = binval::replay::run(&cfg, &args, |line| println!("{line}"), rx).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

async fn republish(cfg: Config, from: String, to: Option<String>, dry_run: bool) -> Result<(), Error> {
    use binval::republish::RepublishFrom;
    let from = RepublishFrom::parse(&from).map_err(|r| Error::config("--from", r))?;
    let to = match to {
        Some(t) => match RepublishFrom::parse(&t) {
            Ok(RepublishFrom::Time(ms)) => Some(ms),
            _ => return Err(Error::config("--to", format!("`{t}`: expected a UTC date-time"))),
        },
        None => None,
    };
    if let (RepublishFrom::Time(a), Some(b)) = (&from, to) {
        if b < *a {
            return Err(Error::config("--to", "the end time is before --from"));
        }
    }
    let summary = binval::republish::run(&cfg, &from, to, dry_run).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

async fn check(cfg: Config) -> Result<(), Error> {
    let mut conn = binval::source::connect(&cfg.source).await?;
    let info = binval::source::preflight(&mut conn).await?;
    println!("source: {} ok (binlog at {}:{})", info.version, info.current.file, info.current.pos);
    let problems = binval::source::check_mappings(&mut conn, &cfg.mappings).await?;
    for p in &problems {
        println!("mapping problem: {p}");
    }
    if !problems.is_empty() {
        return Err(Error::config("mappings", format!("{} problem(s) against the source schema (listed above)", problems.len())));
    }
    let mut redis = binval::redis_sink::RedisConn::connect(&cfg.redis).await?;
    let pong: String = redis
        .query(&redis::cmd("PING"))
        .await
        .map_err(|e| binval::error::TransientError::Redis(e.to_string()))?;
    println!("redis: {pong}");
    // Where `run` would start: the checkpoint (it must be readable), else source.start (its
    // binlog file must still exist on the source).
    let mut store = binval::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, &cfg.source.name, &redis);
    match store.load().await? {
        Some(cp) => println!("checkpoint: {}:{} in {} (run resumes there; source.start is ignored)", cp.file, cp.pos, store.location()),
        None => {
            if let Ok(binval::config::StartPosition::FilePos { file, pos }) = binval::config::StartPosition::parse(&cfg.source.start) {
                let mut conn = binval::source::connect(&cfg.source).await?;
                let logs = binval::source::binary_logs(&mut conn).await?;
                if !logs.contains(&file) {
                    return Err(binval::error::DefiniteError::PositionGone {
                        position: format!("{file}:{pos}"),
                        message: format!("source.start names file {file}, which is not among the server's binary logs ({})", logs.join(", ")),
                    }
                    .into());
                }
            }
            println!("checkpoint: none in {}; run starts at source.start = {}", store.location(), cfg.source.start);
        }
    }
    // Read-only: check never creates the topic (run does, when kafka.create_topic is true).
    let mut kc = cfg.kafka.clone();
    kc.create_topic = false;
    let k = binval::kafka_sink::KafkaSink::connect(&kc).await?;
    println!("kafka: brokers {} reachable (topic {})", cfg.kafka.brokers, k.topic());
    println!("mappings: {} table(s)", cfg.mappings.len());
    Ok(())
}

fn decode(file: &std::path::Path, start: Option<u64>, stop: Option<u64>) -> ExitCode {
    use std::io::Write;
    if let (Some(a), Some(b)) = (start, stop) {
        if b <= a {
            eprintln!("error: --stop {b} is not after --start {a}");
            return ExitCode::from(2);
        }
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut broken_pipe = false;
    let r = binval::offline::read_file(file, start, stop, |line| {
        if !broken_pipe && writeln!(out, "{line}").is_err() {
            broken_pipe = true;
        }
    });
    let _ = out.flush();
    match r {
        Ok(s) => {
            eprintln!("{}: {} events, {} row events, {} rows, read to position {}", file.display(), s.events, s.row_events, s.rows, s.end_pos);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
