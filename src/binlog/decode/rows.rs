//! Row events into rows: [`decode_rows`] frames the row images of one row event with the
//! [`TableSchema`] prepared for its TABLE_MAP, and every value is parsed by mysql_common and
//! converted to its canonical JSON form at once ([`super::value_to_json`]).

use std::sync::Arc;

use mysql_common::binlog::events::RowsEventData;
use mysql_common::binlog::row::BinlogRowValueOptions;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;
use mysql_common::misc::raw::int::{LenEnc, RawInt};
use serde_json::{Map, Value as Json};

use super::{apply_json_diffs, value_to_json, DecodeError, Row, TableSchema};

/// The kind of a row change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// WRITE_ROWS: after image only.
    Insert,
    /// UPDATE_ROWS: before and after images.
    Update,
    /// DELETE_ROWS: before image only.
    Delete,
}

/// One decoded row change of a mapped table.
#[derive(Debug, Clone)]
pub struct RowChange {
    /// `schema.table`.
    pub table: Arc<str>,
    /// Insert, update or delete.
    pub kind: RowKind,
    /// Before image (update, delete).
    pub before: Option<Row>,
    /// After image (insert, update).
    pub after: Option<Row>,
    /// Index of the row event within its transaction: rows of one event come from one
    /// statement and take effect together.
    pub event: u32,
    /// The text columns of this row whose values are JSON documents, as the reader knew them
    /// at the row's TABLE_MAP (MariaDB, see `binlog::json_columns`); `None` where nobody asked
    /// (MySQL, whose JSON is binary, and the offline reader).
    pub json_columns: Option<std::sync::Arc<[String]>>,
}

/// Decode every row of one row event of `table`, appending to `out`.
///
/// The row framing (column-present bitmaps, NULL bitmaps, before/after images, the shared image
/// of PARTIAL_UPDATE_ROWS) is done here with the [`TableSchema`] prepared once per TABLE_MAP;
/// each value is parsed by mysql_common's own `BinlogValue` deserializer. This mirrors
/// mysql_common's `RowsEventData::rows`, which re-parses the TABLE_MAP optional metadata and
/// builds a `Column` per column for every row.
pub fn decode_rows(table: &TableSchema, ev: &RowsEventData<'_>, out: &mut Vec<RowChange>) -> Result<(), DecodeError> {
    let kind = match ev {
        RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => RowKind::Insert,
        RowsEventData::UpdateRowsEventV1(_) | RowsEventData::UpdateRowsEvent(_) | RowsEventData::PartialUpdateRowsEvent(_) => {
            RowKind::Update
        }
        RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => RowKind::Delete,
    };
    let parse_err = |e: std::io::Error| DecodeError::Parse { table: table.name.to_string(), source: e };
    let mut buf = ParseBuf(ev.rows_data());
    if buf.is_empty() {
        return Ok(());
    }
    let num_columns = ev.num_columns() as usize;
    if num_columns > table.columns.len() {
        // mysql_common: the TABLE_MAP must define a type for every column of the row event.
        return Err(parse_err(std::io::Error::new(std::io::ErrorKind::InvalidData, "No column type")));
    }
    // Columns present in each image (bitmaps are cut to num_columns by mysql_common). A full
    // image (every bit set, FULL row image) borrows the schema's list.
    let before_cols =
        ev.columns_before_image().map(|b| present_columns(table, num_columns, |i| b.get(i).as_deref().copied().unwrap_or(false)));
    let after_cols =
        ev.columns_after_image().map(|b| present_columns(table, num_columns, |i| b.get(i).as_deref().copied().unwrap_or(false)));
    // PARTIAL_UPDATE_ROWS: the after image starts with a shared image whose partial bits are
    // indexed by the ordinal of the column among the table's JSON columns.
    let json_ordinals: Option<Vec<usize>> = matches!(ev, RowsEventData::PartialUpdateRowsEvent(_)).then(|| {
        let mut k = 0;
        table.columns[..num_columns]
            .iter()
            .map(|c| {
                let o = k;
                if c.ty == ColumnType::MYSQL_TYPE_JSON {
                    k += 1;
                }
                o
            })
            .collect()
    });
    while !buf.is_empty() {
        let left = buf.len();
        let before = match &before_cols {
            Some(cols) => Some(read_image(table, cols, None, &mut buf, None)?),
            None => None,
        };
        let after = match &after_cols {
            Some(cols) => Some(read_image(table, cols, json_ordinals.as_deref(), &mut buf, before.as_ref())?),
            None => None,
        };
        if buf.len() == left {
            // No column present in either image (a damaged bitmap or column count): a row
            // takes no byte, so the bytes left would be read as rows without end (found by
            // fuzzing: rows were pushed until memory ran out).
            return Err(parse_err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a row image without any column leaves {left} bytes of the row event unread"),
            )));
        }
        out.push(RowChange { table: table.name.clone(), kind, before, after, event: 0, json_columns: table.json_columns.clone() });
    }
    Ok(())
}

