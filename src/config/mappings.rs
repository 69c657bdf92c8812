//! `[[mappings]]`: which tables map to which cache keys, with how many replicas.

use serde::Deserialize;

/// What goes into the replicas.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum MappingMode {
    /// Replicas hold the payload (default).
    #[default]
    WriteThrough,
    /// Replicas are deleted; readers fill them from elsewhere.
    Invalidate,
}

/// Which columns form the payload.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Payload {
    /// `"row"`: the whole after image.
    Whole(String),
    /// A list of column names.
    Columns(Vec<String>),
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Whole("row".into())
    }
}

/// `[[mappings]]`: one table to one or more logical keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MappingConfig {
    /// `schema.table`.
    pub table: String,
    /// Key templates, e.g. `item:detail:{id}`; each `{column}` is a column of the table.
    pub keys: Vec<String>,
    /// Suffix replicas per key: `replicas = N` (1..=64, default 1) gives every key N copies;
    /// `replicas = { min = 1, max = 16 }` gives each key `min` copies until the fleet's reads
    /// of it need more (see `[adaptive]` and `crate::replicas`), at most `max`.
    #[serde(default, deserialize_with = "replicas_setting")]
    pub replicas: Replicas,
    /// `"row"` (default) or a list of columns.
    #[serde(default)]
    pub payload: Payload,
    /// `write-through` (default) or `invalidate`.
    #[serde(default)]
    pub mode: MappingMode,
    /// TTL of replicas, seconds; 0 (default) means no TTL.
    #[serde(default)]
    pub ttl_secs: u64,
    /// Text columns whose values are JSON documents, written into the payload as documents
    /// (not strings). Unset (default): on MariaDB, the table's JSON columns (LONGTEXT with the
    /// `json_valid` check MariaDB adds for the JSON type) are detected at start; MySQL's binary
    /// JSON is always a document. `[]` turns detection off.
    #[serde(default)]
    pub json_columns: Option<Vec<String>>,
    /// Accept key templates that do not identify one row (two rows may render one key): only
    /// with `mode = "invalidate"`, whose deletes then leave a stale marker instead of a
    /// tombstone, so readers ask their loader (which finds the other row, or none) instead of
    /// answering "no row" while another row still renders the key. Default false: every
    /// template must contain the columns of a unique key (`binlog::server::judge_key_templates`).
    #[serde(default)]
    pub allow_non_unique_keys: bool,
    /// The table may not exist yet when binval starts (a migration creates it later): its
    /// absence is then a note, and its rows are streamed from its `CREATE TABLE` on. Without
    /// it, `binval run` refuses to start on a mapped table the source does not have, as
    /// `binval check` does (a typo would otherwise stream nothing without a word). Default
    /// false.
    #[serde(default)]
    pub created_later: bool,
}

/// A mapping's replica count: `min == max` for a static count (`replicas = N`), a range for an
/// adaptive one (`replicas = { min, max }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    /// Copies every key has (a cold key's count).
    pub min: u32,
    /// Copies a hot key may get.
    pub max: u32,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas { min: 1, max: 1 }
    }
}

impl Replicas {
    /// A static count.
    pub fn fixed(n: u32) -> Self {
        Replicas { min: n, max: n }
    }

    /// True when the count of a key follows its reads (`min < max`).
    pub fn is_adaptive(&self) -> bool {
        self.min < self.max
    }
}

impl std::fmt::Display for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_adaptive() {
            write!(f, "{}..={}", self.min, self.max)
        } else {
            write!(f, "{}", self.min)
        }
    }
}

pub(super) fn replicas_setting<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Replicas, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Setting {
        Fixed(u32),
        Range { min: Option<u32>, max: u32 },
    }
    match Setting::deserialize(d) {
        Ok(Setting::Fixed(n)) => Ok(Replicas::fixed(n)),
        Ok(Setting::Range { min, max }) => Ok(Replicas { min: min.unwrap_or(1), max }),
        Err(_) => {
            Err(serde::de::Error::custom("`replicas` must be an integer (`replicas = 8`) or a range (`replicas = { min = 1, max = 16 }`)"))
        }
    }
}
