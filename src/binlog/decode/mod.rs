//! Decode stage: TABLE_MAP and row events into rows with named columns and canonical JSON
//! values.
//!
//! Byte-level decoding of row images is mysql_common's job; this module wraps it with what a
//! cache needs and mysql_common leaves out:
//!
//! * a [`TableSchema`] prepared once per TABLE_MAP event from its optional metadata
//!   (`binlog_row_metadata=FULL`): column names, signedness, charsets and ENUM/SET labels,
//!   exactly as the table was when the row was written (every TABLE_MAP carries them, so they
//!   follow ALTER TABLE);
//! * canonical JSON values (see `schemas/README.md`): integers exact, DECIMAL as an exact string
//!   with its scale, DATE/DATETIME/TIME as MySQL's own text with exactly fsp fraction digits,
//!   TIMESTAMP as a UTC instant, YEAR as a number, BIT as a number, ENUM as its label, SET as a
//!   list of labels, text decoded from its charset, binary as base64, NULL as null, and a column
//!   absent from the row image absent;
//! * fixes for known mysql_common (0.37) gaps: signed MEDIUMINT sign extension, BINARY(n)
//!   trailing zero bytes, YEAR 0000; negative TIME(1)/TIME(2) fractions (parsed here, see
//!   `time2_short_fraction`); which columns the charset metadata covers (MariaDB counts
//!   GEOMETRY, MySQL 9 VECTOR: [`charset_column`]); MySQL PARTIAL_JSON diffs applied to the
//!   before image ([`apply_json_diffs`]); MariaDB legacy temporal columns refused
//!   ([`DecodeError::LegacyTemporal`]);
//! * events mysql_common does not read: MariaDB's compressed events (`log_bin_compress=ON`,
//!   [`uncompress_mariadb_event`]), MySQL 8 TRANSACTION_PAYLOAD cut into its events without
//!   panicking on a damaged payload ([`transaction_payload_events`]), and which unknown event
//!   types may be passed over ([`skippable_unknown_event`]).
//!
//! Anything that cannot be decoded exactly is a [`DecodeError`] naming the table and column:
//! the pipeline stops rather than cache a wrong value.

pub mod charset;

use std::sync::Arc;

use base64::Engine as _;
use mysql_common::binlog::consts::EventType;
use mysql_common::binlog::events::{
    BinlogEventHeader, ColumnCharsets, DefaultCharset, Event, EventData, OptionalMetadataField, RowsEventData, TableMapEvent,
};
use mysql_common::binlog::row::BinlogRowValueOptions;
use mysql_common::binlog::value::BinlogValue;
use mysql_common::constants::ColumnType;
use mysql_common::io::ParseBuf;
use mysql_common::misc::raw::int::{LenEnc, RawInt};
use mysql_common::proto::MySerialize;
use mysql_common::value::Value;
use serde_json::{Map, Number, Value as Json};

/// A decoded row image: column name -> canonical JSON value. Columns absent from the image are
/// absent from the map.
pub type Row = Map<String, Json>;

/// Why a row could not be decoded exactly. Every variant is definite: retrying cannot help.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The TABLE_MAP event is missing metadata binval needs.
    #[error("table {table}: TABLE_MAP has no column names; set binlog_row_metadata=FULL on the source")]
    NoColumnNames { table: String },
    /// A column type binval does not decode.
    #[error("table {table}, column {column}: column type {ty:?} is not supported")]
    UnsupportedType { table: String, column: String, ty: ColumnType },
    /// Text bytes that are not valid in the column's charset, or a charset binval does not
    /// convert.
    #[error("table {table}, column {column}: value cannot be decoded exactly from charset {charset}; binval decodes utf8mb3/utf8mb4, ascii, latin1, ucs2, utf16, utf16le, utf32, gbk (other charsets only when the value is ASCII): convert the column or unmap the table")]
    BadText { table: String, column: String, charset: String },
    /// mysql_common failed to parse the row image.
    #[error("table {table}: row image could not be parsed: {source}")]
    Parse {
        table: String,
        #[source]
        source: std::io::Error,
    },
    /// A MariaDB table with columns in the pre-10.1 temporal format (`mysql56_temporal_format=OFF`,
    /// "mariadb-5.3" in SHOW CREATE TABLE with `show_old_temporals=ON`): the TABLE_MAP gives
    /// them the old DATETIME/TIME/TIMESTAMP types with no metadata, so their fraction digits,
    /// and with them the size of every value, are not in the binlog (MariaDB's own
    /// mariadb-binlog cannot decode such rows either). Refused rather than read as something else.
    #[error("table {table}: columns {columns} use MariaDB's legacy (pre-10.1, mariadb-5.3) temporal format, whose fraction digits the binlog does not record; convert them with SET GLOBAL mysql56_temporal_format=ON then ALTER TABLE {table} FORCE, or unmap the table")]
    LegacyTemporal { table: String, columns: String },
    /// A row event refers to a table id with no preceding TABLE_MAP.
    #[error("row event for table id {table_id} without a preceding TABLE_MAP")]
    NoTableMap { table_id: u64 },
    /// A MySQL partial JSON update (binlog_row_value_options=PARTIAL_JSON) carries diffs, not a
    /// value, and they cannot be applied: the before image lacks the column (MINIMAL row
    /// image), or a diff does not fit the before value (`detail`).
    #[error("table {table}, column {column}: partial JSON update cannot be applied: {detail}; set binlog_row_image=FULL (or binlog_row_value_options='') on the source")]
    PartialJson { table: String, column: String, detail: String },
    /// A MariaDB compressed event (`log_bin_compress=ON`) whose compressed part cannot be
    /// decompressed exactly (bad header byte, unknown algorithm, corrupt zlib data, or a length
    /// that differs from the one the header announces). `event` is the MariaDB event name.
    #[error("compressed MariaDB event {event} cannot be decompressed: {detail}")]
    Compressed { event: &'static str, detail: String },
    /// A MySQL 8 TRANSACTION_PAYLOAD event (binlog_transaction_compression=ON) whose payload
    /// cannot be read to its end: bad zstd data, a truncated or impossible inner event, a size
    /// that differs from the announced uncompressed size, or an event that cannot be inside one.
    #[error("TRANSACTION_PAYLOAD cannot be read: {0}")]
    Payload(String),
}

