//! The log subscriber: human-readable lines or JSON, `RUST_LOG` over the configured level.

use tracing_subscriber::EnvFilter;

/// Install the global log subscriber. `json`: one JSON object per line. `level`: default filter.
pub fn init(json: bool, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json { b.json().try_init() } else { b.try_init() };
}
