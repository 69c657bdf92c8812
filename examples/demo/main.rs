//! The demo's app side: two app instances (each a `binval-consumer` handle) hold product
//! details in their local caches while a writer updates the rows in MariaDB; the running
//! `binval` service turns each commit into Redis writes and an invalidation event. Prints the
//! commit -> eviction latency seen by each instance and checks every instance then reads the
//! database's current value.
//!
//! Run by `scripts/demo.sh` (which starts the services and `binval run`); settings by env:
//! DEMO_MYSQL_URL, DEMO_REDIS_URLS (comma-separated cluster seeds), DEMO_BROKERS, DEMO_TOPIC,
//! DEMO_UPDATES (default 200), DEMO_KEYS (default 20), DEMO_LOAD (background writer, commits/s;
//! default 0 = none).
//!
//! Then a hot key (`hot.rs`): a third instance without a local cache reads `item:detail:1` as
//! fast as it can, and the key, mapped with adaptive replica counts, spreads over the masters.
//!
//! With `DEMO_LOAD=N` a background writer runs single-row `UPDATE`s of 1,000 other rows at N
//! commits/s (two connections) while the updates are timed, as an application's other traffic
//! would; the demo then also prints the rate reached and the share of 20 ms samples in which
//! each instance served from its local cache (the fail safe must not engage under a flowing
//! stream, invariant I8).

use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use mysql_async::prelude::Queryable;

fn env(k: &str, d: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| d.to_string())
}

/// The demo's settings, from the environment (see the module docs).
struct Settings {
    mysql: String,
    redis: Vec<String>,
    brokers: String,
    topic: String,
    updates: usize,
    keys: u32,
    load: u32,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        Ok(Settings {
            mysql: env("DEMO_MYSQL_URL", "mysql://app:app@127.0.0.1:13306/shop"),
            redis: env("DEMO_REDIS_URLS", "redis://127.0.0.1:17001,redis://127.0.0.1:17002,redis://127.0.0.1:17003")
                .split(',')
                .map(String::from)
                .collect(),
            brokers: env("DEMO_BROKERS", "127.0.0.1:19092"),
            topic: env("DEMO_TOPIC", "binval.invalidations"),
            updates: env("DEMO_UPDATES", "200").parse()?,
            keys: env("DEMO_KEYS", "20").parse()?,
            load: env("DEMO_LOAD", "0").parse()?,
        })
    }
}

/// The logical key of product `id`.
fn key(id: u32) -> String {
    format!("item:detail:{id}")
}

mod hot;
mod load;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = Settings::from_env()?;
    let (updates, keys) = (cfg.updates, cfg.keys);

    let mut db = mysql_async::Conn::from_url(cfg.mysql.as_str()).await?;
    db.query_drop("CREATE TABLE IF NOT EXISTS items (id INT PRIMARY KEY, title VARCHAR(200) NOT NULL, price DECIMAL(10,2) NOT NULL, stock INT NOT NULL, updated DATETIME(3) NOT NULL)").await?;

    let apps = start_apps(&cfg).await?;
    println!("2 app instances listening on topic {}", cfg.topic);

    seed(&mut db, &apps, keys).await?;
    let background = if cfg.load > 0 { Some(load::start(&cfg.mysql, cfg.load, &apps).await?) } else { None };
    let (mut lat, missing) = update_and_check(&mut db, &apps, updates, keys).await?;
    println!("{updates} updates of {keys} keys; commit -> local-cache eviction, per app instance (ms):");
    print_latencies(&mut lat);
    if let Some(b) = background {
        b.stop_and_report().await?;
    }
    for (i, a) in apps.iter().enumerate() {
        let s = a.stats();
        println!(
            "app-{i}: hits {} misses {} fills {} refused {} bypass {} events {} evictions {}",
            s.hits, s.misses, s.fills, s.fills_refused, s.bypass_reads, s.events, s.evictions
        );
    }
    for a in &apps {
        a.shutdown().await;
    }
    db.disconnect().await?;
    if missing > 0 {
        anyhow::bail!("{missing} evictions were not observed within 5 s");
    }
    println!("every instance evicted every change and then read the database's value");
    hot::spread(&cfg.redis, &cfg.brokers, &cfg.topic, &key(1), Duration::from_secs(15)).await?;
    Ok(())
}