/// One column of a table as described by a TABLE_MAP event.
#[derive(Debug, Clone)]
pub struct ColumnSchema {
    /// Column name.
    pub name: Arc<str>,
    /// Real column type (ENUM and SET resolved from the metadata).
    pub ty: ColumnType,
    /// Type metadata bytes from the TABLE_MAP (precision/scale, fsp, length...).
    pub meta: Vec<u8>,
    /// UNSIGNED numeric column.
    pub unsigned: bool,
    /// Collation id for text, ENUM and SET columns (63 = binary); 0 if not applicable.
    pub charset: u16,
    /// How text of this column is decoded (from `charset`, resolved once per TABLE_MAP).
    pub text: crate::binlog::decode::charset::Charset,
    /// ENUM labels, index 1 first.
    pub enum_labels: Vec<String>,
    /// SET labels, bit 0 first.
    pub set_labels: Vec<String>,
}

/// A table as described by one TABLE_MAP event, prepared once and used for every row event that
/// follows it.
#[derive(Debug)]
pub struct TableSchema {
    /// `schema.table`.
    pub name: Arc<str>,
    /// Columns in table order.
    pub columns: Vec<ColumnSchema>,
    /// The TABLE_MAP event itself, which mysql_common needs to parse row images.
    pub tme: TableMapEvent<'static>,
    /// `0..columns.len()`: the present columns of a full row image.
    all_columns: Vec<usize>,
}

impl TableSchema {
    /// Prepare a table from its TABLE_MAP event. `mariadb`: the event comes from a MariaDB
    /// server (its FORMAT_DESCRIPTION / `@@version` says so), which counts GEOMETRY columns among
    /// the character columns of the charset metadata (see [`charset_column`]). Errors when column
    /// names are missing (binlog_row_metadata is not FULL).
    pub fn from_table_map(tme: TableMapEvent<'static>, mariadb: bool) -> Result<Self, DecodeError> {
        Self::prepare(tme, true, mariadb)
    }

    /// Like [`TableSchema::from_table_map`], but a TABLE_MAP without column names (MINIMAL row
    /// metadata, or MySQL 5.x) names columns `@0`, `@1`, ... in table order (the offline reader
    /// uses this; the live pipeline refuses such a source at preflight).
    pub fn from_table_map_positional(tme: TableMapEvent<'static>, mariadb: bool) -> Result<Self, DecodeError> {
        Self::prepare(tme, false, mariadb)
    }

    fn prepare(tme: TableMapEvent<'static>, require_names: bool, mariadb: bool) -> Result<Self, DecodeError> {
        let name: Arc<str> = format!("{}.{}", tme.database_name(), tme.table_name()).into();
        let n = tme.columns_count() as usize;
        let mut columns = Vec::with_capacity(n);
        for i in 0..n {
            let ty = match tme.get_column_type(i) {
                Ok(Some(t)) => t,
                _ => {
                    return Err(DecodeError::UnsupportedType {
                        table: name.to_string(),
                        column: format!("#{i}"),
                        ty: ColumnType::MYSQL_TYPE_NULL,
                    })
                }
            };
            columns.push(ColumnSchema {
                name: Arc::from(format!("@{i}").as_str()),
                ty,
                meta: tme.get_column_metadata(i).unwrap_or(&[]).to_vec(),
                unsigned: false,
                charset: 0,
                text: crate::binlog::decode::charset::Charset::of(0),
                enum_labels: Vec::new(),
                set_labels: Vec::new(),
            });
        }
        let parse_err = |e: std::io::Error| DecodeError::Parse { table: name.to_string(), source: e };
        let numeric: Vec<usize> = (0..n).filter(|&i| columns[i].ty.is_numeric_type()).collect();
        let character: Vec<usize> = (0..n).filter(|&i| charset_column(columns[i].ty, mariadb)).collect();
        let enums: Vec<usize> = (0..n).filter(|&i| columns[i].ty == ColumnType::MYSQL_TYPE_ENUM).collect();
        let sets: Vec<usize> = (0..n).filter(|&i| columns[i].ty == ColumnType::MYSQL_TYPE_SET).collect();
        let enum_or_set: Vec<usize> = (0..n).filter(|&i| columns[i].ty.is_enum_or_set_type()).collect();
        let mut have_names = false;
        for field in tme.iter_optional_meta() {
            match field.map_err(parse_err)? {
                OptionalMetadataField::Signedness(bits) => {
                    for (k, &i) in numeric.iter().enumerate() {
                        columns[i].unsigned = bits.get(k).map(|b| *b).unwrap_or(false);
                    }
                }
                OptionalMetadataField::DefaultCharset(dc) => default_charsets(&mut columns, &character, &dc).map_err(parse_err)?,
                OptionalMetadataField::ColumnCharset(cs) => column_charsets(&mut columns, &character, &cs).map_err(parse_err)?,
                OptionalMetadataField::EnumAndSetDefaultCharset(dc) => {
                    default_charsets(&mut columns, &enum_or_set, &dc).map_err(parse_err)?
                }
                OptionalMetadataField::EnumAndSetColumnCharset(cs) => {
                    column_charsets(&mut columns, &enum_or_set, &cs).map_err(parse_err)?
                }
                OptionalMetadataField::ColumnName(names) => {
                    have_names = true;
                    for (i, nm) in names.iter_names().enumerate() {
                        if let Some(c) = columns.get_mut(i) {
                            c.name = Arc::from(nm.map_err(parse_err)?.name().as_ref());
                        }
                    }
                }
                OptionalMetadataField::EnumStrValue(vals) => {
                    for (k, v) in vals.iter_values().enumerate() {
                        let v = v.map_err(parse_err)?;
                        if let Some(&i) = enums.get(k) {
                            columns[i].enum_labels = v.values().iter().map(|s| s.value().into_owned()).collect();
                        }
                    }
                }
                OptionalMetadataField::SetStrValue(vals) => {
                    for (k, v) in vals.iter_values().enumerate() {
                        let v = v.map_err(parse_err)?;
                        if let Some(&i) = sets.get(k) {
                            columns[i].set_labels = v.values().iter().map(|s| s.value().into_owned()).collect();
                        }
                    }
                }
                _ => {}
            }
        }
        for c in &mut columns {
            c.text = crate::binlog::decode::charset::Charset::of(c.charset);
        }
        if mariadb {
            // MariaDB writes DATETIME2/TIME2/TIMESTAMP2 for every column in the current format;
            // the old type codes mean the legacy format (see DecodeError::LegacyTemporal).
            let legacy: Vec<&str> = columns
                .iter()
                .filter(|c| {
                    matches!(c.ty, ColumnType::MYSQL_TYPE_DATETIME | ColumnType::MYSQL_TYPE_TIME | ColumnType::MYSQL_TYPE_TIMESTAMP)
                })
                .map(|c| &*c.name)
                .collect();
            if !legacy.is_empty() {
                return Err(DecodeError::LegacyTemporal { table: name.to_string(), columns: legacy.join(", ") });
            }
        }
        if require_names && !have_names && n > 0 {
            return Err(DecodeError::NoColumnNames { table: name.to_string() });
        }
        let all_columns = (0..columns.len()).collect();
        Ok(TableSchema { name, columns, tme, all_columns })
    }

