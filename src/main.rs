//! `binval`: the service and its operator commands. Only the command line (clap) and the
//! dispatch to [`binval::commands`] live here; argument validation is in the commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use binval::commands::bootstrap::BootstrapCli;
use binval::commands::inspect::InspectCli;
use binval::commands::replay::ReplayCli;
use binval::commands::verify::VerifyCli;
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
        #[command(flatten)]
        args: ReplayCli,
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
    /// Where the source's binval stands: leader (lease holder, fencing token), checkpoint and
    /// its age, the primary's binlog position and how many bytes the checkpoint is behind it,
    /// and this host's instance (role, readiness, lag) when metrics.listen answers here.
    /// Read-only.
    Status {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        /// One JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Fill the replicas and version tokens of the existing rows of the mapped tables from a
    /// table scan, beside a live `run`: chunks in primary-key order, each read in a consistent
    /// snapshot and written through the fenced writes at its binlog position (a change
    /// committed later always wins). Resumable (progress in Redis), rate limited; prints a JSON
    /// summary. No invalidation events unless --publish. MariaDB sources.
    Bootstrap {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        args: BootstrapCli,
    },
    /// Check Redis against the database: each row's keys (every replica's payload and
    /// position, the version token), and keys whose row no longer exists. Differences are
    /// judged again after --recheck-ms and counted only without a newer change in between.
    /// JSON summary on stdout (consistency in nines), one JSON line per mismatch on stderr.
    /// Exit 0 consistent, 3 mismatches found. MariaDB sources.
    Verify {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        args: VerifyCli,
    },
    /// One key in full: each replica's name, hash slot, master (and its replicas), position,
    /// fencing token, payload size and TTL; the version token; whether they agree; the
    /// database row the key should hold. Read-only.
    Inspect {
        /// Config file (TOML or YAML): the same as `run`'s.
        #[arg(long, short, env = "BINVAL_CONFIG")]
        config: PathBuf,
        #[command(flatten)]
        args: InspectCli,
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
        /// Also show the columns MariaDB keeps for itself (the hidden hash column of a long
        /// UNIQUE key, `DB_ROW_HASH_<n>`), which SELECT * and binval's payloads leave out.
        #[arg(long)]
        hidden_columns: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let path = match &cli.command {
        Command::Run { config }
        | Command::Check { config }
        | Command::Replay { config, .. }
        | Command::Republish { config, .. }
        | Command::Status { config, .. }
        | Command::Bootstrap { config, .. }
        | Command::Verify { config, .. }
        | Command::Inspect { config, .. } => config.clone(),
        Command::Decode { binlog_file, start, stop, hidden_columns } => {
            let opts = binval::binlog::offline::DecodeOptions { start: *start, stop: *stop, hidden_columns: *hidden_columns };
            return binval::commands::decode::decode(binlog_file, &opts);
        }
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
    binval_security::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = rt.block_on(async move {
        let done = match cli.command {
            Command::Run { .. } => binval::commands::run::run(cfg).await,
            Command::Check { .. } => binval::commands::check::check(cfg).await,
            Command::Replay { args, .. } => binval::commands::replay::cli(cfg, args).await,
            Command::Republish { from, to, dry_run, .. } => binval::commands::republish::cli(&cfg, &from, to.as_deref(), dry_run).await,
            Command::Status { json, .. } => binval::commands::status::cli(&cfg, json).await,
            Command::Bootstrap { args, .. } => binval::commands::bootstrap::cli(cfg, args).await,
            Command::Inspect { args, .. } => binval::commands::inspect::cli(&cfg, args).await,
            // 3: confirmed mismatches (the command ran, Redis and the database differ).
            Command::Verify { args, .. } => {
                return binval::commands::verify::cli(cfg, args).await.map(|ok| if ok { ExitCode::SUCCESS } else { ExitCode::from(3) })
            }
            Command::Decode { .. } => unreachable!("handled without a config"),
        };
        done.map(|()| ExitCode::SUCCESS)
    });
    match result {
        Ok(code) => code,
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
