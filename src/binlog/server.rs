//! The source server: connecting, the preflight of the binlog settings binval needs, what the
//! server says about itself (version, checksums, current position, binary logs), and checks of
//! the mappings against its schema. Used by the reader and by every command.
//!
//! * Preflight refuses to start unless `log_bin=ON`, `binlog_format=ROW`,
//!   `binlog_row_image=FULL` and `binlog_row_metadata=FULL` (the decoder needs full images and
//!   column names), naming the setting to change.

use std::collections::HashMap;

use binval_protocol::{BinlogPosition, MariadbGtidPosition, MysqlGtidSet, SourcePosition};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};

use crate::config::SourceConfig;
use crate::error::{classify_mysql, DefiniteError, Error};

/// What the server says about itself.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `@@version`.
    pub version: String,
    /// True for MariaDB.
    pub mariadb: bool,
    /// `@@binlog_checksum` is not NONE.
    pub checksum: bool,
    /// Current binlog file and position (SHOW MASTER STATUS).
    pub current: SourcePosition,
    /// Which server this is: the one a binlog position belongs to (a position means nothing on
    /// another server, see [`crate::binlog::start_plan`]).
    pub identity: ServerIdentity,
    /// The server writes GTIDs every replica can resume by: MariaDB always (10.0+), MySQL with
    /// `gtid_mode = ON`.
    pub gtids: bool,
    /// MySQL: `Executed_Gtid_Set` of SHOW MASTER STATUS, read with `current` (so it is the GTID
    /// set of everything before `current`). `None` on MariaDB and without GTIDs.
    pub executed: Option<MysqlGtidSet>,
}

/// The identity of a source server: `@@server_id`, and on MySQL `@@server_uuid` (unique per
/// server, generated at its first start; MySQL docs, "Replication and Binary Logging Options").
/// MariaDB has no server UUID; its `server_id` must be unique within the replication topology.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerIdentity {
    /// `@@server_id`.
    pub server_id: u32,
    /// MySQL `@@server_uuid`; `None` on MariaDB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_uuid: Option<String>,
}

impl ServerIdentity {
    /// Whether `other` is this server: by UUID where both have one, else by `server_id`.
    pub fn same_server(&self, other: &ServerIdentity) -> bool {
        match (&self.server_uuid, &other.server_uuid) {
            (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
            _ => self.server_id == other.server_id,
        }
    }
}

impl std::fmt::Display for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server_id {}", self.server_id)?;
        if let Some(u) = &self.server_uuid {
            write!(f, " (server_uuid {u})")?;
        }
        Ok(())
    }
}

/// Connect with the configured URL (see [`source_opts`]), password and TLS settings
/// ([`crate::security::mysql`]).
pub async fn connect(cfg: &SourceConfig) -> Result<Conn, Error> {
    crate::security::mysql::connect(cfg).await
}

/// The connection options of `source.url` alone (see [`crate::security::mysql::url_opts`]:
/// TCP to the URL's host unless the URL asks for the socket).
pub fn source_opts(url: &str) -> Result<Opts, Error> {
    crate::security::mysql::url_opts(url)
}