    /// True when `tme` is byte for byte the TABLE_MAP this schema was prepared from (same
    /// table id, names, types, metadata): its rows decode exactly as with a newly prepared
    /// schema. MySQL and MariaDB write a TABLE_MAP before the row events of every statement;
    /// readers reuse the prepared schema instead of preparing it again.
    pub fn same_table_map(&self, tme: &TableMapEvent<'_>) -> bool {
        self.tme == *tme
    }
}

/// Whether the charset fields of the TABLE_MAP optional metadata (DEFAULT_CHARSET,
/// COLUMN_CHARSET) have an entry for a column of type `ty`: the server's `is_character_type`.
/// MySQL (sql/log_event.cc): STRING, VAR_STRING, VARCHAR, BLOB, and VECTOR (MySQL 9).
/// MariaDB (sql/log_event.cc): STRING, VAR_STRING, VARCHAR, BLOB and GEOMETRY ("base class is
/// blob for geom type"). mysql_common 0.37's `ColumnType::is_character_type` has neither
/// GEOMETRY nor VECTOR: on MariaDB every text column after a GEOMETRY column would take its
/// left neighbour's charset (found by tests/proptest_roundtrip.rs).
pub fn charset_column(ty: ColumnType, mariadb: bool) -> bool {
    use ColumnType::*;
    match ty {
        MYSQL_TYPE_STRING | MYSQL_TYPE_VAR_STRING | MYSQL_TYPE_VARCHAR | MYSQL_TYPE_BLOB => true,
        MYSQL_TYPE_GEOMETRY => mariadb,
        MYSQL_TYPE_VECTOR => !mariadb,
        _ => false,
    }
}

/// Apply a DEFAULT_CHARSET metadata field to `targets` (indexes of the columns it covers, in
/// order): the default for all, then the listed exceptions (indexed among `targets`).
fn default_charsets(columns: &mut [ColumnSchema], targets: &[usize], dc: &DefaultCharset<'_>) -> std::io::Result<()> {
    for &i in targets {
        columns[i].charset = dc.default_charset();
    }
    for nd in dc.iter_non_default() {
        let nd = nd?;
        if let Some(&i) = targets.get(nd.column_index() as usize) {
            columns[i].charset = nd.charset();
        }
    }
    Ok(())
}

/// Apply a COLUMN_CHARSET metadata field: one collation id per column of `targets`.
fn column_charsets(columns: &mut [ColumnSchema], targets: &[usize], cs: &ColumnCharsets<'_>) -> std::io::Result<()> {
    for (k, c) in cs.iter_charsets().enumerate() {
        if let Some(&i) = targets.get(k) {
            columns[i].charset = c?;
        }
    }
    Ok(())
}

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
        let before = match &before_cols {
            Some(cols) => Some(read_image(table, cols, None, &mut buf, None)?),
            None => None,
        };
        let after = match &after_cols {
            Some(cols) => Some(read_image(table, cols, json_ordinals.as_deref(), &mut buf, before.as_ref())?),
            None => None,
        };
        out.push(RowChange { table: table.name.clone(), kind, before, after, event: 0 });
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
                    apply_json_diffs(base, &diffs).map_err(partial)?
                }
                v => value_to_json(&table.name, col, v)?,
            }
        };
        row.insert(col.name.to_string(), json);
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

