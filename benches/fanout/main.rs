//! The fan-out benchmark of issue #24: what each app instance and the broker pay when many
//! instances read the invalidation topic, per event format. Numbers, no assertions.
//!
//! ```sh
//! cargo bench --bench fanout
//! FANOUT_INSTANCES=1,10,50 FANOUT_SECS=10 cargo bench --bench fanout   # a shorter run
//! ```
//!
//! On this machine's services (binval-testkit: MariaDB with a row binlog, a standalone Redis,
//! tansu, each on free loopback ports) a fresh `binval run` (release build, its own topic of
//! 3 partitions) per cell, a paced writer, and `n` app instances: `n` `binval_consumer::Consumer`s
//! **in this one process** (each with its own librdkafka client, listener thread and local
//! cache), each holding a random sample of the keys so that events evict.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `FANOUT_RATES` | `1000,10000` | key changes/s of the writer |
//! | `FANOUT_FORMATS` | `per_key,batched` | binval's `kafka.event_format` per cell |
//! | `FANOUT_INSTANCES` | `1,10,50,100` | app instances per cell |
//! | `FANOUT_SECS` | 15 | seconds of writing per cell |
//! | `FANOUT_ROWS` | 10000 | rows of the mapped table (one key each, 1 suffix replica) |
//! | `FANOUT_HELD` | 1000 | random rows each instance reads (caches) before the cell |
//! | `FANOUT_ROWS_PER_COMMIT` | rate / 1000, at least 1 | rows per autocommit `UPDATE` (consecutive ids) |
//! | `FANOUT_PROBED` | 10 | instances the eviction probe times (spread over the fleet) |
//! | `FANOUT_FETCH_WAIT_MS` | unset (the crate's 10) | the instances' `fetch.wait.max.ms` |
//!
//! **Consumer CPU per key change per instance**: the instances share this process, so per
//! rate a baseline cell with no instance first measures this process' CPU (user + system,
//! `/proc/self/stat`) per key change with only the writer in it; a cell's consumer CPU is the
//! process' CPU over the cell minus that per-change writer share times the cell's key
//! changes, divided by instances and key changes. It includes librdkafka, the listener
//! threads, the lag checkers and the probe (which reads and polls at most `FANOUT_PROBED`
//! instances). **Broker CPU** is the tansu process' (found by its listener port), over the
//! same window, divided by instances. Messages and bytes fetched per instance come from the
//! consumer's `Stats::messages` / `Stats::message_bytes` (payload bytes after
//! decompression). The window runs from the writer's start until, after binval
//! acknowledged all the writer's changes, the instances received 99% of its messages (or stopped
//! receiving for 3 s).

#[path = "../load/binval.rs"]
#[allow(dead_code)]
mod binval;
mod fleet;
#[path = "../load/setup.rs"]
#[allow(dead_code)]
mod setup;
#[path = "../load/writer.rs"]
#[allow(dead_code)]
mod writer;

use std::time::{Duration, Instant};

use binval_testkit as tk;