/// Check the settings binval needs and read where the binlog is now.
pub async fn preflight(conn: &mut Conn) -> Result<ServerInfo, Error> {
    let q = |e| classify_mysql(e, "preflight");
    type Settings = (String, String, String, Option<String>, Option<String>);
    // MySQL < 8.0.1 has no binlog_row_metadata.
    let row: Option<Settings> = unknown_variable_is_none(
        conn.query_first("SELECT @@version, @@binlog_format, @@binlog_row_image, @@binlog_checksum, @@binlog_row_metadata").await,
    )
    .map_err(q)?;
    let Some((version, format, image, checksum, metadata)) = row else {
        return Err(DefiniteError::SourceSetting {
            setting: "binlog_row_metadata",
            found: "unsupported by this server".into(),
            want: "FULL",
        }
        .into());
    };
    let log_bin: Option<String> = conn.query_first("SELECT @@log_bin").await.map_err(q)?;
    if log_bin.as_deref() != Some("1") && log_bin.as_deref() != Some("ON") {
        return Err(DefiniteError::SourceSetting { setting: "log_bin", found: log_bin.unwrap_or_default(), want: "ON" }.into());
    }
    if !format.eq_ignore_ascii_case("ROW") {
        return Err(DefiniteError::SourceSetting { setting: "binlog_format", found: format, want: "ROW" }.into());
    }
    if !image.eq_ignore_ascii_case("FULL") {
        return Err(DefiniteError::SourceSetting { setting: "binlog_row_image", found: image, want: "FULL" }.into());
    }
    let metadata = metadata.unwrap_or_default();
    if !metadata.eq_ignore_ascii_case("FULL") {
        return Err(DefiniteError::SourceSetting { setting: "binlog_row_metadata", found: metadata, want: "FULL" }.into());
    }
    let collations: Vec<(Option<u64>, Option<String>)> =
        conn.query("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS").await.map_err(q)?;
    crate::binlog::decode::charset::learn_from_server(collations.into_iter().filter_map(|(id, cs)| Some((id? as u16, cs?))).collect());
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let (current, executed) = binlog_status(conn).await?.ok_or_else(|| DefiniteError::SourceSetting {
        setting: "log_bin",
        found: "no binlog (SHOW MASTER STATUS is empty)".into(),
        want: "ON",
    })?;
    let server_id: Option<u32> = conn.query_first("SELECT @@server_id").await.map_err(q)?;
    let (server_uuid, gtids) = if mariadb {
        (None, true)
    } else {
        // MySQL 5.5 and older: neither variable.
        let row: Option<(Option<String>, Option<String>)> =
            unknown_variable_is_none(conn.query_first("SELECT @@server_uuid, @@gtid_mode").await).map_err(q)?;
        let (uuid, mode) = row.unwrap_or_default();
        (uuid, mode.is_some_and(|m| m.eq_ignore_ascii_case("ON")))
    };
    Ok(ServerInfo {
        mariadb,
        version,
        checksum: !checksum.unwrap_or_default().eq_ignore_ascii_case("NONE"),
        current: SourcePosition { file: current.file, pos: current.pos, gtid: None },
        identity: ServerIdentity { server_id: server_id.unwrap_or_default(), server_uuid },
        gtids,
        executed: if gtids && !mariadb { executed } else { None },
    })
}

/// A `SELECT @@variable` answer: no row where the server has no such variable
/// (ER_UNKNOWN_SYSTEM_VARIABLE, 1193).
fn unknown_variable_is_none<T>(r: Result<Option<T>, mysql_async::Error>) -> Result<Option<T>, mysql_async::Error> {
    match r {
        Err(mysql_async::Error::Server(se)) if se.code == 1193 => Ok(None),
        r => r,
    }
}

/// MariaDB: the GTID position where binlog file `file` of this server begins: its GTID_LIST
/// event (`SHOW BINLOG EVENTS`, Info `[0-1-100,1-2-7]`: the last GTID per domain of the files
/// before it; MariaDB docs, "Gtid_list_log_event"). `None` when the file has none.
pub async fn mariadb_gtid_list(conn: &mut Conn, file: &str) -> Result<Option<MariadbGtidPosition>, Error> {
    let rows: Vec<mysql_async::Row> = conn
        .query(format!("SHOW BINLOG EVENTS IN '{}' LIMIT 8", file.replace('\'', "")))
        .await
        .map_err(|e| classify_mysql(e, &format!("SHOW BINLOG EVENTS IN '{file}'")))?;
    Ok(rows.into_iter().find_map(|r| {
        let kind: String = r.get_opt(2)?.ok()?;
        let info: String = r.get_opt(5)?.ok()?;
        (kind == "Gtid_list").then(|| info.trim().trim_start_matches('[').trim_end_matches(']').parse().ok()).flatten()
    }))
}

/// MariaDB: the GTID position at the binlog position `at` of this server
/// (`BINLOG_GTID_POS(file, pos)`, MariaDB docs: the server reads the file's GTID list and the
/// file up to `pos`), i.e. the last GTID per domain of every transaction before `at`. `None`
/// when the server has no such file or `at` is not an event boundary it knows.
pub async fn mariadb_gtid_at(conn: &mut Conn, at: &BinlogPosition) -> Result<Option<MariadbGtidPosition>, Error> {
    let r: Option<Option<String>> = conn
        .exec_first("SELECT BINLOG_GTID_POS(?, ?)", (at.file.as_str(), at.pos))
        .await
        .map_err(|e| classify_mysql(e, &format!("BINLOG_GTID_POS at {at}")))?;
    Ok(r.flatten().and_then(|t| t.parse().ok()))
}

