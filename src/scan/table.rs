//! A mapped table as a table scan reads it: its columns (as the binlog carries them), the key it
//! is scanned in order of, and the queries: chunks in key order (keyset pagination, never
//! OFFSET), rows by key, rows by the columns of a key template.
//!
//! * Columns: every column of `information_schema.COLUMNS`, in table order, INVISIBLE ones
//!   included (`SELECT *` leaves them out, row images carry them); MariaDB's hidden long-UNIQUE
//!   hash columns are not listed there and not in payloads either. UUID, INET6 and INET4 are
//!   read as their stored bytes (`CAST(c AS BINARY(n))`), as the binlog carries them.
//! * Key: the PRIMARY KEY, else the first UNIQUE key of NOT NULL columns without prefix parts
//!   (what InnoDB clusters such a table by). A table with neither is refused, naming it: a scan
//!   in key order is what makes chunks resumable and bounded.
//! * A chunk after key `k1..kn` = `(v1..vn)`: `WHERE k1 > v1 OR (k1 = v1 AND k2 > v2) OR ...`
//!   (each branch an index range; MariaDB does not use an index for a row-constructor
//!   comparison `(k1, k2) > (v1, v2)` everywhere), `ORDER BY k1..kn LIMIT n`.

use binval_protocol::KeyTemplate;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Row, Value};
use serde::{Deserialize, Serialize};

use crate::binlog::decode::{column_value_to_json, Row as JsonRow};
use crate::binlog::server::UniqueKey;
use crate::error::{classify_mysql, DefiniteError, Error};

/// A table's columns and scan key (module docs).
#[derive(Debug, Clone)]
pub struct TableLayout {
    /// `schema.table`.
    pub table: String,
    /// Column names in table order.
    pub columns: Vec<String>,
    /// The scan key's columns, in index order.
    pub key: Vec<String>,
    /// `PRIMARY KEY` or `UNIQUE KEY name`.
    pub key_name: String,
    /// Every unique key of the table (for [`crate::binlog::server::judge_key_templates`]).
    pub unique: Vec<UniqueKey>,
    /// `` `schema`.`table` ``.
    from: String,
    /// The SELECT list: every column, then the key columns as stored (for the next chunk).
    select: String,
}

/// One row read: its canonical JSON image and its key's values as the server sent them.
#[derive(Debug, Clone)]
pub struct ScannedRow {
    /// Column name -> canonical JSON value (the form row events decode to).
    pub row: JsonRow,
    /// The scan key's values, in key order.
    pub key: Vec<Value>,
}

/// A key value kept between runs (bootstrap progress): a mysql value with its type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyValue {
    /// NULL (never in a key; kept for completeness).
    Null,
    /// Signed integer.
    Int(i64),
    /// Unsigned integer.
    UInt(u64),
    /// FLOAT.
    Float(f32),
    /// DOUBLE.
    Double(f64),
    /// Bytes, base64.
    Bytes(String),
    /// DATE/DATETIME/TIMESTAMP: year, month, day, hour, minute, second, µs.
    Date(u16, u8, u8, u8, u8, u8, u32),
    /// TIME: negative, days, hours, minutes, seconds, µs.
    Time(bool, u32, u8, u8, u8, u32),
}

impl KeyValue {
    /// From a value as the server sent it.
    pub fn from_value(v: &Value) -> Self {
        use base64::Engine as _;
        match v.clone() {
            Value::NULL => KeyValue::Null,
            Value::Int(i) => KeyValue::Int(i),
            Value::UInt(u) => KeyValue::UInt(u),
            Value::Float(f) => KeyValue::Float(f),
            Value::Double(d) => KeyValue::Double(d),
            Value::Bytes(b) => KeyValue::Bytes(base64::engine::general_purpose::STANDARD.encode(b)),
            Value::Date(y, mo, d, h, mi, s, us) => KeyValue::Date(y, mo, d, h, mi, s, us),
            Value::Time(n, d, h, mi, s, us) => KeyValue::Time(n, d, h, mi, s, us),
        }
    }

