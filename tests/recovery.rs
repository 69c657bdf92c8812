//! The incident runbooks of the README ("Incidents") run against real services (issue #22,
//! causes 4 and 5): a real MariaDB with its binlog, a 3-master Redis Cluster of the test's own
//! (append-only files, so a master can be wiped with FLUSHALL or restarted empty), standalone
//! Redis, tansu.
//!
//! * A Redis master loses its data under writes — the master holding the checkpoint (FLUSHALL)
//!   or another one (restarted empty): `binval run` resumes from a checkpoint copy and loses no
//!   change; a bounded replay given right after the loss, ending between rows' UPDATE and
//!   DELETE, brings no deleted row back; `binval verify --repair` then brings `binval verify`
//!   to 0 findings; later replays of any range keep it at 0; an app instance reading the
//!   deleted rows throughout never gets one.
//! * Standalone Redis loses everything (no copy survives): the running leader recovers its
//!   start from the topic, loses no change, and the runbook restores every key.
//! * No checkpoint, keys in Redis, nothing on the topic: `check` and `run` refuse, naming what
//!   was found and the command; that command recovers.
//! * The broker was down; an app instance missed events: the runbooks restore every value.

mod pipeline_env;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval_consumer::Consumer;
use mysql_async::prelude::Queryable;
use pipeline_env::*;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const REPLICAS: u32 = 3;
const MAPPING: &str = items_mapping!(3);

/// A config like `Env::config_toml`, with the Redis section and the topic given, and a short
/// lease (takeovers within ~2 s).
fn config_text(env: &Env, start: &str, redis: &str, brokers: &str, topic: &str) -> String {
    let m = MAPPING.replace("{db}", &env.db).replace("{p}", &env.prefix);
    format!(
        r#"
[source]
name = "{name}"
url = "{url}"
server_id = {sid}
heartbeat_ms = 500
start = "{start}"
reconnect_max_ms = 1000
lease_ms = 2000

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
        name = env.source_name,
        url = tk::mariadb().repl_url(),
        sid = env.server_id,
    )
}

fn cluster_section(c: &tk::OwnedCluster) -> String {
    let urls: Vec<String> = c.urls().iter().map(|u| format!("\"{u}\"")).collect();
    format!("mode = \"cluster\"\nurls = [{}]", urls.join(", "))
}

fn write_file(env: &Env, name: &str, text: &str) -> PathBuf {
    let dir = tk::state_root().join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}-{name}", env.prefix));
    std::fs::write(&p, text).unwrap();
    p
}

/// `binval run` as a child process, its log in a file.
struct RunProc {
    child: Option<Child>,
    log: PathBuf,
}

