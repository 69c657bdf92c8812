//! Points in the source's binlog as the operator writes them: `source.start` (where `binval
//! run` starts without a checkpoint) and the ends of a `binval replay` range (`--from`,
//! `--to`). One type ([`StartPoint`]) and one parser for all of them; each setting says which
//! forms it accepts ([`StartForms`]), and a parse error names the setting, the text and those
//! forms. The coordinates themselves are the typed positions of `binval_protocol::position`
//! (one parser and `Display` each).

use binval_protocol::{BinlogPosition, MariadbGtid, MariadbGtidPosition, MysqlGtidSet};

/// A point in the source's binlog: where `binval run` starts without a checkpoint
/// (`source.start`), or an end of a `binval replay` range (`--from`, `--to`). One type, one
/// parser ([`StartPoint::parse`]); which forms a setting accepts is given by [`StartForms`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartPoint {
    /// `current`: the primary's current binlog position (SHOW MASTER STATUS).
    Current,
    /// `FILE:POS`: a binlog position (the first event at that offset).
    Binlog(BinlogPosition),
    /// `gtid:D-S-N[,D-S-N...]`: a MariaDB GTID position (reading starts after it, as
    /// `CHANGE MASTER ... master_use_gtid` does).
    Gtid(MariadbGtidPosition),
    /// `gtid:uuid:1-100[,...]`: a MySQL GTID set (the server sends every transaction not in
    /// it, as `SOURCE_AUTO_POSITION` does); `source.start` only.
    MysqlGtidSet(MysqlGtidSet),
    /// A UTC date-time `YYYY-MM-DD HH:MM:SS` (`T` and a trailing `Z` accepted), Unix ms.
    Time(u64),
}

/// Which forms of [`StartPoint`] a setting accepts, and its name for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartForms {
    /// The flag or config field, e.g. `source.start` or `--from`.
    pub name: &'static str,
    /// `current` is accepted.
    pub current: bool,
    /// A GTID position of several domains, or a MySQL GTID set, is accepted (else exactly one
    /// MariaDB GTID).
    pub gtid_set: bool,
    /// A UTC date-time is accepted.
    pub time: bool,
}

impl StartForms {
    /// `source.start`: `current`, `FILE:POS` or `gtid:SET`.
    pub const SOURCE_START: StartForms = StartForms { name: "source.start", current: true, gtid_set: true, time: false };

    /// A `binval replay` range end (`--from`, `--to`): `FILE:POS`, `gtid:D-S-N` or a UTC
    /// date-time.
    pub const fn replay(flag: &'static str) -> StartForms {
        StartForms { name: flag, current: false, gtid_set: false, time: true }
    }

    /// The accepted forms, with examples, as an error message lists them.
    fn expected(&self) -> String {
        let mut forms = Vec::new();
        if self.current {
            forms.push("current");
        }
        forms.push("FILE:POS (mysql-bin.000003:4)");
        forms.push(if self.gtid_set {
            "gtid:D-S-N[,D-S-N...] (gtid:0-1-100[,1-2-7]), gtid:UUID:N-M[,...] (a MySQL GTID set)"
        } else {
            "gtid:D-S-N (gtid:0-1-100)"
        });
        if self.time {
            forms.push("a UTC date-time (2026-11-30 12:00:00)");
        }
        let last = forms.pop().expect("at least two forms");
        format!("{} or {last}", forms.join(", "))
    }
}

/// A start point that is none of the forms its setting accepts: names the setting, the text
/// and the accepted forms (e.g. ``--from `yesterday`: expected FILE:POS (...), gtid:D-S-N (...)
/// or a UTC date-time (...)``).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} `{text}`: expected {expected}")]
pub struct BadStartPoint {
    /// The flag or config field (`source.start`, `--from`, `--to`).
    pub setting: &'static str,
    /// The text given, trimmed.
    pub text: String,
    /// The accepted forms, with examples.
    pub expected: String,
}

