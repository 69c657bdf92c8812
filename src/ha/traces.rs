//! What an earlier run of the same source left behind, looked for when no checkpoint (and no
//! copy of it) is found: the start plan must not take such a start for a first one and begin at
//! the primary's current position without a word (invariant I10; issue #22, cause 4).
//!
//! Looked for, cheapest first:
//!
//! * the fencing-token counter `binval:{<name>}:fence`, as a note only: taking the lease
//!   creates it, so `binval run` (which looks after taking its lease) cannot tell an earlier
//!   tenure's counter from its own, and `binval check` must decide as `run` does. It lives on
//!   the checkpoint key's master anyway, so it is lost together with it;
//! * bootstrap progress, `binval:{<name>}:bootstrap`;
//! * keys of the mappings' templates: a version token or a suffix replica (`SCAN MATCH
//!   <template glob>:*` on every master, at most [`SCAN_BUDGET`] keys visited per master and
//!   template, stopping at the first);
//! * events of this source's mappings on the invalidation topic, and among them the newest
//!   event of `binval run` per partition ([`crate::ha::topic_marks`]), from which the start plan
//!   recovers the start (other messages are only a note).
//!
//! Nothing is changed: the findings are words for the log, `binval check` and the refusal,
//! and the topic's marks for the start plan.

use crate::config::Config;
use crate::error::Error;
use crate::ha::topic_marks::{self, TopicReport};
use crate::redis::RedisConn;

/// Keys `SCAN` visits at most per master and key template.
pub const SCAN_BUDGET: u64 = 1_000_000;

/// What earlier runs left (see the module docs). `Default` is "nothing looked for".
#[derive(Debug, Clone, Default)]
pub struct Earlier {
    /// Where the checkpoint was looked for (and not found), for the messages.
    pub location: String,
    /// One line per kind of trace found, naming what and where.
    pub found: Vec<String>,
    /// What was found that does not tell an earlier run from this one (the fencing-token
    /// counter), for `binval check`.
    pub notes: Vec<String>,
    /// The topic's tail, when it holds messages.
    pub topic: Option<TopicReport>,
}

impl Earlier {
    /// Whether anything was found.
    pub fn any(&self) -> bool {
        !self.found.is_empty()
    }

    /// The findings as one sentence.
    pub fn describe(&self) -> String {
        self.found.join("; ")
    }

    /// Look for traces of an earlier run of `cfg.source.name` (module docs), after no
    /// checkpoint was found at `location`.
    ///
    /// Errors: Redis and the broker failing (transient), as every start meets them.
    pub async fn gather(cfg: &Config, redis: &RedisConn, location: &str) -> Result<Earlier, Error> {
        let name = &cfg.source.name;
        let (mut found, mut notes) = (Vec::new(), Vec::new());
        let mut c = redis.clone();
        let key = crate::ha::lease::fencing_token_key(name);
        if let Some(t) = c.get(&key).await.map_err(|e| crate::error::classify_redis(e, &key))? {
            notes.push(format!("the fencing-token counter {key} = {t} (some tenure took the lease; binval run's own lease makes it too)"));
        }
        let key = format!("binval:{{{name}}}:bootstrap");
        // PTTL, not EXISTS: the README's ACL rules for binval allow it (-2: no such key).
        let ttl: i64 = c.query(redis::cmd("PTTL").arg(&key)).await.map_err(|e| crate::error::classify_redis(e, &key))?;
        if ttl != -2 {
            found.push(format!("bootstrap progress {key}"));
        }
        for m in &cfg.mappings {
            for t in m.keys.iter().filter_map(|k| binval_protocol::KeyTemplate::parse(k).ok()) {
                let pattern = format!("{}:*", t.glob());
                if let Some(k) = redis.scan_first(&pattern, SCAN_BUDGET).await? {
                    found.push(format!("keys of template `{t}` ({}) in Redis, e.g. {k}", m.table));
                }
            }
        }
        let c2 = cfg.clone();
        let topic = tokio::task::spawn_blocking(move || topic_marks::read(&c2))
            .await
            .map_err(|e| crate::error::task_failed("topic reader", e))??;
        // Only this source's events tell of an earlier run of it (another source may publish
        // to the same topic); partitions holding only other messages are named in the report.
        let topic = if !topic.marks.is_empty() {
            found.push(format!("messages on the invalidation {}", topic.describe()));
            Some(topic)
        } else {
            if topic.has_messages() {
                notes.push(format!("the invalidation {} holds no event of this source's mappings", topic.describe()));
            }
            None
        };
        Ok(Earlier { location: location.to_string(), found, notes, topic })
    }
}
