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
//!   ([`DecodeError::LegacyTemporal`]).
//!
//! Anything that cannot be decoded exactly is a [`DecodeError`] naming the table and column:
//! the pipeline stops rather than cache a wrong value.
//!
//! Events mysql_common does not read (MariaDB's compressed events, MySQL 8 TRANSACTION_PAYLOAD,
//! unknown types) are unwrapped before they get here, by [`crate::binlog::framing`].
//!
//! | file | concern |
//! |---|---|
//! | `schema.rs` | [`TableSchema`], [`ColumnSchema`]: one TABLE_MAP and its optional metadata |
//! | `rows.rs` | [`decode_rows`]: row images of one row event -> [`RowChange`]s |
//! | `values.rs` | [`value_to_json`]: one value -> its canonical JSON form |
//! | `result_set.rs` | [`column_value_to_json`]: a value of a SELECT's result set -> the same canonical form (table scans) |
//! | `json_diff.rs` | [`apply_json_diffs`]: MySQL partial JSON updates |
//! | `charset.rs` | [`charset`]: text of a column decoded from its charset |

pub mod charset;
mod json_diff;
mod result_set;
mod rows;
mod schema;
mod values;

use mysql_common::constants::ColumnType;
use serde_json::{Map, Value as Json};

pub use json_diff::apply_json_diffs;
pub use result_set::column_value_to_json;
pub use rows::{decode_rows, RowChange, RowKind};
pub use schema::{charset_column, ColumnSchema, TableSchema};
pub use values::{utc_instant, value_to_json};

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
