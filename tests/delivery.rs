//! Delivery guarantees on real services (invariants I1, I2, I3 of design.md): version-fenced
//! writes, kill -9 at crash points while a writer runs, and a standby taking over from a killed
//! active instance.
//!
//! `BINVAL_KILL_POINTS` sets how many kill -9 rounds the harness runs (default 20; use 100+
//! for a soak).

mod pipeline_env;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use binval::mapping::KeyChange;
use binval::redis::RedisConn;
use binval::write::redis_sink::{Applied, WriteCtx};
use binval_protocol::{FencePosition, Op};
use pipeline_env::*;
use rand::{Rng, SeedableRng};

fn block<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn fenced_writes(kind: RedisKind) {
    let env = Env::new("fence", kind);
    let cfg = env.config("current", "");
    let conn = RedisConn::connect(&cfg.redis).await.unwrap();
    let key = format!("{}:k", env.prefix);
    let ch = |payload: Option<&str>, op: Op| KeyChange {
        key: key.clone(),
        op,
        table: Arc::from("db.t"),
        payload: payload.map(String::from),
        replicas: 3,
        count: 3,
        ttl_secs: 0,
    };
    let w = |pos: u64, token: u64| WriteCtx {
        position: FencePosition(pos),
        fencing_token: token,
        source_name: "test".into(),
        tombstone_ttl_ms: 60_000,
    };
    let apply = |c: KeyChange, w: WriteCtx| {
        let conn = conn.clone();
        async move { conn.apply_all(std::slice::from_ref(&c), &w).await.map(|v| v[0]) }
    };
    let mut r = env.redis_client();
    let state = |r: &mut RedisClient| -> (u64, Vec<Record>) { (r.version(&key), (0..3).map(|i| r.record(&key, i)).collect()) };

    let a = apply(ch(Some("v10"), Op::Insert), w(10, 1)).await.unwrap();
    assert_eq!(a, Applied { version: 10, replicas_written: 3, version_moved: true, skipped_newer: false });
    let after_10 = block(|| state(&mut r));
    assert_eq!(after_10, (10, vec![(Some("v10".into()), Some(10), false); 3]));

    // An older change and a duplicate of the applied one change nothing.
    assert_eq!(
        apply(ch(Some("v5"), Op::Update), w(5, 1)).await.unwrap(),
        Applied { version: 5, replicas_written: 0, version_moved: false, skipped_newer: true }
    );
    assert_eq!(
        apply(ch(Some("v10"), Op::Insert), w(10, 1)).await.unwrap(),
        Applied { version: 10, replicas_written: 0, version_moved: false, skipped_newer: false }
    );
    assert_eq!(block(|| state(&mut r)), after_10, "re-applying old changes leaves every replica and the token as new as before");

    // A delete leaves tombstones with a TTL; a late, older write cannot resurrect the row.
    apply(ch(None, Op::Delete), w(20, 1)).await.unwrap();
    assert_eq!(block(|| state(&mut r)), (20, vec![(None, Some(20), true); 3]));
    let ttl: i64 = block(|| r.cmd(redis::cmd("PTTL").arg(format!("{key}:r2"))));
    assert!(ttl > 0 && ttl <= 60_000, "tombstone TTL {ttl}");
    assert_eq!(apply(ch(Some("late"), Op::Update), w(15, 1)).await.unwrap().replicas_written, 0);
    assert_eq!(block(|| state(&mut r)), (20, vec![(None, Some(20), true); 3]), "tombstone refused the older write");

    // A newer write replaces the tombstone and clears its TTL.
    apply(ch(Some("v30"), Op::Insert), w(30, 1)).await.unwrap();
    let ttl: i64 = block(|| r.cmd(redis::cmd("PTTL").arg(format!("{key}:r2"))));
    assert_eq!(ttl, -1, "a live record has no TTL (mapping ttl_secs = 0)");

    // One replica lost (e.g. a master's data): re-applying an older change does not fill it
    // with an older value (the token is newer: the key is skipped) ...
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(format!("{key}:r1"))));
    assert!(apply(ch(Some("v20"), Op::Update), w(25, 1)).await.unwrap().skipped_newer);
    assert_eq!(block(|| r.record(&key, 1)), (None, None, false));
    // ... and re-applying the newest change restores it without moving the token.
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(format!("{key}:r1"))));
    assert_eq!(
        apply(ch(Some("v30"), Op::Insert), w(30, 1)).await.unwrap(),
        Applied { version: 30, replicas_written: 1, version_moved: false, skipped_newer: false }
    );
    assert_eq!(block(|| state(&mut r)), (30, vec![(Some("v30".into()), Some(30), false); 3]));

    // Each write leaves exactly its kind's fields and its own TTL, whatever the record was
    // (the script overwrites in place, without DEL; see `LUA_WRITE_REPLICA`).
    let fields = |r: &mut RedisClient| -> (Vec<String>, i64) {
        let mut f: Vec<String> = r.cmd(redis::cmd("HKEYS").arg(format!("{key}:r0")));
        f.sort();
        (f, r.cmd(redis::cmd("PTTL").arg(format!("{key}:r0"))))
    };
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let with_ttl = |c: KeyChange, secs: u64| KeyChange { ttl_secs: secs, ..c };
    apply(with_ttl(ch(Some("v31"), Op::Update), 100), w(31, 1)).await.unwrap();
    let (f, ttl) = block(|| fields(&mut r));
    assert_eq!(f, names(&["d", "f", "n", "p", "x"]), "a set with a TTL marks it (n: the key's replica count)");
    assert!(ttl > 0 && ttl <= 100_000, "{ttl}");
    apply(ch(Some("v32"), Op::Update), w(32, 1)).await.unwrap();
    assert_eq!(block(|| fields(&mut r)), (names(&["d", "f", "n", "p"]), -1), "a set without TTL over one with a TTL drops it");
    apply(ch(None, Op::Delete), w(33, 1)).await.unwrap();
    let (f, ttl) = block(|| fields(&mut r));
    assert_eq!(f, names(&["f", "n", "p", "t", "x"]), "a tombstone holds no payload");
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    apply(ch(None, Op::Update), w(34, 1)).await.unwrap();
    let (f, ttl) = block(|| fields(&mut r));
    assert_eq!(f, names(&["f", "n", "p", "x"]), "an invalidate-mode record holds the position only");
    assert!(ttl > 0 && ttl <= 60_000, "{ttl}");
    apply(ch(Some("v35"), Op::Update), w(35, 1)).await.unwrap();
    assert_eq!(block(|| fields(&mut r)), (names(&["d", "f", "n", "p"]), -1));
    assert_eq!(block(|| state(&mut r)), (35, vec![(Some("v35".into()), Some(35), false); 3]));

    // A writer with an older fencing token than the one that wrote the key is refused.
    apply(ch(Some("v40"), Op::Update), w(40, 2)).await.unwrap();
    let e = apply(ch(Some("stale"), Op::Update), w(50, 1)).await.unwrap_err();
    assert!(e.to_string().contains("fencing token"), "{e}");
    assert!(e.is_transient(), "a lost lease sends the instance back to standby");
    assert_eq!(block(|| r.replica(&key, 0)).as_deref(), Some("v40"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_standalone() {
    fenced_writes(RedisKind::Standalone).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_cluster() {
    fenced_writes(RedisKind::Cluster).await;
}

// ---------------------------------------------------------------------------------------------
// kill -9 harness

const MAPPING: &str = items_mapping!(3);
const IDS: u32 = 12;

/// What the writer did: the final row per id and every change as (id, GTID sequence number).
#[derive(Default)]
struct Written {
    rows: BTreeMap<u32, Option<i64>>,
    last_seq: BTreeMap<u32, u64>,
    changes: Vec<(u32, u64)>,
}

/// Writes random single-statement transactions on ids `first..first + IDS` until `stop`,
/// recording each one's GTID, sleeping up to `max_sleep_ms` between them.
fn writer(db: String, stop: Arc<AtomicBool>, seed: u64, first: u32, max_sleep_ms: u64) -> std::thread::JoinHandle<Written> {
    std::thread::spawn(move || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut w = Written::default();
        let mut n: i64 = 0;
        while !stop.load(Ordering::Relaxed) {
            let id = rng.random_range(first..first + IDS);
            n += 1;
            let exists = matches!(w.rows.get(&id), Some(Some(_)));
            let (sql, after) = if !exists {
                (format!("INSERT INTO `{db}`.items VALUES ({id}, {n})"), Some(n))
            } else if rng.random_bool(0.75) {
                (format!("UPDATE `{db}`.items SET v = {n} WHERE id = {id}"), Some(n))
            } else {
                (format!("DELETE FROM `{db}`.items WHERE id = {id}"), None)
            };
            let out = tk::mariadb().sql(&format!("{sql}; SELECT @@last_gtid")).expect("writer statement");
            let seq: u64 = out.trim().rsplit('-').next().unwrap().parse().unwrap();
            w.rows.insert(id, after);
            w.last_seq.insert(id, seq);
            w.changes.push((id, seq));
            if max_sleep_ms > 0 {
                std::thread::sleep(Duration::from_millis(rng.random_range(0..max_sleep_ms)));
            }
        }
        w
    })
}

impl Written {
    /// The record of writers on disjoint ids, as one.
    fn merge(all: Vec<Written>) -> Written {
        let mut w = Written::default();
        for x in all {
            w.rows.extend(x.rows);
            w.last_seq.extend(x.last_seq);
            w.changes.extend(x.changes);
        }
        w
    }
}

/// Processes started by `binval_child` in this test process, killed if a test panics.
static CHILDREN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

struct ReapOnPanic;
impl Drop for ReapOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for pid in CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                unsafe {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
            }
        }
    }
}

