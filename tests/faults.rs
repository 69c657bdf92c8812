//! Faults survived (issue #4): a Redis restart, a hung then restarted MariaDB, a Kafka broker that is down
//! or answers with errors (librdkafka's mock cluster), a real broker stopped and started, and
//! (issue #22) a frozen broker and a frozen Redis master, which hold back only what must wait.
//! In each, binval stalls without acknowledging anything, retries with backoff, and resumes
//! with nothing lost.

mod pipeline_env;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use binval::config::Config;
use pipeline_env::*;

const MAPPING: &str = items_mapping!(2);
const DOWN: Duration = Duration::from_secs(10);

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// GTID sequence number of the last acknowledged transaction (what the checkpoint saves).
fn acked_seq(run: &Running) -> u64 {
    let g = run.stats.acked.lock().unwrap().as_ref().and_then(|p| p.gtid.clone()).unwrap_or_default();
    g.rsplit('-').next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

static VALUE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1000);

/// Writes `n` updates of ids 1..=3 spread over `over`, returning (id, version, value) of each.
async fn write_during(env: &Env, n: i64, over: Duration) -> Vec<(u32, u64, i64)> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = (i % 3 + 1) as u32;
        let val = VALUE.fetch_add(1, Relaxed);
        let v = env.exec_v(&format!("UPDATE items SET v = {val} WHERE id = {id}")).await;
        out.push((id, v, val));
        tokio::time::sleep(over / n as u32).await;
    }
    out
}

/// The test's config with `mapping`, writing to the test's own `cluster` instead of the shared one.
fn on_cluster(env: &Env, start: &str, mapping: &str, cluster: &tk::OwnedCluster) -> Config {
    let quoted = |urls: Vec<String>| urls.iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(", ");
    let text = env
        .config_toml(start, mapping)
        .replace(&format!("urls = [{}]", quoted(tk::redis_cluster().urls())), &format!("urls = [{}]", quoted(cluster.urls())));
    Config::from_toml(&text).unwrap()
}

/// A client of the Cluster at `urls`.
fn client(urls: Vec<String>) -> RedisClient {
    RedisClient::Cluster(Box::new(redis::cluster::ClusterClient::new(urls).unwrap().get_connection().unwrap()))
}

async fn seed(env: &Env) {
    env.exec(pipeline_env::items::ID_COUNTER).await;
}

