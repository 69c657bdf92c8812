//! `binval`: the service and its operator commands.

use std::path::PathBuf;
use std::process::ExitCode;

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
        Command::Run { config } | Command::Check { config } | Command::Replay { config, .. } | Command::Republish { config, .. } => {
            config.clone()
        }
        Command::Decode { binlog_file, start, stop } => return binval::commands::decode::decode(binlog_file, *start, *stop),
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
            Command::Run { .. } => binval::commands::run::run(cfg).await,
            Command::Check { .. } => binval::commands::check::check(cfg).await,
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
    use binval::commands::replay::{ReplayArgs, ReplayPoint};
    let from = ReplayPoint::parse("--from", &from).map_err(|r| Error::config("--from", r))?;
    let to = to.map(|t| ReplayPoint::parse("--to", &t)).transpose().map_err(|r| Error::config("--to", r))?;
    if rate == Some(0) {
        return Err(Error::config("--rate", "must be at least 1 key change per second"));
    }
    if server_id == Some(cfg.source.server_id) {
        return Err(Error::config(
            "--server-id",
            format!(
                "{} is source.server_id, which the live `binval run` uses: the server would disconnect one of them",
                cfg.source.server_id
            ),
        ));
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
    let summary = binval::commands::replay::run(&cfg, &args, |line| println!("{line}"), rx).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}

async fn republish(cfg: Config, from: String, to: Option<String>, dry_run: bool) -> Result<(), Error> {
    use binval::commands::republish::RepublishFrom;
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
    let summary = binval::commands::republish::run(&cfg, &from, to, dry_run).await?;
    println!("{}", serde_json::to_string(&summary).expect("summary serializes"));
    Ok(())
}
