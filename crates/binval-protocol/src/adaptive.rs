//! Adaptive replica counts: how many suffix replicas each key has, when the count follows the
//! fleet's reads (`replicas = { min = 1, max = 16 }` in a mapping), and the two Redis layouts
//! the writer and the readers share for it: the fleet's **heat reports** (app instances ->
//! binval's leader) and the **hot set** (binval's leader -> app instances at start).
//!
//! # Why per key
//!
//! A static `replicas = 8` gives every row of a table 8 copies and costs 9 script calls per
//! change, while only a handful of keys are ever hot. With an adaptive mapping, a key lives in
//! `min` copies until the fleet reads it faster than one master should serve, then gets as
//! many as its read rate needs (at most `max`), and returns to `min` when it cools.
//!
//! # Readers learn the count from the data
//!
//! Every replica record carries the key's current count in field [`FIELD_COUNT`] (`n`, a
//! decimal; see `fence` for the other fields): the writer stores it with every write, and
//! rewrites it on the existing replicas when the count changes. A reader that reads any
//! replica therefore learns how many there are. A reader starts from its configured count (or
//! the hot set); whatever it believes, a replica it finds missing (no record at all) sends its
//! next read to replica 0, which exists whenever the key does (every count is at least 1). So
//! a reader whose count is too large never answers "no row" for an existing row, and one whose
//! count is too small spreads less until its first read corrects it.
//!
//! Records written before the field existed have no `n`: readers keep what they knew.
//!
//! # Growing and shrinking (the writer's side: `src/replicas/` in binval)
//!
//! * **Grow** `a -> b`: later changes of the key write `b` replicas; replicas `a..b` are
//!   copied from replica 0 *at its own fence position* through the fenced replica script (a
//!   change committed meanwhile has a newer position and wins); then `n = b` is set on the old
//!   replicas ([`replica_count_script`]). A reader that reads a replica not copied yet finds it
//!   missing and reads replica 0.
//! * **Shrink** `b -> a`: `n = a` is announced on every replica (and in the hot set) first,
//!   while changes still write all `b`; only after a grace period longer than the readers'
//!   staleness bound (and than a reader's longest fill: `max_replica_reads + 1` reads at its
//!   response timeout) are replicas `a..b` removed ([`replica_remove_script`]). A reader that
//!   still reads a removed replica finds it missing and reads replica 0: never "no row".
//! * A count change **never creates a key**: a copy is made only from an existing replica 0,
//!   and an announcement only touches existing records. Readers rely on that: a key they
//!   confirmed missing comes into existence only through a change, whose event they see.
//!
//! # Heat reports
//!
//! Each app instance writes, every report interval, the keys it reads most with their read
//! rates (every `get`, local hits included: when its fail safe bypasses the local cache, every
//! one of those reads lands on Redis) as one field of one of [`HEAT_BUCKETS`] hashes:
//! `HSET binval:heat:{b} <instance id> <HeatReport as JSON>`, where `b` is
//! [`heat_bucket_of`] the instance id. Sixteen hashes with hash tags `{0}`..`{15}` spread the
//! reports over the masters of a Cluster (one hash per key would need a SCAN to find; one hash
//! for the fleet would be a hot key). binval's leader reads the sixteen hashes, sums the rates
//! of each key over the reports younger than its staleness cap, and deletes fields far older
//! than that (instances that stopped).
//!
//! # The hot set
//!
//! `binval:hot` is a hash from logical key to its current count (decimal), for every key of an
//! adaptive mapping whose count is above 1 (a key that is not listed has the count its records
//! say, or 1). binval's leader keeps it; an app instance reads it once at start
//! (`HGETALL`, one call per instance start), so its first reads of a key that is already hot
//! spread at once. It is an index for readers only: the writer's own decisions (with their
//! hysteresis state) live beside its lease and checkpoint.

use crate::fence::FieldError;
use serde::{Deserialize, Serialize};

/// Hash field of a replica record holding the key's replica count (decimal `u32`, at least 1).
pub const FIELD_COUNT: &str = "n";

/// The hot set: hash `logical key -> count` (module docs).
pub const HOT_SET_KEY: &str = "binval:hot";

/// Number of heat-report hashes (module docs).
pub const HEAT_BUCKETS: u16 = 16;

/// Schema version of [`HeatReport`].
pub const HEAT_REPORT_VERSION: u32 = 1;

/// The largest count a mapping may ask for (`max`): more replicas than this spread no better
/// on any Redis Cluster worth the name and multiply the writes of a change.
pub const MAX_REPLICAS: u32 = 64;

