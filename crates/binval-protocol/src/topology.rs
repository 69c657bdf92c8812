//! Where Redis nodes are: the address of a node, read from a `redis://` URL or from a
//! `CLUSTER SLOTS` reply, and the slot ranges of a Redis Cluster. One parser of each for binval
//! (its write batches, `binval check`, `binval inspect`) and for `binval-consumer` (the map its
//! reads are routed and counted by), so a master's `host:port` is spelled the same in binval's
//! output, the consumer's `master` metric label and the docs.
//!
//! # Addresses
//!
//! [`NodeAddr::from_url`] reads the authority of a Redis URL as redis-rs does
//! (`redis://[user[:password]@]host[:port][/db]`, scheme `redis` or `rediss`; the userinfo ends
//! at the last `@`, RFC 3986 §3.2.1; port 6379 when none is given; IPv6 hosts in brackets). The
//! address never holds the credentials, so it is safe in a metric label or a log line.
//!
//! ```
//! use binval_protocol::topology::NodeAddr;
//! let a = NodeAddr::from_url("rediss://app:s3@cret@cache-1:6380/2").unwrap();
//! assert_eq!((a.host.as_str(), a.port), ("cache-1", 6380));
//! assert_eq!(NodeAddr::from_url("redis://[::1]").unwrap().to_string(), "[::1]:6379");
//! assert!(NodeAddr::from_url("redis+unix:///run/redis.sock").is_err());
//! ```
//!
//! # Slot ranges
//!
//! With feature `redis`, [`parse_cluster_slots`] reads the reply of `CLUSTER SLOTS` (Redis
//! docs, <https://redis.io/docs/latest/commands/cluster-slots/>: an array of
//! `[start, end, master, replica...]`, each node `[host, port, id, ...]`) into [`SlotRange`]s.
//! An entry that does not have that shape is skipped rather than refused: the callers keep the
//! map they had when a reply is unusable, and a slot no range covers is handled by each of them
//! (a write is sent again through the cluster client, a read counts as `unknown`).

use std::fmt;

/// The port Redis listens on when a URL names none.
pub const DEFAULT_PORT: u16 = 6379;

/// One Redis node: `host` (a name, an IPv4 address, or an IPv6 address without brackets) and
/// TCP `port`. `Display` is `host:port`, with brackets around an IPv6 host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr {
    /// Host name or address, without brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

/// Why a URL has no node address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// Not `redis://` or `rediss://` (e.g. a Unix socket URL, which has no TCP address).
    #[error("not a redis:// or rediss:// URL (scheme {0:?})")]
    Scheme(String),
    /// Nothing between `://` (or the userinfo) and the path.
    #[error("the URL names no host")]
    NoHost,
    /// The text after the host's `:` is not a port number 0-65535.
    #[error("port {0:?} is not a number 0-65535")]
    Port(String),
}

impl NodeAddr {
    /// A node at `host:port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        NodeAddr { host: host.into(), port }
    }

    /// The node a `redis://` or `rediss://` URL connects to (see the module docs for the rules).
    /// Errors: [`AddrError`]; the URL is not repeated in it, since it may hold a password.
    pub fn from_url(url: &str) -> Result<Self, AddrError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| AddrError::Scheme(String::new()))?;
        if !scheme.eq_ignore_ascii_case("redis") && !scheme.eq_ignore_ascii_case("rediss") {
            return Err(AddrError::Scheme(scheme.to_string()));
        }
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or(AddrError::NoHost)?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(AddrError::NoHost);
        }
        let port = match port {
            None | Some("") => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| AddrError::Port(p.to_string()))?,
        };
        Ok(NodeAddr::new(host, port))
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Hash slots `first..=last` of a Redis Cluster, the master that serves them and that master's
/// replica nodes (Redis replication, not binval's suffix replicas), in the reply's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRange {
    /// First slot, 0-16383.
    pub first: u16,
    /// Last slot, inclusive, 0-16383.
    pub last: u16,
    /// The master serving the range.
    pub master: NodeAddr,
    /// Its replica nodes.
    pub replicas: Vec<NodeAddr>,
}

impl SlotRange {
    /// Whether `slot` is in the range.
    pub fn contains(&self, slot: u16) -> bool {
        (self.first..=self.last).contains(&slot)
    }
}

