//! The source connection's security: the password (from the config, the environment or a
//! file), TLS through mysql_async's rustls (`[source.tls]`), and what the server's refusals
//! mean.
//!
//! TLS modes map to mysql_async's `SslOpts` (MySQL reference manual, `--ssl-mode`):
//!
//! | `source.tls.mode` | mysql_async |
//! |---|---|
//! | unset, no files | plaintext (`disabled`) |
//! | `disabled` | no `SslOpts`: plaintext (a server with `require_secure_transport=ON`, or a user `REQUIRE SSL`, refuses it) |
//! | `required` | TLS, the certificate is not checked (`danger_accept_invalid_certs`) |
//! | `verify-ca` | TLS, chain checked against `ca_file`, name not (`danger_skip_domain_validation`) |
//! | `verify-identity` (default with files) | chain and name checked: the URL's host, or `server_name` |
//!
//! TLS is set in `[source.tls]` only: mysql_async's own TLS parameters of the URL
//! (`require_ssl`, `verify_ca`, `verify_identity`, `built_in_roots`) are refused
//! ([`url_tls_param`]), naming the parameter and the `[source.tls]` setting that does it, so a
//! URL never decides alone (and unseen by `binval check`'s report) whether the connection is
//! encrypted.
//!
//! With `ca_file` set only that CA is trusted (the built-in Mozilla roots are off); without it,
//! the built-in roots. A server without TLS is refused in every mode but `disabled` (mysql_async
//! does not fall back to plaintext).

use mysql_async::prelude::Queryable;
use mysql_async::{ClientIdentity, Conn, Opts, OptsBuilder, SslOpts};

use binval_security::TlsMode;

use crate::config::SourceConfig;
use crate::error::{classify_mysql, DefiniteError, Error};

/// The connection options of `source.url`. The host and port of the URL are what binval
/// connects to: mysql_async would otherwise (`prefer_socket`, on by default) ask a server on
/// the same machine for its `@@socket` and switch to that Unix socket, bypassing a proxy or a
/// firewall rule on the TCP port (and TLS: mysql_async does not secure a socket). A URL may
/// still ask for it (`?prefer_socket=true`) or name a socket (`?socket=/path`).
///
/// Errors: a URL mysql_async cannot read (a config error naming `source.url`; the error shows
/// the URL without its password).
pub fn url_opts(url: &str) -> Result<Opts, Error> {
    if let Some(reason) = url_tls_param(url) {
        return Err(Error::config("source.url", reason));
    }
    let opts = Opts::from_url(url).map_err(|e| Error::config("source.url", binval_security::redact_text(&e.to_string())))?;
    let asked = url.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv.split('=').next() == Some("prefer_socket")));
    if asked {
        return Ok(opts);
    }
    Ok(OptsBuilder::from_opts(opts).prefer_socket(false).into())
}

/// mysql_async's TLS parameters of a URL (`?require_ssl=true`...), which binval refuses:
/// `[source.tls]` is where the source's TLS is set (module docs).
pub const URL_TLS_PARAMS: [&str; 4] = ["require_ssl", "verify_ca", "verify_identity", "built_in_roots"];

/// Why `url` is refused, if it has one of [`URL_TLS_PARAMS`]: names the first such parameter
/// and the `[source.tls]` mode that does what the URL's parameters ask.
pub fn url_tls_param(url: &str) -> Option<String> {
    let query = url.split_once('?')?.1.split('#').next().unwrap_or_default();
    let params: Vec<(&str, &str)> = query.split('&').map(|kv| kv.split_once('=').unwrap_or((kv, ""))).collect();
    let (name, value) = params.iter().find(|(k, _)| URL_TLS_PARAMS.contains(k))?;
    let off = |k: &str| params.iter().any(|(n, v)| *n == k && v.eq_ignore_ascii_case("false"));
    let on = params.iter().any(|(n, v)| *n == "require_ssl" && v.eq_ignore_ascii_case("true"));
    let mode = match (on, off("verify_ca"), off("verify_identity")) {
        (false, _, _) => "disabled",
        (true, true, _) => "required",
        (true, false, true) => "verify-ca",
        (true, false, false) => "verify-identity",
    };
    Some(format!(
        "has the TLS parameter `{name}={value}`; binval takes the source's TLS from [source.tls] only: remove the TLS parameters from the URL and set [source.tls] mode = \"{mode}\" (with ca_file for a private CA; built_in_roots=false is ca_file alone)"
    ))
}

