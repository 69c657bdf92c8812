//! Binlog coordinates as types, each with one parser and one `Display`:
//!
//! * [`BinlogPosition`]: `FILE:POS`, a byte offset in one binlog file (MySQL and MariaDB,
//!   `SHOW BINARY LOG STATUS` / `SHOW MASTER STATUS`). Ordered by [`file_index`], then offset.
//! * [`MariadbGtid`]: one MariaDB GTID `domain-server-seq` (MariaDB docs, "Global Transaction
//!   ID": the sequence number grows within a domain, whichever server wrote it).
//! * [`MariadbGtidPosition`]: a MariaDB GTID position, the last GTID of each domain,
//!   `0-1-100,1-2-7` (what `@@gtid_slave_pos` and `@slave_connect_state` hold).
//!
//! MySQL GTIDs (`uuid:n`) are carried as text in [`crate::SourcePosition::gtid`]; binval reads
//! them but does not order by them.
//!
//! ```
//! use binval_protocol::{BinlogPosition, MariadbGtid, MariadbGtidPosition};
//! let p: BinlogPosition = "mysql-bin.000003:4711".parse().unwrap();
//! assert_eq!((p.file_index(), p.pos), (Some(3), 4711));
//! assert_eq!(p.to_string(), "mysql-bin.000003:4711");
//! let g: MariadbGtid = "0-1-100".parse().unwrap();
//! assert_eq!((g.domain, g.server, g.seq), (0, 1, 100));
//! let mut set: MariadbGtidPosition = "0-1-100,1-2-7".parse().unwrap();
//! set.record("0-2-101".parse().unwrap());
//! assert_eq!(set.to_string(), "0-2-101,1-2-7");
//! ```

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Why a coordinate could not be parsed; the message shows the text and the expected form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not {expected}")]
pub struct PositionParseError {
    /// The text that was given.
    pub text: String,
    /// The form that was expected, e.g. `FILE:POS (mysql-bin.000003:4)`.
    pub expected: &'static str,
}

/// The index of a binlog file: the number after the last `.` of its name (`mysql-bin.000042`
/// -> 42; a name without a `.` is read whole, `000042` -> 42). MySQL and MariaDB name files
/// `basename.NNNNNN` and count up by one per file, so the index orders files; `None` when the
/// name has no numeric suffix.
pub fn file_index(file: &str) -> Option<u64> {
    file.rsplit('.').next()?.parse().ok()
}

/// A binlog position: the binlog file and the byte offset of an event boundary in it.
///
/// Offsets below 4 are refused (a binlog file starts with 4 magic bytes). Positions compare
/// by [`file_index`] (files without a numeric suffix first), then offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BinlogPosition {
    /// Binlog file name, e.g. `mysql-bin.000003`.
    pub file: String,
    /// Byte offset in `file`.
    pub pos: u64,
}

impl BinlogPosition {
    /// A position in `file` at byte offset `pos`.
    pub fn new(file: impl Into<String>, pos: u64) -> Self {
        BinlogPosition { file: file.into(), pos }
    }

    /// The index of the file ([`file_index`]).
    pub fn file_index(&self) -> Option<u64> {
        file_index(&self.file)
    }

    /// `(file index, offset)`: the order of positions in one server's binlog.
    pub fn order_key(&self) -> (u64, u64) {
        (self.file_index().unwrap_or(0), self.pos)
    }
}

impl PartialOrd for BinlogPosition {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BinlogPosition {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order_key().cmp(&other.order_key()).then_with(|| self.file.cmp(&other.file))
    }
}

impl fmt::Display for BinlogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

impl FromStr for BinlogPosition {
    type Err = PositionParseError;

    /// `FILE:POS` with `POS >= 4`; the file name may not be empty or contain spaces.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PositionParseError { text: s.to_string(), expected: "FILE:POS with POS >= 4 (mysql-bin.000003:4)" };
        let (file, pos) = s.trim().rsplit_once(':').ok_or_else(bad)?;
        if file.is_empty() || file.contains(char::is_whitespace) {
            return Err(bad());
        }
        match pos.parse::<u64>() {
            Ok(pos) if pos >= 4 => Ok(BinlogPosition::new(file, pos)),
            _ => Err(bad()),
        }
    }
}

impl From<&crate::SourcePosition> for BinlogPosition {
    fn from(p: &crate::SourcePosition) -> Self {
        BinlogPosition::new(p.file.clone(), p.pos)
    }
}

