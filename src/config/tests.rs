use super::*;
use std::path::Path;

#[test]
fn enum_errors_list_the_allowed_values() {
    let e = Config::from_toml(&OK.replace("mode = \"standalone\"", "mode = \"sentinel\"")).unwrap_err().to_string();
    assert!(e.contains("\"standalone\" or \"cluster\""), "{e}");
}

#[test]
fn shipped_configs_load_and_validate() {
    for f in ["config/binval.example.toml", "config/demo.toml", "config/docker.toml", "config/tls.example.toml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
        let c = Config::load(&p).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(c.source.lease_ms, 1500, "{f}");
    }
    let c = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/binval.example.toml")).unwrap();
    assert_eq!((c.source.fence, c.source.fence_epoch, c.redis.tombstone_ttl_ms), (FenceMode::Auto, 0, 86_400_000));
}

const OK: &str = r#"
[source]
url = "mysql://binval:binval@127.0.0.1:3306"
server_id = 77
[redis]
mode = "standalone"
urls = ["redis://127.0.0.1:6379"]
[kafka]
brokers = "127.0.0.1:9092"
[[mappings]]
table = "shop.items"
keys = ["item:detail:{id}"]
replicas = 8
"#;

#[test]
fn loads_with_defaults() {
    let c = Config::from_toml(OK).unwrap();
    assert_eq!(c.source.heartbeat_ms, 1000);
    assert_eq!(c.kafka.topic, "binval.invalidations");
    assert_eq!(c.kafka.progress_interval_ms, 200);
    assert_eq!(c.kafka.event_format, EventFormat::PerKey);
    assert_eq!(c.mappings[0].mode, MappingMode::WriteThrough);
    assert_eq!(c.mappings[0].payload, Payload::Whole("row".into()));
}

#[test]
fn non_unique_keys_need_invalidate_mode() {
    let e = Config::from_toml(&format!("{OK}allow_non_unique_keys = true\n")).unwrap_err().to_string();
    assert!(e.contains("mappings[0].allow_non_unique_keys") && e.contains("invalidate"), "{e}");
    let c = Config::from_toml(&format!("{OK}allow_non_unique_keys = true\nmode = \"invalidate\"\n")).unwrap();
    assert!(c.mappings[0].allow_non_unique_keys);
    assert!(!Config::from_toml(OK).unwrap().mappings[0].allow_non_unique_keys);
}

#[test]
fn tls_parameters_of_the_source_url_are_refused() {
    for (param, mode) in [
        ("require_ssl=true", "verify-identity"),
        ("require_ssl=true&verify_ca=false", "required"),
        ("require_ssl=true&verify_identity=false", "verify-ca"),
        ("built_in_roots=false", "disabled"),
    ] {
        let url = format!("mysql://binval:binval@127.0.0.1:3306?{param}");
        let e = Config::from_toml(&OK.replace("mysql://binval:binval@127.0.0.1:3306", &url)).unwrap_err().to_string();
        let first = param.split('&').next().unwrap();
        assert!(e.contains("source.url") && e.contains(first) && e.contains("[source.tls]"), "{e}");
        assert!(e.contains(&format!("mode = \"{mode}\"")), "{param}: {e}");
    }
    let ok = OK.replace("127.0.0.1:3306", "127.0.0.1:3306?prefer_socket=true");
    assert!(Config::from_toml(&ok).is_ok(), "other parameters stay");
}

#[test]
fn replicas_are_a_count_or_a_range() {
    let c = Config::from_toml(OK).unwrap();
    assert_eq!(c.mappings[0].replicas, Replicas::fixed(8));
    assert!(!c.mappings[0].replicas.is_adaptive());
    let c = Config::from_toml(&OK.replace("replicas = 8", "replicas = { min = 2, max = 16 }")).unwrap();
    assert_eq!(c.mappings[0].replicas, Replicas { min: 2, max: 16 });
    assert_eq!(c.mappings[0].replicas.to_string(), "2..=16");
    let c = Config::from_toml(&OK.replace("replicas = 8", "replicas = { max = 4 }")).unwrap();
    assert_eq!(c.mappings[0].replicas, Replicas { min: 1, max: 4 }, "min defaults to 1");
    assert_eq!(c.adaptive.read_budget_per_master, 50_000.0);
    for (bad, want) in [
        ("replicas = { min = 4, max = 2 }", "min = 4 is above max = 2"),
        ("replicas = { min = 1, max = 65 }", "out of range 1..=64"),
        ("replicas = \"many\"", "an integer (`replicas = 8`) or a range"),
    ] {
        let e = Config::from_toml(&OK.replace("replicas = 8", bad)).unwrap_err().to_string();
        assert!(e.contains("replicas") && e.contains(want), "{bad}: {e}");
    }
    for (bad, field) in [
        ("[adaptive]\nread_budget_per_master = 0", "adaptive.read_budget_per_master"),
        ("[adaptive]\npoll_interval_ms = 0", "adaptive.poll_interval_ms"),
        ("[adaptive]\nshrink_headroom = 0.5", "adaptive.shrink_headroom"),
        ("[[adaptive.pin]]\nreplicas = 4", "adaptive.pin[0]"),
        ("[[adaptive.pin]]\nkey = \"k\"\nreplicas = 0", "adaptive.pin[0].replicas"),
    ] {
        let e = Config::from_toml(&format!("{OK}\n{bad}\n")).unwrap_err().to_string();
        assert!(e.contains(field), "{bad}: {e}");
    }
}

