//! The load benchmark of issue #15 (invariant I8): `binval run` beside a steady writer and a
//! burst, on this machine's real services, with two app instances (`binval-consumer`) serving
//! reads meanwhile. Prints one row per writer rate and a catch-up table side by side with
//! python-mysql-replication's decode-only rate over the same binlog. Numbers, no assertions.
//!
//! ```sh
//! scripts/loadbench.sh                 # builds, installs python-mysql-replication in a venv, runs this
//! cargo bench --bench load             # the same without the Python column
//! ```
//!
//! Each rate gets a fresh `binval run` (release build, its own topic, started at the binlog's
//! end) so its CPU, RSS and lag are its own. Settings (environment):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `BENCH_RATES` | `200,1000,5000,max` | writer commits/s per cell; `max` = as fast as the writer's connections go |
//! | `BENCH_SECS` | 20 | seconds of writing per paced cell |
//! | `BENCH_MAX_SECS` | 45 | seconds of writing of the `max` cell |
//! | `BENCH_WRITERS` | 4 | writer connections (each one autocommit single-row `UPDATE` at a time) |
//! | `BENCH_ROWS` | 10000 | rows of the mapped table (8 suffix replicas each) |
//! | `BENCH_CATCHUP` | 150000 | transactions of the catch-up backlog (0: no catch-up table) |
//! | `BENCH_PYTHON` | unset | a python with `pymysqlreplication` importable, for the side-by-side |
//! | `BENCH_LINGER_MS` | unset (binval's default, 5) | binval's producer `linger.ms` (`kafka.properties`) |
//! | `BENCH_FETCH_WAIT_MS` | unset (the crate's default, 10) | the app instances' `fetch.wait.max.ms` |
//!
//! What each column means is printed under the tables (`report.rs`).

mod apps;
mod binval;
mod catchup;
mod cpu;
mod report;
mod setup;
mod writer;

use std::time::{Duration, Instant};

use report::Cell;

/// One writer rate: `None` = as fast as the connections go.
type Rate = Option<u32>;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn rates() -> Vec<Rate> {
    std::env::var("BENCH_RATES")
        .unwrap_or_else(|_| "200,1000,5000,max".into())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| if s.trim() == "max" { None } else { Some(s.trim().parse().expect("BENCH_RATES: numbers or max")) })
        .collect()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let rows: u32 = env_or("BENCH_ROWS", 10_000);
    let writers: usize = env_or("BENCH_WRITERS", 4);
    let bench = setup::Bench::new(rows).await?;
    println!("services: MariaDB {}, Redis Cluster {:?}, tansu {}", bench.mysql_root, bench.cluster, bench.brokers);
    println!(
        "table {}.items: {rows} rows, 8 suffix replicas per key; writer: {writers} connections, single-row autocommit UPDATEs\n",
        bench.db
    );

    binval::seed(&bench).await?;

    let mut cells = Vec::new();
    for rate in rates() {
        let secs = if rate.is_none() { env_or("BENCH_MAX_SECS", 45) } else { env_or("BENCH_SECS", 20) };
        eprintln!("== cell {}: {secs} s of writing", report::rate_name(rate));
        cells.push(run_cell(&bench, rate, writers, Duration::from_secs(secs)).await?);
        report::print_cells(&cells);
    }
    report::print_cells(&cells);
    report::print_legs(&cells);
    report::print_cpu(&cells);
    report::explain_cells();

    let backlog: u64 = env_or("BENCH_CATCHUP", 150_000);
    if backlog > 0 {
        let c = catchup::run(&bench, backlog, writers).await?;
        report::print_catchup(&c);
    }
    Ok(())
}
/// One cell: a fresh binval, two app instances, the writer at `rate` for `secs`, then the
/// catch-up after the writer stops.
async fn run_cell(bench: &setup::Bench, rate: Rate, writers: usize, secs: Duration) -> anyhow::Result<Cell> {
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
