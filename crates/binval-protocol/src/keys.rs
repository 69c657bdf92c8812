//! Key layout shared by writer and reader.
//!
//! * A **logical key** `K` is rendered from a template such as `item:detail:{id}`, where each
//!   `{column}` is replaced by that column's value in the row. `{{` and `}}` stand for literal
//!   braces.
//! * Its **suffix replicas** are `K:r0 .. K:r{N-1}`; each holds the same payload. Readers pick one
//!   at random so a hot key's load spreads over several hash slots and so over several masters.
//! * Its **version token** is `K:ver`, an integer bumped after every replica holds a change.
//!
//! Redis Cluster places a key in hash slot `CRC16(key) mod 16384`, but when the key contains a
//! `{hash tag}` (the text between the first `{` and the next `}`, if non-empty) only the tag is
//! hashed (Redis Cluster specification, "Hash tags"). A literal hash tag in a template would put
//! every replica of a key into one slot and defeat the replicas, so [`KeyTemplate::parse`]
//! reports it and the service refuses such a template when N > 1.

use std::fmt::Write as _;

/// Separator between a logical key and its replica suffix: `K:r0`.
pub const REPLICA_SEPARATOR: &str = ":r";

/// Number of hash slots in a Redis Cluster (Redis Cluster specification).
pub const HASH_SLOTS: u16 = 16384;

/// Name of replica `index` of logical key `key`: `key:r{index}`.
///
/// ```
/// assert_eq!(binval_protocol::replica_key("item:detail:7", 3), "item:detail:7:r3");
/// ```
pub fn replica_key(key: &str, index: u32) -> String {
    let mut s = String::with_capacity(key.len() + 5);
    s.push_str(key);
    s.push_str(REPLICA_SEPARATOR);
    let _ = write!(s, "{index}");
    s
}

/// Name of the version token of logical key `key`: `key:ver`.
pub fn version_key(key: &str) -> String {
    format!("{key}:ver")
}

/// The hash tag of `key` per the Redis Cluster specification, if it has one: the bytes between
/// the first `{` and the first `}` after it, when that span is non-empty.
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let close = key[open + 1..].iter().position(|&b| b == b'}')?;
    if close == 0 {
        None
    } else {
        Some(&key[open + 1..open + 1 + close])
    }
}

/// Redis Cluster hash slot of `key` (0..16384): CRC16-XMODEM of the hash tag, or of the whole
/// key when it has none.
///
/// ```
/// // Value from the Redis Cluster specification's reference implementation test vector.
/// assert_eq!(binval_protocol::hash_slot(b"123456789"), 0x31C3 % 16384);
/// assert_eq!(binval_protocol::hash_slot(b"{user1000}.following"),
///            binval_protocol::hash_slot(b"user1000"));
/// ```
pub fn hash_slot(key: &[u8]) -> u16 {
    let k = hash_tag(key).unwrap_or(key);
    crc16_xmodem(k) % HASH_SLOTS
}

