//! What `binval verify` reports: the JSON summary (stdout), one JSON line per confirmed
//! mismatch (stderr or `--mismatches FILE`), consistency in nines, and the `binval_verify_*`
//! metrics of a periodic run.
//!
//! # Nines
//!
//! Consistency is the share of keys checked that hold what the database says:
//! `1 - mismatched_keys / keys_checked`, and in nines `-log10(mismatched_keys / keys_checked)`
//! (99.9 % = 3 nines), the measure of Meta's Polaris. With no mismatch among `n` keys the
//! consistency is only known to be at least `1 - 1/n`: `nines` is then `log10(n)` and
//! `nines_at_least` is true.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use super::compare::{Finding, Kind};
use crate::telemetry::names;

/// Totals of one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableCounts {
    /// `schema.table`.
    pub table: String,
    /// Rows read.
    pub rows_checked: u64,
    /// Keys those rows map to, checked.
    pub keys_checked: u64,
    /// Keys found in Redis by `SCAN` that no row scanned maps to, looked up in the database.
    pub reverse_keys_checked: u64,
    /// Keys with a confirmed mismatch.
    pub mismatched_keys: u64,
}

/// The summary of one verify run: the JSON object printed on stdout.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifySummary {
    /// Per table.
    pub tables: Vec<TableCounts>,
    /// Rows read by the scans of the tables (all tables); the reverse check's lookups are
    /// counted in `reverse_keys_checked`, not here.
    pub rows_checked: u64,
    /// Keys checked: those of the rows, plus those of the reverse check and `--keys`.
    pub keys_checked: u64,
    /// Replicas read.
    pub replicas_checked: u64,
    /// Keys with at least one confirmed mismatch.
    pub mismatches: u64,
    /// Confirmed findings by kind: missing replicas or tokens.
    pub missing: u64,
    /// Replicas holding another value than the row (or a tombstone for a live row).
    pub stale: u64,
    /// Replicas holding a value no row maps to.
    pub extra: u64,
    /// Version tokens older than a replica (or not a number).
    pub version: u64,
    /// Keys whose row exists and whose replicas are all marked stale (no payload: left by
    /// TRUNCATE, a RENAME cut-over or a column-changing ALTER TABLE until the row is written
    /// again): readers load the row from the database. Not mismatches.
    pub not_cached: u64,
    /// Keys that differed at first and again after the recheck delay, but with a newer change
    /// in between (row or Redis moved, or `binval run` had not reached the snapshot): lag, not
    /// counted as mismatches.
    pub unsettled: u64,
    /// Suspects not rechecked because more than the limit were found (the run is incomplete).
    pub not_rechecked: u64,
    /// `1 - mismatches / keys_checked`.
    pub consistency: f64,
    /// The consistency in nines (module docs).
    pub nines: f64,
    /// `nines` is a lower bound (no mismatch found).
    pub nines_at_least: bool,
    /// `--sample` percentage, when sampling.
    pub sample_pct: Option<f64>,
    /// The recheck delay, ms.
    pub recheck_ms: u64,
    /// `--repair`: keys rewritten and now consistent.
    pub repaired: u64,
    /// `--repair`: keys still inconsistent after the rewrite (e.g. a replica or token holding
    /// a position newer than the source's: the fenced writes cannot move it back).
    pub repair_failed: u64,
    /// Invalidation events published by the repair.
    pub repair_events: u64,
    /// The binlog position of the first snapshot read.
    pub snapshot: Option<String>,
    /// `binval run`'s checkpoint (`file:pos`) when verify began, or when its recheck began if
    /// there was one; `None` only when there is no checkpoint.
    pub checkpoint: Option<String>,
    /// A signal stopped the checks early: the counts cover what was checked.
    pub interrupted: bool,
    /// Wall time, ms.
    pub elapsed_ms: u64,
    /// Rows read per second of wall time.
    pub rows_per_sec: f64,
}

impl VerifySummary {
    /// Count the confirmed findings of one key.
    pub fn confirmed(&mut self, table: usize, findings: &[Finding]) {
        self.mismatches += 1;
        if let Some(t) = self.tables.get_mut(table) {
            t.mismatched_keys += 1;
        }
        for f in findings {
            match f.kind {
                Kind::Missing => self.missing += 1,
                Kind::Stale => self.stale += 1,
                Kind::Extra => self.extra += 1,
                Kind::Version => self.version += 1,
            }
        }
    }