/// Apply MySQL JSON diffs (PARTIAL_UPDATE_ROWS, `binlog_row_value_options=PARTIAL_JSON`) to
/// the before value of the column, as the replica does (MySQL sql/json_diff.cc,
/// `Json_diff_vector` / `apply_json_diffs`): REPLACE sets the value at an existing path; INSERT
/// adds an object member or inserts into an array at the index (appends past the end); REMOVE
/// deletes the member or element. Diffs apply in order. Values are converted like full JSON
/// values (mysql_common's binary JSON parser). Errors name the diff that does not fit.
pub fn apply_json_diffs(base: &Json, diffs: &[mysql_common::binlog::jsondiff::JsonDiff<'_>]) -> Result<Json, String> {
    use mysql_common::binlog::jsondiff::JsonDiffOperation as Op;
    let mut doc = base.clone();
    for d in diffs {
        let path = d.path_str();
        let legs = json_path_legs(&path).ok_or_else(|| format!("unsupported JSON path {path:?}"))?;
        let bad = |why: &str| format!("{:?} at {path}: {why}", d.operation());
        let value = match d.value() {
            Some(v) => Some(Json::from(v.clone().parse().map_err(|e| bad(&format!("value unreadable: {e}")))?)),
            None => None,
        };
        let Some((last, parents)) = legs.split_last() else {
            // `$` itself: only a REPLACE of the whole document.
            match (d.operation(), value) {
                (Op::REPLACE, Some(v)) => {
                    doc = v;
                    continue;
                }
                _ => return Err(bad("the document root can only be replaced")),
            }
        };
        let mut parent = &mut doc;
        for leg in parents {
            parent = match (leg, parent) {
                (Leg::Member(k), Json::Object(m)) => m.get_mut(k).ok_or_else(|| bad("path does not exist in the before value"))?,
                (Leg::Index(i), Json::Array(a)) => a.get_mut(*i).ok_or_else(|| bad("path does not exist in the before value"))?,
                _ => return Err(bad("path does not exist in the before value")),
            };
        }
        match (d.operation(), last, parent, value) {
            (Op::REPLACE, Leg::Member(k), Json::Object(m), Some(v)) if m.contains_key(k) => {
                m.insert(k.clone(), v);
            }
            (Op::REPLACE, Leg::Index(i), Json::Array(a), Some(v)) if *i < a.len() => a[*i] = v,
            (Op::INSERT, Leg::Member(k), Json::Object(m), Some(v)) => {
                m.insert(k.clone(), v);
            }
            (Op::INSERT, Leg::Index(i), Json::Array(a), Some(v)) => {
                let at = (*i).min(a.len());
                a.insert(at, v);
            }
            (Op::REMOVE, Leg::Member(k), Json::Object(m), None) if m.contains_key(k) => {
                m.remove(k);
            }
            (Op::REMOVE, Leg::Index(i), Json::Array(a), None) if *i < a.len() => {
                a.remove(*i);
            }
            _ => return Err(bad("does not fit the before value")),
        }
    }
    Ok(doc)
}

/// One leg of a JSON path.
#[derive(Debug, PartialEq)]
enum Leg {
    Member(String),
    Index(usize),
}

/// The legs of a MySQL JSON path as written in JSON diffs: `$`, then `.key`, `."quoted key"`
/// (JSON string escapes) or `[n]`. `None` for anything else (wildcards, ranges, `last`).
fn json_path_legs(path: &str) -> Option<Vec<Leg>> {
    let rest = path.trim().strip_prefix('$')?;
    let b = rest.as_bytes();
    let mut legs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' => i += 1,
            b'.' => {
                i += 1;
                while b.get(i) == Some(&b' ') {
                    i += 1;
                }
                if b.get(i) == Some(&b'"') {
                    // A JSON string: find its end, honouring escapes.
                    let start = i;
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    let lit = rest.get(start..=i)?;
                    legs.push(Leg::Member(serde_json::from_str(lit).ok()?));
                    i += 1;
                } else {
                    let start = i;
                    while i < b.len() && b[i] != b'.' && b[i] != b'[' {
                        i += 1;
                    }
                    let key = rest[start..i].trim_end();
                    if key.is_empty() || key == "*" {
                        return None;
                    }
                    legs.push(Leg::Member(key.to_string()));
                }
            }
            b'[' => {
                let end = i + rest[i..].find(']')?;
                legs.push(Leg::Index(rest[i + 1..end].trim().parse().ok()?));
                i = end + 1;
            }
            _ => return None,
        }
    }
    Some(legs)
}

