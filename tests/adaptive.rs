//! Adaptive replica counts (`replicas = { min, max }`, issue #23), the writer's side, against
//! real MariaDB, a real 3-master Redis Cluster and tansu: a key the fleet reads hot grows to
//! the copies its rate needs (new replicas copied from replica 0 at its position, the count in
//! every record), its changes then write every copy, the decision survives a restart, and once
//! the key cools the smaller count is announced first and the extra replicas removed after the
//! grace. The fleet is played by heat reports written by hand, in the layout
//! `binval-consumer` writes (`binval_protocol::adaptive`).

mod pipeline_env;

use std::time::{Duration, Instant};

use binval_protocol::adaptive::{heat_bucket_key, heat_bucket_of, HeatReport, HEAT_REPORT_VERSION, HOT_SET_KEY};
use pipeline_env::*;

/// A mapping with `replicas = { min = 1, max = 8 }` and an `[adaptive]` section tuned for a
/// test: a budget of 1,000 reads/s per master, a 2 s cool-down, a 1 s grace.
fn mappings() -> String {
    "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = { min = 1, max = 8 }\n\n\
     [adaptive]\nread_budget_per_master = 1000\ncool_down_secs = 2\nshrink_grace_ms = 1000\npoll_interval_ms = 100\nreport_max_age_ms = 1000\n"
        .to_string()
}

/// The whole record of replica `i` of `key` as a map (empty when the key does not exist).
fn record(r: &mut RedisClient, key: &str, i: u32) -> std::collections::HashMap<String, String> {
    r.cmd(redis::cmd("HGETALL").arg(format!("{key}:r{i}")))
}

/// Write one heat report for `instance` saying `key` is read at `rate` reads/s.
fn report(r: &mut RedisClient, instance: &str, key: &str, rate: f64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let rep = HeatReport { v: HEAT_REPORT_VERSION, at_ms: now, keys: vec![(key.to_string(), rate)] };
    let _: () = r.cmd(redis::cmd("HSET").arg(heat_bucket_key(heat_bucket_of(instance))).arg(instance).arg(rep.to_json()));
}

fn forget(r: &mut RedisClient, instance: &str) {
    let _: () = r.cmd(redis::cmd("HDEL").arg(heat_bucket_key(heat_bucket_of(instance))).arg(instance));
}

