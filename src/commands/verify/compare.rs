//! One key against what it should hold: the rules `binval verify` (and `binval inspect`)
//! judge a key by. Pure: no I/O.
//!
//! A row maps to the key (the row exists and renders it):
//!
//! | what Redis holds | write-through | invalidate |
//! |---|---|---|
//! | no version token | `missing` | `missing` |
//! | a token that is not a number | `version` | `version` |
//! | a token older than a replica's position, a tombstone's included (moved back; I1 says the token moves last) | `version` | `version` |
//! | a replica missing | `missing` (unless the mapping has a TTL: replicas expire) | fine (readers go to their loader) |
//! | a replica that is a tombstone | `stale` (readers answer "no row") | `stale` |
//! | a replica without payload (marked stale) | fine: not cached ([`not_cached`]) | fine |
//! | a replica whose payload differs from the row's | `stale` | `stale` (invalidate mode stores none) |
//!
//! A replica marked stale is what TRUNCATE, a RENAME cut-over and a column-changing ALTER
//! TABLE leave on every key of the table (`binlog::ddl`): it serves no payload, so readers go
//! to their loader, which reads the row; it is not a mismatch, only a key not cached (counted
//! as `not_cached` by `binval verify`).
//!
//! No row maps to the key (it was deleted, or its key columns changed): a replica holding a
//! payload is `extra` (readers serve a row that does not exist). Tombstones, markers and the
//! version token are what a delete leaves (tokens never expire), so they are fine, as long as
//! the token is the newest of them: a token older than a replica's position (a tombstone's
//! too) is `version`, and replicas without any token are `missing` (the token was lost, e.g.
//! with its master's data): either way a replay of an older change of the key would pass the
//! token check and write that change's payload into a replica that is missing, bringing the
//! deleted row back (issue #22, cause 5). `--repair` rewrites such a key as deleted at a fresh
//! snapshot's position, tombstones and token together.

use serde::Serialize;

use crate::config::MappingMode;
use crate::write::key_state::KeyState;

/// What a key should hold.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The row's payload (write-through), `None` in invalidate mode; ignored without a row.
    pub payload: Option<&'a str>,
    /// A row maps to the key.
    pub row: bool,
    /// The mapping's mode.
    pub mode: MappingMode,
    /// The mapping gives replicas a TTL (a missing replica may have expired).
    pub ttl: bool,
}

/// What kind of mismatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A replica or the version token is not there.
    Missing,
    /// A replica holds another value than the row (or a tombstone).
    Stale,
    /// A replica holds a value though no row maps to the key.
    Extra,
    /// The version token is older than a replica, or not a number.
    Version,
}

impl Kind {
    /// The name in JSON and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Missing => "missing",
            Kind::Stale => "stale",
            Kind::Extra => "extra",
            Kind::Version => "version",
        }
    }
}

/// One thing wrong with a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The kind.
    pub kind: Kind,
    /// The replica (index) it is about; `None` for the version token.
    pub replica: Option<u32>,
    /// What differed, in words.
    pub detail: String,
    /// Top-level payload fields whose values differ (a `stale` payload).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

fn finding(kind: Kind, replica: Option<u32>, detail: impl Into<String>) -> Finding {
    Finding { kind, replica, detail: detail.into(), fields: Vec::new() }
}

/// Everything wrong with `state` against `expected` (module docs); empty when the key is
/// consistent.
pub fn compare(expected: &Expected<'_>, state: &KeyState) -> Vec<Finding> {
    let mut out = Vec::new();
    if !expected.row {
        for (i, r) in state.replicas.iter().enumerate() {
            if r.payload.is_some() && !r.tombstone {
                out.push(finding(Kind::Extra, Some(i as u32), "holds a payload, but no row maps to this key"));
            }
        }
        if let Some(m) = &state.version_invalid {
            out.push(finding(Kind::Version, None, m.clone()));
        } else if state.version.is_none() && out.is_empty() {
            // (With a payload the key is `extra` already, and the repair rewrites it whole.)
            if let Some((i, p)) = newest_replica(state) {
                out.push(finding(
                    Kind::Missing,
                    None,
                    format!(
                        "no version token, but replica r{i} holds position {p}: a replay of an older change would pass the token check"
                    ),
                ));
            }
        }
        version_not_older(state, &mut out);
        return out;
    }
    if let Some(m) = &state.version_invalid {
        out.push(finding(Kind::Version, None, m.clone()));
    } else if state.version.is_none() {
        out.push(finding(Kind::Missing, None, "no version token"));
    }
    let write_through = expected.mode == MappingMode::WriteThrough;
    for (i, r) in state.replicas.iter().enumerate() {
        let i = Some(i as u32);
        if !r.exists {
            if write_through && !expected.ttl {
                out.push(finding(Kind::Missing, i, "replica missing"));
            }
        } else if r.tombstone {
            out.push(finding(Kind::Stale, i, "a tombstone, but the row exists"));
        } else if let Some(p) = &r.payload {
            match expected.payload {
                Some(want) if write_through && p.as_slice() == want.as_bytes() => {}
                Some(want) if write_through => {
                    let mut f = finding(Kind::Stale, i, "payload differs from the row");
                    f.fields = differing_fields(p, want);
                    out.push(f);
                }
                _ => out.push(finding(Kind::Stale, i, "holds a payload, but the mapping is in invalidate mode")),
            }
        }
        // Else a replica marked stale: not cached (module docs).
    }
    version_not_older(state, &mut out);
    out
}

