//! The pipeline tests' environment (tests/pipeline.rs, delivery.rs, faults.rs, invalidation.rs,
//! replay.rs, cli.rs): each test gets its own database, topic, key
//! prefix, source name and server_id on the shared real services of `binval-testkit`.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval::config::Config;
use binval_protocol::InvalidationEvent;
use mysql_async::prelude::Queryable;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, TopicPartitionList};
use tokio::sync::watch;

pub use binval_testkit as tk;

/// The fixtures the tests share: the `items` table in the shapes they use, and its mapping to
/// `{p}:item:{id}` (`{db}` and `{p}` are filled by [`Env::config_toml`]). A test that needs
/// another shape writes it out, so what it depends on is visible where it is tested.
pub mod items {
    /// `items (id, title)`: a product row whose `title` the test changes.
    pub const ID_TITLE: &str = "CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(50))";
    /// `items (id, v, title)`.
    pub const ID_V_TITLE: &str = "CREATE TABLE items (id INT PRIMARY KEY, v INT, title VARCHAR(40))";
    /// `items (id, v INT)`.
    pub const ID_V: &str = "CREATE TABLE items (id INT PRIMARY KEY, v INT)";
    /// `items (id, v BIGINT)`: `v` counts the writes of a row.
    pub const ID_COUNTER: &str = "CREATE TABLE items (id INT PRIMARY KEY, v BIGINT)";

    /// The mapping of `items` to `{p}:item:{id}` with `replicas` suffix replicas, for a
    /// runtime count (a literal one: [`items_mapping!`](crate::items_mapping)).
    pub fn mapping(replicas: u32) -> String {
        format!("[[mappings]]\ntable = \"{{db}}.items\"\nkeys = [\"{{p}}:item:{{id}}\"]\nreplicas = {replicas}\n")
    }
}

/// The mapping of `items` to `{p}:item:{id}` with a literal replica count, as a `&'static str`
/// (for a `const`): `items_mapping!(4)`.
#[macro_export]
macro_rules! items_mapping {
    ($replicas:literal) => {
        concat!("[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = ", $replicas, "\n")
    };
}

/// Which Redis a test runs against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RedisKind {
    Standalone,
    Cluster,
}

/// One test's isolated slice of the shared services.
pub struct Env {
    pub db: String,
    pub topic: String,
    pub prefix: String,
    pub source_name: String,
    pub server_id: u32,
    pub redis: RedisKind,
}

static SERVER_IDS: AtomicU32 = AtomicU32::new(0);

impl Env {
    pub fn new(name: &str, redis: RedisKind) -> Env {
        let db = tk::mariadb().create_database(name).expect("create database");
        let unique = tk::unique_name(name);
        let topic = format!("binval_{unique}");
        tk::broker().create_topic(&topic, 3).expect("create topic");
        let n = SERVER_IDS.fetch_add(1, Ordering::Relaxed);
        Env { db, topic, prefix: unique.clone(), source_name: unique, server_id: 10_000 + (std::process::id() % 10_000) * 100 + n, redis }
    }

    /// SQL as root, through a fresh mysql_async connection (so timings are those of an app).
    pub async fn conn(&self) -> mysql_async::Conn {
        let url = format!("{}/{}", tk::mariadb().root_url(), self.db);
        mysql_async::Conn::from_url(url).await.expect("connect to mariadb")
    }

