//! Table scans: the mapped tables read as they are now, in consistent snapshots whose binlog
//! position is known, turned into the same key changes the binlog path makes. What
//! `binval bootstrap` writes, `binval verify` compares and `binval inspect` shows.
//!
//! | file | concern |
//! |---|---|
//! | [`snapshot`] | consistent snapshots and their binlog position / GTID -> fence position |
//! | [`table`] | a table's columns and scan key; chunks in key order, rows by key, rows by key-template columns |
//! | [`keyspace`] | keys in Redis back to their mapping and template; every key of a template by `SCAN` |
//!
//! A scanned row goes through the mapping rules as an INSERT of its current image
//! ([`Mapper::map_row`]), so its keys and payloads are byte for byte those `binval run` writes
//! for the same row from its row event (the values by `binlog::decode::result_set`, the
//! MariaDB JSON columns as detected on the source now: [`Mapper::with_detected_json`]).

pub mod keyspace;
pub mod snapshot;
pub mod table;

use std::sync::Arc;

use binval_protocol::Op;

use crate::binlog::decode::{RowChange, RowKind};
use crate::binlog::server;
use crate::binlog::txn::Transaction;
use crate::config::{Config, MappingConfig};
use crate::error::{DefiniteError, Error};
use crate::mapping::{KeyChange, Mapper, TableNames};
use crate::write::fence::FenceRule;
use crate::write::group::Group;
use snapshot::{SnapshotConn, SnapshotPosition};
use table::{ScannedRow, TableLayout};

/// One mapped table to scan.
pub struct ScanTable {
    /// Its mapping.
    pub mapping: MappingConfig,
    /// The configured `schema.table` (the mapping rules' name for it).
    pub table: Arc<str>,
    /// The table as the source has it now (under its current name when a RENAME was followed).
    pub layout: TableLayout,
}

/// The source side of a table scan: a snapshot connection, the mapping rules and the tables.
pub struct Scanner {
    /// The connection rows are read on.
    pub snap: SnapshotConn,
    /// The mapping rules, with MariaDB JSON columns detected now.
    pub mapper: Arc<Mapper>,
    /// The tables, in the order of `mappings`.
    pub tables: Vec<ScanTable>,
    /// How fence positions are derived on this source.
    pub fence: FenceRule,
}

impl Scanner {
    /// Check the source (`binlog::server::preflight`), resolve the fence rule, detect MariaDB
    /// JSON columns and read the layout of each mapping's table: under its current name when
    /// `renamed` (the checkpoint's followed RENAMEs) says it moved.
    ///
    /// Errors: the source's settings (as `binval run` refuses them), a table that does not
    /// exist, was renamed away, or has no usable key ([`DefiniteError::Scan`]), a key template
    /// that does not identify a row ([`DefiniteError::KeysNotUnique`]), connection failures.
    pub async fn open(cfg: &Config, mappings: &[MappingConfig], renamed: &TableNames) -> Result<Self, Error> {
        let mut conn = server::connect(&cfg.source).await?;
        let info = server::preflight(&mut conn).await?;
        let fence = FenceRule::resolve(&cfg.source, info.mariadb);
        let mut tables = Vec::with_capacity(mappings.len());
        for m in mappings {
            let live = renamed.live_name(&m.table).ok_or_else(|| DefiniteError::Scan {
                table: m.table.clone(),
                message: "was renamed away (the checkpoint's followed RENAMEs say no table is under this mapping now)".into(),
            })?;
            let layout = TableLayout::read(&mut conn, &live).await?;
            // The mapping's keys as `binval run` judges them (a scan would write or compare
            // keys that two rows render, as the binlog path would).
            let index = cfg.mappings.iter().position(|c| c.table == m.table).unwrap_or_default();
            let templates: Vec<_> = m
                .keys
                .iter()
                .enumerate()
                .filter_map(|(k, key)| binval_protocol::KeyTemplate::parse(key).ok().filter(|t| layout.has_columns(t)).map(|t| (k, t)))
                .collect();
            let problems = server::judge_key_templates(index, &m.table, &templates, m.allow_non_unique_keys, &layout.unique);
            if !problems.is_empty() {
                return Err(DefiniteError::KeysNotUnique(problems.join("; ")).into());
            }
            tables.push(ScanTable { mapping: m.clone(), table: Arc::from(m.table.as_str()), layout });
        }
        let base = Arc::new(Mapper::new(mappings).map_err(|e| Error::config("mappings", e.to_string()))?);
        let mapper = if info.mariadb {
            let live: Vec<String> = tables.iter().map(|t| t.layout.table.clone()).collect();
            let found = server::mariadb_json_columns(&mut conn, &live).await?;
            let detected = tables.iter().filter_map(|t| found.get(&t.layout.table).map(|c| (t.table.to_string(), c.clone()))).collect();
            Mapper::with_detected_json(mappings, base, detected)
        } else {
            base
        };
        let _ = conn.disconnect().await;
        let snap = SnapshotConn::connect(&cfg.source, fence).await?;
        Ok(Scanner { snap, mapper, tables, fence })
    }

