//! The `binval` binary as an operator meets it: config errors, wrong server settings, a start
//! position the server no longer has, and a clean SIGTERM shutdown.

mod pipeline_env;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pipeline_env::*;

fn binval() -> Command {
    Command::new(env!("CARGO_BIN_EXE_binval"))
}

fn write_config(name: &str, text: &str) -> std::path::PathBuf {
    let dir = tk::state_root().join("configs");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.toml", tk::unique_name(name)));
    std::fs::write(&p, text).unwrap();
    p
}

fn run_to_end(args: &[&str], cfg: &std::path::Path) -> (i32, String) {
    let out = binval().args(args).arg("--config").arg(cfg).stdin(Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

const MAPPING: &str = items_mapping!(2);

#[test]
fn bad_config_names_the_field() {
    let env = Env::new("badcfg", RedisKind::Standalone);
    let good = env.config_toml("current", MAPPING);
    let cases = [
        (good.replace("replicas = 2", "replicas = 0"), "mappings[0].replicas"),
        (good.replace("{id}\"]", "{id}\"]\nmode = \"sometimes\""), "mode"),
        (good.replace(":item:{id}", ":{{tag}}:item:{id}"), "mappings[0].keys[0]"),
        (good.replace("server_id = ", "server_idd = 5\nserver_id = "), "server_idd"),
        (good.replace("heartbeat_ms = 500", "heartbeat_ms = \"soon\""), "heartbeat_ms"),
        (good.replace("interval_ms = 200", "store = \"file\""), "checkpoint.path"),
    ];
    for (text, field) in cases {
        let p = write_config("bad", &text);
        let (code, out) = run_to_end(&["run"], &p);
        assert_eq!(code, 2, "config error exits 2: {out}");
        assert!(out.contains(field), "error names `{field}`: {out}");
        assert!(out.contains(&p.display().to_string()) || out.contains("config"), "error names the file: {out}");
    }
    let (code, out) = run_to_end(&["run"], std::path::Path::new("/nonexistent/binval.toml"));
    assert_eq!(code, 2);
    assert!(out.contains("/nonexistent/binval.toml") && out.contains("not found"), "{out}");
}

#[test]
fn refuses_wrong_binlog_settings_naming_the_setting() {
    for (arg, setting, want) in [
        ("--binlog-row-metadata=MINIMAL", "binlog_row_metadata", "FULL"),
        ("--binlog-format=STATEMENT", "binlog_format", "ROW"),
        ("--binlog-row-image=MINIMAL", "binlog_row_image", "FULL"),
    ] {
        let db = tk::MariaDb::start_with(&[arg]).expect("start a MariaDB with a wrong setting");
        let env = Env::new("settings", RedisKind::Standalone);
        let text = env.config_toml("current", MAPPING).replace(&tk::mariadb().repl_url(), &db.repl_url());
        let p = write_config("settings", &text);
        for cmd in ["check", "run"] {
            let (code, out) = run_to_end(&[cmd], &p);
            assert_eq!(code, 1, "{cmd} with {arg}: {out}");
            assert!(out.contains(setting) && out.contains(want), "{cmd} names {setting} and {want}: {out}");
        }
    }
}

#[test]
fn check_names_mapping_problems_against_the_schema() {
    let env = Env::new("chk", RedisKind::Standalone);
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.items (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    let ok = write_config("chk", &env.config_toml("current", MAPPING));
    let (code, out) = run_to_end(&["check"], &ok);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("mappings: 1 table(s)"), "{out}");
    assert!(out.contains("placement: standalone Redis"), "{out}");
    let bad = MAPPING.replace("{p}:item:{id}", "{p}:item:{idd}")
        + "payload = [\"v\", \"w\"]\n[[mappings]]\ntable = \"{db}.nope\"\nkeys = [\"x:{id}\"]\n";
    let p = write_config("chk", &env.config_toml("current", &bad));
    let (code, out) = run_to_end(&["check"], &p);
    assert_eq!(code, 2, "a mapping that does not fit the schema is a config error: {out}");
    assert!(out.contains("mappings[0].keys[0]") && out.contains("`idd`"), "{out}");
    assert!(out.contains("mappings[0].payload") && out.contains("`w`"), "{out}");
    assert!(out.contains("mappings[1].table") && out.contains(".nope"), "{out}");
}

/// On a Cluster, `check` reports per key template how the replicas of sampled keys spread over
/// the masters — keys found in Redis by their version tokens, or rendered ones for a template
/// with none yet — and warns when a mapping has fewer replicas than masters.
#[test]
fn check_reports_replica_placement_per_mapping() {
    let env = Env::new("place", RedisKind::Cluster);
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.items (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.carts (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    let mappings = MAPPING.replace("replicas = 2", "replicas = 8")
        + "[[mappings]]\ntable = \"{db}.carts\"\nkeys = [\"{p}:cart:{id}\"]\nreplicas = 2\n";
    let mut r = env.redis_client();
    for id in 0..30 {
        let _: () = r.cmd(redis::cmd("SET").arg(format!("{}:item:{id}:ver", env.prefix)).arg(1));
    }
    // Version tokens without a checkpoint are traces of an earlier run: with start = "current"
    // check would refuse as run would (tests/recovery.rs); a position is an operator's start.
    let start = tokio::runtime::Runtime::new().unwrap().block_on(env.binlog_now());
    let p = write_config("place", &env.config_toml(&start, &mappings));
    let (code, out) = run_to_end(&["check"], &p);
    println!("{out}");
    assert_eq!(code, 0, "{out}");
    let line = |field: &str| {
        out.lines().find(|l| l.starts_with(&format!("placement: {field}"))).unwrap_or_else(|| panic!("no {field} line: {out}"))
    };
    let items = line("mappings[0].keys[0]");
    assert!(items.contains("8 replicas over 3 masters, 30 keys sampled from Redis"), "{items}");
    let carts = line("mappings[1].keys[0]");
    assert!(carts.contains("2 replicas over 3 masters, 200 keys rendered"), "{carts}");
    assert!(!carts.contains("3 masters for"), "2 replicas never cover 3 masters: {carts}");
    assert!(out.contains("warning: mappings[1].keys[0]") && out.contains("replicas = 2 is below the 3 masters"), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("warning: mappings[0].keys[0]") && l.contains("is below")), "{out}");
}

#[test]
fn purged_start_position_is_a_clear_error() {
    let env = Env::new("purged", RedisKind::Standalone);
    let p = write_config("purged", &env.config_toml("mysql-bin.999999:4", MAPPING));
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.items (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    let (code, out) = run_to_end(&["check"], &p);
    assert_eq!(code, 1, "check finds the missing start file too: {out}");
    assert!(out.contains("mysql-bin.999999:4"), "{out}");
    let (code, out) = run_to_end(&["run"], &p);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("mysql-bin.999999:4") && out.contains("does not have"), "{out}");
    assert!(out.contains("delete the checkpoint") && out.contains("source.start") && out.contains("bootstrap"), "says what to do: {out}");
    // The bad start was not pinned as a checkpoint: fixing source.start is enough.
    let fixed = write_config("purged", &env.config_toml("current", MAPPING));
    let mut child = binval().arg("run").arg("--config").arg(&fixed).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let _reap = KillOnPanic(child.id());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(child.try_wait().unwrap().is_none(), "runs with the corrected start");
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sigterm_drains_saves_checkpoint_and_exits_0() {
    let env = Env::new("sigterm", RedisKind::Standalone);
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.items (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let start = rt.block_on(env.binlog_now());
    let cp_path = tk::state_root().join(format!("{}.checkpoint.json", env.prefix));
    let metrics_port = binval_testkit::free_port().unwrap();
    let text = env.config_toml(&start, MAPPING).replace(
        "[checkpoint]\n",
        &format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\n[checkpoint]\nstore = \"file\"\npath = \"{}\"\n", cp_path.display()),
    );
    let p = write_config("sigterm", &text);
    let log = std::fs::File::create(tk::state_root().join(format!("{}.log", env.prefix))).unwrap();
    let mut child = binval().arg("run").arg("--config").arg(&p).stdout(Stdio::null()).stderr(log).spawn().unwrap();
    let _reap = KillOnPanic(child.id());
    tk::mariadb().sql(&format!("INSERT INTO `{}`.items VALUES (1, 1), (2, 2)", env.db)).unwrap();
    let mut r = env.redis_client();
    assert!(r.wait_version(&format!("{}:item:2", env.prefix), 1) >= 1);
    // Prometheus endpoint: both events acknowledged.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let body = http_get(metrics_port, "/metrics");
        // Every metric carries the source's name as a label.
        let source = format!("{{source=\"{}\"}}", env.source_name);
        if body.contains(&format!("binval_events_acked_total{source} 2")) {
            assert!(body.contains(&format!("binval_key_changes_total{source} 2")), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "metrics never showed 2 acked events: {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < deadline, "binval did not stop within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "clean shutdown exits 0");
    let cp: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cp_path).expect("checkpoint file written")).unwrap();
    let events = read_events(&env.topic, 2);
    assert_eq!(events.len(), 2);
    let last = events.iter().map(|e| (e.position.file.clone(), e.position.pos)).max().unwrap();
    let saved = (cp["file"].as_str().unwrap().to_string(), cp["pos"].as_u64().unwrap());
    assert!(saved >= last, "checkpoint {cp} covers the last event at {last:?}");
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn an_unusable_checkpoint_path_is_a_config_error_not_a_retry_loop() {
    let env = Env::new("cppath", RedisKind::Standalone);
    let text =
        env.config_toml("current", MAPPING).replace("[checkpoint]\n", "[checkpoint]\nstore = \"file\"\npath = \"/etc/hostname/cp.json\"\n");
    let p = write_config("cppath", &text);
    let (code, out) = run_to_end(&["run"], &p);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("checkpoint.path") && out.contains("/etc/hostname/cp.json"), "{out}");
}

/// A Kafka address nobody answers at: `check` fails naming `kafka.brokers` with librdkafka's
/// repeated connection errors logged once, and `run`'s `/readyz` says why it is not ready
/// (it used to blame the source connection).
#[test]
fn an_unreachable_kafka_is_named_by_check_and_by_readiness() {
    let env = Env::new("nokafka", RedisKind::Standalone);
    tk::mariadb().sql(&format!("CREATE TABLE `{}`.items (id INT PRIMARY KEY, v INT)", env.db)).unwrap();
    let closed = binval_testkit::free_port().unwrap();
    let good = env.config_toml("current", MAPPING);
    let text = good.replace(&tk::broker().bootstrap(), &format!("127.0.0.1:{closed}"));
    assert_ne!(text, good, "the broker address is in the config");
    let p = write_config("nokafka", &text);
    let (code, out) = run_to_end(&["check"], &p);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("kafka.brokers") && out.contains(&format!("127.0.0.1:{closed}")), "{out}");
    let librdkafka_lines = out.lines().filter(|l| l.contains("librdkafka")).count();
    assert!(librdkafka_lines <= 6, "{librdkafka_lines} librdkafka lines:\n{out}");

    let metrics_port = binval_testkit::free_port().unwrap();
    let p = write_config(
        "nokafka",
        &text.replace("[checkpoint]\n", &format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\n[checkpoint]\n")),
    );
    let mut child = binval().arg("run").arg("--config").arg(&p).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let _reap = KillOnPanic(child.id());
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let body = http_get(metrics_port, "/readyz");
        if body.contains("kafka.brokers") {
            assert!(body.starts_with("HTTP/1.0 503") || body.starts_with("HTTP/1.1 503"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "/readyz never named kafka.brokers: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    child.kill().unwrap();
    let _ = child.wait();
}
