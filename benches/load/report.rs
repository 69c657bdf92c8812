//! The tables the benchmark prints.

use std::time::Duration;

use crate::apps::{Evictions, Served};
use crate::catchup::Catchup;
use crate::Rate;

/// The figures of one writer rate.
pub struct Cell {
    pub rate: Rate,
    pub writer_per_s: f64,
    /// Seconds the writer wrote.
    pub writer_secs: f64,
    pub binval_tx_per_s: f64,
    pub binval_rows_per_s: f64,
    pub cpu_us_per_tx: f64,
    /// `binval_heartbeat_lag_seconds` every 100 ms while writing and catching up.
    pub lag_s: Vec<f64>,
    /// From the writer's stop to everything it wrote acknowledged (None: not within 5 min).
    pub caught_up: Option<Duration>,
    /// `binval_heartbeat_lag_seconds` 2 s after the writer stopped.
    pub lag_after_2s: Option<f64>,
    pub evictions: Evictions,
    pub served_locally: Served,
    pub peak_rss_mib: f64,
    /// binval's own legs, from its histograms over the cell.
    pub legs: Legs,
    /// CPU seconds per component ([`crate::cpu::COMPONENTS`]) from the writer's start to the
    /// catch-up, and the writer's commits over it (for CPU per commit).
    pub cpu_by_component: Vec<f64>,
}

/// binval's part of commit -> eviction, from its `/metrics` histograms (bucket-interpolated,
/// so a quantile is as coarse as the buckets: 0.5, 1, 2.5, 5, 10, 25, 50, 100 ms, ...).
pub struct Legs {
    /// `binval_redis_apply_seconds` p50, p99: a group's fenced writes, sent to acknowledged.
    pub redis_apply_ms: [Option<f64>; 2],
    /// `binval_kafka_delivery_seconds` p50, p99: an event handed to the producer to its ack.
    pub kafka_ack_ms: [Option<f64>; 2],
    /// Mean of `binval_apply_group_transactions`: transactions per applied group.
    pub group_transactions: Option<f64>,
}

/// Where commit -> eviction goes: binval's Redis and Kafka legs per cell.
pub fn print_legs(cells: &[Cell]) {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    println!(
        "\n| writer target | transactions per group (mean) | Redis apply p50 / p99, ms | Kafka enqueue -> ack p50 / p99, ms | publish -> instance applied p50 / p99, ms (instance 1) | commit -> eviction p50 / p99, ms (instance 1) |"
    );
    println!("|---|---:|---|---|---|---|");
    for c in cells {
        // Instance 1's samples; `quantiles` of none is NaN.
        let (e50, e99, _) = quantiles(c.evictions.ms.first().map_or(&[], Vec::as_slice));
        let (k50, k99, _) = quantiles(c.evictions.publish_to_applied_ms.first().map_or(&[], Vec::as_slice));
        println!(
            "| {} | {} | {} / {} | {} / {} | {k50:.0} / {k99:.0} | {e50:.1} / {e99:.1} |",
            rate_name(c.rate),
            c.legs.group_transactions.map(|g| format!("{g:.1}")).unwrap_or_else(|| "-".into()),
            ms(c.legs.redis_apply_ms[0]),
            ms(c.legs.redis_apply_ms[1]),
            ms(c.legs.kafka_ack_ms[0]),
            ms(c.legs.kafka_ack_ms[1]),
        );
    }
}

/// Where the machine's CPU went: µs of CPU per writer commit per component, and cores used.
pub fn print_cpu(cells: &[Cell]) {
    let names: Vec<&str> = crate::cpu::COMPONENTS.iter().map(|(_, n)| *n).collect();
    println!("\nCPU per writer commit, µs (cores busy over the cell), user + system of every process of the component:\n");
    println!("| writer target | {} | total |", names.join(" | "));
    println!("|---|{}---:|", "---:|".repeat(names.len()));
    for c in cells {
        let commits = c.writer_per_s * c.writer_secs;
        let busy = c.writer_secs + c.caught_up.map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let cell = |cpu: f64| format!("{:.0} ({:.2})", cpu * 1e6 / commits.max(1.0), cpu / busy.max(1e-9));
        let total: f64 = c.cpu_by_component.iter().sum();
        let cols: Vec<String> = c.cpu_by_component.iter().map(|&v| cell(v)).collect();
        println!("| {} | {} | {} |", rate_name(c.rate), cols.join(" | "), cell(total));
    }
}

/// `200/s` or `max`.
pub fn rate_name(r: Rate) -> String {
    r.map(|r| format!("{r}")).unwrap_or_else(|| "max".into())
}

/// (p50, p99, max) of `v`; NaN when empty.
pub fn quantiles(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN);
    (q(0.5), q(0.99), q(1.0))
}

