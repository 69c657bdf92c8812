//! The canonical text of MySQL/MariaDB values inside a payload (the rules of
//! `schemas/README.md`): one implementation for every path that makes a payload, so a row seen
//! in a row event (`binval run`), read with a SELECT (`binval bootstrap`, `binval verify`) or
//! loaded by an app's loader ([`super::result_set`]) gives byte-identical JSON.

use base64::Engine as _;
use serde_json::{Number, Value as Json};

/// `YYYY-MM-DD`, and with `time` = ((h, mi, s, us), fsp) ` hh:mm:ss` with exactly fsp fraction
/// digits: MySQL's own text of a DATE or DATETIME (also of the zero date `0000-00-00`).
pub fn datetime_text((y, mo, d): (u16, u8, u8), time: Option<((u8, u8, u8, u32), u8)>) -> String {
    use std::fmt::Write as _;
    let mut t = String::with_capacity(26);
    let _ = write!(t, "{y:04}-{mo:02}-{d:02}");
    if let Some(((h, mi, s, us), fsp)) = time {
        let _ = write!(t, " {h:02}:{mi:02}:{s:02}");
        push_frac(&mut t, us, fsp);
    }
    t
}

/// MySQL's text of a TIME value: `[-]hh:mm:ss` (hours past 24 for days) with exactly `fsp`
/// fraction digits.
pub fn time_text(neg: bool, days: u32, (h, mi, s, us): (u8, u8, u8, u32), fsp: u8) -> String {
    use std::fmt::Write as _;
    let hours = days as u64 * 24 + h as u64;
    let mut t = String::with_capacity(18);
    let _ = write!(t, "{}{hours:02}:{mi:02}:{s:02}", if neg { "-" } else { "" });
    push_frac(&mut t, us, fsp);
    t
}

/// BIT(n): the big-endian bytes as a number.
pub fn bit_json(b: &[u8]) -> Json {
    Json::from(b.iter().fold(0u64, |acc, &x| (acc << 8) | x as u64))
}

/// GEOMETRY as stored (4-byte little-endian SRID, then WKB) as `{"srid", "wkb"}` (base64);
/// `None` when shorter than an SRID.
pub fn geometry_json(b: &[u8]) -> Option<Json> {
    let srid = u32::from_le_bytes(b.get(..4)?.try_into().ok()?);
    Some(serde_json::json!({ "srid": srid, "wkb": base64::engine::general_purpose::STANDARD.encode(&b[4..]) }))
}

/// A FLOAT as the shortest decimal that reads back as the same f32 (what MySQL prints:
/// `1.1`, not `1.100000023841858`).
pub fn f32_json(f: f32) -> Json {
    f.to_string().parse::<f64>().ok().and_then(Number::from_f64).map(Json::Number).unwrap_or(Json::Null)
}

/// Append `.` and the first `fsp` (0-6) digits of the 6-digit microseconds `us`.
pub fn push_frac(t: &mut String, us: u32, fsp: u8) {
    if fsp == 0 {
        return;
    }
    t.push('.');
    let mut div = 100_000;
    for _ in 0..fsp.min(6) {
        t.push(char::from(b'0' + ((us / div) % 10) as u8));
        div /= 10;
    }
}

/// `.` and the first `fsp` (0-6) digits of the 6-digit microseconds `us`; empty for `fsp` 0.
pub fn frac(us: u32, fsp: u8) -> String {
    if fsp == 0 {
        return String::new();
    }
    let digits = format!("{us:06}");
    format!(".{}", &digits[..fsp.min(6) as usize])
}

/// A DECIMAL's text with at least `scale` fraction digits (zeros appended): the declared scale.
pub fn pad_scale(s: String, scale: usize) -> String {
    if scale == 0 {
        return s;
    }
    match s.split_once('.') {
        Some((_, f)) if f.len() >= scale => s,
        Some((_, f)) => {
            let missing = scale - f.len();
            s + &"0".repeat(missing)
        }
        None => format!("{s}.{}", "0".repeat(scale)),
    }
}

/// Format Unix seconds + microseconds as an RFC 3339 UTC instant with `fsp` fraction digits,
/// e.g. `2026-11-30T22:31:12.120Z`. TIMESTAMP 0 (the zero timestamp) is `0000-00-00 00:00:00`.
pub fn utc_instant(secs: i64, us: u32, fsp: u8) -> String {
    if secs == 0 && us == 0 {
        return zero_timestamp(fsp);
    }
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    instant_text((y, m, d), (rem / 3600, (rem % 3600) / 60, rem % 60), us, fsp)
}

/// The zero TIMESTAMP `0000-00-00 00:00:00` with `fsp` zero fraction digits.
pub fn zero_timestamp(fsp: u8) -> String {
    "0000-00-00 00:00:00".to_string() + &frac(0, fsp)
}

/// An RFC 3339 UTC instant from its UTC date and time of day: `YYYY-MM-DDThh:mm:ss[.f]Z`
/// with `fsp` fraction digits.
pub fn instant_text((y, m, d): (i64, u32, u32), (h, mi, s): (i64, i64, i64), us: u32, fsp: u8) -> String {
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}{}Z", frac(us, fsp))
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants() {
        assert_eq!(utc_instant(1_764_541_872, 0, 0), "2025-11-30T22:31:12Z");
        assert_eq!(utc_instant(1, 120_000, 3), "1970-01-01T00:00:01.120Z");
        assert_eq!(utc_instant(951_782_400, 0, 0), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn scale_padding() {
        assert_eq!(pad_scale("1.5".into(), 2), "1.50");
        assert_eq!(pad_scale("-3".into(), 2), "-3.00");
        assert_eq!(pad_scale("7".into(), 0), "7");
        assert_eq!(pad_scale("0.125".into(), 3), "0.125");
    }

    #[test]
    fn fractions() {
        for (us, fsp) in [(123_456, 3), (5, 6), (5, 0), (999_999, 6), (100_000, 1), (0, 2), (120_000, 2)] {
            let mut t = String::new();
            push_frac(&mut t, us, fsp);
            assert_eq!(t, frac(us, fsp), "{us} {fsp}");
        }
        assert_eq!(frac(123_456, 3), ".123");
        assert_eq!(frac(5, 6), ".000005");
        assert_eq!(frac(5, 0), "");
    }
}
