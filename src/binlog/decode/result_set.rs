//! Rows read with a SELECT (not from the binlog) in the same canonical JSON form the binlog
//! decoder gives, so a row read from the table now and the same row seen in a row event make
//! byte-identical payloads: `binval bootstrap` writes the one, `binval run` the other, and
//! `binval verify` compares them.
//!
//! The rows come through the binary protocol (a prepared statement): numbers, dates and times
//! arrive typed (mysql_common [`Value`]), as they do in row events, not as text to parse.
//! The connection must use `SET NAMES utf8mb4` (text arrives as UTF-8 whatever the column's
//! charset: the server converts, as binval's decoder does from the binlog's bytes) and
//! `time_zone = '+00:00'` (TIMESTAMP values arrive in UTC, as the binlog stores them). The
//! SELECT list must read MariaDB's UUID, INET6 and INET4 columns as
//! `CAST(c AS BINARY(16 | 16 | 4))`: the binlog carries their stored bytes, a SELECT their text
//! (see `scan::table`).
//!
//! Per type (the rules of `schemas/README.md`), by the result set's column metadata:
//! integers exact (YEAR a number), DECIMAL as sent (the server sends the declared scale),
//! FLOAT/DOUBLE as the binlog decoder prints them, DATE/DATETIME/TIME as MySQL's text with the
//! column's fraction digits (`decimals`), TIMESTAMP as a UTC instant (the zero timestamp as
//! `0000-00-00 00:00:00`), BIT as a number, ENUM as its label, SET as the list of its labels,
//! GEOMETRY as `{srid, wkb}`, MySQL JSON as the document, binary strings (charset 63) as
//! base64, other strings as text.

use base64::Engine as _;
use mysql_common::constants::{ColumnFlags, ColumnType};
use mysql_common::packets::Column;
use mysql_common::value::Value;
use serde_json::{Number, Value as Json};

use super::values::{bit_json, datetime_text, f32_json, geometry_json, instant_text, pad_scale, time_text, zero_timestamp};
use super::DecodeError;

/// Collation id of the `binary` character set.
const BINARY: u16 = 63;

/// Convert one value of result-set column `col` of table `table` to its canonical JSON form
/// (module docs). Errors name the table and column: a type binval has no rule for, or text
/// that is not UTF-8 (a connection without `SET NAMES utf8mb4`).
pub fn column_value_to_json(table: &str, col: &Column, v: Value) -> Result<Json, DecodeError> {
    use ColumnType::*;
    let unsupported = || DecodeError::UnsupportedType { table: table.into(), column: col.name_str().into_owned(), ty: col.column_type() };
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
fn text(table: &str, col: &Column, b: Vec<u8>) -> Result<String, DecodeError> {
    String::from_utf8(b).map_err(|_| DecodeError::BadText {
        table: table.into(),
        column: col.name_str().into_owned(),
        charset: "utf8mb4".into(),
    })
}