/// MariaDB JSON columns of the mapped tables: MariaDB's `JSON` type is `LONGTEXT` plus a
/// column check constraint named after the column with the clause ``json_valid(`col`)``
/// (MariaDB docs, "JSON Data Type"); the binlog carries such values as text. Returns
/// `schema.table` -> column names, from `information_schema.CHECK_CONSTRAINTS` now: for rows
/// read from the tables now (a table scan). Rows read from the binlog use what the reader
/// knew at their place in it instead (`binlog::json_columns`).
pub async fn mariadb_json_columns(conn: &mut Conn, tables: &[String]) -> Result<HashMap<String, Vec<String>>, Error> {
    let rows: Vec<(String, String, String, String)> = conn
        .query("SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CHECK_CLAUSE LIKE 'json_valid(%'")
        .await
        .map_err(|e| classify_mysql(e, "information_schema.CHECK_CONSTRAINTS"))?;
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (schema, table, name, clause) in rows {
        let full = format!("{schema}.{table}");
        if tables.contains(&full) && clause == format!("json_valid(`{name}`)") {
            out.entry(full).or_default().push(name);
        }
    }
    Ok(out)
}

/// What [`check_mappings`] found. `binval check` fails on any problem. `binval run` refuses a
/// key problem on every start, and the rest at its first start only (no checkpoint yet,
/// `pipeline::refuse_mapping_problems`); resuming a checkpoint it warns about the rest (the
/// binlog still to read may hold the DDL that explains it; the key judgment runs again after a
/// DDL naming the table).
#[derive(Debug, Default)]
pub struct MappingProblems {
    /// A table or column the mapping names that the source does not have, one line each,
    /// naming the mapping field (`mappings[0].keys[1]`) and, for a table, the source tables
    /// with a similar name.
    pub schema: Vec<String>,
    /// Key templates that do not identify a row ([`judge_key_templates`]), one line each.
    pub keys: Vec<String>,
    /// Mapped tables that do not exist yet and are allowed not to (`created_later = true`):
    /// notes, not problems.
    pub waiting: Vec<String>,
}

impl MappingProblems {
    /// Every problem, schema problems first.
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.schema.iter().chain(&self.keys)
    }

    /// [`DefiniteError::KeysNotUnique`] naming each key problem, if there is one (what `run`
    /// refuses to start on and `check` fails on).
    pub fn refuse_keys(&self) -> Result<(), Error> {
        if self.keys.is_empty() {
            return Ok(());
        }
        Err(DefiniteError::KeysNotUnique(self.keys.join("; ")).into())
    }
}

