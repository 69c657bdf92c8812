//! Fence positions of transactions: the monotonic number that orders every write of a key
//! (the version token holds it, replicas store it, Lua scripts compare it). The layout and the
//! scripts live in `binval_protocol::fence`; this module only decides, per source, which
//! coordinate a transaction's position comes from.
//!
//! * `gtid` (MariaDB): the GTID sequence number. MariaDB writes a GTID event for every
//!   transaction, and a replica promoted to primary continues the domain's numbering, so a
//!   failover inside one replication domain keeps versions comparable.
//! * `file_pos`: `file_index << 32 | end_pos`. Comparable only within one server's binlog
//!   (MySQL without a configured order, or MariaDB with several GTID domains). After a failover
//!   in this mode raise `source.fence_epoch`.
//!
//! A fence position that cannot be derived (no GTID in `gtid` mode, a GTID of another domain,
//! a file name without numeric suffix) is a definite error naming the position: guessing would
//! risk refusing newer changes as "older" forever.

use binval_protocol::{FencePosition, MariadbGtid, SourcePosition};

use crate::config::{FenceMode, SourceConfig};
use crate::error::DefiniteError;

/// The resolved rule for one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceRule {
    /// `Gtid` or `FilePos` (never `Auto`).
    pub mode: FenceMode,
    /// Top 8 bits of every position.
    pub epoch: u8,
    /// GTID domain in `gtid` mode.
    pub domain: u32,
}

impl FenceRule {
    /// Resolve `auto` for a source: MariaDB orders by GTID, MySQL by file:pos.
    pub fn resolve(cfg: &SourceConfig, mariadb: bool) -> Self {
        let mode = match cfg.fence {
            FenceMode::Auto if mariadb => FenceMode::Gtid,
            FenceMode::Auto => FenceMode::FilePos,
            m => m,
        };
        FenceRule { mode, epoch: cfg.fence_epoch, domain: cfg.fence_domain }
    }

    /// The fence position of the transaction committed at `pos`.
    ///
    /// Errors (definite) when the position cannot be derived; the message names the position
    /// and the setting to change.
    pub fn position(&self, pos: &SourcePosition) -> Result<FencePosition, DefiniteError> {
        let fail = |message: String| DefiniteError::Fence { position: pos.to_string(), message };
        match self.mode {
            FenceMode::Gtid => {
                let g = pos
                    .gtid
                    .as_deref()
                    .ok_or_else(|| fail("transaction has no GTID but source.fence = gtid; set source.fence = \"file_pos\"".into()))?;
                let Ok(MariadbGtid { domain: d, seq: n, .. }) = g.parse::<MariadbGtid>() else {
                    return Err(fail(format!("GTID {g} is not a MariaDB domain-server-seq GTID; set source.fence = \"file_pos\"")));
                };
                if d != self.domain {
                    return Err(fail(format!(
                        "GTID {g} is in domain {d}, but writes are ordered by sequence numbers of domain {} (source.fence_domain); for a multi-domain source set source.fence = \"file_pos\"",
                        self.domain
                    )));
                }
                FencePosition::from_gtid_seq(self.epoch, n).ok_or_else(|| fail(format!("GTID sequence number of {g} exceeds 2^56")))
            }
            _ => {
                let p = u32::try_from(pos.pos).map_err(|_| fail("binlog position exceeds 4 GiB".into()))?;
                FencePosition::from_file_pos(self.epoch, &pos.file, p)
                    .ok_or_else(|| fail(format!("binlog file name {} has no numeric suffix below 2^24", pos.file)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(file: &str, p: u64, gtid: Option<&str>) -> SourcePosition {
        SourcePosition { file: file.into(), pos: p, gtid: gtid.map(String::from) }
    }

    #[test]
    fn gtid_mode_uses_the_sequence_number_of_its_domain() {
        let r = FenceRule { mode: FenceMode::Gtid, epoch: 0, domain: 0 };
        assert_eq!(r.position(&pos("b.000001", 9, Some("0-1-42"))).unwrap().0, 42);
        let e = r.position(&pos("b.000001", 9, Some("1-1-42"))).unwrap_err().to_string();
        assert!(e.contains("domain 1") && e.contains("b.000001:9"), "{e}");
        assert!(r.position(&pos("b.000001", 9, None)).is_err());
        let r1 = FenceRule { epoch: 1, ..r };
        assert!(r1.position(&pos("b.000001", 9, Some("0-1-1"))).unwrap() > r.position(&pos("b.000001", 9, Some("0-1-999"))).unwrap());
    }

    #[test]
    fn file_pos_mode_orders_by_file_then_position() {
        let r = FenceRule { mode: FenceMode::FilePos, epoch: 0, domain: 0 };
        let a = r.position(&pos("mysql-bin.000001", 4000, None)).unwrap();
        let b = r.position(&pos("mysql-bin.000002", 4, None)).unwrap();
        assert!(b > a);
        assert!(r.position(&pos("mysql-bin", 4, None)).is_err());
    }
}