/// One MariaDB GTID: `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MariadbGtid {
    /// Replication domain (`gtid_domain_id`).
    pub domain: u32,
    /// `server_id` of the server that wrote the transaction.
    pub server: u32,
    /// Sequence number, growing within the domain.
    pub seq: u64,
}

impl fmt::Display for MariadbGtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl FromStr for MariadbGtid {
    type Err = PositionParseError;

    /// `D-S-N`, three decimal numbers (domain u32, server u32, sequence u64).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PositionParseError { text: s.to_string(), expected: "a MariaDB GTID domain-server-seq (0-1-100)" };
        let mut parts = s.trim().split('-');
        let (Some(d), Some(sv), Some(n), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        Ok(MariadbGtid {
            domain: d.parse().map_err(|_| bad())?,
            server: sv.parse().map_err(|_| bad())?,
            seq: n.parse().map_err(|_| bad())?,
        })
    }
}

/// A MariaDB GTID position: the last GTID of each replication domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MariadbGtidPosition {
    domains: BTreeMap<u32, MariadbGtid>,
}

impl MariadbGtidPosition {
    /// Record `gtid` as the last of its domain.
    pub fn record(&mut self, gtid: MariadbGtid) {
        self.domains.insert(gtid.domain, gtid);
    }

    /// The last GTID of `domain`.
    pub fn get(&self, domain: u32) -> Option<MariadbGtid> {
        self.domains.get(&domain).copied()
    }

    /// True when no domain is recorded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// The GTIDs, by domain.
    pub fn iter(&self) -> impl Iterator<Item = MariadbGtid> + '_ {
        self.domains.values().copied()
    }
}

impl fmt::Display for MariadbGtidPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, g) in self.domains.values().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{g}")?;
        }
        Ok(())
    }
}

impl FromStr for MariadbGtidPosition {
    type Err = PositionParseError;

    /// `D-S-N[,D-S-N...]`; a later GTID of the same domain wins. The empty text is the empty
    /// position (what `@@gtid_binlog_pos` holds before the first GTID: a replica connecting
    /// with it reads from the start of the binlog).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PositionParseError { text: s.to_string(), expected: "a MariaDB GTID position like 0-1-100[,1-2-7]" };
        let mut out = MariadbGtidPosition::default();
        if s.trim().is_empty() {
            return Ok(out);
        }
        for one in s.trim().split(',') {
            out.record(one.parse().map_err(|_| bad())?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binlog_positions_parse_print_and_order() {
        let a: BinlogPosition = "mysql-bin.000009:900".parse().unwrap();
        let b: BinlogPosition = "mysql-bin.000010:4".parse().unwrap();
        assert!(a < b, "file index orders, not the name's text");
        assert_eq!(b.to_string(), "mysql-bin.000010:4");
        assert_eq!("host:3306/mysql-bin.1:4".parse::<BinlogPosition>().unwrap().file, "host:3306/mysql-bin.1");
        for bad in ["mysql-bin.000003", "mysql-bin.000003:2", ":4", "a b:4", "f:x"] {
            let e = bad.parse::<BinlogPosition>().unwrap_err();
            assert!(e.to_string().contains(bad) && e.to_string().contains("FILE:POS"), "{e}");
        }
        assert_eq!(file_index("mysql-bin.000042"), Some(42));
        assert_eq!(file_index("binlog"), None);
        assert_eq!(file_index("000007"), Some(7));
    }

    #[test]
    fn mariadb_gtids_parse_and_keep_the_last_per_domain() {
        assert_eq!("1-2-3".parse::<MariadbGtid>().unwrap(), MariadbGtid { domain: 1, server: 2, seq: 3 });
        for bad in ["0-1", "0-1-2-3", "a-1-2", "", "3e0a1b2c-0000-0000-0000-000000000000:5"] {
            assert!(bad.parse::<MariadbGtid>().is_err(), "{bad}");
        }
        let p: MariadbGtidPosition = "1-2-7, 0-1-5,0-1-6".parse().unwrap();
        assert_eq!(p.to_string(), "0-1-6,1-2-7");
        assert_eq!(p.get(1).map(|g| g.seq), Some(7));
        assert!("0-1-5,".parse::<MariadbGtidPosition>().is_err());
        assert!(" ".parse::<MariadbGtidPosition>().unwrap().is_empty());
    }
}