/// Check each mapping against the source's schema: the table exists, every column a key
/// template or the payload names is a column of it, and every key template identifies a row
/// ([`judge_key_templates`]). `renamed` (the checkpoint's, when there is one) gives the live
/// name of a mapped table a RENAME moved: that table is checked.
pub async fn check_mappings(
    conn: &mut Conn,
    mappings: &[crate::config::MappingConfig],
    renamed: Option<&crate::mapping::TableNames>,
) -> Result<MappingProblems, Error> {
    let mut problems = MappingProblems::default();
    for (i, m) in mappings.iter().enumerate() {
        let live = match renamed.map(|r| r.live_name(&m.table)) {
            None => m.table.clone(),
            Some(Some(live)) => live,
            Some(None) => {
                problems.waiting.push(format!(
                    "mappings[{i}].table: `{}` was renamed away (the checkpoint follows the RENAME) and no table is mapped by it now",
                    m.table
                ));
                continue;
            }
        };
        let cols = table_columns(conn, &live).await?;
        if cols.is_empty() {
            if m.created_later {
                problems.waiting.push(format!(
                    "mappings[{i}].table: table `{}` does not exist yet (created_later = true): its rows are streamed from its CREATE TABLE on",
                    m.table
                ));
                continue;
            }
            let like = similar_tables(conn, &m.table).await?;
            let hint = if like.is_empty() { String::new() } else { format!("; similar tables on the source: {}", like.join(", ")) };
            problems.schema.push(format!(
                "mappings[{i}].table: table `{}` does not exist on the source (or the binval user cannot see it){hint}; if a migration creates it after binval starts, set created_later = true on the mapping",
                m.table
            ));
            continue;
        }
        let mut templates = Vec::with_capacity(m.keys.len());
        for (k, key) in m.keys.iter().enumerate() {
            let Ok(t) = binval_protocol::KeyTemplate::parse(key) else { continue };
            let mut complete = true;
            for c in t.columns() {
                if !cols.iter().any(|x| x == c) {
                    complete = false;
                    problems.schema.push(format!("mappings[{i}].keys[{k}]: `{key}` uses column `{c}`, which `{}` does not have", m.table));
                }
            }
            // A template with a missing column renders no key at all: nothing to judge.
            if complete {
                templates.push((k, t));
            }
        }
        let unique = unique_keys(conn, &live).await?;
        problems.keys.extend(judge_key_templates(i, &m.table, &templates, m.allow_non_unique_keys, &unique));
        if let crate::config::Payload::Columns(pc) = &m.payload {
            for c in pc {
                if !cols.iter().any(|x| x == c) {
                    problems.schema.push(format!("mappings[{i}].payload: column `{c}` is not a column of `{}`", m.table));
                }
            }
        }
    }
    Ok(problems)
}

/// The column names of table `table` (`schema.table`) in `information_schema.COLUMNS`; empty
/// when it does not exist (or the binval user cannot see it).
pub async fn table_columns(conn: &mut Conn, table: &str) -> Result<Vec<String>, Error> {
    let (schema, name) = table.split_once('.').unwrap_or(("", table));
    conn.exec("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", (schema, name))
        .await
        .map_err(|e| classify_mysql(e, "information_schema.COLUMNS"))
}

/// Up to five tables the source has whose `schema.table` name is within an edit distance of 2
/// of `table` (a typo), or that have its name in another schema, closest first.
async fn similar_tables(conn: &mut Conn, table: &str) -> Result<Vec<String>, Error> {
    let (_, name) = table.split_once('.').unwrap_or(("", table));
    let all: Vec<(String, String)> = conn
        .query("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')")
        .await
        .map_err(|e| classify_mysql(e, "information_schema.TABLES"))?;
    let want = table.to_ascii_lowercase();
    let mut near: Vec<(usize, String)> = all
        .into_iter()
        .map(|(s, t)| {
            let full = format!("{s}.{t}");
            let d = if t.eq_ignore_ascii_case(name) { 1 } else { edit_distance(&want, &full.to_ascii_lowercase()) };
            (d, full)
        })
        .filter(|(d, _)| *d <= 2)
        .collect();
    near.sort();
    Ok(near.into_iter().take(5).map(|(_, t)| format!("`{t}`")).collect())
}

/// Levenshtein distance of two strings, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(cur).min(row[j]) };
            prev = cur;
        }
    }
    row[b.len()]
}

/// A PRIMARY KEY or UNIQUE key of a table, as `information_schema.STATISTICS` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UniqueKey {
    /// `PRIMARY KEY` or `UNIQUE KEY name`.
    pub name: String,
    /// Its columns, in index order.
    pub columns: Vec<String>,
    /// Some column of it may hold NULL (a UNIQUE key admits any number of rows with a NULL in
    /// it: MySQL and MariaDB docs, "CREATE TABLE", UNIQUE).
    pub nullable: bool,
    /// Some column is indexed by a prefix only (`c(10)`).
    pub prefix: bool,
}

impl UniqueKey {
    /// `PRIMARY KEY (a, b)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.columns.join(", "))
    }
}

/// One column of an index: `(INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SEQ_IN_INDEX, NULLABLE,
/// SUB_PART)` of `information_schema.STATISTICS`.
pub type IndexPart = (String, u64, String, u64, String, Option<u64>);

