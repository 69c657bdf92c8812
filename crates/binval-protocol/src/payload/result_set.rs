//! Rows read with a SELECT (not from the binlog) in the canonical JSON form the binlog decoder
//! gives, so a row read from the table now and the same row seen in a row event make
//! byte-identical payloads: `binval bootstrap` writes the one, `binval run` the other, `binval
//! verify` compares them, and an app's loader ([`row_payload`]) answers a fill with the same
//! bytes binval would have written.
//!
//! # What the query must do
//!
//! The rows must come through the binary protocol (a prepared statement, e.g. mysql_async's
//! `exec_*`): numbers, dates and times then arrive typed (mysql_common `Value`), as they do in
//! row events, not as text to parse. The connection must use `SET NAMES utf8mb4` (text arrives
//! as UTF-8 whatever the column's charset) and `SET time_zone = '+00:00'` (TIMESTAMP values
//! arrive in UTC, as the binlog stores them). MariaDB's UUID, INET6 and INET4 columns must be
//! selected as `CAST(c AS BINARY(16))` (`BINARY(4)` for INET4) under their own name: the binlog
//! carries their stored bytes, a plain SELECT their text. Select every column of the table (or
//! at least the mapping's `payload` columns), and leave out MariaDB's hidden
//! `DB_ROW_HASH_*` columns (binval leaves them out of payloads).
//!
//! # Per type
//!
//! By the result set's column metadata (the rules of `schemas/README.md`): integers exact
//! (YEAR a number), DECIMAL as sent (the server sends the declared scale), FLOAT/DOUBLE as the
//! binlog decoder prints them, DATE/DATETIME/TIME as MySQL's text with the column's fraction
//! digits (`decimals`), TIMESTAMP as a UTC instant (the zero timestamp as
//! `0000-00-00 00:00:00`), BIT as a number, ENUM as its label, SET as the list of its labels,
//! GEOMETRY as `{srid, wkb}`, MySQL JSON as the document, binary strings (charset 63) as base64,
//! other strings as text.

use base64::Engine as _;
use mysql_common::constants::{ColumnFlags, ColumnType};
use mysql_common::packets::Column;
use mysql_common::value::Value;
use serde_json::{Map, Number, Value as Json};

use super::text::{bit_json, datetime_text, f32_json, geometry_json, instant_text, pad_scale, time_text, zero_timestamp};

/// Collation id of the `binary` character set.
const BINARY: u16 = 63;

/// Why a value has no canonical JSON form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// A column type binval has no rule for (or a value of it that does not parse).
    #[error("{table}.{column}: a {ty} value binval has no payload rule for")]
    UnsupportedType {
        /// `schema.table` as the caller named it.
        table: String,
        /// The column.
        column: String,
        /// The column type, as mysql_common names it.
        ty: String,
    },
    /// Text that is not UTF-8: the connection lacks `SET NAMES utf8mb4`.
    #[error("{table}.{column}: text that is not UTF-8 (the connection needs SET NAMES utf8mb4)")]
    NotUtf8 {
        /// `schema.table` as the caller named it.
        table: String,
        /// The column.
        column: String,
    },
}

