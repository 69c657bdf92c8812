//! `binval run`: the pipeline under a signal handler. The first SIGINT/SIGTERM drains and saves
//! the checkpoint; a second one exits at once (130) without draining.

use std::sync::Arc;

use crate::config::Config;
use crate::error::Error;

/// Serve metrics (when `metrics.listen` is set), then run the pipeline until a signal or a
/// definite error.
pub async fn run(cfg: Config) -> Result<(), Error> {
    if let Some(listen) = &cfg.metrics.listen {
        crate::telemetry::serve_metrics(listen).map_err(crate::error::DefiniteError::MetricsListen)?;
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
    let stats = Arc::new(crate::pipeline::Stats::default());
    crate::pipeline::run(cfg, rx, stats).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}
