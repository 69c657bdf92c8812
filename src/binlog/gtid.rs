//! MySQL GTIDs between mysql_common's event and packet types and binval's own
//! ([`binval_protocol::MysqlGtidSet`]): the text of a GTID event, the set a PREVIOUS_GTIDS event
//! carries, and the set a replica sends in `COM_BINLOG_DUMP_GTID`.
//!
//! MySQL writes a PREVIOUS_GTIDS event near the start of every binlog file: the set of every
//! GTID in the files before it (MySQL docs, "Binary Logging Options", `binlog_gtid_simple_recovery`).
//! The set before any transaction is that set plus the GTIDs of the file up to it, which is
//! what binval's checkpoint keeps (`ha::checkpoint::GtidState`) and resumes by after a failover
//! (`binlog::start_plan`).

use binval_protocol::MysqlGtidSet;
use mysql_common::binlog::events::{GtidEvent, PreviousGtidsEvent};
use mysql_common::packets::{GnoInterval, Sid, Tag};

/// A MySQL server UUID (GTID source id) in its text form.
pub fn uuid_text(sid: &[u8; 16]) -> String {
    let h: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The GTID of a GTID event: `uuid:gno`, or `uuid:tag:gno` for a tagged GTID (MySQL 8.4,
/// GTID_TAGGED_LOG_EVENT); `None` for an ANONYMOUS_GTID event (`gtid_mode = OFF`: no source
/// UUID, no number).
pub fn gtid_text(g: &GtidEvent) -> Option<String> {
    if g.sid() == [0; 16] || g.gno() == 0 {
        return None;
    }
    Some(match g.tag() {
        Some(tag) => format!("{}:{}:{}", uuid_text(&g.sid()), tag.as_str().to_ascii_lowercase(), g.gno()),
        None => format!("{}:{}", uuid_text(&g.sid()), g.gno()),
    })
}

/// The set a PREVIOUS_GTIDS event carries (its intervals are half-open `[start, end)`).
pub fn previous_gtids(ev: &PreviousGtidsEvent<'_>) -> MysqlGtidSet {
    let mut out = String::new();
    for sid in ev.sids() {
        for iv in sid.intervals() {
            if iv.end() <= iv.start() {
                continue;
            }
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&uuid_text(&sid.uuid()));
            if let Some(tag) = sid.tag() {
                out.push(':');
                out.push_str(tag.as_str());
            }
            out.push_str(&format!(":{}-{}", iv.start(), iv.end() - 1));
        }
    }
    out.parse().unwrap_or_default()
}

/// A member of a MySQL GTID set that mysql_common cannot encode for `COM_BINLOG_DUMP_GTID`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpSidError {
    /// A UUID that is not 32 hex digits (with or without dashes).
    #[error("GTID UUID {0}")]
    Uuid(String),
    /// A GTID tag (MySQL 8.3+) mysql_common refuses.
    #[error("GTID tag {tag}: {reason}")]
    Tag { tag: String, reason: String },
}

/// The set as `COM_BINLOG_DUMP_GTID` carries it: one [`Sid`] per UUID and tag, intervals
/// half-open. Errors name a UUID or tag mysql_common cannot encode (none that
/// [`MysqlGtidSet`] parses).
pub fn dump_sids(set: &MysqlGtidSet) -> Result<Vec<Sid<'static>>, DumpSidError> {
    set.members()
        .map(|(uuid, tag, ivs)| {
            let hex: String = uuid.chars().filter(|c| *c != '-').collect();
            let mut bytes = [0u8; 16];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(|| DumpSidError::Uuid(uuid.to_string()))?, 16)
                    .map_err(|_| DumpSidError::Uuid(uuid.to_string()))?;
            }
            let mut sid = Sid::new(bytes).with_intervals(ivs.iter().map(|&(a, b)| GnoInterval::new(a, b + 1)).collect());
            if !tag.is_empty() {
                sid =
                    sid.with_tag(Tag::new(tag.to_string()).map_err(|e| DumpSidError::Tag { tag: tag.to_string(), reason: e.to_string() })?);
            }
            Ok(sid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_gtids_keep_their_tag_and_anonymous_ones_have_none() {
        let sid = [0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42, 0x95, 0x62];
        assert_eq!(gtid_text(&GtidEvent::new(sid, 23)).as_deref(), Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:23"));
        let tag = Tag::new("mytag").unwrap();
        assert_eq!(gtid_text(&GtidEvent::new_tagged(sid, tag, 3)).as_deref(), Some("3e11fa47-71ca-11e1-9e33-c80aa9429562:mytag:3"));
        assert_eq!(gtid_text(&GtidEvent::new([0; 16], 0)), None);
    }

    #[test]
    fn dump_sids_round_trip_through_mysql_common_text() {
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let set: MysqlGtidSet = format!("{u}:1-5:7:tag_a:2-3").parse().unwrap();
        let sids = dump_sids(&set).unwrap();
        let text: Vec<String> = sids.iter().map(|s| s.to_string()).collect();
        assert_eq!(text, vec![format!("{u}:1-5:7"), format!("{u}:tag_a:2-3")]);
        assert_eq!(uuid_text(&sids[0].uuid()), u);
    }
}