/// Two app instances, each with its own local cache and listener.
async fn start_apps(cfg: &Settings) -> anyhow::Result<Vec<Consumer>> {
    let mut apps = Vec::new();
    for _ in 0..2 {
        apps.push(
            Consumer::builder()
                .redis_cluster(cfg.redis.clone())
                .brokers(cfg.brokers.clone())
                .topic(cfg.topic.clone())
                .max_entries(10_000)
                // Under DEMO_LOAD every other row's event is a notice too: room for seconds of them.
                .eviction_channel_capacity(1 << 16)
                .kafka_property("fetch.wait.max.ms", "5")
                .build()
                .await?,
        );
    }
    Ok(apps)
}

/// Seed the rows now that both instances listen, and wait until each has received the
/// seeding event of every key, so none arrives during the measured updates.
async fn seed(db: &mut mysql_async::Conn, apps: &[Consumer], keys: u32) -> anyhow::Result<()> {
    let mut seeding: Vec<_> = apps.iter().map(|a| a.subscribe_evictions()).collect();
    let mut seeded = std::collections::HashMap::new();
    for id in 1..=keys {
        db.exec_drop(
            "INSERT INTO items VALUES (?, ?, 10.00, 100, NOW(3)) ON DUPLICATE KEY UPDATE title = VALUES(title), updated = NOW(3)",
            (id, format!("product {id}")),
        )
        .await?;
        let g: String = db.query_first("SELECT @@last_gtid").await?.unwrap_or_default();
        seeded.insert(key(id), g.rsplit('-').next().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0));
    }
    for (i, sub) in seeding.iter_mut().enumerate() {
        let mut pending = seeded.clone();
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while !pending.is_empty() {
                if let Ok(n) = sub.recv().await {
                    if pending.get(&n.key).is_some_and(|v| n.version >= *v) {
                        pending.remove(&n.key);
                    }
                }
            }
        })
        .await;
        if waited.is_err() {
            anyhow::bail!("app-{i} did not receive the seeding events within 30 s: is `binval run` running?");
        }
    }
    Ok(())
}

/// `updates` times: hold a key in both local caches, update its row, time the eviction in each
/// instance, then check each instance reads the new price. Returns the latencies (ms) per
/// instance and the number of evictions not observed within 5 s.
async fn update_and_check(
    db: &mut mysql_async::Conn,
    apps: &[Consumer],
    updates: usize,
    keys: u32,
) -> anyhow::Result<(Vec<Vec<f64>>, usize)> {
    let mut listeners: Vec<_> = apps.iter().map(|a| a.subscribe_evictions()).collect();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(), Vec::new()];
    let mut missing = 0usize;
    for n in 0..updates {
        let id = (n as u32 % keys) + 1;
        for a in apps {
            a.get(&key(id)).await?; // hold it in the local cache
        }
        let price = format!("{}.{:02}", 10 + n, n % 100);
        let t0 = Instant::now();
        db.exec_drop("UPDATE items SET price = ?, stock = stock - 1, updated = NOW(3) WHERE id = ?", (&price, id)).await?;
        let committed = t0.elapsed();
        for (i, l) in listeners.iter_mut().enumerate() {
            if eviction_of(l, &key(id)).await {
                lat[i].push((t0.elapsed() - committed).as_secs_f64() * 1000.0);
            } else {
                eprintln!(
                    "app-{i}: no eviction observed for update {n} of {} (cached version {:?})",
                    key(id),
                    apps[i].cached_version(&key(id))
                );
                missing += 1;
            }
        }
        for a in apps {
            let v: serde_json::Value = a.get_json(&key(id)).await?.expect("key present");
            if v["price"] != serde_json::Value::String(price.clone()) {
                anyhow::bail!("instance served {} for {} after the eviction, database has {price}", v["price"], key(id));
            }
        }
    }
    Ok((lat, missing))
}

/// Whether a notice that evicted `key` arrives within 5 s.
async fn eviction_of(l: &mut tokio::sync::broadcast::Receiver<binval_consumer::EvictionNotice>, key: &str) -> bool {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match l.recv().await {
                Ok(n) if n.key == key && n.evicted => return true,
                Ok(_) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue, // notices of other rows
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// One line per instance: count, p50/p95/p99/max (ms) and the share under 200 ms.
fn print_latencies(lat: &mut [Vec<f64>]) {
    println!("{:<10} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}", "instance", "n", "p50", "p95", "p99", "max", "<200ms");
    for (i, l) in lat.iter_mut().enumerate() {
        l.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = |p: f64| l.get(((l.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN);
        let within = l.iter().filter(|&&x| x < 200.0).count();
        println!(
            "{:<10} {:>7} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>6.1}%",
            format!("app-{i}"),
            l.len(),
            q(0.5),
            q(0.95),
            q(0.99),
            q(1.0),
            100.0 * within as f64 / l.len().max(1) as f64
        );
    }
}
