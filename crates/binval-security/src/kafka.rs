//! Kafka's SSL and SASL settings as typed fields, mapped to librdkafka properties
//! (librdkafka `CONFIGURATION.md`; Kafka docs "Encryption and Authentication using SSL" and
//! "Authentication using SASL").
//!
//! | typed setting | librdkafka property |
//! |---|---|
//! | TLS on / SASL on | `security.protocol` = `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` |
//! | `tls.ca_file` | `ssl.ca.location` |
//! | `tls.client_cert_file`, `tls.client_key_file` | `ssl.certificate.location`, `ssl.key.location` |
//! | `tls.mode` `verify-identity` / `verify-ca` / `required` | `enable.ssl.certificate.verification` `true`/`true`/`false`, `ssl.endpoint.identification.algorithm` `https`/`none`/`none` |
//! | `sasl.mechanism` | `sasl.mechanisms` (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`) |
//! | `sasl.username`, the password | `sasl.username`, `sasl.password` |
//!
//! Raw properties (binval's `kafka.properties`, the consumer's `kafka_property`) are still
//! passed for everything else (`ssl.cipher.suites`, `sasl.oauthbearer.*`, ...). A raw property
//! that a typed setting also sets is refused, naming both ([`conflicts`]): two places for one
//! setting is how a rotated certificate ends up half-applied. Without typed settings, raw
//! properties work as before (`security.protocol=SSL` and friends).
//!
//! librdkafka checks the broker's certificate against the host it connects to: the bootstrap
//! host, then each broker's advertised host; it has no separate server name
//! (`tls.server_name` is refused). PLAIN sends the password as it is: use it over TLS only.

use serde::Deserialize;

use crate::secret::Secret;
use crate::tls::{FieldError, TlsMode, TlsSettings};

/// A SASL mechanism librdkafka speaks without Kerberos or OAuth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    /// `PLAIN`: user and password in the clear (inside TLS).
    #[serde(rename = "PLAIN")]
    Plain,
    /// `SCRAM-SHA-256` (RFC 7677).
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// `SCRAM-SHA-512`.
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// librdkafka's name (`sasl.mechanisms`).
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = crate::UnknownValue;

    /// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` (case-insensitive).
    fn from_str(s: &str) -> Result<SaslMechanism, crate::UnknownValue> {
        [SaslMechanism::Plain, SaslMechanism::ScramSha256, SaslMechanism::ScramSha512]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| crate::UnknownValue { given: s.to_string(), accepted: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" })
    }
}

/// SASL credentials, resolved (the password read from wherever it was configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSasl {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user (`sasl.username`).
    pub username: String,
    /// The password (`sasl.password`).
    pub password: Secret,
}

/// `[kafka.sasl]` of binval's config (the consumer takes a resolved [`KafkaSasl`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSettings {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: SaslMechanism,
    /// The user.
    pub username: String,
    /// The password (best from the environment, e.g. `BINVAL__KAFKA__SASL__PASSWORD`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// File holding the password, read at every connect.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
}

impl SaslSettings {
    /// A user, and exactly one of password and password file (nothing is read).
    pub fn validate(&self, section: &str) -> Result<(), FieldError> {
        if self.username.is_empty() {
            return Err(FieldError::new(format!("{section}.username"), "is empty"));
        }
        crate::checks::one_password(self.password.is_some(), self.password_file.as_deref(), false, section, section)?;
        if self.password.is_none() && self.password_file.is_none() {
            return Err(FieldError::new(format!("{section}.password"), format!("is needed (or {section}.password_file)")));
        }
        Ok(())
    }

    /// The credentials, with the password read (from the file when one is set; errors name
    /// `section.password_file`).
    pub fn resolve(&self, section: &str) -> Result<KafkaSasl, FieldError> {
        self.validate(section)?;
        let password = match (&self.password, &self.password_file) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => Secret::from_file(f).map_err(|r| FieldError::new(format!("{section}.password_file"), r.to_string()))?,
            (None, None) => unreachable!("validated"),
        };
        Ok(KafkaSasl { mechanism: self.mechanism, username: self.username.clone(), password })
    }
}

