//! Configuration: one file (TOML or YAML, by extension) plus environment overrides
//! `BINVAL__<SECTION>__<FIELD>` (e.g. `BINVAL__SOURCE__SERVER_ID=4001`), loaded with the
//! `config` crate and checked before anything connects. Every error names the field
//! (`mappings[1].keys[0]`) and says what is wrong. JSON Schema: `schemas/config.schema.json`;
//! examples: `config/`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use binval_protocol::KeyTemplate;
use binval_security::{Secret, TlsSettings};
use serde::Deserialize;

pub use crate::start_point::{StartForms, StartPoint};

/// A configuration problem, naming the field and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed, or a field has the wrong type or is missing.
    #[error("config {path}: {message}")]
    Load { path: String, message: String },
    /// A field has a value binval cannot use.
    #[error("config{}: field `{field}`: {reason}", at_path(.path))]
    Invalid { path: String, field: String, reason: String },
}

/// The config crate names enums by their Rust type and joins array keys without a dot
/// (`mappings[0]mode`): say which values are allowed, and write the field as in the file.
fn explain(message: &str) -> String {
    const ALLOWED: &[(&str, &str)] = &[
        ("RedisMode", "\"standalone\" or \"cluster\""),
        ("MappingMode", "\"write-through\" or \"invalidate\""),
        ("CheckpointStore", "\"redis\" or \"file\""),
        ("FenceMode", "\"auto\", \"gtid\" or \"file_pos\""),
        ("EventFormat", "\"per_key\" or \"batched\""),
    ];
    let mut out = message.to_string();
    for (ty, allowed) in ALLOWED {
        if out.contains(&format!("enum {ty} ")) {
            out = format!("{out} (allowed values: {allowed})");
        }
    }
    let mut fixed = String::with_capacity(out.len());
    let mut chars = out.chars().peekable();
    while let Some(c) = chars.next() {
        fixed.push(c);
        if c == ']' && chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) {
            fixed.push('.');
        }
    }
    fixed
}

/// A TOML parse error names no key when an integer is beyond TOML's range (a signed 64-bit
/// integer; "number too large to fit in target type"): name the first `key = <integer>` of
/// `text` that is out of it, as `section.key` (`mappings[i].key` in the i-th `[[mappings]]`).
fn out_of_range_integer(text: &str) -> Option<String> {
    let mut section = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            let n = arrays.entry(name.trim().to_string()).and_modify(|n| *n += 1).or_insert(0);
            section = format!("{}[{n}]", name.trim());
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            let v = value.split('#').next().unwrap_or("").trim().replace('_', "");
            let digits = v.strip_prefix(['+', '-']).unwrap_or(&v);
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && v.parse::<i64>().is_err() {
                let key = key.trim();
                return Some(if section.is_empty() { key.to_string() } else { format!("{section}.{key}") });
            }
        }
    }
    None
}

/// The message of a config that does not parse, with the key of an out-of-range integer
/// named when the parser did not name it.
fn parse_message(text: Option<&str>, message: String) -> String {
    match text.and_then(out_of_range_integer) {
        Some(key) if message.contains("too large") || message.contains("too small") => {
            format!("{message} (`{key}` is beyond the range of a TOML integer)")
        }
        _ => message,
    }
}

fn at_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" {path}")
    }
}

/// The whole configuration of one `binval run`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The MySQL/MariaDB primary to read the binlog of.
    pub source: SourceConfig,
    /// Where the suffix replicas and version tokens go.
    pub redis: RedisConfig,
    /// Where invalidation events go.
    pub kafka: KafkaConfig,
    /// Where the resume position is kept.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Table -> logical key rules. Tables without a rule are skipped before their rows are decoded.
    #[serde(default)]
    pub mappings: Vec<MappingConfig>,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// Prometheus metrics endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// How transactions are grouped when they are applied.
    #[serde(default)]
    pub apply: ApplyConfig,
    /// How adaptive replica counts (`replicas = { min, max }`) follow the fleet's reads.
    #[serde(default)]
    pub adaptive: crate::replicas::AdaptiveConfig,
}