/// The unique keys of table `table` (`schema.table`), the PRIMARY KEY first, then by index
/// name; empty for a table without any (or one that does not exist).
pub async fn unique_keys(conn: &mut Conn, table: &str) -> Result<Vec<UniqueKey>, Error> {
    let (schema, name) = table.split_once('.').unwrap_or(("", table));
    let stats: Vec<IndexPart> = conn
        .exec(
            "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME, SEQ_IN_INDEX, NULLABLE, SUB_PART FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_NAME = 'PRIMARY' DESC, INDEX_NAME, SEQ_IN_INDEX",
            (schema, name),
        )
        .await
        .map_err(|e| classify_mysql(e, "information_schema.STATISTICS"))?;
    Ok(unique_keys_of(&stats))
}

/// The unique keys among `information_schema.STATISTICS` rows ordered by PRIMARY first, then
/// index name and position (what [`unique_keys`] reads).
pub fn unique_keys_of(stats: &[IndexPart]) -> Vec<UniqueKey> {
    let mut out: Vec<UniqueKey> = Vec::new();
    for (idx, non_unique, col, _, nullable, sub) in stats {
        if *non_unique != 0 {
            continue;
        }
        let name = if idx == "PRIMARY" { "PRIMARY KEY".to_string() } else { format!("UNIQUE KEY {idx}") };
        let k = match out.iter_mut().find(|k| k.name == name) {
            Some(k) => k,
            None => {
                out.push(UniqueKey { name, columns: Vec::new(), nullable: false, prefix: false });
                out.last_mut().expect("just pushed")
            }
        };
        k.columns.push(col.clone());
        k.nullable |= !nullable.is_empty();
        k.prefix |= sub.is_some();
    }
    out
}

/// Whether each key template of mapping `mappings[index]` (table `table`; `(k, template)` for
/// `keys[k]`) identifies a row of the table, whose unique keys are `unique`: one line per
/// template that does not, naming the mapping field, the table, its keys, the template's
/// columns and the fix; empty when all do or the mapping accepts non-unique keys
/// (`allow_non_unique_keys`, invalidate mode only).
///
/// A template identifies a row when it contains every column of a PRIMARY KEY or UNIQUE key:
/// two rows rendering one key agree on those columns, which the key forbids. A UNIQUE key with
/// a NULLable column counts too, because a NULL key column renders no key
/// ([`crate::mapping`]): every row that renders a key has non-NULL values in all the
/// template's columns, and among such rows the key admits no duplicates. A prefix key
/// (`c(10)`) counts: distinct prefixes mean distinct values. Otherwise two rows may render
/// one key, and the delete of one would tombstone a key whose other row exists (readers
/// answer "no row"). This is the one place binval judges that: `binval check`, `run` at
/// start and after a DDL naming the table, and the table scans of `bootstrap` and `verify`.
pub fn judge_key_templates(
    index: usize,
    table: &str,
    templates: &[(usize, binval_protocol::KeyTemplate)],
    allow_non_unique_keys: bool,
    unique: &[UniqueKey],
) -> Vec<String> {
    if allow_non_unique_keys {
        return Vec::new();
    }
    let keys = if unique.is_empty() {
        "it has no PRIMARY KEY and no UNIQUE key".to_string()
    } else {
        format!("its unique keys are {}", unique.iter().map(UniqueKey::describe).collect::<Vec<_>>().join(", "))
    };
    let mut out = Vec::new();
    for (k, t) in templates {
        let cols: Vec<&str> = t.columns().collect();
        if unique.iter().any(|u| u.columns.iter().all(|c| cols.contains(&c.as_str()))) {
            continue;
        }
        out.push(format!(
            "mappings[{index}].keys[{k}]: key template `{t}` (columns {}) does not identify a row of `{table}`: {keys}, and the template does not contain all the columns of any of them, so two rows may render one key and deleting one would make readers answer \"no row\" while the other exists; fix: put the columns of a unique key into the template, add a PRIMARY KEY or UNIQUE key on ({}), or set mode = \"invalidate\" and allow_non_unique_keys = true on the mapping",
            if cols.is_empty() { "none".to_string() } else { cols.join(", ") },
            cols.join(", "),
        ));
    }
    out
}

/// The primary's current binlog position (`SHOW MASTER STATUS`); `None` when the binlog is
/// off (the statement returns no row).
pub async fn current_position(conn: &mut Conn) -> Result<Option<BinlogPosition>, Error> {
    Ok(binlog_status(conn).await?.map(|(p, _)| p))
}

