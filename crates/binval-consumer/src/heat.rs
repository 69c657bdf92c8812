//! The consumer's background task for adaptive replica counts ([`binval_protocol::adaptive`]):
//! this instance's **heat report** every report interval, and the **hot set** refresh. The
//! hot set's first load is part of `build()` ([`load_hot_set`]).
//!
//! # Heat reports
//!
//! Every [`crate::ConsumerBuilder::heat_report_interval`] (default 1 s) the task takes the
//! keys this instance reads most from hot-key detection (`hot.rs`, [`HotKeys::heat`]: every
//! `get`, local hits included, with a short window so a step shows within a fifth of a second)
//! and writes them as `HSET binval:heat:{b} <instance id> <HeatReport JSON>`, `b` =
//! [`heat_bucket_of`] the instance id. A report with no key is written once, to retract the
//! previous one, and then not again until there is something to say (an idle instance writes
//! nothing; binval's leader ignores reports older than its staleness cap and deletes fields far
//! older, so a retracted or absent report is the same to it). On shutdown (or when the last
//! handle is dropped) the task removes its field with `HDEL`.
//!
//! A failed write (`NOPERM`: the ACL lacks `HSET`/`HDEL` on `binval:heat:*`; a timeout; a
//! connection error) is counted ([`crate::Stats::heat_reports_failed`]), logged once per kind
//! of failure until a write succeeds again, and retried at the next interval. It never affects
//! a read.
//!
//! # The hot set
//!
//! `HGETALL binval:hot` at start and every [`crate::ConsumerBuilder::hot_set_refresh`]
//! (default 30 s): each entry seeds the key's replica count unless a record already told this
//! instance (`counts.rs`). A failure is a warning naming the key, never fatal; a bad entry is a
//! warning naming the key and value, and is skipped.
//!
//! [`HotKeys::heat`]: crate::hot::HotKeys::heat

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use binval_protocol::adaptive::{heat_bucket_key, heat_bucket_of, parse_count, HeatReport, HEAT_REPORT_VERSION, HOT_SET_KEY};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::counts::ReplicaCounts;
use crate::error::ConsumerError;
use crate::redis_conn::RedisConn;
use crate::state::{now_ms, Shared};
use crate::stats::Counters;

/// What the heat reports say and how often.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeatSettings {
    pub interval: Duration,
    /// Keys per report at most.
    pub top_keys: usize,
    /// Reads per second (of this instance) below which a key is not reported.
    pub min_rate: f64,
}

/// Everything the background task needs besides the shared state.
pub(crate) struct BackgroundSettings {
    pub instance_id: String,
    /// `None`: no heat reports.
    pub heat: Option<HeatSettings>,
    /// `None`: the hot set is not refreshed after start.
    pub hot_set_refresh: Option<Duration>,
    /// Bound of each Redis command.
    pub timeout: Duration,
}

/// The handle of the background task: stopped by [`Background::stop`], or when this handle is
/// dropped (the task then removes its report on its own, if the runtime still runs).
pub(crate) struct Background {
    stop: Option<watch::Sender<bool>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    /// Start the task (nothing to start when there are neither reports nor refreshes).
    pub(crate) fn spawn(redis: RedisConn, shared: Arc<Shared>, counts: Arc<ReplicaCounts>, s: BackgroundSettings) -> Self {
        if s.heat.is_none() && s.hot_set_refresh.is_none() {
            return Background { stop: None, task: Mutex::new(None) };
        }
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(run(redis, shared, counts, s, rx));
        Background { stop: Some(tx), task: Mutex::new(Some(task)) }
    }

    /// Stop the task and wait for it (its last act is removing this instance's heat report),
    /// at most `timeout`. Returns at once when already stopped.
    pub(crate) async fn stop(&self, timeout: Duration) {
        if let Some(tx) = &self.stop {
            let _ = tx.send(true);
        }
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                warn!(timeout_ms = timeout.as_millis() as u64, "binval-consumer heat report task did not stop in time; abandoned");
            }
        }
    }
}

/// The default instance id: `<hostname>-<pid>-<8 random hex digits>` (the hostname from the
/// kernel, else `$HOSTNAME`, else `host`).
pub(crate) fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    format!("{host}-{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// What kind of failure a Redis error is, for "warn once per kind".
fn failure_kind(e: &ConsumerError) -> &'static str {
    match e {
        ConsumerError::Timeout { .. } => "timeout",
        ConsumerError::Redis { source, .. } if source.code() == Some("NOPERM") => "permission",
        e if e.is_unreachable() => "connection",
        _ => "other",
    }
}

