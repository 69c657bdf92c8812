//! What a bootstrap tells while it runs and when it ends: a progress bar (indicatif: rows,
//! rows/s, ETA) when stderr is a terminal, else one log line per [`LOG_EVERY`]; the JSON
//! summary on stdout at the end.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Progress log lines when stderr is not a terminal: at most one per this.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// Totals of one table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableSummary {
    /// `schema.table`.
    pub table: String,
    /// `done`, `interrupted` (a signal; rerun to resume) or `skipped` (done by an earlier run;
    /// `--restart` to do it again).
    pub status: &'static str,
    /// Rows read and written by this run.
    pub rows: u64,
    /// Key changes of those rows (each row makes one per key template).
    pub key_changes: u64,
    /// Key changes that moved a replica or a version token (dry run: would move).
    pub changed: u64,
    /// Key changes Redis already held at the snapshot's position or newer (a change committed
    /// after the snapshot was there first, or the key was bootstrapped before).
    pub unchanged: u64,
    /// Invalidation events published (`--publish`).
    pub events: u64,
    /// Chunks read.
    pub chunks: u64,
    /// Where this run resumed: the scan key of the last row an earlier run wrote.
    pub resumed_after: Option<serde_json::Value>,
    /// Binlog position of the first and the last chunk's snapshot.
    pub first_snapshot: Option<String>,
    /// See `first_snapshot`.
    pub last_snapshot: Option<String>,
    /// Wall time, ms.
    pub elapsed_ms: u64,
}

/// Totals of a bootstrap: the JSON line printed at the end.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BootstrapSummary {
    /// Per table, in order.
    pub tables: Vec<TableSummary>,
    /// Sums over the tables.
    pub rows: u64,
    /// See [`TableSummary::key_changes`].
    pub key_changes: u64,
    /// See [`TableSummary::changed`].
    pub changed: u64,
    /// See [`TableSummary::unchanged`].
    pub unchanged: u64,
    /// See [`TableSummary::events`].
    pub events: u64,
    /// Nothing was written (`--dry-run`).
    pub dry_run: bool,
    /// A signal stopped it before the end (rerun to resume).
    pub interrupted: bool,
    /// Wall time, ms.
    pub elapsed_ms: u64,
    /// `rows` per second of wall time.
    pub rows_per_sec: f64,
}

impl BootstrapSummary {
    /// Add a table's totals.
    pub fn add(&mut self, t: TableSummary) {
        self.rows += t.rows;
        self.key_changes += t.key_changes;
        self.changed += t.changed;
        self.unchanged += t.unchanged;
        self.events += t.events;
        self.interrupted |= t.status == "interrupted";
        self.tables.push(t);
    }

    /// Set the wall time and rate.
    pub fn finish(&mut self, started: Instant) {
        self.elapsed_ms = started.elapsed().as_millis() as u64;
        self.rows_per_sec = rate(self.rows, started.elapsed());
    }
}

/// `n` per second of `d`, rounded to 0.1.
pub fn rate(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        (n as f64 / s * 10.0).round() / 10.0
    } else {
        0.0
    }
}

/// Progress of one table: a bar on a terminal, log lines otherwise, nothing with `--quiet`.
pub struct Progress {
    table: String,
    bar: Option<indicatif::ProgressBar>,
    log: bool,
    started: Instant,
    last_log: Instant,
    rows: u64,
    estimate: u64,
}

impl Progress {
    /// Start showing the bootstrap of `table`, of about `estimate` rows (the server's estimate;
    /// 0 = unknown), resuming after `done` rows.
    pub fn start(table: &str, estimate: u64, done: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(estimate.max(done));
            let style = indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {human_pos}/{human_len} rows, {per_sec}, ETA {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> ");
            b.set_style(style);
            b.set_prefix(table.to_string());
            b.set_position(done);
            b
        });
        Progress {
            table: table.to_string(),
            log: !quiet && bar.is_none(),
            bar,
            started: Instant::now(),
            last_log: Instant::now(),
            rows: done,
            estimate,
        }
    }

    /// `n` more rows written.
    pub fn advance(&mut self, n: u64) {
        self.rows += n;
        if let Some(b) = &self.bar {
            if self.rows > b.length().unwrap_or(0) {
                b.set_length(self.rows);
            }
            b.set_position(self.rows);
        } else if self.log && self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let per_sec = rate(self.rows, self.started.elapsed());
            let eta_s =
                if per_sec > 0.0 && self.estimate > self.rows { ((self.estimate - self.rows) as f64 / per_sec).round() as u64 } else { 0 };
            tracing::info!(table = %self.table, rows = self.rows, estimated_rows = self.estimate, rows_per_sec = per_sec, eta_s, "bootstrap progress");
        }
    }

    /// Done (or stopped): clear the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}