/// `[apply]`: group apply. The apply stage takes every committed transaction already read
/// (up to `max_group_rows` rows) as one group, keeps one change per key (the newest), writes
/// all of the group's keys with one pipeline per Redis master per step, publishes one event
/// per key and moves the checkpoint once the whole group is acknowledged. At low load a group
/// is one transaction.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApplyConfig {
    /// Decoded rows per group (a larger transaction is applied alone, in chunks of this many
    /// rows). Default 4096.
    #[serde(default = "default_max_group_rows")]
    pub max_group_rows: usize,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        ApplyConfig { max_group_rows: default_max_group_rows() }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve Prometheus metrics (`GET /metrics`) and the health probes
    /// (`/healthz`, `/readyz`) on; unset = no endpoint.
    #[serde(default)]
    pub listen: Option<String>,
    /// `/readyz` answers 503 for a leader more than this many ms behind the source
    /// (`binval_lag_seconds`). Default 30000.
    #[serde(default = "default_ready_max_lag_ms")]
    pub ready_max_lag_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { listen: None, ready_max_lag_ms: default_ready_max_lag_ms() }
    }
}

fn default_ready_max_lag_ms() -> u64 {
    30_000
}

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

/// Redis deployment kind.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One Redis server: each key's replicas and version token are written by one Lua script (`key_apply_script`), atomically.
    Standalone,
    /// Redis Cluster: replicas on different masters, written and acknowledged before the token.
    Cluster,
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `standalone` or `cluster`.
    pub mode: RedisMode,
    /// `redis://host:port` URLs: one for standalone, one or more seed nodes for a cluster. In an
    /// environment override, comma-separated.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub urls: Vec<String>,
    /// Per-command response timeout, ms. Default 2000.
    #[serde(default = "default_redis_timeout_ms")]
    pub timeout_ms: u64,
    /// How long a delete's tombstone stays in the replicas, ms (it refuses late, older writes
    /// of the key; after it expires the replica is simply missing). Default 86400000 (24 h).
    #[serde(default = "default_tombstone_ttl_ms")]
    pub tombstone_ttl_ms: u64,
    /// ACL user (Redis 6+ `AUTH username password`); unset = the `default` user.
    #[serde(default)]
    pub username: Option<String>,
    /// The user's password, instead of writing it into the URLs. Best from the environment:
    /// `BINVAL__REDIS__PASSWORD`. Never printed.
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding that password, read at every connect.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `[redis.tls]`: TLS settings for `rediss://` URLs (`crate::security::redis`).
    #[serde(default)]
    pub tls: TlsSettings,
}

/// `[kafka]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port]` bootstrap servers.
    pub brokers: String,
    /// Topic of invalidation events. Default `binval.invalidations`.
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Create the topic at start if it does not exist. Default true.
    #[serde(default = "default_true")]
    pub create_topic: bool,
    /// Partitions of a topic binval creates. Default 3.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor of a topic binval creates. Default 1 (a single test broker); set 3
    /// (or your cluster's usual) in production, or create the topic yourself.
    #[serde(default = "default_replication_factor")]
    pub replication_factor: i32,
    /// Extra librdkafka producer settings, e.g. `"linger.ms" = "5"`. binval always sets
    /// `enable.idempotence=true` and `acks=all`. A property that `[kafka.tls]` or
    /// `[kafka.sasl]` also sets is refused, naming both.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// `[kafka.tls]`: SSL to the brokers (`crate::security::kafka`).
    #[serde(default)]
    pub tls: TlsSettings,
    /// `[kafka.sasl]`: SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    #[serde(default)]
    pub sasl: Option<binval_security::SaslSettings>,
    /// Every this many ms the leader sends one progress message
    /// (`schemas/progress-message.schema.json`) to every partition of the topic: how far its
    /// Redis writes and enqueued events are behind the source, so app instances can tell a
    /// quiet source from a stalled writer ([`crate::write::progress`]). Default 200; 0 = off.
    /// Consumers older than the progress message count each one as a bad message: upgrade them
    /// first, or keep this 0 until then.
    #[serde(default = "default_progress_interval_ms")]
    pub progress_interval_ms: u64,
    /// How invalidation events are published ([`EventFormat`]): `per_key` (default: one JSON
    /// message per key change) or `batched` (one binary message per partition per apply
    /// group, `binval_protocol::batch`). Consumers older than the batched format skip its
    /// messages (as bad messages) and so miss invalidations: upgrade every app first, then
    /// switch (docs/design.md, "Batched events").
    #[serde(default)]
    pub event_format: EventFormat,
}

/// `kafka.event_format`: the format of the invalidation events binval publishes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum EventFormat {
    /// One JSON message per key change (`schemas/invalidation-event.schema.json`), keyed by
    /// the logical key. Readable by every consumer version and by consumers in other languages.
    #[default]
    PerKey,
    /// One binary message per partition per apply group (`schemas/invalidation-batch.md`,
    /// header `binval.kind: batch`), produced to the partition the producer's partitioner
    /// gives each of its keys, compressed (`compression.type` lz4 unless set). Needs
    /// binval-consumer with batch support in every app.
    Batched,
}