use crate::binval::Binval;
use crate::fleet::{Fleet, Received};
use crate::setup::Bench;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn env_list<T: std::str::FromStr>(k: &str, d: &str) -> Vec<T> {
    std::env::var(k).unwrap_or_else(|_| d.into()).split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

/// The figures of one cell.
struct Cell {
    rate: u32,
    format: String,
    instances: usize,
    per_commit: u32,
    /// Key changes the writer and the probe made; the writer's seconds.
    changes: u64,
    writer_secs: f64,
    /// Invalidation messages binval had acknowledged (`binval_events_acked_total`).
    produced: f64,
    /// CPU seconds over the window: this process, the broker, binval.
    process_cpu: f64,
    broker_cpu: f64,
    binval_cpu: f64,
    /// binval's threads over the window, by kind (tokio workers, librdkafka, other).
    binval_threads: tk::procfs::ThreadKinds,
    window_secs: f64,
    /// binval acknowledged the writer's last change in time (None: not within 120 s).
    caught_up: Option<Duration>,
    /// From binval's ack of the last change until the instances received 99% of binval's
    /// messages, and whether they did (false: they stopped receiving for 3 s, or 60 s passed).
    drain: (Duration, bool),
    received: Received,
    held_before: u64,
    evictions: fleet::Evictions,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let rows: u32 = env_or("FANOUT_ROWS", 10_000);
    let held: u32 = env_or("FANOUT_HELD", 1_000);
    let secs: u64 = env_or("FANOUT_SECS", 15);
    let probed: usize = env_or("FANOUT_PROBED", 10);
    let rates: Vec<u32> = env_list("FANOUT_RATES", "1000,10000");
    let formats: Vec<String> = env_list("FANOUT_FORMATS", "per_key,batched");
    let counts: Vec<usize> = env_list("FANOUT_INSTANCES", "1,10,50,100");

    let redis = tk::redis();
    let broker = tk::broker();
    let mut bench = Bench::with_services(rows, tk::mariadb(), vec![redis.url()], broker.bootstrap()).await?;
    bench.redis_mode = "standalone";
    bench.replicas = 1;
    let broker_pid = pid_listening_on("tansu", broker.port);
    println!("services: MariaDB {}, Redis {} (standalone), tansu {} (pid {broker_pid:?})", bench.mysql_root, redis.url(), bench.brokers);
    println!("table {}.items: {rows} rows, one key each (1 suffix replica); each instance holds {held} random rows + {} probe rows; app instances: Consumers in this one process\n", bench.db, setup::PROBES);
    binval::seed(&bench).await?;

    let t_all = Instant::now();
    let mut cells = Vec::new();
    for &rate in &rates {
        let per_commit: u32 = env_or("FANOUT_ROWS_PER_COMMIT", (rate / 1000).max(1));
        eprintln!("== baseline {rate}/s: the writer alone");
        let base = run_cell(&mut bench, rate, per_commit, "per_key", 0, held, probed, secs).await?;
        let writer_per_change = base.process_cpu / base.changes.max(1) as f64;
        cells.push(base);
        for format in &formats {
            for &n in &counts {
                eprintln!("== {rate}/s, {format}, {n} instances ({:.0} s so far)", t_all.elapsed().as_secs_f64());
                match run_cell(&mut bench, rate, per_commit, format, n, held, probed, secs).await {
                    Ok(c) => cells.push(c),
                    Err(e) => println!("cell {rate}/s {format} {n} instances failed: {e:#}"),
                }
                print_cells(&cells, writer_per_change, rate);
            }
        }
    }
    println!("\n## all cells ({:.0} s)\n", t_all.elapsed().as_secs_f64());
    print_all(&cells);
    explain();
    Ok(())
}
#[allow(clippy::too_many_arguments)]
async fn run_cell(
    bench: &mut Bench,
    rate: u32,
    per_commit: u32,
    format: &str,
    n: usize,
    held: u32,
    probed: usize,
    secs: u64,
) -> anyhow::Result<Cell> {
    let name = format!("{rate}_{format}_{n}");
    let topic = bench.fresh_topic(&name)?;
    let start = bench.binlog_now().await?;
    bench.kafka_extra = format!("event_format = \"{format}\"");
    let bv = Binval::spawn(bench, &name, &format!("{}:{}", start.0, start.1), &topic)?;
    bv.wait_ready(Duration::from_secs(60)).await?;
    let fleet = Fleet::start(bench, &topic, n, held).await?;
    let held_before = fleet.held();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let probe = (n > 0).then(|| fleet.probe(bench, probed));
    let broker_pid = pid_listening_on("tansu", tk::broker().port);
    let cpu_of = |pid: Option<u32>| pid.and_then(tk::procfs::cpu_secs).unwrap_or(0.0);
    let (p0, b0, bv0, r0) = (cpu_of(Some(std::process::id())), cpu_of(broker_pid), bv.cpu_secs(), fleet.received());
    let threads0 = bv.thread_kinds();
    let m0 = bv.scrape().await?;
    let t0 = Instant::now();
    let w = writer::run_rows(&bench.app_url(), bench.rows, Some(rate / per_commit), 4, Duration::from_secs(secs), None, per_commit).await?;
    let evictions = match probe {
        Some(p) => p.finish().await,
        None => fleet::Evictions::default(),
    };
    let stop_at = bench.binlog_now().await?;
    let caught_up = bv.wait_acked(&stop_at, Duration::from_secs(120)).await;
    let acked = |m: &binval::Metrics| m.get("binval_events_acked_total", &[]).unwrap_or(0.0);
    let m1 = bv.scrape().await?;
    let drain = fleet.drained(&r0, (acked(&m1) - acked(&m0)) as u64, Duration::from_secs(60)).await;
    let (p1, b1, bv1, r1) = (cpu_of(Some(std::process::id())), cpu_of(broker_pid), bv.cpu_secs(), fleet.received());
    let binval_threads = bv.thread_kinds().since(&threads0);
    let window_secs = t0.elapsed().as_secs_f64();
    fleet.shutdown().await;
    let code = bv.stop().await;
    if code != 0 {
        eprintln!("binval exited {code} after cell {name}");
    }
    Ok(Cell {
        rate,
        format: format.to_string(),
        instances: n,
        per_commit,
        changes: w.commits * per_commit as u64 + evictions.updates,
        writer_secs: w.secs,
        produced: acked(&m1) - acked(&m0),
        process_cpu: p1 - p0,
        broker_cpu: b1 - b0,
        binval_cpu: bv1 - bv0,
        binval_threads,
        window_secs,
        caught_up,
        drain,
        received: r1.since(&r0),
        held_before,
        evictions,
    })
}

/// The pid of the `comm` process whose command line has `127.0.0.1:<port>` (the broker of
/// this benchmark, not another one on the machine).
fn pid_listening_on(comm: &str, port: u16) -> Option<u32> {
    let needle = format!("127.0.0.1:{port}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (name.trim() == comm && String::from_utf8_lossy(&cmdline).contains(&needle)).then_some(pid)
    })
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * q).round() as usize]
}

