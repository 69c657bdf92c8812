//! Helpers of the decoder tests (tests/types.rs, tests/cases.rs, tests/proptest_roundtrip.rs):
//! read the rows a real MariaDB wrote to its binlog, both ways binval reads them:
//!
//! * live: binval's source stage (replica connection, decompression, TABLE_MAP framing, decode,
//!   transaction assembly) in this process, with no Redis or Kafka behind it;
//! * offline: the offline reader over the server's own binlog file.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use binval::binlog::decode::{RowChange, RowKind};
use binval::binlog::resume::{Resume, SourceStats};
use binval::binlog::txn::Transaction;
use binval_protocol::SourcePosition;
use binval_testkit as tk;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// One row change as JSON: `{"kind": "insert"|"update"|"delete", "table": "db.t", "before": {..}, "after": {..}}`
/// (before/after only where the image exists).
pub fn row_json(r: &RowChange) -> Value {
    let kind = match r.kind {
        RowKind::Insert => "insert",
        RowKind::Update => "update",
        RowKind::Delete => "delete",
    };
    let mut v = json!({"kind": kind, "table": &*r.table});
    if let Some(b) = &r.before {
        v["before"] = Value::Object(b.clone());
    }
    if let Some(a) = &r.after {
        v["after"] = Value::Object(a.clone());
    }
    v
}

/// The server's current binlog file and position.
pub fn binlog_now(db: &tk::MariaDb) -> (String, u64) {
    let status = db.sql("SHOW MASTER STATUS").unwrap();
    let mut it = status.split('\t');
    (it.next().unwrap().to_string(), it.next().unwrap().trim().parse().unwrap())
}

/// Every JSON line of the offline reader (events and rows) from `file:pos` to the end of the
/// binlog, following rotations to later files in the server's order.
pub fn offline_lines(db: &tk::MariaDb, from: &(String, u64)) -> Result<Vec<Value>, binval::binlog::offline::OfflineError> {
    // By the number after the dot, as the server counts (`.999999` comes before `.1000000`).
    let index = |f: &str| binval_protocol::file_index(f).expect("a numbered binlog file");
    let mut files: Vec<String> = db.sql("SHOW BINARY LOGS").unwrap().lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    files.retain(|f| index(f) >= index(&from.0));
    files.sort_by_key(|f| index(f));
    let mut lines = Vec::new();
    for f in files {
        let start = if f == from.0 { Some(from.1) } else { None };
        binval::binlog::offline::read_file(&db.datadir.join(&f), start, None, |l| lines.push(l))?;
    }
    Ok(lines)
}

/// Row changes of tables of database `db_name` from `file:pos` to the end of the binlog, through
/// the offline reader ([`offline_lines`]), as [`row_json`] values.
pub fn offline_rows(db: &tk::MariaDb, from: &(String, u64), db_name: &str) -> Result<Vec<Value>, binval::binlog::offline::OfflineError> {
    let prefix = format!("{db_name}.");
    let rows = offline_lines(db, from)?
        .into_iter()
        .filter(|l| l.get("kind").is_some() && l["table"].as_str().is_some_and(|t| t.starts_with(&prefix)))
        .map(|l| {
            let mut v = json!({"kind": l["kind"], "table": l["table"]});
            for k in ["before", "after"] {
                if let Some(x) = l.get(k) {
                    v[k] = x.clone();
                }
            }
            v
        })
        .collect();
    Ok(rows)
}

static SERVER_IDS: AtomicU32 = AtomicU32::new(0);

/// binval's source stage reading one server live, for the given `schema.table`s.
pub struct Live {
    rx: mpsc::Receiver<Transaction>,
    stop: watch::Sender<bool>,
    handle: Option<tokio::task::JoinHandle<Result<(), binval::error::Error>>>,
    /// Transactions received so far, with their rows decoded (the apply stage decodes them in
    /// the pipeline; here, as soon as they arrive).
    pub transactions: Vec<(Transaction, Vec<RowChange>)>,
    /// The source stage's counters (events, rows, reconnects).
    pub stats: Arc<SourceStats>,
}

impl Live {
    /// Start reading `db` at `resume` with `tables` mapped.
    pub fn start(db: &tk::MariaDb, tables: &[String], resume: Resume) -> Live {
        // The source's warnings (reconnects) in the test output; RUST_LOG for more.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
            .with_test_writer()
            .try_init();
        // The rows as read, whatever the tables' keys: accepted as non-unique (the reader judges
        // key templates after DDL; nothing is written here).
        let mappings: Vec<binval::config::MappingConfig> = tables
            .iter()
            .map(|t| {
                serde_json::from_value(json!({"table": t, "keys": ["k:{id}"], "mode": "invalidate", "allow_non_unique_keys": true}))
                    .unwrap()
            })
            .collect();
        let mapper = Arc::new(binval::mapping::Mapper::new(&mappings).unwrap());
        let n = SERVER_IDS.fetch_add(1, Ordering::Relaxed);
        let cfg: binval::config::SourceConfig = serde_json::from_value(json!({
            "url": db.repl_url(),
            "server_id": 50_000 + (std::process::id() % 10_000) * 100 + n,
            "heartbeat_ms": 500,
            "reconnect_max_ms": 1000,
        }))
        .unwrap();
        let (tx, rx) = mpsc::channel(1024);
        let (stop, stop_rx) = watch::channel(false);
        let stats = Arc::new(SourceStats::default());
        let names = binval::binlog::reader::ReadState::default();
        let handle = tokio::spawn(binval::binlog::reader::run(cfg, mapper, names, resume, None, tx, stop_rx, stats.clone()));
        Live { rx, stop, handle: Some(handle), transactions: Vec::new(), stats }
    }

