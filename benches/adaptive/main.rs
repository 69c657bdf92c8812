//! The adaptive replica benchmark of issue #23: the same million-row table mapped with
//! `replicas = { min = 1, max = 16 }` and with a static `replicas = 8`, side by side in one run,
//! on this machine's real services. Numbers, no assertions.
//!
//! ```sh
//! cargo bench --bench adaptive
//! ADAPTIVE_ROWS=100000 BENCH_RATES=max cargo bench --bench adaptive   # a shorter run
//! ```
//!
//! Services: binval-testkit's MariaDB (row binlog) and tansu, and a 3-master Redis Cluster of
//! the benchmark's own (so its memory is the two tables' and nothing else's). App instances are
//! `binval_consumer::Consumer`s in this process with their local cache off: every read goes to
//! Redis, as when the fail safe bypasses the local cache, and counts at the app as heat.
//!
//! Phases (each prints its table):
//! 1. **Memory.** Both tables are seeded by a binval run each (50,000-row transactions); Redis
//!    memory (`used_memory` over the masters) and keys after each. Then a live adaptive binval and
//!    a Zipf read load over the adaptive table (`ADAPTIVE_ZIPF_RATE` reads/s, exponent
//!    `ADAPTIVE_ZIPF_S`, row `r` at rank `r`): the hot keys grow, memory is measured again.
//! 2. **A key turns hot at once.** A cold row, idle, then read by every instance as fast as
//!    they go: a timeline in 100 ms steps of the reads each master served (`cmdstat_hmget` of
//!    `INFO commandstats`), max/mean over masters, the count in the key's record (field `n`) and
//!    the count instance 0 reads with.
//! 3. **The key cools.** The readers drop to ~20 reads/s per instance while the row changes every
//!    100 ms; every read is checked (error, missing, or older than the change committed 1 s
//!    before it began) until the extra replicas are gone, and 3 s more.
//! 4. **The maximum rate.** The load benchmark's cell (`benches/load/cell.rs`: a fresh binval,
//!    two app instances, a probe timing commit -> eviction) per writer rate and mapping, with
//!    the fenced script calls per change (`EVALSHA`/`EVAL`/`FCALL` over the masters / commits).
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `ADAPTIVE_ROWS` | 1000000 | rows of each table |
//! | `ADAPTIVE_MAX` | 16 | the adaptive mapping's `max` |
//! | `ADAPTIVE_BUDGET` | 500 | `[adaptive] read_budget_per_master`, reads/s (scaled down with the load: see below) |
//! | `ADAPTIVE_COOL_DOWN_SECS` | 10 | `[adaptive] cool_down_secs` |
//! | `ADAPTIVE_GRACE_MS` | 10000 | `[adaptive] shrink_grace_ms` (the default) |
//! | `ADAPTIVE_ZIPF_RATE` | 20000 | reads/s of the Zipf load (over 2 instances x 8 tasks) |
//! | `ADAPTIVE_ZIPF_S` | 0.99 | its exponent |
//! | `ADAPTIVE_ZIPF_SECS` | 30 | its length |
//! | `ADAPTIVE_HOT_INSTANCES` | 4 | instances reading the hot key |
//! | `ADAPTIVE_HOT_TASKS` | 16 | reader tasks per instance |
//! | `ADAPTIVE_HOT_SECS` | 10 | seconds of the hot reads |
//! | `BENCH_RATES` | `1000,max` | writer commits/s of phase 4 (`max`: as fast as 4 connections go) |
//! | `BENCH_SECS`, `BENCH_MAX_SECS` | 20, 30 | seconds of writing per paced / max cell |
//!
//! The budget: the default, 50,000 reads/s per master, is sized for a production master; two
//! cores here serve a few tens of thousands of reads/s in all, so the benchmark scales the budget
//! down by ~100x to make the same decisions a fleet ~100x larger would cause.