/// The per-rate table.
pub fn print_cells(cells: &[Cell]) {
    println!(
        "\n| writer target | writer commits/s | binval tx/s | binval rows/s | CPU µs/tx | lag p50 / p99 / max, s | caught up after stop, s | lag 2 s after stop, s | commit -> eviction p50 / p99 / max, ms (per instance) | served locally | peak RSS MiB |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|---:|---|---|---:|");
    for c in cells {
        let (l50, l99, lmax) = quantiles(&c.lag_s);
        let ev: Vec<String> = c
            .evictions
            .ms
            .iter()
            .map(|v| {
                let (a, b, m) = quantiles(v);
                format!("{a:.1} / {b:.1} / {m:.1}")
            })
            .collect();
        let served: Vec<String> = c.served_locally.iter().map(|(s, n)| format!("{:.1}%", 100.0 * *s as f64 / (*n).max(1) as f64)).collect();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {l50:.3} / {l99:.3} / {lmax:.3} | {} | {} | {}{} | {} | {:.0} |",
            rate_name(c.rate),
            c.writer_per_s,
            c.binval_tx_per_s,
            c.binval_rows_per_s,
            c.cpu_us_per_tx,
            c.caught_up.map(|d| format!("{:.2}", d.as_secs_f64())).unwrap_or_else(|| "no (5 min)".into()),
            c.lag_after_2s.map(|l| format!("{l:.3}")).unwrap_or_else(|| "-".into()),
            ev.join("; "),
            if c.evictions.missing + c.evictions.not_held > 0 {
                format!(" ({} missing, {} not held)", c.evictions.missing, c.evictions.not_held)
            } else {
                String::new()
            },
            served.join(" / "),
            c.peak_rss_mib,
        );
    }
}

/// What the columns mean.
pub fn explain_cells() {
    println!(
        "
writer commits/s: single-row autocommit UPDATEs by the writer's connections (paced, or as fast as they go).
binval tx/s, rows/s: binval_transactions_total / binval_rows_total over the writing and the catch-up after it (heartbeat rows included).
CPU µs/tx: binval's CPU time (user + system, all threads) over the same span, per transaction.
lag: binval_heartbeat_lag_seconds (heartbeat row every 100 ms) sampled every 100 ms.
caught up after stop: from the writer's last commit to binval's acknowledged position passing the binlog end at that moment.
lag 2 s after stop: binval_heartbeat_lag_seconds read 2 s after the writer's last commit (the lag of the last heartbeat acknowledged by then).
commit -> eviction: a probe updates a row both app instances hold every 50 ms; commit returned -> the instance applied its event
  (missing: not applied within 5 s; not held: the instance did not hold the row before the update).
served locally: share of 20 ms samples in which the instance served from its local cache (fail safe not engaged).
peak RSS: VmHWM of the binval process of the cell.
legs table: binval's histograms over the cell (bucket-interpolated): Redis apply = one group's fenced writes, sent to acknowledged;
Kafka enqueue -> ack = an event handed to the producer (linger.ms 5) to the broker's ack.
publish -> instance applied: the probe's events, from binval handing each to its producer to the instance applying it
(the eviction notice's received_at_ms - publish_time_ms, whole ms): the whole Kafka leg (ack, the broker's fetch, held
for fetch.wait.max.ms 10 ms on tansu, and the listener). commit -> eviction minus it is binval's part: the binlog read,
the group's wait and its Redis apply."
    );
}

/// The catch-up table.
pub fn print_catchup(c: &Catchup) {
    println!(
        "\nCatch-up over the same binlog ({} single-row transactions, {}:{} .. {}:{}):\n",
        c.transactions, c.from.0, c.from.1, c.to.0, c.to.1
    );
    println!("| reader | what it does | seconds | rows/s | CPU µs/tx | peak RSS MiB |");
    println!("|---|---|---:|---:|---:|---:|");
    let py_rate = match &c.python {
        Ok((rows, secs)) => {
            println!("| python-mysql-replication | decode only | {secs:.1} | {:.0} | | |", *rows as f64 / secs);
            Some(*rows as f64 / secs)
        }
        Err(why) => {
            println!("| python-mysql-replication | {why} | | | | |");
            None
        }
    };
    match c.binval_secs {
        Some(s) => {
            let rate = c.transactions as f64 / s;
            println!(
                "| binval run | decode, 8 suffix replicas on a 3-master Cluster, events to Kafka, checkpoint | {s:.1} | {rate:.0} | {:.0} | {:.0} |",
                c.binval_cpu_secs * 1e6 / c.transactions as f64,
                c.binval_rss_mib
            );
            if let Some(p) = py_rate {
                println!("\nbinval / python-mysql-replication: {:.2}x", rate / p);
            }
        }
        None => println!("| binval run | did not catch up within 15 min | | | | |"),
    }
}
