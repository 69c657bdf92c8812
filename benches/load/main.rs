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
//! | `BENCH_BINVAL_WORKERS` | unset (tokio's default: one per core) | `binval run`'s tokio worker threads (`TOKIO_WORKER_THREADS`, binval's process only) |
//! | `BENCH_FETCH_WAIT_MS` | unset (the crate's default, 10) | the app instances' `fetch.wait.max.ms` |
//!
//! What each column means is printed under the tables (`report.rs`).

mod apps;
mod binval;
mod catchup;
mod cell;
mod cpu;
mod report;
mod setup;
mod writer;

use std::time::Duration;

/// One writer rate: `None` = as fast as the connections go.
type Rate = Option<u32>;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
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
    for rate in cell::rates("200,1000,5000,max") {
        let secs = if rate.is_none() { env_or("BENCH_MAX_SECS", 45) } else { env_or("BENCH_SECS", 20) };
        eprintln!("== cell {}: {secs} s of writing", report::rate_name(rate));
        cells.push(cell::run_cell(&bench, rate, writers, Duration::from_secs(secs)).await?);
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
