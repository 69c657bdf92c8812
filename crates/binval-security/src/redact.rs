//! URLs without their passwords. Every URL binval or the consumer puts into a log line, an
//! error message, `binval check` output or a metric label goes through [`redact_url`] first.

/// `scheme://user:password@host...` -> `scheme://user:***@host...`; a URL without a password
/// (`redis://host:6379`, `mysql://user@host`) is returned as it is. The userinfo ends at the
/// last `@` before the path (RFC 3986 §3.2.1), so a password containing `@` is hidden whole.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else { return url.to_string() };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => url.to_string(),
    }
}

/// Every `scheme://user:password@host` inside a text (an error message of a client library)
/// with its password replaced by `***`.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(|c: char| c.is_whitespace() || "/?#`'\"<>,;)".contains(c)).unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rsplit_once('@') {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = userinfo.split(':').next().unwrap_or("");
                out.push_str(&format!("{user}:***@{host}"));
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// [`redact_url`] of each, joined with `,`.
pub fn redact_urls<S: AsRef<str>>(urls: &[S]) -> String {
    urls.iter().map(|u| redact_url(u.as_ref())).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_only() {
        assert_eq!(redact_url("mysql://u:secret@h:1"), "mysql://u:***@h:1");
        assert_eq!(redact_url("rediss://:pw@h:6379/0"), "rediss://:***@h:6379/0");
        assert_eq!(redact_url("redis://user:p@ss@h:1"), "redis://user:***@h:1");
        assert_eq!(redact_url("mysql://u:pw@h:1/db?x=a@b"), "mysql://u:***@h:1/db?x=a@b");
        assert_eq!(redact_url("mysql://u@h:1"), "mysql://u@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_urls(&["redis://a:b@h:1", "redis://h:2"]), "redis://a:***@h:1,redis://h:2");
        assert_eq!(
            redact_text("Invalid URL `mysql://u:pw@h:1/db`; also redis://x:y@z:2 and http://plain:3/"),
            "Invalid URL `mysql://u:***@h:1/db`; also redis://x:***@z:2 and http://plain:3/"
        );
    }
}