    /// Back to a value to bind. A `Bytes` that is not base64 becomes NULL (it was not written
    /// by binval).
    pub fn to_value(&self) -> Value {
        use base64::Engine as _;
        match self.clone() {
            KeyValue::Null => Value::NULL,
            KeyValue::Int(i) => Value::Int(i),
            KeyValue::UInt(u) => Value::UInt(u),
            KeyValue::Float(f) => Value::Float(f),
            KeyValue::Double(d) => Value::Double(d),
            KeyValue::Bytes(b) => base64::engine::general_purpose::STANDARD.decode(b).map(Value::Bytes).unwrap_or(Value::NULL),
            KeyValue::Date(y, mo, d, h, mi, s, us) => Value::Date(y, mo, d, h, mi, s, us),
            KeyValue::Time(n, d, h, mi, s, us) => Value::Time(n, d, h, mi, s, us),
        }
    }
}

/// What a chunk reads.
#[derive(Debug, Clone, Default)]
pub struct ChunkQuery<'a> {
    /// Rows after this key (exclusive); `None` = from the start.
    pub after: Option<&'a [Value]>,
    /// An operator's SQL condition (`--where`), ANDed.
    pub filter: Option<&'a str>,
    /// Keep each row with this probability (`verify --sample`), by `RAND()` on the server.
    pub sample: Option<f64>,
    /// At most this many rows.
    pub limit: usize,
}

impl TableLayout {
    /// Read the layout of `table` (`schema.table`) from `information_schema`.
    ///
    /// Errors ([`DefiniteError::Scan`], naming the table): it does not exist (or the user
    /// cannot see it), it has no usable key.
    pub async fn read(conn: &mut Conn, table: &str) -> Result<Self, Error> {
        let fail = |message: String| -> Error { DefiniteError::Scan { table: table.to_string(), message }.into() };
        let (schema, name) = table.split_once('.').ok_or_else(|| fail("not a schema.table name".into()))?;
        let cols: Vec<(String, String)> = conn
            .exec(
                "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (schema, name),
            )
            .await
            .map_err(|e| classify_mysql(e, "information_schema.COLUMNS"))?;
        if cols.is_empty() {
            return Err(fail("does not exist on the source (or the binval user cannot see it)".into()));
        }
        let unique = crate::binlog::server::unique_keys(conn, table).await?;
        let (key_name, key) = scan_key(&unique).ok_or_else(|| {
            fail("has no PRIMARY KEY (nor a UNIQUE key of NOT NULL columns): a table scan reads rows in key order, chunk by chunk; add a primary key".into())
        })?;
        let mut select: Vec<String> = cols
            .iter()
            .map(|(c, ty)| match ty.to_ascii_lowercase().as_str() {
                "uuid" | "inet6" => format!("CAST({q} AS BINARY(16)) AS {q}", q = quote(c)),
                "inet4" => format!("CAST({q} AS BINARY(4)) AS {q}", q = quote(c)),
                _ => quote(c),
            })
            .collect();
        select.extend(key.iter().map(|k| quote(k)));
        Ok(TableLayout {
            table: table.to_string(),
            columns: cols.into_iter().map(|(c, _)| c).collect(),
            key,
            key_name,
            unique,
            from: format!("{}.{}", quote(schema), quote(name)),
            select: select.join(", "),
        })
    }

