//! Secure connections against real services (issue #13), with certificates the tests make
//! (`binval_testkit::test_certs`):
//!
//! - MariaDB with `--ssl-cert/--ssl-key`, `require_secure_transport=ON` and a `REQUIRE SSL`
//!   user: `check` and `run` over TLS, plaintext refused with a clear error, a wrong CA named,
//!   missing grants named, the snapshot statements of bootstrap/verify without privileges.
//! - Redis standalone and Cluster on TLS ports only (`--port 0`), with the README's ACL rules
//!   for binval and for app instances: `run`, `check` and the consumer work; a wrong CA is a
//!   definite error naming the setting.
//! - Kafka: tansu 0.6 takes `--cert/--key` but serves plaintext, so the broker sits behind a
//!   TLS front (client certificates required): binval publishes and an app instance evicts
//!   through TLS; a wrong CA and plaintext to the TLS port name `[kafka.tls]`. tansu's SASL
//!   (`--authentication`) cannot be passed (see the test), so SASL is tested by its refusal
//!   naming `[kafka.sasl]`, and by the property mapping's unit tests.
//! - Secrets: the test passwords never appear in logs (debug, JSON), errors, `check` output or
//!   metrics.

mod pipeline_env;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use binval_consumer::{Consumer, ConsumerError, Secret, TlsMode, TlsSettings};
use pipeline_env::*;

/// Every password of these tests contains this; no output may.
const PW: &str = "Pw-7d1f-never-printed";

const MAPPING: &str = items_mapping!(2);
const TABLE: &str = "CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(100) NOT NULL)";

fn binval() -> Command {
    Command::new(env!("CARGO_BIN_EXE_binval"))
}

fn write_file(name: &str, text: &str) -> PathBuf {
    let dir = tk::state_root().join("security");
    std::fs::create_dir_all(&dir).unwrap();
    let (stem, ext) = name.split_once('.').map(|(s, e)| (s, format!(".{e}"))).unwrap_or((name, String::new()));
    let p = dir.join(format!("{}{ext}", tk::unique_name(stem)));
    std::fs::write(&p, text).unwrap();
    p
}

/// `binval <args> --config <cfg>` to its end: (exit code, stdout + stderr).
fn run_to_end(args: &[&str], cfg: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = binval();
    cmd.args(args).arg("--config").arg(cfg).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains(PW), "a password in the output of binval {args:?}:\n{text}");
    (out.status.code().unwrap_or(-1), text)
}

fn pem(p: &Path) -> String {
    p.display().to_string()
}