    /// Start at `file:pos`.
    pub fn at(db: &tk::MariaDb, tables: &[String], from: &(String, u64)) -> Live {
        Live::start(db, tables, Resume::FilePos(SourcePosition { file: from.0.clone(), pos: from.1, gtid: None }))
    }

    /// Wait until `n` row changes arrived in committed transactions (or `secs` pass: then
    /// return what arrived; a source error panics with its message).
    pub async fn rows(&mut self, n: usize, secs: u64) -> Vec<Value> {
        let until = Instant::now() + Duration::from_secs(secs);
        while self.row_count() < n {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match tokio::time::timeout(left.min(Duration::from_millis(200)), self.rx.recv()).await {
                Ok(Some(t)) => {
                    // Positions name a real binlog file (the checkpoint resumes from them): six
                    // digits or more (past mysql-bin.999999 comes mysql-bin.1000000).
                    let f = &t.position.file;
                    assert!(
                        f.starts_with("mysql-bin.") && f.len() >= "mysql-bin.000001".len() && f[10..].bytes().all(|b| b.is_ascii_digit()),
                        "transaction position names file {f:?}"
                    );
                    self.push(t)
                }
                Ok(None) => {
                    let h = self.handle.take().unwrap();
                    match h.await.unwrap() {
                        Err(e) => panic!("source stopped: {e}"),
                        Ok(()) => panic!("source stopped without an error"),
                    }
                }
                Err(_) => {
                    if self.handle.as_ref().is_some_and(|h| h.is_finished()) {
                        let h = self.handle.take().unwrap();
                        match h.await.unwrap() {
                            Err(e) => panic!("source stopped: {e}"),
                            Ok(()) => panic!("source stopped without an error"),
                        }
                    }
                }
            }
        }
        self.transactions.iter().flat_map(|t| t.1.iter().map(row_json)).collect()
    }

    /// Keep a received transaction, its rows decoded (a row that does not decode panics).
    fn push(&mut self, mut t: Transaction) {
        let mut rows = Vec::new();
        t.rows.decode_all(&mut rows).unwrap_or_else(|e| panic!("transaction ending at {}: {e}", t.position));
        self.transactions.push((t, rows));
    }

    /// Everything received so far in commit order: each row change ([`row_json`]), and for a
    /// transaction that invalidates whole tables (TRUNCATE, DROP, partition DDL) first
    /// `{"kind": "invalidate", "tables": [...]}`.
    pub fn changes(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for (t, rows) in &self.transactions {
            if !t.invalidate_tables.is_empty() {
                out.push(json!({"kind": "invalidate", "tables": t.invalidate_tables}));
            }
            out.extend(rows.iter().map(row_json));
        }
        out
    }

    fn row_count(&self) -> usize {
        self.transactions.iter().map(|t| t.1.len()).sum()
    }

    /// Wait for the source to stop by itself with an error (within `secs`).
    pub async fn error(mut self, secs: u64) -> binval::error::Error {
        let h = self.handle.take().unwrap();
        let drain = async {
            while let Some(t) = self.rx.recv().await {
                self.push(t);
            }
        };
        let (r, _) = tokio::time::timeout(Duration::from_secs(secs), async { tokio::join!(h, drain) })
            .await
            .expect("the source stops with an error in time");
        match r.unwrap() {
            Err(e) => e,
            Ok(()) => panic!("source ended without an error"),
        }
    }

    /// Stop the source; panics if it failed.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(h) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(20), h).await.expect("source stops").unwrap().expect("source ended cleanly");
        }
    }
}