const HEADER: &str = "| target changes/s | rows/commit | format | instances | changes/s reached | Kafka messages | changes per message | per instance: messages fetched | per instance: KiB fetched | per instance: events applied (% of changes) | per instance: evictions (held before) | consumer CPU per change per instance, µs | commit -> eviction p50 / p99, ms (samples, instances probed) | nines applied within 50 / 200 / 1000 ms (all instances) | broker CPU, cores (per instance, % of a core) | binval CPU per change, µs | binval by thread: tokio / librdkafka / other, µs per change (voluntary switches per change) | binval ack / instances drained after the writer, s |";

fn row(c: &Cell, writer_per_change: f64) -> String {
    let changes = c.changes.max(1) as f64;
    let n = c.instances.max(1) as f64;
    let per = |v: u64| v as f64 / n;
    let (consumer, evict) = if c.instances == 0 {
        ("(baseline: writer alone)".to_string(), "- | -".to_string())
    } else {
        let cpu = (c.process_cpu - writer_per_change * changes).max(0.0) / n / changes * 1e6;
        let e = &c.evictions;
        (
            format!("{cpu:.2}"),
            format!(
                "{:.1} / {:.1} ({}, {}{}) | {}",
                quantile(&e.ms, 0.5),
                quantile(&e.ms, 0.99),
                e.ms.len(),
                e.instances,
                if e.missing > 0 { format!(", {} missing", e.missing) } else { String::new() },
                c.received.nines()
            ),
        )
    };
    format!(
        "| {} | {} | {} | {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} ({:.0}%) | {:.0} ({:.0}) | {consumer} | {evict} | {:.2} ({:.1}%) | {:.1} | {} | {} / {} |",
        c.rate,
        c.per_commit,
        c.format,
        c.instances,
        changes / c.writer_secs.max(1e-9),
        c.produced,
        changes / c.produced.max(1.0),
        per(c.received.messages),
        per(c.received.bytes) / 1024.0,
        per(c.received.events),
        per(c.received.events) / changes * 100.0,
        per(c.received.evictions),
        c.held_before as f64 / n,
        c.broker_cpu / c.window_secs,
        c.broker_cpu / c.window_secs / n * 100.0,
        c.binval_cpu / changes * 1e6,
        {
            let t = &c.binval_threads.0;
            format!(
                "{:.1} / {:.1} / {:.1} ({:.2} / {:.2} / {:.2})",
                t[0].0 / changes * 1e6,
                t[1].0 / changes * 1e6,
                t[2].0 / changes * 1e6,
                t[0].1 as f64 / changes,
                t[1].1 as f64 / changes,
                t[2].1 as f64 / changes
            )
        },
        c.caught_up.map(|d| format!("{:.1}", d.as_secs_f64())).unwrap_or_else(|| "> 120".into()),
        if c.drain.1 || c.instances == 0 {
            format!("{:.1}", c.drain.0.as_secs_f64())
        } else {
            format!("NOT drained: stopped after {:.1}", c.drain.0.as_secs_f64())
        },
    )
}

