//! The fault benchmark of issue #22 (invariant I9): what app instances serve *while* things
//! fail under a steady write load. Numbers, no assertions.
//!
//! ```sh
//! cargo bench --bench faults
//! ```
//!
//! On this machine's real services, started for the run on free loopback ports: a MariaDB
//! (row binlog), a 3-master Redis Cluster and a tansu broker of the benchmark's own (so it can
//! restart and freeze them), two `binval run` of the release build for the same source (an HA
//! pair: one leads, one stands by), and two app instances (`binval-consumer`, staleness bound
//! `BENCH_BOUND_MS`, default 2000).
//!
//! A writer does `BENCH_RATE` (default 300) single-row commits/s on a mapped table of
//! `BENCH_ROWS` rows (8 suffix replicas each, over the 3 masters). A stamp row is updated every
//! 250 ms with an increasing number; each app instance reads it every 20 ms. A read that
//! returns stamp `s` at time `t` is **stale** when stamp `s + 1` was committed more than the
//! bound before `t`: the app served a value older than its bound as if it were fresh. Reads
//! that returned an error are counted apart (an app's fail safe may refuse rather than serve
//! a stale value).
//!
//! The Cluster runs with `cluster-require-full-coverage no` (the recommended setting;
//! `BENCH_FULL_COVERAGE=yes` for Redis's default) and no replicas, `cluster-node-timeout` 5 s.
//!
//! `BENCH_ROUNDS` (default 1) repeats the whole cycle (a soak: 5 rounds take about 8 minutes;
//! each round freezes the next master, and a new standby is started after each kill).
//!
//! Phases (seconds from `BENCH_PHASE_SECS`, default 10): no fault; the broker frozen
//! (SIGSTOP) 10 s; settle; one Redis master frozen 7 s; settle; every Redis client connection
//! killed (`CLIENT KILL TYPE normal`); the leader's replica connection killed on the source
//! (`KILL` of its Binlog Dump thread); the source (a MariaDB of the benchmark's own) stopped 3 s
//! and started again; one app instance replaced by a new one (empty local cache); the leader
//! killed (SIGKILL); settle. It prints one row per phase, the takeover time of the standby, the lag gauge of the
//! new leader in its first seconds, and what `binval verify` finds afterwards.

#[path = "../load/binval.rs"]
#[allow(dead_code)]
mod binval;
#[path = "../load/setup.rs"]
#[allow(dead_code)]
mod setup;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use binval_testkit as tk;
use mysql_async::prelude::Queryable;
use tokio::sync::watch;

use crate::binval::Binval;
use crate::setup::Bench;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Commit instants of the stamps, index = stamp.
type Stamps = Arc<Mutex<Vec<Instant>>>;

/// One read of the stamp row by an app instance.
#[derive(Clone, Copy)]
enum Read {
    /// Served a value; `stale_ms`: how long past its successor's commit (0: the newest).
    Served { stale_ms: u64 },
    /// The read returned an error (or no row).
    Refused,
}

/// The reads of one phase.
#[derive(Default)]
struct Phase {
    name: &'static str,
    reads: Vec<Read>,
}