/// Where `got` and `want` first differ, briefly (paths, lengths and a short excerpt), or `None`.
pub fn first_difference(got: &Value, want: &Value) -> Option<String> {
    fn short(v: &Value) -> String {
        let s = v.to_string();
        if s.len() > 120 {
            format!("{}… ({} chars)", &s[..s.char_indices().nth(100).map(|(i, _)| i).unwrap_or(s.len())], s.len())
        } else {
            s
        }
    }
    fn walk(path: &str, g: &Value, w: &Value) -> Option<String> {
        match (g, w) {
            (Value::Object(a), Value::Object(b)) => {
                for k in a.keys().chain(b.keys()) {
                    match (a.get(k), b.get(k)) {
                        (Some(x), Some(y)) => {
                            if let Some(d) = walk(&format!("{path}.{k}"), x, y) {
                                return Some(d);
                            }
                        }
                        (x, y) => return Some(format!("{path}.{k}: got {:?}, want {:?}", x.map(short), y.map(short))),
                    }
                }
                None
            }
            (Value::Array(a), Value::Array(b)) => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    if let Some(d) = walk(&format!("{path}[{i}]"), x, y) {
                        return Some(d);
                    }
                }
                (a.len() != b.len()).then(|| format!("{path}: got {} elements, want {}", a.len(), b.len()))
            }
            (Value::String(a), Value::String(b)) if a != b => {
                let at = a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
                Some(format!(
                    "{path}: strings differ at char {at} (got {} chars, want {}): got …{}…, want …{}…",
                    a.chars().count(),
                    b.chars().count(),
                    a.chars().skip(at.saturating_sub(10)).take(40).collect::<String>(),
                    b.chars().skip(at.saturating_sub(10)).take(40).collect::<String>()
                ))
            }
            _ => (g != w).then(|| format!("{path}: got {}, want {}", short(g), short(w))),
        }
    }
    walk("$", got, want)
}

/// Assert `got == want`, reporting only where they first differ (values may be megabytes).
#[track_caller]
pub fn assert_same(got: &Value, want: &Value, context: &str) {
    if let Some(d) = first_difference(got, want) {
        panic!("{context}: {d}");
    }
}

/// How the server's answer for a column becomes binval's canonical JSON value.
#[derive(Clone, Copy, Debug)]
pub enum Conv {
    /// `CAST(v AS CHAR)` -> exact integer.
    Int,
    /// `CAST(v AS CHAR)` -> string as is (DECIMAL with its scale, DATE, DATETIME, TIME, ENUM,
    /// and MariaDB JSON, which is LONGTEXT).
    Text,
    /// `v` read through a utf8mb4 connection: the server converts the column charset.
    Str,
    /// FLOAT: `CAST(v AS DOUBLE)` (the exact f32 value) -> shortest decimal that reads back as
    /// the same f32.
    Float,
    /// DOUBLE: `CAST(v AS CHAR)` -> number.
    Double,
    /// BIT, YEAR: `v + 0` -> number.
    Num,
    /// TIMESTAMP with session time_zone '+00:00': `CAST(v AS CHAR)` -> `...T...Z`, except the
    /// zero timestamp.
    Utc,
    /// Binary strings: `HEX(v)` -> base64.
    Hex,
    /// SET: `CAST(v AS CHAR)` -> list of labels.
    Set,
    /// GEOMETRY: `ST_SRID(v)`, `HEX(ST_AsBinary(v))` -> `{"srid", "wkb"}`.
    Geo,
    /// MariaDB UUID / INET6 / INET4: `HEX(CAST(v AS BINARY(n)))` -> base64.
    BinCast(u32),
}

/// The SELECT expression whose value `canonical` converts.
pub fn select_expr(conv: Conv, col: &str) -> String {
    match conv {
        Conv::Int | Conv::Text | Conv::Double | Conv::Utc | Conv::Set => format!("CAST({col} AS CHAR)"),
        Conv::Str => col.to_string(),
        Conv::Float => format!("CAST({col} AS DOUBLE)"),
        Conv::Num => format!("{col} + 0"),
        Conv::Hex => format!("HEX({col})"),
        Conv::Geo => format!("CONCAT(ST_SRID({col}), ':', HEX(ST_AsBinary({col})))"),
        Conv::BinCast(n) => format!("HEX(CAST({col} AS BINARY({n})))"),
    }
}

/// binval's canonical value for the server's answer `v` (a string or NULL).
pub fn canonical(conv: Conv, v: Option<String>) -> Value {
    let Some(s) = v else { return Value::Null };
    let b64 = |hex: &str| {
        let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    match conv {
        Conv::Int | Conv::Num => {
            if s.starts_with('-') {
                json!(s.parse::<i64>().unwrap())
            } else {
                json!(s.parse::<u64>().unwrap())
            }
        }
        Conv::Text | Conv::Str => Value::String(s),
        Conv::Float => {
            let f = s.parse::<f64>().unwrap() as f32;
            json!(f.to_string().parse::<f64>().unwrap())
        }
        Conv::Double => json!(s.parse::<f64>().unwrap()),
        Conv::Utc => {
            if s.starts_with("0000-00-00") {
                Value::String(s)
            } else {
                Value::String(format!("{}Z", s.replacen(' ', "T", 1)))
            }
        }
        Conv::Hex | Conv::BinCast(_) => b64(&s),
        Conv::Set => Value::Array(if s.is_empty() { vec![] } else { s.split(',').map(|l| json!(l)).collect() }),
        Conv::Geo => {
            let (srid, hex) = s.split_once(':').unwrap();
            json!({"srid": srid.parse::<u32>().unwrap(), "wkb": b64(hex)})
        }
    }
}