fn binval_child(cfg: &std::path::Path, kill_at: Option<&str>, log: &std::path::Path) -> Child {
    let mut c = Command::new(env!("CARGO_BIN_EXE_binval"));
    c.arg("run").arg("--config").arg(cfg).env("RUST_LOG", "binval=info").stdout(Stdio::null());
    c.stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap());
    if let Some(k) = kill_at {
        c.env("BINVAL_KILL_AT", k);
    }
    let child = c.spawn().unwrap();
    CHILDREN.lock().unwrap().push(child.id());
    child
}

fn signal(child: &Child, sig: i32) {
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Samples r0's fence position of every key (ids `1..=ids`) and records any step backwards (I2).
fn regression_sampler(prefix: String, stop: Arc<AtomicBool>, ids: u32) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    std::thread::spawn(move || {
        let mut c = redis::cluster::ClusterClient::new(tk::redis_cluster().urls()).unwrap().get_connection().unwrap();
        let mut seen: HashMap<(u32, u32), u64> = HashMap::new();
        let (mut samples, mut bad) = (0u64, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            for id in 1..=ids {
                for r in 0..3 {
                    let p: Option<u64> = redis::cmd("HGET").arg(format!("{prefix}:item:{id}:r{r}")).arg("p").query(&mut c).unwrap_or(None);
                    if let Some(p) = p {
                        let prev = seen.entry((id, r)).or_insert(0);
                        if p < *prev {
                            bad.push(format!("item {id} r{r}: position {prev} -> {p}"));
                        }
                        *prev = p.max(*prev);
                        samples += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        (samples, bad)
    })
}

/// Check the final state in Redis and Kafka against what the writer did: every key's
/// `replicas` replicas hold its last change.
fn check_final_state(env: &Env, w: &Written, replicas: u32) {
    let mut r = env.redis_client();
    let k = |id: u32| format!("{}:item:{id}", env.prefix);
    for (&id, seq) in &w.last_seq {
        assert_eq!(r.wait_version(&k(id), *seq), *seq, "item {id}: version token = position of its last change");
    }
    for (&id, row) in &w.rows {
        for i in 0..replicas {
            let (d, p, tomb) = r.record(&k(id), i);
            assert_eq!(p, Some(w.last_seq[&id]), "item {id} r{i}: replica written by the last change");
            match row {
                Some(v) => {
                    let d: serde_json::Value = serde_json::from_str(&d.unwrap_or_else(|| panic!("item {id} r{i} has no payload"))).unwrap();
                    assert_eq!(d, serde_json::json!({"id": id, "v": v}), "item {id} r{i}");
                }
                None => assert!(tomb && d.is_none(), "item {id} r{i}: deleted row is a tombstone"),
            }
        }
    }
    // Every change is covered by an event (its own, or a newer one of its key: groups publish
    // one event per key), the newest of each key has its own, and no version is invented.
    let changes: Vec<(String, u64)> = w.changes.iter().map(|(id, s)| (k(*id), *s)).collect();
    if let Some(problem) = events_cover(&tk::broker().bootstrap(), &env.topic, &changes) {
        panic!("{problem}");
    }
}

/// The mapping of the adaptive harness: counts 1..=3, a budget of 100 reads/s per master, and
/// a cool-down and grace short enough that counts change every second or so.
const ADAPTIVE_MAPPING: &str = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = { min = 1, max = 3 }\n\n\
[adaptive]\nread_budget_per_master = 100\ncool_down_secs = 1\nshrink_grace_ms = 300\npoll_interval_ms = 100\nreport_max_age_ms = 300\n";

/// Plays the fleet for the adaptive harness: every 100 ms a heat report calls three of the
/// ids hot (1,000 reads/s), a different three every 700 ms, so keys keep growing and shrinking.
/// Returns how many of its rounds found a hot key with a second replica (grown).
fn heat_player(prefix: String, stop: Arc<AtomicBool>, ids: u32) -> std::thread::JoinHandle<usize> {
    use binval_protocol::adaptive::{heat_bucket_key, heat_bucket_of, HeatReport, HEAT_REPORT_VERSION};
    std::thread::spawn(move || {
        let mut c = redis::cluster::ClusterClient::new(tk::redis_cluster().urls()).unwrap().get_connection().unwrap();
        let instance = format!("{prefix}-fleet");
        let t0 = Instant::now();
        let mut grown = 0;
        while !stop.load(Ordering::Relaxed) {
            let phase = (t0.elapsed().as_millis() / 700) as u32;
            let keys: Vec<(String, f64)> = (0..3).map(|k| (format!("{prefix}:item:{}", 1 + (phase * 3 + k) % ids), 1000.0)).collect();
            if keys.iter().any(|(k, _)| redis::cmd("EXISTS").arg(format!("{k}:r1")).query::<i64>(&mut c).unwrap_or(0) == 1) {
                grown += 1;
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
            let r = HeatReport { v: HEAT_REPORT_VERSION, at_ms: now, keys, now: vec![] };
            let _: Result<(), _> =
                redis::cmd("HSET").arg(heat_bucket_key(heat_bucket_of(&instance))).arg(&instance).arg(r.to_json()).query(&mut c);
            std::thread::sleep(Duration::from_millis(100));
        }
        let _: Result<(), _> = redis::cmd("HDEL").arg(heat_bucket_key(heat_bucket_of(&instance))).arg(&instance).query(&mut c);
        grown
    })
}

fn write_config(env: &Env, start: &str, lease_ms: u64) -> std::path::PathBuf {
    write_config_with(env, start, lease_ms, MAPPING)
}

fn write_config_with(env: &Env, start: &str, lease_ms: u64, mapping: &str) -> std::path::PathBuf {
    let text =
        env.config_toml(start, mapping).replace("reconnect_max_ms = 2000", &format!("reconnect_max_ms = 2000\nlease_ms = {lease_ms}"));
    let dir = tk::state_root().join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.toml", env.prefix));
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn kill_9_at_crash_points_loses_nothing_and_never_regresses() {
    kill_9_harness("kill9", 1, 15);
}

/// The same with three writers that never pause (on ids of their own): binval catches up after
/// every restart and applies the backlog in groups of many transactions, so kills land with
/// groups in flight: replicas of several transactions written, tokens not yet moved, events of
/// a group partly enqueued, a checkpoint behind a whole group.
#[test]
fn kill_9_with_groups_in_flight_loses_nothing_and_never_regresses() {
    kill_9_harness("kill9g", 3, 0);
}

/// The same with adaptive replica counts changing all the time (issue #23): keys grow (copies
/// of replica 0), announce a smaller count and lose their extra replicas while binval is
/// killed at crash points and from outside. After a clean run, once the fleet is quiet, every
/// key is back at one replica holding its last change, no extra replica is left behind, and no
/// replica ever moved backwards.
#[test]
fn kill_9_while_replica_counts_change_loses_nothing_and_leaves_no_stale_copy() {
    kill_9_harness_with("kill9a", 1, 15, true);
}

/// `rounds` (BINVAL_KILL_POINTS, default 20) kills of `binval run` at random crash points while
/// `writers` writers change rows; then a clean run must hold every row's last change (see
/// [`check_final_state`]) and no replica may ever have moved backwards.
fn kill_9_harness(name: &str, writers: u32, max_sleep_ms: u64) {
    kill_9_harness_with(name, writers, max_sleep_ms, false)
}

/// [`kill_9_harness`], with adaptive replica counts changing throughout when `adaptive`.
fn kill_9_harness_with(name: &str, writers: u32, max_sleep_ms: u64, adaptive: bool) {
    let rounds: usize = std::env::var("BINVAL_KILL_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let _reap = ReapOnPanic;
    let env = Env::new(name, RedisKind::Cluster);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(env.exec(pipeline_env::items::ID_COUNTER));
    let start = rt.block_on(env.binlog_now());
    let cfg = write_config_with(&env, &start, 600, if adaptive { ADAPTIVE_MAPPING } else { MAPPING });
    let log = tk::state_root().join(format!("{}.log", env.prefix));
    let seed: u64 = std::env::var("BINVAL_KILL_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    println!("kill -9 harness: {rounds} rounds, seed {seed} (BINVAL_KILL_SEED), log {}", log.display());

    let stop = Arc::new(AtomicBool::new(false));
    let total_ids = IDS * writers;
    let sampler = regression_sampler(env.prefix.clone(), stop.clone(), total_ids);
    let heat_stop = Arc::new(AtomicBool::new(false));
    let heat = adaptive.then(|| heat_player(env.prefix.clone(), heat_stop.clone(), total_ids));
    let writers: Vec<_> =
        (0..writers).map(|k| writer(env.db.clone(), stop.clone(), seed.wrapping_add(k as u64), 1 + k * IDS, max_sleep_ms)).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x9e37);
    let mut fired: BTreeMap<&str, u32> = BTreeMap::new();
    let mut external = 0;
    for _ in 0..rounds {
        let point = binval::failpoint::POINTS[rng.random_range(0..binval::failpoint::POINTS.len())];
        let n = rng.random_range(1..=6);
        let mut child = binval_child(&cfg, Some(&format!("{point}:{n}")), &log);
        match wait_exit(&mut child, Duration::from_secs(6)) {
            Some(s) => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(
                    s.signal(),
                    Some(libc::SIGKILL),
                    "binval exited by itself ({s}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
                *fired.entry(point).or_default() += 1;
            }
            None => {
                // The point was not reached in time: kill -9 from outside, at a random moment.
                signal(&child, libc::SIGKILL);
                child.wait().unwrap();
                external += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = Written::merge(writers.into_iter().map(|w| w.join().unwrap()).collect());
    // A clean run catches up with everything since the last checkpoint.
    let mut child = binval_child(&cfg, None, &log);
    let mut grown = 0usize;
    if let Some(h) = heat {
        // The fleet goes quiet: every key must shrink back to one replica, leaving none behind.
        let mut r = env.redis_client();
        heat_stop.store(true, Ordering::Relaxed);
        grown = h.join().unwrap();
        assert!(grown > 0, "no key was ever seen grown: the counts did not change under the kills");
        let until = Instant::now() + Duration::from_secs(40);
        loop {
            let prefix = &env.prefix;
            let extra: Vec<String> = (1..=total_ids)
                .flat_map(|id| (1..3).map(move |i| format!("{prefix}:item:{id}:r{i}")))
                .filter(|k| r.cmd::<i64>(redis::cmd("EXISTS").arg(k)) == 1)
                .collect();
            if extra.is_empty() {
                break;
            }
            assert!(Instant::now() < until, "replicas left after the fleet went quiet: {extra:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    check_final_state(&env, &written, if adaptive { 1 } else { 3 });
    signal(&child, libc::SIGTERM);
    let status = wait_exit(&mut child, Duration::from_secs(30)).expect("binval stops on SIGTERM");
    assert!(status.success(), "{status}");
    let (samples, regressions) = sampler.join().unwrap();
    assert!(regressions.is_empty(), "replicas moved backwards: {regressions:?}");
    println!(
        "kill -9 harness: {} changes, {} killed at crash points {fired:?}, {external} killed from outside, {samples} replica samples without regression{}",
        written.changes.len(),
        rounds - external,
        if adaptive { format!(", {grown} heat rounds saw a hot key grown") } else { String::new() }
    );
    assert!(fired.values().sum::<u32>() as usize * 2 >= rounds, "most rounds must die at a crash point: {fired:?}");
}

/// `lease acquired` lines in a log, i.e. how often an instance became active.
fn count_in(log: &std::path::Path, needle: &str) -> usize {
    let mut s = String::new();
    std::fs::File::open(log).map(|mut f| f.read_to_string(&mut s)).ok();
    s.matches(needle).count()
}

#[test]
fn standby_takes_over_from_a_killed_active_instance_and_a_paused_one_cannot_write() {
    let _reap = ReapOnPanic;
    let env = Env::new("ha", RedisKind::Cluster);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(env.exec(pipeline_env::items::ID_COUNTER));
    let start = rt.block_on(env.binlog_now());
    let cfg = write_config(&env, &start, 1500);
    let (log_a, log_b) = (tk::state_root().join(format!("{}.a.log", env.prefix)), tk::state_root().join(format!("{}.b.log", env.prefix)));
    let mut a = binval_child(&cfg, None, &log_a);
    let until = Instant::now() + Duration::from_secs(20);
    while count_in(&log_a, "lease acquired") == 0 {
        assert!(Instant::now() < until, "first instance never became active");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut b = binval_child(&cfg, None, &log_b);
    let until = Instant::now() + Duration::from_secs(20);
    while count_in(&log_b, "waiting as standby") == 0 {
        assert!(Instant::now() < until, "second instance did not go standby");
        std::thread::sleep(Duration::from_millis(50));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writer = writer(env.db.clone(), stop.clone(), 7, 1, 15);
    std::thread::sleep(Duration::from_millis(800));
    // Kill the active one mid-stream; the standby takes over within a few seconds.
    signal(&a, libc::SIGKILL);
    a.wait().unwrap();
    let killed = Instant::now();
    while count_in(&log_b, "lease acquired") == 0 {
        assert!(killed.elapsed() < Duration::from_secs(10), "standby did not take over");
        std::thread::sleep(Duration::from_millis(20));
    }
    let takeover = killed.elapsed();
    std::thread::sleep(Duration::from_millis(800));

    // Pause the new active instance (as a long GC or VM stall would), let a third instance
    // take over, then wake the paused one: it must find its lease lost and write nothing.
    let log_c = tk::state_root().join(format!("{}.c.log", env.prefix));
    let mut c = binval_child(&cfg, None, &log_c);
    signal(&b, libc::SIGSTOP);
    let paused = Instant::now();
    while count_in(&log_c, "lease acquired") == 0 {
        assert!(
            paused.elapsed() < Duration::from_secs(10),
            "third instance did not take over from the paused one: {}",
            std::fs::read_to_string(&log_c).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(800));
    signal(&b, libc::SIGCONT);
    let until = Instant::now() + Duration::from_secs(10);
    while count_in(&log_b, "lease of source") == 0 && count_in(&log_b, "another instance is active") < 2 {
        assert!(Instant::now() < until, "woken instance did not notice it lost the lease; log {}", log_b.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    check_final_state(&env, &written, 3);

    // Every tenure took a larger fencing token; the last active instance (c) holds the newest
    // one and wrote with it.
    let mut r = env.redis_client();
    let fence: u64 = r.get(&format!("binval:{{{}}}:fence", env.source_name)).unwrap().parse().unwrap();
    assert!(fence > 1_700_000_000_000, "tokens follow the Redis clock in ms: {fence}");
    let mut by_c = 0;
    for id in 1..=IDS {
        for i in 0..3 {
            let f: Option<u64> = r.cmd(redis::cmd("HGET").arg(format!("{}:item:{id}:r{i}", env.prefix)).arg("f"));
            assert!(f.unwrap_or(0) <= fence, "no replica carries a token newer than the newest tenure");
            if f == Some(fence) {
                by_c += 1;
            }
        }
    }
    assert!(by_c > 0, "the last active instance wrote");
    println!(
        "standby took over {:.1} s after kill -9 of the active instance (lease 1.5 s); {} changes, none lost",
        takeover.as_secs_f64(),
        written.changes.len()
    );
    for ch in [&mut b, &mut c] {
        signal(ch, libc::SIGTERM);
        let s = wait_exit(ch, Duration::from_secs(30)).expect("stops on SIGTERM");
        assert!(s.success(), "{s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_even_after_the_counter_is_lost() {
    use binval::ha::lease::{fencing_token_key, lease_key, Lease};
    let env = Env::new("tokens", RedisKind::Cluster);
    let cfg = env.config("current", "");
    let conn = RedisConn::connect(&cfg.redis).await.unwrap();
    let name = env.source_name.as_str();
    let a = Lease::try_acquire(&conn, name, "a", 10_000).await.unwrap().unwrap();
    let busy = Lease::try_acquire(&conn, name, "b", 10_000).await.unwrap().unwrap_err();
    assert_eq!(busy.0, "a", "b sees a as the holder");
    assert_eq!(
        Lease::try_acquire(&conn, name, "a", 10_000).await.unwrap().unwrap().fencing_token,
        a.fencing_token,
        "re-acquiring keeps the token"
    );
    // Redis lost the lease and the counter (data loss): the next tenure still gets a larger token.
    let mut r = env.redis_client();
    let _: i64 = block(|| r.cmd(redis::cmd("DEL").arg(lease_key(name)).arg(fencing_token_key(name))));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let b = Lease::try_acquire(&conn, name, "b", 10_000).await.unwrap().unwrap();
    assert!(b.fencing_token > a.fencing_token, "{} > {}", b.fencing_token, a.fencing_token);
    assert!(!a.renew(&conn).await.unwrap(), "a's lease is gone");
    b.release(&conn).await;
    assert!(Lease::try_acquire(&conn, name, "c", 10_000).await.unwrap().is_ok(), "released: taken at once");
}