impl Phase {
    fn row(&self, bound_ms: u64) -> String {
        let served: Vec<u64> =
            self.reads.iter().filter_map(|r| if let Read::Served { stale_ms } = r { Some(*stale_ms) } else { None }).collect();
        let refused = self.reads.len() - served.len();
        let stale = served.iter().filter(|&&s| s > bound_ms).count();
        let worst = served.iter().copied().max().unwrap_or(0);
        format!(
            "| {:<22} | {:>6} | {:>6} | {:>9} | {:>8} |",
            self.name,
            self.reads.len(),
            stale,
            format!("{:.2}", worst as f64 / 1000.0),
            refused
        )
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let rows = env_u64("BENCH_ROWS", 2_000) as u32;
    let rate = env_u64("BENCH_RATE", 300) as u32;
    let bound_ms = env_u64("BENCH_BOUND_MS", 2_000);
    let phase_secs = Duration::from_secs(env_u64("BENCH_PHASE_SECS", 10));
    let rounds = env_u64("BENCH_ROUNDS", 1).max(1) as usize;
    let cluster = tk::OwnedCluster::start_new()?;
    // What the docs recommend for a Cluster binval writes to (README "While things fail"): a
    // master frozen past `cluster-node-timeout` must not make the others refuse their slots.
    let coverage = std::env::var("BENCH_FULL_COVERAGE").unwrap_or_else(|_| "no".into());
    for url in cluster.urls() {
        let mut c = redis::Client::open(url)?.get_connection()?;
        redis::cmd("CONFIG").arg("SET").arg("cluster-require-full-coverage").arg(&coverage).query::<()>(&mut c)?;
    }
    let broker = tk::OwnedBroker::start_new()?;
    // A MariaDB of the benchmark's own, so it can be restarted.
    let source = tk::MariaDb::start_with(&[])?;
    let bench = Bench::with_services(rows, &source, cluster.urls(), broker.bootstrap()).await?;
    let topic = format!("{}_faults", bench.prefix);
    broker.create_topic(&topic, 3)?;
    let start = format!("{}:{}", bench.before_rows.0, bench.before_rows.1);
    let mut a = Some(Binval::spawn(&bench, "faults", &start, &topic)?);
    a.as_ref().expect("started").wait_ready(Duration::from_secs(120)).await?;
    let mut b = Some(Binval::spawn(&bench, "faults", &start, &topic)?);
    tokio::time::sleep(Duration::from_secs(2)).await;

    let build_app = || {
        Consumer::builder()
            .redis_cluster(bench.cluster.clone())
            .brokers(bench.brokers.clone())
            .topic(topic.clone())
            .replicas(8)
            .max_staleness(Some(Duration::from_millis(bound_ms)))
            .max_entries(rows as u64 + 1_000)
            .build()
    };
    // Each app instance in a slot, so one can be replaced (killed and started again).
    let mut apps: Vec<Arc<Mutex<Consumer>>> = Vec::new();
    for _ in 0..2 {
        apps.push(Arc::new(Mutex::new(build_app().await?)));
    }
    let stamp_id = bench.probe_ids()[0];
    let stamp_key = bench.key(stamp_id);
    let stamps: Stamps = Arc::new(Mutex::new(Vec::new()));
    let (stop, stopped) = watch::channel(false);
    let writer = {
        let url = bench.app_url();
        let stopped = stopped.clone();
        tokio::spawn(async move {
            let mut done = 0u64;
            while !*stopped.borrow() {
                let w = setup_writer(&url, rows, rate, Duration::from_secs(5)).await;
                done += w.unwrap_or(0);
            }
            done
        })
    };
    let stamper = tokio::spawn(stamp_loop(bench.app_url(), stamp_id, stamps.clone(), stopped.clone()));
    let current: Arc<Mutex<Phase>> = Arc::new(Mutex::new(Phase { name: "warm-up", reads: Vec::new() }));
    let readers: Vec<_> = apps
        .iter()
        .map(|c| tokio::spawn(read_loop(c.clone(), stamp_key.clone(), stamps.clone(), current.clone(), stopped.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut phases: Vec<Phase> = Vec::new();
    let next = |name: &'static str| std::mem::replace(&mut *current.lock().unwrap(), Phase { name, reads: Vec::new() });
    let mut takeovers: Vec<Option<Duration>> = Vec::new();
    let mut lag_samples = Vec::new();
    let started = Instant::now();
    for round in 0..rounds {
        let previous = next("no fault");
        if round > 0 {
            phases.push(previous);
        }
        tokio::time::sleep(phase_secs).await;
        phases.push(next("broker frozen 10 s"));
        broker.freeze(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        broker.freeze(false);
        phases.push(next("after the broker"));
        tokio::time::sleep(phase_secs).await;
        phases.push(next("Redis master frozen 7 s"));
        let frozen = round % 3;
        cluster.freeze_node(frozen, true);
        tokio::time::sleep(Duration::from_secs(7)).await;
        cluster.freeze_node(frozen, false);
        phases.push(next("after the master"));
        tokio::time::sleep(phase_secs).await;

        // Every client connection of every master killed (CLIENT KILL TYPE normal): binval's
        // and the apps' connections drop and reconnect.
        phases.push(next("Redis CLIENT KILL"));
        for url in cluster.urls() {
            let mut c = redis::Client::open(url)?.get_connection()?;
            let _: redis::RedisResult<i64> =
                redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").arg("SKIPME").arg("yes").query(&mut c);
        }
        tokio::time::sleep(phase_secs).await;
        // The leader's replica connection killed on the source (`KILL` of its Binlog Dump
        // thread).
        phases.push(next("binlog dump KILLed"));
        kill_binlog_dumps(&bench.app_url()).await?;
        tokio::time::sleep(phase_secs).await;

        // The source restarted (stopped 3 s): the leader reconnects and resumes.
        phases.push(next("MariaDB restarted"));
        source.stop();
        tokio::time::sleep(Duration::from_secs(3)).await;
        source.start_again()?;
        tokio::time::sleep(phase_secs).await;

        // An app instance killed and started again: the new one begins with an empty local
        // cache (the old one is dropped without a shutdown, as a crash leaves it).
        phases.push(next("app instance restarted"));
        let fresh = build_app().await?;
        let old = std::mem::replace(&mut *apps[1].lock().unwrap(), fresh);
        tokio::spawn(async move { old.shutdown().await });
        tokio::time::sleep(phase_secs).await;

        // Kill -9 whichever instance leads; time the standby's takeover; start a new standby.
        phases.push(next("leader killed"));
        let (leader, standby) = {
            let la = leader_of(a.as_ref().expect("running")).await;
            if la {
                (a.take().expect("running"), b.take().expect("running"))
            } else {
                (b.take().expect("running"), a.take().expect("running"))
            }
        };
        let killed = Instant::now();
        leader.kill();
        let mut took = None;
        while killed.elapsed() < Duration::from_secs(20) {
            if let Ok(m) = standby.scrape().await {
                if took.is_none() && m.get("binval_leader", &[]) == Some(1.0) && m.get("binval_source_connected", &[]) == Some(1.0) {
                    took = Some(killed.elapsed());
                }
                if took.is_some() {
                    if round == 0 {
                        lag_samples.push((killed.elapsed().as_secs_f64(), m.get("binval_lag_seconds", &[]).unwrap_or(-1.0)));
                    }
                    if killed.elapsed() > took.unwrap_or_default() + Duration::from_secs(3) {
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        takeovers.push(took);
        a = Some(standby);
        b = Some(Binval::spawn(&bench, "faults", &start, &topic)?);
        tokio::time::sleep(phase_secs.saturating_sub(killed.elapsed())).await;
    }
    phases.push(next("after the last round"));
    let soak = started.elapsed();

    let _ = stop.send(true);
    let commits = writer.await.unwrap_or(0);
    let _ = stamper.await;
    for r in readers {
        let _ = r.await;
    }
    let mut counters = Vec::new();
    for slot in &apps {
        let c = slot.lock().unwrap().clone();
        counters.push(c.stats());
        c.shutdown().await;
    }

    println!("\n# Fault benchmark (issue #22): reads of a stamp row changed every 250 ms, bound {bound_ms} ms, writer {rate} commits/s ({commits} in all), 2 app instances\n");
    println!("| phase                  |  reads | stale  | worst (s) | refused  |");
    println!("|---|---|---|---|---|");
    let mut merged: Vec<Phase> = Vec::new();
    for p in phases {
        match merged.iter_mut().find(|m| m.name == p.name) {
            Some(m) => m.reads.extend(p.reads),
            None => merged.push(p),
        }
    }
    for p in &merged {
        println!("{}", p.row(bound_ms));
    }
    let all: usize =
        merged.iter().map(|p| p.reads.iter().filter(|r| matches!(r, Read::Served { stale_ms } if *stale_ms > bound_ms)).count()).sum();
    let reads: usize = merged.iter().map(|p| p.reads.len()).sum();
    println!("\n{rounds} rounds in {:.0} s: stale reads past the bound in all phases: {all} of {reads}", soak.as_secs_f64());
    let t: Vec<String> = takeovers.iter().map(|t| t.map_or("none within 20 s".into(), |t| format!("{:.2} s", t.as_secs_f64()))).collect();
    println!("standby leading and connected to the source after each leader's SIGKILL: {}", t.join(", "));
    let lags: Vec<String> = lag_samples.iter().take(12).map(|(t, l)| format!("{t:.1}s:{l:.2}")).collect();
    println!("first new leader's binval_lag_seconds after the kill (time: value): {}", lags.join(" "));
    for (i, s) in counters.iter().enumerate() {
        println!("app {i}: {s:?}");
    }
    // Settle, then verify everything.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cfg = tk::state_root().join("configs").join(format!("{}_faults.toml", bench.prefix));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_binval")).arg("verify").arg("--config").arg(&cfg).output()?;
    println!("binval verify: exit {:?}\n{}", out.status.code(), String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or(""));
    for x in [a, b].into_iter().flatten() {
        x.stop().await;
    }
    Ok(())
}

/// `KILL` every `Binlog Dump` thread of the benchmark's replica user on the source (the
/// leader's replica connection; other tests' readers on the shared server are not ours).
async fn kill_binlog_dumps(url: &str) -> anyhow::Result<()> {
    let mut c = mysql_async::Conn::from_url(url).await?;
    let ids: Vec<u64> =
        c.query("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%' AND USER = 'binval'").await?;
    for id in ids {
        let _ = c.query_drop(format!("KILL {id}")).await;
    }
    c.disconnect().await?;
    Ok(())
}

/// Whether this instance leads now.
async fn leader_of(b: &Binval) -> bool {
    b.scrape().await.ok().and_then(|m| m.get("binval_leader", &[])) == Some(1.0)
}

/// The background writer: `rate` single-row updates per second for `secs`; commits done.
async fn setup_writer(url: &str, rows: u32, rate: u32, secs: Duration) -> anyhow::Result<u64> {
    let mut c = mysql_async::Conn::from_url(url).await?;
    let t0 = Instant::now();
    let mut done = 0u64;
    while t0.elapsed() < secs {
        let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
        if done >= due {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let id = 1 + (done * 7919) as u32 % rows;
        // A failed commit (MariaDB busy) is not retried: the writer only makes load.
        if c.exec_drop("UPDATE items SET price = price + 0.01, updated = NOW(3) WHERE id = ?", (id,)).await.is_ok() {
            done += 1;
        }
    }
    let _ = c.disconnect().await;
    Ok(done)
}

/// Every 250 ms: the stamp row's `stock` := the next stamp; its commit instant recorded.
async fn stamp_loop(url: String, id: u32, stamps: Stamps, stopped: watch::Receiver<bool>) {
    let mut conn: Option<mysql_async::Conn> = None;
    while !*stopped.borrow() {
        if conn.is_none() {
            conn = mysql_async::Conn::from_url(url.as_str()).await.ok();
        }
        if let Some(c) = conn.as_mut() {
            let s = stamps.lock().unwrap().len() as i64;
            match c.exec_drop("UPDATE items SET stock = ? WHERE id = ?", (s, id)).await {
                Ok(()) => stamps.lock().unwrap().push(Instant::now()),
                // The source restarted: connect again.
                Err(_) => conn = None,
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every 20 ms: read the stamp row through the app instance and judge the value.
async fn read_loop(slot: Arc<Mutex<Consumer>>, key: String, stamps: Stamps, phase: Arc<Mutex<Phase>>, stopped: watch::Receiver<bool>) {
    while !*stopped.borrow() {
        let c = slot.lock().unwrap().clone();
        let r = c.get(&key).await;
        let now = Instant::now();
        let read = match r {
            Ok(Some(v)) => match stamp_of(&v) {
                Some(s) => {
                    let st = stamps.lock().unwrap();
                    // The successor's commit: the value is stale from then on.
                    let stale_ms = st.get(s as usize + 1).map_or(0, |&next| now.saturating_duration_since(next).as_millis() as u64);
                    Read::Served { stale_ms }
                }
                // Before the first stamp (stock is the seeded 1,000,000): as old as the first.
                None => Read::Served {
                    stale_ms: stamps.lock().unwrap().first().map_or(0, |&f| now.saturating_duration_since(f).as_millis() as u64),
                },
            },
            Ok(None) | Err(_) => Read::Refused,
        };
        phase.lock().unwrap().reads.push(read);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stamp in a row payload (`stock`, below the seeded 1,000,000).
fn stamp_of(payload: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    let stock = match &v["stock"] {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    (stock < 1_000_000).then_some(stock)
}
