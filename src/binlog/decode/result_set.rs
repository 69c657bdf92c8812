//! Rows read with a SELECT (not from the binlog) in the canonical JSON form the binlog decoder
//! gives: `binval_protocol::payload::result_set` holds the rules (and what the query must do),
//! shared with app loaders; this wraps its errors as [`DecodeError`]s.

use mysql_common::packets::Column;
use mysql_common::value::Value;
use serde_json::Value as Json;

use super::DecodeError;
use binval_protocol::payload::result_set::PayloadError;

/// Convert one value of result-set column `col` of table `table` to its canonical JSON form
/// (`binval_protocol::payload::result_set`, shared with app loaders). Errors name the table
/// and column: a type binval has no rule for, or text that is not UTF-8 (a connection without
/// `SET NAMES utf8mb4`).
pub fn column_value_to_json(table: &str, col: &Column, v: Value) -> Result<Json, DecodeError> {
    binval_protocol::payload::result_set::column_value_to_json(table, col, v).map_err(|e| match e {
        PayloadError::UnsupportedType { table, column, .. } => DecodeError::UnsupportedType { table, column, ty: col.column_type() },
        PayloadError::NotUtf8 { table, column } => DecodeError::BadText { table, column, charset: "utf8mb4".into() },
    })
}