    pub async fn exec(&self, sql: &str) {
        let mut c = self.conn().await;
        c.query_drop(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        c.disconnect().await.ok();
    }

    /// Run `sql` (one transaction) and return the version binval gives its changes: the GTID
    /// sequence number of the transaction (fence mode `gtid`, epoch 0).
    pub async fn exec_v(&self, sql: &str) -> u64 {
        let mut c = self.conn().await;
        c.query_drop(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let v = last_version(&mut c).await;
        c.disconnect().await.ok();
        v
    }

    /// Current binlog position as `file:pos`.
    pub async fn binlog_now(&self) -> String {
        let mut c = self.conn().await;
        let row: mysql_async::Row = c.query_first("SHOW MASTER STATUS").await.unwrap().unwrap();
        let f: String = row.get(0).unwrap();
        let p: u64 = row.get(1).unwrap();
        c.disconnect().await.ok();
        format!("{f}:{p}")
    }

    pub fn redis_section(&self) -> String {
        match self.redis {
            RedisKind::Standalone => format!("mode = \"standalone\"\nurls = [\"{}\"]", tk::redis().url()),
            RedisKind::Cluster => {
                let urls: Vec<String> = tk::redis_cluster().urls().iter().map(|u| format!("\"{u}\"")).collect();
                format!("mode = \"cluster\"\nurls = [{}]", urls.join(", "))
            }
        }
    }

    /// A config TOML with `mappings` appended verbatim; `{db}` and `{p}` in it are replaced by
    /// the database name and key prefix.
    pub fn config_toml(&self, start: &str, mappings: &str) -> String {
        let m = mappings.replace("{db}", &self.db).replace("{p}", &self.prefix);
        format!(
            r#"
[source]
name = "{name}"
url = "{url}"
server_id = {sid}
heartbeat_ms = 500
start = "{start}"
reconnect_max_ms = 2000

[redis]
{redis}

[kafka]
brokers = "{brokers}"
topic = "{topic}"
create_topic = false
[kafka.properties]
"linger.ms" = "0"

[checkpoint]
interval_ms = 200

{m}
"#,
            name = self.source_name,
            url = tk::mariadb().repl_url(),
            sid = self.server_id,
            redis = self.redis_section(),
            brokers = tk::broker().bootstrap(),
            topic = self.topic,
        )
    }

    pub fn config(&self, start: &str, mappings: &str) -> Config {
        Config::from_toml(&self.config_toml(start, mappings)).expect("test config is valid")
    }

    /// Write a config file of this test's own (under the testkit's state folder); its path.
    pub fn write_config(&self, text: &str) -> std::path::PathBuf {
        let dir = tk::state_root().join("configs");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{}.toml", self.prefix));
        std::fs::write(&p, text).unwrap();
        p
    }

    pub fn redis_client(&self) -> RedisClient {
        match self.redis {
            RedisKind::Standalone => RedisClient::Standalone(redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap()),
            RedisKind::Cluster => RedisClient::Cluster(Box::new(
                redis::cluster::ClusterClient::new(tk::redis_cluster().urls()).unwrap().get_connection().unwrap(),
            )),
        }
    }
}

/// Run `f`, which blocks (a child process, a sync Redis client), on this runtime thread.
pub fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Run the `binval` binary with `args` (and environment `vars`, `RUST_LOG=warn` by default) to
/// the end: (exit code, -1 when killed by a signal; stdout; stderr).
pub fn binval_cli(args: &[&str], vars: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_binval"));
    c.args(args).env("RUST_LOG", "warn");
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The JSON lines of a command's output (lines that are not JSON objects are skipped).
pub fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect()
}

/// A replica record as read back: (payload, fence position, tombstone).
pub type Record = (Option<String>, Option<u64>, bool);

pub enum RedisClient {
    Standalone(redis::Connection),
    Cluster(Box<redis::cluster::ClusterConnection>),
}

impl RedisClient {
    pub fn get(&mut self, key: &str) -> Option<String> {
        let cmd = redis::cmd("GET").arg(key).clone();
        match self {
            RedisClient::Standalone(c) => cmd.query(c).unwrap(),
            RedisClient::Cluster(c) => cmd.query(&mut **c).unwrap(),
        }
    }
    pub fn version(&mut self, key: &str) -> u64 {
        self.get(&format!("{key}:ver")).map(|v| v.parse().unwrap()).unwrap_or(0)
    }
    /// Payload of replica `i` of `key` (`HGET K:ri d`): `None` when missing or a tombstone.
    pub fn replica(&mut self, key: &str, i: u32) -> Option<String> {
        self.record(key, i).0
    }
    /// Replica record `i` of `key`: (payload, fence position, tombstone).
    pub fn record(&mut self, key: &str, i: u32) -> Record {
        let cmd = redis::cmd("HMGET").arg(format!("{key}:r{i}")).arg("d").arg("p").arg("t").clone();
        let (d, p, t): (Option<String>, Option<u64>, Option<String>) = match self {
            RedisClient::Standalone(c) => cmd.query(c).unwrap(),
            RedisClient::Cluster(c) => cmd.query(&mut **c).unwrap(),
        };
        (d, p, t.is_some())
    }
    pub fn replicas(&mut self, key: &str, n: u32) -> Vec<Option<String>> {
        (0..n).map(|i| self.replica(key, i)).collect()
    }
    /// Run any command (routed by key in a cluster).
    pub fn cmd<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            RedisClient::Standalone(c) => cmd.query(c).unwrap(),
            RedisClient::Cluster(c) => cmd.query(&mut **c).unwrap(),
        }
    }
    /// Poll until `key:ver` reaches `v` (or 20 s pass; then return what it is).
    pub fn wait_version(&mut self, key: &str, v: u64) -> u64 {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.version(key);
            if now >= v || Instant::now() > until {
                return now;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The version of the last transaction committed on `c` (`@@last_gtid`'s sequence number).
pub async fn last_version(c: &mut mysql_async::Conn) -> u64 {
    let g: String = c.query_first("SELECT @@last_gtid").await.unwrap().unwrap();
    g.rsplit('-').next().unwrap().parse().unwrap_or_else(|_| panic!("@@last_gtid = {g:?}"))
}

/// A pipeline running in this process.
pub struct Running {
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<Result<(), binval::error::Error>>,
    pub stats: Arc<binval::pipeline::Stats>,
}

pub fn start(cfg: Config) -> Running {
    // `BINVAL_TEST_LOG=binval=info cargo test ... -- --nocapture`: the pipeline's log.
    if let Ok(filter) = std::env::var("BINVAL_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).with_test_writer().try_init();
    }
    let (tx, rx) = watch::channel(false);
    let stats = Arc::new(binval::pipeline::Stats::default());
    let handle = tokio::spawn(binval::pipeline::run(cfg, rx, stats.clone()));
    Running { stop: tx, handle, stats }
}

impl Running {
    /// Wait for the pipeline to stop by itself with an error (within `secs`).
    pub async fn expect_error(self, secs: u64) -> binval::error::Error {
        match tokio::time::timeout(Duration::from_secs(secs), self.handle).await {
            Ok(Ok(Err(e))) => e,
            Ok(Ok(Ok(()))) => panic!("pipeline ended without an error"),
            Ok(Err(e)) => panic!("pipeline task failed: {e}"),
            Err(_) => panic!("pipeline still running after {secs} s"),
        }
    }

    /// Graceful stop; panics if the pipeline failed.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("pipeline stops within 30 s")
            .unwrap()
            .expect("pipeline ended cleanly");
    }
}

/// A consumer of `partitions` partitions (0..partitions) of `topic` on `bootstrap`, each
/// assigned at its beginning (a group id of its own, no commits, fetches held at most 5 ms):
/// what the tests read the topic back with.
pub fn reader_from_start(bootstrap: &str, topic: &str, partitions: i32) -> BaseConsumer {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", tk::unique_name("reader"))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    c
}

/// Read `topic` (3 partitions) on `bootstrap` from the beginning until every wanted
/// (key, version) was seen or 30 s passed; returns what was seen.
pub fn events_until(
    bootstrap: &str,
    topic: &str,
    want: &std::collections::HashSet<(String, u64)>,
) -> std::collections::HashSet<(String, u64)> {
    let c = reader_from_start(bootstrap, topic, 3);
    let mut got = std::collections::HashSet::new();
    let until = Instant::now() + Duration::from_secs(30);
    while !want.is_subset(&got) && Instant::now() < until {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            if is_progress(&m) {
                continue;
            }
            let ev = InvalidationEvent::from_json(m.payload().unwrap()).unwrap();
            got.insert((ev.key, ev.version));
        }
    }
    got
}

/// Check the invalidation events of `topic` against `changes` (key, version of each change, in
/// any order): every change is covered by an event of its key with the same or a higher
/// version (binval collapses the changes of a key within a group to the newest, so an
/// intermediate version may have no event of its own, but a consumer that cached it is evicted
/// by the newer one), the newest change of every key has its own event, and no event of these
/// keys from the oldest change given on carries a version that is not one of its changes
/// (older events of the key may come from changes not given). Reads for up to 30 s; returns
/// what is wrong, or `None`.
pub fn events_cover(bootstrap: &str, topic: &str, changes: &[(String, u64)]) -> Option<String> {
    use std::collections::{BTreeMap, HashSet};
    let mut newest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut oldest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut all: HashSet<(String, u64)> = HashSet::new();
    for (k, v) in changes {
        let e = newest.entry(k.as_str()).or_insert(0);
        *e = (*e).max(*v);
        let o = oldest.entry(k.as_str()).or_insert(u64::MAX);
        *o = (*o).min(*v);
        all.insert((k.clone(), *v));
    }
    let want: HashSet<(String, u64)> = newest.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let got = events_until(bootstrap, topic, &want);
    let missing: Vec<_> = want.difference(&got).collect();
    if !missing.is_empty() {
        return Some(format!("{} of {} keys have no event for their newest change: {missing:?}", missing.len(), want.len()));
    }
    let invented: Vec<_> =
        got.iter().filter(|(k, v)| oldest.get(k.as_str()).is_some_and(|o| v >= o)).filter(|e| !all.contains(*e)).collect();
    if !invented.is_empty() {
        return Some(format!("events with versions that are no change of their key: {invented:?}"));
    }
    None
}

/// Read every event of `topic` from the beginning until `want` events arrived or 20 s passed.
pub fn read_events(topic: &str, want: usize) -> Vec<InvalidationEvent> {
    let bootstrap = tk::broker().bootstrap();
    let c = reader_from_start(&bootstrap, topic, 0);
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(5)).unwrap();
    let c = reader_from_start(&bootstrap, topic, md.topics()[0].partitions().len() as i32);
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while out.len() < want && Instant::now() < until {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            if is_progress(&m) {
                continue;
            }
            let ev = InvalidationEvent::from_json(m.payload().unwrap()).expect("event parses");
            assert_eq!(m.key().unwrap(), ev.key.as_bytes(), "Kafka message key is the logical key");
            out.push(ev);
        }
    }
    out
}