#[test]
fn errors_name_the_field() {
    let e = Config::from_toml(&OK.replace("replicas = 8", "replicas = 0")).unwrap_err().to_string();
    assert!(e.contains("mappings[0].replicas"), "{e}");
    let e = Config::from_toml(&OK.replace("item:detail:{id}", "{{shop}}:item:{id}")).unwrap_err().to_string();
    assert!(e.contains("mappings[0].keys[0]") && e.contains("hash tag"), "{e}");
    let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = 77\nstart = \"bogus\"")).unwrap_err().to_string();
    assert!(e.contains("source.start"), "{e}");
    let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = \"x\"")).unwrap_err().to_string();
    assert!(e.contains("server_id"), "{e}");
    let e = Config::from_toml(&OK.replace("mode = \"standalone\"", "mode = \"sentinel\"")).unwrap_err().to_string();
    assert!(e.contains("mode") || e.contains("sentinel"), "{e}");
}

#[test]
fn load_settings_are_checked_and_name_the_field() {
    let c = Config::from_toml(OK).unwrap();
    assert_eq!((c.source.heartbeat_table.as_deref(), c.source.heartbeat_interval_ms, c.source.transaction_memory_mb), (None, 500, 32));
    assert_eq!(c.apply.max_group_rows, 4096);
    assert_eq!(c.apply.linger_ms, 5);
    let with = |extra: &str| Config::from_toml(&OK.replace("server_id = 77", &format!("server_id = 77\n{extra}")));
    let c = with("heartbeat_table = \"binval.heartbeat\"\nheartbeat_interval_ms = 100").unwrap();
    assert_eq!(c.source.heartbeat_table.as_deref(), Some("binval.heartbeat"));
    for (extra, field) in [
        ("heartbeat_table = \"heartbeat\"", "source.heartbeat_table"),
        ("heartbeat_table = \"a.b; DROP TABLE x\"", "source.heartbeat_table"),
        ("heartbeat_table = \"shop.items\"", "source.heartbeat_table"),
        ("heartbeat_interval_ms = 0", "source.heartbeat_interval_ms"),
        ("transaction_memory_mb = 0", "source.transaction_memory_mb"),
        ("spill_dir = \"/nonexistent/binval\"", "source.spill_dir"),
        ("reconnect_max_ms = 0", "source.reconnect_max_ms"),
        ("reconnect_max_ms = 3600001", "source.reconnect_max_ms"),
        ("lease_ms = 100", "source.lease_ms"),
        ("heartbeat_ms = 0", "source.heartbeat_ms"),
        ("heartbeat_ms = 4294968", "source.heartbeat_ms"),
        ("heartbeat_interval_ms = 60001", "source.heartbeat_interval_ms"),
        ("transaction_memory_mb = 65537", "source.transaction_memory_mb"),
        // Beyond the field's type: named by the deserializer.
        ("fence_epoch = 256", "fence_epoch"),
        ("fence_epoch = -1", "fence_epoch"),
    ] {
        let e = with(extra).unwrap_err().to_string();
        assert!(e.contains(field), "{extra}: {e}");
    }
    let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = 4294967296")).unwrap_err().to_string();
    assert!(e.contains("server_id"), "{e}");
    let section = |name: &str, extra: &str| {
        let text = OK.replace(&format!("[{name}]\n"), &format!("[{name}]\n{extra}\n"));
        Config::from_toml(&text).unwrap_err().to_string()
    };
    for (name, extra, field) in [
        ("redis", "timeout_ms = 0", "redis.timeout_ms"),
        ("redis", "timeout_ms = 600001", "redis.timeout_ms"),
        ("redis", "tombstone_ttl_ms = 0", "redis.tombstone_ttl_ms"),
        ("redis", "tombstone_ttl_ms = 9223372036854775807", "redis.tombstone_ttl_ms"),
        // Beyond TOML's integers (i64): the parser's error, with the key named by binval.
        ("redis", "tombstone_ttl_ms = 18446744073709551615", "redis.tombstone_ttl_ms"),
        ("kafka", "partitions = 0", "kafka.partitions"),
        ("kafka", "replication_factor = 0", "kafka.replication_factor"),
        ("kafka", "replication_factor = 40000", "kafka.replication_factor"),
        ("kafka", "progress_interval_ms = 60001", "kafka.progress_interval_ms"),
        ("kafka", "event_format = \"json\"", "kafka.event_format"),
        ("kafka", "event_format = \"json\"", "\"per_key\" or \"batched\""),
        ("kafka", "partitions = 2147483648", "partitions"),
        ("[mappings]", "ttl_secs = 9223372036854775807", "mappings[0].ttl_secs"),
        ("[mappings]", "ttl_secs = 18446744073709551616", "mappings[0].ttl_secs"),
    ] {
        let e = section(name, extra);
        assert!(e.contains(field), "{extra}: {e}");
    }
    let batched = OK.replace("[kafka]\n", "[kafka]\nevent_format = \"batched\"\n");
    assert_eq!(Config::from_toml(&batched).unwrap().kafka.event_format, EventFormat::Batched);
    let e = Config::from_toml(&format!("{batched}\n[kafka.properties]\npartitioner = \"random\"\n")).unwrap_err().to_string();
    assert!(e.contains("kafka.event_format") && e.contains("kafka.properties.partitioner"), "{e}");
    let e = Config::from_toml(&format!("{OK}\n[checkpoint]\ninterval_ms = 0\n")).unwrap_err().to_string();
    assert!(e.contains("checkpoint.interval_ms"), "{e}");
    let e = Config::from_toml(&format!("{OK}\n[metrics]\nready_max_lag_ms = 0\n")).unwrap_err().to_string();
    assert!(e.contains("metrics.ready_max_lag_ms"), "{e}");
    let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group_rows = 1000001\n")).unwrap_err().to_string();
    assert!(e.contains("apply.max_group_rows"), "{e}");
    let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group_rows = 0\n")).unwrap_err().to_string();
    assert!(e.contains("apply.max_group_rows"), "{e}");
    let e = Config::from_toml(&format!("{OK}\n[apply]\nlinger_ms = 101\n")).unwrap_err().to_string();
    assert!(e.contains("apply.linger_ms") && e.contains("0..=100"), "{e}");
    assert_eq!(Config::from_toml(&format!("{OK}\n[apply]\nlinger_ms = 0\n")).unwrap().apply.linger_ms, 0);
    let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group = 10\n")).unwrap_err().to_string();
    assert!(e.contains("max_group"), "an unknown field is named: {e}");
}

