//! Canonical JSON values (see `schemas/README.md`): integers exact, DECIMAL as an exact string
//! with its scale, DATE/DATETIME/TIME as MySQL's own text with exactly fsp fraction digits,
//! TIMESTAMP as a UTC instant, YEAR as a number, BIT as a number, ENUM as its label, SET as a
//! list of labels, text decoded from its charset, binary as base64, NULL as null.
//!
//! [`value_to_json`] dispatches on the value mysql_common parsed (integer, float, date, time,
//! bytes, binary JSON) and then on the column type; each type family has its own function.
//! Fixes for mysql_common (0.37) gaps live here: signed MEDIUMINT sign extension, BINARY(n)
//! trailing zero bytes, YEAR 0000.

use base64::Engine as _;
pub use binval_protocol::payload::text::utc_instant;
use binval_protocol::payload::text::{bit_json, datetime_text, f32_json, geometry_json, pad_scale, time_text};
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::value::Value;
use serde_json::{Number, Value as Json};

use super::{ColumnSchema, DecodeError};

/// Convert one binlog value of column `col` of table `table` to its canonical JSON form.
pub fn value_to_json(table: &str, col: &ColumnSchema, v: BinlogValue<'_>) -> Result<Json, DecodeError> {
    let v = match v {
        BinlogValue::Value(v) => v,
        BinlogValue::Jsonb(j) => {
            check_jsonb(&j).map_err(|e| DecodeError::Parse { table: table.into(), source: e })?;
            let dom = j.parse().map_err(|e| DecodeError::Parse { table: table.into(), source: e })?;
            return Ok(Json::from(dom));
        }
        BinlogValue::JsonDiff(_) => {
            return Err(DecodeError::PartialJson {
                table: table.into(),
                column: col.name.to_string(),
                detail: "a JSON diff has no value of its own (it applies to the before image)".into(),
            })
        }
    };
    Ok(match v {
        Value::NULL => Json::Null,
        Value::Int(i) => int_json(col, i),
        Value::UInt(u) => Json::from(u),
        Value::Float(f) => f32_json(f),
        Value::Double(d) => Number::from_f64(d).map(Json::Number).unwrap_or(Json::Null),
        Value::Date(y, mo, d, h, mi, s, us) => date_json(col, (y, mo, d), (h, mi, s, us)),
        Value::Time(neg, days, h, mi, s, us) => time_json(col, neg, days, (h, mi, s, us)),
        Value::Bytes(b) => bytes_json(table, col, b)?,
    })
}

