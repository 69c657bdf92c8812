//! Mapping stage: config rules turn a row change of `schema.table` into changes of logical
//! cache keys.
//!
//! * INSERT -> `insert` of the key rendered from the after image.
//! * DELETE -> `delete` of the key rendered from the before image.
//! * UPDATE -> `update` of the key when it is the same before and after; when a key column
//!   changed, `delete` of the old key and `insert` of the new one.
//! * A key column that is NULL renders no key (nothing to cache under).
//! * A mapping with `allow_non_unique_keys` (invalidate mode; its templates may render one
//!   key from several rows): a `delete` becomes an `update` without payload, a stale marker
//!   instead of a tombstone, since another row may still render the key.
//!
//! Tables without a rule are never decoded (the source asks [`Mapper::is_mapped`] at TABLE_MAP
//! time).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use binval_protocol::{keys::hash_tag, KeyTemplate, Op};
use serde_json::Value as Json;

use crate::binlog::decode::{Row, RowChange, RowKind};
use crate::config::{MappingConfig, MappingMode, Payload};

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
    /// Suffix replicas this change writes (`K:r0..K:r{replicas-1}`).
    pub replicas: u32,
    /// The key's replica count recorded in every replica written (field `n`, see
    /// `binval_protocol::adaptive`): equal to `replicas`, except while a shrink is announced
    /// and not done (`crate::replicas`), when it is smaller.
    pub count: u32,
    /// Replica TTL in seconds, 0 = none.
    pub ttl_secs: u64,
}

#[derive(Debug)]
struct Rule {
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

/// Renamed mapped tables, followed as the binlog goes: current `schema.table` -> the
/// configured name whose rule applies (`Some`), or `None` for a configured name that was renamed
/// away (no longer mapped under that name). Saved in the checkpoint, so a restart after a
/// RENAME keeps following it; a restart before it replays the RENAME and follows it again.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct TableNames(pub std::collections::BTreeMap<String, Option<String>>);

impl TableNames {
    /// The configured table whose rule applies to live table `name`, if any.
    pub fn resolve(&self, mapper: &Mapper, name: &str) -> Option<String> {
        match self.0.get(name) {
            Some(v) => v.clone(),
            None => mapper.rules.contains_key(name).then(|| name.to_string()),
        }
    }

    /// The live name of the table configured as `configured`: the table a RENAME moved its
    /// rule to, else `configured` itself unless it was renamed away (`None`).
    ///
    /// ```
    /// use binval::mapping::TableNames;
    /// let mut n = TableNames::default();
    /// n.0.insert("shop.goods".into(), Some("shop.items".into()));
    /// n.0.insert("shop.items".into(), None);
    /// assert_eq!(n.live_name("shop.items").as_deref(), Some("shop.goods"));
    /// assert_eq!(n.live_name("shop.tags").as_deref(), Some("shop.tags"));
    /// ```
    pub fn live_name(&self, configured: &str) -> Option<String> {
        let moved = self.0.iter().find(|(_, v)| v.as_deref() == Some(configured)).map(|(k, _)| k.clone());
        moved.or_else(|| (!self.0.contains_key(configured)).then(|| configured.to_string()))
    }

    /// Where each mapping's rule applies now: configured name -> live name (`None`: no table
    /// is mapped by it, e.g. after an older version left it so).
    fn locations(&self, mapper: &Mapper) -> HashMap<String, Option<String>> {
        let mut at: HashMap<String, Option<String>> = HashMap::new();
        for cfg in mapper.rules.keys() {
            at.insert(cfg.clone(), self.live_name(cfg));
        }
        at
    }

    /// The state for the locations `at` (configured name -> live name), in its canonical form:
    /// an entry for each rule applying under another name, and `None` for each configured name
    /// its own rule does not apply to (and no other does).
    fn from_locations(at: &HashMap<String, Option<String>>) -> Self {
        let mut m = std::collections::BTreeMap::new();
        for (cfg, live) in at {
            if let Some(l) = live {
                if l != cfg {
                    m.insert(l.clone(), Some(cfg.clone()));
                }
            }
        }
        for (cfg, live) in at {
            if live.as_deref() != Some(cfg.as_str()) {
                m.entry(cfg.clone()).or_insert(None);
            }
        }
        TableNames(m)
    }

