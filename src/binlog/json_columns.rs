//! MariaDB JSON columns, known at each place in the binlog.
//!
//! MariaDB's `JSON` type is `LONGTEXT` (collation `utf8mb4_bin`) with a column check constraint
//! ``json_valid(`col`)`` (MariaDB docs, "JSON Data Type"); the binlog carries its values as
//! text and the TABLE_MAP does not mark the column. binval puts such a value into the payload
//! as the document itself, so it must know which columns are JSON **as of each row event**, or
//! the payload's shape would depend on when binval happened to start (a table created after
//! start, a column added later, a restart after an `ALTER`).
//!
//! # How
//!
//! * The schema says which columns have the check ([`JsonColumns::load_table`]: information
//!   schema `CHECK_CONSTRAINTS` joined with `COLUMNS`), with each column's data type and
//!   collation.
//! * The reader keeps that per mapped table (by its live `schema.table`), read when its replica
//!   connection opens, and **again after every DDL statement that names a mapped table**
//!   (CREATE, ALTER, RENAME, ...), before it handles the next event: rows before the DDL are
//!   prepared with the old knowledge, rows after it with the new. The query takes a few
//!   milliseconds and DDL is rare, so the stream is not held up.
//! * At each TABLE_MAP of a mapped table, a column is JSON when the schema listed it *and* the
//!   TABLE_MAP shows it with the same data type and collation ([`JsonColumns::for_table_map`]).
//!   The TABLE_MAP is what the row was written with: a column added later, or changed from
//!   `LONGTEXT` to `JSON` later (`MODIFY t JSON` also changes its collation), is not taken for
//!   JSON in rows written before.
//! * The knowledge moves with the transactions and is saved in the checkpoint
//!   (`json_columns`), so a restart continues with exactly what the stopped process knew at
//!   the checkpoint, not with what the schema says when it restarts.
//!
//! What remains: the schema is read when binval reads a DDL, not as of the DDL's time. When
//! binval is behind by several DDLs on one table, or starts without a checkpoint from before a
//! DDL (a first `FILE:POS` start, `binval replay`), the rows in between get what the schema
//! says later, unless the TABLE_MAP tells them apart (a column whose type or collation differs
//! from the schema's is never JSON): only a `json_valid` check added or dropped alone (on a
//! `utf8mb4_bin` LONGTEXT) is not seen there. A mapping that lists `json_columns` needs none of
//! this.

use std::collections::BTreeMap;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use mysql_common::constants::ColumnType;
use serde::{Deserialize, Serialize};

use crate::binlog::decode::{ColumnSchema, TableSchema};
use crate::error::{classify_mysql, Error};

/// One MariaDB JSON column as the schema describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JsonColumn {
    /// Column name.
    pub name: String,
    /// `information_schema.COLUMNS.DATA_TYPE`: `longtext` for the JSON type (`text`,
    /// `mediumtext`, `tinytext`, `varchar`, `char` for a check constraint on those).
    pub data_type: String,
    /// Collation id (`information_schema.COLLATIONS.ID`; `utf8mb4_bin` = 46 for the JSON type).
    pub collation: u16,
}

/// JSON columns per mapped table (live `schema.table`), as of one place in the binlog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonColumns(pub BTreeMap<String, Vec<JsonColumn>>);

impl JsonColumns {
    /// The JSON columns of `table` (`schema.table`) in the schema now.
    ///
    /// Errors: the query failed (transient for connection errors, see [`classify_mysql`]).
    pub async fn load_table(conn: &mut Conn, table: &str) -> Result<Vec<JsonColumn>, Error> {
        let (schema, name) = table.split_once('.').unwrap_or(("", table));
        let rows: Vec<(String, String, String, Option<u64>)> = conn
            .exec(
                "SELECT c.COLUMN_NAME, c.DATA_TYPE, k.CHECK_CLAUSE, co.ID \
                 FROM information_schema.CHECK_CONSTRAINTS k \
                 JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = k.CONSTRAINT_SCHEMA AND c.TABLE_NAME = k.TABLE_NAME AND c.COLUMN_NAME = k.CONSTRAINT_NAME \
                 LEFT JOIN information_schema.COLLATIONS co ON co.COLLATION_NAME = c.COLLATION_NAME \
                 WHERE k.CONSTRAINT_SCHEMA = ? AND k.TABLE_NAME = ? AND k.CHECK_CLAUSE LIKE 'json_valid(%'",
                (schema, name),
            )
            .await
            .map_err(|e| classify_mysql(e, "information_schema.CHECK_CONSTRAINTS"))?;
        let mut out: Vec<JsonColumn> = rows
            .into_iter()
            .filter(|(col, _, clause, _)| *clause == format!("json_valid(`{col}`)"))
            .map(|(name, data_type, _, id)| JsonColumn {
                name,
                data_type: data_type.to_ascii_lowercase(),
                collation: id.unwrap_or(0) as u16,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Read the JSON columns of each of `tables` now, replacing what is known of them.
    pub async fn load(&mut self, conn: &mut Conn, tables: impl IntoIterator<Item = String>) -> Result<(), Error> {
        for t in tables {
            let cols = Self::load_table(conn, &t).await?;
            self.0.insert(t, cols);
        }
        Ok(())
    }

    /// The JSON columns of the rows of one TABLE_MAP of `table` (its live `schema.table`): those
    /// the schema listed whose TABLE_MAP column has the same data type and collation (module
    /// docs). Empty when none.
    pub fn for_table_map(&self, table: &str, schema: &TableSchema) -> Arc<[String]> {
        let Some(cols) = self.0.get(table) else { return Arc::from(Vec::new()) };
        let matching: Vec<String> =
            cols.iter().filter(|j| schema.columns.iter().any(|c| *c.name == *j.name && same_shape(c, j))).map(|j| j.name.clone()).collect();
        Arc::from(matching)
    }
}

/// The TABLE_MAP column `c` has the data type and collation the schema gave `j`.
fn same_shape(c: &ColumnSchema, j: &JsonColumn) -> bool {
    use ColumnType::*;
    let ty = match (c.ty, c.meta.first()) {
        (MYSQL_TYPE_BLOB, Some(4)) => "longtext",
        (MYSQL_TYPE_BLOB, Some(3)) => "mediumtext",
        (MYSQL_TYPE_BLOB, Some(2)) => "text",
        (MYSQL_TYPE_BLOB, Some(1)) => "tinytext",
        (MYSQL_TYPE_VARCHAR | MYSQL_TYPE_VAR_STRING, _) => "varchar",
        (MYSQL_TYPE_STRING, _) => "char",
        _ => return false,
    };
    ty == j.data_type && (j.collation == 0 || c.charset == j.collation)
}
