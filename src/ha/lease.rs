//! High availability: one active `binval run` per source, chosen by a lease in Redis, with a
//! fencing token that every write carries.
//!
//! # Why a fencing token and not just a lease
//!
//! A lease alone cannot stop a paused process (GC-free Rust still meets stopped VMs, SIGSTOP,
//! long network partitions) from waking up after its lease expired and writing as if it were
//! still active. So each acquisition takes a new, larger **fencing token** (`INCR` of
//! `binval:{<name>}:fence`) and every write carries it:
//!
//! Tokens are `max(previous token + 1, Redis server time in ms)`: they grow with every tenure,
//! and still grow if the counter key itself is lost (a Redis data loss must not leave every
//! new leader with a token smaller than the ones stored in the replicas, refused forever).
//!
//! * each replica record stores the token of its writer (`f`), and the replica script refuses a
//!   write whose fencing token is older than the stored one — once the new leader has written a key,
//!   the old one can no longer touch it (it gets `-1` and stops with [`TransientError::LeaseLost`]);
//! * the checkpoint is saved by a script that compares the fencing token with the current value
//!   of the fencing token counter (same hash slot through the `{<name>}` hash tag), so a stale leader can never
//!   move the shared checkpoint.
//!
//! Writes a stale leader still makes to keys the new leader has not touched yet are real,
//! committed changes in source order, and version fencing refuses anything older than what a
//! key holds; they cannot move a cache backwards.
//!
//! # Keys
//!
//! * `binval:{<name>}:lease` = `"<holder> <token>"`, with a TTL of `source.lease_ms`;
//! * `binval:{<name>}:fence` = the last fencing token handed out (only grows;
//!   [`fencing_token_key`]);
//! * `binval:{<name>}:checkpoint` (see [`crate::ha::checkpoint`]).
//!
//! The active instance renews every third of `lease_ms`; a standby polls as often, but at
//! least every 200 ms ([`standby_poll`]), and takes over at most `lease_ms` + one poll after
//! the active one stopped renewing (default 1500 ms: streaming within about 2 s of a kill -9,
//! within the apps' staleness bound, issue #22). A leader whose renewals fail keeps writing
//! under its fencing token ([`Lease::keep`]).

use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, TransientError};
use crate::redis::RedisConn;

const ACQUIRE: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur then
  local holder, tok = string.match(cur, '^(%S+) (%d+)$')
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {tok, holder, redis.call('PTTL', KEYS[1])}
  end
  return {'0', holder or cur, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local tok = string.format('%d', math.max(prev + 1, now))
redis.call('SET', KEYS[2], tok)
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. tok, 'PX', ARGV[2])
return {tok, ARGV[1], tonumber(ARGV[2])}
"#;

// 1: renewed; 2: it had expired (its master did not answer for longer than the lease) and
// nobody took it since (the fencing token counter still holds ours): taken again; 0: lost.
const RENEW: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not cur and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"#;

const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

/// Key of the lease of source `name`.
pub fn lease_key(name: &str) -> String {
    format!("binval:{{{name}}}:lease")
}

/// Key of the fencing token counter of source `name` (the key string `binval:{<name>}:fence`
/// is kept as it always was: it is stored data).
pub fn fencing_token_key(name: &str) -> String {
    format!("binval:{{{name}}}:fence")
}

/// Who holds the lease of a source now, as read by [`read_holder`] (`binval status`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LeaseHolder {
    /// The holder id (`host-pid-random`) of the active instance.
    pub holder: String,
    /// The fencing token of its tenure.
    pub fencing_token: u64,
    /// Milliseconds until the lease expires unless renewed.
    pub ttl_ms: i64,
}

/// Read the lease of source `name` (`GET` and `PTTL` of [`lease_key`]); `None` when no
/// instance holds it. Errors are transient Redis errors naming the key.
pub async fn read_holder(conn: &RedisConn, name: &str) -> Result<Option<LeaseHolder>, Error> {
    let key = lease_key(name);
    let mut c = conn.clone();
    let value: Option<String> = c.get(&key).await.map_err(|e| redis_error(format!("GET {key}: {e}")))?;
    let Some(value) = value else { return Ok(None) };
    let ttl_ms: i64 = c.query(redis::cmd("PTTL").arg(&key)).await.map_err(|e| redis_error(format!("PTTL {key}: {e}")))?;
    let (holder, token) = value.rsplit_once(' ').unwrap_or((value.as_str(), "0"));
    Ok(Some(LeaseHolder { holder: holder.to_string(), fencing_token: token.parse().unwrap_or(0), ttl_ms }))
}

/// A held lease: the fencing token to put on every write.
#[derive(Debug, Clone)]
pub struct Lease {
    /// Source name.
    pub name: String,
    /// This instance's holder id (`host-pid-random`).
    pub holder: String,
    /// The fencing token of this tenure; larger than every earlier one.
    pub fencing_token: u64,
    /// Lease length, ms.
    pub lease_ms: u64,
}

/// A unique holder id for this process.
pub fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
    format!("{host}-{}-{:08x}", std::process::id(), rand::random::<u32>())
}

