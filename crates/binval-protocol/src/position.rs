//! Binlog coordinates as types, each with one parser and one `Display`:
//!
//! * [`BinlogPosition`]: `FILE:POS`, a byte offset in one binlog file (MySQL and MariaDB,
//!   `SHOW BINARY LOG STATUS` / `SHOW MASTER STATUS`). Ordered by [`file_index`], then offset.
//! * [`MariadbGtid`]: one MariaDB GTID `domain-server-seq` (MariaDB docs, "Global Transaction
//!   ID": the sequence number grows within a domain, whichever server wrote it).
//! * [`MariadbGtidPosition`]: a MariaDB GTID position, the last GTID of each domain,
//!   `0-1-100,1-2-7` (what `@@gtid_slave_pos` and `@slave_connect_state` hold).
//!
//! * [`MysqlGtidSet`]: a MySQL GTID set, `uuid:1-100:200,uuid2:tag:1-5` (what
//!   `@@gtid_executed` and `Executed_Gtid_Set` hold, and what a replica sends in
//!   `COM_BINLOG_DUMP_GTID`: MySQL docs, "GTID Sets" and "GTID Auto-Positioning").
//!
//! One MySQL GTID (`uuid:n`, or `uuid:tag:n` on MySQL 8.4) is carried as text in
//! [`crate::SourcePosition::gtid`]; binval does not order by them, it collects them into a set.
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

/// A MySQL GTID set: per source UUID (and tag, MySQL 8.4), the transaction numbers as sorted,
/// disjoint, non-adjacent closed intervals.
///
/// Text form as MySQL prints it (MySQL docs, "GTID Format and Storage"):
/// `3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:11,<uuid>:tag:1-3`; whitespace and newlines
/// around members are ignored (`SHOW MASTER STATUS` breaks lines after commas), UUIDs and tags
/// compare case-insensitively (printed lower case). The empty text is the empty set.
///
/// ```
/// use binval_protocol::MysqlGtidSet;
/// let mut s: MysqlGtidSet = "3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:7".parse().unwrap();
/// s.add_gtid("3e11fa47-71ca-11e1-9e33-c80aa9429562:6").unwrap();
/// assert_eq!(s.to_string(), "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-7");
/// assert!(s.contains_gtid("3e11fa47-71ca-11e1-9e33-c80aa9429562:3"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MysqlGtidSet {
    /// (uuid, tag or "") -> intervals `(first, last)`, inclusive.
    members: BTreeMap<(String, String), Vec<(u64, u64)>>,
}

impl MysqlGtidSet {
    /// True for the empty set.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Add transaction `gno` of `uuid` (with `tag`, `""` for none).
    pub fn add(&mut self, uuid: &str, tag: &str, gno: u64) {
        self.add_interval(uuid, tag, gno, gno);
    }

    /// Add one GTID in text form, `uuid:n` or `uuid:tag:n`.
    ///
    /// Errors when the text is not a single MySQL GTID.
    pub fn add_gtid(&mut self, gtid: &str) -> Result<(), PositionParseError> {
        let (uuid, tag, gno) = parse_one_gtid(gtid)?;
        self.add(&uuid, &tag, gno);
        Ok(())
    }

    /// True when `gtid` (`uuid:n` or `uuid:tag:n`) is in the set; false for text that is no
    /// MySQL GTID.
    pub fn contains_gtid(&self, gtid: &str) -> bool {
        let Ok((uuid, tag, gno)) = parse_one_gtid(gtid) else { return false };
        self.members.get(&(uuid, tag)).is_some_and(|iv| iv.iter().any(|&(a, b)| a <= gno && gno <= b))
    }

    /// Add every GTID of `other`.
    pub fn union(&mut self, other: &MysqlGtidSet) {
        for ((uuid, tag), ivs) in &other.members {
            for &(a, b) in ivs {
                self.add_interval(uuid, tag, a, b);
            }
        }
    }

    /// The members: `(uuid, tag ("" for none), intervals (first, last) inclusive)`.
    pub fn members(&self) -> impl Iterator<Item = (&str, &str, &[(u64, u64)])> + '_ {
        self.members.iter().map(|((u, t), iv)| (u.as_str(), t.as_str(), iv.as_slice()))
    }

    fn add_interval(&mut self, uuid: &str, tag: &str, first: u64, last: u64) {
        let ivs = self.members.entry((uuid.to_ascii_lowercase(), tag.to_ascii_lowercase())).or_default();
        ivs.push((first, last));
        ivs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ivs.len());
        for &(a, b) in ivs.iter() {
            match merged.last_mut() {
                Some(m) if a <= m.1.saturating_add(1) => m.1 = m.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        *ivs = merged;
    }
}