#[path = "../load/apps.rs"]
#[allow(dead_code)]
mod apps;
#[path = "../load/binval.rs"]
#[allow(dead_code)]
mod binval;
#[path = "../load/catchup.rs"]
#[allow(dead_code)]
mod catchup;
#[path = "../load/cell.rs"]
mod cell;
#[path = "../load/cpu.rs"]
mod cpu;
mod masters;
mod readers;
#[path = "../load/report.rs"]
#[allow(dead_code)]
mod report;
#[path = "../load/setup.rs"]
#[allow(dead_code)]
mod setup;
#[path = "../load/writer.rs"]
#[allow(dead_code)]
mod writer;

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use binval_testkit as tk;
use mysql_async::prelude::Queryable;

use crate::binval::Binval;
use crate::masters::Masters;
use crate::setup::Bench;

/// One writer rate: `None` = as fast as the connections go.
type Rate = Option<u32>;

fn env_or<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

const MIB: f64 = 1024.0 * 1024.0;

/// The adaptive run's settings.
struct Settings {
    rows: u32,
    max: u32,
    budget: u64,
    cool_down: u64,
    grace_ms: u64,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let s = Settings {
        rows: env_or("ADAPTIVE_ROWS", 1_000_000),
        max: env_or("ADAPTIVE_MAX", 16),
        budget: env_or("ADAPTIVE_BUDGET", 500),
        cool_down: env_or("ADAPTIVE_COOL_DOWN_SECS", 10),
        grace_ms: env_or("ADAPTIVE_GRACE_MS", 10_000),
    };
    let cluster = tk::OwnedCluster::start_new()?;
    let mut masters = Masters::connect(&cluster.urls())?;
    let (server, broker) = (tk::mariadb(), tk::broker());
    println!(
        "services: MariaDB {}, Redis Cluster {:?} (the benchmark's own), tansu {}",
        server.root_url(),
        cluster.urls(),
        broker.bootstrap()
    );
    println!(
        "tables: {} rows each; adaptive: replicas = {{ min = 1, max = {} }}, read_budget_per_master = {}, cool_down_secs = {}, shrink_grace_ms = {}; static: replicas = 8\n",
        s.rows, s.max, s.budget, s.cool_down, s.grace_ms
    );

    // ---- 1. memory
    let mem0 = (masters.used_memory()?, masters.keys()?);
    let mut adaptive = Bench::with_services(s.rows, server, cluster.urls(), broker.bootstrap()).await?;
    adaptive.replicas = 1;
    adaptive.replicas_setting = Some(format!("{{ min = 1, max = {} }}", s.max));
    adaptive.extra_sections = format!(
        "\n[adaptive]\nread_budget_per_master = {}\ncool_down_secs = {}\nshrink_grace_ms = {}\n",
        s.budget, s.cool_down, s.grace_ms
    );
    eprintln!("== seeding the adaptive table");
    binval::seed(&adaptive).await?;
    let mem1 = (masters.used_memory()?, masters.keys()?);
    let stat = Bench::with_services(s.rows, server, cluster.urls(), broker.bootstrap()).await?;
    eprintln!("== seeding the static-8 table");
    binval::seed(&stat).await?;
    let mem2 = (masters.used_memory()?, masters.keys()?);

