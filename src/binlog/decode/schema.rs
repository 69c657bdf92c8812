//! The table as one TABLE_MAP event describes it: [`TableSchema`] and its [`ColumnSchema`]s,
//! prepared once per TABLE_MAP from its optional metadata (`binlog_row_metadata=FULL`): column
//! names, signedness, charsets and ENUM/SET labels, exactly as the table was when the row was
//! written (every TABLE_MAP carries them, so they follow ALTER TABLE).

use std::sync::Arc;

use mysql_common::binlog::events::{ColumnCharsets, DefaultCharset, OptionalMetadataField, TableMapEvent};
use mysql_common::constants::ColumnType;

use super::DecodeError;

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
    /// A column the server adds for itself, which `SELECT *` never shows (MariaDB's long-UNIQUE
    /// hash columns, see `mark_hidden_columns`): decoded (the row image holds it) but left out
    /// of rows unless [`TableSchema::keep_hidden`].
    pub hidden: bool,
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
    pub(super) all_columns: Vec<usize>,
    /// The TABLE_MAP named the columns (`binlog_row_metadata=FULL`); without names (MINIMAL, or
    /// MySQL before 8.0.1) they are `@0`, `@1`, ... and ENUM/SET values have no labels.
    pub has_column_names: bool,
    /// Put [`ColumnSchema::hidden`] columns into the rows too (`binval decode --hidden-columns`).
    pub keep_hidden: bool,
    /// Text columns whose values are JSON documents (MariaDB's JSON type is LONGTEXT with a
    /// `json_valid` check, which the TABLE_MAP does not show): set by the reader from the
    /// source's schema when it prepares the TABLE_MAP (`binlog::json_columns`); `None` for none.
    pub json_columns: Option<Arc<[String]>>,
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
        let mut columns = typed_columns(&tme, &name)?;
        let have_names =
            apply_optional_metadata(&tme, &mut columns, mariadb).map_err(|e| DecodeError::Parse { table: name.to_string(), source: e })?;
        for c in &mut columns {
            c.text = crate::binlog::decode::charset::Charset::of(c.charset);
        }
        if mariadb {
            refuse_legacy_temporal(&name, &columns)?;
            mark_hidden_columns(&mut columns);
        }
        if require_names && !have_names && !columns.is_empty() {
            return Err(DecodeError::NoColumnNames { table: name.to_string() });
        }
        let all_columns = (0..columns.len()).collect();
        Ok(TableSchema { name, columns, tme, all_columns, has_column_names: have_names, keep_hidden: false, json_columns: None })
    }

    /// True when `tme` is byte for byte the TABLE_MAP this schema was prepared from (same
    /// table id, names, types, metadata): its rows decode exactly as with a newly prepared
    /// schema. MySQL and MariaDB write a TABLE_MAP before the row events of every statement;
    /// readers reuse the prepared schema instead of preparing it again.
    pub fn same_table_map(&self, tme: &TableMapEvent<'_>) -> bool {
        self.tme == *tme
    }
}

/// The columns of `tme` with their types and type metadata, named `@0`, `@1`, ... until the
/// optional metadata names them. A column without a type is an unsupported type.
fn typed_columns(tme: &TableMapEvent<'static>, name: &Arc<str>) -> Result<Vec<ColumnSchema>, DecodeError> {
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
        let meta = tme.get_column_metadata(i).unwrap_or(&[]);
        let needed = metadata_needed(ty, meta);
        if meta.len() < needed {
            // mysql_common indexes the metadata of these types without checking its length.
            return Err(DecodeError::Parse {
                table: name.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("TABLE_MAP gives column #{i} ({ty:?}) {} metadata bytes, its type needs {needed}", meta.len()),
                ),
            });
        }
        if ty == ColumnType::MYSQL_TYPE_NEWDECIMAL && meta[1] > meta[0] {
            // mysql_common computes precision - scale unchecked.
            return Err(DecodeError::Parse {
                table: name.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("TABLE_MAP gives column #{i} DECIMAL scale {} above its precision {}", meta[1], meta[0]),
                ),
            });
        }
        columns.push(ColumnSchema {
            name: Arc::from(format!("@{i}").as_str()),
            ty,
            meta: meta.to_vec(),
            unsigned: false,
            charset: 0,
            text: crate::binlog::decode::charset::Charset::of(0),
            enum_labels: Vec::new(),
            set_labels: Vec::new(),
            hidden: false,
        });
    }
    Ok(columns)
}