/// Check a binary DECIMAL(`precision`, `scale`) at the start of `bytes` before mysql_common
/// reads it: it multiplies the last fraction group by a power of ten unchecked, so a group
/// beyond its digits overflowed (found by fuzzing). The schema guarantees `scale <= precision`.
fn check_decimal(bytes: &[u8], precision: usize, scale: usize) -> std::io::Result<()> {
    const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];
    let intg = precision - scale;
    let size = DIG2BYTES[intg % 9] + intg / 9 * 4 + scale / 9 * 4 + DIG2BYTES[scale % 9];
    let digits = scale % 9;
    if digits == 0 || bytes.len() < size || size == 0 {
        return Ok(()); // nothing to multiply, or too short: mysql_common says so itself
    }
    let negative = (bytes[0] ^ 0x80) & 0x80 != 0;
    let n = DIG2BYTES[digits];
    let mut group = bytes[size - n..size].to_vec();
    if size == n {
        group[0] ^= 0x80;
    }
    let unsigned = group.iter().fold(0i64, |a, &b| (a << 8) | b as i64);
    let signed = if group[0] & 0x80 != 0 { unsigned - (1i64 << (8 * n)) } else { unsigned };
    let x = if negative { !signed } else { signed };
    if !(0..10i64.pow(digits as u32)).contains(&x) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("DECIMAL({precision},{scale}): its last fraction group {x} has more than {digits} digits"),
        ));
    }
    Ok(())
}

/// Indexes of the columns whose bit is set among the first `num_columns`; the schema's own list
/// when all of the table's columns are present.
fn present_columns(table: &TableSchema, num_columns: usize, bit: impl Fn(usize) -> bool) -> std::borrow::Cow<'_, [usize]> {
    if num_columns == table.columns.len() && (0..num_columns).all(&bit) {
        std::borrow::Cow::Borrowed(&table.all_columns[..])
    } else {
        std::borrow::Cow::Owned((0..num_columns).filter(|&i| bit(i)).collect())
    }
}

