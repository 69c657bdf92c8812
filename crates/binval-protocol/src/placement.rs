//! Where a logical key's suffix replicas live on a Redis Cluster, and which replica a read
//! goes to so that one hot key loads every master that holds a replica equally.
//!
//! # Why reads pick a master first
//!
//! Replica `K:ri` lives in hash slot `CRC16(K:ri) mod 16384`, and the slot's master is whatever
//! the cluster's slot map says. Slots are effectively random, so 8 replicas on 3 masters land
//! 4/2/2 as easily as 3/3/2: picking a *replica* uniformly then gives the master with 4 of them
//! half of the key's reads (max/mean 1.5, measured in `docs/benchmarks.md`). Picking a *master*
//! uniformly among those that hold a replica of the key, then a replica on it, gives each of
//! them the same share whatever the layout. The share can only be even over the masters that
//! hold a replica: a key whose replicas cover 2 of 3 masters reaches 2 of them (`binval
//! check` reports how many keys that is per mapping).
//!
//! # A missing replica moves to another master first
//!
//! A replica can be missing (never written, expired, or lost with its master's data, which
//! binval does not refill on its own: `binval replay` does). Replicas on the same master share
//! that master's fate, so [`Placement::read_order`] puts one replica of every other master
//! before a second replica of the same master.
//!
//! The grouping is a pure function of the key, N and the slot map; callers pass the slot map
//! as a function from hash slot to master index (`binval check` with its own map, the consumer
//! with the map its Cluster client routes by).

use crate::keys::replica_slots;
#[cfg(test)]
use crate::keys::{hash_slot, replica_key};

/// The replicas `0..N` of one logical key, grouped by the master that owns their hash slot.
///
/// ```
/// use binval_protocol::placement::Placement;
/// // A toy cluster: slots below 8192 on master 0, the rest on master 1.
/// let p = Placement::of("item:detail:6666", 8, |slot| usize::from(slot >= 8192));
/// assert_eq!(p.replicas(), 8);
/// assert!(p.masters() <= 2);
/// let order = p.read_order(42);
/// assert_eq!(order.len(), 8); // every replica once, one per master first
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// `(master index, replica indexes on it)`, masters in order of their first replica.
    groups: Vec<(usize, Vec<u32>)>,
}

impl Placement {
    /// Group `key`'s replicas `0..replicas` by `master_of(slot)` of each replica key's hash
    /// slot. `master_of` may return any index (e.g. `usize::MAX` for a slot no master covers):
    /// equal indexes form one group.
    pub fn of(key: &str, replicas: u32, mut master_of: impl FnMut(u16) -> usize) -> Placement {
        let mut groups: Vec<(usize, Vec<u32>)> = Vec::new();
        for (i, slot) in (0..replicas).zip(replica_slots(key, replicas)) {
            let master = master_of(slot);
            match groups.iter_mut().find(|(m, _)| *m == master) {
                Some((_, g)) => g.push(i),
                None => groups.push((master, vec![i])),
            }
        }
        Placement { groups }
    }

    /// All replicas on one master (standalone Redis, or a key read without a slot map).
    pub fn single(replicas: u32) -> Placement {
        Placement { groups: vec![(0, (0..replicas).collect())] }
    }

    /// `(master index, replica indexes)` per master holding at least one replica.
    pub fn groups(&self) -> &[(usize, Vec<u32>)] {
        &self.groups
    }

    /// Number of masters holding at least one replica.
    pub fn masters(&self) -> usize {
        self.groups.len()
    }

    /// Number of replicas N.
    pub fn replicas(&self) -> u32 {
        self.groups.iter().map(|(_, g)| g.len() as u32).sum()
    }

    /// The master index of replica `replica` (`None` if it is not one of `0..N`).
    pub fn master_of_replica(&self, replica: u32) -> Option<usize> {
        self.groups.iter().find(|(_, g)| g.contains(&replica)).map(|(m, _)| *m)
    }

    /// The order in which a read tries the replicas, from `random` (any uniformly random
    /// number): the first is on a master chosen uniformly among the masters holding a replica,
    /// and is a replica chosen uniformly on it; then one replica of each other master (masters
    /// in random order); then the remaining replicas. A read takes the first replica that
    /// answers and stops after its read bound.
    pub fn read_order(&self, random: u64) -> Vec<u32> {
        let mut r = Mix(random);
        let mut groups: Vec<Vec<u32>> = self.groups.iter().map(|(_, g)| g.clone()).collect();
        // Fisher-Yates over the masters, then within each master.
        for i in (1..groups.len()).rev() {
            groups.swap(i, r.below(i + 1));
        }
        for g in &mut groups {
            for i in (1..g.len()).rev() {
                g.swap(i, r.below(i + 1));
            }
        }
        let mut order = Vec::with_capacity(self.replicas() as usize);
        let deepest = groups.iter().map(Vec::len).max().unwrap_or(0);
        for depth in 0..deepest {
            order.extend(groups.iter().filter_map(|g| g.get(depth)));
        }
        order
    }