    /// The live `schema.table` names some mapping applies to now.
    pub fn live_names(&self, mapper: &Mapper) -> Vec<String> {
        let mut v: Vec<String> = self.locations(mapper).into_values().flatten().collect();
        v.sort();
        v
    }

    /// Follow one RENAME statement: `pairs` are its `(from, to)` renames, applied in order as
    /// MySQL/MariaDB do (atomically: the statement is judged as a whole). Per mapping whose
    /// table is named in the statement:
    ///
    /// * its name ends up holding a *different* table (an online schema change cut-over
    ///   `RENAME TABLE t TO t_old, t_new TO t`, or a swap of two tables): the mapping stays with
    ///   the name, and since the rows under it are others now, every key of it is stale
    ///   ([`RenameOutcome::stale`]);
    /// * its name is left empty: the mapping follows its table to the table's new name (rows and
    ///   keys are unchanged, [`RenameOutcome::followed`]);
    /// * its table comes back to its name: nothing changes.
    ///
    /// A mapping that would follow its table onto a name where another mapping applies is a
    /// [`RenameConflict`]: two mappings on one table would mix their keys, and which one the
    /// operator means is not in the binlog. Nothing is changed then.
    pub fn rename_statement(&mut self, mapper: &Mapper, pairs: &[(String, String)]) -> Result<RenameOutcome, RenameConflict> {
        // Which table (by its name before the statement) each name holds after it; a name not
        // in `holds` keeps its own table, `None` is a name left empty.
        let mut holds: HashMap<&str, Option<&str>> = HashMap::new();
        for (from, to) in pairs {
            let table = holds.get(from.as_str()).copied().unwrap_or(Some(from.as_str()));
            holds.insert(from.as_str(), None);
            holds.insert(to.as_str(), table);
        }
        let final_name = |table: &str| holds.iter().find(|(_, t)| **t == Some(table)).map(|(n, _)| n.to_string());
        let mut at = self.locations(mapper);
        let mut out = RenameOutcome::default();
        for (cfg, live) in at.iter_mut() {
            let Some(name) = live.clone() else { continue };
            let Some(held) = holds.get(name.as_str()) else { continue };
            match held {
                Some(t) if *t == name => {}
                Some(_) => out.stale.push(cfg.clone()),
                None => {
                    if let Some(to) = final_name(&name) {
                        out.followed.push((cfg.clone(), name.clone(), to.clone()));
                        *live = Some(to);
                    }
                }
            }
        }
        for (cfg, from, to) in &out.followed {
            if let Some((other, _)) = at.iter().find(|(c, l)| *c != cfg && l.as_deref() == Some(to.as_str())) {
                return Err(RenameConflict { mapping: cfg.clone(), table: from.clone(), onto: to.clone(), other: other.clone() });
            }
        }
        out.stale.sort();
        out.followed.sort();
        *self = Self::from_locations(&at);
        Ok(out)
    }
}

/// What one RENAME statement did to the mappings ([`TableNames::rename_statement`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RenameOutcome {
    /// `(configured name, from, to)`: mappings that follow their table to its new name.
    pub followed: Vec<(String, String, String)>,
    /// Configured names of mappings that stay with their name, which now holds another table:
    /// every key of them is stale.
    pub stale: Vec<String>,
}

/// A RENAME that would move the table of mapping `mapping` (live name `table`) onto `onto`,
/// where mapping `other` applies (see [`TableNames::rename_statement`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenameConflict {
    /// The configured name of the mapping whose table moves.
    pub mapping: String,
    /// That table's name before the statement.
    pub table: String,
    /// The name it moves to.
    pub onto: String,
    /// The configured name of the mapping that applies to `onto`.
    pub other: String,
}

/// The compiled mapping rules of a config.
#[derive(Debug, Default)]
pub struct Mapper {
    rules: HashMap<String, Rule>,
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

/// Two passes over the rows of one statement: first the deletes of keys rows moved away from,
/// then everything else.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    MovedAway,
    Rest,
}