/// The connection options of the source: `source.url` ([`url_opts`]) with
/// `source.password(_file)` and `[source.tls]`. Errors: config errors naming the field.
pub fn opts(cfg: &SourceConfig) -> Result<Opts, Error> {
    cfg.tls.check_files("source.tls").map_err(|f| Error::config(f.field, f.reason))?;
    let base = url_opts(&cfg.url)?;
    let mut b = OptsBuilder::from_opts(base);
    if let Some(pw) = super::password(cfg.password.as_ref(), cfg.password_file.as_deref(), "source")? {
        b = b.pass(Some(pw.expose()));
    }
    let mode = cfg.tls.effective_mode();
    if cfg.tls.mode.is_some() || mode.encrypted() {
        b = b.ssl_opts(ssl_opts(cfg, mode));
    }
    Ok(b.into())
}

fn ssl_opts(cfg: &SourceConfig, mode: TlsMode) -> Option<SslOpts> {
    if !mode.encrypted() {
        return None;
    }
    let t = &cfg.tls;
    let mut s = SslOpts::default();
    if let Some(ca) = &t.ca_file {
        s = s.with_root_certs(vec![ca.clone().into()]).with_disable_built_in_roots(true);
    }
    if let (Some(c), Some(k)) = (&t.client_cert_file, &t.client_key_file) {
        s = s.with_client_identity(Some(ClientIdentity::new(c.clone().into(), k.clone().into())));
    }
    if let Some(n) = &t.server_name {
        s = s.with_danger_tls_hostname_override(Some(n.clone()));
    }
    match mode {
        TlsMode::VerifyCa => s = s.with_danger_skip_domain_validation(true),
        TlsMode::Required => s = s.with_danger_accept_invalid_certs(true).with_danger_skip_domain_validation(true),
        _ => {}
    }
    Some(s)
}

/// Connect to the source with [`opts`]. A TLS failure or a refusal that retrying cannot fix
/// is a definite error naming the setting; other failures per [`classify_mysql`].
pub async fn connect(cfg: &SourceConfig) -> Result<Conn, Error> {
    Conn::new(opts(cfg)?).await.map_err(|e| connect_error(e, cfg))
}

/// See [`connect`].
pub fn connect_error(e: mysql_async::Error, cfg: &SourceConfig) -> Error {
    let text = e.to_string();
    let mode = cfg.tls.effective_mode();
    if let Some(f) = binval_security::tls::explain_tls_failure(&text, "source.tls") {
        crate::telemetry::error_classified("source", true);
        return Error::config(f.field, f.reason);
    }
    if let mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) = &e {
        crate::telemetry::error_classified("source", true);
        return Error::config(
            "source.tls.mode",
            format!("is \"{}\" but the server does not offer TLS (start it with --ssl-cert/--ssl-key)", mode.as_str()),
        );
    }
    if let mysql_async::Error::Server(se) = &e {
        // ER_SECURE_TRANSPORT_REQUIRED (MySQL 3159, MariaDB 4116? varies): the server refuses
        // plaintext; ER_ACCESS_DENIED_ERROR (1045) over plaintext: the user may be REQUIRE SSL.
        let insecure = se.message.contains("insecure transport") || se.message.contains("secure transport");
        if insecure || (se.code == 1045 && !mode.encrypted()) {
            crate::telemetry::error_classified("source", true);
            let hint = if insecure {
                "the server requires TLS (require_secure_transport=ON)"
            } else {
                "the user may be REQUIRE SSL (or the password is wrong)"
            };
            return DefiniteError::SourceRefused(format!(
                "{} ({hint}): binval connected without TLS; set [source.tls] mode = \"verify-identity\" (with ca_file) or another mode",
                se.message
            ))
            .into();
        }
    }
    classify_mysql(e, "connect")
}

/// The TLS of an open connection as the server sees it (`SHOW SESSION STATUS LIKE
/// 'Ssl_version'` / `'Ssl_cipher'`, MySQL and MariaDB): `Some((version, cipher))`, or `None`
/// for plaintext.
pub async fn session_tls(conn: &mut Conn) -> Result<Option<(String, String)>, Error> {
    let rows: Vec<(String, String)> = conn
        .query("SHOW SESSION STATUS WHERE Variable_name IN ('Ssl_version', 'Ssl_cipher')")
        .await
        .map_err(|e| classify_mysql(e, "SHOW SESSION STATUS"))?;
    let get = |n: &str| rows.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.clone()).unwrap_or_default();
    let (version, cipher) = (get("Ssl_version"), get("Ssl_cipher"));
    Ok((!version.is_empty()).then_some((version, cipher)))
}
