//! [`Secret`]: a password or key passphrase held in memory that prints as `***` in `Debug` and
//! `Display`, so a configuration or builder printed with `{:?}` never shows it.

use std::fmt;

/// A secret value (a password). Read it with [`Secret::expose`]; formatting shows `***`.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wrap a value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the client library that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Read a secret file (a Kubernetes Secret mounted as a file, Docker secrets, ...): the
    /// whole file without its trailing line break (`\n` or `\r\n`), since `echo pw > file`
    /// and most editors add one. Errors name the file (never its content); an empty file is
    /// an error (an empty password is almost always a mistake in the mount).
    pub fn from_file(path: &std::path::Path) -> Result<Secret, crate::FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| crate::FileError::Read { path: path.into(), source })?;
        let value = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
        if value.is_empty() {
            return Err(crate::FileError::Empty { path: path.into() });
        }
        Ok(Secret(value.to_string()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_and_reads_files_without_the_line_break() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        let dir = std::env::temp_dir().join(format!("binval-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (content, want) in [("pw\n", Some("pw")), ("pw\r\n", Some("pw")), ("p w", Some("p w")), ("\n", None)] {
            let p = dir.join("s");
            std::fs::write(&p, content).unwrap();
            assert_eq!(Secret::from_file(&p).ok().as_ref().map(Secret::expose), want, "{content:?}");
        }
        let e = Secret::from_file(&dir.join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