const MYSQL_GTID_SET: &str = "a MySQL GTID set like 3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5[:tag:1-3][,uuid:...]";
const MYSQL_GTID: &str = "a MySQL GTID like 3e11fa47-71ca-11e1-9e33-c80aa9429562:5 (or uuid:tag:5)";

/// A MySQL server UUID: 32 hex digits in the 8-4-4-4-12 hyphenated form.
fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5 && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A GTID tag (MySQL 8.4 docs, "GTID Format and Storage"): `[a-z_][a-z0-9_]{0,31}`, any case.
fn is_tag(s: &str) -> bool {
    let mut b = s.bytes();
    s.len() <= 32 && b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn parse_one_gtid(s: &str) -> Result<(String, String, u64), PositionParseError> {
    let bad = || PositionParseError { text: s.to_string(), expected: MYSQL_GTID };
    let parts: Vec<&str> = s.trim().split(':').collect();
    let (uuid, tag, n) = match parts.as_slice() {
        [u, n] => (*u, "", *n),
        [u, t, n] if is_tag(t) => (*u, *t, *n),
        _ => return Err(bad()),
    };
    let gno: u64 = n.parse().map_err(|_| bad())?;
    if !is_uuid(uuid) || gno == 0 {
        return Err(bad());
    }
    Ok((uuid.to_ascii_lowercase(), tag.to_ascii_lowercase(), gno))
}

impl fmt::Display for MysqlGtidSet {
    /// Members by UUID, each as `uuid:intervals[:tag:intervals...]`, UUIDs comma-separated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut last_uuid: Option<&str> = None;
        for ((uuid, tag), ivs) in &self.members {
            if last_uuid != Some(uuid.as_str()) {
                if last_uuid.is_some() {
                    f.write_str(",")?;
                }
                f.write_str(uuid)?;
                last_uuid = Some(uuid);
            }
            if !tag.is_empty() {
                write!(f, ":{tag}")?;
            }
            for &(a, b) in ivs {
                if a == b {
                    write!(f, ":{a}")?;
                } else {
                    write!(f, ":{a}-{b}")?;
                }
            }
        }
        Ok(())
    }
}

impl FromStr for MysqlGtidSet {
    type Err = PositionParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PositionParseError { text: s.to_string(), expected: MYSQL_GTID_SET };
        let mut out = MysqlGtidSet::default();
        if s.trim().is_empty() {
            return Ok(out);
        }
        for member in s.split(',') {
            let mut parts = member.trim().split(':');
            let uuid = parts.next().filter(|u| is_uuid(u)).ok_or_else(bad)?;
            let mut tag = "";
            let mut any = false;
            for part in parts {
                if part.starts_with(|c: char| c.is_ascii_digit()) {
                    let (a, b) = match part.split_once('-') {
                        Some((a, b)) => (a.parse::<u64>().map_err(|_| bad())?, b.parse::<u64>().map_err(|_| bad())?),
                        None => {
                            let n = part.parse::<u64>().map_err(|_| bad())?;
                            (n, n)
                        }
                    };
                    if a == 0 || b < a {
                        return Err(bad());
                    }
                    out.add_interval(uuid, tag, a, b);
                    any = true;
                } else if is_tag(part) {
                    tag = part;
                    any = false;
                } else {
                    return Err(bad());
                }
            }
            if !any {
                return Err(bad());
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_gtid_sets_parse_merge_and_print() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let v = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        let s: MysqlGtidSet = format!("{v}:5,\n {u}:1-3:5-9:4, {u}:Tag_1:1-2").parse().unwrap();
        assert_eq!(s.to_string(), format!("{u}:1-9:tag_1:1-2,{v}:5"));
        assert_eq!(s.to_string().parse::<MysqlGtidSet>().unwrap(), s);
        assert!(s.contains_gtid(&format!("{u}:7")) && s.contains_gtid(&format!("{u}:tag_1:2")));
        assert!(!s.contains_gtid(&format!("{u}:10")) && !s.contains_gtid(&format!("{u}:other:1")) && !s.contains_gtid("x"));
        let mut t = MysqlGtidSet::default();
        t.add_gtid(&format!("{v}:6")).unwrap();
        t.add_gtid(&format!("{u}:tag_1:3")).unwrap();
        t.union(&s);
        assert_eq!(t.to_string(), format!("{u}:1-9:tag_1:1-3,{v}:5-6"));
        assert!("".parse::<MysqlGtidSet>().unwrap().is_empty());
        for bad in [u.to_string(), format!("{u}:0"), format!("{u}:5-3"), "nouuid:1".into(), format!("{u}:tag"), format!("{u}:1,")] {
            let e = bad.parse::<MysqlGtidSet>().unwrap_err();
            assert!(e.to_string().contains("MySQL GTID set"), "{bad}: {e}");
        }
        assert!(t.add_gtid(&format!("{u}:1-2")).is_err() && t.add_gtid("0-1-2").is_err());
    }

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