/// SHOW MASTER STATUS (MySQL 8.4: SHOW BINARY LOG STATUS): the current binlog position and, on
/// MySQL, the `Executed_Gtid_Set` column read with it (`None` where the column is missing or
/// not a GTID set). `None` without a binlog.
pub async fn binlog_status(conn: &mut Conn) -> Result<Option<(BinlogPosition, Option<MysqlGtidSet>)>, Error> {
    let status: Option<mysql_async::Row> = match conn.query_first("SHOW MASTER STATUS").await {
        // MySQL 8.4 removed SHOW MASTER STATUS (ER_PARSE_ERROR) for SHOW BINARY LOG STATUS.
        Err(mysql_async::Error::Server(se)) if se.code == 1064 => {
            conn.query_first("SHOW BINARY LOG STATUS").await.map_err(|e| classify_mysql(e, "SHOW BINARY LOG STATUS"))?
        }
        r => r.map_err(|e| classify_mysql(e, "SHOW MASTER STATUS"))?,
    };
    Ok(status.map(|r| {
        let executed = r.get_opt::<String, _>(4).and_then(Result::ok).and_then(|t| t.parse().ok());
        (BinlogPosition::new(r.get::<String, _>(0).unwrap_or_default(), r.get::<u64, _>(1).unwrap_or_default()), executed)
    }))
}

/// Binlog files the server still has (SHOW BINARY LOGS).
pub async fn binary_logs(conn: &mut Conn) -> Result<Vec<String>, Error> {
    let rows: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.map_err(|e| classify_mysql(e, "SHOW BINARY LOGS"))?;
    Ok(rows.into_iter().map(|r| r.get::<String, _>(0).unwrap_or_default()).collect())
}

/// Binlog files the server still has with their sizes in bytes (SHOW BINARY LOGS: `Log_name`,
/// `File_size`), oldest first. The last file's size is the primary's current offset in it.
pub async fn binary_log_sizes(conn: &mut Conn) -> Result<Vec<(String, u64)>, Error> {
    let rows: Vec<mysql_async::Row> = conn.query("SHOW BINARY LOGS").await.map_err(|e| classify_mysql(e, "SHOW BINARY LOGS"))?;
    Ok(rows.into_iter().map(|r| (r.get::<String, _>(0).unwrap_or_default(), r.get::<u64, _>(1).unwrap_or_default())).collect())
}

/// Binlog bytes from `from` to the end of the newest file in `logs` (from
/// [`binary_log_sizes`]): what a reader at `from` still has to read. `None` when `from`'s file
/// is not among `logs` (purged, or another server's).
pub fn bytes_behind(logs: &[(String, u64)], from: &BinlogPosition) -> Option<u64> {
    let i = logs.iter().position(|(f, _)| *f == from.file)?;
    let rest: u64 = logs[i + 1..].iter().map(|(_, size)| size).sum();
    Some(logs[i].1.saturating_sub(from.pos) + rest)
}