/// Parse one row image into its canonical JSON row, exactly as mysql_common's `BinlogRow`
/// deserializer frames it: for an after image of PARTIAL_UPDATE_ROWS (`json_ordinals` given)
/// the shared image (value options, then one partial bit per JSON column of the table), then the
/// NULL bitmap (one bit per column present in the image), then the value of every present,
/// non-NULL column, each parsed by mysql_common's `BinlogValue` and converted at once. `cols`
/// lists the present columns in table order; `before`: the before image of the same row, to
/// which the JSON diffs of a partial after image apply.
fn read_image<'de>(
    table: &'de TableSchema,
    cols: &[usize],
    json_ordinals: Option<&[usize]>,
    buf: &mut ParseBuf<'de>,
    before: Option<&Row>,
) -> Result<Row, DecodeError> {
    let parse_err = |e: std::io::Error| DecodeError::Parse { table: table.name.to_string(), source: e };
    let partial_bits: Option<&'de [u8]> = match json_ordinals {
        Some(_) => {
            let value_options = *buf.parse::<RawInt<LenEnc>>(()).map_err(parse_err)?;
            if value_options & BinlogRowValueOptions::PARTIAL_JSON_UPDATES as u64 > 0 {
                let json_columns = table.columns.iter().filter(|c| c.ty == ColumnType::MYSQL_TYPE_JSON).count();
                Some(buf.parse::<&[u8]>(json_columns.div_ceil(8)).map_err(parse_err)?)
            } else {
                None
            }
        }
        None => None,
    };
    let null_bitmap: &[u8] = buf.parse(cols.len().div_ceil(8)).map_err(parse_err)?;
    let mut row = Map::new();
    for (image_idx, &i) in cols.iter().enumerate() {
        let col = &table.columns[i];
        let json = if null_bitmap[image_idx / 8] & (1 << (image_idx % 8)) != 0 {
            Json::Null
        } else {
            let is_partial = match (partial_bits, json_ordinals) {
                (Some(bits), Some(ord)) if col.ty == ColumnType::MYSQL_TYPE_JSON => {
                    let k = ord[i];
                    bits.get(k / 8).map(|b| b & (1 << (k % 8)) != 0).unwrap_or(false)
                }
                _ => false,
            };
            if col.ty == ColumnType::MYSQL_TYPE_DATETIME2 && buf.0.first().is_some_and(|b| b & 0x80 == 0) {
                // A DATETIME2 is stored with its sign bit set (offset 0x8000000000); a negative
                // one makes mysql_common 0.37 overflow (negate i64::MIN; found by fuzzing).
                return Err(parse_err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "DATETIME2 value below its range (sign bit clear)",
                )));
            }
            if col.ty == ColumnType::MYSQL_TYPE_NEWDECIMAL {
                check_decimal(buf.0, col.meta[0] as usize, col.meta[1] as usize).map_err(parse_err)?;
            }
            let v = if col.ty == ColumnType::MYSQL_TYPE_TIME2 && matches!(col.meta.first(), Some(1 | 2)) {
                time2_short_fraction(buf).map_err(parse_err)?
            } else {
                buf.parse::<BinlogValue<'de>>((col.ty, &col.meta[..], col.unsigned, is_partial)).map_err(parse_err)?
            };
            match v {
                BinlogValue::JsonDiff(diffs) => {
                    let partial =
                        |detail: String| DecodeError::PartialJson { table: table.name.to_string(), column: col.name.to_string(), detail };
                    let base = before
                        .and_then(|b| b.get(&*col.name))
                        .ok_or_else(|| partial("the before image does not hold the column (binlog_row_image is not FULL)".into()))?;
                    apply_json_diffs(base, &diffs).map_err(|e| partial(e.to_string()))?
                }
                v => value_to_json(&table.name, col, v)?,
            }
        };
        if !col.hidden || table.keep_hidden {
            row.insert(col.name.to_string(), json);
        }
    }
    Ok(row)
}

