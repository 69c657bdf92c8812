//! `binval status`: where a source's binval stands, for an operator at a terminal: who leads
//! (the lease in Redis), where the checkpoint is and how old it is, where the primary's binlog
//! is and how many bytes the checkpoint is behind it, and, when `metrics.listen` answers on
//! this host, the local instance's role, readiness and lag. Read-only: it takes no lease and
//! moves nothing.
//!
//! The table reads from Redis (lease, fencing token counter, checkpoint) and the source
//! (`SHOW BINARY LOGS`, `@@version`); `--json` prints the same as one JSON object
//! ([`Status`]).

use std::io::{Read, Write};
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use crate::error::{Error, TransientError};
use crate::ha::lease::LeaseHolder;
use crate::redis::RedisConn;

/// Everything `binval status` reports.
#[derive(Debug, Serialize)]
pub struct Status {
    /// `source.name`.
    pub source: String,
    /// The lease holder, `None` when no instance leads.
    pub leader: Option<LeaseHolder>,
    /// The newest fencing token handed out (the counter; the leader's token equals it).
    pub fencing_token_counter: u64,
    /// The saved checkpoint.
    pub checkpoint: Option<CheckpointStatus>,
    /// The primary.
    pub primary: Option<PrimaryStatus>,
    /// Binlog bytes from the checkpoint to the primary's position (`None`: unknown, e.g. the
    /// checkpoint's file was purged).
    pub behind_bytes: Option<u64>,
    /// The instance whose `metrics.listen` this host answers on, if it does.
    pub local_instance: Option<LocalInstance>,
    /// Keys of adaptive mappings above their `min` count, hottest first (empty without
    /// adaptive mappings).
    pub hot_keys: Vec<HotKeyStatus>,
}

/// One key of an adaptive mapping above its `min` count (`crate::replicas`).
#[derive(Debug, Serialize)]
pub struct HotKeyStatus {
    /// The logical key.
    pub key: String,
    /// The count readers are told.
    pub replicas: u32,
    /// Replicas changes write (above `replicas` while a shrink waits for its removal).
    pub writing: u32,
    /// The fleet read rate the leader saw last, reads/s.
    pub reads_per_sec: f64,
    /// Why.
    pub why: String,
}

/// The saved checkpoint.
#[derive(Debug, Serialize)]
pub struct CheckpointStatus {
    /// `file:pos`.
    pub position: String,
    /// GTID state saved with it.
    pub gtid: Option<String>,
    /// Saved at, Unix ms.
    pub saved_at_ms: u64,
    /// Now minus `saved_at_ms`.
    pub age_ms: u64,
    /// Where it is stored.
    pub location: String,
}

/// The primary's binlog.
#[derive(Debug, Serialize)]
pub struct PrimaryStatus {
    /// `@@version`.
    pub version: String,
    /// `file:pos` (end of the newest binlog file).
    pub position: String,
    /// Binlog files it still has.
    pub binlog_files: usize,
}

/// What the local instance's metrics listener says.
#[derive(Debug, Serialize)]
pub struct LocalInstance {
    /// `http://host:port`.
    pub url: String,
    /// `/readyz` answered 200.
    pub ready: bool,
    /// `/readyz`'s `role` and `reason`.
    pub role: String,
    /// Why.
    pub reason: String,
    /// `binval_lag_seconds`.
    pub lag_seconds: Option<f64>,
    /// `binval_leader`.
    pub leader: Option<bool>,
}

