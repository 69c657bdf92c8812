//! [`Mapper`]: the compiled rules of every mapping, turning one row change into key changes.

use super::collapse::Phase;
use super::*;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use binval_protocol::{keys::hash_tag, KeyTemplate, Op};
use serde_json::Value as Json;

use crate::binlog::decode::{Row, RowChange, RowKind};
use crate::config::{MappingConfig, MappingMode, Payload};

#[derive(Debug)]
pub(super) struct Rule {
    table: Arc<str>,
    templates: Vec<KeyTemplate>,
    replicas: crate::config::Replicas,
    payload: Option<Vec<String>>,
    mode: MappingMode,
    ttl_secs: u64,
    /// Text columns whose values are JSON documents (MariaDB's JSON type is LONGTEXT with a
    /// `json_valid` check; the binlog cannot tell it from text): configured, or detected at
    /// start ([`Mapper::with_detected_json`], for rows that do not come from the binlog).
    json_columns: Vec<String>,
    /// `json_columns` not configured: take the ones detected on the source (for rows from the
    /// binlog, the ones the reader knew at the row's TABLE_MAP: `RowChange::json_columns`).
    detect_json: bool,
    /// The mapping's place in `mappings` (for `mappings[i]` in errors).
    index: usize,
    /// `allow_non_unique_keys` (invalidate mode only): a delete leaves a stale marker, not a
    /// tombstone, since another row may still render the key.
    non_unique: bool,
}

/// The compiled mapping rules of a config.
#[derive(Debug, Default)]
pub struct Mapper {
    pub(super) rules: HashMap<String, Rule>,
    /// The counts of the keys of adaptive mappings that are above their `min`.
    counts: Arc<crate::replicas::ReplicaCounts>,
}