/// The Redis key of heat-report hash `bucket` (`0..HEAT_BUCKETS`): `binval:heat:{<bucket>}`.
///
/// ```
/// assert_eq!(binval_protocol::adaptive::heat_bucket_key(3), "binval:heat:{3}");
/// ```
pub fn heat_bucket_key(bucket: u16) -> String {
    format!("binval:heat:{{{bucket}}}")
}

/// The heat-report hash an instance id writes to: CRC16 of the id mod [`HEAT_BUCKETS`].
///
/// ```
/// use binval_protocol::adaptive::{heat_bucket_of, HEAT_BUCKETS};
/// assert!(heat_bucket_of("app-7") < HEAT_BUCKETS);
/// assert_eq!(heat_bucket_of("app-7"), heat_bucket_of("app-7"));
/// ```
pub fn heat_bucket_of(instance_id: &str) -> u16 {
    crate::keys::hash_slot(instance_id.as_bytes()) % HEAT_BUCKETS
}

/// What one app instance reports: its most-read keys over its recent reads. Serialized as JSON,
/// e.g. `{"v":1,"at_ms":1764790000000,"keys":[["item:detail:6666",41250.0]],"now":[40800.0]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeatReport {
    /// [`HEAT_REPORT_VERSION`].
    pub v: u32,
    /// When the report was made, Unix ms (the instance's clock).
    pub at_ms: u64,
    /// `(logical key, reads per second)`, most read first. Reads are the app's `get` calls of
    /// the key, local hits included. The rate is a steady one (it follows a rise within a
    /// fifth of a second but a stop only within a few seconds): binval grows counts from it.
    pub keys: Vec<(String, f64)>,
    /// The same keys' reads per second over the last fraction of a second, index by index
    /// with `keys` (empty in reports of consumers that predate it; the leader then takes the
    /// steady rate). It follows a stop as fast as a rise: binval's cool-down clock starts and
    /// restarts from it, so a key that cools is back at `min` copies a cool-down after its
    /// reads fell, not a cool-down after the steady rate caught up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub now: Vec<f64>,
}

/// Why bytes read from a heat hash are not a report this build reads.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HeatReportError {
    /// Not JSON of the report's shape (a field written by something else).
    #[error("not a heat report: {0}")]
    NotAReport(String),
    /// A report schema this build does not read ([`HEAT_REPORT_VERSION`] is the one it does).
    #[error("heat report version {0} (this build reads {HEAT_REPORT_VERSION})")]
    Version(u32),
    /// A read rate that is negative or not finite; `recent`: in `now`, else in `keys`.
    #[error("heat report: key {key:?} has {}read rate {rate}", if *.recent { "recent " } else { "" })]
    Rate { key: String, rate: f64, recent: bool },
    /// `now` does not hold one recent rate per key.
    #[error("heat report: {recent} recent rates (`now`) for {keys} keys")]
    RecentCount { recent: usize, keys: usize },
}

impl HeatReport {
    /// Parse a report read from a heat hash; errors name what is wrong (a field written by
    /// something else, or a newer schema).
    ///
    /// ```
    /// use binval_protocol::adaptive::HeatReport;
    /// let r = HeatReport::parse(br#"{"v":1,"at_ms":5,"keys":[["k",2.5]]}"#).unwrap();
    /// assert_eq!(r.keys, vec![("k".to_string(), 2.5)]);
    /// assert!(HeatReport::parse(b"{}").is_err());
    /// ```
    pub fn parse(raw: &[u8]) -> Result<Self, HeatReportError> {
        let r: HeatReport = serde_json::from_slice(raw).map_err(|e| HeatReportError::NotAReport(e.to_string()))?;
        if r.v != HEAT_REPORT_VERSION {
            return Err(HeatReportError::Version(r.v));
        }
        if let Some((k, rate)) = r.keys.iter().find(|(_, rate)| !rate.is_finite() || *rate < 0.0) {
            return Err(HeatReportError::Rate { key: k.clone(), rate: *rate, recent: false });
        }
        if !r.now.is_empty() && r.now.len() != r.keys.len() {
            return Err(HeatReportError::RecentCount { recent: r.now.len(), keys: r.keys.len() });
        }
        if let Some((i, rate)) = r.now.iter().enumerate().find(|(_, rate)| !rate.is_finite() || **rate < 0.0) {
            return Err(HeatReportError::Rate { key: r.keys[i].0.clone(), rate: *rate, recent: true });
        }
        Ok(r)
    }