/// Errors with [`DefiniteError::PositionGone`] unless the file of `position` is among `logs`
/// (from [`binary_logs`]); `origin` says where the position came from (`source.start`,
/// `--from`, `the checkpoint`), so the operator knows what to change.
pub fn require_binlog_file(logs: &[String], position: &BinlogPosition, origin: &str) -> Result<(), Error> {
    if logs.contains(&position.file) {
        return Ok(());
    }
    Err(DefiniteError::PositionGone {
        position: position.to_string(),
        message: format!("{origin} names file {}, which is not among the server's binary logs ({})", position.file, logs.join(", ")),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use binval_protocol::KeyTemplate;

    #[test]
    fn edit_distance_counts_typos() {
        assert_eq!(edit_distance("shop.itemz", "shop.items"), 1);
        assert_eq!(edit_distance("shop.item", "shop.items"), 1);
        assert_eq!(edit_distance("shop.tiems", "shop.items"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    fn stat(idx: &str, non_unique: u64, col: &str, seq: u64, nullable: &str, sub: Option<u64>) -> IndexPart {
        (idx.into(), non_unique, col.into(), seq, nullable.into(), sub)
    }

    /// The problems of templates `keys` of `db.t` against STATISTICS rows `stats`.
    fn judge(keys: &[&str], accepts: bool, stats: &[IndexPart]) -> Vec<String> {
        let templates: Vec<(usize, KeyTemplate)> = keys.iter().enumerate().map(|(k, t)| (k, KeyTemplate::parse(t).unwrap())).collect();
        judge_key_templates(3, "db.t", &templates, accepts, &unique_keys_of(stats))
    }

    #[test]
    fn unique_keys_are_read_from_statistics() {
        let stats = [
            stat("PRIMARY", 0, "a", 1, "", None),
            stat("PRIMARY", 0, "b", 2, "", None),
            stat("by_v", 1, "v", 1, "YES", None),
            stat("u", 0, "n", 1, "YES", None),
            stat("u", 0, "t", 2, "", Some(10)),
        ];
        let keys = unique_keys_of(&stats);
        assert_eq!(keys.len(), 2, "a non-unique index is no key: {keys:?}");
        assert_eq!(
            keys[0],
            UniqueKey { name: "PRIMARY KEY".into(), columns: vec!["a".into(), "b".into()], nullable: false, prefix: false }
        );
        assert_eq!(keys[1], UniqueKey { name: "UNIQUE KEY u".into(), columns: vec!["n".into(), "t".into()], nullable: true, prefix: true });
        assert_eq!(keys[0].describe(), "PRIMARY KEY (a, b)");
    }

    #[test]
    fn a_template_identifies_a_row_when_it_contains_a_unique_keys_columns() {
        let pk = [stat("PRIMARY", 0, "id", 1, "", None)];
        assert!(judge(&["t:{id}"], false, &pk).is_empty(), "the primary key");
        assert!(judge(&["t:{id}:{v}"], false, &pk).is_empty(), "columns beyond a unique key's are fine");
        let composite = [stat("PRIMARY", 0, "a", 1, "", None), stat("PRIMARY", 0, "b", 2, "", None)];
        assert!(judge(&["t:{b}:{a}"], false, &composite).is_empty(), "in any order");
        let p = judge(&["t:{a}"], false, &composite);
        assert_eq!(p.len(), 1, "a template missing a primary key column: {p:?}");
        assert!(p[0].starts_with("mappings[3].keys[0]: key template `t:{a}` (columns a) does not identify a row of `db.t`"), "{}", p[0]);
        assert!(p[0].contains("PRIMARY KEY (a, b)") && p[0].contains("allow_non_unique_keys = true"), "{}", p[0]);
        let not_null = [stat("PRIMARY", 0, "id", 1, "", None), stat("sku", 0, "sku", 1, "", None)];
        assert!(judge(&["t:{id}", "s:{sku}"], false, &not_null).is_empty(), "a UNIQUE NOT NULL key");
        let prefix = [stat("name", 0, "name", 1, "", Some(8))];
        assert!(judge(&["n:{name}"], false, &prefix).is_empty(), "a unique prefix: distinct prefixes, distinct values");
    }

    #[test]
    fn a_nullable_unique_key_identifies_the_rows_that_render_a_key() {
        // UNIQUE admits many rows with a NULL, but a NULL key column renders no key: the rows
        // that render one are unique by the key.
        let stats = [stat("email", 0, "email", 1, "YES", None)];
        assert!(judge(&["u:{email}"], false, &stats).is_empty());
        // ... unless the template leaves a column of it out: (1, NULL) and (1, 'x') render u:1.
        let pair = [stat("ab", 0, "a", 1, "", None), stat("ab", 0, "b", 2, "YES", None)];
        assert_eq!(judge(&["u:{a}"], false, &pair).len(), 1);
    }

    #[test]
    fn no_key_or_a_non_unique_index_does_not_identify_a_row_unless_accepted() {
        let p = judge(&["t:{x}", "t2:{y}"], false, &[]);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("it has no PRIMARY KEY and no UNIQUE key") && p[1].starts_with("mappings[3].keys[1]"), "{p:?}");
        let index = [stat("by_x", 1, "x", 1, "", None)];
        assert_eq!(judge(&["t:{x}"], false, &index).len(), 1, "a plain index is not unique");
        assert!(judge(&["t:{x}"], true, &[]).is_empty(), "allow_non_unique_keys accepts it");
    }
}