impl EventFormat {
    /// The config value (`per_key`, `batched`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventFormat::PerKey => "per_key",
            EventFormat::Batched => "batched",
        }
    }
}

/// Where the checkpoint lives.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointStore {
    /// Key `binval:{<source name>}:checkpoint` in the configured Redis (default).
    #[default]
    Redis,
    /// A JSON file at `checkpoint.path`, replaced atomically (write + rename).
    File,
}

/// `[checkpoint]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// `redis` (default) or `file`.
    #[serde(default)]
    pub store: CheckpointStore,
    /// File path for `store = "file"`.
    pub path: Option<PathBuf>,
    /// Save at most this often while events flow, ms. Default 1000.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Redis Cluster: on how many masters the checkpoint is kept (the key
    /// `binval:{<source name>}:checkpoint` beside the lease, plus copies under keys whose hash
    /// tags put them on other masters), so the loss of one master's data loses no checkpoint
    /// (`crate::ha::checkpoint`). 1 = no copies. Default 3 (at most the number of masters).
    /// Ignored on standalone Redis and for `store = "file"`.
    #[serde(default = "default_copies")]
    pub copies: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { store: CheckpointStore::Redis, path: None, interval_ms: default_interval_ms(), copies: default_copies() }
    }
}

fn default_copies() -> usize {
    3
}

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

/// `[log]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: Option<String>,
    /// tracing-subscriber filter, default `info`. `RUST_LOG` wins when set.
    #[serde(default)]
    pub level: Option<String>,
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

fn replicas_setting<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Replicas, D::Error> {
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

fn list_or_comma_separated<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrText {
        List(Vec<String>),
        Text(String),
    }
    Ok(match ListOrText::deserialize(d)? {
        ListOrText::List(l) => l,
        ListOrText::Text(t) => t.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect(),
    })
}

fn default_source_name() -> String {
    "default".into()
}
fn default_heartbeat_ms() -> u64 {
    1000
}
fn default_start() -> String {
    "current".into()
}
fn default_reconnect_max_ms() -> u64 {
    30_000
}
fn default_replication_factor() -> i32 {
    1
}
fn default_lease_ms() -> u64 {
    1500
}
fn default_tombstone_ttl_ms() -> u64 {
    86_400_000
}
fn default_redis_timeout_ms() -> u64 {
    2000
}
fn default_topic() -> String {
    "binval.invalidations".into()
}
fn default_true() -> bool {
    true
}
fn default_progress_interval_ms() -> u64 {
    200
}
fn default_partitions() -> i32 {
    3
}
fn default_interval_ms() -> u64 {
    1000
}
fn default_heartbeat_interval_ms() -> u64 {
    500
}
fn default_transaction_memory_mb() -> u64 {
    32
}
fn default_max_group_rows() -> usize {
    4096
}

/// The longest TTL a config may give (replicas, tombstones), ms: 100 years, far inside what
/// Redis takes (`PX` is a signed 64-bit count) and what binval computes in ms.
pub const MAX_TTL_MS: u64 = 100 * 365 * 86_400_000;