/// Poll `f` every 50 ms until it returns `Some` (or `secs` pass: panic naming `what`).
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "waited {secs} s for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_grows_writes_every_copy_and_shrinks_once_cool() {
    let env = Env::new("adaptive", RedisKind::Cluster);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50))").await;
    let start = env.binlog_now().await;
    let run = pipeline_env::start(env.config(&start, &mappings()));
    let (hot, cold) = (format!("{}:item:1", env.prefix), format!("{}:item:2", env.prefix));
    let v1 = env.exec_v("INSERT INTO items VALUES (1, 'lamp'), (2, 'desk')").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&cold, v1)), v1);
    // Cold keys: one copy, recording count 1.
    for k in [&hot, &cold] {
        let r0 = block(|| record(&mut r, k, 0));
        assert_eq!(r0.get("n").map(String::as_str), Some("1"), "{k}: {r0:?}");
        assert!(block(|| record(&mut r, k, 1)).is_empty(), "{k} has one replica");
    }

    // The fleet reads `hot` at 5,000 reads/s: 5 masters' budget, so every master (3).
    let instance = format!("{}-app", env.prefix);
    let n = block(|| {
        wait_for(15, "the hot key to grow", || {
            report(&mut r, &instance, &hot, 5_000.0);
            let n: Option<String> = r.cmd(redis::cmd("HGET").arg(HOT_SET_KEY).arg(&hot));
            n.map(|n| n.parse::<u32>().unwrap())
        })
    });
    assert!((3..=8).contains(&n), "grew to {n}");
    // Every copy holds replica 0's change at its position, with the new count.
    let copies = block(|| {
        wait_for(10, "every copy to record the count", || {
            let recs: Vec<_> = (0..n).map(|i| record(&mut r, &hot, i)).collect();
            recs.iter().all(|x| x.get("n") == Some(&n.to_string())).then_some(recs)
        })
    });
    for (i, c) in copies.iter().enumerate() {
        assert_eq!(c.get("p"), Some(&v1.to_string()), "replica {i}: {c:?}");
        assert_eq!(c.get("d"), copies[0].get("d"), "replica {i} holds replica 0's payload");
    }
    assert!(block(|| record(&mut r, &hot, n)).is_empty(), "no replica past the count");
    // The copies cover every master.
    let masters: std::collections::BTreeSet<usize> = {
        let conn = binval::redis_conn::RedisConn::connect(&env.config(&start, "").redis).await.unwrap();
        let map = conn.refresh_slots().await.unwrap();
        (0..n).map(|i| map.master_of_slot(binval_protocol::hash_slot(format!("{hot}:r{i}").as_bytes()))).collect()
    };
    assert_eq!(masters.len(), 3, "the copies of a key read at 5 masters' budget cover all 3 masters");
    assert!(block(|| record(&mut r, &cold, 1)).is_empty(), "the cold key keeps one copy");

    // A change of the hot key now writes every copy.
    let v2 = env.exec_v("UPDATE items SET title = 'brass lamp' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&hot, v2)), v2);
    for i in 0..n {
        let c = block(|| record(&mut r, &hot, i));
        assert_eq!(c.get("p"), Some(&v2.to_string()), "replica {i} written by the change");
        assert!(c.get("d").unwrap().contains("brass lamp"));
    }

    // The decision survives a restart: the next change still writes every copy.
    run.stop().await;
    let run = pipeline_env::start(env.config(&start, &mappings()));
    let v3 = env.exec_v("UPDATE items SET title = 'gold lamp' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&hot, v3)), v3);
    for i in 0..n {
        let c = block(|| record(&mut r, &hot, i));
        assert_eq!(c.get("p"), Some(&v3.to_string()), "replica {i} written by the change after the restart");
    }

    // The key cools: reports stop. After the 2 s cool-down the count 1 is announced (every
    // replica records n = 1, the hot set drops the key) while the copies still exist, and
    // after the 1 s grace they are removed.
    block(|| forget(&mut r, &instance));
    let announced_at = block(|| {
        wait_for(15, "the smaller count to be announced", || {
            let n0 = record(&mut r, &hot, 0).get("n").cloned();
            (n0.as_deref() == Some("1")).then(Instant::now)
        })
    });
    let hot_set: Option<String> = block(|| r.cmd(redis::cmd("HGET").arg(HOT_SET_KEY).arg(&hot)));
    assert_eq!(hot_set, None, "the hot set no longer lists the key");
    let last = block(|| {
        wait_for(10, "the extra replicas to be removed", || {
            let left = (1..n).filter(|&i| !record(&mut r, &hot, i).is_empty()).count();
            (left == 0).then(Instant::now)
        })
    });
    assert!(last.duration_since(announced_at) >= Duration::from_millis(700), "removed only after the grace");
    // The key still reads from replica 0, and a change writes only it.
    let v4 = env.exec_v("UPDATE items SET title = 'tin lamp' WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&hot, v4)), v4);
    let r0 = block(|| record(&mut r, &hot, 0));
    assert_eq!((r0.get("p"), r0.get("n").map(String::as_str)), (Some(&v4.to_string()), Some("1")));
    assert!(block(|| record(&mut r, &hot, 1)).is_empty());
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_key_gets_its_count_without_reads() {
    let env = Env::new("adaptive_pin", RedisKind::Cluster);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50))").await;
    let start = env.binlog_now().await;
    let pinned = format!("{}:item:9", env.prefix);
    let m = format!("{}[[adaptive.pin]]\nkey = \"{pinned}\"\nreplicas = 4\n", mappings());
    let run = pipeline_env::start(env.config(&start, &m));
    let v = env.exec_v("INSERT INTO items VALUES (9, 'stool')").await;
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&pinned, v)), v);
    block(|| {
        wait_for(15, "the pinned key to have 4 copies", || {
            let recs: Vec<_> = (0..4).map(|i| record(&mut r, &pinned, i)).collect();
            recs.iter().all(|x| x.get("n").map(String::as_str) == Some("4") && x.get("p") == Some(&v.to_string())).then_some(())
        })
    });
    assert!(block(|| record(&mut r, &pinned, 4)).is_empty());
    run.stop().await;
}