impl Lease {
    /// Try once. `Ok(Err((holder, ttl_ms)))` when another instance holds it.
    pub async fn try_acquire(conn: &RedisConn, name: &str, holder: &str, lease_ms: u64) -> Result<Result<Lease, (String, i64)>, Error> {
        let mut c = conn.clone();
        let (tok, who, ttl): (String, String, i64) = c
            .eval(ACQUIRE, &[lease_key(name), fencing_token_key(name)], &[holder.to_string(), lease_ms.to_string()])
            .await
            .map_err(|e| redis_error(format!("lease {}: {e}", lease_key(name))))?;
        let token: u64 = tok.parse().unwrap_or(0);
        if token == 0 {
            return Ok(Err((who, ttl)));
        }
        Ok(Ok(Lease { name: name.into(), holder: holder.into(), fencing_token: token, lease_ms }))
    }

    /// Wait as standby until the lease is ours, or `shutdown` (then `None`).
    pub async fn acquire(
        conn: &RedisConn,
        name: &str,
        holder: &str,
        lease_ms: u64,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Option<Lease>, Error> {
        let mut logged = false;
        loop {
            match Self::try_acquire(conn, name, holder, lease_ms).await? {
                Ok(l) => {
                    crate::telemetry::health().became_leader(l.fencing_token);
                    tracing::info!(source = name, fencing_token = l.fencing_token, holder, "lease acquired: this instance is active");
                    return Ok(Some(l));
                }
                Err((other, ttl)) => {
                    crate::telemetry::health().became_standby();
                    crate::telemetry::health().lease_checked();
                    if !logged {
                        tracing::info!(source = name, active = %other, lease_ttl_ms = ttl, "another instance is active; waiting as standby");
                        logged = true;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(standby_poll(lease_ms)) => {}
                _ = shutdown.wait_for(|v| *v) => return Ok(None),
            }
        }
    }

    fn value(&self) -> String {
        format!("{} {}", self.holder, self.fencing_token)
    }

    /// Renew once; `Ok(false)` when the lease is no longer ours. A lease that expired while
    /// its master did not answer (frozen longer than `lease_ms`) is taken again if no other
    /// instance took it since — the fencing token counter still holds this tenure's token —
    /// so a frozen master does not cost a handover; after a Redis data loss the counter is
    /// gone and the lease is lost.
    pub async fn renew(&self, conn: &RedisConn) -> Result<bool, Error> {
        let mut c = conn.clone();
        let n: i64 = c
            .eval(
                RENEW,
                &[lease_key(&self.name), fencing_token_key(&self.name)],
                &[self.value(), self.lease_ms.to_string(), self.fencing_token.to_string()],
            )
            .await
            .map_err(|e| redis_error(format!("lease renew: {e}")))?;
        if n == 2 {
            tracing::info!(source = %self.name, fencing_token = self.fencing_token, "the lease had expired while Redis did not answer; nobody took it since: taken again");
        }
        Ok(n >= 1)
    }

    /// Give the lease up (clean shutdown), so a standby takes over at once.
    pub async fn release(&self, conn: &RedisConn) {
        crate::telemetry::health().became_standby();
        let mut c = conn.clone();
        if let Err(e) = c.eval::<i64>(RELEASE, &[lease_key(&self.name)], &[self.value()]).await {
            tracing::warn!(error = %e, "lease release failed; a standby takes over when it expires");
        }
    }

    /// Renew every third of the lease until `stop`; returns the error that ended the tenure:
    /// [`TransientError::LeaseLost`] when a renewal finds the lease held by another instance
    /// (or gone: a wiped Redis).
    ///
    /// A renewal that fails (the master holding the lease key is frozen or failing over) does
    /// not end the tenure: the writes do not depend on the lease but on the fencing token they
    /// carry, so if another instance took the lease meanwhile, the first key it writes (or the
    /// checkpoint it saves) stops this one. Stepping down instead would stop every write while
    /// that one master does not answer — and no standby can take the lease either then
    /// (issue #22). Failures are logged (at most every 5 s) and counted.
    pub async fn keep(&self, conn: RedisConn, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
        let period = Duration::from_millis(self.lease_ms / 3);
        let mut last_ok = tokio::time::Instant::now();
        let mut last_warn: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.wait_for(|v| *v) => return Ok(()),
            }
            match self.renew(&conn).await {
                Ok(true) => {
                    if last_warn.take().is_some() {
                        tracing::info!(source = %self.name, "lease renewed again");
                    }
                    last_ok = tokio::time::Instant::now();
                    crate::telemetry::health().lease_checked();
                }
                Ok(false) => {
                    crate::telemetry::health().became_standby();
                    return Err(TransientError::LeaseLost {
                        source_name: self.name.clone(),
                        message: "another instance holds it now".into(),
                    }
                    .into());
                }
                Err(e) => {
                    if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                        last_warn = Some(tokio::time::Instant::now());
                        tracing::warn!(
                            error = %e,
                            since_renewed_ms = last_ok.elapsed().as_millis() as u64,
                            "lease renewal failed; writing on under the fencing token (a new leader's first write stops this instance)"
                        );
                    }
                }
            }
        }
    }
}

/// How often a standby tries to take the lease: a third of it, at most every
/// [`STANDBY_POLL_MAX`], so a takeover after the leader's death costs at most `lease_ms` plus
/// that (one `EVAL` each: cheap).
pub fn standby_poll(lease_ms: u64) -> Duration {
    Duration::from_millis(lease_ms / 3).min(STANDBY_POLL_MAX)
}

/// The longest wait between two tries of a standby.
pub const STANDBY_POLL_MAX: Duration = Duration::from_millis(200);

/// A failed lease command: transient, counted in `binval_errors_total`.
fn redis_error(message: String) -> TransientError {
    crate::telemetry::error_classified("redis", false);
    TransientError::Redis(message)
}
