//! What `/readyz` answers: the role of this instance, its source connection, lag and lease
//! checks, kept in one process-wide [`Health`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

use super::names;
use super::record::set_position;

/// What this instance is doing, for `/readyz` and [`names::LEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Started, no lease decision yet.
    Starting = 0,
    /// Another instance holds the lease; this one polls it.
    Standby = 1,
    /// This instance holds the lease and writes.
    Leader = 2,
    /// A shutdown was requested.
    Stopping = 3,
}

impl Role {
    /// `starting`, `standby`, `leader`, `stopping`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Starting => "starting",
            Role::Standby => "standby",
            Role::Leader => "leader",
            Role::Stopping => "stopping",
        }
    }
}

/// The process-wide state `/readyz` decides on: set by the lease, the reader and the monitor
/// (atomics: readers never block the pipeline).
#[derive(Debug)]
pub struct Health {
    role: AtomicU8,
    connected: AtomicBool,
    lag_ms: AtomicU64,
    lease_checked_ms: AtomicU64,
    lease_ms: AtomicU64,
    max_lag_ms: AtomicU64,
    fencing_token: AtomicU64,
    checkpoint: Mutex<Option<SavedCheckpoint>>,
    /// Why the pipeline last stopped and is restarting (a transient error), until the replica
    /// connection opens again: readiness names it, so a wrong `kafka.brokers` is not reported
    /// as a source problem.
    restart_reason: Mutex<Option<String>>,
}

/// The last checkpoint this instance saved or loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// Binlog file.
    pub file: String,
    /// Offset in `file`.
    pub pos: u64,
    /// When it was saved, Unix ms.
    pub saved_at_ms: u64,
}

pub(super) static HEALTH: Health = Health::new();

/// The process-wide [`Health`].
pub fn health() -> &'static Health {
    &HEALTH
}

/// The answer of `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// Ready (HTTP 200) or not (503).
    pub ready: bool,
    /// [`Role::as_str`].
    pub role: &'static str,
    /// Why, in words.
    pub reason: String,
}

impl Health {
    /// A process that is starting: not connected, no lease checked, no checkpoint; the lease
    /// and lag bounds at their defaults until [`Health::configure`] sets them from the config.
    pub(super) const fn new() -> Health {
        Health {
            role: AtomicU8::new(Role::Starting as u8),
            connected: AtomicBool::new(false),
            lag_ms: AtomicU64::new(0),
            lease_checked_ms: AtomicU64::new(0),
            lease_ms: AtomicU64::new(5000),
            max_lag_ms: AtomicU64::new(30_000),
            fencing_token: AtomicU64::new(0),
            checkpoint: Mutex::new(None),
            restart_reason: Mutex::new(None),
        }
    }

    /// Set the bounds readiness uses: `source.lease_ms` and `metrics.ready_max_lag_ms`.
    pub fn configure(&self, lease_ms: u64, max_lag_ms: u64) {
        self.lease_ms.store(lease_ms, Relaxed);
        self.max_lag_ms.store(max_lag_ms, Relaxed);
    }

    /// The current role.
    pub fn role(&self) -> Role {
        match self.role.load(Relaxed) {
            1 => Role::Standby,
            2 => Role::Leader,
            3 => Role::Stopping,
            _ => Role::Starting,
        }
    }

    /// This instance holds the lease with `fencing_token` (a new tenure, or the same one taken
    /// again after a pipeline restart).
    pub fn became_leader(&self, fencing_token: u64) {
        self.role.store(Role::Leader as u8, Relaxed);
        let previous = self.fencing_token.swap(fencing_token, Relaxed);
        self.lease_checked();
        metrics::gauge!(names::LEADER).set(1.0);
        metrics::gauge!(names::FENCING_TOKEN).set(fencing_token as f64);
        // A restart within the tenure re-acquires the same token: not a new tenure.
        if previous != fencing_token {
            metrics::counter!(names::LEASE_ACQUIRED).increment(1);
        }
    }

    /// Another instance holds the lease (or this one lost or released it). A shutdown in
    /// progress stays [`Role::Stopping`].
    pub fn became_standby(&self) {
        let _ = self.role.fetch_update(Relaxed, Relaxed, |r| (r != Role::Stopping as u8).then_some(Role::Standby as u8));
        self.fencing_token.store(0, Relaxed);
        metrics::gauge!(names::LEADER).set(0.0);
        metrics::gauge!(names::FENCING_TOKEN).set(0.0);
    }

    /// The pipeline stopped on transient error `reason` and restarts (cleared when the replica
    /// connection opens).
    pub fn restarting(&self, reason: String) {
        *self.restart_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
    }

    /// A shutdown was requested: not ready from now on.
    pub fn stopping(&self) {
        self.role.store(Role::Stopping as u8, Relaxed);
    }