    /// Each key with its steady rate and its recent one (`now`, or the steady rate in a report
    /// without it), reads per second.
    ///
    /// ```
    /// use binval_protocol::adaptive::HeatReport;
    /// let r = HeatReport::parse(br#"{"v":1,"at_ms":5,"keys":[["k",2.5]],"now":[0.0]}"#).unwrap();
    /// assert_eq!(r.rates().collect::<Vec<_>>(), vec![("k", 2.5, 0.0)]);
    /// let old = HeatReport::parse(br#"{"v":1,"at_ms":5,"keys":[["k",2.5]]}"#).unwrap();
    /// assert_eq!(old.rates().collect::<Vec<_>>(), vec![("k", 2.5, 2.5)]);
    /// ```
    pub fn rates(&self) -> impl Iterator<Item = (&str, f64, f64)> {
        self.keys.iter().enumerate().map(|(i, (k, steady))| (k.as_str(), *steady, self.now.get(i).copied().unwrap_or(*steady)))
    }

    /// The JSON text of the report.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a heat report serializes")
    }
}

/// Parse a replica count as stored in field [`FIELD_COUNT`] or in the hot set (`None` = the
/// field is absent). Errors ([`FieldError::Count`]) when it is not a decimal in
/// `1..=MAX_REPLICAS`; the error holds the value.
///
/// ```
/// use binval_protocol::adaptive::parse_count;
/// assert_eq!(parse_count(Some(b"8")), Ok(Some(8)));
/// assert_eq!(parse_count(None), Ok(None));
/// assert!(parse_count(Some(b"0")).is_err());
/// ```
pub fn parse_count(raw: Option<&[u8]>) -> Result<Option<u32>, FieldError> {
    let Some(b) = raw else { return Ok(None) };
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|n| (1..=MAX_REPLICAS).contains(n))
        .map(Some)
        .ok_or_else(|| FieldError::Count(String::from_utf8_lossy(b).into_owned()))
}

/// Set the count field of an existing replica record, fenced by the fencing token.
/// `KEYS[1]` = `K:rN`; `ARGV` = fencing token, count. Returns `1` when set, `0` when the key
/// does not exist (nothing to announce on), `-1` when the record was written under a newer
/// fencing token (this writer has lost its lease). The record's position is not touched: the
/// count is about the key, not about a change.
pub fn replica_count_script() -> String {
    format!(
        "{}
local f = redis.call('HGET', KEYS[1], 'f')
if f and newer(f, ARGV[1]) then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'n', ARGV[2])
return 1
",
        crate::fence::LUA_NEWER
    )
}

/// Remove a replica record that a smaller count no longer has, fenced by the fencing token.
/// `KEYS[1]` = `K:rN`; `ARGV[1]` = fencing token. Returns `1` when removed, `0` when absent,
/// `-1` when the record was written under a newer fencing token.
pub fn replica_remove_script() -> String {
    format!(
        "{}
local f = redis.call('HGET', KEYS[1], 'f')
if f and newer(f, ARGV[1]) then return -1 end
return redis.call('DEL', KEYS[1])
",
        crate::fence::LUA_NEWER
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_spread_over_slots() {
        let slots: std::collections::BTreeSet<u16> =
            (0..HEAT_BUCKETS).map(|b| crate::keys::hash_slot(heat_bucket_key(b).as_bytes())).collect();
        assert_eq!(slots.len(), HEAT_BUCKETS as usize, "every bucket its own slot");
        let used: std::collections::BTreeSet<u16> = (0..1000).map(|i| heat_bucket_of(&format!("app-{i}"))).collect();
        assert_eq!(used.len(), HEAT_BUCKETS as usize);
    }

    #[test]
    fn reports_round_trip_and_bad_ones_are_named() {
        let r = HeatReport { v: HEAT_REPORT_VERSION, at_ms: 7, keys: vec![("item:1".into(), 1e5)], now: vec![9e4] };
        assert_eq!(HeatReport::parse(r.to_json().as_bytes()).unwrap(), r);
        assert!(HeatReport::parse(br#"{"v":2,"at_ms":1,"keys":[]}"#).unwrap_err().to_string().contains("version 2"));
        assert!(HeatReport::parse(br#"{"v":1,"at_ms":1,"keys":[["k",-1.0]]}"#).unwrap_err().to_string().contains("\"k\""));
        assert!(HeatReport::parse(br#"{"v":1,"at_ms":1,"keys":[["k",1.0]],"now":[1.0,2.0]}"#)
            .unwrap_err()
            .to_string()
            .contains("2 recent rates"));
        assert!(HeatReport::parse(br#"{"v":1,"at_ms":1,"keys":[["k",1.0]],"now":[-1.0]}"#).unwrap_err().to_string().contains("\"k\""));
        assert!(parse_count(Some(b"65")).unwrap_err().to_string().contains("\"65\""));
        assert!(parse_count(Some(b"x")).is_err());
    }
}