    let topic = adaptive.fresh_topic("live")?;
    let at = adaptive.binlog_now().await?;
    let live = Binval::spawn(&adaptive, "live", &format!("{}:{}", at.0, at.1), &topic)?;
    live.wait_ready(Duration::from_secs(60)).await?;
    let zipf_rate: f64 = env_or("ADAPTIVE_ZIPF_RATE", 20_000.0);
    let zipf_s: f64 = env_or("ADAPTIVE_ZIPF_S", 0.99);
    let zipf_secs: u64 = env_or("ADAPTIVE_ZIPF_SECS", 30);
    eprintln!("== Zipf reads, {zipf_rate}/s for {zipf_secs} s");
    let apps = readers::instances(&adaptive, &topic, 2).await?;
    let z = Arc::new(readers::Zipf::new(s.rows as usize, zipf_s));
    let stop = Arc::new(AtomicU8::new(0));
    let t0 = Instant::now();
    let (zt, zh) = readers::zipf(&apps, &adaptive, z.clone(), zipf_rate, 8, stop.clone());
    tokio::time::sleep(Duration::from_secs(zipf_secs)).await;
    let grown = live.scrape().await?.get("binval_adaptive_keys", &[]).unwrap_or(0.0);
    let mem3 = (masters.used_memory()?, masters.keys()?);
    stop.store(1, Relaxed);
    for h in zh {
        h.await?;
    }
    let zipf_done = zt.reads.load(Relaxed) as f64 / t0.elapsed().as_secs_f64();
    let mut counts = Vec::new();
    for r in 1..=8usize {
        let key = format!("{}:item:{r}", adaptive.prefix);
        counts.push(format!("row {r} ({:.0}/s): {}", zipf_done * z.share(r), apps[0].replica_count(&key)));
    }
    for a in &apps {
        a.shutdown().await;
    }
    let one = (mem1.0 as f64 - mem0.0 as f64, mem1.1 - mem0.1);
    let st = (mem2.0 as f64 - mem1.0 as f64, mem2.1 - mem1.1);
    let hot = (one.0 + mem3.0 as f64 - mem2.0 as f64, one.1 + mem3.1 - mem2.1);
    println!("### 1. Redis memory of a {}-row table", s.rows);
    println!("\n| mapping | Redis keys | used_memory, MiB | bytes per row | x one copy |\n|---|---:|---:|---:|---:|");
    let row = |name: &str, (b, k): (f64, u64)| {
        println!("| {name} | {k} | {:.1} | {:.0} | {:.2} |", b / MIB, b / s.rows as f64, b / one.0.max(1.0));
    };
    row("adaptive, seeded: every key at min = 1 (one copy + version token)", one);
    row(&format!("adaptive after {zipf_secs} s of Zipf({zipf_s}) reads at {zipf_done:.0}/s ({grown:.0} keys above min)"), hot);
    row("static replicas = 8", st);
    println!("\nZipf reads: {}", zt.line());
    println!("counts of the hottest rows (the app's): {}\n", counts.join(", "));

    // ---- 2. a key turns hot
    let hot_id = s.rows / 2;
    let key = format!("{}:item:{hot_id}", adaptive.prefix);
    let n_apps: usize = env_or("ADAPTIVE_HOT_INSTANCES", 4);
    let tasks: usize = env_or("ADAPTIVE_HOT_TASKS", 16);
    let hot_secs: u64 = env_or("ADAPTIVE_HOT_SECS", 10);
    let apps = readers::instances(&adaptive, &topic, n_apps).await?;
    // The instances start idle; heat of the Zipf phase is gone from the leader's view first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r0_master = masters.owner(&format!("{key}:r0")).unwrap_or(0);
    let commits: readers::Commits = Default::default();
    let pace = Arc::new(AtomicU8::new(readers::FAST));
    let sampler = Sampler::start(cluster.urls(), apps[0].clone(), key.clone(), r0_master)?;
    let rise = Instant::now();
    eprintln!("== {key} read by {n_apps} instances x {tasks} tasks for {hot_secs} s");
    let (ht, hh) = readers::hot(&apps, &key, tasks, pace.clone(), commits.clone());
    tokio::time::sleep(Duration::from_secs(hot_secs)).await;
    let fast_reads = ht.reads.load(Relaxed) as f64 / rise.elapsed().as_secs_f64();
    let fast_line = ht.line();

