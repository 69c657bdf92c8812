//! MySQL partial JSON updates (`binlog_row_value_options=PARTIAL_JSON`): the after image of a
//! PARTIAL_UPDATE_ROWS event carries diffs instead of the JSON value, and binval applies them
//! to the before value as a replica does, so the row still goes out with its whole value.

use serde_json::Value as Json;

/// A JSON diff that cannot be applied to the before value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonDiffError {
    /// A path with wildcards, ranges or `last`, which MySQL never writes in a diff.
    #[error("unsupported JSON path {0:?}")]
    Path(String),
    /// The diff does not fit the before value; `operation` is REPLACE, INSERT or REMOVE.
    #[error("{operation} at {path}: {why}")]
    DoesNotFit { operation: String, path: String, why: String },
}

/// Apply MySQL JSON diffs (PARTIAL_UPDATE_ROWS, `binlog_row_value_options=PARTIAL_JSON`) to
/// the before value of the column, as the replica does (MySQL sql/json_diff.cc,
/// `Json_diff_vector` / `apply_json_diffs`): REPLACE sets the value at an existing path; INSERT
/// adds an object member or inserts into an array at the index (appends past the end); REMOVE
/// deletes the member or element. Diffs apply in order. Values are converted like full JSON
/// values (mysql_common's binary JSON parser). Errors name the diff that does not fit.
pub fn apply_json_diffs(base: &Json, diffs: &[mysql_common::binlog::jsondiff::JsonDiff<'_>]) -> Result<Json, JsonDiffError> {
    use mysql_common::binlog::jsondiff::JsonDiffOperation as Op;
    let mut doc = base.clone();
    for d in diffs {
        let path = d.path_str();
        let legs = json_path_legs(&path).ok_or_else(|| JsonDiffError::Path(path.to_string()))?;
        let bad = |why: &str| JsonDiffError::DoesNotFit {
            operation: format!("{:?}", d.operation()),
            path: path.to_string(),
            why: why.to_string(),
        };
        let value = match d.value() {
            Some(v) => Some(Json::from(v.clone().parse().map_err(|e| bad(&format!("value unreadable: {e}")))?)),
            None => None,
        };
        let Some((last, parents)) = legs.split_last() else {
            // `$` itself: only a REPLACE of the whole document.
            match (d.operation(), value) {
                (Op::REPLACE, Some(v)) => {
                    doc = v;
                    continue;
                }
                _ => return Err(bad("the document root can only be replaced")),
            }
        };
        let mut parent = &mut doc;
        for leg in parents {
            parent = match (leg, parent) {
                (Leg::Member(k), Json::Object(m)) => m.get_mut(k).ok_or_else(|| bad("path does not exist in the before value"))?,
                (Leg::Index(i), Json::Array(a)) => a.get_mut(*i).ok_or_else(|| bad("path does not exist in the before value"))?,
                _ => return Err(bad("path does not exist in the before value")),
            };
        }
        match (d.operation(), last, parent, value) {
            (Op::REPLACE, Leg::Member(k), Json::Object(m), Some(v)) if m.contains_key(k) => {
                m.insert(k.clone(), v);
            }
            (Op::REPLACE, Leg::Index(i), Json::Array(a), Some(v)) if *i < a.len() => a[*i] = v,
            (Op::INSERT, Leg::Member(k), Json::Object(m), Some(v)) => {
                m.insert(k.clone(), v);
            }
            (Op::INSERT, Leg::Index(i), Json::Array(a), Some(v)) => {
                let at = (*i).min(a.len());
                a.insert(at, v);
            }
            (Op::REMOVE, Leg::Member(k), Json::Object(m), None) if m.contains_key(k) => {
                m.remove(k);
            }
            (Op::REMOVE, Leg::Index(i), Json::Array(a), None) if *i < a.len() => {
                a.remove(*i);
            }
            _ => return Err(bad("does not fit the before value")),
        }
    }
    Ok(doc)
}

/// One leg of a JSON path.
#[derive(Debug, PartialEq)]
enum Leg {
    Member(String),
    Index(usize),
}

/// The legs of a MySQL JSON path as written in JSON diffs: `$`, then `.key`, `."quoted key"`
/// (JSON string escapes) or `[n]`. `None` for anything else (wildcards, ranges, `last`).
fn json_path_legs(path: &str) -> Option<Vec<Leg>> {
    let rest = path.trim().strip_prefix('$')?;
    let b = rest.as_bytes();
    let mut legs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b' ' => i += 1,
            b'.' => {
                i += 1;
                while b.get(i) == Some(&b' ') {
                    i += 1;
                }
                if b.get(i) == Some(&b'"') {
                    // A JSON string: find its end, honouring escapes.
                    let start = i;
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    let lit = rest.get(start..=i)?;
                    legs.push(Leg::Member(serde_json::from_str(lit).ok()?));
                    i += 1;
                } else {
                    let start = i;
                    while i < b.len() && b[i] != b'.' && b[i] != b'[' {
                        i += 1;
                    }
                    let key = rest[start..i].trim_end();
                    if key.is_empty() || key == "*" {
                        return None;
                    }
                    legs.push(Leg::Member(key.to_string()));
                }
            }
            b'[' => {
                let end = i + rest[i..].find(']')?;
                legs.push(Leg::Index(rest[i + 1..end].trim().parse().ok()?));
                i = end + 1;
            }
            _ => return None,
        }
    }
    Some(legs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mysql_common::io::ParseBuf;

    /// Case 15 (../shared/cases/15-json-partial-update.md) A-D, as the diffs MySQL logs for
    /// them (binary JSON values: 0x05 int16, 0x04 literal, 0x0c string).
    #[test]
    fn json_diffs_apply_to_the_before_value() {
        use mysql_common::binlog::jsondiff::JsonDiff;
        fn diff(op: u8, path: &str, value: Option<&[u8]>) -> JsonDiff<'static> {
            let mut b = vec![op, path.len() as u8];
            b.extend_from_slice(path.as_bytes());
            if let Some(v) = value {
                b.push(v.len() as u8);
                b.extend_from_slice(v);
            }
            let leaked: &'static [u8] = Box::leak(b.into_boxed_slice());
            ParseBuf(leaked).parse(()).unwrap()
        }
        let (replace, insert, remove) = (0, 1, 2);
        let base = serde_json::json!({"id": 1, "name": "java"});
        // (A) JSON_SET(c1, '$.id', 3, '$.star', 5)
        let a =
            apply_json_diffs(&base, &[diff(replace, "$.id", Some(&[0x05, 3, 0])), diff(insert, "$.star", Some(&[0x05, 5, 0]))]).unwrap();
        assert_eq!(a, serde_json::json!({"id": 3, "name": "java", "star": 5}));
        // (B) JSON_REMOVE(c1, '$.name')
        let b = apply_json_diffs(&a, &[diff(remove, "$.name", None)]).unwrap();
        assert_eq!(b, serde_json::json!({"id": 3, "star": 5}));
        // (C) an array: append at the end, insert in front, remove
        let arr = serde_json::json!([1, 2, "x"]);
        let c = apply_json_diffs(
            &arr,
            &[diff(insert, "$[3]", Some(&[0x0c, 1, b'y'])), diff(insert, "$[0]", Some(&[0x04, 0x01])), diff(remove, "$[1]", None)],
        )
        .unwrap();
        assert_eq!(c, serde_json::json!([true, 2, "x", "y"]));
        // (D) JSON_REPLACE(c1, '$.r', NULL): a JSON null, not SQL NULL
        let d = apply_json_diffs(&serde_json::json!({"r": 1}), &[diff(replace, "$.r", Some(&[0x04, 0x00]))]).unwrap();
        assert_eq!(d, serde_json::json!({"r": null}));
        // A diff that does not fit the before value is an error, not a guess.
        assert!(apply_json_diffs(&base, &[diff(replace, "$.missing", Some(&[0x05, 1, 0]))]).unwrap_err().to_string().contains("$.missing"));
        assert!(apply_json_diffs(&base, &[diff(remove, "$.a.b", None)]).is_err());
        assert!(apply_json_diffs(&arr, &[diff(replace, "$[7]", Some(&[0x05, 1, 0]))]).is_err());
    }

    #[test]
    fn json_paths() {
        assert_eq!(json_path_legs("$"), Some(vec![]));
        assert_eq!(json_path_legs("$.age"), Some(vec![Leg::Member("age".into())]));
        assert_eq!(json_path_legs("$.a[3].b"), Some(vec![Leg::Member("a".into()), Leg::Index(3), Leg::Member("b".into())]));
        assert_eq!(json_path_legs(r#"$."k.e\"y"[0]"#), Some(vec![Leg::Member("k.e\"y".into()), Leg::Index(0)]));
        assert_eq!(json_path_legs("$[*]"), None);
        assert_eq!(json_path_legs("$.*"), None);
        assert_eq!(json_path_legs("$[last]"), None);
    }
}
