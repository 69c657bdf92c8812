//! binval operated as an operator meets it: two `binval run` processes of one source (leader
//! and standby) with their metrics listeners, an app instance (binval-consumer with a
//! Prometheus recorder in this process), `/healthz` and `/readyz` of both roles,
//! `binval status` (table and `--json`), a takeover after the leader's SIGTERM, and the check
//! that every metric a dashboard panel or an alert rule of `deploy/` selects (name and label
//! matchers) finds series in the live scrapes: a panel never points at nothing.

mod pipeline_env;
mod promql_refs;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use binval::commands::status::http_get;
use pipeline_env::*;
use promql_refs::*;

fn binval() -> Command {
    Command::new(env!("CARGO_BIN_EXE_binval"))
}

fn free_port() -> u16 {
    binval_testkit::free_port().unwrap()
}

/// A `binval run` child with its metrics address; killed if the test fails.
struct Instance {
    child: Child,
    addr: SocketAddr,
    _guard: KillOnPanic,
    config: std::path::PathBuf,
}

impl Instance {
    fn start(env: &Env, name: &str, start: &str, port: u16) -> Instance {
        let text =
            env.config_toml(start, MAPPING).replace("[checkpoint]", &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n\n[checkpoint]"));
        let dir = tk::state_root().join("configs");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join(format!("{}.toml", tk::unique_name(name)));
        std::fs::write(&config, text).unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}-{port}.log"))).unwrap();
        let child = binval().arg("run").arg("--config").arg(&config).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let pid = child.id();
        Instance { child, addr: format!("127.0.0.1:{port}").parse().unwrap(), _guard: KillOnPanic(pid), config }
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.addr, path).ok()
    }

    fn readyz(&self) -> Option<(u16, serde_json::Value)> {
        let (code, body) = self.get("/readyz")?;
        Some((code, serde_json::from_str(&body).unwrap_or_else(|e| panic!("/readyz body {body:?}: {e}"))))
    }

    /// Poll `/readyz` until it answers `code` with `role` (or 30 s pass: then panic).
    fn wait_ready(&self, code: u16, role: &str) -> serde_json::Value {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((c, body)) = self.readyz() {
                if c == code && body["role"] == role {
                    return body;
                }
                assert!(Instant::now() < until, "{} /readyz: {c} {body} (want {code} {role})", self.addr);
            } else {
                assert!(Instant::now() < until, "{} /readyz does not answer", self.addr);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn scrape(&self) -> String {
        let (code, body) = self.get("/metrics").expect("/metrics answers");
        assert_eq!(code, 200);
        body
    }

    /// SIGTERM, then wait for exit 0.
    fn stop(mut self) {
        Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                assert!(s.success(), "binval exited with {s}");
                return;
            }
            assert!(Instant::now() < until, "binval did not stop within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Adaptive (`min = 4`): the leader's adaptive-count task runs, so its metrics are in the
/// scrape the alert rules are checked against; every key stays at 4 copies (no heat).
const MAPPING: &str = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\"]\nreplicas = { min = 4, max = 8 }\n";

fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    samples.iter().find(|s| s.name == name && label.is_none_or(|(k, v)| s.labels.get(k).map(String::as_str) == Some(v))).map(|s| s.value)
}

/// Poll the scrape of `i` until `ok` holds (30 s, then panic with the scrape).
fn wait_scrape(i: &Instance, what: &str, ok: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = i.scrape();
        let samples = parse_scrape(&text);
        if ok(&samples) {
            return samples;
        }
        assert!(Instant::now() < until, "{what} not seen in the scrape of {}:\n{text}", i.addr);
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn status(config: &std::path::Path, json: bool) -> String {
    let mut c = binval();
    c.arg("status").arg("--config").arg(config);
    if json {
        c.arg("--json");
    }
    let out = c.stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "binval status: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// /proc/<pid>: (peak RSS in KiB, CPU seconds user+system).
fn resources(pid: u32) -> (u64, f64) {
    let hwm = binval_testkit::procfs::peak_rss_kib(pid).expect("VmHWM of the leader");
    (hwm, binval_testkit::procfs::cpu_secs(pid).expect("CPU time of the leader"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_select_live_series_and_probes_follow_the_lease() {
    // The app instance's recorder, installed before the consumer is built (crate docs).
    let mut b = metrics_exporter_prometheus::PrometheusBuilder::new();
    for (name, buckets) in binval_consumer::HISTOGRAM_BUCKETS {
        b = b.set_buckets_for_metric(metrics_exporter_prometheus::Matcher::Full(name.to_string()), buckets).unwrap();
    }
    let app_metrics = b.install_recorder().unwrap();

    let env = Env::new("operate", RedisKind::Cluster);
    env.exec(pipeline_env::items::ID_TITLE).await;
    env.exec("INSERT INTO items VALUES (1, 'lamp'), (2, 'desk')").await;
    let start = env.binlog_now().await;

    // Leader first, then the standby of the same source.
    let leader = Instance::start(&env, "leader", &start, free_port());
    let body = leader.wait_ready(200, "leader");
    assert!(body["reason"].as_str().unwrap().starts_with("leader streaming"), "{body}");
    let standby = Instance::start(&env, "standby", &start, free_port());
    let body = standby.wait_ready(200, "standby");
    assert_eq!(body["reason"], "standby, polling the lease");
    for i in [&leader, &standby] {
        assert_eq!(i.get("/healthz"), Some((200, "ok\n".to_string())));
        assert_eq!(i.get("/nothing").map(|r| r.0), Some(404));
    }

    // The app instance, on the same topic, Redis Cluster and replica count.
    let app = binval_consumer::Consumer::builder()
        .brokers(tk::broker().bootstrap())
        .topic(env.topic.clone())
        .replicas(4)
        .redis_cluster(tk::redis_cluster().urls())
        .kafka_property("fetch.wait.max.ms", "5")
        .hot_key_sample_every(1)
        .hot_key_threshold(1.0)
        .build()
        .await
        .unwrap();

    // Load: transactions through binval, then reads through the app, then a change it evicts.
    let (rss_before, cpu_before) = resources(leader.child.id());
    let t0 = Instant::now();
    let mut c = env.conn().await;
    use mysql_async::prelude::Queryable;
    const UPDATES: u64 = 2000;
    for n in 0..UPDATES {
        c.query_drop(format!("UPDATE items SET title = 'lamp {n}' WHERE id = 1")).await.unwrap();
    }
    let v = last_version(&mut c).await;
    let key = format!("{}:item:1", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(tokio::task::block_in_place(|| r.wait_version(&key, v)), v);
    let applied = t0.elapsed();
    let (rss_after, cpu_after) = resources(leader.child.id());
    println!(
        "binval run (debug build), {UPDATES} single-row transactions in {:.2} s (commit loop included; noisy: other builds share the 2 cores): \
         {:.2} CPU s ({:.0} % of one core), peak RSS {} KiB -> {} KiB",
        applied.as_secs_f64(),
        cpu_after - cpu_before,
        (cpu_after - cpu_before) / applied.as_secs_f64() * 100.0,
        rss_before,
        rss_after
    );
    for _ in 0..50 {
        let got: serde_json::Value = app.get_json(&key).await.unwrap().expect("row");
        assert_eq!(got["title"], format!("lamp {}", UPDATES - 1));
    }
    let mut notices = app.subscribe_evictions();
    let v2 = env.exec_v("UPDATE items SET title = 'lamp final' WHERE id = 1").await;
    tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let n = notices.recv().await.unwrap();
            if n.key == key && n.version >= v2 {
                return;
            }
        }
    })
    .await
    .expect("the app evicts the change");
    assert_eq!(app.hot_keys()[0].key, key, "the read key is the hottest");

    // The leader's gauges settle: caught up, positions, the primary polled.
    let samples = wait_scrape(&leader, "lag 0, the source position and a delivery histogram", |s| {
        value(s, "binval_lag_seconds", None) == Some(0.0)
            && value(s, "binval_binlog_file_index", Some(("position", "source"))).is_some()
            && value(s, "binval_binlog_bytes_behind", None) == Some(0.0)
            && value(s, "binval_checkpoint_age_seconds", None) == Some(0.0)
            && s.iter().any(|x| x.name == "binval_kafka_delivery_seconds_bucket")
    });
    assert_eq!(value(&samples, "binval_leader", None), Some(1.0));
    assert_eq!(value(&samples, "binval_source_connected", None), Some(1.0));
    assert!(value(&samples, "binval_fencing_token", None).unwrap() > 0.0);
    assert!(value(&samples, "binval_transactions_total", None).unwrap() >= UPDATES as f64);
    assert_eq!(value(&samples, "binval_queue_capacity", Some(("stage", "source"))), Some(binval::pipeline::TXN_CHANNEL as f64));
    let gtid = value(&samples, "binval_gtid_sequence", Some(("position", "acked"))).expect("acked GTID sequence (MariaDB)");
    assert_eq!(gtid, v2 as f64, "the last acknowledged transaction's GTID sequence");
    assert!(
        samples.iter().filter(|s| s.name != "binval_info").all(|s| s.labels.get("source") == Some(&env.source_name)),
        "every metric carries source"
    );
    let standby_samples = parse_scrape(&standby.scrape());
    assert_eq!(value(&standby_samples, "binval_leader", None), Some(0.0));
    assert_eq!(value(&standby_samples, "binval_ready", None), Some(1.0));

    // binval status, table and JSON.
    let table = status(&leader.config, false);
    println!("{table}");
    let lease_line = table.lines().find(|l| l.starts_with("leader ")).unwrap().to_string();
    assert!(lease_line.contains(&format!("fencing token {}", value(&samples, "binval_fencing_token", None).unwrap() as u64)), "{table}");
    assert!(table.contains("this host") && table.contains("leader (ready)"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&status(&leader.config, true)).unwrap();
    assert_eq!(json["source"], env.source_name.as_str());
    assert_eq!(json["local_instance"]["role"], "leader");
    assert_eq!(json["local_instance"]["lag_seconds"], 0.0);
    assert!(json["checkpoint"]["position"].as_str().unwrap().contains(':'));
    let primary = json["primary"]["position"].as_str().unwrap().to_string();
    assert_eq!(primary, env.binlog_now().await, "the primary's position as SHOW MASTER STATUS says");

    // A periodic `binval verify` (issue #11) with its metrics listener: the dashboard's
    // consistency panels select its series.
    let verify_port = free_port();
    let mut verify = binval()
        .args(["verify", "--config"])
        .arg(&leader.config)
        .args(["--every", "1h", "--recheck-ms", "100", "--metrics-listen", &format!("127.0.0.1:{verify_port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _verify_guard = KillOnPanic(verify.id());
    let mut first_run = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(verify.stdout.take().unwrap()), &mut first_run).unwrap();
    let run: serde_json::Value = serde_json::from_str(&first_run).unwrap();
    assert_eq!(run["rows_checked"], 2, "{run}");
    let (code, verify_text) = http_get(format!("127.0.0.1:{verify_port}").parse().unwrap(), "/metrics").unwrap();
    assert_eq!(code, 200);
    Command::new("kill").arg("-TERM").arg(verify.id().to_string()).status().unwrap();
    assert!(verify.wait().unwrap().success(), "verify --every exits 0 on SIGTERM");

    // Every selector of every panel and alert finds a series.
    let binval_text = leader.scrape() + &standby.scrape() + &verify_text;
    let app_text = app_metrics.render();
    let (binval_samples, app_samples) = (parse_scrape(&binval_text), parse_scrape(&app_text));
    assert!(app_samples.iter().any(|s| s.name == "binval_consumer_redis_reads_total" && s.labels["master"].starts_with("127.0.0.1:")));
    let mut missing = Vec::new();
    let mut checked = 0;
    for q in dashboard_queries().into_iter().chain(alert_queries()) {
        for s in selectors(&q.expr).unwrap() {
            let pool = if s.name.starts_with("binval_consumer_") { &app_samples } else { &binval_samples };
            checked += 1;
            if !pool.iter().any(|x| selects(&s, x)) {
                missing.push(format!("{}: {} {:?}", q.origin, s.name, s.matchers));
            }
        }
    }
    println!("{checked} selectors of the dashboards and alert rules matched against the live scrapes");
    assert!(missing.is_empty(), "selectors with no live series:\n{}\n--- binval:\n{binval_text}\n--- app:\n{app_text}", missing.join("\n"));

    // Takeover: the leader drains and releases the lease, the standby leads and is ready.
    let token_before = value(&samples, "binval_fencing_token", None).unwrap();
    leader.stop();
    standby.wait_ready(200, "leader");
    let s = wait_scrape(&standby, "the standby's tenure", |s| value(s, "binval_leader", None) == Some(1.0));
    assert_eq!(value(&s, "binval_lease_acquired_total", None), Some(1.0));
    assert!(value(&s, "binval_fencing_token", None).unwrap() > token_before, "the new tenure's token is larger");
    let table = status(&standby.config, false);
    assert!(table.contains("leader (ready)"), "{table}");
    app.shutdown().await;
    standby.stop();
}
