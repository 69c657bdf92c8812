//! The fleet's heat reports (`binval_protocol::adaptive`, "Heat reports"): every app instance
//! writes its most-read keys with their read rates into one of sixteen hashes; the leader
//! reads all sixteen and sums each key's rate over the reports that are recent enough.

use std::collections::HashMap;

use binval_protocol::adaptive::{heat_bucket_key, HeatReport, HEAT_BUCKETS};

use crate::error::{classify_redis, Error};
use crate::redis::RedisConn;

/// The fleet's read rates, summed per key.
#[derive(Debug, Default, Clone)]
pub struct FleetHeat {
    /// Logical key -> steady reads/s over every instance whose report counted
    /// (`HeatReport::keys`): counts grow from it.
    pub rates: HashMap<String, f64>,
    /// Logical key -> recent reads/s over the same reports (`HeatReport::now`, or the steady
    /// rate of a report without it): the cool-down clock runs from it.
    pub recent: HashMap<String, f64>,
    /// Reports counted (instances reporting).
    pub instances: usize,
    /// Age of the oldest report counted, ms (0 without reports): how far behind the reads the
    /// round's recent rates may be (module docs of `decide`, "Hysteresis").
    pub oldest_report_age_ms: u64,
    /// Logical key -> when the newest report that still saw the key at its steady rate (its
    /// recent rate at least half its steady one) was made, Unix ms (the instance's clock).
    pub hot_at_ms: HashMap<String, u64>,
    /// Report fields that did not parse, as `(hash, field, reason)` (logged by the caller).
    pub bad: Vec<(String, String, String)>,
}

/// Read the sixteen heat hashes and sum the rates of the reports made at or after
/// `now_ms - max_age_ms`. Fields older than `10 × max_age_ms` (instances that stopped without
/// removing theirs) are deleted. Errors: the Redis error of a hash that could not be read,
/// naming it.
pub async fn read(redis: &RedisConn, now_ms: u64, max_age_ms: u64) -> Result<FleetHeat, Error> {
    let mut heat = FleetHeat::default();
    let mut c = redis.clone();
    for b in 0..HEAT_BUCKETS {
        let key = heat_bucket_key(b);
        let fields: HashMap<String, Vec<u8>> = c.query(redis::cmd("HGETALL").arg(&key)).await.map_err(|e| classify_redis(e, &key))?;
        let mut stale = Vec::new();
        for (instance, raw) in fields {
            let report = match HeatReport::parse(&raw) {
                Ok(r) => r,
                Err(reason) => {
                    heat.bad.push((key.clone(), instance, reason.to_string()));
                    continue;
                }
            };
            if report.at_ms.saturating_add(max_age_ms.saturating_mul(10)) < now_ms {
                stale.push(instance);
                continue;
            }
            if report.at_ms.saturating_add(max_age_ms) < now_ms {
                continue;
            }
            heat.instances += 1;
            heat.oldest_report_age_ms = heat.oldest_report_age_ms.max(now_ms.saturating_sub(report.at_ms));
            for (k, steady, recent) in report.rates() {
                *heat.rates.entry(k.to_string()).or_default() += steady;
                *heat.recent.entry(k.to_string()).or_default() += recent;
                if steady > 0.0 && recent * 2.0 >= steady {
                    let at = heat.hot_at_ms.entry(k.to_string()).or_default();
                    *at = (*at).max(report.at_ms);
                }
            }
        }
        if !stale.is_empty() {
            let _: Result<(), _> = c.query(redis::cmd("HDEL").arg(&key).arg(&stale)).await;
        }
    }
    Ok(heat)
}