impl Config {
    /// Load `path` (TOML or YAML by extension) with `BINVAL__*` environment overrides, then
    /// validate. Errors name the file and the field.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let p = path.display().to_string();
        if !path.exists() {
            return Err(ConfigError::Load { path: p, message: "file not found".into() });
        }
        let cfg = config::Config::builder()
            .add_source(config::File::from(path))
            .add_source(
                // No type guessing: `BINVAL__SOURCE__NAME=007` stays the string "007"; numeric
                // fields still parse from their text. Lists are comma-separated.
                config::Environment::with_prefix("BINVAL").prefix_separator("__").separator("__"),
            )
            .build()
            .map_err(|e| {
                let text = std::fs::read_to_string(path).ok();
                ConfigError::Load { path: p.clone(), message: parse_message(text.as_deref(), e.to_string()) }
            })?;
        let c: Config = cfg.try_deserialize().map_err(|e| ConfigError::Load { path: p.clone(), message: explain(&e.to_string()) })?;
        c.validate(&p)?;
        Ok(c)
    }

    /// Parse from TOML text (tests, embedded configs), then validate.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .map_err(|e| ConfigError::Load { path: "<inline>".into(), message: parse_message(Some(text), e.to_string()) })?;
        let c: Config =
            cfg.try_deserialize().map_err(|e| ConfigError::Load { path: "<inline>".into(), message: explain(&e.to_string()) })?;
        c.validate("<inline>")?;
        Ok(c)
    }

    /// Check values that types alone cannot.
    pub fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let bad = |field: String, reason: String| ConfigError::Invalid { path: path.into(), field, reason };
        if !self.source.url.starts_with("mysql://") {
            return Err(bad("source.url".into(), format!("`{}` must start with mysql://", redact(&self.source.url))));
        }
        if let Some(reason) = crate::security::mysql::url_tls_param(&self.source.url) {
            return Err(bad("source.url".into(), reason));
        }
        if self.source.server_id == 0 {
            return Err(bad("source.server_id".into(), "must be a non-zero server_id unique in the topology".into()));
        }
        if self.source.heartbeat_ms == 0 || self.source.heartbeat_ms > 4_294_967 {
            return Err(bad("source.heartbeat_ms".into(), "must be 1..=4294967 ms".into()));
        }
        StartPoint::parse(&self.source.start, StartForms::SOURCE_START).map_err(|r| bad("source.start".into(), r))?;
        if self.source.name.is_empty() || !self.source.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(bad("source.name".into(), "must be non-empty and use only [A-Za-z0-9._-]".into()));
        }
        if !(100..=3_600_000).contains(&self.source.reconnect_max_ms) {
            return Err(bad("source.reconnect_max_ms".into(), "must be 100..=3600000 ms".into()));
        }
        if !(300..=600_000).contains(&self.source.lease_ms) {
            return Err(bad("source.lease_ms".into(), "must be 300..=600000 ms".into()));
        }
        if let Some(t) = &self.source.heartbeat_table {
            if !is_schema_table(t) {
                return Err(bad("source.heartbeat_table".into(), format!("`{t}` must be `schema.table` (letters, digits, _ and $)")));
            }
            if self.mappings.iter().any(|m| m.table == *t) {
                return Err(bad("source.heartbeat_table".into(), format!("`{t}` is also a mapped table; use a table of its own")));
            }
        }
        if !(10..=60_000).contains(&self.source.heartbeat_interval_ms) {
            return Err(bad("source.heartbeat_interval_ms".into(), "must be 10..=60000 ms".into()));
        }
        if !(1..=65_536).contains(&self.source.transaction_memory_mb) {
            return Err(bad("source.transaction_memory_mb".into(), "must be 1..=65536 MiB".into()));
        }
        if let Some(d) = &self.source.spill_dir {
            if !d.is_dir() {
                return Err(bad("source.spill_dir".into(), format!("`{}` is not a folder", d.display())));
            }
        }
        if !(1..=1_000_000).contains(&self.apply.max_group_rows) {
            return Err(bad("apply.max_group_rows".into(), "must be 1..=1000000 rows".into()));
        }
        if self.redis.tombstone_ttl_ms == 0 {
            return Err(bad("redis.tombstone_ttl_ms".into(), "must be > 0 (a tombstone without TTL would never leave Redis)".into()));
        }
        if self.redis.tombstone_ttl_ms > MAX_TTL_MS {
            return Err(bad("redis.tombstone_ttl_ms".into(), format!("must be at most {MAX_TTL_MS} ms (100 years)")));
        }
        if !(1..=600_000).contains(&self.redis.timeout_ms) {
            return Err(bad("redis.timeout_ms".into(), "must be 1..=600000 ms".into()));
        }
        if self.redis.urls.is_empty() {
            return Err(bad("redis.urls".into(), "needs at least one redis:// URL".into()));
        }
        for (i, u) in self.redis.urls.iter().enumerate() {
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                return Err(bad(format!("redis.urls[{i}]"), format!("`{}` must start with redis:// or rediss://", redact(u))));
            }
        }
        if self.redis.mode == RedisMode::Standalone && self.redis.urls.len() != 1 {
            return Err(bad("redis.urls".into(), "standalone mode takes exactly one URL (use mode = \"cluster\" for several)".into()));
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(bad("kafka.brokers".into(), "must list at least one host:port".into()));
        }
        if self.kafka.topic.is_empty()
            || self.kafka.topic.len() > 249
            || !self.kafka.topic.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            // Kafka topic names: [a-zA-Z0-9._-], at most 249 characters (Kafka docs, topic naming).
            return Err(bad(
                "kafka.topic".into(),
                format!("`{}` is not a legal Kafka topic name ([a-zA-Z0-9._-], 1..249 chars)", self.kafka.topic),
            ));
        }
        if !(1..=i16::MAX as i32).contains(&self.kafka.replication_factor) {
            // Kafka's CreateTopics request carries it as an INT16.
            return Err(bad("kafka.replication_factor".into(), "must be 1..=32767".into()));
        }
        if self.kafka.partitions < 1 {
            return Err(bad("kafka.partitions".into(), "must be >= 1".into()));
        }
        if self.kafka.event_format == EventFormat::Batched {
            crate::kafka::Partitioner::from_property(self.kafka.properties.get("partitioner").map(String::as_str))
                .map_err(|e| bad("kafka.event_format".into(), e.to_string()))?;
        }
        if self.kafka.progress_interval_ms > 60_000 {
            return Err(bad("kafka.progress_interval_ms".into(), "must be 0 (off) or at most 60000 ms".into()));
        }
        if self.checkpoint.store == CheckpointStore::File && self.checkpoint.path.is_none() {
            return Err(bad("checkpoint.path".into(), "required when checkpoint.store = \"file\"".into()));
        }
        if self.checkpoint.interval_ms == 0 {
            return Err(bad("checkpoint.interval_ms".into(), "must be > 0".into()));
        }
        if !(1..=crate::ha::checkpoint::MAX_COPIES).contains(&self.checkpoint.copies) {
            return Err(bad("checkpoint.copies".into(), format!("must be 1..={}", crate::ha::checkpoint::MAX_COPIES)));
        }
        if self.metrics.ready_max_lag_ms == 0 {
            return Err(bad("metrics.ready_max_lag_ms".into(), "must be > 0".into()));
        }
        if let Some(l) = &self.metrics.listen {
            if l.parse::<std::net::SocketAddr>().is_err() {
                return Err(bad("metrics.listen".into(), format!("`{l}` is not an ip:port socket address")));
            }
        }
        self.validate_security().map_err(|e| bad(e.field, e.reason))?;
        self.adaptive.validate().map_err(|(field, reason)| bad(format!("adaptive.{field}"), reason))?;
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.mappings.iter().enumerate() {
            let f = |name: &str| format!("mappings[{i}].{name}");
            match m.table.split_once('.') {
                Some((s, t)) if !s.is_empty() && !t.is_empty() && !t.contains('.') => {}
                _ => return Err(bad(f("table"), format!("`{}` must be `schema.table`", m.table))),
            }
            if !seen.insert(m.table.clone()) {
                return Err(bad(f("table"), format!("`{}` is mapped twice; list all its keys in one mapping", m.table)));
            }
            if m.keys.is_empty() {
                return Err(bad(f("keys"), "needs at least one key template".into()));
            }
            let r = m.replicas;
            if r.min == 0 || r.max > binval_protocol::adaptive::MAX_REPLICAS {
                return Err(bad(f("replicas"), format!("{r} is out of range 1..={}", binval_protocol::adaptive::MAX_REPLICAS)));
            }
            if r.min > r.max {
                return Err(bad(f("replicas"), format!("min = {} is above max = {}", r.min, r.max)));
            }
            if m.ttl_secs > MAX_TTL_MS / 1000 {
                return Err(bad(f("ttl_secs"), format!("{} is out of range 0..={} s (100 years)", m.ttl_secs, MAX_TTL_MS / 1000)));
            }
            if m.allow_non_unique_keys && m.mode != MappingMode::Invalidate {
                return Err(bad(
                    f("allow_non_unique_keys"),
                    "needs mode = \"invalidate\": in write-through mode two rows rendering one key would overwrite each other's payload, and a delete of one would tombstone the key while the other exists".into(),
                ));
            }
            for (k, key) in m.keys.iter().enumerate() {
                let t = KeyTemplate::parse(key).map_err(|e| bad(format!("mappings[{i}].keys[{k}]"), e.to_string()))?;
                t.check_replicas(m.replicas.max).map_err(|e| bad(format!("mappings[{i}].keys[{k}]"), e.to_string()))?;
            }
            match &m.payload {
                Payload::Whole(w) if w != "row" => return Err(bad(f("payload"), format!("`{w}`: use \"row\" or a list of column names"))),
                Payload::Columns(c) if c.is_empty() => return Err(bad(f("payload"), "column list is empty".into())),
                _ => {}
            }
        }
        Ok(())
    }
}

