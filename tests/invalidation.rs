//! The whole loop: a commit in MariaDB evicts the key from the local cache of every app
//! instance that links `binval-consumer`, and the next read returns the database's value.

mod common;

use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use common::*;

async fn app(env: &Env) -> Consumer {
    let b = Consumer::builder().brokers(tk::broker().bootstrap()).topic(env.topic.clone()).replicas(4).kafka_property("fetch.wait.max.ms", "5");
    let b = match env.redis {
        RedisKind::Standalone => b.redis_standalone(tk::redis().url()),
        RedisKind::Cluster => b.redis_cluster(tk::redis_cluster().urls()),
    };
    b.build().await.expect("consumer starts")
}

async fn two_instances_evict(kind: RedisKind) {
    let env = Env::new("evict", kind);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50), price DECIMAL(8,2))").await;
    env.exec("INSERT INTO items VALUES (7, 'lamp', 19.99)").await;
    let start = env.binlog_now().await;
    let run = common::start(env.config(&start, "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = 4\n"));
    let key = format!("{}:item:7", env.prefix);
    // Seed the replicas through binval itself. Its event (version v1) may still reach the apps
    // after they start; only the v2 notice counts below.
    let v1 = env.exec_v("UPDATE items SET title = 'desk lamp' WHERE id = 7").await;
    let mut r = env.redis_client();
    assert_eq!(tokio::task::block_in_place(|| r.wait_version(&key, v1)), v1);

    let apps = [app(&env).await, app(&env).await];
    for a in &apps {
        let v: serde_json::Value = a.get_json(&key).await.unwrap().expect("filled from a replica");
        assert_eq!(v["title"], "desk lamp");
        assert_eq!(a.cached_version(&key), Some(v1), "cached with the version read before the replica");
    }
    let mut subs: Vec<_> = apps.iter().map(|a| a.subscribe_evictions()).collect();

    let t0 = Instant::now();
    let v2 = env.exec_v("UPDATE items SET price = 24.50 WHERE id = 7").await;
    let committed = t0.elapsed();
    for (i, s) in subs.iter_mut().enumerate() {
        let notice = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let n = s.recv().await.expect("eviction channel open");
                if n.key == key && n.version >= v2 {
                    return n;
                }
            }
        })
        .await
        .expect("eviction observed");
        assert!(notice.evicted, "instance {i} held the key and evicted it");
        assert_eq!(notice.version, v2);
        println!("{kind:?}: app-{i} evicted {key} {:.1} ms after the commit returned", (t0.elapsed() - committed).as_secs_f64() * 1000.0);
    }
    for a in &apps {
        assert_eq!(a.cached_version(&key), None);
        let v: serde_json::Value = a.get_json(&key).await.unwrap().unwrap();
        assert_eq!(v["price"], "24.50", "next read returns the database's value");
        assert_eq!(a.cached_version(&key), Some(v2));
    }
    for a in &apps {
        a.shutdown().await;
    }
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_evict_standalone() {
    two_instances_evict(RedisKind::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_evict_cluster() {
    two_instances_evict(RedisKind::Cluster).await;
}

/// An instance that missed an invalidation (it was partitioned from the broker, or started
/// after the event at the newest offset while holding an old value) applies it when the
/// operator runs `binval republish`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn republish_makes_an_instance_that_missed_an_event_evict() {
    let env = Env::new("republish", RedisKind::Standalone);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50), price DECIMAL(8,2))").await;
    let start = env.binlog_now().await;
    let mapping = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = 4\n";
    let run = common::start(env.config(&start, mapping));
    let key = format!("{}:item:7", env.prefix);
    let v1 = env.exec_v("INSERT INTO items VALUES (7, 'lamp', 19.99)").await;
    let mut r = env.redis_client();
    assert_eq!(tokio::task::block_in_place(|| r.wait_version(&key, v1)), v1);
    let old: Vec<Vec<String>> = tokio::task::block_in_place(|| {
        (0..4).map(|i| r.cmd::<Vec<String>>(redis::cmd("HGETALL").arg(format!("{key}:r{i}")))).collect()
    });
    let v2 = env.exec_v("UPDATE items SET price = 24.50 WHERE id = 7").await;
    assert_eq!(tokio::task::block_in_place(|| r.wait_version(&key, v2)), v2);
    let new: Vec<Vec<String>> = tokio::task::block_in_place(|| {
        (0..4).map(|i| r.cmd::<Vec<String>>(redis::cmd("HGETALL").arg(format!("{key}:r{i}")))).collect()
    });
    // Put Redis back to v1 for a moment, let a new instance (listening from the newest offset,
    // so after the v2 event) cache the old pair, then restore v2: the instance now holds a value
    // whose invalidation it never saw.
    let set_state = |r: &mut RedisClient, state: &[Vec<String>], ver: u64| {
        for (i, fields) in state.iter().enumerate() {
            let _: i64 = r.cmd(redis::cmd("DEL").arg(format!("{key}:r{i}")));
            let _: i64 = r.cmd(redis::cmd("HSET").arg(format!("{key}:r{i}")).arg(fields));
        }
        let _: () = r.cmd(redis::cmd("SET").arg(format!("{key}:ver")).arg(ver));
    };
    tokio::task::block_in_place(|| set_state(&mut r, &old, v1));
    let a = app(&env).await;
    let v: serde_json::Value = a.get_json(&key).await.unwrap().unwrap();
    assert_eq!(v["price"], "19.99");
    assert_eq!(a.cached_version(&key), Some(v1));
    tokio::task::block_in_place(|| set_state(&mut r, &new, v2));
    let v: serde_json::Value = a.get_json(&key).await.unwrap().unwrap();
    assert_eq!(v["price"], "19.99", "stale: the instance missed the v2 event");

    let dir = tk::state_root().join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join(format!("{}.toml", env.prefix));
    std::fs::write(&cfg, env.config_toml(&start, mapping)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_binval"))
        .args(["republish", "--config"])
        .arg(&cfg)
        .args(["--from", "2000-01-01 00:00:00"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["read"], 2, "{summary} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(summary["republished"], 2, "{summary}");
    let until = Instant::now() + Duration::from_secs(10);
    while a.cached_version(&key) == Some(v1) {
        assert!(Instant::now() < until, "the re-published v2 event was not applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v: serde_json::Value = a.get_json(&key).await.unwrap().unwrap();
    assert_eq!(v["price"], "24.50", "after the re-published event the instance reads the database's value");
    assert_eq!(a.cached_version(&key), Some(v2));
    a.shutdown().await;
    run.stop().await;
}
