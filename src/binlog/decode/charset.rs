//! Text columns decoded from their column charset. The binlog carries a collation id per text
//! column (TABLE_MAP optional metadata); the id names the charset. Ids come from the server's
//! `information_schema.COLLATIONS` when binval is connected (see [`learn_from_server`]), and
//! from a built-in table of the documented MySQL/MariaDB ids otherwise (offline reader).
//!
//! Decoded exactly: utf8mb3/utf8mb4, ascii, latin1 (MySQL's latin1 is cp1252), ucs2, utf16,
//! utf16le, utf32, gbk, binary (-> base64 by the caller). Other charsets (big5, sjis, ...):
//! ASCII-only values are exact and kept; anything else is an error naming the charset, never a
//! guess.

use std::collections::HashMap;
use std::sync::RwLock;

static SERVER: RwLock<Option<HashMap<u16, String>>> = RwLock::new(None);

/// Record the server's collation id -> charset name table.
pub fn learn_from_server(map: HashMap<u16, String>) {
    *SERVER.write().unwrap() = Some(map);
}

/// Charset name of collation `id`, e.g. `utf8mb4`, or `None` when unknown.
pub fn charset_name(id: u16) -> Option<String> {
    if let Some(m) = SERVER.read().unwrap().as_ref() {
        if let Some(n) = m.get(&id) {
            return Some(n.clone());
        }
    }
    builtin(id).map(str::to_string)
}

fn builtin(id: u16) -> Option<&'static str> {
    // MariaDB NO PAD collations are the PAD ones + 1024.
    let base = if (1024..2048).contains(&id) { id - 1024 } else { id };
    Some(match base {
        63 => "binary",
        5 | 8 | 15 | 31 | 47 | 48 | 49 | 94 => "latin1",
        11 | 65 => "ascii",
        33 | 76 | 83 | 192..=215 | 223 => "utf8mb3",
        45 | 46 | 224..=247 | 255..=323 => "utf8mb4",
        35 | 90 | 128..=151 | 159 => "ucs2",
        54 | 55 | 101..=124 => "utf16",
        56 | 62 => "utf16le",
        60 | 61 | 160..=183 => "utf32",
        28 | 87 => "gbk",
        1 | 84 => "big5",
        13 | 88 => "sjis",
        12 | 91 => "ujis",
        19 | 85 => "euckr",
        24 | 86 => "gb2312",
        95 | 96 => "cp932",
        97 | 98 => "eucjpms",
        248..=250 => "gb18030",
        _ => return None,
    })
}

/// How the text of one collation id is decoded: resolved once per column (when its TABLE_MAP
/// is prepared), not per value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charset {
    kind: Kind,
    /// Charset name for errors (`utf8mb4`, `gbk`, `collation id N`, ...).
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No charset in the binlog metadata: valid UTF-8 is kept.
    NoInfo,
    Utf8,
    Latin1,
    /// ucs2, utf16: big-endian UTF-16.
    Utf16Be,
    Utf16Le,
    Utf32,
    Gbk,
    /// A known ASCII-compatible charset binval does not convert: ASCII-only values only.
    AsciiOnly,
    /// An id neither the server nor the built-in table knows.
    Unknown,
}

impl Charset {
    /// Resolve collation `id` (see [`charset_name`]). Id 0 means the binlog recorded no charset
    /// (MySQL 5.x, MINIMAL row metadata: offline files only, the live pipeline requires FULL).
    pub fn of(id: u16) -> Charset {
        if id == 0 {
            return Charset { kind: Kind::NoInfo, name: "unknown (no charset in the binlog metadata)".into() };
        }
        let Some(name) = charset_name(id) else {
            return Charset { kind: Kind::Unknown, name: format!("collation id {id}") };
        };
        let kind = match name.as_str() {
            "utf8mb4" | "utf8mb3" | "utf8" | "ascii" => Kind::Utf8,
            "latin1" => Kind::Latin1,
            "ucs2" | "utf16" => Kind::Utf16Be,
            "utf16le" => Kind::Utf16Le,
            "utf32" => Kind::Utf32,
            "gbk" => Kind::Gbk,
            _ => Kind::AsciiOnly,
        };
        Charset { kind, name }
    }

