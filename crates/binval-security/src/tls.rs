//! TLS settings of one connection: the mode and the PEM files.
//!
//! The modes are MySQL's `--ssl-mode` values (MySQL reference manual, "Command Options for
//! Encrypted Connections"), used for Redis and Kafka too so one word means one thing:
//!
//! | mode | encrypted | certificate chain checked against the CA | name checked |
//! |---|---|---|---|
//! | `disabled` | no | - | - |
//! | `required` | yes | no (anyone in the middle can read everything) | no |
//! | `verify-ca` | yes | yes | no (any certificate of that CA is accepted) |
//! | `verify-identity` | yes | yes | yes: the host binval connects to, or `server_name` |
//!
//! Without `ca_file` the system's trust store is the CA (MySQL: Mozilla's roots compiled in).
//! Keys must be unencrypted PEM (PKCS#8, PKCS#1 or SEC1): keep them readable by binval's
//! user only (a Kubernetes Secret mounted with `defaultMode: 0400`).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;

use crate::FileError;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// How a connection uses TLS (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plaintext.
    #[default]
    Disabled,
    /// Encrypted, the server's certificate is not checked.
    Required,
    /// Encrypted, the certificate chain is checked against the CA, not the name.
    VerifyCa,
    /// Encrypted, chain and name checked.
    VerifyIdentity,
}

impl TlsMode {
    /// The mode as written in a config (`verify-ca`).
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Required => "required",
            TlsMode::VerifyCa => "verify-ca",
            TlsMode::VerifyIdentity => "verify-identity",
        }
    }

    /// Anything but `disabled`.
    pub fn encrypted(self) -> bool {
        self != TlsMode::Disabled
    }

    /// What `binval check` says about the server's certificate in this mode.
    pub fn verification(self) -> &'static str {
        match self {
            TlsMode::Disabled => "no certificate (plaintext)",
            TlsMode::Required => "certificate NOT verified (tls mode required)",
            TlsMode::VerifyCa => "certificate verified against the CA, name not checked (tls mode verify-ca)",
            TlsMode::VerifyIdentity => "certificate verified against the CA and the server name (tls mode verify-identity)",
        }
    }
}

impl std::str::FromStr for TlsMode {
    type Err = crate::UnknownValue;

    /// `disabled`, `required`, `verify-ca`, `verify-identity` (as in a config file).
    fn from_str(s: &str) -> Result<TlsMode, crate::UnknownValue> {
        [TlsMode::Disabled, TlsMode::Required, TlsMode::VerifyCa, TlsMode::VerifyIdentity]
            .into_iter()
            .find(|m| m.as_str() == s.trim())
            .ok_or_else(|| crate::UnknownValue { given: s.to_string(), accepted: "disabled, required, verify-ca or verify-identity" })
    }
}

/// A client certificate (chain) and its key, PEM bytes.
pub type PemPair = (Vec<u8>, Vec<u8>);

/// A setting that cannot be used: `field` is the full name (`redis.tls.ca_file`, or a builder
/// option), `reason` says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {reason}")]
pub struct FieldError {
    /// The setting, as the user wrote it.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl FieldError {
    /// Build one.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), reason: reason.into() }
    }
}

