//! The payload a replica holds (field `d`): one row as canonical JSON, made the same way on
//! every path — from a row event (`binval run`), from a SELECT (`binval bootstrap`, `verify`),
//! and by an app's loader — so a value loaded from the database and one binval wrote are
//! byte-identical and a fill never caches a differently spelled copy.
//!
//! | module | what |
//! |---|---|
//! | [`text`] | the canonical text of DATE, DATETIME, TIME, TIMESTAMP, DECIMAL, BIT, FLOAT, GEOMETRY |
//! | [`render`] (this file) | a row (column -> JSON value) to the payload text: all columns or the mapping's `payload` list, JSON columns embedded as documents |
//! | `result_set` (feature `mysql`) | one value of a SELECT's result set (mysql_common `Column` + `Value`) to its canonical JSON, and [`row_payload`](result_set::row_payload) for a whole row: what a loader needs |
//!
//! The per-type rules are listed in `schemas/README.md`.

pub mod text;

#[cfg(feature = "mysql")]
pub mod result_set;

use serde_json::{Map, Value as Json};

/// A payload's text, and the JSON columns whose value was not a JSON document (kept as a
/// string; the caller logs them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The payload: a JSON object, keys sorted.
    pub text: String,
    /// Columns of `json_columns` whose text did not parse as JSON.
    pub not_json: Vec<String>,
}

/// The payload of `row` (column name -> canonical JSON value): the whole row, or only
/// `columns` (the mapping's `payload` list; a column the row lacks is left out), with the
/// string value of each of `json_columns` (MariaDB's JSON, stored as text) embedded as the
/// document itself, exactly as stored (numbers keep every digit and their scale).
///
/// ```
/// use binval_protocol::payload::render;
/// let row = serde_json::json!({"id": 7, "doc": "{\"a\": 1.50}", "t": "x"});
/// let r = render(row.as_object().unwrap(), None, &["doc".to_string()]);
/// assert_eq!(r.text, r#"{"doc":{"a": 1.50},"id":7,"t":"x"}"#);
/// let picked = render(row.as_object().unwrap(), Some(&["t".to_string()]), &[]);
/// assert_eq!(picked.text, r#"{"t":"x"}"#);
/// ```
pub fn render(row: &Map<String, Json>, columns: Option<&[String]>, json_columns: &[String]) -> Rendered {
    let picked;
    let m: &Map<String, Json> = match columns {
        None => row,
        Some(cols) => {
            let mut m = Map::new();
            for c in cols {
                if let Some(v) = row.get(c) {
                    m.insert(c.clone(), v.clone());
                }
            }
            picked = m;
            &picked
        }
    };
    let mut not_json = Vec::new();
    if json_columns.is_empty() {
        return Rendered { text: serde_json::to_string(m).expect("a row serializes"), not_json };
    }
    let mut out = String::with_capacity(256);
    out.push('{');
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(k).expect("a key serializes"));
        out.push(':');
        match v {
            Json::String(text) if json_columns.iter().any(|c| c == k) => match serde_json::from_str::<&serde_json::value::RawValue>(text) {
                Ok(raw) => out.push_str(raw.get()),
                Err(_) => {
                    not_json.push(k.clone());
                    out.push_str(&serde_json::to_string(v).expect("a value serializes"));
                }
            },
            _ => out.push_str(&serde_json::to_string(v).expect("a value serializes")),
        }
    }
    out.push('}');
    Rendered { text: out, not_json }
}
