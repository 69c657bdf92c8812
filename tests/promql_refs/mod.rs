//! What the dashboards and alert rules of `deploy/` query, for tests/deploy.rs (well-formed)
//! and tests/operate.rs (every selector finds series in a live scrape): each query's PromQL
//! parsed with promql-parser, its vector selectors (metric name and label matchers)
//! collected, and a small reader of the Prometheus text format to match them against.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use promql_parser::label::MatchOp;
use promql_parser::parser::Expr;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The dashboards of `deploy/grafana`.
pub fn dashboards() -> Vec<(PathBuf, serde_json::Value)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root().join("deploy/grafana")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            out.push((p, v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 2, "deploy/grafana holds the binval and the app dashboards");
    out
}

/// Every panel (rows' nested panels too) of a dashboard.
pub fn panels(dashboard: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// One query: where it is (`file: panel title` or `alerts.yml: alert`) and its PromQL.
#[derive(Debug, Clone)]
pub struct Query {
    pub origin: String,
    pub expr: String,
}

/// The queries of every dashboard panel.
pub fn dashboard_queries() -> Vec<Query> {
    let mut out = Vec::new();
    for (path, d) in dashboards() {
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_else(|| panic!("{file}: panel {} has a target without expr", p["title"]));
                out.push(Query { origin: format!("{file}: panel \"{}\"", p["title"].as_str().unwrap_or("")), expr: expr.to_string() });
            }
        }
    }
    out
}

/// The alert rules of `deploy/prometheus/alerts.yml`: (name, expr).
pub fn alert_queries() -> Vec<Query> {
    let docs = yaml(&root().join("deploy/prometheus/alerts.yml"));
    let mut out = Vec::new();
    for g in docs[0]["groups"].as_array().expect("groups") {
        for r in g["rules"].as_array().expect("rules") {
            out.push(Query {
                origin: format!("alerts.yml: {}", r["alert"].as_str().expect("alert name")),
                expr: r["expr"].as_str().expect("expr").to_string(),
            });
        }
    }
    out
}

/// Grafana variables replaced by what they stand for, so the text parses as PromQL:
/// `$__rate_interval` by a range, `$source` / `$job` (multi-value, "All" = `.*`) by `.*`.
pub fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$source", ".*").replace("$job", ".*")
}

/// A vector selector: metric name and label matchers `(label, op, value)` with op `=`, `!=`,
/// `=~`, `!~`.
#[derive(Debug, Clone)]
pub struct Selector {
    pub name: String,
    pub matchers: Vec<(String, MatchOp, String)>,
}

/// Parse `expr` (after [`substitute`]) and collect its vector selectors. Errors with the
/// parser's message.
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    let e = promql_parser::parser::parse(&substitute(expr))?;
    let mut out = Vec::new();
    walk(&e, &mut out);
    Ok(out)
}

fn walk(e: &Expr, out: &mut Vec<Selector>) {
    match e {
        Expr::Aggregate(a) => {
            walk(&a.expr, out);
            if let Some(p) = &a.param {
                walk(p, out);
            }
        }
        Expr::Unary(u) => walk(&u.expr, out),
        Expr::Binary(b) => {
            walk(&b.lhs, out);
            walk(&b.rhs, out);
        }
        Expr::Paren(p) => walk(&p.expr, out),
        Expr::Subquery(s) => walk(&s.expr, out),
        Expr::VectorSelector(v) => out.push(selector(v)),
        Expr::MatrixSelector(m) => out.push(selector(&m.vs)),
        Expr::Call(c) => {
            for a in &c.args.args {
                walk(a, out);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

fn selector(v: &promql_parser::parser::VectorSelector) -> Selector {
    let mut name = v.name.clone().unwrap_or_default();
    let mut matchers = Vec::new();
    for m in &v.matchers.matchers {
        if m.name == "__name__" {
            name = m.value.clone();
        } else {
            matchers.push((m.name.clone(), m.op.clone(), m.value.clone()));
        }
    }
    assert!(v.matchers.or_matchers.is_empty(), "`or` matchers are not used in deploy/");
    Selector { name, matchers }
}

/// One sample of a scrape: name and labels.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parse Prometheus text format (the exposition format 0.0.4: `name{l="v",...} value`).
pub fn parse_scrape(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => continue,
        };
        let mut labels = BTreeMap::new();
        let value_text = if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut end = body.len();
            // key="value" pairs with \" \\ \n escapes, up to the closing brace.
            loop {
                while let Some((_, c)) = chars.peek() {
                    if *c == ',' || *c == ' ' {
                        chars.next();
                    } else {
                        break;
                    }
                }
                match chars.peek() {
                    Some((i, '}')) => {
                        end = *i + 1;
                        break;
                    }
                    None => break,
                    _ => {}
                }
                let mut key = String::new();
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    key.push(c);
                }
                chars.next(); // opening quote
                let mut value = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, other)) => value.push(other),
                            None => {}
                        },
                        '"' => break,
                        c => value.push(c),
                    }
                }
                labels.insert(key, value);
            }
            &body[end..]
        } else {
            rest
        };
        let value = value_text.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        out.push(Sample { name: name.to_string(), labels, value });
    }
    out
}

/// Labels Prometheus adds at scrape time (target labels): a matcher on them holds for any
/// scraped series.
pub const TARGET_LABELS: &[&str] = &["job", "instance"];

/// Whether `s` selects `sample` (name and every matcher; matchers on [`TARGET_LABELS`] hold).
pub fn selects(s: &Selector, sample: &Sample) -> bool {
    s.name == sample.name
        && s.matchers.iter().all(|(label, op, value)| {
            if TARGET_LABELS.contains(&label.as_str()) {
                return true;
            }
            let have = sample.labels.get(label).map(String::as_str).unwrap_or("");
            match op {
                MatchOp::Equal => have == value,
                MatchOp::NotEqual => have != value,
                MatchOp::Re(re) => re.is_match(have),
                MatchOp::NotRe(re) => !re.is_match(have),
            }
        })
}

/// YAML documents of `path` as JSON values (keys as strings).
pub fn yaml(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    yaml_text(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// YAML text as JSON values, one per document.
pub fn yaml_text(text: &str) -> Result<Vec<serde_json::Value>, String> {
    let docs = yaml_rust2::YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    docs.iter().map(to_json).collect()
}

fn to_json(y: &yaml_rust2::Yaml) -> Result<serde_json::Value, String> {
    use yaml_rust2::Yaml;
    Ok(match y {
        Yaml::Real(r) => serde_json::json!(r.parse::<f64>().map_err(|e| format!("{r}: {e}"))?),
        Yaml::Integer(i) => serde_json::json!(i),
        Yaml::String(s) => serde_json::json!(s),
        Yaml::Boolean(b) => serde_json::json!(b),
        Yaml::Array(a) => serde_json::Value::Array(a.iter().map(to_json).collect::<Result<_, _>>()?),
        Yaml::Hash(h) => {
            let mut m = serde_json::Map::new();
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("unsupported key {other:?}")),
                };
                m.insert(key, to_json(v)?);
            }
            serde_json::Value::Object(m)
        }
        Yaml::Null => serde_json::Value::Null,
        Yaml::Alias(_) | Yaml::BadValue => return Err(format!("unsupported YAML node {y:?}")),
    })
}