/// The replica holding the newest position (a tombstone's counts), with that position.
fn newest_replica(state: &KeyState) -> Option<(usize, u64)> {
    state.replicas.iter().enumerate().filter_map(|(i, r)| r.position.map(|p| (i, p))).max_by_key(|(_, p)| *p)
}

/// A version token older than a replica's position (tombstones included) is `version`: I1
/// says the token moves last.
fn version_not_older(state: &KeyState, out: &mut Vec<Finding>) {
    if let (Some(v), Some((i, p))) = (state.version, newest_replica(state)) {
        if v < p {
            let what = if state.replicas[i].tombstone { " (a tombstone)" } else { "" };
            out.push(finding(Kind::Version, None, format!("version token {v} is older than replica r{i}'s position {p}{what}")));
        }
    }
}

/// Whether a row maps to the key and every replica of it that exists is marked stale (no
/// payload, not a tombstone), at least one: a key readers load from the database, counted as
/// not cached rather than as a mismatch (module docs).
pub fn not_cached(expected: &Expected<'_>, state: &KeyState) -> bool {
    let mut present = state.replicas.iter().filter(|r| r.exists).peekable();
    expected.row && present.peek().is_some() && present.all(|r| r.payload.is_none() && !r.tombstone)
}

/// Top-level fields of two JSON objects whose values differ (sorted); `["(not a JSON object)"]`
/// when either is not one.
pub fn differing_fields(got: &[u8], want: &str) -> Vec<String> {
    let (Ok(serde_json::Value::Object(g)), Ok(serde_json::Value::Object(w))) =
        (serde_json::from_slice::<serde_json::Value>(got), serde_json::from_str::<serde_json::Value>(want))
    else {
        return vec!["(not a JSON object)".into()];
    };
    let mut keys: Vec<String> = g.keys().chain(w.keys()).filter(|k| g.get(*k) != w.get(*k)).cloned().collect();
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::key_state::ReplicaState;

    fn replica(payload: Option<&str>, p: u64, tombstone: bool) -> ReplicaState {
        ReplicaState { exists: true, payload: payload.map(|s| s.as_bytes().to_vec()), position: Some(p), tombstone, fencing_token: Some(1) }
    }

    fn state(version: Option<u64>, replicas: Vec<ReplicaState>) -> KeyState {
        KeyState { version, version_invalid: None, replicas }
    }

    const ROW: Expected<'static> = Expected { payload: Some(r#"{"id":1,"v":2}"#), row: true, mode: MappingMode::WriteThrough, ttl: false };

    fn kinds(f: &[Finding]) -> Vec<(Kind, Option<u32>)> {
        f.iter().map(|f| (f.kind, f.replica)).collect()
    }

    #[test]
    fn a_consistent_key_has_no_finding() {
        let ok = r#"{"id":1,"v":2}"#;
        assert!(compare(&ROW, &state(Some(5), vec![replica(Some(ok), 5, false), replica(Some(ok), 5, false)])).is_empty());
        // The token may be newer than the replicas (a later write skipped them? no: all move), never older.
        assert!(compare(&ROW, &state(Some(6), vec![replica(Some(ok), 5, false)])).is_empty());
    }

    #[test]
    fn each_kind_of_mismatch_is_named() {
        let ok = r#"{"id":1,"v":2}"#;
        let s = state(Some(5), vec![replica(Some(r#"{"id":1,"v":3}"#), 5, false), ReplicaState::default(), replica(Some(ok), 5, false)]);
        let f = compare(&ROW, &s);
        assert_eq!(kinds(&f), vec![(Kind::Stale, Some(0)), (Kind::Missing, Some(1))]);
        assert_eq!(f[0].fields, vec!["v".to_string()]);
        let f = compare(&ROW, &state(Some(4), vec![replica(Some(ok), 5, false)]));
        assert_eq!(kinds(&f), vec![(Kind::Version, None)], "token moved back");
        let f = compare(&ROW, &state(None, vec![replica(Some(ok), 5, false)]));
        assert_eq!(kinds(&f), vec![(Kind::Missing, None)]);
        let f = compare(&ROW, &state(Some(5), vec![replica(None, 5, true)]));
        assert!(!not_cached(&ROW, &state(Some(5), vec![replica(None, 5, true)])), "a tombstone is not a stale mark");
        assert_eq!(kinds(&f), vec![(Kind::Stale, Some(0))], "tombstone for a live row");
        let mut bad = state(Some(5), vec![replica(Some(ok), 5, false)]);
        bad.version_invalid = Some("version token is not a decimal integer: \"x\"".into());
        assert_eq!(kinds(&compare(&ROW, &bad)), vec![(Kind::Version, None)]);
    }

    #[test]
    fn a_replica_marked_stale_is_not_cached_not_a_mismatch() {
        // What TRUNCATE or a column-changing ALTER leaves on a key whose row exists.
        let marked = state(Some(7), vec![replica(None, 7, false), replica(None, 7, false)]);
        assert!(compare(&ROW, &marked).is_empty());
        assert!(not_cached(&ROW, &marked));
        let ok = r#"{"id":1,"v":2}"#;
        let written = state(Some(8), vec![replica(Some(ok), 8, false), replica(Some(ok), 8, false)]);
        assert!(!not_cached(&ROW, &written));
        assert!(!not_cached(&Expected { row: false, ..ROW }, &marked), "no row: nothing to cache");
        assert!(!not_cached(&ROW, &state(None, vec![ReplicaState::default()])), "never written: missing, not marked");
    }

    #[test]
    fn no_row_means_only_payloads_are_extra() {
        let gone = Expected { row: false, ..ROW };
        assert!(compare(&gone, &state(Some(9), vec![replica(None, 9, true), ReplicaState::default()])).is_empty());
        let f = compare(&gone, &state(Some(9), vec![replica(None, 9, true), replica(Some("{}"), 8, false)]));
        assert_eq!(kinds(&f), vec![(Kind::Extra, Some(1))]);
        assert!(compare(&gone, &state(None, vec![ReplicaState::default()])).is_empty(), "nothing left of a deleted row: fine");
    }

    #[test]
    fn a_deleted_rows_token_must_not_be_older_than_its_tombstones() {
        // Issue #22, cause 5: after a master lost a deleted row's token, a replay wrote an older
        // token; verify said `version 0` and inspect "agreement yes".
        let gone = Expected { row: false, ..ROW };
        let f = compare(&gone, &state(Some(7), vec![replica(None, 9, true), replica(None, 9, true)]));
        assert_eq!(kinds(&f), vec![(Kind::Version, None)]);
        assert!(f[0].detail.contains("version token 7") && f[0].detail.contains("position 9 (a tombstone)"), "{:?}", f[0]);
        let f = compare(&gone, &state(None, vec![replica(None, 9, true), ReplicaState::default()]));
        assert_eq!(kinds(&f), vec![(Kind::Missing, None)], "tombstones without their token");
        // The same for a live row: a tombstone newer than the token.
        let ok = r#"{"id":1,"v":2}"#;
        let f = compare(&ROW, &state(Some(5), vec![replica(Some(ok), 5, false), replica(None, 6, true)]));
        assert_eq!(kinds(&f), vec![(Kind::Stale, Some(1)), (Kind::Version, None)]);
    }

    #[test]
    fn ttl_and_invalidate_mode_allow_missing_replicas() {
        let ttl = Expected { ttl: true, ..ROW };
        assert!(compare(&ttl, &state(Some(5), vec![ReplicaState::default()])).is_empty());
        let inv = Expected { payload: None, mode: MappingMode::Invalidate, ..ROW };
        assert!(compare(&inv, &state(Some(5), vec![ReplicaState::default(), replica(None, 5, false)])).is_empty());
        let f = compare(&inv, &state(Some(5), vec![replica(Some("{}"), 5, false)]));
        assert_eq!(kinds(&f), vec![(Kind::Stale, Some(0))]);
    }

    #[test]
    fn fields_that_differ() {
        assert_eq!(differing_fields(br#"{"a":1,"b":2}"#, r#"{"a":1,"b":3,"c":4}"#), vec!["b".to_string(), "c".to_string()]);
        assert_eq!(differing_fields(b"x", "{}"), vec!["(not a JSON object)".to_string()]);
    }
}