    /// The key changes of scanned rows of table `t`: each row as the INSERT of its image, its
    /// changes as `update`s (a bootstrap or repair refreshes a key; it does not create a row).
    pub fn key_changes(&self, t: usize, rows: &[ScannedRow], out: &mut Vec<KeyChange>) {
        for r in rows {
            self.row_keys(t, &r.row, out);
        }
    }

    /// The change that says "no row maps to `key`" (a delete) for table `t`.
    pub fn delete_change(&self, t: usize, key: &str) -> KeyChange {
        let m = &self.tables[t].mapping;
        let (replicas, count) = self.mapper.count_of(key, m.replicas);
        KeyChange {
            key: key.to_string(),
            op: Op::Delete,
            table: self.tables[t].table.clone(),
            payload: None,
            replicas,
            count,
            ttl_secs: m.ttl_secs,
        }
    }

    /// The key changes of one row image of table `t` (see [`Scanner::key_changes`]).
    pub fn row_keys(&self, t: usize, row: &crate::binlog::decode::Row, out: &mut Vec<KeyChange>) {
        let change = RowChange {
            table: self.tables[t].table.clone(),
            kind: RowKind::Insert,
            before: None,
            after: Some(row.clone()),
            event: 0,
            json_columns: None,
        };
        let from = out.len();
        self.mapper.map_row(&change, out);
        for c in &mut out[from..] {
            c.op = Op::Update;
        }
    }
}

/// `changes` as a group of one transaction at the snapshot's position, to be written through
/// [`crate::write::apply::Writer::apply_group`] (every change at the snapshot's fence position;
/// events, when published, carry the snapshot's binlog position and now as commit time).
pub fn snapshot_group(changes: Vec<KeyChange>, at: &SnapshotPosition) -> Group {
    let mut group = Group::new();
    group.tags = vec![(at.fence, 0); changes.len()];
    group.changes = changes;
    group.txns.push(Transaction { position: at.position.clone(), commit_time_ms: crate::now_ms(), ..Transaction::default() });
    group
}

/// The mappings of the `--table`s given (all when none); an unknown table is an error naming
/// `--table` and listing the mapped ones (exit code 2).
pub fn selected_mappings(cfg: &Config, tables: &[String]) -> Result<Vec<MappingConfig>, Error> {
    if tables.is_empty() {
        return Ok(cfg.mappings.clone());
    }
    for t in tables {
        if !cfg.mappings.iter().any(|m| &m.table == t) {
            let known: Vec<&str> = cfg.mappings.iter().map(|m| m.table.as_str()).collect();
            return Err(Error::config("--table", format!("`{t}` is not a mapped table (mapped: {})", known.join(", "))));
        }
    }
    Ok(cfg.mappings.iter().filter(|m| tables.contains(&m.table)).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_names_follow_the_checkpoints_renames() {
        let mut n = TableNames::default();
        assert_eq!(n.live_name("s.items").as_deref(), Some("s.items"));
        n.0.insert("s.goods".into(), Some("s.items".into()));
        n.0.insert("s.items".into(), None);
        assert_eq!(n.live_name("s.items").as_deref(), Some("s.goods"));
        n.0.remove("s.goods");
        assert_eq!(n.live_name("s.items"), None);
    }
}
