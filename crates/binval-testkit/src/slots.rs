//! Which master owns each hash slot of a running Redis Cluster, read from `CLUSTER NODES`: for
//! tests and benches that need to know where a key's replicas live (the per-master spread of a
//! hot key's reads is binval's point).

use anyhow::{anyhow, Context as _};

use crate::util::redis_cmd;

/// The masters of a cluster and the slot ranges each owns.
#[derive(Debug, Clone)]
pub struct SlotOwners {
    /// Ports of the masters, in the order of their lowest slot.
    pub masters: Vec<u16>,
    /// `(first slot, last slot, index into masters)`, sorted by first slot.
    ranges: Vec<(u16, u16, usize)>,
}

impl SlotOwners {
    /// Ask the node on `127.0.0.1:port` (`CLUSTER NODES`; Redis docs: one line per node, its
    /// flags, and for a master its slot ranges `a-b` or single slots `a`).
    pub fn read(port: u16) -> anyhow::Result<SlotOwners> {
        let text = redis_cmd(port, "CLUSTER NODES").with_context(|| format!("CLUSTER NODES on {port}"))?;
        let mut owned: Vec<(u16, u16, u16)> = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].split(',').any(|f| f == "master") {
                continue;
            }
            let addr = fields[1].split('@').next().unwrap_or_default();
            let node_port: u16 =
                addr.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(|| anyhow!("bad node address {addr:?}"))?;
            for slots in &fields[8..] {
                if slots.starts_with('[') {
                    continue; // a slot being migrated or imported: owned by the range that lists it
                }
                let (a, b) = slots.split_once('-').unwrap_or((slots, slots));
                let (a, b): (u16, u16) = (a.parse()?, b.parse()?);
                owned.push((a, b, node_port));
            }
        }
        owned.sort_unstable();
        let mut masters: Vec<u16> = Vec::new();
        let mut ranges = Vec::new();
        for (a, b, p) in owned {
            let i = masters.iter().position(|m| *m == p).unwrap_or_else(|| {
                masters.push(p);
                masters.len() - 1
            });
            ranges.push((a, b, i));
        }
        Ok(SlotOwners { masters, ranges })
    }

    /// Index (into [`SlotOwners::masters`]) of the master owning `slot`; `usize::MAX` if none.
    pub fn master_of(&self, slot: u16) -> usize {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        match i.checked_sub(1).map(|i| self.ranges[i]) {
            Some((a, b, m)) if a <= slot && slot <= b => m,
            _ => usize::MAX,
        }
    }
}
