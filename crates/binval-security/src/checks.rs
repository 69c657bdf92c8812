//! Checks of the security settings of binval's config, per service, without reading any file
//! (a config is checked where its secret and certificate files may not exist, e.g. in CI; the
//! files are read, with errors naming them, when binval connects). Errors name the field as
//! written in the config file.

use std::path::Path;

use crate::kafka::{conflicts, security_properties, KafkaSasl, SaslSettings};
use crate::secret::Secret;
use crate::tls::{FieldError, TlsSettings};

/// The password of a URL is set (`scheme://user:password@host`).
pub fn url_has_password(url: &str) -> bool {
    crate::redact_url(url) != url
}

/// A password is given in one place only: `section.password`, `section.password_file` or the
/// URL (`url_field`).
pub fn one_password(inline: bool, file: Option<&Path>, url_has: bool, section: &str, url_field: &str) -> Result<(), FieldError> {
    if inline && file.is_some() {
        return Err(FieldError::new(
            format!("{section}.password_file"),
            format!("and {section}.password are both set: give the password once"),
        ));
    }
    if url_has && (inline || file.is_some()) {
        return Err(FieldError::new(url_field, format!("has a password and {section}.password(_file) is set too: give the password once")));
    }
    Ok(())
}

/// `[source]`: one password, `[source.tls]`.
pub fn source(url: &str, password: Option<&Secret>, password_file: Option<&Path>, tls: &TlsSettings) -> Result<(), FieldError> {
    one_password(password.is_some(), password_file, url_has_password(url), "source", "source.url")?;
    tls.validate("source.tls")
}

/// `[redis]`: one password, a password with a user, `[redis.tls]` that fits the URLs.
pub fn redis(
    urls: &[String],
    username: Option<&str>,
    password: Option<&Secret>,
    password_file: Option<&Path>,
    tls: &TlsSettings,
) -> Result<(), FieldError> {
    one_password(password.is_some(), password_file, urls.iter().any(|u| url_has_password(u)), "redis", "redis.urls")?;
    if username.is_some() && password.is_none() && password_file.is_none() {
        return Err(FieldError::new("redis.password", "is needed with redis.username (or redis.password_file)"));
    }
    tls.validate("redis.tls")?;
    crate::redis_tls::effective_mode(urls, tls, "redis.tls", "redis.urls").map(|_| ())
}

/// `[kafka.tls]`, `[kafka.sasl]`, and no raw property (`raw`) that they also set.
pub fn kafka<'a>(tls: &TlsSettings, sasl: Option<&SaslSettings>, raw: impl IntoIterator<Item = &'a str>) -> Result<(), FieldError> {
    tls.validate("kafka.tls")?;
    let sasl = sasl
        .map(|s| {
            s.validate("kafka.sasl")?;
            Ok::<_, FieldError>(KafkaSasl { mechanism: s.mechanism, username: s.username.clone(), password: Secret::new("-") })
        })
        .transpose()?;
    let typed = security_properties(tls, "kafka.tls", sasl.as_ref(), "kafka.sasl")?;
    match conflicts(raw, &typed).into_iter().next() {
        Some((raw, field)) => {
            Err(FieldError::new(format!("kafka.properties.\"{raw}\""), format!("is also set by {field}: keep one of the two")))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::SaslMechanism;
    use crate::tls::TlsMode;

    #[test]
    fn each_rule_names_the_field() {
        let none = TlsSettings::default();
        let pw = Secret::new("x");
        assert_eq!(source("mysql://u:p@h:1", Some(&pw), None, &none).unwrap_err().field, "source.url");
        assert_eq!(source("mysql://u@h:1", Some(&pw), Some(Path::new("/f")), &none).unwrap_err().field, "source.password_file");
        assert!(source("mysql://u@h:1", None, Some(Path::new("/f")), &none).is_ok(), "the file is read at connect, not here");
        let urls = vec!["rediss://h:1".to_string()];
        assert_eq!(redis(&urls, Some("u"), None, None, &none).unwrap_err().field, "redis.password");
        assert!(redis(&urls, Some("u"), Some(&pw), None, &none).is_ok());
        let ca = TlsSettings { mode: Some(TlsMode::VerifyCa), ..Default::default() };
        assert_eq!(redis(&["redis://h:1".to_string()], None, None, None, &ca).unwrap_err().field, "redis.urls");
        let sasl = SaslSettings { mechanism: SaslMechanism::ScramSha256, username: "b".into(), password: None, password_file: None };
        assert_eq!(kafka(&none, Some(&sasl), []).unwrap_err().field, "kafka.sasl.password");
        let sasl = SaslSettings { password: Some(pw.clone()), ..sasl };
        assert!(kafka(&none, Some(&sasl), ["linger.ms"]).is_ok());
        let e = kafka(&none, Some(&sasl), ["sasl.username"]).unwrap_err();
        assert_eq!(e.field, "kafka.properties.\"sasl.username\"");
        assert!(e.reason.contains("kafka.sasl.username"), "{e}");
    }
}