/// Keep only the last change of each key within one transaction (all of a transaction's
/// changes share its fence position, and only the state after the commit is ever visible to
/// readers). The kept change has the last op, except that a key inserted and then updated in
/// the same transaction stays an `insert`. Kept changes stay in the order of their last appearance.
pub fn collapse_per_key(changes: &mut Vec<KeyChange>) {
    collapse_per_key_with(changes, &mut Vec::<()>::new());
}

/// [`collapse_per_key`] over the changes of several transactions in commit order (a group,
/// see `write::apply`), keeping `tags[i]` (e.g. the change's transaction) with `changes[i]`
/// when `tags` is as long as `changes` (an empty `tags` is left alone). The newest change of
/// each key wins: writes are fenced and consumers evict by version, so the older ones need not
/// be written.
pub fn collapse_per_key_with<T>(changes: &mut Vec<KeyChange>, tags: &mut Vec<T>) {
    if changes.len() < 2 {
        return;
    }
    let (keep, first_insert): (Vec<bool>, Vec<bool>) = {
        let mut last: HashMap<&str, (usize, bool)> = HashMap::with_capacity(changes.len());
        for (i, c) in changes.iter().enumerate() {
            last.entry(c.key.as_str()).and_modify(|e| e.0 = i).or_insert((i, c.op == Op::Insert));
        }
        if last.len() == changes.len() {
            return;
        }
        let mut keep = vec![false; changes.len()];
        let mut first_insert = vec![false; changes.len()];
        for (i, ins) in last.into_values() {
            keep[i] = true;
            first_insert[i] = ins;
        }
        (keep, first_insert)
    };
    for (i, c) in changes.iter_mut().enumerate() {
        if keep[i] && first_insert[i] && c.op == Op::Update {
            c.op = Op::Insert;
        }
    }
    let mut i = 0;
    changes.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    if tags.len() == keep.len() {
        let mut i = 0;
        tags.retain(|_| {
            i += 1;
            keep[i - 1]
        });
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

/// The payload of `row` (`binval_protocol::payload::render`, the one implementation shared with
/// bootstrap and app loaders); a JSON column whose text is not JSON is kept as text, logged.
fn payload_of(row: &Row, columns: Option<&[String]>, json_columns: &[String], table: &str) -> String {
    let r = binval_protocol::payload::render(row, columns, json_columns);
    for column in &r.not_json {
        tracing::warn!(table, column = %column, "value of a JSON column is not JSON; kept as text");
    }
    r.text
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
    fn a_non_unique_mapping_invalidates_instead_of_deleting() {
        let m = mapper("mode = \"invalidate\"\nallow_non_unique_keys = true");
        assert_eq!(m.key_rule("shop.items").map(|(i, t, a)| (i, t.len(), a)), Some((0, 2, true)));
        let (a, b) = (row(json!({"id": 1, "sku": "A"})), row(json!({"id": 1, "sku": "B"})));
        let change = |kind, before: Option<&Row>, after: Option<&Row>| RowChange {
            table: "shop.items".into(),
            kind,
            before: before.cloned(),
            after: after.cloned(),
            event: 0,
            json_columns: None,
        };
        let mut out = vec![];
        m.map_row(&change(RowKind::Delete, Some(&a), None), &mut out);
        m.map_row(&change(RowKind::Update, Some(&a), Some(&b)), &mut out);
        let got: Vec<(&str, Op, Option<&str>)> = out.iter().map(|c| (c.key.as_str(), c.op, c.payload.as_deref())).collect();
        // Another row may still render item:sku:A: a stale marker (update, no payload), not a
        // tombstone.
        assert_eq!(
            got,
            vec![
                ("item:detail:1", Op::Update, None),
                ("item:sku:A", Op::Update, None),
                ("item:sku:A", Op::Update, None),
                ("item:detail:1", Op::Update, None),
                ("item:sku:B", Op::Insert, None)
            ]
        );
        assert_eq!(mapper("").key_rule("shop.items").map(|(_, _, a)| a), Some(false));
    }

    #[test]
    fn insert_update_delete() {
        let m = mapper("");
        assert!(m.is_mapped("shop", "items"));
        assert!(!m.is_mapped("shop", "other"));
        let mut out = vec![];
        let after = row(json!({"id": 1, "sku": "A", "price": "1.50"}));
        m.map_row(
            &RowChange {
                table: "shop.items".into(),
                kind: RowKind::Insert,
                before: None,
                after: Some(after.clone()),
                event: 0,
                json_columns: None,
            },
            &mut out,
        );
        assert_eq!(out.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), vec!["item:detail:1", "item:sku:A"]);
        assert!(out.iter().all(|c| c.op == Op::Insert && c.replicas == 4 && c.count == 4));
        assert_eq!(out[0].payload.as_deref(), Some(r#"{"id":1,"price":"1.50","sku":"A"}"#));

        out.clear();
        let after2 = row(json!({"id": 1, "sku": "B", "price": "2.00"}));
        m.map_row(
            &RowChange {
                table: "shop.items".into(),
                kind: RowKind::Update,
                before: Some(after.clone()),
                after: Some(after2),
                event: 0,
                json_columns: None,
            },
            &mut out,
        );
        let got: Vec<(String, Op)> = out.iter().map(|c| (c.key.clone(), c.op)).collect();
        assert_eq!(got, vec![("item:sku:A".into(), Op::Delete), ("item:detail:1".into(), Op::Update), ("item:sku:B".into(), Op::Insert)]);
        assert_eq!(out[0].payload, None);

        out.clear();
        m.map_row(
            &RowChange {
                table: "shop.items".into(),
                kind: RowKind::Delete,
                before: Some(after),
                after: None,
                event: 0,
                json_columns: None,
            },
            &mut out,
        );
        assert!(out.iter().all(|c| c.op == Op::Delete && c.payload.is_none()));
    }

    #[test]
    fn swapping_key_values_in_one_statement_keeps_both_keys() {
        let m = mapper("");
        let r = |id: i64, sku: &str| row(json!({"id": id, "sku": sku}));
        let rows = vec![
            RowChange {
                table: "shop.items".into(),
                kind: RowKind::Update,
                before: Some(r(1, "A")),
                after: Some(r(1, "B")),
                event: 0,
                json_columns: None,
            },
            RowChange {
                table: "shop.items".into(),
                kind: RowKind::Update,
                before: Some(r(2, "B")),
                after: Some(r(2, "A")),
                event: 0,
                json_columns: None,
            },
        ];
        let mut out = vec![];
        m.map_rows(&rows, &mut out);
        let sku: Vec<(String, Op)> = out.iter().filter(|c| c.key.starts_with("item:sku")).map(|c| (c.key.clone(), c.op)).collect();
        assert_eq!(
            sku,
            vec![
                ("item:sku:A".into(), Op::Delete),
                ("item:sku:B".into(), Op::Delete),
                ("item:sku:B".into(), Op::Insert),
                ("item:sku:A".into(), Op::Insert)
            ],
            "deletes first: both keys end up present"
        );
        // Across statements, order is kept as committed.
        let mut rows = rows;
        rows[1].event = 1;
        out.clear();
        m.map_rows(&rows, &mut out);
        let last_a = out.iter().rposition(|c| c.key == "item:sku:A").unwrap();
        assert_eq!(out[last_a].op, Op::Insert);
    }

    #[test]
    fn payload_columns_and_invalidate_mode() {
        let m = mapper("payload = [\"price\"]");
        let mut out = vec![];
        m.map_row(
            &RowChange {
                table: "shop.items".into(),
                kind: RowKind::Insert,
                before: None,
                after: Some(row(json!({"id": 1, "sku": null, "price": "1.50"}))),
                event: 0,
                json_columns: None,
            },
            &mut out,
        );
        assert_eq!(out.len(), 1, "NULL sku renders no key");
        assert_eq!(out[0].payload.as_deref(), Some(r#"{"price":"1.50"}"#));
        let m = mapper("mode = \"invalidate\"");
        out.clear();
        m.map_row(
            &RowChange {
                table: "shop.items".into(),
                kind: RowKind::Insert,
                before: None,
                after: Some(row(json!({"id": 1, "sku": "A"}))),
                event: 0,
                json_columns: None,
            },
            &mut out,
        );
        assert!(out.iter().all(|c| c.payload.is_none()));
    }

    fn two_mappings() -> Mapper {
        let mut m = mapper("");
        let extra = Mapper::new(
            &crate::config::Config::from_toml(
                "[source]\nurl = \"mysql://u:p@h:1\"\nserver_id = 1\n[redis]\nmode = \"standalone\"\nurls = [\"redis://h:1\"]\n[kafka]\nbrokers = \"h:1\"\n[[mappings]]\ntable = \"shop.items_new\"\nkeys = [\"n:{id}\"]\n",
            )
            .unwrap()
            .mappings,
        )
        .unwrap();
        m.rules.extend(extra.rules);
        m
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn renames_follow_the_table_unless_the_name_gets_another() {
        let m = two_mappings();
        let mut n = TableNames::default();
        // A plain rename: followed, and back again.
        let o = n.rename_statement(&m, &pairs(&[("shop.items", "shop.goods")])).unwrap();
        assert_eq!(o.followed, vec![("shop.items".into(), "shop.items".into(), "shop.goods".into())]);
        assert_eq!(n.resolve(&m, "shop.goods").as_deref(), Some("shop.items"));
        assert_eq!(n.resolve(&m, "shop.items"), None);
        n.rename_statement(&m, &pairs(&[("shop.goods", "shop.items")])).unwrap();
        assert_eq!(n, TableNames::default(), "back to the configured names");
        // A swap through a temporary name: both stay with their names, both stale.
        let o = n
            .rename_statement(&m, &pairs(&[("shop.items", "shop.tmp"), ("shop.items_new", "shop.items"), ("shop.tmp", "shop.items_new")]))
            .unwrap();
        assert_eq!((o.followed.len(), o.stale), (0, vec!["shop.items".to_string(), "shop.items_new".to_string()]));
        assert_eq!(n, TableNames::default());
        // A table renamed away and back in one statement: nothing changes.
        let o = n.rename_statement(&m, &pairs(&[("shop.items", "shop.t"), ("shop.t", "shop.items")])).unwrap();
        assert_eq!(o, RenameOutcome::default());
        // The cut-over onto another mapping's name: refused, nothing changed.
        let e = n.rename_statement(&m, &pairs(&[("shop.items", "shop.items_old"), ("shop.items_new", "shop.items")])).unwrap_err();
        assert_eq!(
            e,
            RenameConflict {
                mapping: "shop.items_new".into(),
                table: "shop.items_new".into(),
                onto: "shop.items".into(),
                other: "shop.items".into()
            }
        );
        assert_eq!(n, TableNames::default());
        // With only one of them mapped, the cut-over keeps the mapping with the name.
        let m1 = mapper("");
        let o = n.rename_statement(&m1, &pairs(&[("shop.items", "shop.items_old"), ("shop.items_new", "shop.items")])).unwrap();
        assert_eq!((o.followed.len(), o.stale), (0, vec!["shop.items".to_string()]));
        assert_eq!(n.resolve(&m1, "shop.items_old"), None);
    }

    fn ch(key: &str, op: Op, payload: Option<&str>) -> KeyChange {
        KeyChange {
            key: key.into(),
            op,
            table: std::sync::Arc::from("db.t"),
            payload: payload.map(String::from),
            replicas: 1,
            count: 1,
            ttl_secs: 0,
        }
    }

    #[test]
    fn one_change_per_key_per_transaction_the_state_after_commit() {
        let mut v = vec![
            ch("a", Op::Insert, Some("1")),
            ch("b", Op::Update, Some("x")),
            ch("a", Op::Update, Some("2")),
            ch("c", Op::Update, Some("y")),
            ch("c", Op::Delete, None),
            ch("a", Op::Update, Some("3")),
        ];
        collapse_per_key(&mut v);
        let got: Vec<(&str, Op, Option<&str>)> = v.iter().map(|c| (c.key.as_str(), c.op, c.payload.as_deref())).collect();
        assert_eq!(got, vec![("b", Op::Update, Some("x")), ("c", Op::Delete, None), ("a", Op::Insert, Some("3"))]);
    }
}