/// Convert one binlog value of column `col` of table `table` to its canonical JSON form.
pub fn value_to_json(table: &str, col: &ColumnSchema, v: BinlogValue<'_>) -> Result<Json, DecodeError> {
    use ColumnType::*;
    let unsupported = || DecodeError::UnsupportedType { table: table.into(), column: col.name.to_string(), ty: col.ty };
    let v = match v {
        BinlogValue::Value(v) => v,
        BinlogValue::Jsonb(j) => {
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
        Value::Int(i) => match col.ty {
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
        },
        Value::UInt(u) => Json::from(u),
        Value::Float(f) => f32_json(f),
        Value::Double(d) => Number::from_f64(d).map(Json::Number).unwrap_or(Json::Null),
        Value::Date(y, mo, d, h, mi, s, us) => {
            use std::fmt::Write as _;
            let mut t = String::with_capacity(26);
            let _ = write!(t, "{y:04}-{mo:02}-{d:02}");
            if !matches!(col.ty, MYSQL_TYPE_DATE | MYSQL_TYPE_NEWDATE) {
                let fsp = if col.ty == MYSQL_TYPE_DATETIME2 { col.meta.first().copied().unwrap_or(0) } else { 0 };
                let _ = write!(t, " {h:02}:{mi:02}:{s:02}");
                push_frac(&mut t, us, fsp);
            }
            Json::String(t)
        }
        Value::Time(neg, days, h, mi, s, us) => {
            use std::fmt::Write as _;
            let fsp = if col.ty == MYSQL_TYPE_TIME2 { col.meta.first().copied().unwrap_or(0) } else { 0 };
            let hours = days as u64 * 24 + h as u64;
            let mut t = String::with_capacity(18);
            let _ = write!(t, "{}{hours:02}:{mi:02}:{s:02}", if neg { "-" } else { "" });
            push_frac(&mut t, us, fsp);
            Json::String(t)
        }
        Value::Bytes(b) => match col.ty {
            MYSQL_TYPE_NEWDECIMAL | MYSQL_TYPE_DECIMAL => {
                let s = String::from_utf8(b).map_err(|_| unsupported())?;
                let scale = col.meta.get(1).copied().unwrap_or(0) as usize;
                Json::String(pad_scale(s, scale))
            }
            MYSQL_TYPE_YEAR => {
                let y: i64 = std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok()).ok_or_else(unsupported)?;
                // mysql_common adds 1900 to the stored byte; byte 0 is YEAR 0000.
                Json::from(if y == 1900 { 0 } else { y })
            }
            MYSQL_TYPE_BIT => Json::from(b.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64)),
            MYSQL_TYPE_TIMESTAMP2 => {
                let s = std::str::from_utf8(&b).map_err(|_| unsupported())?;
                let (sec, us) = match s.split_once('.') {
                    Some((a, f)) => (a.parse::<i64>().map_err(|_| unsupported())?, f.parse::<u32>().map_err(|_| unsupported())?),
                    None => (s.parse::<i64>().map_err(|_| unsupported())?, 0),
                };
                Json::String(utc_instant(sec, us, col.meta.first().copied().unwrap_or(0)))
            }
            MYSQL_TYPE_SET => {
                let mask = b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64);
                let labels = (0..64)
                    .filter(|bit| mask & (1u64 << bit) != 0)
                    .map(|bit| Json::String(col.set_labels.get(bit).cloned().unwrap_or_else(|| format!("#{bit}"))))
                    .collect();
                Json::Array(labels)
            }
            MYSQL_TYPE_GEOMETRY => {
                if b.len() < 4 {
                    return Err(unsupported());
                }
                let srid = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                serde_json::json!({ "srid": srid, "wkb": base64::engine::general_purpose::STANDARD.encode(&b[4..]) })
            }
            MYSQL_TYPE_STRING
            | MYSQL_TYPE_VARCHAR
            | MYSQL_TYPE_VAR_STRING
            | MYSQL_TYPE_BLOB
            | MYSQL_TYPE_TINY_BLOB
            | MYSQL_TYPE_MEDIUM_BLOB
            | MYSQL_TYPE_LONG_BLOB => {
                let mut b = b;
                if col.charset == BINARY_CHARSET && col.ty == MYSQL_TYPE_STRING {
                    let n = string_len(&col.meta);
                    if b.len() < n {
                        b.resize(n, 0);
                    }
                }
                text_or_base64(table, col, b)?
            }
            MYSQL_TYPE_VECTOR => {
                // MySQL 9 VECTOR: little-endian IEEE-754 float32 values.
                if b.len() % 4 != 0 {
                    return Err(unsupported());
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
            _ => return Err(unsupported()),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// MariaDB compressed events (log_bin_compress=ON)
// ---------------------------------------------------------------------------------------------

/// Whether an event of a type mysql_common 0.37 does not parse (`read_data` gives `None`) may be
/// passed over: MySQL's HEARTBEAT_LOG_EVENT_V2 (41) and MariaDB's ANNOTATE_ROWS (160),
/// BINLOG_CHECKPOINT (161), GTID_LIST (163) and START_ENCRYPTION (164) carry no rows; any
/// other type only when its header has `LOG_EVENT_IGNORABLE_F` (0x80, MySQL/MariaDB
/// log_event.h: "a replica that does not know the event may skip it"). MariaDB's GTID (162)
/// and compressed events (165-171) are decoded by binval before this question arises.
pub fn skippable_unknown_event(raw: u8, flags: u16) -> bool {
    const LOG_EVENT_IGNORABLE_F: u16 = 0x80;
    matches!(raw, 41 | 160 | 161 | 163 | 164) || flags & LOG_EVENT_IGNORABLE_F != 0
}

/// The plain event type a MariaDB compressed event type wraps, or `None` for any other type.
///
/// From MariaDB's `Log_event_type` (sql/log_event.h): QUERY_COMPRESSED_EVENT (165) is a
/// QUERY_EVENT (2); WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT_V1 (166-168) are the v1 row
/// events (23-25); WRITE/UPDATE/DELETE_ROWS_COMPRESSED_EVENT (169-171) the v2 row events
/// (30-32). mysql_common 0.37 knows none of them (`read_data` returns `Ok(None)`).
pub fn mariadb_compressed_plain_type(raw: u8) -> Option<EventType> {
    Some(match raw {
        165 => EventType::QUERY_EVENT,
        166 => EventType::WRITE_ROWS_EVENT_V1,
        167 => EventType::UPDATE_ROWS_EVENT_V1,
        168 => EventType::DELETE_ROWS_EVENT_V1,
        169 => EventType::WRITE_ROWS_EVENT,
        170 => EventType::UPDATE_ROWS_EVENT,
        171 => EventType::DELETE_ROWS_EVENT,
        _ => return None,
    })
}

/// MariaDB's name of a compressed event type (`Log_event::get_type_str`), e.g.
/// `Write_rows_compressed_v1`; `Unknown` for other types.
pub fn mariadb_compressed_name(raw: u8) -> &'static str {
    match raw {
        165 => "Query_compressed",
        166 => "Write_rows_compressed_v1",
        167 => "Update_rows_compressed_v1",
        168 => "Delete_rows_compressed_v1",
        169 => "Write_rows_compressed",
        170 => "Update_rows_compressed",
        171 => "Delete_rows_compressed",
        _ => "Unknown",
    }
}

/// Turn a MariaDB compressed event (types 165-171, see [`mariadb_compressed_plain_type`]) into
/// the plain event it wraps, so that mysql_common parses it and binval decodes it exactly like
/// an uncompressed one. The returned event keeps the original header (time, server_id, log_pos)
/// with the plain type and the new size, and carries no checksum (the original one was checked
/// by the reader, over the compressed bytes).
///
/// Format, from MariaDB's sql/log_event.cc (`query_event_uncompress`,
/// `row_log_event_uncompress`, `binlog_buf_uncompress`, `binlog_get_uncompress_len`): only the
/// tail is compressed: the query text of a query event (after the status variables and the
/// schema name with its NUL), the row images of a row event (after the post-header, the
/// variable-length extra header of v2 events, the column count and the column bitmaps). The
/// compressed record is one header byte (bit 7 set; bits 4-6 the algorithm, 0 = zlib, the only
/// one defined; bits 0-2 the byte width, 1-4, of the length), the uncompressed length in that
/// many **big-endian** bytes, then a zlib stream.
///
/// The clear part is located by mysql_common itself: the event is first parsed with the plain
/// type (its query text / rows data then are the compressed record). No byte of the clear part
/// is parsed by binval.
///
/// Errors: [`DecodeError::Compressed`] naming the event and what is wrong; the caller adds the
/// binlog position. Never an empty or partial result.
pub fn uncompress_mariadb_event(ev: &Event) -> Result<Event, DecodeError> {
    let header = ev.header();
    let raw = header.event_type_raw();
    let event = mariadb_compressed_name(raw);
    let err = |detail: String| DecodeError::Compressed { event, detail };
    let plain = mariadb_compressed_plain_type(raw).ok_or_else(|| err(format!("event type {raw} is not a compressed event type")))?;
    let fde = {
        let fde = ev.fde().clone();
        let mut footer = fde.footer();
        footer.set_checksum_enabled(false);
        fde.with_footer(footer)
    };
    let data = ev.data();
    let framed = reframe(&fde, header, plain, data).map_err(&err)?;
    let clear_len = match framed.read_data() {
        Ok(Some(EventData::QueryEvent(q))) => data.len() - q.query_raw().len(),
        Ok(Some(EventData::RowsEvent(r))) => data.len() - r.rows_data().len(),
        Ok(_) => return Err(err(format!("mysql_common does not read it as a {plain:?}"))),
        Err(e) => return Err(err(format!("its uncompressed part is unreadable: {e}"))),
    };
    let tail = uncompress_record(&data[clear_len..]).map_err(&err)?;
    let mut plain_data = Vec::with_capacity(clear_len + tail.len());
    plain_data.extend_from_slice(&data[..clear_len]);
    plain_data.extend_from_slice(&tail);
    reframe(&fde, header, plain, &plain_data).map_err(err)
}

/// An event of type `ty` with the header fields of `header` and body `data`, read back by
/// mysql_common (`fde` must have checksums disabled: `data` carries none).
fn reframe(
    fde: &mysql_common::binlog::events::FormatDescriptionEvent<'static>,
    header: BinlogEventHeader,
    ty: EventType,
    data: &[u8],
) -> Result<Event, String> {
    let size = BinlogEventHeader::LEN + data.len();
    let size32 = u32::try_from(size).map_err(|_| format!("uncompressed event of {size} bytes exceeds the 4 GiB event size limit"))?;
    let h = BinlogEventHeader::new(header.timestamp(), ty, header.server_id(), size32, header.log_pos(), header.flags());
    let mut buf = Vec::with_capacity(size);
    h.serialize(&mut buf);
    buf.extend_from_slice(data);
    Event::read(fde, &buf[..]).map_err(|e| format!("rebuilt {ty:?} unreadable: {e}"))
}

/// Decompress one MariaDB compressed record (see [`uncompress_mariadb_event`] for the format).
/// The result has exactly the announced length, or this is an error.
fn uncompress_record(rec: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let (&h, rest) = rec.split_first().ok_or("the compressed record is empty")?;
    if h & 0x80 == 0 {
        return Err(format!("record header byte {h:#04x} lacks the compressed flag 0x80"));
    }
    let alg = (h & 0x70) >> 4;
    if alg != 0 {
        return Err(format!("record header byte {h:#04x} names compression algorithm {alg}; MariaDB defines only 0 (zlib)"));
    }
    let lenlen = (h & 0x07) as usize;
    if !(1..=4).contains(&lenlen) {
        return Err(format!("record header byte {h:#04x} gives a {lenlen}-byte length; MariaDB writes 1 to 4"));
    }
    if rest.len() < lenlen {
        return Err(format!("record ends inside its {lenlen}-byte length"));
    }
    let len = rest[..lenlen].iter().fold(0usize, |a, &b| (a << 8) | b as usize);
    if len == 0 {
        return Err("record announces an uncompressed length of 0".into());
    }
    let mut out = Vec::with_capacity(len);
    flate2::read::ZlibDecoder::new(&rest[lenlen..])
        .take(len as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("zlib data ({} bytes) is corrupt: {e}", rest.len() - lenlen))?;
    if out.len() != len {
        return Err(format!("zlib data gives {} bytes, the record header announces {len}", out.len()));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// MySQL 8 TRANSACTION_PAYLOAD (binlog_transaction_compression=ON)
// ---------------------------------------------------------------------------------------------

/// The events inside a MySQL 8 TRANSACTION_PAYLOAD event, in order: typically QUERY `BEGIN`,
/// TABLE_MAPs, row events and the XID (the GTID stays outside). The payload is decompressed
/// with mysql_common (`TransactionPayloadEvent::decompressed`, zstd or none) and cut into
/// events here: each inner event is read by its own header's size (mysql_common's
/// `EventStreamReader::read_decompressed` panics on an inner event cut short), without
/// checksums (MySQL WL#3549: inner events carry none).
///
/// The whole transaction is held in memory (compressed by the server's packet, decompressed
/// here); MySQL writes one payload event per transaction.
///
/// Errors ([`DecodeError::Payload`]): zstd failure, an inner event shorter than its header or
/// than the payload left, a decompressed size different from the event's uncompressed size
/// field, a FORMAT_DESCRIPTION / TRANSACTION_PAYLOAD / ROTATE inside. Never a partial list.
pub fn transaction_payload_events(ev: &Event) -> Result<Vec<Event>, DecodeError> {
    use mysql_common::binlog::events::TransactionPayloadEvent;
    use std::io::Read as _;
    let err = |m: String| DecodeError::Payload(m);
    let tpe: TransactionPayloadEvent<'_> = ev.read_event().map_err(|e| err(format!("its header is unreadable: {e}")))?;
    let announced = tpe.uncompressed_size();
    let mut reader = tpe.decompressed().map_err(|e| err(format!("{:?} decompression: {e}", tpe.algorithm())))?;
    let fde = {
        let fde = ev.fde().clone();
        let mut footer = fde.footer();
        footer.set_checksum_enabled(false);
        fde.with_footer(footer)
    };
    let mut events = Vec::new();
    let mut offset: u64 = 0;
    loop {
        let mut buf = vec![0u8; BinlogEventHeader::LEN];
        let mut got = 0;
        while got < buf.len() {
            match reader.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => {
                    return Err(err(format!("{:?} decompression failed at payload offset {}: {e}", tpe.algorithm(), offset + got as u64)))
                }
            }
        }
        if got == 0 {
            break;
        }
        if got < BinlogEventHeader::LEN {
            return Err(err(format!(
                "the payload ends inside an event header at offset {offset} ({got} of {} bytes)",
                BinlogEventHeader::LEN
            )));
        }
        let size = u32::from_le_bytes([buf[9], buf[10], buf[11], buf[12]]) as usize;
        let ty = buf[4];
        if size < BinlogEventHeader::LEN {
            return Err(err(format!("inner event at offset {offset} has length {size}, shorter than its header")));
        }
        if size as u64 > announced.saturating_sub(offset) {
            return Err(err(format!(
                "inner event at offset {offset} has length {size}, beyond the announced uncompressed size {announced}"
            )));
        }
        buf.resize(size, 0);
        reader
            .read_exact(&mut buf[BinlogEventHeader::LEN..])
            .map_err(|e| err(format!("inner event at offset {offset} ({size} bytes) is cut short: {e}")))?;
        if matches!(
            EventType::try_from(ty),
            Ok(EventType::FORMAT_DESCRIPTION_EVENT | EventType::TRANSACTION_PAYLOAD_EVENT | EventType::ROTATE_EVENT)
        ) {
            return Err(err(format!(
                "inner event at offset {offset} is a {:?}, which cannot be inside a payload",
                EventType::try_from(ty).unwrap()
            )));
        }
        events.push(Event::read(&fde, &buf[..]).map_err(|e| err(format!("inner event at offset {offset}: {e}")))?);
        offset += size as u64;
    }
    if offset != announced {
        return Err(err(format!("the payload holds {offset} bytes of events, the event announces {announced}")));
    }
    Ok(events)
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
    col.text.decode(b).map(Json::String).map_err(|charset| DecodeError::BadText {
        table: table.into(),
        column: col.name.to_string(),
        charset,
    })
}

/// A FLOAT as the shortest decimal that reads back as the same f32 (what MySQL prints:
/// `1.1`, not `1.100000023841858`).
fn f32_json(f: f32) -> Json {
    f.to_string().parse::<f64>().ok().and_then(Number::from_f64).map(Json::Number).unwrap_or(Json::Null)
}

/// Append `.` and the first `fsp` (0-6) digits of the 6-digit microseconds `us`.
fn push_frac(t: &mut String, us: u32, fsp: u8) {
    if fsp == 0 {
        return;
    }
    t.push('.');
    let mut div = 100_000;
    for _ in 0..fsp.min(6) {
        t.push(char::from(b'0' + ((us / div) % 10) as u8));
        div /= 10;
    }
}

fn frac(us: u32, fsp: u8) -> String {
    if fsp == 0 {
        return String::new();
    }
    let digits = format!("{us:06}");
    format!(".{}", &digits[..fsp.min(6) as usize])
}

fn pad_scale(s: String, scale: usize) -> String {
    if scale == 0 {
        return s;
    }
    match s.split_once('.') {
        Some((_, f)) if f.len() >= scale => s,
        Some((_, f)) => {
            let missing = scale - f.len();
            s + &"0".repeat(missing)
        }
        None => format!("{s}.{}", "0".repeat(scale)),
    }
}

/// Format Unix seconds + microseconds as an RFC 3339 UTC instant with `fsp` fraction digits,
/// e.g. `2026-11-30T22:31:12.120Z`. TIMESTAMP 0 (the zero timestamp) is `0000-00-00 00:00:00`.
pub fn utc_instant(secs: i64, us: u32, fsp: u8) -> String {
    if secs == 0 && us == 0 {
        return "0000-00-00 00:00:00".to_string() + &frac(0, fsp);
    }
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{}Z", rem / 3600, (rem % 3600) / 60, rem % 60, frac(us, fsp))
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants() {
        assert_eq!(utc_instant(1_764_541_872, 0, 0), "2025-11-30T22:31:12Z");
        assert_eq!(utc_instant(1, 120_000, 3), "1970-01-01T00:00:01.120Z");
        assert_eq!(utc_instant(951_782_400, 0, 0), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn scale_padding() {
        assert_eq!(pad_scale("1.5".into(), 2), "1.50");
        assert_eq!(pad_scale("-3".into(), 2), "-3.00");
        assert_eq!(pad_scale("7".into(), 0), "7");
        assert_eq!(pad_scale("0.125".into(), 3), "0.125");
    }

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
            out.push(RowChange { table: table.name.clone(), kind, before, after, event: 0 });
        }
        Ok(out)
    }

    /// A MariaDB compressed record (`binlog_buf_compress`): header byte, big-endian length,
    /// zlib stream.
    fn record(plain: &[u8], lenlen: usize) -> Vec<u8> {
        use std::io::Write as _;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(plain).unwrap();
        let mut r = vec![0x80 | lenlen as u8];
        r.extend_from_slice(&(plain.len() as u32).to_be_bytes()[4 - lenlen..]);
        r.extend(z.finish().unwrap());
        r
    }

    #[test]
    fn compressed_records() {
        let small = b"0123456789".repeat(3);
        assert_eq!(uncompress_record(&record(&small, 1)).unwrap(), small);
        // Lengths are big-endian: 0x01_02 bytes must not be read as 0x02_01.
        let big = (0..0x0102u32).map(|i| i as u8).collect::<Vec<_>>();
        assert_eq!(uncompress_record(&record(&big, 2)).unwrap(), big);
        let huge = b"abc".repeat(100_000);
        assert_eq!(uncompress_record(&record(&huge, 3)).unwrap(), huge);
        assert_eq!(uncompress_record(&record(&huge, 4)).unwrap(), huge);

        let mut bad = record(&small, 1);
        bad[0] = 0x01;
        assert!(uncompress_record(&bad).unwrap_err().contains("lacks the compressed flag"));
        bad[0] = 0x91;
        assert!(uncompress_record(&bad).unwrap_err().contains("algorithm 1"));
        bad[0] = 0x85;
        assert!(uncompress_record(&bad).unwrap_err().contains("5-byte length"));
        let mut wrong_len = record(&small, 1);
        wrong_len[1] += 1;
        assert!(uncompress_record(&wrong_len).unwrap_err().contains("announces 31"));
        let mut corrupt = record(&huge, 3);
        let n = corrupt.len();
        corrupt[n - 2] ^= 0xff; // the zlib stream's Adler-32
        assert!(uncompress_record(&corrupt).unwrap_err().contains("corrupt"));
        let truncated = &record(&huge, 3)[..40];
        assert!(uncompress_record(truncated).is_err());
        assert!(uncompress_record(&[]).is_err());
        assert!(uncompress_record(&[0x82, 0x01]).unwrap_err().contains("ends inside"));
    }

    /// The TRANSACTION_PAYLOAD of a real MySQL 8 binlog unwraps into its inner events; a
    /// damaged or cut payload is an error, never a panic or a partial list.
    #[test]
    fn transaction_payload_unwraps_and_fails_loudly() {
        use mysql_common::binlog::consts::BinlogVersion;
        use mysql_common::binlog::BinlogFile;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/binlogs/mysql-test/transaction_compression.000001");
        let f = std::fs::File::open(path).unwrap();
        let file = BinlogFile::new(BinlogVersion::Version4, std::io::BufReader::new(f)).unwrap();
        let payload = file
            .map(|e| e.unwrap())
            .find(|e| e.header().event_type_raw() == EventType::TRANSACTION_PAYLOAD_EVENT as u8)
            .expect("a payload event");
        let inner = transaction_payload_events(&payload).unwrap();
        let types: Vec<u8> = inner.iter().map(|e| e.header().event_type_raw()).collect();
        assert_eq!(types.first(), Some(&(EventType::QUERY_EVENT as u8)), "{types:?}");
        assert_eq!(types.last(), Some(&(EventType::XID_EVENT as u8)), "{types:?}");
        assert!(types.contains(&(EventType::TABLE_MAP_EVENT as u8)) && types.contains(&(EventType::WRITE_ROWS_EVENT as u8)), "{types:?}");

        // Damage the zstd data (the payload is the tail of the event body).
        let mut bytes = Vec::new();
        payload.write(BinlogVersion::Version4, &mut bytes).unwrap();
        let body_end = bytes.len() - 4; // CRC32
        for at in [body_end - 3, body_end - 12, body_end / 2 + 10] {
            let mut b = bytes.clone();
            b[at] ^= 0x5a;
            let ev = Event::read(payload.fde(), &b[..]).unwrap();
            match transaction_payload_events(&ev) {
                Err(DecodeError::Payload(m)) => assert!(!m.is_empty()),
                other => panic!("damaged payload at byte {at}: {:?}", other.map(|v| v.len())),
            }
        }
    }

    /// Case 15 (../shared/cases/15-json-partial-update.md) A-D, as the diffs MySQL logs for
    /// them (binary JSON values: 0x05 int16, 0x04 literal, 0x0c string).
    #[test]
    fn json_diffs_apply_to_the_before_value() {
        use mysql_common::binlog::jsondiff::JsonDiff;
        fn diff(op: u8, path: &str, value: Option<&[u8]>) -> JsonDiff<'static> {
            let mut b = vec![op, path.len() as u8];
            b.extend_from_slice(path.as_bytes());
            if let Some(v) = value {
                b.push(v.len() as u8);
                b.extend_from_slice(v);
            }
            let leaked: &'static [u8] = Box::leak(b.into_boxed_slice());
            ParseBuf(leaked).parse(()).unwrap()
        }
        let (replace, insert, remove) = (0, 1, 2);
        let base = serde_json::json!({"id": 1, "name": "java"});
        // (A) JSON_SET(c1, '$.id', 3, '$.star', 5)
        let a =
            apply_json_diffs(&base, &[diff(replace, "$.id", Some(&[0x05, 3, 0])), diff(insert, "$.star", Some(&[0x05, 5, 0]))]).unwrap();
        assert_eq!(a, serde_json::json!({"id": 3, "name": "java", "star": 5}));
        // (B) JSON_REMOVE(c1, '$.name')
        let b = apply_json_diffs(&a, &[diff(remove, "$.name", None)]).unwrap();
        assert_eq!(b, serde_json::json!({"id": 3, "star": 5}));
        // (C) an array: append at the end, insert in front, remove
        let arr = serde_json::json!([1, 2, "x"]);
        let c = apply_json_diffs(
            &arr,
            &[diff(insert, "$[3]", Some(&[0x0c, 1, b'y'])), diff(insert, "$[0]", Some(&[0x04, 0x01])), diff(remove, "$[1]", None)],
        )
        .unwrap();
        assert_eq!(c, serde_json::json!([true, 2, "x", "y"]));
        // (D) JSON_REPLACE(c1, '$.r', NULL): a JSON null, not SQL NULL
        let d = apply_json_diffs(&serde_json::json!({"r": 1}), &[diff(replace, "$.r", Some(&[0x04, 0x00]))]).unwrap();
        assert_eq!(d, serde_json::json!({"r": null}));
        // A diff that does not fit the before value is an error, not a guess.
        assert!(apply_json_diffs(&base, &[diff(replace, "$.missing", Some(&[0x05, 1, 0]))]).unwrap_err().contains("$.missing"));
        assert!(apply_json_diffs(&base, &[diff(remove, "$.a.b", None)]).is_err());
        assert!(apply_json_diffs(&arr, &[diff(replace, "$[7]", Some(&[0x05, 1, 0]))]).is_err());
    }

    #[test]
    fn json_paths() {
        assert_eq!(json_path_legs("$"), Some(vec![]));
        assert_eq!(json_path_legs("$.age"), Some(vec![Leg::Member("age".into())]));
        assert_eq!(json_path_legs("$.a[3].b"), Some(vec![Leg::Member("a".into()), Leg::Index(3), Leg::Member("b".into())]));
        assert_eq!(json_path_legs(r#"$."k.e\"y"[0]"#), Some(vec![Leg::Member("k.e\"y".into()), Leg::Index(0)]));
        assert_eq!(json_path_legs("$[*]"), None);
        assert_eq!(json_path_legs("$.*"), None);
        assert_eq!(json_path_legs("$[last]"), None);
    }

    #[test]
    fn compressed_types() {
        assert_eq!(mariadb_compressed_plain_type(165), Some(EventType::QUERY_EVENT));
        assert_eq!(mariadb_compressed_plain_type(167), Some(EventType::UPDATE_ROWS_EVENT_V1));
        assert_eq!(mariadb_compressed_plain_type(171), Some(EventType::DELETE_ROWS_EVENT));
        assert_eq!(mariadb_compressed_plain_type(162), None);
        assert_eq!(mariadb_compressed_plain_type(23), None);
    }

    #[test]
    fn fractions() {
        for (us, fsp) in [(123_456, 3), (5, 6), (5, 0), (999_999, 6), (100_000, 1), (0, 2), (120_000, 2)] {
            let mut t = String::new();
            push_frac(&mut t, us, fsp);
            assert_eq!(t, frac(us, fsp), "{us} {fsp}");
        }
        assert_eq!(frac(123_456, 3), ".123");
        assert_eq!(frac(5, 6), ".000005");
        assert_eq!(frac(5, 0), "");
    }
}
