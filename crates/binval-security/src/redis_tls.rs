//! Redis clients over TLS (rustls) with an ACL user, for standalone Redis and Redis Cluster.
//!
//! TLS is on exactly when the URLs are `rediss://` (Redis docs, "TLS"; redis-rs takes the
//! scheme). [`TlsSettings`] adds the CA file, the client certificate and key (for
//! `tls-auth-clients yes`), and the mode: `verify-identity` (default) checks the certificate
//! against the URL's host (on a Cluster: against the address each node announces in `CLUSTER
//! SLOTS`, usually an IP: give the nodes certificates with that IP, or announce host names
//! with `cluster-announce-hostname` and `cluster-preferred-endpoint-type hostname`);
//! `verify-ca` checks the chain only; `required` checks nothing. redis-rs has no separate TLS
//! server name for its reconnecting clients, so `server_name` is refused here.
//!
//! [`RedisAuth`] is the ACL user (`AUTH username password`, Redis 6+; a password alone is the
//! `default` user). Credentials in the URL (`rediss://user:pw@host`) work too, but not both.

use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, TlsCertificates};

use crate::secret::Secret;
use crate::tls::{FieldError, TlsMode, TlsSettings};

/// The ACL user binval or the consumer authenticates as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisAuth {
    /// ACL user name; unset with a password = the `default` user.
    pub username: Option<String>,
    /// The user's password.
    pub password: Option<Secret>,
}

/// The mode in force for `urls` with `tls`: `disabled` for `redis://`, the mode set (default
/// `verify-identity`) for `rediss://`. Errors (naming `section.mode` or `urls_field`) when the
/// URLs mix schemes, or a mode other than `disabled` is set for `redis://` URLs and the other
/// way round, or a server name is set.
pub fn effective_mode<S: AsRef<str>>(urls: &[S], tls: &TlsSettings, section: &str, urls_field: &str) -> Result<TlsMode, FieldError> {
    let tls_urls = urls.iter().filter(|u| u.as_ref().starts_with("rediss://")).count();
    if tls_urls != 0 && tls_urls != urls.len() {
        return Err(FieldError::new(urls_field, "mixes redis:// and rediss:// URLs: use rediss:// for every node of a TLS deployment"));
    }
    if tls.server_name.is_some() {
        return Err(FieldError::new(
            format!("{section}.server_name"),
            "is not supported for Redis: the certificate is checked against each URL's host (on a Cluster, each node's announced address); use a host name the certificate names, or mode = \"verify-ca\"",
        ));
    }
    let tls_on = tls_urls > 0;
    match (tls_on, tls.mode) {
        (true, None) => Ok(TlsMode::VerifyIdentity),
        (true, Some(TlsMode::Disabled)) => Err(FieldError::new(
            format!("{section}.mode"),
            "is \"disabled\" but the URLs are rediss:// (TLS): use redis:// URLs or another mode",
        )),
        (false, Some(m)) if m.encrypted() => Err(FieldError::new(
            urls_field,
            format!("{section}.mode is \"{}\": the URLs must be rediss:// (TLS), not redis://", m.as_str()),
        )),
        (false, _) if tls.ca_file.is_some() || tls.client_cert_file.is_some() => {
            Err(FieldError::new(urls_field, format!("{section} files are set: the URLs must be rediss:// (TLS), not redis://")))
        }
        (true, Some(m)) => Ok(m),
        (false, _) => Ok(TlsMode::Disabled),
    }
}

/// The certificates redis-rs takes (`None` when neither a CA file nor a client identity is
/// set: then the system trust store is used).
fn certificates(tls: &TlsSettings, section: &str) -> Result<Option<TlsCertificates>, FieldError> {
    tls.check_files(section)?;
    let root_cert = tls.ca_pem(section)?;
    let client_tls = tls.client_identity_pem(section)?.map(|(client_cert, client_key)| redis::ClientTlsConfig { client_cert, client_key });
    Ok((root_cert.is_some() || client_tls.is_some()).then_some(TlsCertificates { client_tls, root_cert }))
}

/// A client for one server (`url`), with the TLS settings and credentials applied. `section`
/// (`redis.tls`) and `urls_field` (`redis.urls[0]`) name the settings in errors.
pub fn standalone_client(
    url: &str,
    tls: &TlsSettings,
    auth: &RedisAuth,
    section: &str,
    urls_field: &str,
) -> Result<redis::Client, FieldError> {
    let mode = effective_mode(&[url], tls, section, urls_field)?;
    let bad_url = |e: RedisError| FieldError::new(urls_field, format!("`{}`: {e}", crate::redact_url(url)));
    let mut info = url.into_connection_info().map_err(bad_url)?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &auth.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &auth.password {
        settings = settings.set_password(p.expose());
    }
    info = info.set_redis_settings(settings);
    if !mode.encrypted() {
        return redis::Client::open(info).map_err(bad_url);
    }
    let client = match certificates(tls, section)? {
        Some(certs) => redis::Client::build_with_tls(info, certs).map_err(|e| FieldError::new(section, e.to_string()))?,
        None => redis::Client::open(info).map_err(bad_url)?,
    };
    let mut info = client.get_connection_info().clone();
    let mut addr = info.addr().clone();
    match mode {
        TlsMode::VerifyCa => addr.set_danger_accept_invalid_hostnames(true),
        TlsMode::Required => {
            if let ConnectionAddr::TcpTls { insecure, .. } = &mut addr {
                *insecure = true;
            }
        }
        _ => {}
    }
    info = info.set_addr(addr);
    redis::Client::open(info).map_err(bad_url)
}