/// `HGETALL binval:hot` once, seeding `counts` with every valid entry. Returns the number of
/// entries taken; a failure is counted and returned (the caller decides how loudly to say it).
pub(crate) async fn load_hot_set(
    redis: &RedisConn,
    counts: &ReplicaCounts,
    counters: &Counters,
    timeout: Duration,
) -> Result<usize, ConsumerError> {
    let mut cmd = redis::cmd("HGETALL");
    cmd.arg(HOT_SET_KEY);
    let entries: HashMap<Vec<u8>, Vec<u8>> = match redis.query(&cmd, &format!("HGETALL `{HOT_SET_KEY}`"), timeout).await {
        Ok(m) => m,
        Err(e) => {
            counters.hot_set_load_failure();
            return Err(e);
        }
    };
    let (mut taken, mut bad) = (0usize, 0usize);
    for (k, v) in &entries {
        let count = match std::str::from_utf8(k) {
            Ok(key) => parse_count(Some(v)).map(|n| (key, n)).map_err(|e| e.to_string()),
            Err(_) => Err(format!("the key is not UTF-8: {:?}", String::from_utf8_lossy(k))),
        };
        match count {
            Ok((key, Some(n))) => {
                counts.seed(key, n);
                taken += 1;
            }
            Ok((_, None)) => {}
            Err(reason) => {
                bad += 1;
                if bad <= 3 {
                    warn!(key = HOT_SET_KEY, entry = %String::from_utf8_lossy(k), "hot set entry skipped: {reason}");
                }
            }
        }
    }
    if bad > 3 {
        warn!(key = HOT_SET_KEY, skipped = bad, "hot set: {bad} entries skipped in all (the first 3 are named above)");
    }
    Ok(taken)
}

/// The task: reports and refreshes until stopped, then removes its report.
async fn run(redis: RedisConn, shared: Arc<Shared>, counts: Arc<ReplicaCounts>, s: BackgroundSettings, mut stop: watch::Receiver<bool>) {
    let bucket_key = heat_bucket_key(heat_bucket_of(&s.instance_id));
    let counters = &shared.counters;
    let start = tokio::time::Instant::now();
    let far = start + Duration::from_secs(86_400 * 365);
    let mut next_report = s.heat.map_or(far, |h| start + h.interval);
    let mut next_refresh = s.hot_set_refresh.map_or(far, |r| start + r);
    // The report written last had no key (or none was written): an empty one need not be.
    let mut said_nothing = true;
    let mut warned: Vec<&'static str> = Vec::new();
    let mut refresh_warned: Vec<&'static str> = Vec::new();
    loop {
        tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
            _ = tokio::time::sleep_until(next_report.min(next_refresh)) => {}
        }
        let now = tokio::time::Instant::now();
        if let Some(h) = s.heat.filter(|_| now >= next_report) {
            next_report += h.interval;
            if next_report <= now {
                next_report = now + h.interval;
            }
            let keys = shared.hot.as_ref().map(|hot| hot.heat(h.top_keys, h.min_rate)).unwrap_or_default();
            if !(keys.is_empty() && said_nothing) {
                let empty = keys.is_empty();
                let (keys, now): (Vec<(String, f64)>, Vec<f64>) = keys.into_iter().map(|(k, steady, recent)| ((k, steady), recent)).unzip();
                let report = HeatReport { v: HEAT_REPORT_VERSION, at_ms: now_ms(), keys, now };
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&bucket_key).arg(&s.instance_id).arg(report.to_json());
                match redis.query::<i64>(&cmd, &format!("HSET `{bucket_key}` {}", s.instance_id), s.timeout).await {
                    Ok(_) => {
                        counters.heat_report(true);
                        said_nothing = empty;
                        if !warned.is_empty() {
                            info!(key = %bucket_key, instance = %s.instance_id, "heat reports written again");
                            warned.clear();
                        }
                    }
                    Err(e) => {
                        counters.heat_report(false);
                        let kind = failure_kind(&e);
                        if !warned.contains(&kind) {
                            warned.push(kind);
                            warn!(
                                key = %bucket_key,
                                instance = %s.instance_id,
                                error = %e,
                                "heat report not written ({kind}); binval's leader does not see this instance's reads until one \
                                 is (the Redis ACL needs HSET and HDEL on binval:heat:*); retrying every interval, logged once per kind"
                            );
                        }
                    }
                }
            }
        }
        if let Some(every) = s.hot_set_refresh.filter(|_| now >= next_refresh) {
            next_refresh = now + every;
            match load_hot_set(&redis, &counts, counters, s.timeout).await {
                Ok(_) => refresh_warned.clear(),
                Err(e) => {
                    let kind = failure_kind(&e);
                    if !refresh_warned.contains(&kind) {
                        refresh_warned.push(kind);
                        warn!(key = HOT_SET_KEY, error = %e, "hot set refresh failed ({kind}); reads still learn counts from the records");
                    }
                }
            }
        }
        counters.learned_counts(counts.entries());
    }
    if s.heat.is_some() {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(&bucket_key).arg(&s.instance_id);
        if let Err(e) = redis.query::<i64>(&cmd, &format!("HDEL `{bucket_key}` {}", s.instance_id), s.timeout).await {
            counters.heat_report(false);
            warn!(key = %bucket_key, instance = %s.instance_id, error = %e, "heat report not removed at shutdown (binval's leader drops it once it is old)");
        }
    }
}
