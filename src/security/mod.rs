//! Secure connections to the three services: TLS, authentication and secrets, in one place so
//! the rules read the same for each (the shared parts, also used by `binval-consumer`, are in
//! `crates/binval-security`).
//!
//! | module | what |
//! |---|---|
//! | [`mysql`] | the source connection's options: password, TLS mode and files (mysql_async over rustls); what a TLS or `REQUIRE SSL` refusal means; the TLS version and cipher of a connection |
//! | [`redis`] | Redis clients with TLS (`rediss://`, rustls) and an ACL user; failures that name the setting |
//! | [`kafka`] | the librdkafka configuration (typed SSL/SASL settings + raw properties) and a client context that keeps the last broker error, so a handshake or SASL failure is a definite error naming the setting instead of a timeout retried forever |
//! | [`probe`] | a TLS handshake with the same settings, for `binval check`: protocol version and cipher |
//! | [`grants`] | the MySQL privileges each command needs, checked against `SHOW GRANTS` |
//!
//! Secrets: every password can be given inline (`password`, best through the environment:
//! `BINVAL__SOURCE__PASSWORD`, `BINVAL__REDIS__PASSWORD`, `BINVAL__KAFKA__SASL__PASSWORD`) or
//! as a file (`password_file`, read at every connect, so a rotated Kubernetes Secret is used
//! from the next reconnect on), never both, and not beside a password in the URL. Passwords
//! are held as [`Secret`] (prints `***`), and URLs go through [`crate::config::redact`]
//! before they reach a log line, an error, `check` output or a metric label.

pub mod grants;
pub mod kafka;
pub mod mysql;
pub mod probe;
pub mod redis;

use std::path::Path;

use binval_security::Secret;

use crate::error::Error;

/// The password of `section` (`source`, `redis`, `kafka.sasl`): inline or read from the file
/// (a config error naming `section.password_file` when it cannot be read), `None` when neither
/// is set.
pub fn password(inline: Option<&Secret>, file: Option<&Path>, section: &str) -> Result<Option<Secret>, Error> {
    match (inline, file) {
        (Some(p), _) => Ok(Some(p.clone())),
        (None, Some(f)) => Secret::from_file(f).map(Some).map_err(|r| Error::config(format!("{section}.password_file"), r.to_string())),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    const OK: &str = "[source]\nurl = \"mysql://binval@127.0.0.1:3306\"\nserver_id = 77\n[redis]\nmode = \"standalone\"\nurls = [\"redis://127.0.0.1:6379\"]\n[kafka]\nbrokers = \"127.0.0.1:9092\"\n";

    #[test]
    fn security_settings_are_checked_and_name_the_field() {
        // Keys go under the section's header, sub-tables at the end.
        let with = |section: &str, extra: &str| {
            let text = if extra.starts_with('[') { format!("{OK}{extra}\n") } else { OK.replace(section, &format!("{section}\n{extra}")) };
            crate::config::Config::from_toml(&text)
        };
        let c = with("[kafka]", "[kafka.tls]\nca_file = \"/not/read/at/load.pem\"\n[kafka.sasl]\nmechanism = \"SCRAM-SHA-512\"\nusername = \"b\"\npassword_file = \"/x\"").unwrap();
        assert_eq!(c.kafka.tls.effective_mode(), binval_security::TlsMode::VerifyIdentity);
        let e = crate::config::Config::from_toml(&OK.replace("binval@", "binval:pw@").replace("[source]", "[source]\npassword = \"p\""))
            .unwrap_err();
        assert!(e.to_string().contains("source.url") && !e.to_string().contains(":pw@"), "{e}");
        for (section, extra, field) in [
            ("[source]", "password = \"p\"\npassword_file = \"/p\"", "source.password_file"),
            ("[source]", "[source.tls]\nmode = \"sometimes\"", "mode"),
            ("[source]", "[source.tls]\nclient_cert_file = \"/c.pem\"", "source.tls.client_key_file"),
            ("[redis]", "username = \"u\"", "redis.password"),
            ("[redis]", "[redis.tls]\nmode = \"verify-ca\"", "redis.urls"),
            ("[redis]", "[redis.tls]\nserver_name = \"r\"", "redis.tls.server_name"),
            ("[kafka]", "[kafka.sasl]\nmechanism = \"PLAIN\"\nusername = \"b\"", "kafka.sasl.password"),
            ("[kafka]", "[kafka.sasl]\nmechanism = \"GSSAPI\"\nusername = \"b\"\npassword = \"p\"", "mechanism"),
            (
                "[kafka]",
                "[kafka.tls]\nmode = \"required\"\n[kafka.properties]\n\"security.protocol\" = \"SSL\"",
                "kafka.properties.\"security.protocol\"",
            ),
        ] {
            let e = with(section, extra).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }
}
