//! One cell of the load benchmark: a fresh `binval run` at the binlog's end, the app
//! instances serving reads, the writer at one rate, the catch-up after it stops; the figures
//! of [`Cell`]. Shared with the adaptive benchmark (`benches/adaptive`).

use std::time::{Duration, Instant};

use crate::report::Cell;
use crate::{apps, binval, cpu, report, setup, writer, Rate};

/// The writer rates of `BENCH_RATES` (`default` when unset): commits/s, `max` = as fast as the
/// connections go; an empty list is no cell. Panics naming `BENCH_RATES` on anything else.
pub fn rates(default: &str) -> Vec<Rate> {
    std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| if s.trim() == "max" { None } else { Some(s.trim().parse().expect("BENCH_RATES: numbers or max")) })
        .collect()
}

/// One cell: a fresh binval, two app instances, the writer at `rate` for `secs`, then the
/// catch-up after the writer stops.
pub async fn run_cell(bench: &setup::Bench, rate: Rate, writers: usize, secs: Duration) -> anyhow::Result<Cell> {
    let name = report::rate_name(rate);
    let topic = bench.fresh_topic(&name)?;
    let start = bench.binlog_now().await?;
    let bv = binval::Binval::spawn(bench, &name, &format!("{}:{}", start.0, start.1), &topic)?;
    bv.wait_ready(Duration::from_secs(60)).await?;
    let apps = apps::Apps::start(bench, &topic).await?;
    tokio::time::sleep(Duration::from_secs(1)).await; // instances warm up their caches

    let sampler = bv.sample_every(Duration::from_millis(100));
    let prefix = bench.prefix.clone();
    let probes = apps.probe(bench.app_url(), bench.probe_ids(), move |id| format!("{prefix}:item:{id}"));
    let serving = apps.sample_serving(Duration::from_millis(20));
    let cpu0 = bv.cpu_secs();
    let machine0 = cpu::CpuSnapshot::take();
    let m0 = bv.scrape().await?;
    let w = writer::run(&bench.app_url(), bench.rows, rate, writers, secs, None).await?;
    let stopped = Instant::now();
    let stop_at = bench.binlog_now().await?;
    // The lag 2 s after the stop is read at that moment, while binval may still be catching up.
    let (caught_up, lag_after_2s) = tokio::join!(bv.wait_acked(&stop_at, Duration::from_secs(300)), async {
        tokio::time::sleep(Duration::from_secs(2).saturating_sub(stopped.elapsed())).await;
        bv.scrape().await.ok().and_then(|m| m.get("binval_heartbeat_lag_seconds", &[]))
    });
    let m1 = bv.scrape().await?;
    let cpu = bv.cpu_secs() - cpu0;
    let cpu_by_component = cpu::CpuSnapshot::take().since(&machine0);
    let lags = sampler.finish().await;
    let probe = probes.finish().await;
    let served = serving.finish().await;
    let rss = bv.peak_rss_mib();
    apps.shutdown().await;
    let code = bv.stop().await;
    if code != 0 {
        eprintln!("binval exited {code} after cell {name}");
    }
    let txs = m1.get("binval_transactions_total", &[]).unwrap_or(0.0) - m0.get("binval_transactions_total", &[]).unwrap_or(0.0);
    let rows = m1.get("binval_rows_total", &[]).unwrap_or(0.0) - m0.get("binval_rows_total", &[]).unwrap_or(0.0);
    let busy = w.secs + caught_up.map(|d| d.as_secs_f64()).unwrap_or(0.0);
    Ok(Cell {
        rate,
        writer_per_s: w.commits as f64 / w.secs,
        writer_secs: w.secs,
        cpu_by_component,
        binval_tx_per_s: txs / busy.max(1e-9),
        binval_rows_per_s: rows / busy.max(1e-9),
        cpu_us_per_tx: if txs > 0.0 { cpu * 1e6 / txs } else { f64::NAN },
        lag_s: lags,
        caught_up,
        lag_after_2s,
        evictions: probe,
        served_locally: served,
        peak_rss_mib: rss,
        legs: report::Legs {
            redis_apply_ms: [0.5, 0.99].map(|q| m1.quantile_since(&m0, "binval_redis_apply_seconds", q).map(|s| s * 1e3)),
            kafka_ack_ms: [0.5, 0.99].map(|q| m1.quantile_since(&m0, "binval_kafka_delivery_seconds", q).map(|s| s * 1e3)),
            group_transactions: m1.mean_since(&m0, "binval_apply_group_transactions"),
        },
    })
}
