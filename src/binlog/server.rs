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
    let row: Option<Settings> = conn
        .query_first("SELECT @@version, @@binlog_format, @@binlog_row_image, @@binlog_checksum, @@binlog_row_metadata")
        .await
        .or_else(|e| match &e {
            // MySQL < 8.0.1 has no binlog_row_metadata.
            mysql_async::Error::Server(se) if se.code == 1193 => Ok(None),
            _ => Err(e),
        })
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
        let row: Option<(Option<String>, Option<String>)> = conn
            .query_first("SELECT @@server_uuid, @@gtid_mode")
            .await
            .or_else(|e| match &e {
                // MySQL 5.5 and older: neither variable.
                mysql_async::Error::Server(se) if se.code == 1193 => Ok(None),
                _ => Err(e),
            })
            .map_err(q)?;
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

/// Check each mapping against the source's schema: the table exists, and every column a key
/// template or the payload names is a column of it. Returns one line per problem, naming the
/// mapping field (`mappings[0].keys[1]`).
pub async fn check_mappings(conn: &mut Conn, mappings: &[crate::config::MappingConfig]) -> Result<Vec<String>, Error> {
    let mut problems = Vec::new();
    for (i, m) in mappings.iter().enumerate() {
        let (schema, table) = m.table.split_once('.').unwrap_or(("", &m.table));
        let cols: Vec<String> = conn
            .exec("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", (schema, table))
            .await
            .map_err(|e| classify_mysql(e, "check"))?;
        if cols.is_empty() {
            problems
                .push(format!("mappings[{i}].table: table `{}` does not exist on the source (or the binval user cannot see it)", m.table));
            continue;
        }
        for (k, key) in m.keys.iter().enumerate() {
            if let Ok(t) = binval_protocol::KeyTemplate::parse(key) {
                for c in t.columns() {
                    if !cols.iter().any(|x| x == c) {
                        problems.push(format!("mappings[{i}].keys[{k}]: `{key}` uses column `{c}`, which `{}` does not have", m.table));
                    }
                }
            }
        }
        if let crate::config::Payload::Columns(pc) = &m.payload {
            for c in pc {
                if !cols.iter().any(|x| x == c) {
                    problems.push(format!("mappings[{i}].payload: column `{c}` is not a column of `{}`", m.table));
                }
            }
        }
    }
    Ok(problems)
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