/// Check a binary JSON value for what mysql_common 0.37's `parse` panics on (found by
/// fuzzing): an opaque DECIMAL whose scale exceeds its precision, an opaque DATE / DATETIME /
/// TIMESTAMP / TIME whose packed value is `i64::MIN` (negated unchecked). Walks the whole
/// document; errors name what is wrong.
fn check_jsonb(v: &mysql_common::binlog::jsonb::Value<'_>) -> std::io::Result<()> {
    use mysql_common::binlog::jsonb::Value as J;
    use mysql_common::constants::ColumnType as T;
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    match v {
        J::SmallArray(a) => a.iter().try_for_each(|e| check_jsonb(&e?)),
        J::LargeArray(a) => a.iter().try_for_each(|e| check_jsonb(&e?)),
        J::SmallObject(o) => o.iter().try_for_each(|e| check_jsonb(&e?.1)),
        J::LargeObject(o) => o.iter().try_for_each(|e| check_jsonb(&e?.1)),
        J::Opaque(o) => {
            let data = o.data_raw();
            match o.value_type() {
                T::MYSQL_TYPE_NEWDECIMAL => match data {
                    [precision, scale, ..] if scale <= precision => Ok(()),
                    [precision, scale, ..] => Err(bad(format!("JSON DECIMAL scale {scale} above its precision {precision}"))),
                    _ => Err(bad("JSON DECIMAL without precision and scale".into())),
                },
                T::MYSQL_TYPE_DATE | T::MYSQL_TYPE_DATETIME | T::MYSQL_TYPE_TIMESTAMP | T::MYSQL_TYPE_TIME => {
                    match data.first_chunk::<8>().map(|b| i64::from_le_bytes(*b)) {
                        Some(i64::MIN) => Err(bad(format!("JSON {:?} packed value out of range", o.value_type()))),
                        _ => Ok(()),
                    }
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// The error for a value that does not fit its column type.
fn unsupported(table: &str, col: &ColumnSchema) -> DecodeError {
    DecodeError::UnsupportedType { table: table.into(), column: col.name.to_string(), ty: col.ty }
}

/// An integer value: MEDIUMINT sign-extended (mysql_common 0.37 leaves signed MEDIUMINT
/// unsigned), ENUM as its label (index 0 is the empty string of an invalid value; an index
/// past the labels stays a number), the old TIMESTAMP as a UTC instant.
fn int_json(col: &ColumnSchema, i: i64) -> Json {
    use ColumnType::*;
    match col.ty {
        MYSQL_TYPE_INT24 if !col.unsigned && i >= 0x80_0000 => Json::from(i - 0x100_0000),
        MYSQL_TYPE_ENUM => {
            if i == 0 {
                Json::String(String::new())
            } else {
                match col.enum_labels.get(i as usize - 1) {
                    Some(l) => Json::String(l.clone()),
                    None => Json::from(i),
                }
            }
        }
        MYSQL_TYPE_TIMESTAMP => Json::String(utc_instant(i, 0, 0)),
        _ => Json::from(i),
    }
}

/// DATE as `YYYY-MM-DD`; DATETIME as `YYYY-MM-DD hh:mm:ss` with exactly fsp fraction digits.
fn date_json(col: &ColumnSchema, date: (u16, u8, u8), time: (u8, u8, u8, u32)) -> Json {
    use ColumnType::*;
    let time = match col.ty {
        MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE => None,
        MYSQL_TYPE_DATETIME2 => Some((time, col.meta.first().copied().unwrap_or(0))),
        _ => Some((time, 0)),
    };
    Json::String(datetime_text(date, time))
}

/// TIME as `[-]hh:mm:ss` (hours past 24 for days) with exactly fsp fraction digits.
fn time_json(col: &ColumnSchema, neg: bool, days: u32, time: (u8, u8, u8, u32)) -> Json {
    let fsp = if col.ty == ColumnType::MYSQL_TYPE_TIME2 { col.meta.first().copied().unwrap_or(0) } else { 0 };
    Json::String(time_text(neg, days, time, fsp))
}

/// A value mysql_common gives as bytes, by column type.
fn bytes_json(table: &str, col: &ColumnSchema, b: Vec<u8>) -> Result<Json, DecodeError> {
    use ColumnType::*;
    Ok(match col.ty {
        MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
            let s = String::from_utf8(b).map_err(|_| unsupported(table, col))?;
            let scale = col.meta.get(1).copied().unwrap_or(0) as usize;
            Json::String(pad_scale(s, scale))
        }
        MYSQL_TYPE_YEAR => {
            let y: i64 = std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok()).ok_or_else(|| unsupported(table, col))?;
            // mysql_common adds 1900 to the stored byte; byte 0 is YEAR 0000.
            Json::from(if y == 1900 { 0 } else { y })
        }
        MYSQL_TYPE_BIT => bit_json(&b),
        MYSQL_TYPE_TIMESTAMP2 => timestamp2_json(table, col, &b)?,
        MYSQL_TYPE_SET => set_json(col, &b),
        MYSQL_TYPE_GEOMETRY => geometry_json(&b).ok_or_else(|| unsupported(table, col))?,
        MYSQL_TYPE_STRING
        | MYSQL_TYPE_VARCHAR
        | MYSQL_TYPE_VAR_STRING
        | MYSQL_TYPE_BLOB
        | MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB => string_json(table, col, b)?,
        MYSQL_TYPE_VECTOR => {
            // MySQL 9 VECTOR: little-endian IEEE-754 float32 values.
            if !b.len().is_multiple_of(4) {
                return Err(unsupported(table, col));
            }
            Json::Array(b.chunks_exact(4).map(|c| f32_json(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect())
        }
        MYSQL_TYPE_JSON => {
            // MariaDB stores JSON as LONGTEXT; MySQL's binary JSON is handled above.
            let s = String::from_utf8(b).map_err(|_| DecodeError::BadText {
                table: table.into(),
                column: col.name.to_string(),
                charset: "utf8mb4".into(),
            })?;
            serde_json::from_str(&s).unwrap_or(Json::String(s))
        }
        _ => return Err(unsupported(table, col)),
    })
}

/// TIMESTAMP(fsp): mysql_common gives `seconds[.micros]` since the epoch; a UTC instant.
fn timestamp2_json(table: &str, col: &ColumnSchema, b: &[u8]) -> Result<Json, DecodeError> {
    let s = std::str::from_utf8(b).map_err(|_| unsupported(table, col))?;
    let (sec, us) = match s.split_once('.') {
        Some((a, f)) => (a.parse::<i64>().map_err(|_| unsupported(table, col))?, f.parse::<u32>().map_err(|_| unsupported(table, col))?),
        None => (s.parse::<i64>().map_err(|_| unsupported(table, col))?, 0),
    };
    Ok(Json::String(utc_instant(sec, us, col.meta.first().copied().unwrap_or(0))))
}

/// SET: the little-endian bit mask as the list of its labels (`#n` for a bit with no label).
fn set_json(col: &ColumnSchema, b: &[u8]) -> Json {
    let mask = b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64);
    let labels = (0..64)
        .filter(|bit| mask & (1u64 << bit) != 0)
        .map(|bit| Json::String(col.set_labels.get(bit).cloned().unwrap_or_else(|| format!("#{bit}"))))
        .collect();
    Json::Array(labels)
}

/// Text and binary strings. BINARY(n) gets back the trailing zero bytes the binlog leaves out
/// (mysql_common 0.37 does not pad it to its declared length).
fn string_json(table: &str, col: &ColumnSchema, mut b: Vec<u8>) -> Result<Json, DecodeError> {
    if col.charset == BINARY_CHARSET && col.ty == ColumnType::MYSQL_TYPE_STRING {
        let n = string_len(&col.meta);
        if b.len() < n {
            b.resize(n, 0);
        }
    }
    text_or_base64(table, col, b)
}

/// Collation id of the `binary` charset.
const BINARY_CHARSET: u16 = 63;
fn string_len(meta: &[u8]) -> usize {
    if meta.len() < 2 {
        return 0;
    }
    let (b0, b1) = (meta[0] as usize, meta[1] as usize);
    if (b0 & 0x30) != 0x30 {
        b1 | (((b0 & 0x30) ^ 0x30) << 4)
    } else {
        b1
    }
}

fn text_or_base64(table: &str, col: &ColumnSchema, b: Vec<u8>) -> Result<Json, DecodeError> {
    if col.charset == BINARY_CHARSET {
        return Ok(Json::String(base64::engine::general_purpose::STANDARD.encode(b)));
    }
    col.text.decode(b).map(Json::String).map_err(|e| DecodeError::BadText {
        table: table.into(),
        column: col.name.to_string(),
        charset: e.charset,
    })
}