    /// The next chunk of rows in key order (see [`ChunkQuery`]).
    ///
    /// Errors: what the server refuses (a `--where` it cannot run: definite, naming the
    /// table and the message), connection failures (transient), values binval cannot convert.
    pub async fn chunk(&self, conn: &mut Conn, q: &ChunkQuery<'_>) -> Result<Vec<ScannedRow>, Error> {
        let mut conds = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        if let Some(after) = q.after {
            conds.push(self.after_condition(after, &mut params));
        }
        if let Some(f) = q.filter {
            conds.push(format!("({f})"));
        }
        if let Some(p) = q.sample {
            conds.push("RAND() < ?".into());
            params.push(Value::Double(p));
        }
        let order: Vec<String> = self.key.iter().map(|k| quote(k)).collect();
        let sql = format!(
            "SELECT {} FROM {}{} ORDER BY {} LIMIT {}",
            self.select,
            self.from,
            if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) },
            order.join(", "),
            q.limit.max(1)
        );
        self.query(conn, &sql, params).await
    }

    /// The rows whose scan key is one of `keys` (in no particular order; missing ones are not
    /// there).
    pub async fn by_keys(&self, conn: &mut Conn, keys: &[Vec<Value>]) -> Result<Vec<ScannedRow>, Error> {
        let mut out = Vec::with_capacity(keys.len());
        for batch in keys.chunks(256) {
            let mut params = Vec::with_capacity(batch.len() * self.key.len());
            let one: Vec<String> = self.key.iter().map(|k| format!("{} = ?", quote(k))).collect();
            let one = format!("({})", one.join(" AND "));
            let conds: Vec<&str> = batch.iter().map(|_| one.as_str()).collect();
            for k in batch {
                params.extend(k.iter().cloned());
            }
            let sql = format!("SELECT {} FROM {} WHERE {}", self.select, self.from, conds.join(" OR "));
            out.extend(self.query(conn, &sql, params).await?);
        }
        Ok(out)
    }

    /// The rows whose columns hold the texts a key of `template` was rendered from
    /// ([`KeyTemplate::split_key`]): `(column, text)` pairs, compared by the server's rules
    /// (a number column equals the text of the number). At most `limit` rows.
    pub async fn by_columns(&self, conn: &mut Conn, values: &[(&str, &str)], limit: usize) -> Result<Vec<ScannedRow>, Error> {
        let conds: Vec<String> = values.iter().map(|(c, _)| format!("{} = ?", quote(c))).collect();
        let params: Vec<Value> = values.iter().map(|(_, v)| Value::Bytes(v.as_bytes().to_vec())).collect();
        let sql = format!("SELECT {} FROM {} WHERE {} LIMIT {}", self.select, self.from, conds.join(" AND "), limit.max(1));
        self.query(conn, &sql, params).await
    }

    /// The server's estimate of the table's rows (`information_schema.TABLES.TABLE_ROWS`), for
    /// progress: cheap, not exact.
    pub async fn estimated_rows(&self, conn: &mut Conn) -> Result<u64, Error> {
        let (schema, name) = self.table.split_once('.').unwrap_or(("", &self.table));
        let n: Option<Option<u64>> = conn
            .exec_first("SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", (schema, name))
            .await
            .map_err(|e| classify_mysql(e, "information_schema.TABLES"))?;
        Ok(n.flatten().unwrap_or(0))
    }

    /// `k1 > ? OR (k1 = ? AND k2 > ?) OR ...` with its parameters appended to `params`.
    fn after_condition(&self, after: &[Value], params: &mut Vec<Value>) -> String {
        let mut branches = Vec::with_capacity(self.key.len());
        for i in 0..self.key.len() {
            let mut parts: Vec<String> = Vec::with_capacity(i + 1);
            for (j, k) in self.key.iter().enumerate().take(i) {
                parts.push(format!("{} = ?", quote(k)));
                params.push(after[j].clone());
            }
            parts.push(format!("{} > ?", quote(&self.key[i])));
            params.push(after[i].clone());
            branches.push(format!("({})", parts.join(" AND ")));
        }
        format!("({})", branches.join(" OR "))
    }

    async fn query(&self, conn: &mut Conn, sql: &str, params: Vec<Value>) -> Result<Vec<ScannedRow>, Error> {
        let params = if params.is_empty() { Params::Empty } else { Params::Positional(params) };
        let rows: Vec<Row> = conn.exec(sql, params).await.map_err(|e| self.query_error(e))?;
        rows.into_iter().map(|r| self.convert(r)).collect()
    }

    /// A row of the SELECT list: the columns, then the key as stored.
    fn convert(&self, mut r: Row) -> Result<ScannedRow, Error> {
        let n = self.columns.len();
        let cols = r.columns();
        let mut row = JsonRow::new();
        for (i, name) in self.columns.iter().enumerate() {
            let v = r.take::<Value, _>(i).unwrap_or(Value::NULL);
            let json = column_value_to_json(&self.table, &cols[i], v)
                .map_err(|e| DefiniteError::Scan { table: self.table.clone(), message: e.to_string() })?;
            row.insert(name.clone(), json);
        }
        let key = (n..n + self.key.len()).map(|i| r.take::<Value, _>(i).unwrap_or(Value::NULL)).collect();
        Ok(ScannedRow { row, key })
    }

    /// A query the server refuses for a reason about the query (syntax, unknown column,
    /// privileges) is definite, naming the table; anything else is classified as usual.
    fn query_error(&self, e: mysql_async::Error) -> Error {
        if let mysql_async::Error::Server(se) = &e {
            // Lock waits, deadlocks, shutdown, a killed query or connection: worth a retry.
            if se.code < 2000 && ![1205, 1213, 1040, 1053, 1317, 1927, 1969].contains(&se.code) {
                return DefiniteError::Scan {
                    table: self.table.clone(),
                    message: format!("the source refused the query: {} ({})", se.message, se.code),
                }
                .into();
            }
        }
        classify_mysql(e, &self.table)
    }

    /// The key columns a template uses that are all in this table (for reverse lookups).
    pub fn has_columns(&self, template: &KeyTemplate) -> bool {
        template.columns().all(|c| self.columns.iter().any(|x| x == c))
    }
}