/// Gather the status of `cfg`'s source. Errors: Redis and source errors (transient: the
/// operator retries), a definite error for an unreadable checkpoint.
pub async fn gather(cfg: &Config) -> Result<Status, Error> {
    let redis = RedisConn::connect(&cfg.redis).await?;
    let name = &cfg.source.name;
    let leader = crate::ha::lease::read_holder(&redis, name).await?;
    let fencing_token_counter = crate::write::apply::current_fencing_token(&redis, &crate::ha::lease::fencing_token_key(name)).await?;
    let mut store = crate::ha::checkpoint::CheckpointStoreImpl::new(&cfg.checkpoint, name, &redis);
    let now = crate::now_ms();
    let saved = store.load().await?;
    let checkpoint = saved.as_ref().map(|c| CheckpointStatus {
        position: format!("{}:{}", c.file, c.pos),
        gtid: c.gtid.clone(),
        saved_at_ms: c.saved_at_ms,
        age_ms: now.saturating_sub(c.saved_at_ms),
        location: store.location(),
    });
    let (primary, behind_bytes) = match primary(cfg).await {
        Ok((version, logs)) => {
            let behind = saved
                .as_ref()
                .and_then(|c| crate::binlog::server::bytes_behind(&logs, &binval_protocol::BinlogPosition::new(&c.file, c.pos)));
            let position = logs.last().map(|(f, s)| format!("{f}:{s}")).unwrap_or_default();
            (Some(PrimaryStatus { version, position, binlog_files: logs.len() }), behind)
        }
        Err(e) => {
            eprintln!("warning: source not readable: {e}");
            (None, None)
        }
    };
    let local_instance = match &cfg.metrics.listen {
        Some(l) => local_instance(l),
        None => None,
    };
    let mut hot_keys: Vec<HotKeyStatus> = if cfg.mappings.iter().any(|m| m.replicas.is_adaptive()) {
        crate::replicas::counts::load(&redis, name)
            .await?
            .into_iter()
            .map(|(key, s)| HotKeyStatus { key, replicas: s.n, writing: s.w, reads_per_sec: s.reads_per_sec, why: s.why })
            .collect()
    } else {
        Vec::new()
    };
    hot_keys.sort_by(|a, b| b.reads_per_sec.total_cmp(&a.reads_per_sec));
    Ok(Status { source: name.clone(), leader, fencing_token_counter, checkpoint, primary, behind_bytes, local_instance, hot_keys })
}

async fn primary(cfg: &Config) -> Result<(String, Vec<(String, u64)>), Error> {
    use mysql_async::prelude::Queryable;
    let mut conn = crate::binlog::server::connect(&cfg.source).await?;
    let version: Option<String> = conn.query_first("SELECT @@version").await.map_err(|e| crate::error::classify_mysql(e, "status"))?;
    let logs = crate::binlog::server::binary_log_sizes(&mut conn).await?;
    let _ = conn.disconnect().await;
    Ok((version.unwrap_or_default(), logs))
}

/// Ask the metrics listener `listen` (an unspecified address is asked on loopback).
fn local_instance(listen: &str) -> Option<LocalInstance> {
    let mut addr: std::net::SocketAddr = listen.parse().ok()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let (code, body) = http_get(addr, "/readyz").ok()?;
    let r: serde_json::Value = serde_json::from_str(&body).ok()?;
    let metrics = http_get(addr, "/metrics").map(|(_, b)| b).unwrap_or_default();
    Some(LocalInstance {
        url: format!("http://{addr}"),
        ready: code == 200,
        role: r["role"].as_str().unwrap_or("").to_string(),
        reason: r["reason"].as_str().unwrap_or("").to_string(),
        lag_seconds: sample(&metrics, crate::telemetry::names::LAG),
        leader: sample(&metrics, crate::telemetry::names::LEADER).map(|v| v == 1.0),
    })
}