/// A progress message of binval (header `binval.kind: progress`), not an invalidation event.
pub fn is_progress<M: Message>(m: &M) -> bool {
    use rdkafka::message::Headers;
    m.headers().is_some_and(|h| {
        h.iter().any(|h| h.key == binval_protocol::KIND_HEADER && h.value == Some(binval_protocol::KIND_PROGRESS.as_bytes()))
    })
}

/// Kills process `pid` (SIGKILL) if the test panics while it may still run, so a failed
/// assertion never leaves a `binval` child behind.
pub struct KillOnPanic(pub u32);

impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            unsafe {
                libc::kill(self.0 as libc::pid_t, libc::SIGKILL);
            }
        }
    }
}

/// The position (`file:pos`, where the event begins) of the first row event of table
/// `db.table` from `from` (`file:pos`) on, read from the server's own binlog file.
pub fn row_event_position(from: &str, table: &str) -> String {
    let (file, pos) = from.rsplit_once(':').unwrap();
    let mut found = None;
    binval::binlog::offline::read_file(&tk::mariadb().datadir.join(file), Some(pos.parse().unwrap()), None, |l| {
        if found.is_none() && l.get("rows").is_some() && l["table"] == table {
            found = l["pos"].as_u64();
        }
    })
    .unwrap();
    format!("{file}:{}", found.unwrap_or_else(|| panic!("no row event of {table} after {from}")))
}
