//! `deploy/` checked without a cluster or a Prometheus server: the alert rules with promtool
//! (`check rules`, the rule unit tests `test rules`, `check config` of the compose
//! Prometheus), every dashboard and alert query parsed as PromQL, the Kubernetes manifests
//! against the Kubernetes API types (k8s-openapi; any field the types do not know is an
//! error, as with `kubeconform -strict`) and against each other (selectors, ports, probes,
//! the ConfigMap's config, the Secret's keys), and docker-compose's Prometheus and Grafana
//! wiring. That every queried metric is exported is tests/operate.rs (a live scrape).

mod promql_refs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use promql_refs::*;
use serde_json::Value;

fn promtool() -> PathBuf {
    let on_path =
        std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).map(|d| d.join("promtool"));
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin/promtool"));
    on_path
        .chain(home)
        .find(|p| p.is_file())
        .expect("promtool not found: run scripts/services.sh install (it takes promtool out of Debian's prometheus package)")
}

fn run_promtool(args: &[&str]) {
    let out = Command::new(promtool()).args(args).current_dir(root().join("deploy/prometheus")).output().expect("run promtool");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("promtool {}:\n{text}", args.join(" "));
    assert!(out.status.success(), "promtool {} failed:\n{text}", args.join(" "));
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests() {
    run_promtool(&["check", "rules", "alerts.yml"]);
    run_promtool(&["test", "rules", "alerts.test.yml"]);
    run_promtool(&["check", "config", "prometheus.yml"]);
}

#[test]
fn every_alert_has_severity_summary_and_a_unit_test() {
    let docs = yaml(&root().join("deploy/prometheus/alerts.yml"));
    let tests = std::fs::read_to_string(root().join("deploy/prometheus/alerts.test.yml")).unwrap();
    let mut names = BTreeSet::new();
    for g in docs[0]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            let name = r["alert"].as_str().expect("every rule is an alert");
            assert!(names.insert(name.to_string()), "alert {name} defined twice");
            assert!(matches!(r["labels"]["severity"].as_str(), Some("warning" | "critical")), "{name}: severity warning or critical");
            assert!(r["annotations"]["summary"].as_str().is_some_and(|s| !s.is_empty()), "{name}: annotations.summary");
            assert!(tests.contains(&format!("alertname: {name}\n")), "{name} has no case in alerts.test.yml");
            selectors(r["expr"].as_str().unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    assert!(names.len() >= 5, "lag, no leader, checkpoint, restarts, consumers bypassing: {names:?}");
}

#[test]
fn dashboards_are_well_formed() {
    for (path, d) in dashboards() {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "{file}: uid");
        let vars: BTreeSet<String> =
            d["templating"]["list"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect();
        assert!(vars.contains("datasource"), "{file}: a datasource variable (dashboards import into any Grafana)");
        let mut ids = BTreeSet::new();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            assert!(ids.insert(p["id"].as_i64().expect("panel id")), "{file}: panel id {} twice", p["id"]);
            let g = &p["gridPos"];
            let (x, w) = (g["x"].as_i64().unwrap(), g["w"].as_i64().unwrap());
            assert!(x >= 0 && w > 0 && x + w <= 24 && g["h"].as_i64().unwrap() > 0, "{file}: panel {title} inside the 24-column grid");
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{file}: panel {title} uses the datasource variable");
            let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{file}: panel {title} has targets"));
            assert!(!targets.is_empty(), "{file}: panel {title} queries something");
            for t in targets {
                let expr = t["expr"].as_str().unwrap();
                for v in ["$source", "$job"] {
                    if expr.contains(v) {
                        assert!(vars.contains(&v[1..]), "{file}: panel {title} uses {v}, which the dashboard does not define");
                    }
                }
                let sel = selectors(expr).unwrap_or_else(|e| panic!("{file}: panel {title}: `{expr}`: {e}"));
                assert!(!sel.is_empty(), "{file}: panel {title} selects no metric");
                for s in sel {
                    let prefix = if file.contains("consumer") { "binval_consumer_" } else { "binval_" };
                    assert!(s.name.starts_with(prefix), "{file}: panel {title} queries {}, not a {prefix}* metric", s.name);
                }
            }
        }
    }
}

#[test]
fn dashboards_cover_what_the_issue_asks_for() {
    let all: String = dashboard_queries().into_iter().map(|q| q.expr + "\n").collect();
    for m in [
        "binval_lag_seconds",
        "binval_transactions_total",
        "binval_redis_apply_seconds_bucket",
        "binval_kafka_delivery_seconds_bucket",
        "binval_errors_total",
        "binval_leader",
        "binval_checkpoint_age_seconds",
        "binval_queue_depth",
        "binval_verify_nines",
        "binval_verify_mismatches",
        "binval_consumer_hits_total",
        "binval_consumer_serving_local",
        "binval_consumer_invalidation_lag_ms_bucket",
        "binval_consumer_fills_total",
        "binval_consumer_hot_key_rank_reads_per_sec",
        "binval_consumer_redis_reads_total",
    ] {
        assert!(all.contains(m), "no panel shows {m}");
    }
    for q in dashboard_queries().iter().chain(alert_queries().iter()) {
        for n in binval::telemetry::names::NOT_YET_EMITTED {
            assert!(!q.expr.contains(n), "{}: {n} is not emitted yet", q.origin);
        }
    }
}

/// Every key path of `original` that the typed round trip lost: a field the API types do not
/// know (a typo like `livenessProbes`, a field at the wrong level).
fn unknown_fields(original: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                match t.get(k) {
                    Some(tv) => unknown_fields(v, tv, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, (ov, tv)) in o.iter().zip(t).enumerate() {
                unknown_fields(ov, tv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(doc: &Value, file: &str) -> T {
    let t: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: not a valid {}: {e}", doc["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    let mut unknown = Vec::new();
    unknown_fields(doc, &back, "", &mut unknown);
    assert!(unknown.is_empty(), "{file}: fields the Kubernetes API does not have: {unknown:?}");
    t
}

struct Manifests {
    deployment: k8s_openapi::api::apps::v1::Deployment,
    service: k8s_openapi::api::core::v1::Service,
    config_map: k8s_openapi::api::core::v1::ConfigMap,
    secret: k8s_openapi::api::core::v1::Secret,
    pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget,
}

fn manifests() -> Manifests {
    use k8s_openapi::api;
    let dir = root().join("deploy/kubernetes");
    let kustomization = &yaml(&dir.join("kustomization.yaml"))[0];
    let listed: BTreeSet<String> = kustomization["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_string()).collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present, "kustomization.yaml lists exactly the manifests of deploy/kubernetes");
    let (mut deployment, mut service, mut config_map, mut secret, mut pdb) = (None, None, None, None, None);
    for f in &listed {
        for doc in yaml(&dir.join(f)) {
            let kind = doc["kind"].as_str().unwrap_or_else(|| panic!("{f}: a document without kind"));
            let api_version = doc["apiVersion"].as_str().unwrap_or("");
            match (api_version, kind) {
                ("apps/v1", "Deployment") => deployment = Some(typed::<api::apps::v1::Deployment>(&doc, f)),
                ("v1", "Service") => service = Some(typed::<api::core::v1::Service>(&doc, f)),
                ("v1", "ConfigMap") => config_map = Some(typed::<api::core::v1::ConfigMap>(&doc, f)),
                ("v1", "Secret") => secret = Some(typed::<api::core::v1::Secret>(&doc, f)),
                ("policy/v1", "PodDisruptionBudget") => pdb = Some(typed::<api::policy::v1::PodDisruptionBudget>(&doc, f)),
                other => panic!("{f}: unexpected {other:?}"),
            }
        }
    }
    Manifests {
        deployment: deployment.expect("a Deployment"),
        service: service.expect("a Service"),
        config_map: config_map.expect("a ConfigMap"),
        secret: secret.expect("a Secret"),
        pdb: pdb.expect("a PodDisruptionBudget"),
    }
}

fn selects_labels(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn kubernetes_manifests_match_the_api_and_each_other() {
    let m = manifests();
    let spec = &m.deployment.spec;
    assert_eq!(spec.replicas, Some(2), "two instances: the lease makes one active");
    let template_labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
    assert!(selects_labels(spec.selector.match_labels.as_ref().unwrap(), &template_labels), "the Deployment selects its pods");
    assert!(selects_labels(m.service.spec.as_ref().unwrap().selector.as_ref().unwrap(), &template_labels), "the Service selects the pods");
    let pdb = m.pdb.spec.as_ref().unwrap();
    assert!(selects_labels(pdb.selector.as_ref().unwrap().match_labels.as_ref().unwrap(), &template_labels), "the PDB selects the pods");
    assert_eq!(pdb.min_available, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)));

    let pod = spec.template.spec.as_ref().unwrap();
    let c = &pod.containers[0];
    let ports: BTreeMap<String, i32> = c.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    for (probe, path) in [(&c.liveness_probe, "/healthz"), (&c.readiness_probe, "/readyz"), (&c.startup_probe, "/healthz")] {
        let http = probe.as_ref().expect("liveness, readiness and startup probes").http_get.as_ref().expect("HTTP probes");
        assert_eq!(http.path.as_deref(), Some(path));
        match &http.port {
            IntOrString::String(name) => assert!(ports.contains_key(name), "probe port {name} is a container port"),
            IntOrString::Int(p) => assert!(ports.values().any(|v| v == p), "probe port {p} is a container port"),
        }
    }
    let svc_port = &m.service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(svc_port.target_port, Some(IntOrString::String("metrics".into())));
    let annotations = spec.template.metadata.as_ref().unwrap().annotations.clone().unwrap();
    assert_eq!(annotations.get("prometheus.io/port").map(String::as_str), Some(ports["metrics"].to_string().as_str()));

    let requests = c.resources.as_ref().and_then(|r| r.requests.clone()).expect("resource requests");
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"), "cpu and memory requests");

    // The ConfigMap's config is a binval config whose metrics
    // listener is the probed port.
    let data = m.config_map.data.as_ref().unwrap();
    let volume = pod.volumes.as_ref().unwrap().iter().find(|v| v.config_map.is_some()).unwrap();
    let cm_ref = volume.config_map.as_ref().unwrap();
    assert_eq!(cm_ref.name, m.config_map.metadata.name.clone().unwrap());
    for item in cm_ref.items.iter().flatten() {
        assert!(data.contains_key(&item.key), "ConfigMap key {} exists", item.key);
    }
    let cfg = binval::config::Config::from_toml(&data["binval.toml"]).unwrap_or_else(|e| panic!("configmap.yaml binval.toml: {e}"));
    let listen: std::net::SocketAddr = cfg.metrics.listen.as_deref().expect("metrics.listen set: the probes need it").parse().unwrap();
    assert_eq!(listen.port() as i32, ports["metrics"], "metrics.listen is the container's metrics port");
    assert!(listen.ip().is_unspecified(), "metrics.listen binds every interface (the kubelet probes the pod IP)");
    let mount = c.volume_mounts.as_ref().unwrap().iter().find(|v| v.name == volume.name).unwrap();
    let args = c.args.as_ref().unwrap();
    let config_arg = &args[args.iter().position(|a| a == "--config").unwrap() + 1];
    assert!(config_arg.starts_with(&mount.mount_path), "--config {config_arg} is in the mounted ConfigMap");

    // Passwords and the CA are files of the mounted Secret: every `*_file` of the config is in
    // the Secret's mount and names one of its keys; no password in the ConfigMap or the
    // environment.
    let secret_keys: BTreeSet<String> = m.secret.string_data.clone().unwrap_or_default().into_keys().collect();
    let secret_volume = pod.volumes.as_ref().unwrap().iter().find(|v| v.secret.is_some()).expect("the Secret is a volume");
    assert_eq!(secret_volume.secret.as_ref().unwrap().secret_name, m.secret.metadata.name.clone());
    let secret_mount = c.volume_mounts.as_ref().unwrap().iter().find(|v| v.name == secret_volume.name).expect("the Secret is mounted");
    let files = [
        cfg.source.password_file.clone(),
        cfg.redis.password_file.clone(),
        cfg.kafka.sasl.as_ref().and_then(|s| s.password_file.clone()),
        cfg.source.tls.ca_file.clone(),
        cfg.redis.tls.ca_file.clone(),
        cfg.kafka.tls.ca_file.clone(),
    ];
    for f in files.iter() {
        let f = f.as_ref().expect("every password and CA of the config is a file");
        let key = f.strip_prefix(&secret_mount.mount_path).unwrap_or_else(|_| panic!("{} is in the Secret's mount", f.display()));
        assert!(secret_keys.contains(key.to_str().unwrap()), "the Secret has key {}", key.display());
    }
    assert!(
        cfg.source.password.is_none() && cfg.redis.password.is_none() && !cfg.source.url.contains(":CHANGE-ME@"),
        "no password in the ConfigMap"
    );
    assert!(c.env.iter().flatten().all(|e| e.value_from.is_none()), "no secret in the environment");
    assert!(!data["binval.toml"].contains("CHANGE-ME"), "no password in the ConfigMap");
    let security = pod.security_context.as_ref().unwrap();
    assert_eq!(security.run_as_non_root, Some(true));
    let dockerfile = std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap();
    assert!(dockerfile.contains(&format!("--uid {}", security.run_as_user.unwrap())), "runAsUser is the image's binval user");
}

#[test]
fn kubectl_kustomize_renders_when_kubectl_is_there() {
    // kubectl is not something the project installs; when a machine has it, its own renderer
    // must accept the kustomization too.
    let Ok(out) = Command::new("kubectl").args(["kustomize", "deploy/kubernetes"]).current_dir(root()).output() else {
        println!("kubectl not installed: the typed checks above stand alone");
        return;
    };
    assert!(out.status.success(), "kubectl kustomize: {}", String::from_utf8_lossy(&out.stderr));
    let docs = yaml_text(&String::from_utf8_lossy(&out.stdout)).unwrap();
    assert_eq!(docs.len(), 5, "ConfigMap, Secret, Deployment, Service, PodDisruptionBudget");
}

#[test]
fn compose_provisions_prometheus_and_grafana() {
    let compose = &yaml(&root().join("docker-compose.yml"))[0];
    let services = compose["services"].as_object().unwrap();
    let mounts = |svc: &str| -> Vec<String> {
        services[svc]["volumes"]
            .as_array()
            .unwrap_or_else(|| panic!("{svc} mounts"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let grafana = mounts("grafana");
    for (path, _) in dashboards() {
        let rel = format!("./deploy/grafana/{}", path.file_name().unwrap().to_string_lossy());
        assert!(grafana.iter().any(|m| m.starts_with(&format!("{rel}:/var/lib/grafana/dashboards/"))), "grafana mounts {rel}");
    }
    assert!(grafana.iter().any(|m| m.starts_with("./deploy/grafana/provisioning:/etc/grafana/provisioning")));
    let provider = &yaml(&root().join("deploy/grafana/provisioning/dashboards/binval.yml"))[0];
    assert_eq!(provider["providers"][0]["options"]["path"], "/var/lib/grafana/dashboards");
    let prometheus = mounts("prometheus");
    for f in ["prometheus.yml", "alerts.yml"] {
        assert!(prometheus.iter().any(|m| m.starts_with(&format!("./deploy/prometheus/{f}:/etc/prometheus/{f}"))), "prometheus mounts {f}");
    }
    let datasource = &yaml(&root().join("deploy/grafana/provisioning/datasources/prometheus.yml"))[0];
    assert_eq!(datasource["datasources"][0]["url"], "http://prometheus:9090");
    // Every scrape target is a compose service on a port it listens on.
    let prom = &yaml(&root().join("deploy/prometheus/prometheus.yml"))[0];
    let docker_cfg = binval::config::Config::load(Path::new(&root().join("config/docker.toml"))).unwrap();
    let binval_port = docker_cfg.metrics.listen.unwrap().rsplit(':').next().unwrap().to_string();
    for job in prom["scrape_configs"].as_array().unwrap() {
        for t in job["static_configs"][0]["targets"].as_array().unwrap() {
            let (host, port) = t.as_str().unwrap().split_once(':').unwrap();
            assert!(services.contains_key(host), "scrape target {host} is a compose service");
            if host == "binval" {
                assert_eq!(port, binval_port, "config/docker.toml's metrics.listen port");
            }
            if host == "product-api" {
                let listen = services[host]["environment"]["LISTEN_ADDR"].as_str().unwrap();
                assert!(listen.ends_with(&format!(":{port}")), "product_api listens on {port}");
            }
        }
    }
}
