//! The demo's hot-key phase: a third app instance, with no local cache (as an instance whose
//! fail safe bypasses it), reads one product as fast as it can. Its heat reports tell binval's
//! leader; `item:detail:{id}` is mapped with `replicas = { min = 1, max = 16 }` and a read
//! budget of 2,000 reads/s per master (config/demo.toml), so the key grows to copies on every
//! master, and the instance learns the count from the records it reads. Prints a timeline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::{CacheMode, Consumer};

/// Read `key` hot from a fresh instance until it has spread (or `limit` passes); returns the
/// count the instance reads with at the end.
pub async fn spread(redis: &[String], brokers: &str, topic: &str, key: &str, limit: Duration) -> anyhow::Result<u32> {
    let app = Arc::new(
        Consumer::builder()
            .redis_cluster(redis.to_vec())
            .brokers(brokers.to_string())
            .topic(topic.to_string())
            .cache_mode(CacheMode::Prefixes(vec!["-no-local-cache-".into()]))
            .heat_report_interval(Duration::from_millis(250))
            .build()
            .await?,
    );
    println!("a third app instance, no local cache, reads {key} as fast as it can (count now {}):", app.replica_count(key));
    let (reads, errors, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (app, key, reads, errors, stop) = (app.clone(), key.to_string(), reads.clone(), errors.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                match app.get(&key).await {
                    Ok(Some(_)) => reads.fetch_add(1, Relaxed),
                    _ => errors.fetch_add(1, Relaxed),
                };
            }
        }));
    }
    let t0 = Instant::now();
    let (mut last, mut spread_at) = (0u64, None);
    while t0.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = reads.load(Relaxed);
        let n = app.replica_count(key);
        println!(
            "  {:>4.1} s  {:>7.0} reads/s  reading {n} replica{}",
            t0.elapsed().as_secs_f64(),
            (now - last) as f64 * 2.0,
            if n == 1 { "" } else { "s" }
        );
        last = now;
        match spread_at {
            None if n > 1 => spread_at = Some(t0.elapsed()),
            Some(at) if t0.elapsed() > at + Duration::from_secs(1) => break,
            _ => {}
        }
    }
    stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let n = app.replica_count(key);
    let bad = errors.load(Relaxed);
    app.shutdown().await;
    match spread_at {
        Some(at) if bad == 0 => {
            println!(
                "{key} spread to {n} replicas {:.1} s after it turned hot; {} reads, 0 failed (`binval status` lists it)",
                at.as_secs_f64(),
                reads.load(Relaxed)
            );
            Ok(n)
        }
        Some(_) => anyhow::bail!("{bad} reads of {key} failed or found no row while it spread"),
        None => anyhow::bail!("{key} did not spread within {} s: is the mapping adaptive and binval leading?", limit.as_secs()),
    }
}