impl StartPoint {
    /// Parse `s` as one of the forms `forms` accepts. The error names the setting
    /// (`forms.name`), the text and the accepted forms.
    pub fn parse(s: &str, forms: StartForms) -> Result<Self, BadStartPoint> {
        let s = s.trim();
        let bad = || BadStartPoint { setting: forms.name, text: s.to_string(), expected: forms.expected() };
        if forms.current && s.eq_ignore_ascii_case("current") {
            return Ok(StartPoint::Current);
        }
        if let Some(g) = s.strip_prefix("gtid:") {
            if forms.gtid_set {
                if let Ok(set) = g.parse::<MysqlGtidSet>() {
                    return if set.is_empty() { Err(bad()) } else { Ok(StartPoint::MysqlGtidSet(set)) };
                }
            }
            let set: MariadbGtidPosition = g.parse().map_err(|_| bad())?;
            if set.is_empty() || (!forms.gtid_set && g.contains(',')) {
                return Err(bad());
            }
            return Ok(StartPoint::Gtid(set));
        }
        if forms.time {
            if let Ok(t) = humantime::parse_rfc3339_weak(s.trim_end_matches('Z')) {
                let ms = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| bad())?.as_millis() as u64;
                return Ok(StartPoint::Time(ms));
            }
        }
        s.parse::<BinlogPosition>().map(StartPoint::Binlog).map_err(|_| bad())
    }

    /// The one GTID of a single-GTID position (what a replay range end holds).
    pub fn single_gtid(set: &MariadbGtidPosition) -> Option<MariadbGtid> {
        let mut it = set.iter();
        match (it.next(), it.next()) {
            (Some(g), None) => Some(g),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_positions() {
        let f = StartForms::SOURCE_START;
        assert_eq!(StartPoint::parse("current", f).unwrap(), StartPoint::Current);
        assert_eq!(StartPoint::parse("mysql-bin.000003:4", f).unwrap(), StartPoint::Binlog(BinlogPosition::new("mysql-bin.000003", 4)));
        assert_eq!(StartPoint::parse("gtid:0-1-100", f).unwrap(), StartPoint::Gtid("0-1-100".parse().unwrap()));
        assert!(StartPoint::parse("gtid:x", f).is_err());
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        assert_eq!(StartPoint::parse(&format!("gtid:{u}:1-5"), f).unwrap(), StartPoint::MysqlGtidSet(format!("{u}:1-5").parse().unwrap()));
        assert!(StartPoint::parse(&format!("gtid:{u}:1-5"), StartForms::replay("--from")).is_err(), "replay takes one MariaDB GTID");
        assert!(StartPoint::parse("f:2", f).is_err());
    }

    #[test]
    fn replay_points_parse_and_errors_name_the_flag() {
        let (from, to) = (StartForms::replay("--from"), StartForms::replay("--to"));
        assert_eq!(StartPoint::parse("mysql-bin.000003:4", from).unwrap(), StartPoint::Binlog(BinlogPosition::new("mysql-bin.000003", 4)));
        assert_eq!(StartPoint::parse("gtid:0-1-100", from).unwrap(), StartPoint::Gtid("0-1-100".parse().unwrap()));
        assert_eq!(StartPoint::parse("1970-01-01 00:00:01", to).unwrap(), StartPoint::Time(1000));
        assert_eq!(StartPoint::parse("1970-01-01T00:00:02Z", to).unwrap(), StartPoint::Time(2000));
        let e = StartPoint::parse("yesterday", from).unwrap_err().to_string();
        assert!(e.starts_with("--from `yesterday`") && e.contains("gtid:D-S-N") && e.contains("UTC date-time"), "{e}");
        assert!(StartPoint::parse("mysql-bin.000003:2", from).is_err());
        assert!(StartPoint::parse("gtid:0-1", from).is_err());
        assert!(StartPoint::parse("gtid:0-1-1,1-1-1", from).is_err(), "one GTID only");
        assert!(StartPoint::parse("current", from).is_err());
        let e = StartPoint::parse("bogus", StartForms::SOURCE_START).unwrap_err().to_string();
        assert!(e.contains("source.start") && e.contains("current") && e.contains("gtid:"), "{e}");
    }
}
