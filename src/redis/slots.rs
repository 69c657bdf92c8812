//! [`SlotMap`]: binval's own copy of a Redis Cluster's slot map, by which the write stage groups
//! a batch's commands into one pipeline per master (module docs of [`crate::redis`]). The reply
//! of `CLUSTER SLOTS` is read by the one parser binval and the consumer share,
//! [`binval_protocol::topology::parse_cluster_slots`].

use binval_protocol::keys::HASH_SLOTS;
use binval_protocol::topology::parse_cluster_slots;
use redis::Value;

/// Which master serves each hash slot, as `CLUSTER SLOTS` reported it: `slots[s]` is an index
/// into `masters` (`host:port`, [`binval_protocol::topology::NodeAddr`]'s spelling).
#[derive(Debug, Clone, Default)]
pub struct SlotMap {
    slots: Vec<u16>,
    masters: Vec<String>,
}

impl SlotMap {
    /// Build it from a `CLUSTER SLOTS` reply. Slots without a master (no range covers them, or
    /// an entry the parser skipped) map to master 0: a command for them fails and is sent again
    /// through the cluster client, which follows `MOVED`.
    pub fn from_cluster_slots(reply: &Value) -> Self {
        let mut map = SlotMap { slots: vec![0; HASH_SLOTS as usize], masters: Vec::new() };
        for range in parse_cluster_slots(reply) {
            let addr = range.master.to_string();
            let idx = match map.masters.iter().position(|m| *m == addr) {
                Some(i) => i,
                None => {
                    map.masters.push(addr);
                    map.masters.len() - 1
                }
            };
            map.slots[range.first as usize..=range.last as usize].fill(idx as u16);
        }
        map
    }

    /// Index of the master serving `slot` (see [`SlotMap::masters`]).
    pub fn master_of_slot(&self, slot: u16) -> usize {
        self.slots.get(slot as usize).copied().unwrap_or(0) as usize
    }

    /// `host:port` of every master, in first-seen order.
    pub fn masters(&self) -> &[String] {
        &self.masters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value::{Array, BulkString, Int};

    fn node(host: &str, port: i64) -> Value {
        Array(vec![BulkString(host.as_bytes().to_vec()), Int(port), BulkString(b"id".to_vec())])
    }

    #[test]
    fn masters_in_first_seen_order_and_uncovered_slots_on_master_0() {
        let reply = Array(vec![
            Array(vec![Int(100), Int(5460), node("10.0.0.2", 7002)]),
            Array(vec![Int(5461), Int(10922), node("10.0.0.1", 7001)]),
            Array(vec![Int(10923), Int(16383), node("10.0.0.2", 7002), node("10.0.0.9", 7009)]),
        ]);
        let map = SlotMap::from_cluster_slots(&reply);
        assert_eq!(map.masters(), ["10.0.0.2:7002", "10.0.0.1:7001"]);
        assert_eq!((map.master_of_slot(100), map.master_of_slot(5461), map.master_of_slot(16383)), (0, 1, 0));
        assert_eq!(map.master_of_slot(99), 0, "a slot no range covers");
        assert!(SlotMap::from_cluster_slots(&Value::Nil).masters().is_empty());
    }
}