    // ---- 3. it cools, while it changes every 100 ms
    pace.store(readers::SLOW, Relaxed);
    let cooled = Instant::now();
    let cooled_ms = ::binval::now_ms();
    // The leader's stored decision (`binval:{<source>}:replicas`, field = the key): when it
    // decided the smaller count, to tell the decision from the step's application.
    let state_key = format!("binval:{{{}_live}}:replicas", adaptive.prefix);
    let mut decided_ms: Option<u64> = None;
    let stop_writer = Arc::new(AtomicBool::new(false));
    let writer = {
        let (url, commits, stop) = (adaptive.app_url(), commits.clone(), stop_writer.clone());
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(url).await?;
            let mut stock = 2_000_000i64;
            while !stop.load(Relaxed) {
                stock += 1;
                c.exec_drop("UPDATE items SET stock = ? WHERE id = ?", (stock, hot_id)).await?;
                commits.lock().unwrap().push((Instant::now(), stock));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    let before_cool = ht.line();
    let (mut announced, mut removed) = (None, None);
    let limit = Duration::from_secs(s.cool_down + s.grace_ms / 1000 + 60);
    while cooled.elapsed() < limit {
        let n = masters.owner(&format!("{key}:r0")).and_then(|i| masters.hget(i, &format!("{key}:r0"), "n"));
        if decided_ms.is_none() {
            let stored = masters.owner(&state_key).and_then(|i| masters.hget(i, &state_key, &key));
            decided_ms = stored
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .filter(|v| v["n"] == 1)
                .and_then(|v| v["at_ms"].as_u64());
        }
        if announced.is_none() && n.as_deref().is_none_or(|n| n == "1") {
            announced = Some(cooled.elapsed());
        }
        if announced.is_some() && (1..s.max).all(|i| !masters.exists(&format!("{key}:r{i}"))) {
            removed = Some(cooled.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    pace.store(readers::STOP, Relaxed);
    stop_writer.store(true, Relaxed);
    for h in hh {
        h.await?;
    }
    writer.await??;
    let samples = sampler.finish();
    for a in &apps {
        a.shutdown().await;
    }
    live.stop().await;
    print_timeline(&samples, r0_master, fast_reads, &fast_line);
    println!("\n### 3. The key cools (readers at ~20 reads/s per instance, the row changing every 100 ms)\n");
    let secs = |d: Option<Duration>| d.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_else(|| "not within the limit".into());
    println!("- the smaller count (n = 1) in the record: {} after the load dropped", secs(announced));
    println!("- the extra replicas removed: {} after the load dropped", secs(removed));
    println!(
        "- the leader decided n = 1 (its stored decision's at_ms) {} after the load dropped",
        decided_ms.map(|t| format!("{:.1} s", t.saturating_sub(cooled_ms) as f64 / 1000.0)).unwrap_or_else(|| "(not seen)".into())
    );
    println!(
        "- configured: cool_down_secs = {}, shrink_grace_ms = {}; the cool-down clock runs from the instances' recent rates, from the start of the newest report that still saw the key hot; the records are removed after the grace",
        s.cool_down, s.grace_ms
    );
    println!("- reads while hot: {before_cool}; over the whole run, shrink included: {}", ht.line());
    println!("  (stale: older than the change committed {} ms before the read began)\n", readers::STALE_MS);

    // ---- 4. the maximum rate
    let rates = cell::rates("1000,max");
    let mut rows = Vec::new();
    let mut cells = Vec::new();
    for rate in rates {
        for (name, bench) in [("static 8", &stat), ("adaptive", &adaptive)] {
            let secs = if rate.is_none() { env_or("BENCH_MAX_SECS", 30) } else { env_or("BENCH_SECS", 20) };
            eprintln!("== {name}, writer {}: {secs} s", report::rate_name(rate));
            let calls0 = masters.total_calls(&["evalsha", "eval", "fcall"])?;
            let c = cell::run_cell(bench, rate, 4, Duration::from_secs(secs)).await?;
            let calls = masters.total_calls(&["evalsha", "eval", "fcall"])? - calls0;
            let commits = c.writer_per_s * c.writer_secs;
            rows.push((name, calls as f64 / commits.max(1.0)));
            cells.push(c);
        }
    }
    println!("### 4. Writer rates, static 8 and adaptive (every key cold: 1 copy)\n");
    println!("| mapping | writer target | writer commits/s | binval tx/s | fenced script calls per change | transactions per group | Redis apply p50 / p99, ms | commit -> eviction p50 / p99, ms (instance 1) |");
    println!("|---|---|---:|---:|---:|---:|---|---|");
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    for ((name, calls), c) in rows.iter().zip(&cells) {
        let (e50, e99, _) = report::quantiles(c.evictions.ms.first().map_or(&[], Vec::as_slice));
        println!(
            "| {name} | {} | {:.0} | {:.0} | {calls:.2} | {} | {} / {} | {e50:.1} / {e99:.1} |",
            report::rate_name(c.rate),
            c.writer_per_s,
            c.binval_tx_per_s,
            ms(c.legs.group_transactions),
            ms(c.legs.redis_apply_ms[0]),
            ms(c.legs.redis_apply_ms[1]),
        );
    }
    println!("\nThe load benchmark's tables of the same cells (static 8 and adaptive alternate, in that order):");
    report::print_cells(&cells);
    report::print_legs(&cells);
    Ok(())
}

/// One sample of the hot key's timeline.
struct Sample {
    at: Duration,
    /// `cmdstat_hmget` calls per master so far.
    hmget: Vec<u64>,
    /// Field `n` of the key's replica 0 (None: not there or no field).
    n: Option<u32>,
    /// The count instance 0 reads the key with.
    app_count: u32,
}

/// A thread sampling every 100 ms.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(urls: Vec<String>, app: Consumer, key: String, r0_master: usize) -> anyhow::Result<Sampler> {
        let mut m = Masters::connect(&urls)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut out = Vec::new();
            let r0 = format!("{key}:r0");
            while !flag.load(Relaxed) {
                let hmget = m.calls("hmget").unwrap_or_default();
                let n = m.hget(r0_master, &r0, "n").and_then(|n| n.parse().ok());
                out.push(Sample { at: t0.elapsed(), hmget, n, app_count: app.replica_count(&key) });
                let next = Duration::from_millis(100 * out.len() as u64);
                std::thread::sleep(next.saturating_sub(t0.elapsed()));
            }
            out
        });
        Ok(Sampler { stop, thread })
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The hot key's timeline (until the load dropped, and 2 s of the cooling) and its summary.
fn print_timeline(samples: &[Sample], r0_master: usize, reads_per_s: f64, tally: &str) {
    println!("### 2. A key turns hot at once ({reads_per_s:.0} reads/s at the instances, local cache off)\n");
    println!("The masters' columns are the Redis reads those made: an instance's single-flight joins concurrent reads of one key into one `HMGET`.\n");
    println!("| t, ms | reads/s per master | max / mean | replica-0 master / mean | n in the record | instance 0 reads over |");
    println!("|---:|---|---:|---:|---:|---:|");
    let mut first_even: Option<Duration> = None;
    let (mut worst_after, mut r0_worst_after) = (0.0f64, 0.0f64);
    let fast_until = samples.iter().position(|s| s.at > Duration::from_secs(env_or("ADAPTIVE_HOT_SECS", 10))).unwrap_or(samples.len());
    for w in samples.windows(2).take(fast_until.saturating_sub(1) + 20) {
        let dt = (w[1].at - w[0].at).as_secs_f64().max(1e-3);
        let per: Vec<f64> = w[1].hmget.iter().zip(&w[0].hmget).map(|(b, a)| b.saturating_sub(*a) as f64 / dt).collect();
        let mean = per.iter().sum::<f64>() / per.len().max(1) as f64;
        let max = per.iter().copied().fold(0.0, f64::max);
        let (ratio, r0) = if mean > 0.0 { (max / mean, per.get(r0_master).copied().unwrap_or(0.0) / mean) } else { (f64::NAN, f64::NAN) };
        let at = w[1].at;
        let fast = at <= samples.get(fast_until.saturating_sub(1)).map_or(at, |s| s.at);
        if fast && mean > 100.0 {
            if first_even.is_none() && ratio <= 1.15 {
                first_even = Some(at);
            }
            if at >= Duration::from_secs(2) {
                worst_after = worst_after.max(ratio);
                r0_worst_after = r0_worst_after.max(r0);
            }
        }
        let per_text: Vec<String> = per.iter().map(|v| format!("{v:.0}")).collect();
        println!(
            "| {} | {} | {ratio:.2} | {r0:.2} | {} | {} |",
            at.as_millis(),
            per_text.join(" / "),
            w[1].n.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            w[1].app_count
        );
    }
    println!(
        "\n- reads per master max/mean <= 1.15 first at {} after the rise; worst max/mean from 2 s to the load's end: {worst_after:.2}; the replica-0 master's worst share / mean over the same span: {r0_worst_after:.2}",
        first_even.map(|d| format!("{} ms", d.as_millis())).unwrap_or_else(|| "never".into())
    );
    println!("- hot reads: {tally}");
}