impl RunProc {
    fn spawn(cfg: &Path, log: PathBuf, vars: &[(&str, &str)]) -> RunProc {
        let file = std::fs::File::create(&log).unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_binval"));
        c.arg("run").arg("--config").arg(cfg).env("RUST_LOG", "info").stdout(Stdio::null()).stderr(file);
        for (k, v) in vars {
            c.env(k, v);
        }
        RunProc { child: Some(c.spawn().unwrap()), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for a log line containing `what` (up to `secs`).
    fn wait_log(&self, what: &str, secs: u64) -> bool {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if self.log().contains(what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Wait for it to exit by itself (up to `secs`): its exit code.
    fn wait_exit(&mut self, secs: u64) -> Option<i32> {
        let until = Instant::now() + Duration::from_secs(secs);
        let child = self.child.as_mut()?;
        while Instant::now() < until {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGTERM, and the exit code (it must stop within 30 s).
    fn stop(mut self) -> i32 {
        let Some(child) = self.child.as_ref() else { return 0 };
        Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
        let code = self.wait_exit(30).expect("binval run stops within 30 s of SIGTERM");
        assert_eq!(code, 0, "clean stop; log:\n{}", self.log());
        code
    }
}

impl Drop for RunProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `binval <cmd> --config cfg args...`: (exit code, last JSON line of stdout, stdout, stderr).
fn cli(cmd: &str, cfg: &Path, args: &[&str]) -> (i32, Value, String, String) {
    let cfg = cfg.to_string_lossy();
    let (code, out, err) = binval_cli(&[&[cmd, "--config", &cfg], args].concat(), &[]);
    (code, json_lines(&out).pop().unwrap_or(Value::Null), out, err)
}

/// A writer of random single-row transactions on `ids` (updates, inserts of absent rows,
/// deletes), as fast as one connection goes with a 2 ms pause; returns (id, committed at) of
/// every transaction that changed a row.
struct Writer {
    stop: Arc<AtomicBool>,
    handle: tokio::task::JoinHandle<Vec<(u32, Instant)>>,
}

impl Writer {
    fn start(env: &Env, ids: std::ops::RangeInclusive<u32>, seed: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let url = format!("{}/{}", tk::mariadb().root_url(), env.db);
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            let mut c = mysql_async::Conn::from_url(url).await.unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut done = Vec::new();
            while !s.load(Relaxed) {
                let id: u32 = rng.random_range(ids.clone());
                let sql = match rng.random_range(0..4) {
                    0 | 1 => format!("UPDATE items SET v = v + 1, title = CONCAT('u', v) WHERE id = {id}"),
                    2 => format!("INSERT IGNORE INTO items VALUES ({id}, {id}, 'new')"),
                    _ => format!("DELETE FROM items WHERE id = {id}"),
                };
                c.query_drop(&sql).await.unwrap();
                if c.affected_rows() > 0 {
                    done.push((id, Instant::now()));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            c.disconnect().await.ok();
            done
        });
        Writer { stop, handle }
    }

    async fn stop(self) -> Vec<(u32, Instant)> {
        self.stop.store(true, Relaxed);
        self.handle.await.unwrap()
    }
}

/// An app instance reading `keys` in a loop (local cache, read-through); counts every read
/// that returned a row (each key's row was deleted before the probe started, and none comes
/// back: any row is a deleted row served as live).
struct Probe {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    live: Arc<AtomicU64>,
    handle: tokio::task::JoinHandle<Vec<String>>,
}

impl Probe {
    async fn start(redis_urls: Vec<String>, topic: &str, keys: Vec<String>) -> Probe {
        let app = Consumer::builder()
            .redis_cluster(redis_urls)
            .brokers(tk::broker().bootstrap())
            .topic(topic.to_string())
            .replicas(REPLICAS)
            .kafka_property("fetch.wait.max.ms", "5")
            .max_staleness(Some(Duration::from_secs(30)))
            .build()
            .await
            .expect("app instance starts");
        let (stop, reads, live) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, rd, lv) = (stop.clone(), reads.clone(), live.clone());
        let handle = tokio::spawn(async move {
            let mut served = Vec::new();
            while !s.load(Relaxed) {
                for k in &keys {
                    // Errors (a master down) are not rows.
                    if let Ok(v) = app.get_json::<Value>(k).await {
                        rd.fetch_add(1, Relaxed);
                        if let Some(v) = v {
                            lv.fetch_add(1, Relaxed);
                            served.push(format!("{k}: {v}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            app.shutdown().await;
            served
        });
        Probe { stop, reads, live, handle }
    }

    /// Stop; the rows served as live, and the reads made.
    async fn stop(self) -> (Vec<String>, u64) {
        self.stop.store(true, Relaxed);
        let served = self.handle.await.unwrap();
        (served, self.reads.load(Relaxed))
    }
}

/// The ids of the rows the database holds now.
async fn present_ids(env: &Env) -> HashSet<u32> {
    let mut c = env.conn().await;
    let ids: Vec<u32> = c.query("SELECT id FROM items").await.unwrap();
    c.disconnect().await.ok();
    ids.into_iter().collect()
}

/// Keys of rows of `ids` the database does not hold whose replicas hold a payload (a deleted
/// row a reader would be served).
async fn deleted_with_payload(env: &Env, r: &mut RedisClient, ids: std::ops::RangeInclusive<u32>) -> Vec<String> {
    let present = present_ids(env).await;
    block(|| {
        let mut out = Vec::new();
        for id in ids.filter(|id| !present.contains(id)) {
            let key = format!("{}:item:{id}", env.prefix);
            for i in 0..REPLICAS {
                if let Some(p) = r.replica(&key, i) {
                    out.push(format!("{key}:r{i} = {p}"));
                }
            }
        }
        out
    })
}

/// Commit a marker row and wait until binval applied it: everything before it is applied.
async fn caught_up(env: &Env, r: &mut RedisClient, id: u32) {
    let v = env.exec_v(&format!("INSERT INTO items VALUES ({id}, 0, 'marker') ON DUPLICATE KEY UPDATE v = v + 1")).await;
    let key = format!("{}:item:{id}", env.prefix);
    let deadline = Instant::now() + Duration::from_secs(60);
    while block(|| r.version(&key)) < v {
        assert!(Instant::now() < deadline, "binval did not apply {key} at {v} within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn cluster_client(c: &tk::OwnedCluster) -> RedisClient {
    RedisClient::Cluster(Box::new(redis::cluster::ClusterClient::new(c.urls()).unwrap().get_connection().unwrap()))
}

/// `binval verify` must find nothing: exit 0, 0 mismatches. Returns the summary.
fn verify_clean(cfg: &Path, when: &str) -> Value {
    let (code, s, _, err) = cli("verify", cfg, &["--recheck-ms", "300"]);
    assert_eq!((code, s["mismatches"].clone()), (0, json!(0)), "verify after {when}: {s}\n{err}");
    assert_eq!([&s["missing"], &s["stale"], &s["extra"], &s["version"]], [&json!(0); 4], "{when}: {s}");
    s
}

/// How a test loses a master's data.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// FLUSHALL on the master holding the checkpoint key (and the lease and fencing counter).
    FlushCheckpointMaster,
    /// Another master killed and started again without its data.
    RestartOtherEmpty,
}

async fn a_master_loses_its_data_under_writes(loss: Loss) {
    let env = Env::new(&format!("recover_{}", matches!(loss, Loss::FlushCheckpointMaster) as u8), RedisKind::Standalone);
    let mut cluster = tk::OwnedCluster::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let start = env.binlog_now().await;
    let text = config_text(&env, "current", &cluster_section(&cluster), &tk::broker().bootstrap(), &env.topic);
    let cfg = write_file(&env, "binval.toml", &text);
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run.log", env.prefix)), &[]);
    let mut r = cluster_client(&cluster);
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "no checkpoint pinned: {}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let k = |id: u32| format!("{}:item:{id}", env.prefix);

    // Rows 1..=300; rows 1..=100 updated, then deleted, before the loss (issue #22, cause 5).
    env.exec("INSERT INTO items SELECT seq, seq, CONCAT('t', seq) FROM seq_1_to_300").await;
    let g_upd = env.exec_v("UPDATE items SET v = v + 1000, title = 'updated' WHERE id <= 100").await;
    let g_del = env.exec_v("DELETE FROM items WHERE id <= 100").await;
    assert_eq!(block(|| r.wait_version(&k(100), g_del)), g_del);
    // The checkpoint is kept on every master: the key and its copies.
    let (code, _, out, err) = cli("check", &cfg, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let copies_line = out.lines().find(|l| l.starts_with("checkpoint copies:")).unwrap_or_else(|| panic!("{out}")).to_string();
    assert_eq!(copies_line.matches("~cp").count(), 2, "{copies_line}");

    let deleted: Vec<String> = (1..=100).map(k).collect();
    let probe = Probe::start(cluster.urls(), &env.topic, deleted.clone()).await;
    let writer = Writer::start(&env, 101..=400, 22);
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The loss.
    let owners = tk::SlotOwners::read(cluster.ports[0]).unwrap();
    let cp_master = owners.masters[owners.master_of(binval_protocol::hash_slot(cp_key.as_bytes()))];
    let lost_at = Instant::now();
    let lost_port = match loss {
        Loss::FlushCheckpointMaster => {
            let mut c = redis::Client::open(format!("redis://127.0.0.1:{cp_master}")).unwrap().get_connection().unwrap();
            let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
            cp_master
        }
        Loss::RestartOtherEmpty => {
            let other = *owners.masters.iter().find(|p| **p != cp_master).unwrap();
            let i = cluster.ports.iter().position(|p| *p == other).unwrap();
            block(|| cluster.restart_empty(i)).unwrap();
            other
        }
    };
    println!("{loss:?}: master 127.0.0.1:{lost_port} lost its data (the checkpoint's is {cp_master})");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done = writer.stop().await;
    caught_up(&env, &mut r, 100_000).await;
    let resumed = lost_at.elapsed();
    if matches!(loss, Loss::FlushCheckpointMaster) {
        assert!(run.wait_log("resuming from a copy of the checkpoint", 10), "the new tenure resumed from a copy:\n{}", run.log());
        assert_eq!(run.log().matches("no checkpoint").count(), 1, "only the first start found none:\n{}", run.log());
    }

    // No change committed after the loss is missing: binval resumed where it had stopped
    // (before, it started at the primary's position then and skipped them).
    let after: HashSet<u32> = done.iter().filter(|(_, at)| *at > lost_at + Duration::from_millis(20)).map(|(id, _)| *id).collect();
    let keys: Vec<String> = after.iter().map(|&id| k(id)).collect();
    let key_args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (code, s, _, err) = cli("verify", &cfg, &[&["--recheck-ms", "300", "--keys"], &key_args[..]].concat());
    assert_eq!((code, s["mismatches"].clone()), (0, json!(0)), "the {} keys changed after the loss: {s}\n{err}", keys.len());

    // What the loss left (the keys whose records were on that master).
    let (code, before, _, _) = cli("verify", &cfg, &["--recheck-ms", "300"]);
    assert_eq!(code, 3, "the loss left damage: {before}");
    println!(
        "{loss:?}: {} writer transactions ({} after the loss); binval caught up {:.1} s after the loss; verify then found {} keys damaged (missing {}, stale {}, extra {}, version {}) of {}",
        done.len(),
        after.len(),
        resumed.as_secs_f64(),
        before["mismatches"],
        before["missing"],
        before["stale"],
        before["extra"],
        before["version"],
        before["keys_checked"]
    );

    // Right after the loss, the old remedy: a bounded replay ending between rows 1..=100's
    // UPDATE and DELETE. It must bring none of them back. (The other loss goes to the runbook
    // directly.)
    let to = format!("gtid:0-1-{g_upd}");
    if matches!(loss, Loss::FlushCheckpointMaster) {
        // What the logged images alone would do (the dry run shows the fenced rule only): the
        // deleted rows a replay without the check would have written back.
        let (code, out, err) =
            binval_cli(&["replay", "--config", &cfg.to_string_lossy(), "--from", &start, "--to", &to, "--dry-run", "--quiet"], &[]);
        assert_eq!(code, 0, "{err}");
        let back: HashSet<String> = json_lines(&out)
            .into_iter()
            .filter(|l| l["would_change"] == json!(true) && l["op"] != json!("delete"))
            .filter_map(|l| l["key"].as_str().map(String::from))
            .filter(|key| deleted.contains(key))
            .collect();
        println!("{loss:?}: a replay of the logged images to {to} would have written {} of the 100 deleted rows back", back.len());
        assert!(!back.is_empty(), "the loss took some deleted rows' tokens: the scenario of issue #22, cause 5");
        let (code, s, _, err) = cli("replay", &cfg, &["--from", &start, "--to", &to, "--quiet"]);
        assert_eq!(code, 0, "{err}");
        println!("{loss:?}: replay --to {to} right after the loss: {s}");
        assert!(s["deleted_since"].as_u64().unwrap() > 0, "deleted rows whose token was lost were checked: {s}");
        assert_eq!(deleted_with_payload(&env, &mut r, 1..=400).await, Vec::<String>::new(), "the bounded replay brought deleted rows back");
    }

    // The runbook: 1. verify --repair, 2. verify until it exits 0.
    let t = Instant::now();
    let (code, s, _, err) = cli("verify", &cfg, &["--recheck-ms", "300", "--repair"]);
    assert!(code == 0 || code == 3, "{s} {err}");
    assert_eq!(s["repair_failed"], json!(0), "{s}");
    println!(
        "{loss:?}: verify --repair: {} mismatches, {} repaired, {} events in {:.1} s",
        s["mismatches"],
        s["repaired"],
        s["repair_events"],
        t.elapsed().as_secs_f64()
    );
    let live_before_runbook = probe.live.load(Relaxed);
    verify_clean(&cfg, "the runbook");
    assert_eq!(deleted_with_payload(&env, &mut r, 1..=400).await, Vec::<String>::new());

    // Later replays of any range change nothing and keep verify at 0: ending between the
    // UPDATE and the DELETE, and to the end.
    for range in [vec!["--from", start.as_str(), "--to", to.as_str()], vec!["--from", start.as_str()]] {
        let (code, s, _, err) = cli("replay", &cfg, &[&range[..], &["--quiet"]].concat());
        assert_eq!(code, 0, "{err}");
        // What it may still change: tombstones lost with the master, written again by their
        // logged deletes (verify does not ask for tombstones: they expire), and keys of rows
        // deleted since that kept no record at all, written as deleted. Never a payload.
        assert_eq!(s["written_present"], s["deleted_since"], "replay {range:?} after the runbook: {s}");
        println!("{loss:?}: replay {range:?} after the runbook: {s}");
        verify_clean(&cfg, &format!("replay {range:?}"));
        assert_eq!(deleted_with_payload(&env, &mut r, 1..=400).await, Vec::<String>::new(), "replay {range:?}");
    }
    let (served, reads) = probe.stop().await;
    assert!(reads > 1000, "the app instance read the deleted rows throughout ({reads} reads)");
    assert_eq!(served, Vec::<String>::new(), "deleted rows served as live ({live_before_runbook} before the runbook)");
    println!("{loss:?}: the app instance read the 100 deleted rows {reads} times from before the loss to the end: 0 served as live");
    run.stop();
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoints_master_flushed_under_writes_the_runbook_restores_every_key() {
    a_master_loses_its_data_under_writes(Loss::FlushCheckpointMaster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_master_restarted_empty_under_writes_the_runbook_restores_every_key() {
    a_master_loses_its_data_under_writes(Loss::RestartOtherEmpty).await;
}

/// Standalone Redis loses everything (FLUSHALL): no copy of the checkpoint survives. The
/// running leader recovers its start from the topic and loses no change; `check` says so; the
/// runbook restores every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_redis_flushed_the_start_is_recovered_from_the_topic() {
    let env = Env::new("recover_topic", RedisKind::Standalone);
    let redis = tk::OwnedRedis::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let start = env.binlog_now().await;
    let section = format!("mode = \"standalone\"\nurls = [\"{}\"]", redis.url());
    let cfg = write_file(&env, "binval.toml", &config_text(&env, "current", &section, &tk::broker().bootstrap(), &env.topic));
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run.log", env.prefix)), &[]);
    let mut r = RedisClient::Standalone(redis::Client::open(redis.url()).unwrap().get_connection().unwrap());
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "no checkpoint pinned: {}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.exec("INSERT INTO items SELECT seq, seq, CONCAT('t', seq) FROM seq_1_to_200").await;
    let g_del = env.exec_v("DELETE FROM items WHERE id <= 50").await;
    assert_eq!(block(|| r.wait_version(&format!("{}:item:50", env.prefix), g_del)), g_del);
    let writer = Writer::start(&env, 51..=300, 7);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lost_at = Instant::now();
    let _: () = block(|| r.cmd(&redis::cmd("FLUSHALL")));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done = writer.stop().await;
    caught_up(&env, &mut r, 100_000).await;
    assert!(run.wait_log("resuming where the topic shows it stopped", 10), "{}", run.log());
    let log = run.log();
    let line = log.lines().find(|l| l.contains("resuming where the topic shows it stopped")).unwrap();
    println!("recovered start: {line}");
    assert!(line.contains("partition") && line.contains("messages on the invalidation topic"), "{line}");

    // No change after the loss is missing.
    let after: HashSet<u32> = done.iter().filter(|(_, at)| *at > lost_at + Duration::from_millis(20)).map(|(id, _)| *id).collect();
    let keys: Vec<String> = after.iter().map(|id| format!("{}:item:{id}", env.prefix)).collect();
    let key_args: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (code, s, _, err) = cli("verify", &cfg, &[&["--recheck-ms", "300", "--keys"], &key_args[..]].concat());
    assert_eq!((code, s["mismatches"].clone()), (0, json!(0)), "the {} keys changed after the loss: {s}\n{err}", keys.len());

    // The runbook.
    let (code, s, _, _) = cli("verify", &cfg, &["--recheck-ms", "300"]);
    assert_eq!(code, 3, "everything not changed since the loss is gone: {s}");
    println!("standalone flush: verify found {} keys damaged of {}", s["mismatches"], s["keys_checked"]);
    let (code, s, _, err) = cli("verify", &cfg, &["--recheck-ms", "300", "--repair"]);
    assert_eq!(code, 3, "{s} {err}");
    assert_eq!(s["repair_failed"], json!(0), "{s}");
    verify_clean(&cfg, "the runbook");
    let to = format!("gtid:0-1-{}", g_del - 1);
    for range in [vec!["--from", start.as_str(), "--to", to.as_str()], vec!["--from", start.as_str()]] {
        let (code, s, _, err) = cli("replay", &cfg, &[&range[..], &["--quiet"]].concat());
        assert_eq!(code, 0, "{err}");
        // Keys of rows deleted before the loss kept nothing in Redis: written as deleted, never
        // with the logged payload.
        assert_eq!(s["written_present"], s["deleted_since"], "{s}");
        println!("standalone flush: replay {range:?} after the runbook: {s}");
        verify_clean(&cfg, &format!("replay {range:?}"));
        assert_eq!(deleted_with_payload(&env, &mut r, 1..=300).await, Vec::<String>::new(), "replay {range:?}");
    }
    run.stop();

    // `check` with no checkpoint at all: it says where run would recover from.
    let mut c = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let (code, _, out, err) = cli("check", &cfg, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let line = out.lines().find(|l| l.starts_with("checkpoint: none")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("recovered from the topic") && line.contains("partition"), "{line}");
    assert!(out.contains("earlier run: messages on the invalidation topic"), "{out}");
}

/// No checkpoint, the mappings' keys in Redis, nothing on the topic: `check` and `run` refuse,
/// naming what was found and the exact command; following it (start once at the primary's
/// position, then verify --repair) restores every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_without_a_checkpoint_are_refused_with_the_command_that_recovers() {
    let env = Env::new("recover_refuse", RedisKind::Standalone);
    let redis = tk::OwnedRedis::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let section = format!("mode = \"standalone\"\nurls = [\"{}\"]", redis.url());
    let cfg = write_file(&env, "binval.toml", &config_text(&env, "current", &section, &tk::broker().bootstrap(), &env.topic));
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run1.log", env.prefix)), &[]);
    let mut r = RedisClient::Standalone(redis::Client::open(redis.url()).unwrap().get_connection().unwrap());
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "{}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.exec("INSERT INTO items SELECT seq, seq, 't' FROM seq_1_to_20").await;
    caught_up(&env, &mut r, 1000).await;
    run.stop();
    // The checkpoint lost; a new, empty topic (the old one's retention passed, say).
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(&cp_key)));
    let topic = format!("{}_2", env.topic);
    tk::broker().create_topic(&topic, 3).unwrap();
    let cfg = write_file(&env, "binval2.toml", &config_text(&env, "current", &section, &tk::broker().bootstrap(), &topic));
    // Rows change while binval is away.
    env.exec("UPDATE items SET v = 99 WHERE id BETWEEN 1 AND 5").await;
    env.exec("DELETE FROM items WHERE id BETWEEN 16 AND 20").await;

    let (code, _, out, err) = cli("check", &cfg, &[]);
    assert_eq!(code, 1, "check refuses as run would: {out}\n{err}");
    assert!(out.contains(&format!("earlier run: keys of template `{}:item:{{id}}`", env.prefix)), "{out}");
    for want in ["no checkpoint of source", &cp_key, ":item:", "BINVAL__SOURCE__START=", "verify --config <file> --repair"] {
        assert!(err.contains(want), "the refusal names {want:?}: {err}");
    }
    let (code, _, err) = binval_cli(&["run", "--config", &cfg.to_string_lossy()], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no checkpoint of source") && err.contains("BINVAL__SOURCE__START="), "{err}");
    // The command the error gives.
    let pos = err.split("BINVAL__SOURCE__START=").nth(1).unwrap().split_whitespace().next().unwrap().to_string();
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run2.log", env.prefix)), &[("BINVAL__SOURCE__START", &pos)]);
    assert!(run.wait_log("starting at source.start as given", 30), "{}", run.log());
    let (code, s, _, err) = cli("verify", &cfg, &["--recheck-ms", "300", "--repair"]);
    assert_eq!((code, s["repair_failed"].clone()), (3, json!(0)), "{s} {err}");
    assert_eq!(s["mismatches"], json!(10), "5 stale rows and 5 deleted ones: {s}");
    verify_clean(&cfg, "the refusal's command");
    run.stop();
}

/// The broker was down (hung) while rows changed: binval held back, lost nothing and caught
/// up; the app instance bypassed its local cache meanwhile and serves the database's values
/// after; the runbook's `binval republish` re-sends the events for any instance that kept
/// serving; verify stays at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_was_down_nothing_is_lost_and_apps_converge() {
    let broker = tk::OwnedBroker::start_new().unwrap();
    let env = Env::new("recover_broker", RedisKind::Standalone);
    broker.create_topic(&env.topic, 3).unwrap();
    let cluster = tk::OwnedCluster::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let cfg = write_file(&env, "binval.toml", &config_text(&env, "current", &cluster_section(&cluster), &broker.bootstrap(), &env.topic));
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run.log", env.prefix)), &[]);
    let mut r = cluster_client(&cluster);
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "{}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.exec("INSERT INTO items SELECT seq, seq, 't' FROM seq_1_to_50").await;
    caught_up(&env, &mut r, 1000).await;
    let app = Consumer::builder()
        .redis_cluster(cluster.urls())
        .brokers(broker.bootstrap())
        .topic(env.topic.clone())
        .replicas(REPLICAS)
        .kafka_property("fetch.wait.max.ms", "5")
        .max_staleness(Some(Duration::from_secs(2)))
        .kafka_request_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    for id in 1..=50 {
        let _ = app.get_json::<Value>(&k(id)).await.unwrap();
    }
    let before = chrono_now();
    broker.freeze(true);
    let writer = Writer::start(&env, 1..=60, 3);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let done = writer.stop().await;
    broker.freeze(false);
    caught_up(&env, &mut r, 1000).await;
    // The runbook: binval needs nothing; republish for instances that kept serving.
    let (code, s, _, err) = cli("republish", &cfg, &["--from", &before]);
    assert_eq!(code, 0, "{err}");
    assert!(s["republished"].as_u64().unwrap() > 0, "{s}");
    verify_clean(&cfg, "the broker's outage");
    // Every value the app serves is the database's.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut c = env.conn().await;
        let rows: Vec<(u32, i32, String)> = c.query("SELECT id, v, title FROM items").await.unwrap();
        c.disconnect().await.ok();
        let mut wrong = Vec::new();
        for id in 1..=60 {
            let got = app.get_json::<Value>(&k(id)).await.unwrap();
            let want = rows.iter().find(|r| r.0 == id).map(|(id, v, t)| json!({"id": id, "v": v, "title": t}));
            if got != want {
                wrong.push((id, got, want));
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the app serves other values than the database: {wrong:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("broker down 4 s: {} writer transactions meanwhile, none lost; {} events re-published", done.len(), s["republished"]);
    app.shutdown().await;
    run.stop();
    drop(cluster);
}

/// An app instance that missed events (it cached values whose invalidations it never saw)
/// serves the database's values after the runbook's `binval republish --from`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_missed_events_converges_after_republish() {
    let env = Env::new("recover_missed", RedisKind::Standalone);
    let cluster = tk::OwnedCluster::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let cfg =
        write_file(&env, "binval.toml", &config_text(&env, "current", &cluster_section(&cluster), &tk::broker().bootstrap(), &env.topic));
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run.log", env.prefix)), &[]);
    let mut r = cluster_client(&cluster);
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "{}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The runbook's "time before the miss": any time before it will do (republishing more is
    // harmless); this one is before every event of the test.
    let before = chrono_now();
    env.exec("INSERT INTO items SELECT seq, seq, 't' FROM seq_1_to_20").await;
    caught_up(&env, &mut r, 1000).await;
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    // What Redis holds now, to put back for a moment below.
    let dump = |r: &mut RedisClient| -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for id in 1..=20 {
            for i in 0..REPLICAS {
                let name = format!("{}:r{i}", k(id));
                out.push((name.clone(), r.cmd::<Vec<String>>(redis::cmd("HGETALL").arg(&name))));
            }
            out.push((format!("{}:ver", k(id)), vec![r.get(&format!("{}:ver", k(id))).unwrap()]));
        }
        out
    };
    let restore = |r: &mut RedisClient, state: &[(String, Vec<String>)]| {
        for (name, fields) in state {
            let _: i64 = r.cmd(redis::cmd("DEL").arg(name));
            if name.ends_with(":ver") {
                let _: () = r.cmd(redis::cmd("SET").arg(name).arg(&fields[0]));
            } else if !fields.is_empty() {
                let _: i64 = r.cmd(redis::cmd("HSET").arg(name).arg(fields));
            }
        }
    };
    let old = block(|| dump(&mut r));
    env.exec("UPDATE items SET v = v + 100 WHERE id <= 10").await;
    env.exec("DELETE FROM items WHERE id > 15").await;
    caught_up(&env, &mut r, 1000).await;
    let new = block(|| dump(&mut r));
    // An instance that starts now (at the newest offsets) while Redis shows the old state for a
    // moment caches values whose invalidations it never sees.
    run.stop();
    block(|| restore(&mut r, &old));
    let app = Consumer::builder()
        .redis_cluster(cluster.urls())
        .brokers(tk::broker().bootstrap())
        .topic(env.topic.clone())
        .replicas(REPLICAS)
        .kafka_property("fetch.wait.max.ms", "5")
        .max_staleness(Some(Duration::from_secs(30)))
        .build()
        .await
        .unwrap();
    for id in 1..=20 {
        assert!(app.get_json::<Value>(&k(id)).await.unwrap().is_some());
    }
    block(|| restore(&mut r, &new));
    assert_eq!(app.get_json::<Value>(&k(1)).await.unwrap().unwrap()["v"], json!(1), "stale: the instance missed the events");
    // A dry run first says what it would send, per partition, and sends nothing.
    let (code, d, _, err) = cli("republish", &cfg, &["--from", &before, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!((d["dry_run"].as_bool(), d["republished"].as_u64()), (Some(true), Some(0)), "{d}");
    assert!(d["would_republish"].as_u64().unwrap() >= 35 && d["would_republish"] == d["read"], "{d}");
    let per_partition: u64 = d["partitions"].as_object().unwrap().values().map(|p| p["events"].as_u64().unwrap()).sum();
    assert_eq!(Some(per_partition), d["read"].as_u64(), "{d}");
    // The runbook: republish from before the changes.
    let (code, s, _, err) = cli("republish", &cfg, &["--from", &before]);
    assert_eq!(code, 0, "{err}");
    assert!(s["republished"].as_u64().unwrap() >= 35, "20 inserts, 10 updates and 5 deletes (and the marker): {s}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut wrong = Vec::new();
        for id in 1..=20u32 {
            let got = app.get_json::<Value>(&k(id)).await.unwrap();
            let want = match id {
                1..=10 => Some(json!({"id": id, "v": id + 100, "title": "t"})),
                11..=15 => Some(json!({"id": id, "v": id, "title": "t"})),
                _ => None,
            };
            if got != want {
                wrong.push((id, got, want));
            }
        }
        if wrong.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "after republish the app still serves: {wrong:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.shutdown().await;
    drop(cluster);
}

/// Now as `YYYY-MM-DD HH:MM:SS` (UTC), minus one second, for `--from` time arguments.
fn chrono_now() -> String {
    let t = std::time::SystemTime::now() - Duration::from_secs(1);
    humantime::format_rfc3339_seconds(t).to_string().replace('T', " ").trim_end_matches('Z').to_string()
}

/// Issue #22, cause 5, its last part: a deleted row's version token older than its tombstones
/// (what a replay after a loss used to leave), and a deleted row's tombstones without a token:
/// `verify` counts a `version` and a `missing` finding and reports the token it read, `inspect`
/// says "agreement NO", `--repair` fixes both, and a replay to between the row's UPDATE and
/// DELETE then writes nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rows_token_older_than_its_tombstones_is_found_and_repaired() {
    let env = Env::new("recover_token", RedisKind::Standalone);
    let cluster = tk::OwnedCluster::start_new().unwrap();
    env.exec(pipeline_env::items::ID_V_TITLE).await;
    let start = env.binlog_now().await;
    let cfg =
        write_file(&env, "binval.toml", &config_text(&env, "current", &cluster_section(&cluster), &tk::broker().bootstrap(), &env.topic));
    let run = RunProc::spawn(&cfg, tk::state_root().join(format!("{}-run.log", env.prefix)), &[]);
    let mut r = cluster_client(&cluster);
    let cp_key = format!("binval:{{{}}}:checkpoint", env.source_name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while block(|| r.get(&cp_key)).is_none() {
        assert!(Instant::now() < deadline, "{}", run.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    env.exec("INSERT INTO items VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')").await;
    let v_upd = env.exec_v("UPDATE items SET v = 10 WHERE id IN (1, 2)").await;
    let v_del = env.exec_v("DELETE FROM items WHERE id IN (1, 2)").await;
    assert_eq!(block(|| r.wait_version(&k(2), v_del)), v_del);
    let _: () = block(|| r.cmd(redis::cmd("SET").arg(format!("{}:ver", k(1))).arg(v_upd)));
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(format!("{}:ver", k(2)))));
    assert_eq!(block(|| r.record(&k(1), 0)), (None, Some(v_del), true), "tombstones at the delete");

    let lines = tk::state_root().join(format!("{}-mismatches.jsonl", env.prefix));
    let (code, s, _, err) = cli("verify", &cfg, &["--recheck-ms", "300", "--mismatches", &lines.to_string_lossy()]);
    assert_eq!(code, 3, "{s} {err}");
    assert_eq!([&s["mismatches"], &s["version"], &s["missing"], &s["extra"]], [&json!(2), &json!(1), &json!(1), &json!(0)], "{s}");
    let text = std::fs::read_to_string(&lines).unwrap();
    let found: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let l1 = found.iter().find(|l| l["key"] == json!(k(1))).unwrap_or_else(|| panic!("{text}"));
    assert_eq!((l1["findings"][0]["kind"].clone(), l1["version"].clone()), (json!("version"), json!(v_upd)), "the token read, not 0: {l1}");
    assert_eq!(l1["replica_positions"], json!([v_del, v_del, v_del]), "{l1}");
    let l2 = found.iter().find(|l| l["key"] == json!(k(2))).unwrap_or_else(|| panic!("{text}"));
    assert_eq!((l2["findings"][0]["kind"].clone(), l2["version"].clone()), (json!("missing"), Value::Null), "{l2}");
    let (code, out, err) = binval_cli(&["inspect", "--config", &cfg.to_string_lossy(), &k(1)], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("agreement      NO") && out.contains(&format!("version token {v_upd} is older than replica")), "{out}");

    let (code, s, _, err) = cli("verify", &cfg, &["--recheck-ms", "300", "--repair"]);
    assert_eq!((code, s["repaired"].clone(), s["repair_failed"].clone()), (3, json!(2), json!(0)), "{s} {err}");
    verify_clean(&cfg, "the repair");
    let after = block(|| r.version(&k(1)));
    assert!(after >= v_del, "the token is the repair's snapshot position now, not older than the tombstones ({after})");
    let (code, s, _, err) = cli("replay", &cfg, &["--from", &start, "--to", &format!("gtid:0-1-{v_upd}"), "--quiet"]);
    assert_eq!((code, s["changed"].clone()), (0, json!(0)), "{s} {err}");
    verify_clean(&cfg, "a replay to between the UPDATE and the DELETE");
    assert_eq!(deleted_with_payload(&env, &mut r, 1..=3).await, Vec::<String>::new());
    run.stop();
    drop(cluster);
}
