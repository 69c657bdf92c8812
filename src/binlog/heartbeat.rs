//! The heartbeat row (`source.heartbeat_table`): written on the primary every
//! `source.heartbeat_interval_ms`, read back through the binlog (`binlog::events`).
//!
//! # Why
//!
//! A binlog event header carries its time in whole seconds, so a lag measured from commit
//! times is only good to a second, and it is not measured at all while no application writes.
//! The active instance therefore upserts one row per source,
//! `(source = <source.name>, ts_us = UNIX_TIMESTAMP(NOW(6)) * 10^6)`, on an ordinary
//! connection. When the reader sees that row come back through the binlog, the transaction
//! carries the primary's own microsecond clock, and once its (empty) group is acknowledged the
//! checkpoint task sets `binval_heartbeat_lag_seconds` = now - `ts_us`; `binval_lag_seconds`
//! uses it as that transaction's commit time. The same idea as Debezium's `heartbeat.action.query`
//! and pt-heartbeat.
//!
//! The lag is measured between two clocks: the primary's `NOW(6)` and binval's wall clock.
//! Keep both hosts on NTP; a skew shows up as a constant offset.
//!
//! Failures are not fatal: the reason is logged (at most once a minute) and the row is written
//! again at the next interval. The table is created when missing: `CREATE TABLE IF NOT EXISTS
//! t (source VARCHAR(64) NOT NULL PRIMARY KEY, ts_us BIGINT NOT NULL)` (MariaDB/MySQL need
//! CREATE on it once, then INSERT and UPDATE).

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use tokio::sync::watch;

use crate::binlog::server;
use crate::config::SourceConfig;

/// Why one heartbeat write failed (logged, at most once a minute; the task goes on).
#[derive(Debug, thiserror::Error)]
enum HeartbeatError {
    /// No connection to the source.
    #[error(transparent)]
    Connect(crate::error::Error),
    /// The table's CREATE or the row's upsert failed; `what` names the statement or table.
    #[error("{what}: {source}")]
    Statement { what: String, source: mysql_async::Error },
}

/// `schema.table` (plain identifiers, as `config` checks) quoted for SQL.
fn quoted(table: &str) -> String {
    match table.split_once('.') {
        Some((s, t)) => format!("`{s}`.`{t}`"),
        None => format!("`{table}`"),
    }
}

/// Write the heartbeat row of `cfg.name` into `table` every `cfg.heartbeat_interval_ms` until
/// `stop` turns true.
pub async fn run(cfg: SourceConfig, table: String, mut stop: watch::Receiver<bool>) {
    let every = Duration::from_millis(cfg.heartbeat_interval_ms);
    let t = quoted(&table);
    let create = format!("CREATE TABLE IF NOT EXISTS {t} (source VARCHAR(64) NOT NULL PRIMARY KEY, ts_us BIGINT NOT NULL)");
    let upsert = format!(
        "INSERT INTO {t} (source, ts_us) VALUES (?, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)) ON DUPLICATE KEY UPDATE ts_us = VALUES(ts_us)"
    );
    let mut conn: Option<mysql_async::Conn> = None;
    let mut created = false;
    let mut last_warning: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|v| *v) => break,
        }
        let result: Result<(), HeartbeatError> = async {
            if conn.is_none() {
                conn = Some(server::connect(&cfg).await.map_err(HeartbeatError::Connect)?);
            }
            let c = conn.as_mut().expect("connected");
            if !created {
                c.query_drop(&create).await.map_err(|source| HeartbeatError::Statement { what: create.clone(), source })?;
                created = true;
            }
            c.exec_drop(&upsert, (cfg.name.as_str(),))
                .await
                .map_err(|source| HeartbeatError::Statement { what: format!("upsert into {table}"), source })
        }
        .await;
        if let Err(e) = result {
            conn = None;
            if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(table = %table, error = %e, "heartbeat row not written (source.heartbeat_table); lag is measured from binlog times until it is");
                last_warning = Some(Instant::now());
            }
        }
    }
    if let Some(c) = conn {
        let _ = c.disconnect().await;
    }
}