/// Replace the `[source]` url of an [`Env`] config with the TLS MariaDB's and add `tls`.
fn on_tls_mariadb(text: &str, user: &str, pw_file: &Path, tls: &str) -> String {
    let db = tk::mariadb_tls();
    let url = format!("mysql://{user}@127.0.0.1:{}", db.port);
    text.replace(&tk::mariadb().repl_url(), &url)
        .replace("server_id =", &format!("password_file = \"{}\"\nserver_id =", pem(pw_file)))
        .replace("reconnect_max_ms = 2000\n", &format!("reconnect_max_ms = 2000\n[source.tls]\n{tls}\n"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls_with_require_ssl_user() {
    let certs = tk::test_certs();
    let db = tk::mariadb_tls();
    let env = Env::new("tls_mysql", RedisKind::Standalone);
    let name = tk::unique_name("tlsdb");
    let user = tk::unique_name("u");
    tk::sql_via_socket(
        db,
        &format!(
            "CREATE DATABASE {name}; USE {name}; {TABLE}; \
             CREATE USER '{user}'@'%' IDENTIFIED BY '{PW}' REQUIRE SSL; \
             GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'; GRANT SELECT ON {name}.items TO '{user}'@'%';"
        ),
    )
    .unwrap();
    let pw_file = write_file("mysql-pw", &format!("{PW}\n"));
    let base = env.config_toml("current", &MAPPING.replace("{db}", &name));
    let verified = on_tls_mariadb(&base, &user, &pw_file, &format!("mode = \"verify-identity\"\nca_file = \"{}\"", pem(&certs.ca)));

    // check over TLS: version and cipher, verified, grants complete.
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &verified), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("source tls: TLSv1.") && out.contains("certificate verified against the CA and the server name"), "{out}");
    assert!(out.contains("source grants:") && out.contains("has what run and replay need"), "{out}");

    // Mutual TLS: a REQUIRE X509 user gets in with the client certificate only.
    let x509 = tk::unique_name("x");
    tk::sql_via_socket(
        db,
        &format!(
            "CREATE USER '{x509}'@'%' IDENTIFIED BY '{PW}' REQUIRE X509; \
             GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{x509}'@'%'; GRANT SELECT ON {name}.items TO '{x509}'@'%';"
        ),
    )
    .unwrap();
    let ca_only = format!("mode = \"verify-identity\"\nca_file = \"{}\"", pem(&certs.ca));
    let mtls = format!("{ca_only}\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"", pem(&certs.client_cert), pem(&certs.client_key));
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &on_tls_mariadb(&base, &x509, &pw_file, &mtls)), &[]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &on_tls_mariadb(&base, &x509, &pw_file, &ca_only)), &[]);
    assert_ne!(code, 0, "a REQUIRE X509 user without a client certificate is refused: {out}");

    // Plaintext is refused, with a clear error saying what to set.
    let plain = on_tls_mariadb(&base, &user, &pw_file, "mode = \"disabled\"");
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &plain), &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("[source.tls]") && (out.contains("require_secure_transport") || out.contains("REQUIRE SSL")), "{out}");

    // A CA that did not sign the server's certificate: a definite error naming the setting.
    let wrong = on_tls_mariadb(&base, &user, &pw_file, &format!("ca_file = \"{}\"", pem(&certs.other_ca)));
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &wrong), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("source.tls.ca_file"), "{out}");

    // mysql_async's own TLS parameters in the URL are refused by every command, naming the
    // parameter and the [source.tls] mode that does what it asks (never plaintext unseen).
    let in_url = on_tls_mariadb(&base, &user, &pw_file, "").replace(&format!("{}\"", db.port), &format!("{}?require_ssl=true\"", db.port));
    assert!(in_url.contains("?require_ssl=true\""), "{in_url}");
    for cmd in ["check", "run"] {
        let (code, out) = run_to_end(&[cmd], &write_file("c.toml", &in_url), &[]);
        assert_eq!(code, 2, "{cmd}: {out}");
        assert!(out.contains("source.url") && out.contains("require_ssl=true") && out.contains("[source.tls]"), "{cmd}: {out}");
        assert!(out.contains("mode = \"verify-identity\""), "{cmd}: {out}");
    }

    // run over TLS: a row reaches Redis.
    let running = start(binval::config::Config::from_toml(&verified).unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tk::sql_via_socket(db, &format!("INSERT INTO {name}.items VALUES (1, 'over tls')")).unwrap();
    let key = format!("{}:item:1", env.prefix);
    let mut r = env.redis_client();
    let until = Instant::now() + Duration::from_secs(20);
    while r.version(&key) == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(r.replica(&key, 0).is_some_and(|v| v.contains("over tls")), "the row reached Redis over a TLS source connection");
    running.stop().await;

    // Missing grants are named with the statement that grants them.
    let weak = tk::unique_name("w");
    tk::sql_via_socket(db, &format!("CREATE USER '{weak}'@'%' IDENTIFIED BY '{PW}'; GRANT SELECT ON {name}.items TO '{weak}'@'%';"))
        .unwrap();
    let (code, out) = run_to_end(&["check"], &write_file("c.toml", &verified.replace(&format!("//{user}@"), &format!("//{weak}@"))), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("missing REPLICATION SLAVE") && out.contains(&format!("GRANT REPLICATION SLAVE ON *.* TO '{weak}'@'%'")), "{out}");
    assert!(out.contains("missing BINLOG MONITOR"), "{out}");

    // What bootstrap and verify run needs no more than SELECT (MariaDB): a consistent snapshot
    // and the binlog position it was taken at.
    let opts = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(db.port)
        .user(Some(weak.clone()))
        .pass(Some(PW))
        .ssl_opts(mysql_async::SslOpts::default().with_root_certs(vec![certs.ca.clone().into()]));
    let mut c = mysql_async::Conn::new(opts).await.unwrap();
    use mysql_async::prelude::Queryable;
    c.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT").await.unwrap();
    let snap: Vec<(String, String)> = c.query("SHOW STATUS LIKE 'binlog_snapshot_%'").await.unwrap();
    assert!(snap.iter().any(|(k, v)| k == "Binlog_snapshot_file" && v.starts_with("mysql-bin.")), "{snap:?}");
    let rows: Vec<(i32, String)> = c.query(format!("SELECT id, title FROM {name}.items")).await.unwrap();
    assert_eq!(rows, vec![(1, "over tls".to_string())]);
    c.query_drop("COMMIT").await.unwrap();
    c.disconnect().await.unwrap();
}