#[test]
fn environment_overrides_keep_strings_and_split_lists() {
    let dir = std::env::temp_dir().join(format!("binval-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("c.toml");
    std::fs::write(&p, OK).unwrap();
    // SAFETY: this is the only test of this binary that touches BINVAL__ variables.
    unsafe {
        std::env::set_var("BINVAL__SOURCE__NAME", "007");
        std::env::set_var("BINVAL__SOURCE__SERVER_ID", "4001");
        std::env::set_var("BINVAL__REDIS__MODE", "cluster");
        std::env::set_var("BINVAL__REDIS__URLS", "redis://a:1,redis://b:2");
        std::env::set_var("BINVAL__REDIS__PASSWORD", "123");
    }
    let c = Config::load(&p);
    unsafe {
        for k in
            ["BINVAL__SOURCE__NAME", "BINVAL__SOURCE__SERVER_ID", "BINVAL__REDIS__MODE", "BINVAL__REDIS__URLS", "BINVAL__REDIS__PASSWORD"]
        {
            std::env::remove_var(k);
        }
    }
    let c = c.unwrap();
    assert_eq!(c.source.name, "007");
    assert_eq!(c.source.server_id, 4001);
    assert_eq!(c.redis.urls, vec!["redis://a:1".to_string(), "redis://b:2".into()]);
    assert_eq!(c.redis.password.as_ref().map(binval_security::Secret::expose), Some("123"), "a password from the environment stays text");
    assert_eq!(format!("{:?}", c.redis.password), "Some(***)");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn redacts() {
    assert_eq!(redact("mysql://u:secret@h:1"), "mysql://u:***@h:1");
}
