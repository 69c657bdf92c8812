//! [`ConfigError`]: what is wrong with a configuration, naming the field as it is written in the file.

/// A configuration problem, naming the field and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed, or a field has the wrong type or is missing.
    #[error("config {path}: {message}")]
    Load { path: String, message: String },
    /// A field has a value binval cannot use.
    #[error("config{}: field `{field}`: {reason}", at_path(.path))]
    Invalid { path: String, field: String, reason: String },
}

/// The config crate names enums by their Rust type and joins array keys without a dot
/// (`mappings[0]mode`): say which values are allowed, and write the field as in the file.
pub(super) fn explain(message: &str) -> String {
    const ALLOWED: &[(&str, &str)] = &[
        ("RedisMode", "\"standalone\" or \"cluster\""),
        ("MappingMode", "\"write-through\" or \"invalidate\""),
        ("CheckpointStore", "\"redis\" or \"file\""),
        ("FenceMode", "\"auto\", \"gtid\" or \"file_pos\""),
        ("EventFormat", "\"per_key\" or \"batched\""),
    ];
    let mut out = message.to_string();
    for (ty, allowed) in ALLOWED {
        if out.contains(&format!("enum {ty} ")) {
            out = format!("{out} (allowed values: {allowed})");
        }
    }
    let mut fixed = String::with_capacity(out.len());
    let mut chars = out.chars().peekable();
    while let Some(c) = chars.next() {
        fixed.push(c);
        if c == ']' && chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) {
            fixed.push('.');
        }
    }
    fixed
}

/// A TOML parse error names no key when an integer is beyond TOML's range (a signed 64-bit
/// integer; "number too large to fit in target type"): name the first `key = <integer>` of
/// `text` that is out of it, as `section.key` (`mappings[i].key` in the i-th `[[mappings]]`).
pub(super) fn out_of_range_integer(text: &str) -> Option<String> {
    let mut section = String::new();
    let mut arrays: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("[[").and_then(|l| l.strip_suffix("]]")) {
            let n = arrays.entry(name.trim().to_string()).and_modify(|n| *n += 1).or_insert(0);
            section = format!("{}[{n}]", name.trim());
        } else if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((key, value)) = line.split_once('=') {
            let v = value.split('#').next().unwrap_or("").trim().replace('_', "");
            let digits = v.strip_prefix(['+', '-']).unwrap_or(&v);
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && v.parse::<i64>().is_err() {
                let key = key.trim();
                return Some(if section.is_empty() { key.to_string() } else { format!("{section}.{key}") });
            }
        }
    }
    None
}

/// The message of a config that does not parse, with the key of an out-of-range integer
/// named when the parser did not name it.
pub(super) fn parse_message(text: Option<&str>, message: String) -> String {
    match text.and_then(out_of_range_integer) {
        Some(key) if message.contains("too large") || message.contains("too small") => {
            format!("{message} (`{key}` is beyond the range of a TOML integer)")
        }
        _ => message,
    }
}

pub(super) fn at_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" {path}")
    }
}
