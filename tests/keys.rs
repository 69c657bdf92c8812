//! Keys that do not identify a row (issue #21 item 3) against real MariaDB, Redis and Kafka:
//! `binval check` and `binval run` judge a mapping's key templates the way the table scans
//! do (`binlog::server::judge_key_templates`), at start and after a DDL statement; a mapping
//! that accepts non-unique keys (invalidate mode) leaves stale markers, not tombstones. And an
//! instance that stops with a definite error releases its lease.

mod pipeline_env;

use binval::error::{DefiniteError, Error};
use binval::ha::lease::{lease_key, Lease};
use binval::redis::RedisConn;
use pipeline_env::*;

/// A mapping of table `t` with key template `keys` (TOML list) and extra lines.
fn mapping(table: &str, keys: &str, extra: &str) -> String {
    format!("[[mappings]]\ntable = \"{{db}}.{table}\"\nkeys = {keys}\n{extra}\n")
}

/// The config of `env` with a long lease: a standby would wait `lease_ms` for an unreleased one.
fn long_lease(env: &Env, start: &str, mappings: &str) -> String {
    env.config_toml(start, mappings).replace("reconnect_max_ms = 2000", "reconnect_max_ms = 2000\nlease_ms = 60000")
}

/// The lease of `env`'s source is free: another holder takes it at once.
async fn lease_is_free(env: &Env) -> bool {
    let cfg = env.config("current", "");
    let conn = RedisConn::connect(&cfg.redis).await.unwrap();
    let mut r = env.redis_client();
    let held: bool = block(|| r.cmd(redis::cmd("EXISTS").arg(lease_key(&env.source_name))));
    let taken = Lease::try_acquire(&conn, &env.source_name, "next-instance", 60_000).await.unwrap();
    if let Ok(l) = &taken {
        l.release(&conn).await;
    }
    !held && taken.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_run_refuse_keys_that_do_not_identify_a_row_and_release_the_lease() {
    let env = Env::new("keys_refused", RedisKind::Standalone);
    env.exec("CREATE TABLE nokey (x INT, y INT)").await;
    env.exec("CREATE TABLE pair (a INT NOT NULL, b INT NOT NULL, v INT, PRIMARY KEY (a, b))").await;
    let start = env.binlog_now().await;
    let nokey = format!("{}.nokey", env.db);

    // No PRIMARY KEY, no UNIQUE key: check names the mapping, the table, its keys, the
    // template's columns and the fix.
    let cfg = env.write_config(&long_lease(&env, &start, &mapping("nokey", "[\"{p}:n:{x}\"]", "")));
    let (code, out, err) = block(|| binval_cli(&["check", "--config", cfg.to_str().unwrap()], &[]));
    assert_eq!(code, 1, "{out}{err}");
    let text = format!("{out}{err}");
    for want in ["mappings[0].keys[0]", &nokey, "no PRIMARY KEY and no UNIQUE key", "(columns x)", "allow_non_unique_keys = true"] {
        assert!(text.contains(want), "check names {want}: {text}");
    }

    // run refuses to start on it (a definite error, exit 1) ...
    let (code, _, err) = block(|| binval_cli(&["run", "--config", cfg.to_str().unwrap()], &[]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("mappings[0].keys[0]") && err.contains(&nokey), "{err}");
    // ... and, stopping for good, released its lease: the next instance leads at once (not
    // after lease_ms = 60 s).
    assert!(lease_is_free(&env).await, "the lease was released on the definite error");

    // A template that leaves out a column of the primary key does not identify a row either;
    // one with every key column (and more) does.
    let pair = mapping("pair", "[\"{p}:pair:{a}:{b}:{v}\", \"{p}:pa:{a}\"]", "");
    let e = start_pipeline(&env, &start, &pair).expect_error(30).await;
    let m = e.to_string();
    assert!(matches!(e, Error::Definite(DefiniteError::KeysNotUnique(_))), "{m}");
    assert!(m.contains("mappings[0].keys[1]") && !m.contains("keys[0]") && m.contains("PRIMARY KEY (a, b)"), "{m}");
    assert!(lease_is_free(&env).await, "released after the in-process run's definite error too");
}

fn start_pipeline(env: &Env, from: &str, mappings: &str) -> Running {
    start(binval::config::Config::from_toml(&long_lease(env, from, mappings)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_when_a_ddl_leaves_the_key_without_a_unique_key() {
    let env = Env::new("keys_ddl", RedisKind::Standalone);
    env.exec("CREATE TABLE items (id INT NOT NULL, v INT, PRIMARY KEY (id))").await;
    let start = env.binlog_now().await;
    let run = start_pipeline(&env, &start, &mapping("items", "[\"{p}:item:{id}\"]", ""));
    let v = env.exec_v("INSERT INTO items VALUES (1, 10)").await;
    let key = format!("{}:item:1", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&key, v)), v);

    env.exec("ALTER TABLE items DROP PRIMARY KEY").await;
    env.exec("INSERT INTO items VALUES (2, 20)").await;
    let e = run.expect_error(30).await;
    let m = e.to_string();
    assert!(matches!(e, Error::Definite(DefiniteError::MappingBroken { .. })), "{m}");
    let items = format!("{}.items", env.db);
    assert!(m.contains(&items) && m.contains("mysql-bin.") && m.contains("mappings[0].keys[0]") && m.contains("no PRIMARY KEY"), "{m}");
    assert_eq!(r.version(&format!("{}:item:2", env.prefix)), 0, "nothing after the DDL was applied");
    assert!(lease_is_free(&env).await, "released after a definite error mid-stream");

    // A restart judges the same at start (the DDL is before the checkpoint's position or
    // after it: either way the mapping is refused).
    let e = start_pipeline(&env, &start, &mapping("items", "[\"{p}:item:{id}\"]", "")).expect_error(30).await;
    assert!(!e.is_transient() && e.to_string().contains(&items), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_non_unique_key_is_invalidated_not_tombstoned() {
    let env = Env::new("keys_nonunique", RedisKind::Standalone);
    env.exec("CREATE TABLE tags (id INT PRIMARY KEY, tag VARCHAR(10) NOT NULL)").await;
    let start = env.binlog_now().await;
    let lines = "replicas = 2\nmode = \"invalidate\"\nallow_non_unique_keys = true";
    let tags = mapping("tags", "[\"{p}:tag:{tag}\"]", lines);
    let run = start_pipeline(&env, &start, &tags);
    let key = format!("{}:tag:red", env.prefix);
    let mut r = env.redis_client();
    let v = env.exec_v("INSERT INTO tags VALUES (1, 'red'), (2, 'red')").await;
    assert_eq!(block(|| r.wait_version(&key, v)), v);

    // One of the two rows goes: another still renders the key, so it must not read "no row".
    let v = env.exec_v("DELETE FROM tags WHERE id = 1").await;
    assert_eq!(block(|| r.wait_version(&key, v)), v);
    for i in 0..2 {
        let (payload, position, tombstone) = r.record(&key, i);
        assert_eq!((payload, position, tombstone), (None, Some(v), false), "replica {i}: a stale marker at the delete's position");
    }
    // Moving the other row away leaves a marker too (the loader finds no row then).
    let v = env.exec_v("UPDATE tags SET tag = 'blue' WHERE id = 2").await;
    assert_eq!(block(|| r.wait_version(&key, v)), v);
    assert_eq!(r.record(&key, 0), (None, Some(v), false));
    run.stop().await;
}