fn print_header() {
    println!("{HEADER}");
    println!("|{}", "---|".repeat(HEADER.matches('|').count() - 1));
}

/// The cells of `rate` so far.
fn print_cells(cells: &[Cell], writer_per_change: f64, rate: u32) {
    println!();
    print_header();
    for c in cells.iter().filter(|c| c.rate == rate) {
        println!("{}", row(c, writer_per_change));
    }
}

fn print_all(cells: &[Cell]) {
    print_header();
    for c in cells {
        let base = cells.iter().find(|b| b.rate == c.rate && b.instances == 0);
        let writer_per_change = base.map(|b| b.process_cpu / b.changes.max(1) as f64).unwrap_or(0.0);
        println!("{}", row(c, writer_per_change));
    }
}

fn explain() {
    println!(
        r#"
- changes/s reached: the writer's and the probe's key changes (rows updated, one key each) over the writer's seconds; Kafka messages: binval's
  `binval_events_acked_total` over the cell (per_key: one per change; batched: one per partition per apply group;
  progress messages not counted); changes per message: the ratio (target of issue #24: >= 10 at >= 5,000 changes/s).
- per instance: the consumers' `Stats::messages` (every topic message received, progress messages included),
  `Stats::message_bytes` (payload bytes after decompression), `events` and `evictions`, averaged over the instances.
- consumer CPU per change per instance: (this process' CPU over the cell - the baseline cell's CPU per change x the
  cell's changes) / instances / changes. The instances share this process with the writer and the probe.
- commit -> eviction: the probe's commit returned -> the instance no longer holds the version it held (polled every ms),
  pooled over the probed instances; 1 ms of polling resolution.
- broker CPU: the tansu process' CPU over the window (cores), and per instance; binval CPU per change: `binval run`'s.
- binval by thread: the same CPU split by thread (`/proc/PID/task/*`): tokio's workers (reader, apply loop, Redis,
  delivery reports, checkpoint), librdkafka's threads (`rdk:*`, mostly the broker thread), the rest; and each kind's
  voluntary context switches (each a sleep and its wake-up) per change.
- binval ack: from the writer's stop to binval's ack of its last change; instances drained: from then until the
  instances received 99% of binval's messages ("NOT drained": they stopped receiving for 3 s, or 60 s passed: the
  machine did not keep up with that cell; its CPU per change then counts changes not processed)."#
    );
}
