//! `[source]`: the MySQL/MariaDB primary binval reads the binlog of.

use std::path::PathBuf;

use binval_security::{Secret, TlsSettings};
use serde::Deserialize;

use super::defaults::*;

/// `[source]`: the replica connection.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Name of this source: the checkpoint is stored under it. Default `default`.
    #[serde(default = "default_source_name")]
    pub name: String,
    /// `mysql://user:password@host:port` of a user with REPLICATION SLAVE and REPLICATION CLIENT
    /// (MariaDB: also BINLOG MONITOR) and SELECT. binval connects to that host and port over
    /// TCP, also on the server's own machine (`?prefer_socket=true` switches to the server's Unix
    /// socket, `?socket=/path` names one): see `binlog::server::source_opts`.
    pub url: String,
    /// server_id binval announces as a replica; must differ from every server and replica in the
    /// replication topology (MySQL/MariaDB reject duplicates).
    pub server_id: u32,
    /// Heartbeat period requested from the primary, ms. Default 1000. A connection silent for
    /// three periods is considered dead and reconnected.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Where to start when no checkpoint exists: `current` (default: the primary's current
    /// binlog position), `FILE:POS` (e.g. `mysql-bin.000003:4`), or `gtid:GTID_SET` (MariaDB,
    /// e.g. `gtid:0-1-100`).
    #[serde(default = "default_start")]
    pub start: String,
    /// Longest wait between reconnect attempts, ms (exponential backoff). Default 30000.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
    /// How writes are ordered (the fence position, see `binval_protocol::fence`): `auto`
    /// (default: `gtid` on MariaDB, `file_pos` on MySQL), `gtid` (MariaDB GTID sequence number
    /// within `fence_domain`; survives a failover inside the domain) or `file_pos` (binlog file
    /// index and position; not comparable across servers).
    #[serde(default)]
    pub fence: FenceMode,
    /// Fence epoch 0..=255 in the top 8 bits of every version: raise it by one after a failover
    /// that makes positions incomparable (e.g. `file_pos` mode), so the new primary's changes
    /// win over everything written before. Default 0.
    #[serde(default)]
    pub fence_epoch: u8,
    /// The MariaDB GTID domain whose sequence numbers order writes in `gtid` mode. A mapped
    /// change from another domain stops the pipeline (use `file_pos` for multi-domain sources).
    /// Default 0.
    #[serde(default)]
    pub fence_domain: u32,
    /// Lease of the active instance, ms: another `binval run` with the same source name waits
    /// as standby and takes over when the lease is not renewed for this long. Renewed every
    /// third of it; a standby tries every third of it, at least every 200 ms. Default 1500: a
    /// standby streams within about 2 s of the leader's death. A renewal that fails does not
    /// stop the leader (its writes are fenced, see `ha::lease`).
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// `schema.table` of binval's heartbeat table, unset = no heartbeats. The active instance
    /// upserts the row `source = <source.name>` with `ts_us` = the primary's
    /// `UNIX_TIMESTAMP(NOW(6))` in µs every `heartbeat_interval_ms`, creating the table if it is
    /// missing (`CREATE TABLE IF NOT EXISTS t (source VARCHAR(64) PRIMARY KEY, ts_us BIGINT NOT
    /// NULL)`; the user needs INSERT and UPDATE on it, and CREATE unless it exists). Seen back
    /// through the binlog, the row gives the lag (`binval_lag_seconds`,
    /// `binval_heartbeat_lag_seconds`) sub-second precision, where binlog headers carry whole
    /// seconds, and keeps the lag measured while no application writes. The table is never
    /// mapped: its rows reach neither Redis nor Kafka.
    #[serde(default)]
    pub heartbeat_table: Option<String>,
    /// How often the heartbeat row is written, ms. Default 500.
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// Row events of one transaction held in memory, MiB; beyond it they go to a temporary
    /// file in `spill_dir` (deleted once the transaction is applied or dropped). Transactions
    /// read but not yet applied hold at most twice this in all; prepared XA transactions waiting
    /// for their XA COMMIT at most this together (`binlog::xa`). Default 32.
    #[serde(default = "default_transaction_memory_mb")]
    pub transaction_memory_mb: u64,
    /// Folder of the temporary files of large transactions. Default: the system's temp
    /// folder (`TMPDIR`, else `/tmp`).
    #[serde(default)]
    pub spill_dir: Option<PathBuf>,
    /// Password of the URL's user, instead of writing it into `url` (which then has none).
    /// Best from the environment: `BINVAL__SOURCE__PASSWORD`. Never printed.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding that password (e.g. a Kubernetes Secret mounted as a file), read at every
    /// connect, so a rotated password is used from the next reconnect on. Without its
    /// trailing line break.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `[source.tls]`: TLS of every connection to the source (`crate::security::mysql`).
    #[serde(default)]
    pub tls: TlsSettings,
}

/// How the fence position of a transaction is derived.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum FenceMode {
    /// `gtid` on MariaDB, `file_pos` on MySQL.
    #[default]
    Auto,
    /// MariaDB GTID sequence number within `source.fence_domain`.
    Gtid,
    /// `file_index << 32 | end_pos` of the commit.
    FilePos,
}