/// The TLS settings of one service (`[source.tls]`, `[redis.tls]`, `[kafka.tls]` in binval's
/// config; the consumer's builder takes the same struct).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// The mode; unset: `verify-identity` when anything else here is set (or a Redis URL is
    /// `rediss://`), else `disabled`.
    #[serde(default)]
    pub mode: Option<TlsMode>,
    /// PEM file of the CA certificate(s) the server's certificate must chain to. Unset: the
    /// system's trust store.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for servers that require one (mutual TLS).
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (unencrypted).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// The name the server's certificate is checked against (and sent as SNI) instead of the
    /// host binval connects to. MySQL only: redis-rs and librdkafka check the host they
    /// connect to (the URL's host, a Cluster node's announced address, a broker's advertised
    /// host).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl TlsSettings {
    /// The mode in force: the one set, else `verify-identity` if a file or server name is set,
    /// else `disabled`.
    pub fn effective_mode(&self) -> TlsMode {
        self.mode.unwrap_or(if self.any_file_or_name() { TlsMode::VerifyIdentity } else { TlsMode::Disabled })
    }

    fn any_file_or_name(&self) -> bool {
        self.ca_file.is_some() || self.client_cert_file.is_some() || self.client_key_file.is_some() || self.server_name.is_some()
    }

    /// Check the settings of section `section` (`redis.tls`) without reading any file (a
    /// config is checked where the files may not exist, e.g. in CI): certificate and key come
    /// together, no files with mode `disabled`, a valid server name. Errors name the field.
    pub fn validate(&self, section: &str) -> Result<(), FieldError> {
        let field = |f: &str| format!("{section}.{f}");
        if self.mode == Some(TlsMode::Disabled) && self.any_file_or_name() {
            return Err(FieldError::new(
                field("mode"),
                "is \"disabled\" but TLS files or a server name are set: remove them or choose a mode",
            ));
        }
        match (&self.client_cert_file, &self.client_key_file) {
            (Some(_), None) => return Err(FieldError::new(field("client_key_file"), "is needed with client_cert_file")),
            (None, Some(_)) => return Err(FieldError::new(field("client_cert_file"), "is needed with client_key_file")),
            _ => {}
        }
        if let Some(n) = &self.server_name {
            rustls::pki_types::ServerName::try_from(n.as_str())
                .map_err(|e| FieldError::new(field("server_name"), format!("`{n}` is not a DNS name or IP address: {e}")))?;
        }
        Ok(())
    }

    /// Read the files (where binval connects, before it does): each one given is readable PEM
    /// of the right kind. Errors name the field.
    pub fn check_files(&self, section: &str) -> Result<(), FieldError> {
        let field = |f: &str| format!("{section}.{f}");
        self.validate(section)?;
        if let Some(ca) = &self.ca_file {
            read_certificates(ca).map_err(|r| FieldError::new(field("ca_file"), r.to_string()))?;
        }
        if let (Some(c), Some(k)) = (&self.client_cert_file, &self.client_key_file) {
            read_certificates(c).map_err(|r| FieldError::new(field("client_cert_file"), r.to_string()))?;
            read_key(k).map_err(|r| FieldError::new(field("client_key_file"), r.to_string()))?;
        }
        Ok(())
    }

    /// The CA file's bytes (PEM), if one is set.
    pub fn ca_pem(&self, section: &str) -> Result<Option<Vec<u8>>, FieldError> {
        read_file(self.ca_file.as_deref(), &format!("{section}.ca_file"))
    }

    /// The client certificate and key bytes (PEM), if set.
    pub fn client_identity_pem(&self, section: &str) -> Result<Option<PemPair>, FieldError> {
        let cert = read_file(self.client_cert_file.as_deref(), &format!("{section}.client_cert_file"))?;
        let key = read_file(self.client_key_file.as_deref(), &format!("{section}.client_key_file"))?;
        Ok(cert.zip(key))
    }
}

/// What a failed TLS handshake means, from the error text of rustls (through mysql_async or
/// redis-rs) or OpenSSL (through librdkafka): `Some` naming the setting of `section` to change
/// when the failure is one retrying cannot fix, `None` when the text is not a TLS failure.
pub fn explain_tls_failure(text: &str, section: &str) -> Option<FieldError> {
    let f = |n: &str| format!("{section}.{n}");
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    let about_certificate = text.contains("certificate");
    if has(&["NotValidForName", "Hostname verification failed", "hostname mismatch"])
        || (about_certificate && text.contains("does not match"))
    {
        return Some(FieldError::new(
            f("mode"),
            format!("the server's certificate does not name the host connected to: connect by a name the certificate holds, or set {section}.server_name (MySQL) or mode = \"verify-ca\" ({text})"),
        ));
    }
    if about_certificate && has(&["Expired", "NotValidYet", "has expired", "not yet valid"]) {
        return Some(FieldError::new(f("ca_file"), format!("the server's certificate is outside its validity period ({text})")));
    }
    if has(&[
        "invalid peer certificate",
        "certificate verify failed",
        "UnknownIssuer",
        "BadSignature",
        "unable to get local issuer",
        "self-signed certificate",
        "self signed certificate",
    ]) {
        return Some(FieldError::new(
            f("ca_file"),
            format!(
                "the server's certificate is not signed by a CA in {section}.ca_file (or the system trust store when it is unset): {text}"
            ),
        ));
    }
    if has(&[
        "received fatal alert",
        "alert certificate required",
        "alert unknown ca",
        "alert bad certificate",
        "tlsv13 alert",
        "sslv3 alert",
    ]) {
        return Some(FieldError::new(
            f("client_cert_file"),
            format!("the server refused the TLS handshake: it may require a client certificate ({section}.client_cert_file and client_key_file) signed by a CA it trusts ({text})"),
        ));
    }
    if has(&[
        "corrupt message",
        "InvalidContentType",
        "wrong version number",
        "packet length too long",
        "record layer failure",
        "InvalidMessage",
    ]) {
        return Some(FieldError::new(
            f("mode"),
            format!("the server does not speak TLS on this port: use its TLS port, or disable TLS ({text})"),
        ));
    }
    None
}