/// A Cluster client builder for the seed `urls`, with the TLS settings (applied to every node
/// the client discovers) and credentials. Timeouts and retries are the caller's.
pub fn cluster_builder(
    urls: &[String],
    tls: &TlsSettings,
    auth: &RedisAuth,
    section: &str,
    urls_field: &str,
) -> Result<ClusterClientBuilder, FieldError> {
    let mode = effective_mode(urls, tls, section, urls_field)?;
    let seeds: Vec<String> = match mode {
        // redis-rs takes `#insecure` on a rediss:// URL for "no verification".
        TlsMode::Required => urls.iter().map(|u| if u.contains('#') { u.clone() } else { format!("{u}#insecure") }).collect(),
        _ => urls.to_vec(),
    };
    let mut b = ClusterClientBuilder::new(seeds);
    if let Some(u) = &auth.username {
        b = b.username(u);
    }
    if let Some(p) = &auth.password {
        b = b.password(p.expose());
    }
    if mode.encrypted() {
        b = b.tls(if mode == TlsMode::Required { redis::cluster::TlsMode::Insecure } else { redis::cluster::TlsMode::Secure });
        if let Some(certs) = certificates(tls, section)? {
            b = b.certs(certs);
        }
        if mode == TlsMode::VerifyCa {
            b = b.danger_accept_invalid_hostnames(true);
        }
    }
    Ok(b)
}

/// What a failed connection means for the operator, when it is a TLS or authentication
/// problem retrying cannot fix: `Some` naming the setting to change (`section.ca_file`,
/// `section.client_cert_file`, `section.mode`, or the credentials `auth_field`), `None` for
/// anything else (a server down: retry).
pub fn explain_failure(e: &RedisError, section: &str, auth_field: &str) -> Option<FieldError> {
    let text = e.to_string();
    if let Some(f) = crate::tls::explain_tls_failure(&text, section) {
        return Some(f);
    }
    let auth = e.kind() == redis::ErrorKind::AuthenticationFailed
        || ["WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "invalid username-password"].iter().any(|c| text.contains(c));
    auth.then(|| {
        FieldError::new(auth_field, format!("Redis refused the user, its password or a command its ACL rules do not allow ({text}); the rules binval needs are in the README (\"Least privilege\")"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_modes_must_agree() {
        let none = TlsSettings::default();
        assert_eq!(effective_mode(&["rediss://h:1"], &none, "redis.tls", "redis.urls").unwrap(), TlsMode::VerifyIdentity);
        assert_eq!(effective_mode(&["redis://h:1"], &none, "redis.tls", "redis.urls").unwrap(), TlsMode::Disabled);
        let e = effective_mode(&["redis://h:1", "rediss://h:2"], &none, "redis.tls", "redis.urls").unwrap_err();
        assert_eq!(e.field, "redis.urls");
        let ca = TlsSettings { mode: Some(TlsMode::VerifyCa), ..Default::default() };
        assert_eq!(effective_mode(&["redis://h:1"], &ca, "redis.tls", "redis.urls").unwrap_err().field, "redis.urls");
        assert_eq!(effective_mode(&["rediss://h:1"], &ca, "redis.tls", "redis.urls").unwrap(), TlsMode::VerifyCa);
        let off = TlsSettings { mode: Some(TlsMode::Disabled), ..Default::default() };
        assert_eq!(effective_mode(&["rediss://h:1"], &off, "redis.tls", "redis.urls").unwrap_err().field, "redis.tls.mode");
        let sn = TlsSettings { server_name: Some("x".into()), ..Default::default() };
        assert_eq!(effective_mode(&["rediss://h:1"], &sn, "redis.tls", "redis.urls").unwrap_err().field, "redis.tls.server_name");
    }

    #[test]
    fn clients_carry_credentials_and_tls() {
        let auth = RedisAuth { username: Some("binval".into()), password: Some(Secret::new("pw")) };
        let c = standalone_client("rediss://127.0.0.1:6390", &TlsSettings::default(), &auth, "redis.tls", "redis.urls[0]").unwrap();
        let info = c.get_connection_info();
        assert_eq!((info.redis_settings().username(), info.redis_settings().password()), (Some("binval"), Some("pw")));
        assert!(matches!(info.addr(), ConnectionAddr::TcpTls { insecure: false, .. }));
        let req = TlsSettings { mode: Some(TlsMode::Required), ..Default::default() };
        let c = standalone_client("rediss://127.0.0.1:6390", &req, &RedisAuth::default(), "redis.tls", "redis.urls[0]").unwrap();
        assert!(matches!(c.get_connection_info().addr(), ConnectionAddr::TcpTls { insecure: true, .. }));
        let e = standalone_client("redis://h:1", &req, &auth, "redis.tls", "redis.urls[0]").unwrap_err();
        assert_eq!(e.field, "redis.urls[0]");
    }
}