    /// Totals, consistency and nines, once the counts are in.
    pub fn finish(&mut self, elapsed: std::time::Duration) {
        self.rows_checked = self.tables.iter().map(|t| t.rows_checked).sum();
        let keys = self.keys_checked.max(1) as f64;
        self.consistency = 1.0 - self.mismatches as f64 / keys;
        (self.nines, self.nines_at_least) = nines(self.mismatches, self.keys_checked);
        self.elapsed_ms = elapsed.as_millis() as u64;
        self.rows_per_sec = crate::commands::bootstrap::report::rate(self.rows_checked, elapsed);
    }

    /// Publish the `binval_verify_*` gauges of this run (see `telemetry`).
    pub fn record_metrics(&self) {
        metrics::gauge!(names::VERIFY_ROWS_CHECKED).set(self.rows_checked as f64);
        metrics::gauge!(names::VERIFY_KEYS_CHECKED).set(self.keys_checked as f64);
        for (kind, n) in [("missing", self.missing), ("stale", self.stale), ("extra", self.extra), ("version", self.version)] {
            metrics::gauge!(names::VERIFY_MISMATCHES, "kind" => kind).set(n as f64);
        }
        metrics::gauge!(names::VERIFY_MISMATCHED_KEYS).set(self.mismatches as f64);
        metrics::gauge!(names::VERIFY_UNSETTLED).set(self.unsettled as f64);
        metrics::gauge!(names::VERIFY_NINES).set(self.nines);
        metrics::gauge!(names::VERIFY_DURATION).set(self.elapsed_ms as f64 / 1000.0);
        metrics::gauge!(names::VERIFY_LAST_RUN_TS).set(crate::now_ms() as f64 / 1000.0);
        metrics::counter!(names::VERIFY_REPAIRED).increment(self.repaired);
        let result = if self.mismatches == 0 { "consistent" } else { "inconsistent" };
        metrics::counter!(names::VERIFY_RUNS, "result" => result).increment(1);
    }
}

/// `(nines, at_least)` for `bad` mismatched keys of `n` checked (module docs), rounded to
/// 0.01. No key checked: `(0, true)`.
pub fn nines(bad: u64, n: u64) -> (f64, bool) {
    let round = |x: f64| (x * 100.0).round() / 100.0;
    match (bad, n) {
        (_, 0) => (0.0, true),
        (0, n) => (round((n as f64).log10()), true),
        (b, n) => (round(-(b as f64 / n as f64).log10()).max(0.0), false),
    }
}

/// One confirmed mismatch, as a JSON line.
#[derive(Debug, Serialize)]
pub struct MismatchLine<'a> {
    /// The logical key.
    pub key: &'a str,
    /// The mapped table.
    pub table: &'a str,
    /// The row's scan key (`column -> value`), when a row maps to the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row_key: Option<BTreeMap<String, serde_json::Value>>,
    /// What is wrong, per replica or token.
    pub findings: &'a [Finding],
    /// The replica names of those findings (`K:r3`), or the token's.
    pub replicas: Vec<String>,
    /// The version token read at the recheck (`None`: absent).
    pub version: Option<u64>,
    /// Each replica's position read at the recheck (`None`: missing).
    pub replica_positions: Vec<Option<u64>>,
    /// The recheck snapshot's binlog position and fence position: what the key was compared
    /// with.
    pub snapshot: String,
    /// See `snapshot`.
    pub snapshot_fence_position: u64,
}

/// Where mismatch lines go: stderr, or a file (`--mismatches`, appended).
pub enum LineSink {
    /// Standard error.
    Stderr,
    /// A file.
    File(std::fs::File),
}

impl LineSink {
    /// Open `path` for appending, or stderr. Errors name `--mismatches`.
    pub fn open(path: Option<&std::path::Path>) -> Result<Self, crate::error::Error> {
        match path {
            None => Ok(LineSink::Stderr),
            Some(p) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map(LineSink::File)
                .map_err(|e| crate::error::Error::config("--mismatches", format!("{}: {e}", p.display()))),
        }
    }

    /// Write one line.
    pub fn line(&mut self, l: &MismatchLine<'_>) {
        let text = serde_json::to_string(l).expect("line serializes");
        let _ = match self {
            LineSink::Stderr => writeln!(std::io::stderr(), "{text}"),
            LineSink::File(f) => writeln!(f, "{text}"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_in_nines() {
        assert_eq!(nines(1, 1000), (3.0, false));
        assert_eq!(nines(5, 1_000_000), (5.3, false));
        assert_eq!(nines(0, 100_000), (5.0, true));
        assert_eq!(nines(10, 10), (0.0, false));
        assert_eq!(nines(0, 0), (0.0, true));
    }
}
