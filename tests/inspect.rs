//! `binval inspect` on a 3-master Redis Cluster: a key's N suffix replicas on the masters that
//! own their hash slots, positions, fencing tokens, sizes, the version token, agreement and
//! the row; the same for every key of a row (`--table --pk`); a damaged replica shows.

mod pipeline_env;

use pipeline_env::*;
use serde_json::{json, Value};

fn inspect(cfg: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let cfg = cfg.to_string_lossy();
    binval_cli(&[&["inspect", "--config", &cfg], args].concat(), &[])
}

const MAPPING: &str = "[[mappings]]\ntable = \"{db}.items\"\nkeys = [\"{p}:item:{id}\", \"{p}:sku:{sku}\"]\nreplicas = 4\n";

/// `host:port` of the master owning `slot`, per `CLUSTER SLOTS` of the test cluster.
fn master_of(slot: u16) -> String {
    let mut c = redis::Client::open(tk::redis_cluster().urls()[0].as_str()).unwrap().get_connection().unwrap();
    let ranges: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Vec<redis::Value>>(&mut c)
        .unwrap()
        .into_iter()
        .map(|r| {
            let redis::Value::Array(items) = r else { panic!("CLUSTER SLOTS entry") };
            let s: u16 = redis::from_redis_value(items[0].clone()).unwrap();
            let e: u16 = redis::from_redis_value(items[1].clone()).unwrap();
            let redis::Value::Array(m) = &items[2] else { panic!("master entry") };
            (s, e, (redis::from_redis_value(m[0].clone()).unwrap(), redis::from_redis_value(m[1].clone()).unwrap()))
        })
        .collect();
    let (_, _, (h, p)) = ranges.into_iter().find(|(s, e, _)| (*s..=*e).contains(&slot)).unwrap();
    format!("{h}:{p}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_replicas_on_their_masters_and_the_row() {
    let env = Env::new("inspect", RedisKind::Cluster);
    env.exec("CREATE TABLE items (id INT PRIMARY KEY, sku VARCHAR(20) UNIQUE, price DECIMAL(6,2))").await;
    let start = env.binlog_now().await;
    let cfg = env.write_config(&env.config_toml(&start, MAPPING));
    let run = pipeline_env::start(env.config(&start, MAPPING));
    let v = env.exec_v("INSERT INTO items VALUES (6666, 'lamp-1', 9.90)").await;
    let key = format!("{}:item:6666", env.prefix);
    let mut r = env.redis_client();
    assert_eq!(block(|| r.wait_version(&key, v)), v);

    let (code, out, err) = block(|| inspect(&cfg, &[&key, "--json"]));
    assert_eq!(code, 0, "{err}");
    let ins: Value = serde_json::from_str(&out).unwrap();
    let k = &ins["keys"][0];
    assert_eq!((k["key"].clone(), k["replica_count"].clone(), k["agree"].clone()), (json!(key), json!(4), json!(true)), "{k}");
    let replicas = k["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 4);
    let payload = r#"{"id":6666,"price":"9.90","sku":"lamp-1"}"#;
    let mut masters = std::collections::BTreeSet::new();
    for (i, rep) in replicas.iter().enumerate() {
        let name = format!("{key}:r{i}");
        let slot = binval_protocol::hash_slot(name.as_bytes());
        assert_eq!((rep["name"].clone(), rep["slot"].clone()), (json!(name), json!(slot)), "{rep}");
        assert_eq!(rep["node"]["master"], json!(master_of(slot)), "replica {i} on the master owning its slot");
        assert_eq!(
            (rep["position"].clone(), rep["payload_bytes"].clone(), rep["ttl_ms"].clone()),
            (json!(v), json!(payload.len()), Value::Null),
            "{rep}"
        );
        assert!(rep["fencing_token"].as_u64().unwrap() > 0, "{rep}");
        masters.insert(rep["node"]["master"].as_str().unwrap().to_string());
    }
    println!("{key}: 4 replicas on {} masters", masters.len());
    assert_eq!(k["version"]["position"], json!(v));
    assert_eq!(k["version"]["node"]["master"], json!(master_of(binval_protocol::hash_slot(format!("{key}:ver").as_bytes()))));
    assert_eq!(ins["row"], json!({"id": 6666, "sku": "lamp-1", "price": "9.90"}));
    assert_eq!(k["expected_payload"], json!(payload));

    // The human table, and every key of a row by its primary key.
    let (code, out, err) = block(|| inspect(&cfg, &[&key]));
    assert_eq!(code, 0, "{err}");
    println!("{out}");
    assert!(out.contains(&format!("{key}:r3")) && out.contains("agreement      yes"), "{out}");
    let table = format!("{}.items", env.db);
    let (code, out, err) = block(|| inspect(&cfg, &["--table", &table, "--pk", "6666", "--json"]));
    assert_eq!(code, 0, "{err}");
    let ins: Value = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = ins["keys"].as_array().unwrap().iter().map(|k| k["key"].as_str().unwrap()).collect();
    assert_eq!(keys, vec![key.clone(), format!("{}:sku:lamp-1", env.prefix)]);

    // A damaged replica: the key no longer agrees, and inspect says where.
    let _: i64 = block(|| r.cmd(redis::cmd("HSET").arg(format!("{key}:r2")).arg("d").arg("{}")));
    let (code, out, _) = block(|| inspect(&cfg, &[&key]));
    assert_eq!(code, 0);
    assert!(out.contains("agreement      NO") && out.contains("r2: payload differs from the row"), "{out}");
    let (code, _, err) = block(|| inspect(&cfg, &["--table", &table, "--pk", "1", "--pk", "2"]));
    assert!(code == 2 && err.contains("--pk"), "{code} {err}");
    let (code, _, err) = block(|| inspect(&cfg, &["nope:1"]));
    assert!(code == 2 && err.contains("nope:1"), "{code} {err}");
    run.stop().await;
}
