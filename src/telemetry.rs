//! Logging setup: human-readable lines by default, JSON with `--log-format json` (or
//! `log.format = "json"`); `RUST_LOG` overrides the configured level.

use tracing_subscriber::EnvFilter;

/// Install the global subscriber. `json`: one JSON object per line. `level`: default filter.
pub fn init(json: bool, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_target(false).with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}