/// The PRIMARY KEY, else the first UNIQUE key of NOT NULL columns without prefix parts, of
/// `unique` (from [`crate::binlog::server::unique_keys`]): keyset pagination needs whole,
/// non-NULL values to order by.
fn scan_key(unique: &[UniqueKey]) -> Option<(String, Vec<String>)> {
    unique.iter().find(|k| !k.nullable && !k.prefix).map(|k| (k.name.clone(), k.columns.clone()))
}

/// `` `name` `` with backticks doubled.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binlog::server::{unique_keys_of, IndexPart};

    fn stat(idx: &str, non_unique: u64, col: &str, seq: u64, nullable: &str, sub: Option<u64>) -> IndexPart {
        (idx.into(), non_unique, col.into(), seq, nullable.into(), sub)
    }

    fn scan_key(stats: &[IndexPart]) -> Option<(String, Vec<String>)> {
        super::scan_key(&unique_keys_of(stats))
    }

    #[test]
    fn the_scan_key_is_the_primary_key_else_a_unique_not_null_key() {
        let pk = vec![stat("PRIMARY", 0, "a", 1, "", None), stat("PRIMARY", 0, "b", 2, "", None), stat("u", 0, "c", 1, "", None)];
        assert_eq!(scan_key(&pk), Some(("PRIMARY KEY".into(), vec!["a".into(), "b".into()])));
        let unique = vec![stat("by_name", 1, "n", 1, "", None), stat("nullable", 0, "x", 1, "YES", None), stat("u", 0, "c", 1, "", None)];
        assert_eq!(scan_key(&unique), Some(("UNIQUE KEY u".into(), vec!["c".into()])));
        assert_eq!(scan_key(&[stat("p", 0, "t", 1, "", Some(10))]), None, "a prefix key does not order whole values");
        assert_eq!(scan_key(&[]), None);
    }

    #[test]
    fn key_values_round_trip() {
        for v in [
            Value::Int(-5),
            Value::UInt(7),
            Value::Bytes(vec![0, 255, 1]),
            Value::Date(2024, 1, 2, 3, 4, 5, 6),
            Value::Time(true, 1, 2, 3, 4, 5),
        ] {
            let kv = KeyValue::from_value(&v);
            let back: KeyValue = serde_json::from_str(&serde_json::to_string(&kv).unwrap()).unwrap();
            assert_eq!(back.to_value(), v);
        }
        assert_eq!(quote("a`b"), "`a``b`");
    }
}
