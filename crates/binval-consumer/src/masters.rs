//! Reads per Redis master: `binval_consumer_redis_reads_total{master, command}`, the metric
//! that shows whether the suffix replicas spread a hot key's reads over the masters (the point
//! of binval, see the crate docs).
//!
//! `master` is the `host:port` of the master that owns the read key's hash slot in the
//! consumer's slot map (`slot_map.rs`, the same map the reads are routed by); standalone Redis
//! has one `master`, the URL's `host:port`; a slot no range covered at the last refresh counts
//! as `unknown`. So the label set is bounded by the cluster's masters. `command` says what
//! was read and where (see [`Read`]).
//!
//! Cost per read (fills only, never a local hit): one atomic add on a counter registered when
//! the slot map was built.

use metrics::Counter;

use crate::metric_names;

/// What a read asked for, and where it went (the `command` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// `HMGET K:rN d t p n` served by the master (`command="replica"`).
    Replica,
    /// The same, served by one of the master's replica nodes (`command="replica_node"`; only
    /// with [`crate::ConsumerBuilder::read_from_replica_nodes`]).
    ReplicaNode,
}

/// The counters of one master.
pub(crate) struct MasterCounters {
    replica: Counter,
    replica_node: Counter,
}

impl MasterCounters {
    pub(crate) fn new(master: &str) -> Self {
        MasterCounters {
            replica: metrics::counter!(metric_names::REDIS_READS_TOTAL, "master" => master.to_string(), "command" => "replica"),
            replica_node: metrics::counter!(metric_names::REDIS_READS_TOTAL, "master" => master.to_string(), "command" => "replica_node"),
        }
    }

    pub(crate) fn count(&self, read: Read) {
        match read {
            Read::Replica => self.replica.increment(1),
            Read::ReplicaNode => self.replica_node.increment(1),
        }
    }
}

/// `host:port` of a standalone server's URL ([`binval_protocol::topology::NodeAddr::from_url`];
/// never the password); a URL without one (a Unix socket) is labelled by its redacted form.
pub(crate) fn master_label(url: &str) -> String {
    binval_protocol::topology::NodeAddr::from_url(url).map_or_else(|_| binval_security::redact_url(url), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_master_is_host_port() {
        assert_eq!(master_label("redis://user:pw@10.0.0.9:6380/2"), "10.0.0.9:6380");
        assert_eq!(master_label("rediss://cache:6379"), "cache:6379");
        assert_eq!(master_label("redis://cache"), "cache:6379", "the port redis-rs connects to");
    }
}