/// The ranges of a `CLUSTER SLOTS` reply, in the reply's order; entries of another shape, slot
/// numbers outside 0-16383 and nodes without a usable host or port are skipped (module docs).
///
/// ```
/// use binval_protocol::topology::{parse_cluster_slots, NodeAddr};
/// use redis::Value::{Array, BulkString, Int};
/// let node = |h: &str, p| Array(vec![BulkString(h.into()), Int(p), BulkString(b"id".to_vec())]);
/// let reply = Array(vec![Array(vec![Int(0), Int(16383), node("10.0.0.1", 7000), node("10.0.0.2", 7001)])]);
/// let ranges = parse_cluster_slots(&reply);
/// assert_eq!(ranges[0].master, NodeAddr::new("10.0.0.1", 7000));
/// assert_eq!(ranges[0].replicas, vec![NodeAddr::new("10.0.0.2", 7001)]);
/// ```
#[cfg(feature = "redis")]
pub fn parse_cluster_slots(reply: &redis::Value) -> Vec<SlotRange> {
    use redis::Value::{Array, BulkString, Int, SimpleString};
    let node = |v: &redis::Value| -> Option<NodeAddr> {
        let Array(n) = v else { return None };
        let host = match n.first()? {
            BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            SimpleString(s) => s.clone(),
            _ => return None,
        };
        let Int(port) = n.get(1)? else { return None };
        (!host.is_empty()).then_some(())?;
        Some(NodeAddr::new(host, u16::try_from(*port).ok()?))
    };
    let slot = |v: Option<&redis::Value>| -> Option<u16> {
        let Some(Int(s)) = v else { return None };
        u16::try_from(*s).ok().filter(|s| *s < crate::keys::HASH_SLOTS)
    };
    let Array(ranges) = reply else { return Vec::new() };
    ranges
        .iter()
        .filter_map(|r| {
            let Array(items) = r else { return None };
            let (first, last) = (slot(items.first())?, slot(items.get(1))?);
            let master = node(items.get(2)?)?;
            let replicas = items.iter().skip(3).filter_map(node).collect();
            (first <= last).then_some(SlotRange { first, last, master, replicas })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_to_addresses() {
        let ok = |u: &str| NodeAddr::from_url(u).unwrap().to_string();
        assert_eq!(ok("redis://127.0.0.1:6379"), "127.0.0.1:6379");
        assert_eq!(ok("rediss://user:se@cret@h:6380/2?x=1"), "h:6380");
        assert_eq!(ok("redis://:pw@cache"), "cache:6379");
        assert_eq!(ok("REDIS://cache:/0"), "cache:6379");
        assert_eq!(ok("redis://[fe80::1]:7000"), "[fe80::1]:7000");
        assert_eq!(ok("redis://u:p@[::1]#frag"), "[::1]:6379");
        assert_eq!(NodeAddr::from_url("cache:6379"), Err(AddrError::Scheme(String::new())));
        assert_eq!(NodeAddr::from_url("unix:///tmp/r.sock"), Err(AddrError::Scheme("unix".into())));
        assert_eq!(NodeAddr::from_url("redis://user:pw@/0"), Err(AddrError::NoHost));
        assert_eq!(NodeAddr::from_url("redis://h:70000"), Err(AddrError::Port("70000".into())));
        assert_eq!(NodeAddr::from_url("redis://[::1"), Err(AddrError::NoHost));
    }

    #[test]
    fn errors_never_repeat_the_password() {
        let e = NodeAddr::from_url("redis://u:hunter2@h:x").unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn cluster_slots_ranges_and_malformed_entries() {
        use redis::Value::{Array, BulkString, Int, Nil, SimpleString};
        let node = |h: &str, p: i64| Array(vec![BulkString(h.as_bytes().to_vec()), Int(p), BulkString(b"id".to_vec())]);
        let reply = Array(vec![
            Array(vec![Int(5461), Int(10922), node("10.0.0.2", 7002)]),
            Array(vec![Int(0), Int(5460), node("10.0.0.1", 7001), node("10.0.0.4", 7004), Nil]),
            Array(vec![Int(10923), Int(16383), Array(vec![SimpleString("::1".into()), Int(7003)])]),
            // Skipped: no master, a slot past 16383, a port past 65535, a reversed range, no host.
            Array(vec![Int(1), Int(2)]),
            Array(vec![Int(16000), Int(16384), node("x", 1)]),
            Array(vec![Int(1), Int(2), node("x", 65536)]),
            Array(vec![Int(9), Int(2), node("x", 1)]),
            Array(vec![Int(1), Int(2), node("", 1)]),
            Nil,
        ]);
        let r = parse_cluster_slots(&reply);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[1],
            SlotRange { first: 0, last: 5460, master: NodeAddr::new("10.0.0.1", 7001), replicas: vec![NodeAddr::new("10.0.0.4", 7004)] }
        );
        assert_eq!(r[2].master.to_string(), "[::1]:7003");
        assert!(r[0].contains(10922) && !r[0].contains(10923));
        assert!(parse_cluster_slots(&Nil).is_empty());
    }
}