/// Check the ENUM / SET labels of a TABLE_MAP (per column: a length-encoded count, then that
/// many length-encoded strings) before mysql_common reads them: it reserves memory for the
/// count before reading any label, so a damaged count allocated without bound (found by
/// fuzzing). Each label takes at least one byte, so the count is bounded by the bytes left.
fn check_str_values(vals: &impl mysql_common::proto::MySerialize) -> std::io::Result<()> {
    let mut raw = Vec::new();
    vals.serialize(&mut raw);
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TABLE_MAP ENUM/SET labels: {m}"));
    let mut buf = mysql_common::io::ParseBuf(&raw);
    while !buf.is_empty() {
        let n = buf.checked_eat_lenenc_int().ok_or_else(|| bad("truncated label count"))?;
        if n > buf.len() as u64 {
            return Err(bad(&format!("{n} labels announced, {} bytes left", buf.len())));
        }
        for _ in 0..n {
            buf.checked_eat_lenenc_str().ok_or_else(|| bad("truncated label"))?;
        }
    }
    Ok(())
}

/// How many TABLE_MAP metadata bytes mysql_common 0.37 reads, unchecked, when it parses a
/// value of type `ty` (a TABLE_MAP with fewer made it panic: found by fuzzing). A typed array
/// is read as the type its first metadata byte names.
fn metadata_needed(ty: ColumnType, meta: &[u8]) -> usize {
    use ColumnType::*;
    let ty = match (ty, meta.first()) {
        (MYSQL_TYPE_TYPED_ARRAY, None) => return 1,
        (MYSQL_TYPE_TYPED_ARRAY, Some(&t)) => ColumnType::try_from(t).unwrap_or(MYSQL_TYPE_TYPED_ARRAY),
        (ty, _) => ty,
    };
    match ty {
        MYSQL_TYPE_STRING
        | MYSQL_TYPE_BIT
        | MYSQL_TYPE_NEWDECIMAL
        | MYSQL_TYPE_ENUM
        | MYSQL_TYPE_SET
        | MYSQL_TYPE_VARCHAR
        | MYSQL_TYPE_VAR_STRING => 2,
        MYSQL_TYPE_TIMESTAMP2
        | MYSQL_TYPE_DATETIME2
        | MYSQL_TYPE_TIME2
        | MYSQL_TYPE_TINY_BLOB
        | MYSQL_TYPE_MEDIUM_BLOB
        | MYSQL_TYPE_LONG_BLOB
        | MYSQL_TYPE_BLOB
        | MYSQL_TYPE_GEOMETRY
        | MYSQL_TYPE_VECTOR
        | MYSQL_TYPE_TYPED_ARRAY => 1,
        _ => 0,
    }
}

