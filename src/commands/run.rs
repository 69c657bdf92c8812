//! `binval run`: the pipeline under a signal handler, with the metrics listener and its
//! monitor. The first SIGINT/SIGTERM drains and saves the checkpoint; a second one exits at
//! once (130) without draining.

use std::sync::Arc;

use crate::config::Config;
use crate::error::Error;
use crate::telemetry::{self, names};

/// Serve metrics and the health probes (when `metrics.listen` is set), then run the pipeline
/// until a signal or a definite error.
pub async fn run(cfg: Config) -> Result<(), Error> {
    telemetry::health().configure(cfg.source.lease_ms, cfg.metrics.ready_max_lag_ms);
    if let Some(listen) = &cfg.metrics.listen {
        telemetry::serve(listen, "metrics.listen", &[("source", cfg.source.name.as_str())])
            .await
            .map_err(crate::error::DefiniteError::MetricsListen)?;
        metrics::gauge!(names::INFO, "version" => env!("CARGO_PKG_VERSION"), "process" => process_id()).set(1.0);
        tracing::info!(listen = %listen, "serving Prometheus metrics at /metrics, probes at /healthz and /readyz");
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested: draining and saving the checkpoint (signal again to exit at once)");
        telemetry::health().stopping();
        let _ = tx.send(true);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::warn!("second signal: exiting without draining; the checkpoint is where it was last saved");
        std::process::exit(130);
    });
    let stats = Arc::new(crate::pipeline::Stats::default());
    let monitor = crate::monitor::spawn(&cfg, stats.clone(), rx.clone());
    let result = crate::pipeline::run(cfg, rx, stats).await;
    monitor.abort();
    result?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// `host-pid`: the start of this process's lease holder id (`crate::ha::lease::holder_id`).
fn process_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}