    /// The charset's name, e.g. `utf8mb4` (`collation id N` when unknown).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Decode `bytes`. `Err` carries the charset name: the bytes are not valid in it, or it is
    /// a charset binval does not convert and the value is not ASCII.
    pub fn decode(&self, bytes: Vec<u8>) -> Result<String, NotInCharset> {
        let bad = || NotInCharset { charset: self.name.clone() };
        match self.kind {
            Kind::NoInfo | Kind::Utf8 => String::from_utf8(bytes).map_err(|_| bad()),
            Kind::Latin1 => {
                if bytes.is_ascii() {
                    Ok(String::from_utf8(bytes).expect("ascii"))
                } else {
                    Ok(bytes.iter().map(|&b| cp1252(b)).collect())
                }
            }
            Kind::Utf16Be => {
                if !bytes.len().is_multiple_of(2) {
                    return Err(bad());
                }
                let units: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
                String::from_utf16(&units).map_err(|_| bad())
            }
            Kind::Utf16Le => {
                if !bytes.len().is_multiple_of(2) {
                    return Err(bad());
                }
                let units: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                String::from_utf16(&units).map_err(|_| bad())
            }
            Kind::Utf32 => {
                if !bytes.len().is_multiple_of(4) {
                    return Err(bad());
                }
                bytes
                    .chunks_exact(4)
                    .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])).ok_or(()))
                    .collect::<Result<String, ()>>()
                    .map_err(|_| bad())
            }
            Kind::Gbk => gbk(&bytes).ok_or_else(bad),
            // ASCII-compatible charsets binval does not convert: ASCII-only text is exact.
            Kind::AsciiOnly if bytes.is_ascii() => Ok(String::from_utf8(bytes).expect("ascii")),
            Kind::AsciiOnly | Kind::Unknown => Err(bad()),
        }
    }
}

/// Text bytes that are not valid in their column's charset, or non-ASCII text of a charset
/// binval does not convert (see the module docs for the converted ones).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("text not valid in charset {charset}")]
pub struct NotInCharset {
    /// The charset's name, e.g. `utf16` (`collation id N` when unknown).
    pub charset: String,
}

/// Decode `bytes` of collation `id` ([`Charset::of`] then [`Charset::decode`]). `Err` carries
/// the charset name (or `collation id N`).
pub fn decode(id: u16, bytes: Vec<u8>) -> Result<String, NotInCharset> {
    Charset::of(id).decode(bytes)
}

/// The previous per-value implementation, kept as the reference of the tests.
#[cfg(test)]
fn decode_reference(id: u16, bytes: Vec<u8>) -> Result<String, NotInCharset> {
    if id == 0 {
        return String::from_utf8(bytes).map_err(|_| NotInCharset { charset: "unknown (no charset in the binlog metadata)".to_string() });
    }
    let name = charset_name(id);
    let bad = || NotInCharset { charset: name.clone().unwrap_or_else(|| format!("collation id {id}")) };
    match name.as_deref() {
        Some("utf8mb4") | Some("utf8mb3") | Some("utf8") | Some("ascii") => String::from_utf8(bytes).map_err(|_| bad()),
        Some("latin1") => Ok(bytes.iter().map(|&b| cp1252(b)).collect()),
        Some("ucs2") | Some("utf16") => {
            if !bytes.len().is_multiple_of(2) {
                return Err(bad());
            }
            let units: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).map_err(|_| bad())
        }
        Some("utf16le") => {
            if !bytes.len().is_multiple_of(2) {
                return Err(bad());
            }
            let units: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).map_err(|_| bad())
        }
        Some("utf32") => {
            if !bytes.len().is_multiple_of(4) {
                return Err(bad());
            }
            bytes
                .chunks_exact(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])).ok_or(()))
                .collect::<Result<String, ()>>()
                .map_err(|_| bad())
        }
        Some("gbk") => gbk(&bytes).ok_or_else(bad),
        // ASCII-compatible charsets binval does not convert: ASCII-only text is exact.
        _ if bytes.is_ascii() && name.is_some() => Ok(String::from_utf8(bytes).expect("ascii")),
        _ => Err(bad()),
    }
}

/// MySQL's gbk (strings/ctype-gbk.c): ASCII, and two-byte codes with a lead byte 0x81-0xFE
/// and a trail byte 0x40-0x7E or 0x80-0xFE. Decoded with encoding_rs's GBK table (the WHATWG
/// index), which agrees with MySQL/MariaDB for every two-byte code the server converts to
/// Unicode (checked code by code against the server by tests/types.rs). Codes the server has
/// no Unicode for (the user-defined areas, which WHATWG maps to the Private Use Area) and bytes
/// it would not accept in a gbk column (a lone byte >= 0x80, GB18030 four-byte sequences) are
/// an error, never a guess.
fn gbk(bytes: &[u8]) -> Option<String> {
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b < 0x80 {
            i += 1;
        } else if (0x81..=0xFE).contains(&b) && bytes.get(i + 1).is_some_and(|&t| (0x40..=0x7E).contains(&t) || (0x80..=0xFE).contains(&t))
        {
            i += 2;
        } else {
            return None;
        }
    }
    let mut j = 0;
    while j + 1 < bytes.len() {
        if bytes[j] < 0x80 {
            j += 1;
            continue;
        }
        if GBK_UNMAPPED.binary_search(&u16::from_be_bytes([bytes[j], bytes[j + 1]])).is_ok() {
            return None;
        }
        j += 2;
    }
    let s = encoding_rs::GBK.decode_without_bom_handling_and_without_replacement(bytes)?;
    // The user-defined areas: WHATWG maps them to the Private Use Area, MySQL/MariaDB have no
    // Unicode for them (a SELECT in utf8mb4 shows '?'): no exact text exists.
    if s.chars().any(|c| ('\u{E000}'..='\u{F8FF}').contains(&c)) {
        return None;
    }
    Some(s.into_owned())
}

