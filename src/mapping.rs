//! Mapping stage: config rules turn a row change of `schema.table` into changes of logical
//! cache keys.
//!
//! * INSERT -> `insert` of the key rendered from the after image.
//! * DELETE -> `delete` of the key rendered from the before image.
//! * UPDATE -> `update` of the key when it is the same before and after; when a key column
//!   changed, `delete` of the old key and `insert` of the new one.
//! * A key column that is NULL renders no key (nothing to cache under).
//!
//! Tables without a rule are never decoded (the source asks [`Mapper::is_mapped`] at TABLE_MAP
//! time).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use binval_protocol::{keys::hash_tag, KeyTemplate, Op};
use serde_json::Value as Json;

use crate::config::{MappingConfig, MappingMode, Payload};
use crate::decode::{Row, RowChange, RowKind};

/// One change of one logical key, ready for the Redis stage.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyChange {
    /// Logical key (no replica suffix).
    pub key: String,
    /// What happened to it.
    pub op: Op,
    /// Source table, `schema.table`.
    pub table: Arc<str>,
    /// JSON document to store in every replica; `None` deletes the replicas (delete, or
    /// invalidate mode).
    pub payload: Option<String>,
    /// Number of suffix replicas N.
    pub replicas: u32,
    /// Replica TTL in seconds, 0 = none.
    pub ttl_secs: u64,
}

#[derive(Debug)]
struct Rule {
    table: Arc<str>,
    templates: Vec<KeyTemplate>,
    replicas: u32,
    payload: Option<Vec<String>>,
    mode: MappingMode,
    ttl_secs: u64,
}

/// The compiled mapping rules of a config.
#[derive(Debug, Default)]
pub struct Mapper {
    rules: HashMap<String, Rule>,
}

impl Mapper {
    /// Compile the rules. Templates were validated with the config; this cannot fail for a
    /// validated config.
    pub fn new(mappings: &[MappingConfig]) -> Result<Self, binval_protocol::TemplateError> {
        let mut rules = HashMap::new();
        for m in mappings {
            let templates = m.keys.iter().map(|k| KeyTemplate::parse(k)).collect::<Result<Vec<_>, _>>()?;
            rules.insert(
                m.table.clone(),
                Rule {
                    table: Arc::from(m.table.as_str()),
                    templates,
                    replicas: m.replicas,
                    payload: match &m.payload {
                        Payload::Whole(_) => None,
                        Payload::Columns(c) => Some(c.clone()),
                    },
                    mode: m.mode,
                    ttl_secs: m.ttl_secs,
                },
            );
        }
        Ok(Mapper { rules })
    }

    /// True when `schema.table` has a rule.
    pub fn is_mapped(&self, schema: &str, table: &str) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        self.rules.contains_key(&format!("{schema}.{table}"))
    }

    /// Mapped table names.
    pub fn tables(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().map(|s| s.as_str())
    }

    /// Append the key changes of one row change to `out`, in template order.
    pub fn map_row(&self, row: &RowChange, out: &mut Vec<KeyChange>) {
        let Some(rule) = self.rules.get(&*row.table) else { return };
        for t in &rule.templates {
            let old = row.before.as_ref().and_then(|r| render(t, r));
            let new = row.after.as_ref().and_then(|r| render(t, r));
            let payload = || match rule.mode {
                MappingMode::Invalidate => None,
                MappingMode::WriteThrough => row.after.as_ref().map(|a| payload_of(a, rule.payload.as_deref())),
            };
            let mut push = |key: String, op: Op, payload: Option<String>| {
                if rule.replicas > 1 {
                    if let Some(tag) = hash_tag(key.as_bytes()) {
                        tracing::warn!(key = %key, tag = %String::from_utf8_lossy(tag), "a column value forms a Redis hash tag: all replicas of this key share one hash slot");
                    }
                }
                out.push(KeyChange { key, op, table: rule.table.clone(), payload, replicas: rule.replicas, ttl_secs: rule.ttl_secs });
            };
            match row.kind {
                RowKind::Insert => {
                    if let Some(k) = new {
                        push(k, Op::Insert, payload());
                    }
                }
                RowKind::Delete => {
                    if let Some(k) = old {
                        push(k, Op::Delete, None);
                    }
                }
                RowKind::Update => match (old, new) {
                    (Some(o), Some(n)) if o == n => push(n, Op::Update, payload()),
                    (o, n) => {
                        if let Some(o) = o {
                            push(o, Op::Delete, None);
                        }
                        if let Some(n) = n {
                            push(n, Op::Insert, payload());
                        }
                    }
                },
            }
        }
    }
}