    /// Max/mean of the share of reads per master that master-balanced reads of this key give
    /// on a cluster of `masters_in_cluster` masters: every covered master gets `1 / covered`,
    /// the mean is `1 / masters_in_cluster`, so this is `masters_in_cluster / covered` (1.0
    /// when the replicas cover every master).
    pub fn balanced_max_over_mean(&self, masters_in_cluster: usize) -> f64 {
        if self.groups.is_empty() {
            return 0.0;
        }
        masters_in_cluster.max(self.groups.len()) as f64 / self.groups.len() as f64
    }

    /// The same figure for reads that pick a replica uniformly (the read path before issue
    /// #10): the master holding the most replicas gets `most / N` of the reads.
    pub fn uniform_max_over_mean(&self, masters_in_cluster: usize) -> f64 {
        let n = self.replicas();
        let most = self.groups.iter().map(|(_, g)| g.len()).max().unwrap_or(0);
        if n == 0 {
            return 0.0;
        }
        most as f64 * masters_in_cluster.max(self.groups.len()) as f64 / f64::from(n)
    }
}

/// A small deterministic mixer (SplitMix64) that turns one random number into as many as a
/// read order needs, so this crate needs no random number generator of its own.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n ≤ 64 here: the bias of a modulo of a 64-bit number is nil).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 masters like `redis-cli --cluster create` makes them: 0-5460, 5461-10922, 10923-16383.
    fn three(slot: u16) -> usize {
        usize::from(slot / 5461).min(2)
    }

    #[test]
    fn groups_every_replica_once_by_its_slots_master() {
        let p = Placement::of("item:detail:6666", 8, three);
        assert_eq!(p.replicas(), 8);
        let mut all: Vec<u32> = p.groups().iter().flat_map(|(_, g)| g.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        for (m, g) in p.groups() {
            for &i in g {
                assert_eq!(three(hash_slot(replica_key("item:detail:6666", i).as_bytes())), *m);
                assert_eq!(p.master_of_replica(i), Some(*m));
            }
        }
        assert_eq!(Placement::single(4).groups(), &[(0, vec![0, 1, 2, 3])]);
    }

    /// The first replica of a read order is on each covered master equally often, whatever
    /// the number of replicas per master; the next ones visit the other masters first.
    #[test]
    fn read_order_balances_masters_then_tries_other_masters() {
        // A key whose 8 replicas are unevenly spread over 3 masters.
        let key = (0..1000)
            .map(|i| format!("item:{i}"))
            .find(|k| {
                let p = Placement::of(k, 8, three);
                let sizes: Vec<usize> = p.groups().iter().map(|(_, g)| g.len()).collect();
                p.masters() == 3 && sizes.iter().max() >= Some(&4)
            })
            .expect("an uneven key");
        let p = Placement::of(&key, 8, three);
        let mut first_per_master = [0u32; 3];
        let trials = 30_000u64;
        for t in 0..trials {
            let order = p.read_order(t.wrapping_mul(0x2545_F491_4F6C_DD1D));
            assert_eq!(order.len(), 8);
            let masters: Vec<usize> = order.iter().map(|&i| p.master_of_replica(i).unwrap()).collect();
            // The first three reads are on three different masters.
            let mut head = masters[..3].to_vec();
            head.sort_unstable();
            head.dedup();
            assert_eq!(head.len(), 3, "{order:?} {masters:?}");
            first_per_master[masters[0]] += 1;
        }
        let mean = trials as f64 / 3.0;
        let max = *first_per_master.iter().max().unwrap() as f64;
        assert!(max / mean < 1.05, "{first_per_master:?}");
        assert!(p.uniform_max_over_mean(3) >= 1.5, "{p:?}");
        assert_eq!(p.balanced_max_over_mean(3), 1.0);
    }

    #[test]
    fn spread_figures() {
        let p = Placement { groups: vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5])] };
        assert_eq!(p.balanced_max_over_mean(3), 1.5);
        assert_eq!(p.uniform_max_over_mean(3), 4.0 * 3.0 / 6.0);
    }
}