fn check_redis(r: &mut RedisClient, env: &Env, writes: &[(u32, u64, i64)]) {
    for id in 1..=3u32 {
        let Some(&(_, v, val)) = writes.iter().rev().find(|w| w.0 == id) else { continue };
        let key = format!("{}:item:{id}", env.prefix);
        assert_eq!(r.wait_version(&key, v), v, "item {id} reached its last version");
        for i in 0..2 {
            let row: serde_json::Value = serde_json::from_str(&r.replica(&key, i).expect("replica")).unwrap();
            assert_eq!(row["v"], serde_json::json!(val), "item {id} r{i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_stalls_without_acknowledging_and_loses_nothing() {
    let mut own = tk::OwnedRedis::start_new().unwrap();
    let env = Env::new("redisdown", RedisKind::Standalone);
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    let text = env.config_toml(&start, MAPPING).replace(&tk::redis().url(), &own.url());
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    let mut r = RedisClient::Standalone(redis::Client::open(own.url()).unwrap().get_connection().unwrap());
    block(|| check_redis(&mut r, &env, &first));
    drop(r);
    tokio::time::sleep(Duration::from_millis(500)).await;
    block(|| own.stop());
    let during = write_during(&env, 6, DOWN).await;
    // (Other tests' transactions on the shared server pass by unacknowledged too.)
    assert!(acked_seq(&run) < during[0].1, "nothing acknowledged past the outage's first change while Redis is down");
    assert!(run.stats.restarts.load(Relaxed) >= 1, "the pipeline noticed and retries");
    block(|| own.start()).unwrap();

    let mut r = RedisClient::Standalone(redis::Client::open(own.url()).unwrap().get_connection().unwrap());
    block(|| check_redis(&mut r, &env, &during));
    let changes: Vec<(String, u64)> = during.iter().map(|(id, v, _)| (format!("{}:item:{id}", env.prefix), *v)).collect();
    let problem = block(|| events_cover(&tk::broker().bootstrap(), &env.topic, &changes));
    assert!(problem.is_none(), "every change made while Redis was down is covered by an event: {problem:?}");
    println!(
        "redis down {} s: {} restarts, all {} changes applied after it returned",
        DOWN.as_secs(),
        run.stats.restarts.load(Relaxed),
        during.len()
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_restart_reconnects_and_resumes_from_where_it_was() {
    let db = tk::MariaDb::start_with(&[]).unwrap();
    let env = Env::new("dbdown", RedisKind::Standalone);
    // The test's tables live on the private server; point the config's source there.
    db.sql(&format!("CREATE DATABASE `{}`", env.db)).unwrap();
    let root = |sql: &str| db.sql(&format!("USE `{}`; {sql}; SELECT @@last_gtid", env.db)).unwrap();
    root("CREATE TABLE items (id INT PRIMARY KEY, v BIGINT)");
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut cols = status.split_whitespace();
    let start = format!("{}:{}", cols.next().unwrap(), cols.next().unwrap());
    let text = env.config_toml(&start, MAPPING).replace(&tk::mariadb().repl_url(), &db.repl_url());
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    let seq = |out: String| -> u64 { out.trim().rsplit('-').next().unwrap().parse().unwrap() };
    let v1 = seq(root("INSERT INTO items VALUES (1, 1)"));
    let mut r = env.redis_client();
    let k1 = format!("{}:item:1", env.prefix);
    assert_eq!(block(|| r.wait_version(&k1, v1)), v1);

    // A half-open connection: the server hangs (no events, no heartbeats). binval must notice
    // after 3 heartbeat periods (3 x 500 ms here) and reconnect.
    let reconnects = run.stats.source.reconnects.load(Relaxed);
    db.freeze(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    db.freeze(false);
    let until = Instant::now() + Duration::from_secs(10);
    while run.stats.source.reconnects.load(Relaxed) == reconnects {
        assert!(Instant::now() < until, "the silent connection was not detected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = seq(root("UPDATE items SET v = 3 WHERE id = 1"));
    assert_eq!(block(|| r.wait_version(&k1, v)), v, "change after the hang arrives");

    // A restart.
    block(|| db.stop());
    tokio::time::sleep(Duration::from_secs(3)).await;
    block(|| db.start_again()).unwrap();
    let v2 = seq(root("UPDATE items SET v = 2 WHERE id = 1"));
    let v3 = seq(root("INSERT INTO items VALUES (2, 20)"));
    assert_eq!(block(|| r.wait_version(&k1, v2)), v2, "change after the restart arrives");
    assert_eq!(block(|| r.wait_version(&format!("{}:item:2", env.prefix), v3)), v3);
    let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&k1, 1)).unwrap()).unwrap();
    assert_eq!(row["v"], serde_json::json!(2));
    assert!(run.stats.source.reconnects.load(Relaxed) + run.stats.restarts.load(Relaxed) >= 1, "reconnected");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_broker_down_and_erroring_mock_cluster_loses_nothing() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mock = MockCluster::new(1).unwrap();
    let env = Env::new("kafkadown", RedisKind::Standalone);
    mock.create_topic(&env.topic, 3, 1).unwrap();
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    let text = env
        .config_toml(&start, MAPPING)
        .replace(&format!("brokers = \"{}\"", tk::broker().bootstrap()), &format!("brokers = \"{}\"", mock.bootstrap_servers()))
        // One produce request in flight. The mock cluster answers an injected error without
        // storing the batch, yet accepts the next sequence number of a batch already in flight;
        // librdkafka's idempotent producer then counts the failed batch as "implicitly acked by
        // subsequent batch success" and reports it delivered. A real broker refuses the later
        // batch (OUT_OF_ORDER_SEQUENCE_NUMBER), so this is the mock's artifact, not a loss:
        // under CPU load it lost the first event after the injected errors in about half the
        // runs (librdkafka debug log, IMPLICITACK). See the note on issue #9.
        .replace("[kafka.properties]\n", "[kafka.properties]\n\"max.in.flight.requests.per.connection\" = \"1\"\n");
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    let mut r = env.redis_client();
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    block(|| check_redis(&mut r, &env, &first));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Retriable produce errors first, then the broker goes away entirely.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT],
    );
    mock.broker_down(1).unwrap();
    let during = write_during(&env, 6, DOWN).await;
    block(|| check_redis(&mut r, &env, &during));
    assert!(acked_seq(&run) < during[0].1, "Redis moved on, but nothing is acknowledged (checkpoint) while Kafka is down");
    mock.broker_up(1).unwrap();

    let until = Instant::now() + Duration::from_secs(60);
    while acked_seq(&run) < during.last().unwrap().1 {
        assert!(Instant::now() < until, "acknowledgements did not resume after the broker returned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let changes: Vec<(String, u64)> = during.iter().map(|(id, v, _)| (format!("{}:item:{id}", env.prefix), *v)).collect();
    let problem = block(|| events_cover(&mock.bootstrap_servers(), &env.topic, &changes));
    assert!(problem.is_none(), "events lost across the broker outage: {problem:?}");
    println!(
        "mock broker down {} s with produce errors: {} restarts, all {} events delivered after",
        DOWN.as_secs(),
        run.stats.restarts.load(Relaxed),
        during.len()
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_broker_stop_and_start_loses_nothing() {
    let mut broker = tk::OwnedBroker::start_new().unwrap();
    let env = Env::new("brokerdown", RedisKind::Standalone);
    broker.create_topic(&env.topic, 3).unwrap();
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    // The broker keeps topics in memory: binval re-creates the topic when it reconnects.
    let text = env
        .config_toml(&start, MAPPING)
        .replace(&format!("brokers = \"{}\"", tk::broker().bootstrap()), &format!("brokers = \"{}\"", broker.bootstrap()))
        .replace("create_topic = false", "create_topic = true\nproperties = { \"message.timeout.ms\" = \"5000\", \"linger.ms\" = \"0\" }")
        .replace("[kafka.properties]\n\"linger.ms\" = \"0\"\n", "");
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    let mut r = env.redis_client();
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    block(|| check_redis(&mut r, &env, &first));

    block(|| broker.stop());
    let during = write_during(&env, 6, DOWN).await;
    assert!(acked_seq(&run) < during[0].1, "nothing acknowledged while the broker is down");
    block(|| broker.start()).unwrap();
    let until = Instant::now() + Duration::from_secs(90);
    while acked_seq(&run) < during.last().unwrap().1 {
        assert!(
            Instant::now() < until,
            "acknowledgements did not resume after the broker returned (restarts: {})",
            run.stats.restarts.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    block(|| check_redis(&mut r, &env, &during));
    println!(
        "real broker down {} s: {} restarts, all {} changes acknowledged after it returned",
        DOWN.as_secs(),
        run.stats.restarts.load(Relaxed),
        during.len()
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_master_down_stalls_and_loses_nothing() {
    let mut cluster = block(tk::OwnedCluster::start_new).unwrap();
    let env = Env::new("masterdown", RedisKind::Cluster);
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    let run = pipeline_env::start(on_cluster(&env, &start, MAPPING, &cluster));
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    let mut r = block(|| client(cluster.urls()));
    block(|| check_redis(&mut r, &env, &first));
    drop(r);

    block(|| cluster.stop_node(0));
    let during = write_during(&env, 6, DOWN).await;
    // After the node timeout (5 s) the whole cluster refuses writes (full coverage required):
    // the last changes, made after that, cannot be acknowledged.
    assert!(acked_seq(&run) < during.last().unwrap().1, "not acknowledged while the cluster is down");
    block(|| cluster.start_node(0)).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while acked_seq(&run) < during.last().unwrap().1 {
        assert!(Instant::now() < until, "acknowledgements did not resume after the master returned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut r = block(|| client(cluster.urls()));
    block(|| check_redis(&mut r, &env, &during));
    println!(
        "cluster master down {} s: {} restarts, all {} changes applied after it returned",
        DOWN.as_secs(),
        run.stats.restarts.load(Relaxed),
        during.len()
    );
    run.stop().await;
}

/// Issue #22: a frozen broker (SIGSTOP: connections open, nothing answers) does not stop the
/// Redis writes. While it is frozen every change reaches its replicas and version token (so an
/// app whose fail safe bypasses its local cache reads fresh values), nothing is acknowledged
/// (the checkpoint waits for Kafka), and once it thaws every change's event is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_does_not_stop_the_redis_writes() {
    let broker = tk::OwnedBroker::start_new().unwrap();
    let env = Env::new("brokerfrozen", RedisKind::Standalone);
    broker.create_topic(&env.topic, 3).unwrap();
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    let text = env
        .config_toml(&start, MAPPING)
        .replace(&format!("brokers = \"{}\"", tk::broker().bootstrap()), &format!("brokers = \"{}\"", broker.bootstrap()));
    let run = pipeline_env::start(Config::from_toml(&text).unwrap());
    let mut r = env.redis_client();
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    block(|| check_redis(&mut r, &env, &first));

    broker.freeze(true);
    // 30 changes over 3 s: more groups than the old 64-group limit would matter for at this
    // rate only with larger load; what counts is that each one reaches Redis while frozen.
    let during = write_during(&env, 30, Duration::from_secs(3)).await;
    block(|| check_redis(&mut r, &env, &during));
    assert!(acked_seq(&run) < during[0].1, "nothing acknowledged while the broker is frozen");
    broker.freeze(false);
    let until = Instant::now() + Duration::from_secs(60);
    while acked_seq(&run) < during.last().unwrap().1 {
        assert!(Instant::now() < until, "acknowledgements did not resume after the broker thawed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let changes: Vec<(String, u64)> = during.iter().map(|(id, v, _)| (format!("{}:item:{id}", env.prefix), *v)).collect();
    let problem = block(|| events_cover(&broker.bootstrap(), &env.topic, &changes));
    assert!(problem.is_none(), "every change made while the broker was frozen has its event: {problem:?}");
    assert_eq!(run.stats.restarts.load(Relaxed), 0, "a 3 s freeze is waited out, not restarted");
    run.stop().await;
}

/// Issue #22: one frozen Redis master (SIGSTOP, shorter than the cluster's node timeout) holds
/// back only what must wait for it. With 8 replicas over 3 masters every key has replicas on
/// the frozen one, so no version token may move and nothing is acknowledged (I1, I3); but the
/// replicas on the two masters that answer take every change while it is frozen, so readers
/// there see fresh values. After it thaws everything converges and every event is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_holds_back_only_what_must_wait_for_it() {
    const MAPPING8: &str = items_mapping!(8);
    let cluster = block(tk::OwnedCluster::start_new).unwrap();
    let env = Env::new("masterfrozen", RedisKind::Cluster);
    seed(&env).await;
    env.exec("INSERT INTO items VALUES (1, 1), (2, 2), (3, 3)").await;
    let start = env.binlog_now().await;
    let run = pipeline_env::start(on_cluster(&env, &start, MAPPING8, &cluster));
    let first = write_during(&env, 3, Duration::from_millis(300)).await;
    let mut r = block(|| client(cluster.urls()));
    for &(id, v, _) in &first {
        assert_eq!(block(|| r.wait_version(&format!("{}:item:{id}", env.prefix), v)), v, "item {id} before the freeze");
    }
    drop(r);
    let owners = tk::SlotOwners::read(cluster.ports[0]).unwrap();
    let frozen = owners.masters.iter().position(|&p| p == cluster.ports[0]).unwrap();
    // Plain connections to the two masters that answer: each reads the replicas it owns.
    let mut live: Vec<(usize, redis::Connection)> = owners
        .masters
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != frozen)
        .map(|(i, p)| (i, redis::Client::open(format!("redis://127.0.0.1:{p}")).unwrap().get_connection().unwrap()))
        .collect();

    cluster.freeze_node(0, true);
    let frozen_at = Instant::now();
    let during = write_during(&env, 6, Duration::from_millis(1200)).await;
    // Within the freeze (3.5 s, under the 5 s node timeout): every replica on a master that
    // answers holds the last value of its key.
    let mut fresh = 0;
    let until = frozen_at + Duration::from_millis(3300);
    let mut missing: Vec<String> = Vec::new();
    while Instant::now() < until {
        (fresh, missing) = (0, Vec::new());
        for id in 1..=3u32 {
            let Some(&(_, _, val)) = during.iter().rev().find(|w| w.0 == id) else { continue };
            let key = format!("{}:item:{id}", env.prefix);
            for i in 0..8u32 {
                let rk = format!("{key}:r{i}");
                let m = owners.master_of(binval_protocol::hash_slot(rk.as_bytes()));
                let Some((_, c)) = live.iter_mut().find(|(j, _)| *j == m) else { continue };
                let d: Option<String> = redis::cmd("HGET").arg(&rk).arg("d").query(c).unwrap();
                match d.and_then(|d| serde_json::from_str::<serde_json::Value>(&d).ok()) {
                    Some(row) if row["v"] == serde_json::json!(val) => fresh += 1,
                    other => missing.push(format!("{rk}: {other:?}")),
                }
            }
        }
        if missing.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let acked_during = acked_seq(&run);
    let waited = frozen_at.elapsed();
    cluster.freeze_node(0, false);
    assert!(missing.is_empty(), "replicas on the masters that answer, {waited:?} into the freeze: {missing:?}");
    assert!(fresh > 0, "some replicas live on the masters that answer");
    assert!(acked_during < during[0].1, "nothing acknowledged while a master holding replicas of every key is frozen");
    let until = Instant::now() + Duration::from_secs(60);
    while acked_seq(&run) < during.last().unwrap().1 {
        assert!(Instant::now() < until, "acknowledgements did not resume after the master thawed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut r = block(|| client(cluster.urls()));
    for id in 1..=3u32 {
        let Some(&(_, v, val)) = during.iter().rev().find(|w| w.0 == id) else { continue };
        let key = format!("{}:item:{id}", env.prefix);
        assert_eq!(block(|| r.wait_version(&key, v)), v, "item {id} token after the thaw");
        for i in 0..8 {
            let row: serde_json::Value = serde_json::from_str(&block(|| r.replica(&key, i)).expect("replica")).unwrap();
            assert_eq!(row["v"], serde_json::json!(val), "item {id} r{i} after the thaw");
        }
    }
    let changes: Vec<(String, u64)> = during.iter().map(|(id, v, _)| (format!("{}:item:{id}", env.prefix), *v)).collect();
    let problem = block(|| events_cover(&tk::broker().bootstrap(), &env.topic, &changes));
    assert!(problem.is_none(), "every change made during the freeze has its event: {problem:?}");
    println!(
        "master frozen {waited:?}: {fresh} replicas on the other masters fresh during it; {} restarts",
        run.stats.restarts.load(Relaxed)
    );
    run.stop().await;
}
