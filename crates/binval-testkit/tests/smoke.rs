//! Starts every service the testkit offers and checks it works.

use std::net::TcpStream;
use std::process::Command;
use std::time::Instant;

use binval_testkit::{broker, mariadb, redis, redis_cluster, unique_name, OwnedBroker};

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let v = f();
    eprintln!("{what}: {:?}", t.elapsed());
    v
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli").args(["-h", "127.0.0.1", "-p", &port.to_string()]).args(args).output().expect("redis-cli runs");
    assert!(out.status.success(), "redis-cli failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn mariadb_has_row_binlog_and_repl_user() {
    let db = timed("mariadb() first call", mariadb);
    assert_eq!(db.sql("SELECT @@binlog_format, @@binlog_row_metadata").unwrap(), "ROW\tFULL\n");
    assert_eq!(db.sql("SELECT @@log_bin, @@binlog_row_image, @@server_id, @@gtid_strict_mode").unwrap(), "1\tFULL\t1\t0\n");
    assert_eq!(db.root_url(), format!("mysql://root@127.0.0.1:{}", db.port));
    assert_eq!(db.repl_url(), format!("mysql://binval:binval@127.0.0.1:{}", db.port));
    assert!(db.datadir.join("mysql").is_dir());

    let out = Command::new("mariadb")
        .args(["--no-defaults", "-ubinval", "-pbinval", "-h127.0.0.1", &format!("-P{}", db.port)])
        .args(["--batch", "-e", "SHOW MASTER STATUS; SHOW BINARY LOGS; SELECT @@binlog_format"])
        .output()
        .unwrap();
    assert!(out.status.success(), "binval user: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mysql-bin.000001"), "{text}");

    // Errors carry the CLI's stderr.
    let err = db.sql("SELECT * FROM no_such_db.t").unwrap_err().to_string();
    assert!(err.contains("no_such_db"), "{err}");

    // Writes land in the binlog.
    let name = db.create_database("smoke").unwrap();
    db.sql(&format!("CREATE TABLE `{name}`.t (id INT PRIMARY KEY, v VARCHAR(10)); INSERT INTO `{name}`.t VALUES (1, 'x');")).unwrap();
    assert_eq!(db.sql(&format!("SELECT v FROM `{name}`.t")).unwrap(), "x\n");
}

#[test]
fn mariadb_is_shared() {
    assert_eq!(mariadb().port, mariadb().port);
    assert!(std::ptr::eq(mariadb(), mariadb()));
}

#[test]
fn redis_answers_ping() {
    let r = timed("redis() first call", redis);
    assert_eq!(redis_cli(r.port, &["PING"]).trim(), "PONG");
    assert_eq!(r.url(), format!("redis://127.0.0.1:{}", r.port));
}

#[test]
fn redis_cluster_is_ok() {
    let c = timed("redis_cluster() first call", redis_cluster);
    assert_eq!(c.ports.len(), 3);
    for &p in &c.ports {
        let info = redis_cli(p, &["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }
    assert_eq!(c.urls().len(), 3);
    // -c follows MOVED redirects: keys land on whatever node owns the slot.
    let out =
        Command::new("redis-cli").args(["-c", "-h", "127.0.0.1", "-p", &c.ports[0].to_string(), "SET", "{smoke}k", "v"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
}

#[test]
fn broker_port_is_open() {
    let b = timed("broker() first call", broker);
    TcpStream::connect(b.bootstrap()).expect("broker accepts TCP");
    b.create_topic(&unique_name("smoke_topic"), 1).unwrap();
}

#[test]
fn owned_broker_stops_and_restarts() {
    let mut b = timed("OwnedBroker::start_new", OwnedBroker::start_new).unwrap();
    let addr = b.bootstrap();
    assert_ne!(addr, broker().bootstrap());
    TcpStream::connect(&addr).expect("owned broker accepts TCP");
    b.stop();
    assert!(TcpStream::connect(&addr).is_err(), "stopped broker still accepts");
    timed("OwnedBroker::start (restart)", || b.start()).unwrap();
    TcpStream::connect(&addr).expect("restarted broker accepts TCP");
    assert_eq!(b.bootstrap(), addr);
}

#[test]
fn unique_names_are_unique_and_safe() {
    let a = unique_name("My-Topic.x");
    let b = unique_name("My-Topic.x");
    assert_ne!(a, b);
    for n in [&a, &b] {
        assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{n}");
        assert!(n.starts_with("my_topic_x_"), "{n}");
        assert!(n.contains(&std::process::id().to_string()), "{n}");
    }
}