    /// The lease was read or renewed in Redis just now.
    pub fn lease_checked(&self) {
        self.lease_checked_ms.store(crate::now_ms(), Relaxed);
    }

    /// The fencing token of the current tenure (0 when not leader).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token.load(Relaxed)
    }

    /// Whether the replica connection is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Relaxed)
    }

    /// Record the lag the monitor computed.
    pub fn set_lag_ms(&self, lag_ms: u64) {
        self.lag_ms.store(lag_ms, Relaxed);
    }

    /// The last checkpoint saved or loaded.
    pub fn checkpoint(&self) -> Option<SavedCheckpoint> {
        self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ready or not at `now_ms`, and why (the rules in the module docs).
    pub fn readiness(&self, now_ms: u64) -> Readiness {
        let role = self.role();
        let (ready, reason) = match role {
            Role::Starting => (false, "starting: no lease decision yet".to_string()),
            Role::Stopping => (false, "shutting down".to_string()),
            Role::Leader => {
                let (lag, max) = (self.lag_ms.load(Relaxed), self.max_lag_ms.load(Relaxed));
                if !self.connected() {
                    match self.restart_reason.lock().unwrap_or_else(|e| e.into_inner()).as_deref() {
                        Some(why) => (false, format!("leader, but the pipeline is restarting after: {why}")),
                        None => (false, "leader, but the replica connection to the source is not open".to_string()),
                    }
                } else if lag > max {
                    (false, format!("leader, {lag} ms behind the source (metrics.ready_max_lag_ms = {max})"))
                } else {
                    (true, format!("leader streaming, {lag} ms behind the source"))
                }
            }
            Role::Standby => {
                let bound = self.lease_ms.load(Relaxed) * 2;
                let age = now_ms.saturating_sub(self.lease_checked_ms.load(Relaxed));
                if age > bound {
                    (false, format!("standby, but the lease was not read in Redis for {age} ms (bound {bound} ms)"))
                } else {
                    (true, "standby, polling the lease".to_string())
                }
            }
        };
        Readiness { ready, role: role.as_str(), reason }
    }
}

/// The replica connection is open until the returned guard drops (hold it for the life of the
/// connection): sets [`names::SOURCE_CONNECTED`] and the readiness flag.
#[must_use = "the connection counts as open only while the guard lives"]
pub fn source_connected() -> ConnectedGuard {
    HEALTH.connected.store(true, Relaxed);
    *HEALTH.restart_reason.lock().unwrap_or_else(|e| e.into_inner()) = None;
    metrics::gauge!(names::SOURCE_CONNECTED).set(1.0);
    ConnectedGuard(())
}

/// See [`source_connected`].
#[derive(Debug)]
pub struct ConnectedGuard(());

impl Drop for ConnectedGuard {
    fn drop(&mut self) {
        HEALTH.connected.store(false, Relaxed);
        metrics::gauge!(names::SOURCE_CONNECTED).set(0.0);
    }
}

/// A checkpoint was saved, or loaded at start: the `checkpoint` position gauges and
/// the state [`crate::monitor`] computes the checkpoint age from.
pub fn checkpoint_recorded(file: &str, pos: u64, saved_at_ms: u64) {
    set_position("checkpoint", file, pos);
    metrics::gauge!(names::CHECKPOINT_SAVED_TS).set(saved_at_ms as f64 / 1000.0);
    *HEALTH.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) = Some(SavedCheckpoint { file: file.to_string(), pos, saved_at_ms });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn readiness_rules() {
        let h = Health::new();
        let now = crate::now_ms();
        assert!(!h.readiness(now).ready, "starting");
        h.became_standby();
        assert!(!h.readiness(now).ready, "standby that never read the lease");
        h.lease_checked();
        assert_eq!(h.readiness(now).role, "standby");
        assert!(h.readiness(now).ready);
        assert!(!h.readiness(now + 20_000).ready, "standby whose lease check is older than two lease periods");
        h.became_leader(7);
        assert_eq!(h.fencing_token(), 7);
        assert!(!h.readiness(now).ready, "leader without a source connection");
        h.restarting("kafka: kafka.brokers = \"x:1\": no broker answered".into());
        let r = h.readiness(now);
        assert!(!r.ready && r.reason.contains("kafka.brokers"), "the restart's cause is the reason: {r:?}");
        h.connected.store(true, Relaxed);
        assert!(h.readiness(now).ready);
        h.set_lag_ms(30_001);
        let r = h.readiness(now);
        assert!(!r.ready && r.reason.contains("30001 ms behind"), "{r:?}");
        h.set_lag_ms(10);
        h.stopping();
        h.became_standby();
        assert_eq!(h.readiness(now).role, "stopping", "a shutdown stays stopping");
    }
}