fn read_file(path: Option<&Path>, field: &str) -> Result<Option<Vec<u8>>, FieldError> {
    path.map(|p| std::fs::read(p).map_err(|e| FieldError::new(field, format!("cannot read `{}`: {e}", p.display())))).transpose()
}

/// The certificates of a PEM file; at least one.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, FileError> {
    let bytes = std::fs::read(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| FileError::NotCertificates { path: path.into(), source })?;
    if certs.is_empty() {
        return Err(FileError::NoCertificate { path: path.into() });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1; not encrypted).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, FileError> {
    let bytes = std::fs::read(path).map_err(|source| FileError::Read { path: path.into(), source })?;
    if String::from_utf8_lossy(&bytes).contains("ENCRYPTED") {
        return Err(FileError::EncryptedKey { path: path.into() });
    }
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|source| FileError::NoKey { path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_name_the_setting() {
        let e = explain_tls_failure("invalid peer certificate: UnknownIssuer", "redis.tls").unwrap();
        assert_eq!(e.field, "redis.tls.ca_file");
        let e = explain_tls_failure(
            "ssl://h:1/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed",
            "kafka.tls",
        )
        .unwrap();
        assert_eq!(e.field, "kafka.tls.ca_file");
        assert_eq!(explain_tls_failure("invalid peer certificate: NotValidForName", "source.tls").unwrap().field, "source.tls.mode");
        assert_eq!(
            explain_tls_failure("received fatal alert: CertificateRequired", "redis.tls").unwrap().field,
            "redis.tls.client_cert_file"
        );
        assert_eq!(
            explain_tls_failure("received corrupt message of type InvalidContentType", "redis.tls").unwrap().field,
            "redis.tls.mode"
        );
        assert!(explain_tls_failure("Connection refused (os error 111)", "redis.tls").is_none());
    }

    #[test]
    fn effective_mode_and_validation_name_the_field() {
        assert_eq!(TlsSettings::default().effective_mode(), TlsMode::Disabled);
        let s = TlsSettings { ca_file: Some("/nonexistent/ca.pem".into()), ..Default::default() };
        assert_eq!(s.effective_mode(), TlsMode::VerifyIdentity);
        assert!(s.validate("redis.tls").is_ok(), "validate reads no file");
        let e = s.check_files("redis.tls").unwrap_err();
        assert_eq!(e.field, "redis.tls.ca_file");
        assert!(e.reason.contains("/nonexistent/ca.pem"), "{e}");
        let s = TlsSettings { mode: Some(TlsMode::Disabled), server_name: Some("db".into()), ..Default::default() };
        assert_eq!(s.validate("source.tls").unwrap_err().field, "source.tls.mode");
        let s = TlsSettings { client_cert_file: Some("/x".into()), ..Default::default() };
        assert_eq!(s.validate("kafka.tls").unwrap_err().field, "kafka.tls.client_key_file");
        let s = TlsSettings { server_name: Some("bad name!".into()), ..Default::default() };
        assert_eq!(s.validate("source.tls").unwrap_err().field, "source.tls.server_name");
        let dir = std::env::temp_dir().join(format!("binval-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("not.pem"), "hello").unwrap();
        let s = TlsSettings { ca_file: Some(dir.join("not.pem")), ..Default::default() };
        assert!(s.check_files("source.tls").unwrap_err().reason.contains("no PEM certificate"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