impl Config {
    /// The security settings (`binval_security::checks`; files are read when binval connects).
    fn validate_security(&self) -> Result<(), binval_security::FieldError> {
        let (s, r, k) = (&self.source, &self.redis, &self.kafka);
        binval_security::checks::source(&s.url, s.password.as_ref(), s.password_file.as_deref(), &s.tls)?;
        binval_security::checks::redis(&r.urls, r.username.as_deref(), r.password.as_ref(), r.password_file.as_deref(), &r.tls)?;
        binval_security::checks::kafka(&k.tls, k.sasl.as_ref(), k.properties.keys().map(String::as_str))
    }
}

/// `schema.table` with plain identifiers (the heartbeat table is written in SQL by binval, so
/// its name must need no quoting).
fn is_schema_table(t: &str) -> bool {
    let ok = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    matches!(t.split_once('.'), Some((s, n)) if ok(s) && ok(n))
}

/// Hide the password of a `scheme://user:password@host` URL for logs and errors
/// ([`binval_security::redact_url`]).
pub fn redact(url: &str) -> String {
    binval_security::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_errors_list_the_allowed_values() {
        let e = Config::from_toml(&OK.replace("mode = \"standalone\"", "mode = \"sentinel\"")).unwrap_err().to_string();
        assert!(e.contains("\"standalone\" or \"cluster\""), "{e}");
    }

    #[test]
    fn shipped_configs_load_and_validate() {
        for f in ["config/binval.example.toml", "config/demo.toml", "config/docker.toml", "config/tls.example.toml"] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(f);
            let c = Config::load(&p).unwrap_or_else(|e| panic!("{f}: {e}"));
            assert_eq!(c.source.lease_ms, 1500, "{f}");
        }
        let c = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/binval.example.toml")).unwrap();
        assert_eq!((c.source.fence, c.source.fence_epoch, c.redis.tombstone_ttl_ms), (FenceMode::Auto, 0, 86_400_000));
    }

    const OK: &str = r#"