/// One librdkafka property a typed setting sets: (property, the typed setting's name, value).
pub type TypedProperty = (&'static str, String, String);

/// The librdkafka properties of `tls` (in section `tls_section`, e.g. `kafka.tls`) and `sasl`
/// (named `sasl_section`), in a fixed order. Empty when TLS is disabled and there is no SASL:
/// then `security.protocol` is left to librdkafka's default (`plaintext`) or a raw property.
pub fn security_properties(
    tls: &TlsSettings,
    tls_section: &str,
    sasl: Option<&KafkaSasl>,
    sasl_section: &str,
) -> Result<Vec<TypedProperty>, FieldError> {
    if tls.server_name.is_some() {
        return Err(FieldError::new(
            format!("{tls_section}.server_name"),
            "is not supported for Kafka: librdkafka checks each broker's certificate against the host it connects to (bootstrap, then advertised listeners)",
        ));
    }
    let mode = tls.effective_mode();
    let mut out: Vec<TypedProperty> = Vec::new();
    let mut put = |k: &'static str, field: String, v: &str| out.push((k, field, v.to_string()));
    let protocol = match (mode.encrypted(), sasl.is_some()) {
        (false, false) => return Ok(Vec::new()),
        (true, false) => "SSL",
        (false, true) => "SASL_PLAINTEXT",
        (true, true) => "SASL_SSL",
    };
    put("security.protocol", format!("{tls_section}.mode / {sasl_section}"), protocol);
    if mode.encrypted() {
        let f = |n: &str| format!("{tls_section}.{n}");
        if let Some(ca) = &tls.ca_file {
            put("ssl.ca.location", f("ca_file"), &ca.display().to_string());
        }
        if let Some(c) = &tls.client_cert_file {
            put("ssl.certificate.location", f("client_cert_file"), &c.display().to_string());
        }
        if let Some(k) = &tls.client_key_file {
            put("ssl.key.location", f("client_key_file"), &k.display().to_string());
        }
        let (verify, algorithm) = match mode {
            TlsMode::VerifyIdentity => ("true", "https"),
            TlsMode::VerifyCa => ("true", "none"),
            _ => ("false", "none"),
        };
        put("enable.ssl.certificate.verification", f("mode"), verify);
        put("ssl.endpoint.identification.algorithm", f("mode"), algorithm);
    }
    if let Some(s) = sasl {
        let f = |n: &str| format!("{sasl_section}.{n}");
        put("sasl.mechanisms", f("mechanism"), s.mechanism.as_str());
        put("sasl.username", f("username"), &s.username);
        put("sasl.password", f("password"), s.password.expose());
    }
    Ok(out)
}

/// The raw properties (`raw`, as `(name, value)`) that a typed setting also sets, each as
/// `(property, typed setting)`: refuse them, naming both.
pub fn conflicts<'a>(raw: impl IntoIterator<Item = &'a str>, typed: &[TypedProperty]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for k in raw {
        if let Some((_, field, _)) = typed.iter().find(|(p, _, _)| p.eq_ignore_ascii_case(k)) {
            out.push((k.to_string(), field.clone()));
        }
    }
    out
}

/// Whether a librdkafka property holds a secret (its value must never be printed).
pub fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("password") || n.contains("secret") || n.ends_with(".pem") && n.contains("key")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(tls: &TlsSettings, sasl: Option<&KafkaSasl>) -> Vec<(&'static str, String)> {
        security_properties(tls, "kafka.tls", sasl, "kafka.sasl").unwrap().into_iter().map(|(k, _, v)| (k, v)).collect()
    }

    #[test]
    fn maps_to_librdkafka() {
        assert!(props(&TlsSettings::default(), None).is_empty());
        let tls = TlsSettings {
            ca_file: Some("/ca.pem".into()),
            client_cert_file: Some("/c.pem".into()),
            client_key_file: Some("/k.pem".into()),
            ..Default::default()
        };
        let sasl = KafkaSasl { mechanism: SaslMechanism::ScramSha512, username: "binval".into(), password: Secret::new("pw") };
        let p = props(&tls, Some(&sasl));
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(get("ssl.ca.location"), Some("/ca.pem"));
        assert_eq!(get("ssl.certificate.location"), Some("/c.pem"));
        assert_eq!(get("ssl.key.location"), Some("/k.pem"));
        assert_eq!(get("enable.ssl.certificate.verification"), Some("true"));
        assert_eq!(get("ssl.endpoint.identification.algorithm"), Some("https"));
        assert_eq!(
            (get("sasl.mechanisms"), get("sasl.username"), get("sasl.password")),
            (Some("SCRAM-SHA-512"), Some("binval"), Some("pw"))
        );
        let p = props(&TlsSettings { mode: Some(TlsMode::VerifyCa), ..Default::default() }, None);
        assert_eq!(p[0], ("security.protocol", "SSL".into()));
        assert!(p.contains(&("ssl.endpoint.identification.algorithm", "none".into())));
        let p = props(&TlsSettings { mode: Some(TlsMode::Required), ..Default::default() }, None);
        assert!(p.contains(&("enable.ssl.certificate.verification", "false".into())));
        let plain = KafkaSasl { mechanism: SaslMechanism::Plain, username: "u".into(), password: Secret::new("p") };
        assert_eq!(props(&TlsSettings::default(), Some(&plain))[0], ("security.protocol", "SASL_PLAINTEXT".into()));
        let e = security_properties(&TlsSettings { server_name: Some("k".into()), ..Default::default() }, "kafka.tls", None, "kafka.sasl")
            .unwrap_err();
        assert_eq!(e.field, "kafka.tls.server_name");
    }

    #[test]
    fn raw_properties_that_typed_settings_set_are_conflicts() {
        let tls = TlsSettings { ca_file: Some("/ca.pem".into()), ..Default::default() };
        let typed = security_properties(&tls, "kafka.tls", None, "kafka.sasl").unwrap();
        let c = conflicts(["linger.ms", "SSL.CA.LOCATION", "ssl.cipher.suites"], &typed);
        assert_eq!(c, vec![("SSL.CA.LOCATION".to_string(), "kafka.tls.ca_file".to_string())]);
        assert!(is_secret_property("sasl.password") && is_secret_property("ssl.key.password") && !is_secret_property("linger.ms"));
    }
}