/// The hash slots of replicas `0..n` of `key`, in order: `hash_slot(replica_key(key, i))` for
/// each `i`, without building the replica keys. Replica keys share the prefix `K:r`, and CRC16
/// runs byte by byte, so the prefix is hashed once and each replica adds only its index's
/// digits (the consumer groups a key's replicas by master on every fill). A key with a hash
/// tag keeps it in every replica key: one slot for all.
///
/// ```
/// use binval_protocol::{hash_slot, replica_key, keys::replica_slots};
/// let slots: Vec<u16> = replica_slots("item:detail:6666", 8).collect();
/// assert_eq!(slots[5], hash_slot(replica_key("item:detail:6666", 5).as_bytes()));
/// ```
pub fn replica_slots(key: &str, n: u32) -> impl Iterator<Item = u16> + '_ {
    let tagged = hash_tag(key.as_bytes()).map(hash_slot);
    let prefix = crc16_update(crc16_update(0, key.as_bytes()), REPLICA_SEPARATOR.as_bytes());
    (0..n).map(move |i| {
        if let Some(slot) = tagged {
            return slot;
        }
        let mut digits = [0u8; 10];
        let mut at = digits.len();
        let mut v = i;
        loop {
            at -= 1;
            digits[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        crc16_update(prefix, &digits[at..]) % HASH_SLOTS
    })
}

/// CRC16-XMODEM (polynomial 0x1021, initial value 0) one byte at a time through a 256-entry
/// table built at compile time: the consumer computes the slot of each of a key's N replica
/// keys on every fill, where the bit-by-bit loop (8 shifts per byte) showed.
fn crc16_xmodem(data: &[u8]) -> u16 {
    crc16_update(0, data)
}

/// Continue a CRC16-XMODEM over `data`.
fn crc16_update(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc = (crc << 8) ^ CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Why a key template is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `{` without a matching `}`, or a stray `}`.
    #[error("key template `{template}`: unbalanced brace at byte {at}; use {{{{ and }}}} for literal braces")]
    Unbalanced { template: String, at: usize },
    /// `{}` with no column name.
    #[error("key template `{template}`: empty placeholder `{{}}` at byte {at}")]
    EmptyPlaceholder { template: String, at: usize },
    /// The template has no `{column}` placeholder, so every row would map to one key.
    #[error("key template `{template}` has no {{column}} placeholder")]
    NoPlaceholder { template: String },
    /// The template's literal text forms a Redis Cluster hash tag.
    #[error("key template `{template}` contains the hash tag `{{{tag}}}`: all {replicas} replicas of a key would share one hash slot (and one master); remove the literal braces or set replicas = 1")]
    HashTag { template: String, tag: String, replicas: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Col(String),
}

/// A parsed logical key template such as `item:detail:{id}` or `feed:{user_id}:{day}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate {
    source: String,
    parts: Vec<Part>,
}

impl KeyTemplate {
    /// Parse `template`. Errors on unbalanced braces, empty placeholders, or no placeholder.
    /// A literal hash tag is not an error here; see [`KeyTemplate::check_replicas`].
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let b = template.as_bytes();
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'{' if b.get(i + 1) == Some(&b'{') => {
                    lit.push('{');
                    i += 2;
                }
                b'}' if b.get(i + 1) == Some(&b'}') => {
                    lit.push('}');
                    i += 2;
                }
                b'{' => {
                    let end = template[i + 1..].find(['}', '{']).map(|e| e + i + 1);
                    match end {
                        Some(e) if b[e] == b'}' => {
                            let name = &template[i + 1..e];
                            if name.trim().is_empty() {
                                return Err(TemplateError::EmptyPlaceholder { template: template.into(), at: i });
                            }
                            if !lit.is_empty() {
                                parts.push(Part::Lit(std::mem::take(&mut lit)));
                            }
                            parts.push(Part::Col(name.trim().to_string()));
                            i = e + 1;
                        }
                        _ => return Err(TemplateError::Unbalanced { template: template.into(), at: i }),
                    }
                }
                b'}' => return Err(TemplateError::Unbalanced { template: template.into(), at: i }),
                _ => {
                    let ch = template[i..].chars().next().unwrap();
                    lit.push(ch);
                    i += ch.len_utf8();
                }
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        if !parts.iter().any(|p| matches!(p, Part::Col(_))) {
            return Err(TemplateError::NoPlaceholder { template: template.into() });
        }
        Ok(KeyTemplate { source: template.into(), parts })
    }

    /// Refuse a template whose literal text contains a hash tag when `replicas > 1`.
    pub fn check_replicas(&self, replicas: u32) -> Result<(), TemplateError> {
        if replicas <= 1 {
            return Ok(());
        }
        // Only literal text can be checked statically; column values are checked per key.
        let literal: String = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Lit(s) => s.as_str(),
                Part::Col(_) => "\u{0}",
            })
            .collect();
        for seg in literal.split('\u{0}') {
            if let Some(tag) = hash_tag(seg.as_bytes()) {
                return Err(TemplateError::HashTag {
                    template: self.source.clone(),
                    tag: String::from_utf8_lossy(tag).into_owned(),
                    replicas,
                });
            }
        }
        Ok(())
    }

    /// The template text as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Column names used by the template, in order of appearance (may repeat).
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Col(c) => Some(c.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// The literal text before the first placeholder (`item:detail:` for
    /// `item:detail:{id}`): every key of the template starts with it. A `truncate` event
    /// carries the template; consumers evict every cached key with this prefix.
    pub fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Lit(s)) => s,
            _ => "",
        }
    }

    /// A Redis glob (`SCAN MATCH`) matching every key of the template: each placeholder
    /// becomes `*`, glob metacharacters of the literal text are escaped.
    ///
    /// ```
    /// let t = binval_protocol::KeyTemplate::parse("item:[x]:{id}").unwrap();
    /// assert_eq!(t.glob(), r"item:\[x\]:*");
    /// ```
    pub fn glob(&self) -> String {
        let mut out = String::with_capacity(self.source.len());
        for p in &self.parts {
            match p {
                Part::Lit(s) => {
                    for ch in s.chars() {
                        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
                            out.push('\\');
                        }
                        out.push(ch);
                    }
                }
                Part::Col(_) => out.push('*'),
            }
        }
        out
    }

    /// The column texts a logical key was rendered from: `(column, text)` per placeholder, in
    /// template order, or `None` when `key` is not a key of this template (its literal text
    /// differs, two placeholders touch so the split is ambiguous, or a column used twice would
    /// get two values). A placeholder takes the shortest text up to the next literal text (the
    /// last placeholder the rest), so with `{a}:{b}` the key `x:y:z` splits as `a = x`,
    /// `b = y:z`: the reverse of [`KeyTemplate::render`] whenever no value contains the
    /// literal text that follows its placeholder (the separator rule of the README).
    ///
    /// ```
    /// let t = binval_protocol::KeyTemplate::parse("feed:{user}:{day}").unwrap();
    /// assert_eq!(t.split_key("feed:7:2024-01-02"), Some(vec![("user", "7"), ("day", "2024-01-02")]));
    /// assert_eq!(t.split_key("item:7"), None);
    /// ```
    pub fn split_key<'k>(&self, key: &'k str) -> Option<Vec<(&str, &'k str)>> {
        let mut at = 0;
        let mut out: Vec<(&str, &'k str)> = Vec::new();
        for (i, p) in self.parts.iter().enumerate() {
            match p {
                Part::Lit(s) => {
                    if !key[at..].starts_with(s.as_str()) {
                        return None;
                    }
                    at += s.len();
                }
                Part::Col(c) => {
                    let end = match self.parts.get(i + 1) {
                        None => key.len(),
                        Some(Part::Lit(next)) => at + key[at..].find(next.as_str())?,
                        Some(Part::Col(_)) => return None,
                    };
                    let value = &key[at..end];
                    if out.iter().any(|(col, v)| col == c && *v != value) {
                        return None;
                    }
                    out.push((c.as_str(), value));
                    at = end;
                }
            }
        }
        (at == key.len()).then_some(out)
    }

    /// Length of the template's literal text: the more of it, the more specific the template
    /// (a key that fits two templates belongs to the one with more literal text).
    pub fn literal_len(&self) -> usize {
        self.parts.iter().map(|p| if let Part::Lit(s) = p { s.len() } else { 0 }).sum()
    }

    /// Render the logical key. `value_of(column)` returns the column's text, or `None` when the
    /// column is NULL or absent, in which case no key is rendered (`None`).
    pub fn render<'a, F>(&self, mut value_of: F) -> Option<String>
    where
        F: FnMut(&str) -> Option<std::borrow::Cow<'a, str>>,
    {
        let mut out = String::with_capacity(self.source.len() + 16);
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Col(c) => out.push_str(&value_of(c)?),
            }
        }
        Some(out)
    }
}