[source]
url = "mysql://binval:binval@127.0.0.1:3306"
server_id = 77
[redis]
mode = "standalone"
urls = ["redis://127.0.0.1:6379"]
[kafka]
brokers = "127.0.0.1:9092"
[[mappings]]
table = "shop.items"
keys = ["item:detail:{id}"]
replicas = 8
"#;

    #[test]
    fn loads_with_defaults() {
        let c = Config::from_toml(OK).unwrap();
        assert_eq!(c.source.heartbeat_ms, 1000);
        assert_eq!(c.kafka.topic, "binval.invalidations");
        assert_eq!(c.kafka.progress_interval_ms, 200);
        assert_eq!(c.kafka.event_format, EventFormat::PerKey);
        assert_eq!(c.mappings[0].mode, MappingMode::WriteThrough);
        assert_eq!(c.mappings[0].payload, Payload::Whole("row".into()));
    }

    #[test]
    fn non_unique_keys_need_invalidate_mode() {
        let e = Config::from_toml(&format!("{OK}allow_non_unique_keys = true\n")).unwrap_err().to_string();
        assert!(e.contains("mappings[0].allow_non_unique_keys") && e.contains("invalidate"), "{e}");
        let c = Config::from_toml(&format!("{OK}allow_non_unique_keys = true\nmode = \"invalidate\"\n")).unwrap();
        assert!(c.mappings[0].allow_non_unique_keys);
        assert!(!Config::from_toml(OK).unwrap().mappings[0].allow_non_unique_keys);
    }

    #[test]
    fn tls_parameters_of_the_source_url_are_refused() {
        for (param, mode) in [
            ("require_ssl=true", "verify-identity"),
            ("require_ssl=true&verify_ca=false", "required"),
            ("require_ssl=true&verify_identity=false", "verify-ca"),
            ("built_in_roots=false", "disabled"),
        ] {
            let url = format!("mysql://binval:binval@127.0.0.1:3306?{param}");
            let e = Config::from_toml(&OK.replace("mysql://binval:binval@127.0.0.1:3306", &url)).unwrap_err().to_string();
            let first = param.split('&').next().unwrap();
            assert!(e.contains("source.url") && e.contains(first) && e.contains("[source.tls]"), "{e}");
            assert!(e.contains(&format!("mode = \"{mode}\"")), "{param}: {e}");
        }
        let ok = OK.replace("127.0.0.1:3306", "127.0.0.1:3306?prefer_socket=true");
        assert!(Config::from_toml(&ok).is_ok(), "other parameters stay");
    }

    #[test]
    fn replicas_are_a_count_or_a_range() {
        let c = Config::from_toml(OK).unwrap();
        assert_eq!(c.mappings[0].replicas, Replicas::fixed(8));
        assert!(!c.mappings[0].replicas.is_adaptive());
        let c = Config::from_toml(&OK.replace("replicas = 8", "replicas = { min = 2, max = 16 }")).unwrap();
        assert_eq!(c.mappings[0].replicas, Replicas { min: 2, max: 16 });
        assert_eq!(c.mappings[0].replicas.to_string(), "2..=16");
        let c = Config::from_toml(&OK.replace("replicas = 8", "replicas = { max = 4 }")).unwrap();
        assert_eq!(c.mappings[0].replicas, Replicas { min: 1, max: 4 }, "min defaults to 1");
        assert_eq!(c.adaptive.read_budget_per_master, 50_000.0);
        for (bad, want) in [
            ("replicas = { min = 4, max = 2 }", "min = 4 is above max = 2"),
            ("replicas = { min = 1, max = 65 }", "out of range 1..=64"),
            ("replicas = \"many\"", "an integer (`replicas = 8`) or a range"),
        ] {
            let e = Config::from_toml(&OK.replace("replicas = 8", bad)).unwrap_err().to_string();
            assert!(e.contains("replicas") && e.contains(want), "{bad}: {e}");
        }
        for (bad, field) in [
            ("[adaptive]\nread_budget_per_master = 0", "adaptive.read_budget_per_master"),
            ("[adaptive]\npoll_interval_ms = 0", "adaptive.poll_interval_ms"),
            ("[adaptive]\nshrink_headroom = 0.5", "adaptive.shrink_headroom"),
            ("[[adaptive.pin]]\nreplicas = 4", "adaptive.pin[0]"),
            ("[[adaptive.pin]]\nkey = \"k\"\nreplicas = 0", "adaptive.pin[0].replicas"),
        ] {
            let e = Config::from_toml(&format!("{OK}\n{bad}\n")).unwrap_err().to_string();
            assert!(e.contains(field), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = Config::from_toml(&OK.replace("replicas = 8", "replicas = 0")).unwrap_err().to_string();
        assert!(e.contains("mappings[0].replicas"), "{e}");
        let e = Config::from_toml(&OK.replace("item:detail:{id}", "{{shop}}:item:{id}")).unwrap_err().to_string();
        assert!(e.contains("mappings[0].keys[0]") && e.contains("hash tag"), "{e}");
        let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = 77\nstart = \"bogus\"")).unwrap_err().to_string();
        assert!(e.contains("source.start"), "{e}");
        let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = \"x\"")).unwrap_err().to_string();
        assert!(e.contains("server_id"), "{e}");
        let e = Config::from_toml(&OK.replace("mode = \"standalone\"", "mode = \"sentinel\"")).unwrap_err().to_string();
        assert!(e.contains("mode") || e.contains("sentinel"), "{e}");
    }

    #[test]
    fn load_settings_are_checked_and_name_the_field() {
        let c = Config::from_toml(OK).unwrap();
        assert_eq!((c.source.heartbeat_table.as_deref(), c.source.heartbeat_interval_ms, c.source.transaction_memory_mb), (None, 500, 32));
        assert_eq!(c.apply.max_group_rows, 4096);
        let with = |extra: &str| Config::from_toml(&OK.replace("server_id = 77", &format!("server_id = 77\n{extra}")));
        let c = with("heartbeat_table = \"binval.heartbeat\"\nheartbeat_interval_ms = 100").unwrap();
        assert_eq!(c.source.heartbeat_table.as_deref(), Some("binval.heartbeat"));
        for (extra, field) in [
            ("heartbeat_table = \"heartbeat\"", "source.heartbeat_table"),
            ("heartbeat_table = \"a.b; DROP TABLE x\"", "source.heartbeat_table"),
            ("heartbeat_table = \"shop.items\"", "source.heartbeat_table"),
            ("heartbeat_interval_ms = 0", "source.heartbeat_interval_ms"),
            ("transaction_memory_mb = 0", "source.transaction_memory_mb"),
            ("spill_dir = \"/nonexistent/binval\"", "source.spill_dir"),
            ("reconnect_max_ms = 0", "source.reconnect_max_ms"),
            ("reconnect_max_ms = 3600001", "source.reconnect_max_ms"),
            ("lease_ms = 100", "source.lease_ms"),
            ("heartbeat_ms = 0", "source.heartbeat_ms"),
            ("heartbeat_ms = 4294968", "source.heartbeat_ms"),
            ("heartbeat_interval_ms = 60001", "source.heartbeat_interval_ms"),
            ("transaction_memory_mb = 65537", "source.transaction_memory_mb"),
            // Beyond the field's type: named by the deserializer.
            ("fence_epoch = 256", "fence_epoch"),
            ("fence_epoch = -1", "fence_epoch"),
        ] {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
        let e = Config::from_toml(&OK.replace("server_id = 77", "server_id = 4294967296")).unwrap_err().to_string();
        assert!(e.contains("server_id"), "{e}");
        let section = |name: &str, extra: &str| {
            let text = OK.replace(&format!("[{name}]\n"), &format!("[{name}]\n{extra}\n"));
            Config::from_toml(&text).unwrap_err().to_string()
        };
        for (name, extra, field) in [
            ("redis", "timeout_ms = 0", "redis.timeout_ms"),
            ("redis", "timeout_ms = 600001", "redis.timeout_ms"),
            ("redis", "tombstone_ttl_ms = 0", "redis.tombstone_ttl_ms"),
            ("redis", "tombstone_ttl_ms = 9223372036854775807", "redis.tombstone_ttl_ms"),
            // Beyond TOML's integers (i64): the parser's error, with the key named by binval.
            ("redis", "tombstone_ttl_ms = 18446744073709551615", "redis.tombstone_ttl_ms"),
            ("kafka", "partitions = 0", "kafka.partitions"),
            ("kafka", "replication_factor = 0", "kafka.replication_factor"),
            ("kafka", "replication_factor = 40000", "kafka.replication_factor"),
            ("kafka", "progress_interval_ms = 60001", "kafka.progress_interval_ms"),
            ("kafka", "event_format = \"json\"", "kafka.event_format"),
            ("kafka", "event_format = \"json\"", "\"per_key\" or \"batched\""),
            ("kafka", "partitions = 2147483648", "partitions"),
            ("[mappings]", "ttl_secs = 9223372036854775807", "mappings[0].ttl_secs"),
            ("[mappings]", "ttl_secs = 18446744073709551616", "mappings[0].ttl_secs"),
        ] {
            let e = section(name, extra);
            assert!(e.contains(field), "{extra}: {e}");
        }
        let batched = OK.replace("[kafka]\n", "[kafka]\nevent_format = \"batched\"\n");
        assert_eq!(Config::from_toml(&batched).unwrap().kafka.event_format, EventFormat::Batched);
        let e = Config::from_toml(&format!("{batched}\n[kafka.properties]\npartitioner = \"random\"\n")).unwrap_err().to_string();
        assert!(e.contains("kafka.event_format") && e.contains("kafka.properties.partitioner"), "{e}");
        let e = Config::from_toml(&format!("{OK}\n[checkpoint]\ninterval_ms = 0\n")).unwrap_err().to_string();
        assert!(e.contains("checkpoint.interval_ms"), "{e}");
        let e = Config::from_toml(&format!("{OK}\n[metrics]\nready_max_lag_ms = 0\n")).unwrap_err().to_string();
        assert!(e.contains("metrics.ready_max_lag_ms"), "{e}");
        let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group_rows = 1000001\n")).unwrap_err().to_string();
        assert!(e.contains("apply.max_group_rows"), "{e}");
        let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group_rows = 0\n")).unwrap_err().to_string();
        assert!(e.contains("apply.max_group_rows"), "{e}");
        let e = Config::from_toml(&format!("{OK}\n[apply]\nmax_group = 10\n")).unwrap_err().to_string();
        assert!(e.contains("max_group"), "an unknown field is named: {e}");
    }

    #[test]
    fn environment_overrides_keep_strings_and_split_lists() {
        let dir = std::env::temp_dir().join(format!("binval-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(&p, OK).unwrap();
        // SAFETY: this is the only test of this binary that touches BINVAL__ variables.
        unsafe {
            std::env::set_var("BINVAL__SOURCE__NAME", "007");
            std::env::set_var("BINVAL__SOURCE__SERVER_ID", "4001");
            std::env::set_var("BINVAL__REDIS__MODE", "cluster");
            std::env::set_var("BINVAL__REDIS__URLS", "redis://a:1,redis://b:2");
            std::env::set_var("BINVAL__REDIS__PASSWORD", "123");
        }
        let c = Config::load(&p);
        unsafe {
            for k in [
                "BINVAL__SOURCE__NAME",
                "BINVAL__SOURCE__SERVER_ID",
                "BINVAL__REDIS__MODE",
                "BINVAL__REDIS__URLS",
                "BINVAL__REDIS__PASSWORD",
            ] {
                std::env::remove_var(k);
            }
        }
        let c = c.unwrap();
        assert_eq!(c.source.name, "007");
        assert_eq!(c.source.server_id, 4001);
        assert_eq!(c.redis.urls, vec!["redis://a:1".to_string(), "redis://b:2".into()]);
        assert_eq!(
            c.redis.password.as_ref().map(binval_security::Secret::expose),
            Some("123"),
            "a password from the environment stays text"
        );
        assert_eq!(format!("{:?}", c.redis.password), "Some(***)");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn redacts() {
        assert_eq!(redact("mysql://u:secret@h:1"), "mysql://u:***@h:1");
    }
}
