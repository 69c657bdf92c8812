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