impl std::fmt::Display for KeyTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    /// The table-driven CRC equals the bit-by-bit definition (and Redis's slots for keys whose
    /// slots are documented).
    #[test]
    fn crc16_table_matches_the_bitwise_definition() {
        fn bitwise(data: &[u8]) -> u16 {
            let mut crc: u16 = 0;
            for &b in data {
                crc ^= (b as u16) << 8;
                for _ in 0..8 {
                    crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
                }
            }
            crc
        }
        for len in 0..64usize {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + len * 11) as u8).collect();
            assert_eq!(crc16_xmodem(&data), bitwise(&data), "{data:?}");
        }
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        // `CLUSTER KEYSLOT foo` = 12182, `CLUSTER KEYSLOT bar` = 5061 (redis-cli).
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"bar"), 5061);
    }

    #[test]
    fn replica_slots_equal_the_slots_of_the_replica_keys() {
        for key in ["item:detail:6666", "", "a{b}c", "a{}c", "x{y", "{tag}:z", "t}{"] {
            let fast: Vec<u16> = replica_slots(key, 120).collect();
            let slow: Vec<u16> = (0..120).map(|i| hash_slot(replica_key(key, i).as_bytes())).collect();
            assert_eq!(fast, slow, "{key:?}");
        }
    }

    #[test]
    fn parse_and_render() {
        let t = KeyTemplate::parse("item:detail:{id}").unwrap();
        assert_eq!(t.columns().collect::<Vec<_>>(), vec!["id"]);
        assert_eq!(t.render(|_| Some(Cow::Borrowed("6666"))).unwrap(), "item:detail:6666");
        assert_eq!(t.render(|_| None), None);
        let t = KeyTemplate::parse("feed:{user}:{day}").unwrap();
        let r = t.render(|c| Some(Cow::Owned(format!("<{c}>")))).unwrap();
        assert_eq!(r, "feed:<user>:<day>");
    }

    #[test]
    fn errors() {
        assert!(matches!(KeyTemplate::parse("a:{id"), Err(TemplateError::Unbalanced { .. })));
        assert!(matches!(KeyTemplate::parse("a:}"), Err(TemplateError::Unbalanced { .. })));
        assert!(matches!(KeyTemplate::parse("a:{}"), Err(TemplateError::EmptyPlaceholder { .. })));
        assert!(matches!(KeyTemplate::parse("a:b"), Err(TemplateError::NoPlaceholder { .. })));
    }

    #[test]
    fn hash_tag_refused_with_replicas() {
        let t = KeyTemplate::parse("{{shop}}:item:{id}").unwrap();
        assert_eq!(t.render(|_| Some(Cow::Borrowed("1"))).unwrap(), "{shop}:item:1");
        assert!(matches!(t.check_replicas(8), Err(TemplateError::HashTag { .. })));
        assert!(t.check_replicas(1).is_ok());
        assert!(KeyTemplate::parse("item:{id}").unwrap().check_replicas(8).is_ok());
    }

    #[test]
    fn keys_split_back_into_their_column_texts() {
        let t = KeyTemplate::parse("item:detail:{id}").unwrap();
        assert_eq!(t.split_key("item:detail:6666"), Some(vec![("id", "6666")]));
        assert_eq!(t.split_key("item:detail:"), Some(vec![("id", "")]));
        assert_eq!(t.split_key("item:sku:1"), None);
        let t = KeyTemplate::parse("o:{a}:{b}:x").unwrap();
        assert_eq!(t.split_key("o:1:2:x"), Some(vec![("a", "1"), ("b", "2")]));
        assert_eq!(t.split_key("o:1:2:3:x"), Some(vec![("a", "1"), ("b", "2:3")]));
        assert_eq!(t.split_key("o:1:2:y"), None);
        assert_eq!(KeyTemplate::parse("{a}{b}").unwrap().split_key("12"), None, "touching placeholders are ambiguous");
        let t = KeyTemplate::parse("{a}-{a}").unwrap();
        assert_eq!(t.split_key("1-1"), Some(vec![("a", "1"), ("a", "1")]));
        assert_eq!(t.split_key("1-2"), None);
        // Whatever renders splits back to the same texts when values avoid the separators.
        let t = KeyTemplate::parse("feed:{user}:{day}").unwrap();
        let key = t.render(|c| Some(Cow::Owned(if c == "user" { "u7".into() } else { "2024-01-02".into() }))).unwrap();
        assert_eq!(t.split_key(&key), Some(vec![("user", "u7"), ("day", "2024-01-02")]));
        assert!(t.literal_len() > KeyTemplate::parse("{x}").unwrap().literal_len());
    }

    #[test]
    fn slots() {
        assert_eq!(hash_slot(b"foo"), 12182); // CLUSTER KEYSLOT foo
        assert_eq!(hash_slot(b"{a}x"), hash_slot(b"a"));
        assert_eq!(hash_slot(b"{}x"), hash_slot(b"{}x"));
        // replicas spread over slots
        let slots: std::collections::HashSet<u16> = (0..8).map(|i| hash_slot(replica_key("item:detail:6666", i).as_bytes())).collect();
        assert!(slots.len() > 1);
    }
}