fn render(t: &KeyTemplate, row: &Row) -> Option<String> {
    t.render(|col| match row.get(col)? {
        Json::Null => None,
        Json::String(s) => Some(Cow::Owned(s.clone())),
        Json::Number(n) => Some(Cow::Owned(n.to_string())),
        Json::Bool(b) => Some(Cow::Owned(b.to_string())),
        other => Some(Cow::Owned(other.to_string())),
    })
}

fn payload_of(row: &Row, columns: Option<&[String]>) -> String {
    match columns {
        None => serde_json::to_string(row).expect("row serializes"),
        Some(cols) => {
            let mut m = serde_json::Map::new();
            for c in cols {
                if let Some(v) = row.get(c) {
                    m.insert(c.clone(), v.clone());
                }
            }
            serde_json::to_string(&m).expect("row serializes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mapper(extra: &str) -> Mapper {
        let cfg = crate::config::Config::from_toml(&format!(
            r#"
[source]
url = "mysql://u:p@h:1"
server_id = 1
[redis]
mode = "standalone"
urls = ["redis://h:1"]
[kafka]
brokers = "h:1"
[[mappings]]
table = "shop.items"
keys = ["item:detail:{{id}}", "item:sku:{{sku}}"]
replicas = 4
{extra}
"#
        ))
        .unwrap();
        Mapper::new(&cfg.mappings).unwrap()
    }

    fn row(v: serde_json::Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn insert_update_delete() {
        let m = mapper("");
        assert!(m.is_mapped("shop", "items"));
        assert!(!m.is_mapped("shop", "other"));
        let mut out = vec![];
        let after = row(json!({"id": 1, "sku": "A", "price": "1.50"}));
        m.map_row(&RowChange { table: "shop.items".into(), kind: RowKind::Insert, before: None, after: Some(after.clone()) }, &mut out);
        assert_eq!(out.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), vec!["item:detail:1", "item:sku:A"]);
        assert!(out.iter().all(|c| c.op == Op::Insert && c.replicas == 4));
        assert_eq!(out[0].payload.as_deref(), Some(r#"{"id":1,"price":"1.50","sku":"A"}"#));

        out.clear();
        let after2 = row(json!({"id": 1, "sku": "B", "price": "2.00"}));
        m.map_row(&RowChange { table: "shop.items".into(), kind: RowKind::Update, before: Some(after.clone()), after: Some(after2) }, &mut out);
        let got: Vec<(String, Op)> = out.iter().map(|c| (c.key.clone(), c.op)).collect();
        assert_eq!(
            got,
            vec![
                ("item:detail:1".into(), Op::Update),
                ("item:sku:A".into(), Op::Delete),
                ("item:sku:B".into(), Op::Insert)
            ]
        );
        assert_eq!(out[1].payload, None);

        out.clear();
        m.map_row(&RowChange { table: "shop.items".into(), kind: RowKind::Delete, before: Some(after), after: None }, &mut out);
        assert!(out.iter().all(|c| c.op == Op::Delete && c.payload.is_none()));
    }

    #[test]
    fn payload_columns_and_invalidate_mode() {
        let m = mapper("payload = [\"price\"]");
        let mut out = vec![];
        m.map_row(
            &RowChange { table: "shop.items".into(), kind: RowKind::Insert, before: None, after: Some(row(json!({"id": 1, "sku": null, "price": "1.50"}))) },
            &mut out,
        );
        assert_eq!(out.len(), 1, "NULL sku renders no key");
        assert_eq!(out[0].payload.as_deref(), Some(r#"{"price":"1.50"}"#));
        let m = mapper("mode = \"invalidate\"");
        out.clear();
        m.map_row(
            &RowChange { table: "shop.items".into(), kind: RowKind::Insert, before: None, after: Some(row(json!({"id": 1, "sku": "A"}))) },
            &mut out,
        );
        assert!(out.iter().all(|c| c.payload.is_none()));
    }
}