impl Mapper {
    /// Compile the rules. Templates were validated with the config; this cannot fail for a
    /// validated config.
    pub fn new(mappings: &[MappingConfig]) -> Result<Self, binval_protocol::TemplateError> {
        let mut rules = HashMap::new();
        for (index, m) in mappings.iter().enumerate() {
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
                    json_columns: m.json_columns.clone().unwrap_or_default(),
                    detect_json: m.json_columns.is_none(),
                    index,
                    non_unique: m.allow_non_unique_keys,
                },
            );
        }
        Ok(Mapper { rules, counts: Arc::default() })
    }

    /// The counts of the keys of adaptive mappings (`replicas = { min, max }`) above their
    /// `min`: every change of such a key writes (and records) the count found here.
    pub fn counts(&self) -> &Arc<crate::replicas::ReplicaCounts> {
        &self.counts
    }

    /// True when a mapping has an adaptive replica count.
    pub fn any_adaptive(&self) -> bool {
        self.rules.values().any(|r| r.replicas.is_adaptive())
    }

    /// The replica setting of the adaptive mapping whose key template matches `key`; `None`
    /// when no adaptive mapping renders such a key.
    pub fn adaptive_rule_of(&self, key: &str) -> Option<crate::config::Replicas> {
        self.rules
            .values()
            .filter(|r| r.replicas.is_adaptive())
            .find(|r| r.templates.iter().any(|t| t.split_key(key).is_some()))
            .map(|r| r.replicas)
    }

    /// The replica setting of the mapping whose key template matches `key`, adaptive or not.
    pub fn replicas_of_key(&self, key: &str) -> Option<crate::config::Replicas> {
        let mut rules: Vec<&Rule> = self.rules.values().collect();
        rules.sort_by_key(|r| r.index);
        rules.into_iter().find(|r| r.templates.iter().any(|t| t.split_key(key).is_some())).map(|r| r.replicas)
    }

    /// `(replicas to write, count to record)` for a change of `key` under a mapping with `r`.
    pub fn count_of(&self, key: &str, r: crate::config::Replicas) -> (u32, u32) {
        if !r.is_adaptive() {
            return (r.min, r.min);
        }
        match self.counts.get(key) {
            Some(c) => (c.write, c.count),
            None => (r.min, r.min),
        }
    }

    /// True when `schema.table` has a rule.
    pub fn is_mapped(&self, schema: &str, table: &str) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        self.rules.contains_key(&format!("{schema}.{table}"))
    }

    /// The configured name, key templates and replica setting of mapped table `table`
    /// (`schema.table`), for table-wide invalidation.
    pub fn templates_of(&self, table: &str) -> Option<(&str, &[KeyTemplate], crate::config::Replicas)> {
        self.rules.get(table).map(|r| (&*r.table, r.templates.as_slice(), r.replicas))
    }

    /// The key templates of mapped table `table` (configured `schema.table`) for the key
    /// judgment (`binlog::server::judge_key_templates`): the mapping's index in `mappings`, its
    /// templates, and whether it accepts non-unique keys.
    pub fn key_rule(&self, table: &str) -> Option<(usize, &[KeyTemplate], bool)> {
        self.rules.get(table).map(|r| (r.index, r.templates.as_slice(), r.non_unique))
    }

    /// The first row of `rows` whose image lacks a column the key templates of its table use,
    /// as (table, missing columns). With the FULL row image binval requires, a missing column
    /// means the table no longer has it (renamed or dropped): every row would map to no key and
    /// invalidation would stop silently.
    pub fn missing_key_columns(&self, rows: &[RowChange]) -> Option<(String, Vec<String>)> {
        for row in rows {
            let Some(r) = self.rules.get(&*row.table) else { continue };
            let Some(image) = row.after.as_ref().or(row.before.as_ref()) else { continue };
            let mut missing: Vec<String> =
                r.templates.iter().flat_map(|t| t.columns()).filter(|c| !image.contains_key(*c)).map(String::from).collect();
            if !missing.is_empty() {
                missing.sort();
                missing.dedup();
                return Some((row.table.to_string(), missing));
            }
        }
        None
    }

    /// Set the JSON columns detected on the source for `table` (MariaDB JSON columns, see
    /// `binlog::server::mariadb_json_columns`); ignored for mappings that list `json_columns`,
    /// and for rows from the binlog, which carry the reader's own (`RowChange::json_columns`).
    pub fn set_detected_json(&mut self, table: &str, columns: Vec<String>) {
        if let Some(r) = self.rules.get_mut(table) {
            if r.detect_json {
                r.json_columns = columns;
            }
        }
    }

    /// The JSON columns of `table` in effect.
    pub fn json_columns(&self, table: &str) -> &[String] {
        self.rules.get(table).map(|r| r.json_columns.as_slice()).unwrap_or(&[])
    }

    /// Mapped table names.
    pub fn tables(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().map(|s| s.as_str())
    }

    /// The mapper with the JSON columns detected on a MariaDB source (`detected`: `schema.table`
    /// -> column names, from `binlog::server::mariadb_json_columns`) set for the mappings
    /// without `json_columns`, so their text values become JSON documents: for rows that do not
    /// come from the binlog (a table scan reads the schema of now). Rows from the binlog carry
    /// the columns the reader knew at their TABLE_MAP instead (`binlog::json_columns`). Returns
    /// `mapper` itself when nothing was detected (MySQL's binary JSON needs no detection).
    pub fn with_detected_json(mappings: &[MappingConfig], mapper: Arc<Mapper>, detected: HashMap<String, Vec<String>>) -> Arc<Mapper> {
        if detected.is_empty() {
            return mapper;
        }
        let mut m = Mapper::new(mappings).expect("mappings were validated at start");
        for (table, cols) in detected {
            tracing::info!(table = %table, columns = ?cols, "MariaDB JSON columns: values go into the payload as JSON documents");
            m.set_detected_json(&table, cols);
        }
        Arc::new(m)
    }

    /// Append the key changes of a transaction's rows to `out`, in commit order. Within the rows
    /// of one row event (one statement, whose changes take effect together), the deletes of
    /// keys that rows move away from come first, so a statement that swaps key values
    /// (`SET k = CASE k WHEN 'a' THEN 'b' WHEN 'b' THEN 'a' END`) leaves both keys present.
    pub fn map_rows(&self, rows: &[RowChange], out: &mut Vec<KeyChange>) {
        let mut i = 0;
        while i < rows.len() {
            let mut j = i;
            while j < rows.len() && rows[j].event == rows[i].event {
                j += 1;
            }
            for r in &rows[i..j] {
                self.map_one(r, Phase::MovedAway, out);
            }
            for r in &rows[i..j] {
                self.map_one(r, Phase::Rest, out);
            }
            i = j;
        }
    }

    /// Append the key changes of one row change to `out`, in template order.
    pub fn map_row(&self, row: &RowChange, out: &mut Vec<KeyChange>) {
        self.map_one(row, Phase::MovedAway, out);
        self.map_one(row, Phase::Rest, out);
    }

    fn map_one(&self, row: &RowChange, phase: Phase, out: &mut Vec<KeyChange>) {
        let Some(rule) = self.rules.get(&*row.table) else { return };
        for t in &rule.templates {
            let old = row.before.as_ref().and_then(|r| render(t, r));
            let new = row.after.as_ref().and_then(|r| render(t, r));
            let payload = || match rule.mode {
                MappingMode::Invalidate => None,
                MappingMode::WriteThrough => {
                    let json: &[String] = match (&row.json_columns, rule.detect_json) {
                        (Some(detected), true) => detected,
                        _ => &rule.json_columns,
                    };
                    row.after.as_ref().map(|a| payload_of(a, rule.payload.as_deref(), json, &rule.table))
                }
            };
            let mut push = |key: String, op: Op, payload: Option<String>| {
                // Another row may still render a key a non-unique mapping deletes: invalidate
                // it instead (readers ask their loader, which finds that row or none).
                let op = if op == Op::Delete && rule.non_unique { Op::Update } else { op };
                if rule.replicas.max > 1 {
                    if let Some(tag) = hash_tag(key.as_bytes()) {
                        tracing::warn!(key = %key, tag = %String::from_utf8_lossy(tag), "a column value forms a Redis hash tag: all replicas of this key share one hash slot");
                    }
                }
                let (replicas, count) = self.count_of(&key, rule.replicas);
                out.push(KeyChange { key, op, table: rule.table.clone(), payload, replicas, count, ttl_secs: rule.ttl_secs });
            };
            match (phase, row.kind) {
                (Phase::MovedAway, RowKind::Update) => {
                    if let (Some(o), n) = (old, new) {
                        if n.as_deref() != Some(o.as_str()) {
                            push(o, Op::Delete, None);
                        }
                    }
                }
                (Phase::MovedAway, _) => {}
                (Phase::Rest, RowKind::Insert) => {
                    if let Some(k) = new {
                        push(k, Op::Insert, payload());
                    }
                }
                (Phase::Rest, RowKind::Delete) => {
                    if let Some(k) = old {
                        push(k, Op::Delete, None);
                    }
                }
                (Phase::Rest, RowKind::Update) => match (old, new) {
                    (Some(o), Some(n)) if o == n => push(n, Op::Update, payload()),
                    (_, Some(n)) => push(n, Op::Insert, payload()),
                    (_, None) => {}
                },
            }
        }
    }
}

pub(super) fn render(t: &KeyTemplate, row: &Row) -> Option<String> {
    t.render(|col| match row.get(col)? {
        Json::Null => None,
        Json::String(s) => Some(Cow::Owned(s.clone())),
        Json::Number(n) => Some(Cow::Owned(n.to_string())),
        Json::Bool(b) => Some(Cow::Owned(b.to_string())),
        other => Some(Cow::Owned(other.to_string())),
    })
}

/// The payload of `row` (`binval_protocol::payload::render`, the one implementation shared with
/// bootstrap and app loaders); a JSON column whose text is not JSON is kept as text, logged.
pub(super) fn payload_of(row: &Row, columns: Option<&[String]>, json_columns: &[String], table: &str) -> String {
    let r = binval_protocol::payload::render(row, columns, json_columns);
    for column in &r.not_json {
        tracing::warn!(table, column = %column, "value of a JSON column is not JSON; kept as text");
    }
    r.text
}