/// The README's ACL rule for binval, for keys `{prefix}:*`.
fn binval_acl(user: &str, prefix: &str) -> Vec<String> {
    let rule = format!(
        "{user} on >{PW} resetkeys ~{prefix}:* ~binval:* resetchannels -@all +ping +info +cluster|slots +script|load +evalsha +eval +get +set +hget +hmget +hset +hdel +del +pexpire +persist +pttl +time +scan"
    );
    rule.split(' ').map(String::from).collect()
}

/// The README's ACL rule for app instances.
fn app_acl(user: &str, prefix: &str) -> Vec<String> {
    format!("{user} on >{PW} resetkeys %R~{prefix}:* resetchannels -@all +ping +get +hmget +cluster|slots")
        .split(' ')
        .map(String::from)
        .collect()
}

/// Read `key` through `consumer` every 50 ms until `ok` holds for what it reads; panics with
/// `what` after 20 s.
async fn read_until(consumer: &Consumer, key: &str, ok: impl Fn(Option<&str>) -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while !ok(consumer.get(key).await.unwrap().as_deref()) {
        assert!(Instant::now() < until, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_acl_users_standalone_and_cluster() {
    let certs = tk::test_certs();
    for (kind, redis) in [("standalone", tk::redis_tls()), ("cluster", tk::redis_tls_cluster())] {
        let env = Env::new(&format!("tls_redis_{kind}"), RedisKind::Standalone);
        env.exec(TABLE).await;
        let (bv, app) = (tk::unique_name("binval"), tk::unique_name("app"));
        redis.acl_setuser(&binval_acl(&bv, &env.prefix).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        redis.acl_setuser(&app_acl(&app, &env.prefix).iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        let urls = redis.urls();
        let list = urls.iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(", ");
        let section =
            |ca: &Path| format!("mode = \"{kind}\"\nurls = [{list}]\nusername = \"{bv}\"\n[redis.tls]\nca_file = \"{}\"", pem(ca));
        let text = env.config_toml("current", MAPPING).replace(&env.redis_section(), &section(&certs.ca));
        let cfg_path = write_file("r.toml", &text);
        // The password from the environment.
        let (code, out) = run_to_end(&["check"], &cfg_path, &[("BINVAL__REDIS__PASSWORD", PW)]);
        assert_eq!(code, 0, "{kind}: {out}");
        assert!(out.contains(&format!("redis: PONG (ACL user {bv})")), "{kind}: {out}");
        assert!(out.contains("redis tls: 127.0.0.1:") && out.contains("TLSv1.3") && out.contains("certificate verified"), "{kind}: {out}");

        let wrong = write_file("r.toml", &env.config_toml("current", MAPPING).replace(&env.redis_section(), &section(&certs.other_ca)));
        let (code, out) = run_to_end(&["check"], &wrong, &[("BINVAL__REDIS__PASSWORD", PW)]);
        assert_eq!(code, 2, "{kind}: a wrong CA is a definite error: {out}");
        assert!(out.contains("redis.tls.ca_file"), "{kind}: {out}");

        // run writes through the ACL user; an app instance reads through its read-only user.
        let with_pw = text.replace(&format!("username = \"{bv}\""), &format!("username = \"{bv}\"\npassword = \"{PW}\""));
        let running = start(binval::config::Config::from_toml(&with_pw).unwrap());
        let tls = |ca: &Path| TlsSettings { mode: Some(TlsMode::VerifyIdentity), ca_file: Some(ca.to_path_buf()), ..Default::default() };
        let builder = |ca: &Path| {
            let b = Consumer::builder().brokers(tk::broker().bootstrap()).topic(&env.topic).replicas(2);
            let b = if kind == "cluster" { b.redis_cluster(urls.clone()) } else { b.redis_standalone(&urls[0]) };
            b.redis_tls(tls(ca)).redis_user(Some(&app), Secret::new(PW))
        };
        let consumer = builder(&certs.ca).build().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        env.exec("INSERT INTO items VALUES (1, 'first')").await;
        let key = format!("{}:item:1", env.prefix);
        let has = |text: &'static str| move |v: Option<&str>| v.is_some_and(|v| v.contains(text));
        read_until(&consumer, &key, has("first"), &format!("{kind}: the consumer reads binval's write over TLS")).await;
        env.exec("UPDATE items SET title = 'second' WHERE id = 1").await;
        read_until(&consumer, &key, has("second"), &format!("{kind}: the update evicts and the new value is read")).await;
        // A delete (tombstone: HSET + HDEL of the payload + PEXPIRE inside the script) and a
        // row inserted again over the tombstone (HDEL of `t`, PERSIST): every command the
        // replica script may call passes the README's rule.
        env.exec("DELETE FROM items WHERE id = 1").await;
        read_until(&consumer, &key, |v| v.is_none(), &format!("{kind}: the delete evicts and the tombstone reads as no row")).await;
        env.exec("INSERT INTO items VALUES (1, 'third')").await;
        read_until(&consumer, &key, has("third"), &format!("{kind}: the row inserted again replaces the tombstone")).await;
        consumer.shutdown().await;
        running.stop().await;

        let Err(e) = builder(&certs.other_ca).build().await else { panic!("{kind}: a wrong CA fails the build") };
        assert!(matches!(&e, ConsumerError::Config { field: "redis_tls", .. }), "{kind}: {e}");
        assert!(e.to_string().contains("redis_tls.ca_file") && !e.to_string().contains(PW), "{kind}: {e}");
    }
}

fn kafka_config(env: &Env, broker: &tk::SecureBroker, tls: &str, sasl: &str) -> String {
    env.config_toml("current", MAPPING)
        .replace(&format!("brokers = \"{}\"", tk::broker().bootstrap()), &format!("brokers = \"{}\"", broker.bootstrap()))
        .replace("create_topic = false", "create_topic = true\npartitions = 1")
        .replace("[kafka.properties]", &format!("{tls}\n{sasl}\n[kafka.properties]"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_over_tls_and_sasl() {
    let certs = tk::test_certs();
    let broker = tk::SecureBroker::start(tk::BrokerSecurity { tls: true, client_auth: true, sasl: false }).unwrap();
    let env = Env::new("tls_kafka", RedisKind::Standalone);
    env.exec(TABLE).await;
    broker.create_topic(&env.topic, 1).unwrap();
    let tls = |ca: &Path| {
        format!(
            "[kafka.tls]\nca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
            pem(ca),
            pem(&certs.client_cert),
            pem(&certs.client_key)
        )
    };
    let text = kafka_config(&env, &broker, &tls(&certs.ca), "");
    let (code, out) = run_to_end(&["check"], &write_file("k.toml", &text), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("kafka security: no SASL; TLSv1.3") && out.contains("certificate verified against the CA and the server name"),
        "{out}"
    );

    // binval publishes and an app instance evicts, both through TLS with client certificates.
    let running = start(binval::config::Config::from_toml(&text).unwrap());
    let consumer = Consumer::builder()
        .redis_standalone(tk::redis().url())
        .brokers(broker.bootstrap())
        .topic(&env.topic)
        .replicas(2)
        .kafka_tls(TlsSettings {
            ca_file: Some(certs.ca.clone()),
            client_cert_file: Some(certs.client_cert.clone()),
            client_key_file: Some(certs.client_key.clone()),
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    let mut notices = consumer.subscribe_evictions();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v = env.exec_v("INSERT INTO items VALUES (1, 'a')").await;
    let key = format!("{}:item:1", env.prefix);
    let n = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let n = notices.recv().await.unwrap();
            if n.key == key {
                return n;
            }
        }
    })
    .await
    .expect("the event arrives through TLS");
    assert_eq!(n.version, v);
    consumer.shutdown().await;
    running.stop().await;

    // A wrong CA: a definite error naming the setting (not a broker "down" retried forever).
    let (code, out) = run_to_end(&["check"], &write_file("k.toml", &kafka_config(&env, &broker, &tls(&certs.other_ca), "")), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("kafka.tls.ca_file"), "{out}");
    // Plaintext to the TLS listener.
    let (code, out) = run_to_end(&["check"], &write_file("k.toml", &kafka_config(&env, &broker, "", "")), &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("kafka.tls"), "{out}");

    // SASL: tansu 0.6 (`--authentication`) offers SCRAM-SHA-256/512 and OAUTHBEARER, not
    // PLAIN, and cannot create a SCRAM user once authentication is on (its user tool must
    // authenticate first; storage is in memory): every exchange is refused, which is what is
    // tested here: the failure names [kafka.sasl].
    let sasl_broker = tk::SecureBroker::start(tk::BrokerSecurity { tls: true, client_auth: true, sasl: true }).unwrap();
    let pw_file = write_file("kafka-pw", PW);
    for m in ["SCRAM-SHA-512", "PLAIN"] {
        let sasl = format!("[kafka.sasl]\nmechanism = \"{m}\"\nusername = \"binval\"\npassword_file = \"{}\"", pem(&pw_file));
        let (code, out) = run_to_end(&["check"], &write_file("k.toml", &kafka_config(&env, &sasl_broker, &tls(&certs.ca), &sasl)), &[]);
        assert_eq!(code, 2, "{m}: {out}");
        assert!(out.contains("kafka.sasl") && out.contains(m), "{m}: {out}");
    }
}

/// Passwords in URLs and files, through everything an operator sees: `check` output and its
/// errors (text and JSON logs at debug level), `run`'s logs and `/metrics`, config errors, the
/// consumer's errors and `Debug`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_logs_errors_check_or_metrics() {
    let env = Env::new("secrets", RedisKind::Standalone);
    env.exec(TABLE).await;
    let user = tk::unique_name("s");
    tk::mariadb()
        .sql(&format!("CREATE USER '{user}'@'%' IDENTIFIED BY '{PW}'; GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'; GRANT SELECT ON {}.* TO '{user}'@'%';", env.db))
        .unwrap();
    let redis_user = tk::unique_name("r");
    let mut admin = redis::Client::open(tk::redis().url()).unwrap().get_connection().unwrap();
    let rule = binval_acl(&redis_user, &env.prefix);
    let _: () = redis::cmd("ACL").arg("SETUSER").arg(&rule).query(&mut admin).unwrap();
    let port = tk::redis().port;
    let text = env
        .config_toml("current", MAPPING)
        .replace(&tk::mariadb().repl_url(), &format!("mysql://{user}:{PW}@127.0.0.1:{}", tk::mariadb().port))
        .replace(&tk::redis().url(), &format!("redis://{redis_user}:{PW}@127.0.0.1:{port}"))
        .replace("[checkpoint]", "[metrics]\nlisten = \"127.0.0.1:0\"\n[checkpoint]");
    let logs = [("RUST_LOG", "debug"), ("BINVAL_LOG_FORMAT", "json")];
    let (code, out) = run_to_end(&["check"], &write_file("s.toml", &text), &logs);
    assert_eq!(code, 0, "{out}");

    // Wrong passwords and unreachable servers: the errors carry the URLs.
    for (from, to) in [
        (format!(":{PW}@127.0.0.1:{port}"), format!(":{PW}x@127.0.0.1:{port}")),
        (format!("{PW}@127.0.0.1:{}", tk::mariadb().port), format!("{PW}y@127.0.0.1:1")),
    ] {
        let (code, out) = run_to_end(&["check"], &write_file("s.toml", &text.replace(&from, &to)), &logs);
        assert_ne!(code, 0, "{out}");
    }
    // A config error that shows a URL.
    let (code, out) = run_to_end(&["check"], &write_file("s.toml", &text.replace("redis://", "http://")), &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("http://") && out.contains(":***@"), "the URL is named, its password hidden: {out}");

    // run: logs at debug level and /metrics.
    let metrics_port = binval_testkit::free_port().unwrap();
    let cfg = write_file("s.toml", &text.replace("127.0.0.1:0", &format!("127.0.0.1:{metrics_port}")));
    let child = binval()
        .args(["run", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let mut scrape = String::new();
    while Instant::now() < until && !scrape.contains("binval_source_connected 1") {
        tokio::time::sleep(Duration::from_millis(200)).await;
        scrape = reqwest_get(metrics_port).unwrap_or_default();
    }
    env.exec("INSERT INTO items VALUES (1, 'x')").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    scrape = reqwest_get(metrics_port).unwrap_or_default();
    Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
    let logs = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(scrape.contains("binval_transactions_total"), "metrics scraped: {scrape}");
    for (what, text) in [("run logs", &logs), ("metrics", &scrape)] {
        assert!(!text.contains(PW), "a password in {what}:\n{text}");
    }

    // The consumer: an unreachable Redis with a password in its URL, and the builder's Debug.
    let url = format!("redis://app:{PW}@127.0.0.1:1");
    let b = Consumer::builder()
        .redis_standalone(&url)
        .brokers(tk::broker().bootstrap())
        .topic(&env.topic)
        .redis_user(Some("app"), Secret::new(PW));
    assert!(!format!("{b:?}").contains(PW), "builder Debug: {b:?}");
    let e = Consumer::builder().redis_standalone(&url).brokers(tk::broker().bootstrap()).topic(&env.topic).build().await.err().unwrap();
    assert!(!e.to_string().contains(PW) && !format!("{e:?}").contains(PW), "{e} / {e:?}");
}

/// `GET /metrics` on a local port.
fn reqwest_get(port: u16) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}