/// One value of result-set column `col` of table `table` in its canonical JSON form (module
/// docs). Errors name the table and column.
pub fn column_value_to_json(table: &str, col: &Column, v: Value) -> Result<Json, PayloadError> {
    use ColumnType::*;
    let unsupported = || PayloadError::UnsupportedType {
        table: table.into(),
        column: col.name_str().into_owned(),
        ty: format!("{:?}", col.column_type()),
    };
    let fsp = col.decimals().min(6);
    Ok(match v {
        Value::NULL => Json::Null,
        Value::Int(i) => Json::from(i),
        Value::UInt(u) => Json::from(u),
        Value::Float(f) => f32_json(f),
        Value::Double(d) => Number::from_f64(d).map(Json::Number).unwrap_or(Json::Null),
        Value::Date(y, mo, d, h, mi, s, us) => match col.column_type() {
            MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => Json::String(datetime_text((y, mo, d), None)),
            MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 if (y, mo, d, h, mi, s, us) == (0, 0, 0, 0, 0, 0, 0) => {
                Json::String(zero_timestamp(fsp))
            }
            MYSQL_TYPE_TIMESTAMP | MYSQL_TYPE_TIMESTAMP2 => Json::String(instant_text(
                (i64::from(y), u32::from(mo), u32::from(d)),
                (i64::from(h), i64::from(mi), i64::from(s)),
                us,
                fsp,
            )),
            _ => Json::String(datetime_text((y, mo, d), Some(((h, mi, s, us), fsp)))),
        },
        Value::Time(neg, days, h, mi, s, us) => Json::String(time_text(neg, days, (h, mi, s, us), fsp)),
        Value::Bytes(b) => match col.column_type() {
            MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
                Json::String(pad_scale(String::from_utf8(b).map_err(|_| unsupported())?, usize::from(col.decimals())))
            }
            MYSQL_TYPE_BIT => bit_json(&b),
            MYSQL_TYPE_GEOMETRY => geometry_json(&b).ok_or_else(unsupported)?,
            MYSQL_TYPE_JSON => {
                let s = text(table, col, b)?;
                serde_json::from_str(&s).unwrap_or(Json::String(s))
            }
            MYSQL_TYPE_YEAR => Json::from(std::str::from_utf8(&b).ok().and_then(|s| s.parse::<i64>().ok()).ok_or_else(unsupported)?),
            _ if col.flags().contains(ColumnFlags::SET_FLAG) => {
                let s = text(table, col, b)?;
                Json::Array(if s.is_empty() { Vec::new() } else { s.split(',').map(|l| Json::String(l.to_string())).collect() })
            }
            _ if col.character_set() == BINARY => Json::String(base64::engine::general_purpose::STANDARD.encode(b)),
            _ => Json::String(text(table, col, b)?),
        },
    })
}

/// Text of a non-binary column, which the connection receives as UTF-8.
fn text(table: &str, col: &Column, b: Vec<u8>) -> Result<String, PayloadError> {
    String::from_utf8(b).map_err(|_| PayloadError::NotUtf8 { table: table.into(), column: col.name_str().into_owned() })
}

/// The payload binval writes for a row read with a SELECT (module docs, "What the query must
/// do"): `columns` and `values` of the result-set row in the same order, `payload` the
/// mapping's `payload` list (`None`: the whole row), `json_columns` the text columns holding
/// JSON documents (MariaDB's JSON type; binval detects them from the `json_valid` check, or
/// the mapping lists them). What a loader returns for a key, so a fill from the database caches
/// the same bytes a fill from a replica would.
///
/// With mysql_async (not a dependency of this crate, hence not compiled here):
///
/// ```ignore
/// # async fn load(pool: mysql_async::Pool, id: u64) -> Result<Option<String>, Box<dyn std::error::Error>> {
/// use mysql_async::prelude::*;
/// let mut conn = pool.get_conn().await?;
/// conn.query_drop("SET NAMES utf8mb4, time_zone = '+00:00'").await?;
/// let row: Option<mysql_async::Row> = conn.exec_first("SELECT * FROM shop.items WHERE id = ?", (id,)).await?;
/// let Some(row) = row else { return Ok(None) };
/// let columns = row.columns();
/// let values = row.unwrap();
/// Ok(Some(binval_protocol::payload::result_set::row_payload("shop.items", &columns, values, None, &[])?))
/// # }
/// ```
pub fn row_payload(
    table: &str,
    columns: &[Column],
    values: Vec<Value>,
    payload: Option<&[String]>,
    json_columns: &[String],
) -> Result<String, PayloadError> {
    let mut row = Map::new();
    for (col, v) in columns.iter().zip(values) {
        let name = col.name_str();
        if name.starts_with("DB_ROW_HASH_") {
            continue;
        }
        row.insert(name.into_owned(), column_value_to_json(table, col, v)?);
    }
    Ok(super::render(&row, payload, json_columns).text)
}