/// A TIME(1) or TIME(2) value (MYSQL_TYPE_TIME2 with fsp 1-2): 3 bytes big-endian integer part
/// offset by 0x800000, then 1 byte of hundredths. Parsed here because mysql_common 0.37
/// (`binlog::misc::my_time_packed_from_binary`) keeps that byte in a `u32` and subtracts 0x100
/// from it for negative times with a fraction (`-00:00:01.5`): an overflow panic in debug
/// builds and a wrong value in release builds. Same arithmetic as MySQL's
/// `my_time_packed_from_binary` (mysys/my_time.cc), with a signed fraction; the packed value
/// is turned into a `Value::Time` by mysql_common's own `time_from_packed`.
fn time2_short_fraction(buf: &mut ParseBuf<'_>) -> std::io::Result<BinlogValue<'static>> {
    let b: &[u8] = buf.parse(4)?;
    let mut intpart = (((b[0] as i64) << 16) | ((b[1] as i64) << 8) | b[2] as i64) - 0x80_0000;
    let mut frac = b[3] as i64;
    if intpart < 0 && frac > 0 {
        intpart += 1;
        frac -= 0x100;
    }
    let packed = (intpart << 24) + frac * 10_000;
    Ok(BinlogValue::Value(mysql_common::binlog::misc::time_from_packed(packed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fast row framing must give exactly what mysql_common's own `rows()` gives, for every
    /// row event of real MySQL/MariaDB binlogs (full and partial images, updates, JSON, BIT,
    /// TIME...).
    #[test]
    fn fast_rows_match_mysql_common_rows() {
        use mysql_common::binlog::consts::BinlogVersion;
        use mysql_common::binlog::events::EventData;
        use mysql_common::binlog::BinlogFile;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test");
        let mut compared = 0usize;
        for name in [
            "write-full-row.binlog",
            "write-partial-row.binlog",
            "update-full-row.binlog",
            "json-opaque.binlog",
            "mysql_type_bit.000001",
            "time_issue.000001",
            "vector.binlog",
        ] {
            let f = std::fs::File::open(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let file = BinlogFile::new(BinlogVersion::Version4, std::io::BufReader::new(f)).unwrap();
            let mut tables = std::collections::HashMap::new();
            for ev in file {
                let Ok(ev) = ev else { break };
                match ev.read_data() {
                    Ok(Some(EventData::TableMapEvent(t))) => {
                        if let Ok(s) = TableSchema::from_table_map_positional(t.into_owned(), false) {
                            tables.insert(s.tme.table_id(), s);
                        }
                    }
                    Ok(Some(EventData::RowsEvent(ev))) => {
                        let Some(t) = tables.get(&ev.table_id()) else { continue };
                        let mut fast = Vec::new();
                        let fast = decode_rows(t, &ev, &mut fast).map(|_| fast);
                        let slow = slow_decode_rows(t, &ev);
                        match (fast, slow) {
                            (Ok(a), Ok(b)) => {
                                assert_eq!(a.len(), b.len(), "{name}");
                                for (x, y) in a.iter().zip(&b) {
                                    assert_eq!((x.kind, &x.before, &x.after), (y.kind, &y.before, &y.after), "{name}: table {}", t.name);
                                    compared += 1;
                                }
                            }
                            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name}"),
                            (a, b) => panic!("{name}: fast {:?} vs mysql_common {:?}", a.map(|v| v.len()), b.map(|v| v.len())),
                        }
                    }
                    _ => {}
                }
            }
        }
        assert!(compared > 20, "only {compared} rows compared");
    }

    /// The previous implementation: mysql_common's `rows()` (reference for the fast path).
    fn slow_decode_rows(table: &TableSchema, ev: &RowsEventData<'_>) -> Result<Vec<RowChange>, DecodeError> {
        let kind = match ev {
            RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => RowKind::Insert,
            RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => RowKind::Delete,
            _ => RowKind::Update,
        };
        let n = table.columns.len();
        let before_cols: Vec<usize> =
            ev.columns_before_image().map(|b| (0..n).filter(|&i| b.get(i).map(|x| *x).unwrap_or(false)).collect()).unwrap_or_default();
        let after_cols: Vec<usize> =
            ev.columns_after_image().map(|b| (0..n).filter(|&i| b.get(i).map(|x| *x).unwrap_or(false)).collect()).unwrap_or_default();
        let to_json = |cols: &[usize], values: Vec<BinlogValue<'static>>| -> Result<Row, DecodeError> {
            let mut row = Map::new();
            for (&i, v) in cols.iter().zip(values) {
                let col = &table.columns[i];
                row.insert(col.name.to_string(), value_to_json(&table.name, col, v)?);
            }
            Ok(row)
        };
        let mut out = Vec::new();
        for r in ev.rows(&table.tme) {
            let (b, a) = r.map_err(|e| DecodeError::Parse { table: table.name.to_string(), source: e })?;
            let before = b.map(|row| to_json(&before_cols, row.unwrap())).transpose()?;
            let after = a.map(|row| to_json(&after_cols, row.unwrap())).transpose()?;
            out.push(RowChange { table: table.name.clone(), kind, before, after, event: 0, json_columns: None });
        }
        Ok(out)
    }
}