/// Apply the TABLE_MAP optional metadata (`binlog_row_metadata=FULL`) to `columns`:
/// signedness, charsets, column names, ENUM and SET labels. Each field lists only the columns
/// it covers (numeric, character, ENUM, SET), in table order. Returns whether the column names
/// were there.
fn apply_optional_metadata(tme: &TableMapEvent<'static>, columns: &mut [ColumnSchema], mariadb: bool) -> std::io::Result<bool> {
    let n = columns.len();
    let numeric: Vec<usize> = (0..n).filter(|&i| columns[i].ty.is_numeric_type()).collect();
    let character: Vec<usize> = (0..n).filter(|&i| charset_column(columns[i].ty, mariadb)).collect();
    let enums: Vec<usize> = (0..n).filter(|&i| columns[i].ty == ColumnType::MYSQL_TYPE_ENUM).collect();
    let sets: Vec<usize> = (0..n).filter(|&i| columns[i].ty == ColumnType::MYSQL_TYPE_SET).collect();
    let enum_or_set: Vec<usize> = (0..n).filter(|&i| columns[i].ty.is_enum_or_set_type()).collect();
    let mut have_names = false;
    for field in tme.iter_optional_meta() {
        match field? {
            OptionalMetadataField::Signedness(bits) => {
                for (k, &i) in numeric.iter().enumerate() {
                    columns[i].unsigned = bits.get(k).map(|b| *b).unwrap_or(false);
                }
            }
            OptionalMetadataField::DefaultCharset(dc) => default_charsets(columns, &character, &dc)?,
            OptionalMetadataField::ColumnCharset(cs) => column_charsets(columns, &character, &cs)?,
            OptionalMetadataField::EnumAndSetDefaultCharset(dc) => default_charsets(columns, &enum_or_set, &dc)?,
            OptionalMetadataField::EnumAndSetColumnCharset(cs) => column_charsets(columns, &enum_or_set, &cs)?,
            OptionalMetadataField::ColumnName(names) => {
                have_names = true;
                for (i, nm) in names.iter_names().enumerate() {
                    if let Some(c) = columns.get_mut(i) {
                        c.name = Arc::from(nm?.name().as_ref());
                    }
                }
            }
            OptionalMetadataField::EnumStrValue(vals) => {
                check_str_values(&vals)?;
                for (k, v) in vals.iter_values().enumerate() {
                    let v = v?;
                    if let Some(&i) = enums.get(k) {
                        columns[i].enum_labels = v.values().iter().map(|s| s.value().into_owned()).collect();
                    }
                }
            }
            OptionalMetadataField::SetStrValue(vals) => {
                check_str_values(&vals)?;
                for (k, v) in vals.iter_values().enumerate() {
                    let v = v?;
                    if let Some(&i) = sets.get(k) {
                        columns[i].set_labels = v.values().iter().map(|s| s.value().into_owned()).collect();
                    }
                }
            }
            _ => {}
        }
    }
    Ok(have_names)
}

/// Mark MariaDB's long-UNIQUE hash columns hidden. A UNIQUE key too long for a B-tree (on a
/// TEXT or BLOB column, say) makes MariaDB (10.4+) add a column of its own holding a hash of the
/// key, `INVISIBLE_FULL`: no statement can read it, `SELECT *` and information_schema do not
/// show it, but the binlog's row images carry it like any column. MariaDB names it
/// `DB_ROW_HASH_<n>` (the first free n: a user column `DB_ROW_HASH_1` makes it
/// `DB_ROW_HASH_2`), types it BIGINT UNSIGNED and appends it after every other column
/// (`add_hash_field` in MariaDB's sql_table.cc). The TABLE_MAP has no visibility flag, so that
/// is what is checked: the trailing run of BIGINT UNSIGNED columns named `DB_ROW_HASH_<digits>`.
/// A user's own column could only be taken for one if it matched all of it (name, type, and
/// no other column after it).
fn mark_hidden_columns(columns: &mut [ColumnSchema]) {
    for c in columns.iter_mut().rev() {
        let hash_name = c.name.strip_prefix("DB_ROW_HASH_").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !(hash_name && c.ty == ColumnType::MYSQL_TYPE_LONGLONG && c.unsigned) {
            break;
        }
        c.hidden = true;
    }
}

/// Refuse a MariaDB table with legacy temporal columns. MariaDB writes DATETIME2/TIME2/
/// TIMESTAMP2 for every column in the current format; the old type codes mean the legacy
/// format (see [`DecodeError::LegacyTemporal`]).
fn refuse_legacy_temporal(name: &str, columns: &[ColumnSchema]) -> Result<(), DecodeError> {
    let legacy: Vec<&str> = columns
        .iter()
        .filter(|c| matches!(c.ty, ColumnType::MYSQL_TYPE_DATETIME | ColumnType::MYSQL_TYPE_TIME | ColumnType::MYSQL_TYPE_TIMESTAMP))
        .map(|c| &*c.name)
        .collect();
    if !legacy.is_empty() {
        return Err(DecodeError::LegacyTemporal { table: name.to_string(), columns: legacy.join(", ") });
    }
    Ok(())
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