/// The value of the first sample of `name` in Prometheus text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let rest = if rest.starts_with('{') { &rest[rest.find('}')? + 1..] } else { rest };
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// A plain HTTP/1.0 GET with a 2 s timeout: status code and body.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// Render `s` as the human table: one `what  value` line per row.
pub fn render(s: &Status) -> String {
    let mut rows: Vec<(&str, String)> = vec![("source", s.source.clone())];
    rows.push((
        "leader",
        match &s.leader {
            Some(l) => format!("{} (fencing token {}, lease expires in {:.1} s)", l.holder, l.fencing_token, l.ttl_ms as f64 / 1000.0),
            None => "none: no instance holds the lease".into(),
        },
    ));
    rows.push(("fencing token", format!("{} (newest handed out)", s.fencing_token_counter)));
    rows.push((
        "checkpoint",
        match &s.checkpoint {
            Some(c) => format!(
                "{}{} saved {} ago ({})",
                c.position,
                c.gtid.as_ref().map(|g| format!(" gtid {g},")).unwrap_or_else(|| ",".into()),
                human_ms(c.age_ms),
                c.location
            ),
            None => "none saved yet".into(),
        },
    ));
    rows.push((
        "primary",
        match &s.primary {
            Some(p) => {
                format!("{} ({}, {} binlog file{})", p.position, p.version, p.binlog_files, if p.binlog_files == 1 { "" } else { "s" })
            }
            None => "not readable (see the warning above)".into(),
        },
    ));
    rows.push((
        "behind",
        match s.behind_bytes {
            Some(0) => "0 bytes: the checkpoint is at the primary's position".into(),
            Some(b) => format!("{b} bytes of binlog between the checkpoint and the primary"),
            None => "unknown".into(),
        },
    ));
    if let Some(i) = &s.local_instance {
        rows.push(("this host", format!("{} {} ({}): {}", i.url, i.role, if i.ready { "ready" } else { "NOT ready" }, i.reason)));
        if let Some(lag) = i.lag_seconds {
            rows.push(("lag", format!("{lag:.3} s behind the source (binval_lag_seconds of this host's instance)")));
        }
    }
    for (i, h) in s.hot_keys.iter().take(20).enumerate() {
        let writing = if h.writing > h.replicas { format!(", writing {} until the shrink's grace ends", h.writing) } else { String::new() };
        rows.push((
            if i == 0 { "hot keys" } else { "" },
            format!("{} {} replicas{writing}, fleet reads {:.0}/s", h.key, h.replicas, h.reads_per_sec),
        ));
    }
    if s.hot_keys.len() > 20 {
        rows.push(("", format!("... and {} more (--json lists all)", s.hot_keys.len() - 20)));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect()
}

fn human_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1000..=119_999 => format!("{:.1} s", ms as f64 / 1000.0),
        120_000..=7_199_999 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

/// `binval status`: print the table (or JSON with `json`).
pub async fn cli(cfg: &Config, json: bool) -> Result<(), Error> {
    let s = gather(cfg).await?;
    let out = if json { serde_json::to_string_pretty(&s).expect("serializable") + "\n" } else { render(&s) };
    std::io::stdout()
        .write_all(out.as_bytes())
        .map_err(|e| TransientError::LocalDisk(format!("writing the status to standard output: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_from_prometheus_text() {
        let text = "# TYPE binval_lag_seconds gauge\nbinval_lag_seconds{source=\"s\"} 1.5\nbinval_leader 1\n";
        assert_eq!(sample(text, "binval_lag_seconds"), Some(1.5));
        assert_eq!(sample(text, "binval_leader"), Some(1.0));
        assert_eq!(sample(text, "binval_lag"), None, "a prefix is not a name");
    }

    #[test]
    fn renders_a_table() {
        let s = Status {
            source: "shop".into(),
            leader: Some(LeaseHolder { holder: "h-1-ab".into(), fencing_token: 9, ttl_ms: 4200 }),
            fencing_token_counter: 9,
            checkpoint: Some(CheckpointStatus {
                position: "b.000002:80".into(),
                gtid: Some("0-1-5".into()),
                saved_at_ms: 1,
                age_ms: 1500,
                location: "redis key binval:{shop}:checkpoint".into(),
            }),
            primary: Some(PrimaryStatus { version: "10.11".into(), position: "b.000002:120".into(), binlog_files: 2 }),
            behind_bytes: Some(40),
            local_instance: None,
            hot_keys: vec![HotKeyStatus {
                key: "item:detail:6666".into(),
                replicas: 8,
                writing: 8,
                reads_per_sec: 412_000.0,
                why: String::new(),
            }],
        };
        let t = render(&s);
        assert!(t.contains("leader         h-1-ab (fencing token 9, lease expires in 4.2 s)"), "{t}");
        assert!(t.contains("checkpoint     b.000002:80 gtid 0-1-5, saved 1.5 s ago"), "{t}");
        assert!(t.contains("behind         40 bytes"), "{t}");
        assert!(t.contains("hot keys       item:detail:6666 8 replicas, fleet reads 412000/s"), "{t}");
    }
}
