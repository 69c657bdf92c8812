//! The services (binval-testkit: MariaDB with a row binlog, a 3-master Redis Cluster, tansu,
//! each on free loopback ports) and the mapped table of the benchmark.

use mysql_async::prelude::Queryable;

use binval_testkit as tk;

/// Probe rows (ids above the writer's range): the eviction latency is timed on them.
pub const PROBES: u32 = 20;

/// The benchmark's database and services.
pub struct Bench {
    /// The database holding `items` (and binval's heartbeat table).
    pub db: String,
    /// Prefix of every logical key (`<prefix>:item:<id>`).
    pub prefix: String,
    /// Rows the writer updates (`1..=rows`); probe rows follow.
    pub rows: u32,
    pub mysql_root: String,
    /// binval's replica connection URL.
    pub repl_url: String,
    /// Redis URLs: the Cluster's seed nodes, or the one standalone server ([`Bench::redis_mode`]).
    pub cluster: Vec<String>,
    /// binval's `redis.mode`: `cluster` (the default) or `standalone` (the fan-out benchmark).
    pub redis_mode: &'static str,
    /// Suffix replicas per key (`replicas` of the mapping; the app instances use the same).
    pub replicas: u32,
    /// The mapping's `replicas` setting when it is not the static [`Bench::replicas`] (the
    /// adaptive benchmark's `{ min = 1, max = 16 }`); the app instances then use
    /// [`Bench::replicas`] as their default count only.
    pub replicas_setting: Option<String>,
    /// Sections appended to binval's config (the adaptive benchmark's `[adaptive]`).
    pub extra_sections: String,
    /// Extra lines of binval's `[kafka]` section for the next [`Bench::config`] (the fan-out
    /// benchmark's `event_format`).
    pub kafka_extra: String,
    pub brokers: String,
    /// The binlog position before the rows were inserted (where the seeding run starts).
    pub before_rows: (String, u64),
}

impl Bench {
    /// Start (or reuse) the services, create the database, the table and its rows, and let the
    /// binlog reader's user write the heartbeat table there.
    pub async fn new(rows: u32) -> anyhow::Result<Bench> {
        Self::with_services(rows, tk::mariadb(), tk::redis_cluster().urls(), tk::broker().bootstrap()).await
    }

    /// [`Bench::new`] on the given MariaDB, Redis Cluster and broker (a fault benchmark's own,
    /// which it may freeze or restart).
    pub async fn with_services(rows: u32, server: &tk::MariaDb, cluster: Vec<String>, brokers: String) -> anyhow::Result<Bench> {
        let db = server.create_database("load")?;
        let mut bench = Bench {
            prefix: tk::unique_name("load"),
            db,
            rows,
            mysql_root: server.root_url(),
            repl_url: server.repl_url(),
            cluster,
            redis_mode: "cluster",
            replicas: 8,
            replicas_setting: None,
            extra_sections: String::new(),
            kafka_extra: String::new(),
            brokers,
            before_rows: (String::new(), 0),
        };
        let mut c = mysql_async::Conn::from_url(bench.app_url()).await?;
        c.query_drop("CREATE TABLE items (id INT PRIMARY KEY, title VARCHAR(200) NOT NULL, price DECIMAL(10,2) NOT NULL, stock INT NOT NULL, updated DATETIME(3) NOT NULL)").await?;
        bench.before_rows = bench.binlog_now().await?;
        // 50,000 rows per transaction: a million-row table (the adaptive benchmark) is not
        // one huge transaction binval would have to hold.
        let mut from = 1;
        while from <= rows + PROBES {
            let to = (from + 49_999).min(rows + PROBES);
            c.query_drop(format!("INSERT INTO items SELECT seq, CONCAT('product ', seq), 10.00, 1000000, NOW(3) FROM seq_{from}_to_{to}"))
                .await?;
            from = to + 1;
        }
        c.query_drop(format!("GRANT CREATE, INSERT, UPDATE ON `{}`.* TO 'binval'@'%'", bench.db)).await?;
        c.disconnect().await?;
        Ok(bench)
    }

    /// The app's connection URL (root, the benchmark's database).
    pub fn app_url(&self) -> String {
        format!("{}/{}", self.mysql_root, self.db)
    }

    /// The probe rows' ids.
    pub fn probe_ids(&self) -> Vec<u32> {
        (self.rows + 1..=self.rows + PROBES).collect()
    }

    /// The logical key of row `id`.
    pub fn key(&self, id: u32) -> String {
        format!("{}:item:{id}", self.prefix)
    }

    /// A new topic of 3 partitions (a fresh one per cell: tansu's fetch cost grows with the
    /// batches a partition holds, see docs/benchmarks.md).
    pub fn fresh_topic(&self, cell: &str) -> anyhow::Result<String> {
        let t = format!("{}_{cell}", self.prefix);
        tk::broker().create_topic(&t, 3)?;
        Ok(t)
    }

    /// `SHOW MASTER STATUS`: (file, position).
    pub async fn binlog_now(&self) -> anyhow::Result<(String, u64)> {
        let mut c = mysql_async::Conn::from_url(self.app_url()).await?;
        let row: mysql_async::Row = c.query_first("SHOW MASTER STATUS").await?.ok_or_else(|| anyhow::anyhow!("binlog off"))?;
        let (f, p): (String, u64) = (row.get(0).unwrap_or_default(), row.get(1).unwrap_or_default());
        c.disconnect().await?;
        Ok((f, p))
    }

    /// binval's config for one cell, written to the testkit's state folder.
    pub fn config(&self, cell: &str, start: &str, topic: &str, metrics_port: u16) -> anyhow::Result<std::path::PathBuf> {
        let urls: Vec<String> = self.cluster.iter().map(|u| format!("\"{u}\"")).collect();
        let text = format!(
            r#"[source]
name = "{prefix}_{cell}"
url = "{repl}"
server_id = {sid}
start = "{start}"
heartbeat_table = "{db}.heartbeat"
heartbeat_interval_ms = 100

[redis]
mode = "{redis_mode}"
urls = [{urls}]

[kafka]
brokers = "{brokers}"
topic = "{topic}"
create_topic = false
{kafka_extra}
{linger}
[checkpoint]
store = "redis"
interval_ms = 1000

[metrics]
listen = "127.0.0.1:{metrics_port}"

[[mappings]]
table = "{db}.items"
keys = ["{prefix}:item:{{id}}"]
replicas = {replicas}
payload = "row"
mode = "write-through"
{extra}"#,
            prefix = self.prefix,
            repl = self.repl_url,
            sid = 20_000 + std::process::id() % 10_000,
            db = self.db,
            urls = urls.join(", "),
            brokers = self.brokers,
            redis_mode = self.redis_mode,
            replicas = self.replicas_setting.clone().unwrap_or_else(|| self.replicas.to_string()),
            extra = self.extra_sections,
            kafka_extra = self.kafka_extra,
            linger = match std::env::var("BENCH_LINGER_MS") {
                Ok(ms) => format!("properties = {{ \"linger.ms\" = \"{ms}\" }}\n"),
                Err(_) => String::new(),
            },
        );
        let dir = tk::state_root().join("configs");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{}_{cell}.toml", self.prefix));
        std::fs::write(&path, text)?;
        Ok(path)
    }
}
