//! Primary failover (issue #21, item 1): a MariaDB primary A and its GTID replica B
//! (`gtid_strict_mode`, `log_slave_updates`), whose binlog files were flushed at other moments,
//! so a binlog position of A names another transaction on B, or nothing. binval must resume on
//! B by the checkpoint's GTID (never by A's `file:pos`), say so, and refuse where it cannot.
//!
//! Every test starts its own pair of servers and asserts the values Redis holds against the
//! rows B holds (the database after the failover), and `binval verify` against it.

mod pipeline_env;

use std::time::{Duration, Instant};

use pipeline_env::{binval_cli, block, start, tk, RedisClient};

/// A primary (server_id 21) and a replica (22) replicating by GTID, with a table `items` in
/// database `shop`; the replica's binlog is one file ahead of the primary's.
struct Pair {
    a: tk::MariaDb,
    b: tk::MariaDb,
    name: String,
    topic: String,
}

impl Pair {
    fn new(name: &str) -> Pair {
        let args = |id: &str| vec![format!("--server-id={id}"), "--gtid-strict-mode=ON".into(), "--log-slave-updates=ON".into()];
        let a_args = args("21");
        let b_args = args("22");
        let a = tk::MariaDb::start_with(&a_args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        let b = tk::MariaDb::start_with(&b_args.iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        // B flushes its binlog now, A later (FLUSH BINARY LOGS is never replicated): the same
        // file names hold other transactions on the two servers.
        b.sql("FLUSH BINARY LOGS").unwrap();
        b.replicate_from(&a).unwrap();
        a.sql("CREATE DATABASE shop; CREATE TABLE shop.items (id INT PRIMARY KEY, price INT NOT NULL, name VARCHAR(40))").unwrap();
        a.sql("FLUSH BINARY LOGS").unwrap();
        b.wait_caught_up(&a).unwrap();
        let name = tk::unique_name(name);
        let topic = format!("binval_{name}");
        tk::broker().create_topic(&topic, 3).unwrap();
        Pair { a, b, name, topic }
    }

    /// A config reading `url`, fence `fence`, one write-through mapping of `shop.items`.
    fn config(&self, url: &str, fence: &str) -> String {
        format!(
            r#"
[source]
name = "{name}"
url = "{url}"
server_id = 4100
heartbeat_ms = 500
start = "current"
reconnect_max_ms = 500
fence = "{fence}"

[redis]
mode = "standalone"
urls = ["{redis}"]

[kafka]
brokers = "{brokers}"
topic = "{topic}"
create_topic = false
[kafka.properties]
"linger.ms" = "0"

[checkpoint]
interval_ms = 100

[[mappings]]
table = "shop.items"
keys = ["{name}:item:{{id}}"]
replicas = 2
"#,
            name = self.name,
            redis = tk::redis().url(),
            brokers = tk::broker().bootstrap(),
            topic = self.topic,
        )
    }

    fn key(&self, id: u32) -> String {
        format!("{}:item:{id}", self.name)
    }

    /// Wait until a `current` start is pinned into the checkpoint (writes after it are read).
    async fn wait_pinned(&self, r: &mut RedisClient) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.get(&format!("binval:{{{}}}:checkpoint", self.name)).is_none() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn checkpoint(&self, r: &mut RedisClient) -> serde_json::Value {
        let text = r.get(&format!("binval:{{{}}}:checkpoint", self.name)).expect("a checkpoint");
        serde_json::from_str(&text).unwrap()
    }
}

fn cfg(text: &str) -> binval::config::Config {
    binval::config::Config::from_toml(text).unwrap()
}

/// The rows of `shop.items` on `db`: (id, price).
fn rows(db: &tk::MariaDb) -> Vec<(u32, i64)> {
    db.sql("SELECT id, price FROM shop.items ORDER BY id")
        .unwrap()
        .lines()
        .map(|l| {
            let mut f = l.split('\t');
            (f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap())
        })
        .collect()
}

/// Wait (up to 30 s) until both replicas of every row of `db` hold its price; returns the
/// rows whose replicas still differ (id, database price, replica payloads).
fn wait_replicas_match(pair: &Pair, r: &mut RedisClient, db: &tk::MariaDb) -> Vec<(u32, i64, Vec<Option<String>>)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let wrong: Vec<_> = rows(db)
            .into_iter()
            .filter_map(|(id, price)| {
                let reps = r.replicas(&pair.key(id), 2);
                let ok = reps.iter().all(|p| {
                    p.as_deref().and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok()).is_some_and(|v| v["price"] == price)
                });
                (!ok).then_some((id, price, reps))
            })
            .collect();
        if wrong.is_empty() || Instant::now() > deadline {
            return wrong;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The issue's reproduction: binval stopped with a checkpoint on A; more writes on A (which B
/// replicates); A stopped, B promoted, `source.url` pointed at B. A's checkpoint position
/// exists on B but names another place there: binval resumes by the checkpoint's GTID, applies
/// every transaction A wrote after it, and `binval verify` finds nothing wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_resumes_by_gtid_and_loses_nothing() {
    let pair = Pair::new("failover");
    let mut r = RedisClient::Standalone(redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap());
    let on_a = pair.config(&pair.a.repl_url(), "gtid");
    let run = start(cfg(&on_a));
    // The start is pinned: wait for its checkpoint before writing.
    pair.wait_pinned(&mut r).await;
    let values: Vec<String> = (1..=10).map(|i| format!("({i}, {}, 'item {i}')", i * 10)).collect();
    pair.a.sql(&format!("INSERT INTO shop.items VALUES {}", values.join(", "))).unwrap();
    pair.a.sql("UPDATE shop.items SET price = price + 1 WHERE id <= 3").unwrap();
    assert!(block(|| wait_replicas_match(&pair, &mut r, &pair.a)).is_empty(), "binval applied A's rows");
    run.stop().await;
    let cp = pair.checkpoint(&mut r);
    assert_eq!(cp["server"]["server_id"], 21, "the checkpoint names the server its position belongs to: {cp}");
    let cp_gtid = cp["gtid"].as_str().unwrap().to_string();
    let cp_pos = (cp["file"].as_str().unwrap().to_string(), cp["pos"].as_u64().unwrap());

    // Changes binval has not read: they exist on B only through replication.
    for i in 1..=5 {
        pair.a.sql(&format!("UPDATE shop.items SET price = {} WHERE id = {i}", 1000 + i)).unwrap();
    }
    pair.a.sql("DELETE FROM shop.items WHERE id = 10").unwrap();
    pair.b.wait_caught_up(&pair.a).unwrap();
    pair.a.stop();
    pair.b.promote().unwrap();
    pair.b.sql("UPDATE shop.items SET price = 2006 WHERE id = 6; INSERT INTO shop.items VALUES (11, 110, 'on b')").unwrap();

    // A's position names another place on B (the point of the test).
    let b_there = pair.b.sql(&format!("SELECT BINLOG_GTID_POS('{}', {})", cp_pos.0, cp_pos.1)).unwrap();
    assert_ne!(b_there.trim(), cp_gtid, "B's binlog at A's checkpoint position {cp_pos:?} is another GTID position");

    let on_b = pair.config(&pair.b.repl_url(), "gtid");
    let path = std::env::temp_dir().join(format!("{}.toml", pair.name));
    std::fs::write(&path, &on_b).unwrap();
    let (code, out, err) = block(|| binval_cli(&["check", "--config", path.to_str().unwrap()], &[]));
    assert!(out.contains("run resumes at gtid") && out.contains(&cp_gtid), "check names the GTID resume (exit {code}):\n{out}\n{err}");

    let run = start(cfg(&on_b));
    let wrong = block(|| wait_replicas_match(&pair, &mut r, &pair.b));
    assert!(wrong.is_empty(), "after the failover every row of B is in Redis; still wrong: {wrong:?}");
    // The deleted row is a tombstone, not its old payload.
    assert_eq!(r.replicas(&pair.key(10), 2), vec![None, None], "row 10 was deleted on A before the failover");
    run.stop().await;
    let cp = pair.checkpoint(&mut r);
    assert_eq!(cp["server"]["server_id"], 22, "the checkpoint now belongs to B: {cp}");

    let (code, out, err) = block(|| binval_cli(&["verify", "--config", path.to_str().unwrap(), "--recheck-ms", "200"], &[]));
    assert_eq!(code, 0, "binval verify after the failover:\n{out}\n{err}");
    pair.b.stop();
}

/// binval runs while the primary fails, under a steady writer: `source.url` and the writer's
/// URL point at one name (here a TCP forwarder) that moves to the promoted replica. The reader
/// notices the other server on reconnect, the tenure restarts and resumes by GTID: nothing A
/// wrote before it died is lost, and what the writer commits on B after the move arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_under_a_running_binval_behind_one_address() {
    use mysql_async::prelude::Queryable;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let pair = Pair::new("failover_live");
    let fwd = tk::forward::Forwarder::start(pair.a.port).unwrap();
    let mut r = RedisClient::Standalone(redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap());
    let url = format!("mysql://binval:binval@127.0.0.1:{}", fwd.port);
    let run = start(cfg(&pair.config(&url, "gtid")));
    pair.wait_pinned(&mut r).await;
    let values: Vec<String> = (1..=8).map(|i| format!("({i}, {}, 'item {i}')", i * 10)).collect();
    pair.a.sql(&format!("INSERT INTO shop.items VALUES {}", values.join(", "))).unwrap();
    // The writer: single-row UPDATEs through the moving address, as fast as one connection
    // goes; paused while the replica catches up and is promoted (the failover's write pause).
    let (pause, stop, commits) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (pause, stop, commits) = (pause.clone(), stop.clone(), commits.clone());
        let url = format!("mysql://root@127.0.0.1:{}/shop", fwd.port);
        tokio::spawn(async move {
            let mut conn: Option<mysql_async::Conn> = None;
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                if pause.load(Relaxed) {
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let c = match &mut conn {
                    Some(c) => c,
                    None => match mysql_async::Conn::from_url(url.as_str()).await {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                n += 1;
                match c.query_drop(format!("UPDATE items SET price = price + 1 WHERE id = {}", 1 + n % 8)).await {
                    Ok(()) => {
                        commits.fetch_add(1, Relaxed);
                    }
                    Err(_) => conn = None,
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    pause.store(true, Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = commits.load(Relaxed);
    pair.b.wait_caught_up(&pair.a).unwrap();
    pair.a.stop();
    pair.b.promote().unwrap();
    fwd.point_to(pair.b.port);
    pause.store(false, Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Relaxed);
    writer.await.unwrap();
    let total = commits.load(Relaxed);
    println!("writer: {before} commits on A, {} on B after the move", total - before);
    assert!(before > 50 && total > before, "the writer ran on both servers: {before} then {total}");
    let wrong = block(|| wait_replicas_match(&pair, &mut r, &pair.b));
    assert!(wrong.is_empty(), "after the failover behind one address every row of B is in Redis; still wrong: {wrong:?}");
    assert!(run.stats.restarts.load(Relaxed) >= 1, "the tenure restarted on the new server");
    run.stop().await;
    assert_eq!(pair.checkpoint(&mut r)["server"]["server_id"], 22);
    pair.b.stop();
}

/// Where neither the position nor a GTID can be used, binval refuses and names both servers:
/// a checkpoint of another server without GTIDs, and `fence = "file_pos"` after a change of
/// server (whose versions B's positions do not continue) until `fence_epoch` is raised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_refusals_name_the_checkpoint_and_the_server() {
    let pair = Pair::new("failover_refuse");
    let mut r = RedisClient::Standalone(redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap());
    let key = format!("binval:{{{}}}:checkpoint", pair.name);
    let a_now = pair.a.sql("SHOW MASTER STATUS").unwrap();
    let mut f = a_now.split('\t');
    let (file, pos) = (f.next().unwrap().to_string(), f.next().unwrap().trim().parse::<u64>().unwrap());

    // 1. A checkpoint of A with no GTID state, resumed on B.
    let cp = serde_json::json!({"file": file, "pos": pos, "saved_at_ms": 1, "server": {"server_id": 21}});
    r.cmd::<()>(redis::cmd("SET").arg(&key).arg(cp.to_string()));
    let e = start(cfg(&pair.config(&pair.b.repl_url(), "gtid"))).expect_error(60).await.to_string();
    assert!(e.contains("server_id 21") && e.contains("server_id 22") && e.contains(&file) && e.contains("no GTID"), "{e}");

    // 2. fence = file_pos: a change of server needs a higher fence epoch.
    let gtid = pair.a.sql("SELECT @@gtid_binlog_pos").unwrap().trim().to_string();
    let cp = serde_json::json!({"file": file, "pos": pos, "gtid": gtid, "saved_at_ms": 1, "server": {"server_id": 21}, "fence_epoch": 0});
    r.cmd::<()>(redis::cmd("SET").arg(&key).arg(cp.to_string()));
    let e = start(cfg(&pair.config(&pair.b.repl_url(), "file_pos"))).expect_error(60).await.to_string();
    assert!(e.contains("fence_epoch = 1") && e.contains("server_id 22"), "{e}");

    // 3. The same checkpoint on A itself resumes at its position, whatever the fence.
    let text = pair.config(&pair.a.repl_url(), "file_pos");
    let run = start(cfg(&text));
    pair.a.sql("INSERT INTO shop.items VALUES (1, 10, 'a')").unwrap();
    assert!(block(|| wait_replicas_match(&pair, &mut r, &pair.a)).is_empty());
    run.stop().await;
    pair.a.stop();
    pair.b.stop();
}

/// MySQL GTID sets (no MySQL server runs here: the real MySQL test binlogs stand in). For every
/// transaction boundary of every binlog with GTIDs, the checkpoint's GTID state
/// (`GtidState`: the file's PREVIOUS_GTIDS set plus each GTID read) is saved as text, read
/// back, encoded into the `COM_BINLOG_DUMP_GTID` packet binval sends, and decoded again as the
/// server would; the server's rule (send every transaction whose GTID is not in the set) must
/// then pick exactly the transactions after the boundary.
#[test]
fn mysql_gtid_sets_resume_exactly_after_each_transaction_of_the_test_binlogs() {
    use binval::ha::checkpoint::GtidState;
    use mysql_common::io::ParseBuf;
    use mysql_common::packets::ComBinlogDumpGtid;
    use mysql_common::proto::{MyDeserialize, MySerialize};

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs");
    let files = [
        "mysql-test/binlog_transaction_with_GTID.000001",
        "mysql-test/binlog_transaction_previous_GTID_no_tag.000001",
        "mysql-test/binlog_56_gtid_reserved_word.000001",
        "more/binlog_transaction_with_GTID_TAG.000001",
    ];
    let mut checked = 0;
    for name in files {
        let path = root.join(name);
        // (previous set of the file, GTIDs in order, and per boundary the GTIDs before it)
        let mut lines = Vec::new();
        binval::binlog::offline::read_file(&path, None, None, |l| lines.push(l)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut state = GtidState::default();
        let mut all: Vec<String> = Vec::new();
        let mut boundaries: Vec<(Option<String>, usize)> = Vec::new();
        for l in &lines {
            if let Some(p) = l["previous_gtids"].as_str() {
                state.record_previous(&p.parse().unwrap_or_else(|e| panic!("{name}: {e}")));
            }
            if let Some(g) = l["gtid"].as_str().filter(|_| l["event"].as_str().is_some_and(|e| e.contains("GTID"))) {
                // The checkpoint moves past a transaction at its commit; here at its GTID
                // event, the state before it is the boundary after the previous one.
                boundaries.push((state.render(), all.len()));
                state.record(g);
                all.push(g.to_string());
            }
        }
        boundaries.push((state.render(), all.len()));
        for (saved, done) in boundaries {
            // Before the first GTID of a server the set is empty: nothing to save yet.
            let Some(saved) = saved else {
                assert_eq!(done, 0, "{name}: a whole GTID set once PREVIOUS_GTIDS is read");
                continue;
            };
            let set = GtidState::from_saved(&saved, true).mysql().cloned().unwrap();
            let sids = binval::binlog::gtid::dump_sids(&set).unwrap();
            let mut bytes = Vec::new();
            ComBinlogDumpGtid::new(4100u32).with_sids(sids).serialize(&mut bytes);
            let sent = ComBinlogDumpGtid::deserialize((), &mut ParseBuf(&bytes)).unwrap();
            let received: binval_protocol::MysqlGtidSet =
                sent.sids().iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",").parse().unwrap();
            let resent: Vec<&String> = all.iter().filter(|g| !received.contains_gtid(g)).collect();
            assert_eq!(resent, all[done..].iter().collect::<Vec<_>>(), "{name}: resume at {saved}");
            checked += 1;
        }
    }
    assert!(checked >= 8, "{checked} boundaries checked");
}

/// A checkpoint whose binlog file and GTIDs were purged (issue #21 item 4): `binval check`
/// must say what `run` then meets — a refusal naming the purge — not "run resumes there".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_checkpoint_is_refused_by_check_and_run_alike() {
    let pair = Pair::new("purged");
    pair.b.stop();
    let mut r = RedisClient::Standalone(redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap());
    let text = pair.config(&pair.a.repl_url(), "gtid");
    let run = start(cfg(&text));
    pair.wait_pinned(&mut r).await;
    pair.a.sql("INSERT INTO shop.items VALUES (1, 10, 'a')").unwrap();
    assert!(block(|| wait_replicas_match(&pair, &mut r, &pair.a)).is_empty());
    run.stop().await;
    let cp = pair.checkpoint(&mut r);
    pair.a.sql("FLUSH BINARY LOGS; INSERT INTO shop.items VALUES (2, 20, 'b'); FLUSH BINARY LOGS").unwrap();
    let now = pair.a.sql("SHOW MASTER STATUS").unwrap();
    let current = now.split('\t').next().unwrap().to_string();
    // MariaDB purges a file only once its binlog checkpoint has moved past it (InnoDB has
    // flushed its transactions): ask again until every file before `current` is gone — the
    // checkpoint's and the next one, which holds the transaction after it (with only the
    // checkpoint's file gone, binval rightly resumes by GTID from the next file).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        pair.a.sql(&format!("PURGE BINARY LOGS TO '{current}'")).unwrap();
        let logs = pair.a.sql("SHOW BINARY LOGS").unwrap();
        if logs.lines().filter_map(|l| l.split('\t').next()).filter(|f| f.starts_with("mysql-bin.")).all(|f| f == current) {
            break;
        }
        assert!(Instant::now() < deadline, "MariaDB did not purge {}: {logs}", cp["file"]);
        std::thread::sleep(Duration::from_millis(200));
    }

    let path = std::env::temp_dir().join(format!("{}.toml", pair.name));
    std::fs::write(&path, &text).unwrap();
    let (code, out, err) = block(|| binval_cli(&["check", "--config", path.to_str().unwrap()], &[]));
    let events = pair.a.sql(&format!("SHOW BINLOG EVENTS IN '{current}' LIMIT 8")).unwrap();
    assert_ne!(code, 0, "check refuses a purged checkpoint:\n{out}\n{err}\n{events}");
    assert!(
        err.contains("purged") && err.contains(cp["file"].as_str().unwrap()),
        "check names the purge and the checkpoint:\n{out}\n{err}"
    );
    let e = start(cfg(&text)).expect_error(60).await.to_string();
    assert!(e.contains("purged") && e.contains(cp["file"].as_str().unwrap()), "{e}");
    pair.a.stop();
}