/// Two-byte gbk codes that WHATWG's table (GB18030-2005 additions) maps but MySQL/MariaDB's
/// gbk does not (the server shows '?'): found by tests/types.rs against MariaDB 10.11.
const GBK_UNMAPPED: &[u16] = &[
    0xA2E3, 0xA3A0, 0xA6D9, 0xA6DA, 0xA6DB, 0xA6DC, 0xA6DD, 0xA6DE, 0xA6DF, 0xA6EC, 0xA6ED, 0xA6F3, 0xA8BC, 0xA8BF, 0xA989, 0xA98A, 0xA98B,
    0xA98C, 0xA98D, 0xA98E, 0xA98F, 0xA990, 0xA991, 0xA992, 0xA993, 0xA994, 0xA995, 0xFE50, 0xFE54, 0xFE55, 0xFE56, 0xFE57, 0xFE58, 0xFE59,
    0xFE5A, 0xFE5B, 0xFE5C, 0xFE5D, 0xFE5E, 0xFE5F, 0xFE60, 0xFE61, 0xFE62, 0xFE63, 0xFE64, 0xFE65, 0xFE66, 0xFE67, 0xFE68, 0xFE69, 0xFE6A,
    0xFE6B, 0xFE6D, 0xFE6E, 0xFE6F, 0xFE70, 0xFE71, 0xFE72, 0xFE73, 0xFE74, 0xFE75, 0xFE77, 0xFE78, 0xFE79, 0xFE7A, 0xFE7B, 0xFE7C, 0xFE7D,
    0xFE7E, 0xFE80, 0xFE81, 0xFE82, 0xFE83, 0xFE84, 0xFE85, 0xFE86, 0xFE87, 0xFE88, 0xFE89, 0xFE8A, 0xFE8B, 0xFE8C, 0xFE8D, 0xFE8E, 0xFE8F,
    0xFE90, 0xFE92, 0xFE93, 0xFE94, 0xFE95, 0xFE96, 0xFE97, 0xFE98, 0xFE99, 0xFE9A, 0xFE9B, 0xFE9C, 0xFE9D, 0xFE9E, 0xFE9F, 0xFEA0,
];

/// MySQL's latin1 is Windows-1252: 0x80-0x9F map to typographic characters (five are unused
/// and map to the C1 controls, as MySQL does).
fn cp1252(b: u8) -> char {
    const HIGH: [u16; 32] = [
        0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D, 0x017D, 0x008F,
        0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
    ];
    if (0x80..0xA0).contains(&b) {
        char::from_u32(HIGH[(b - 0x80) as usize] as u32).unwrap()
    } else {
        b as char
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_family() {
        assert_eq!(decode(45, "héllo 🎉".as_bytes().to_vec()).unwrap(), "héllo 🎉");
        assert_eq!(decode(8, vec![b'c', 0xE9, 0x80]).unwrap(), "cé€");
        assert_eq!(decode(35, vec![0, b'A', 0, b'B']).unwrap(), "AB");
        assert_eq!(decode(56, vec![b'A', 0, b'B', 0]).unwrap(), "AB");
        assert_eq!(decode(60, vec![0, 0, 0, b'A', 0, 1, 0xF3, 0x89]).unwrap(), "A🎉");
        assert_eq!(decode(28, b"plain".to_vec()).unwrap(), "plain");
        assert_eq!(decode(28, vec![0xC4, 0xE3]).unwrap(), "你");
        assert_eq!(decode(28, vec![0xC4]).unwrap_err().charset, "gbk");
        assert_eq!(decode(28, vec![0x80]).unwrap_err().charset, "gbk");
        assert_eq!(decode(28, vec![0x81, 0x30, 0x81, 0x30]).unwrap_err().charset, "gbk", "GB18030 four-byte sequences are not gbk");
        assert_eq!(decode(1069, b"nopad".to_vec()).unwrap(), "nopad");
        assert_eq!(decode(9999, b"x".to_vec()).unwrap_err().charset, "collation id 9999");
        assert!(decode(45, vec![0xFF]).is_err());
    }

    #[test]
    fn resolved_charsets_decode_like_the_reference() {
        let samples: Vec<Vec<u8>> = vec![
            vec![],
            b"plain".to_vec(),
            vec![0xC4, 0xE3],
            vec![0xFF],
            vec![0, 0x41],
            vec![0x41, 0],
            vec![0, 0, 0, 0x41],
            "é🎉".as_bytes().to_vec(),
            vec![0x80, 0x9F],
        ];
        for id in [0u16, 8, 28, 33, 35, 45, 56, 60, 63, 1, 95, 9999, 1069] {
            for b in &samples {
                assert_eq!(decode(id, b.clone()), decode_reference(id, b.clone()), "collation {id}, bytes {b:?}");
            }
        }
    }
}
