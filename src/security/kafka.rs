//! binval's librdkafka configuration: `kafka.brokers`, the typed `[kafka.tls]` and
//! `[kafka.sasl]` settings mapped to librdkafka properties (`binval_security::kafka`, shared
//! with the consumer; `kafka.properties` naming the same property is refused at config load),
//! and a client context that keeps the last error librdkafka reported.
//!
//! Why the context: librdkafka retries a failed TLS handshake or SASL exchange forever and
//! only reports it through its error callback; the call that waits (a metadata request) just
//! times out. Without the context, a wrong CA would look like a broker that is down and
//! `binval run` would retry forever. With it, a failed connect whose last broker error is a
//! TLS or SASL failure becomes a definite error naming the setting ([`SecurityContext::explain`]).

use std::sync::{Arc, Mutex};

use binval_security::FieldError;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::config::KafkaConfig;
use crate::error::Error;

/// `bootstrap.servers` and the typed security properties of `cfg` (callers add their own
/// defaults, then `kafka.properties`).
pub fn client_config(cfg: &KafkaConfig) -> Result<ClientConfig, Error> {
    cfg.tls.check_files("kafka.tls").map_err(|f| Error::config(f.field, f.reason))?;
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", &cfg.brokers);
    for (k, _, v) in typed_properties(cfg)? {
        cc.set(k, v);
    }
    Ok(cc)
}

/// The librdkafka properties `[kafka.tls]` and `[kafka.sasl]` set (the SASL password read).
pub fn typed_properties(cfg: &KafkaConfig) -> Result<Vec<binval_security::kafka::TypedProperty>, Error> {
    let sasl = cfg.sasl.as_ref().map(|s| s.resolve("kafka.sasl")).transpose().map_err(|f| Error::config(f.field, f.reason))?;
    binval_security::kafka::security_properties(&cfg.tls, "kafka.tls", sasl.as_ref(), "kafka.sasl")
        .map_err(|f| Error::config(f.field, f.reason))
}

/// A reported error: its code (`None` for a log line) and text.
type BrokerError = (Option<RDKafkaErrorCode>, String);

/// A librdkafka client context that logs each global error (as librdkafka's default does, but a
/// line repeated within a minute at debug level) and keeps the last one (but "all brokers
/// down", which only follows another) for
/// [`SecurityContext::explain`]. Clones share what they keep.
#[derive(Clone, Default)]
pub struct SecurityContext {
    last: Arc<Mutex<Option<BrokerError>>>,
    /// When each kind of log line (its text without digits) was last logged at its level: a
    /// broker that cannot be reached makes librdkafka repeat the same line every second per
    /// broker thread; it is logged once a minute, the repeats at debug.
    logged: Arc<Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

/// How long a repeated librdkafka log line stays at debug level.
const LOG_REPEAT_QUIET: std::time::Duration = std::time::Duration::from_secs(60);

impl SecurityContext {
    /// `true` when a line like this one (same facility, same text but for its digits) was
    /// logged at its own level less than [`LOG_REPEAT_QUIET`] ago.
    fn repeated(&self, fac: &str, message: &str) -> bool {
        let kind: String = fac.chars().chain(message.chars()).filter(|c| !c.is_ascii_digit()).collect();
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if logged.get(&kind).is_some_and(|t| now.duration_since(*t) < LOG_REPEAT_QUIET) {
            return true;
        }
        if logged.len() >= 1024 {
            logged.clear();
        }
        logged.insert(kind, now);
        false
    }
}

impl ClientContext for SecurityContext {
    /// librdkafka's log lines, as its default context logs them; a connection failure (`FAIL`)
    /// is also kept: some (a plaintext client at a TLS listener) reach no error callback.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        use RDKafkaLogLevel::*;
        let level = if !matches!(level, Debug) && self.repeated(fac, log_message) { Debug } else { level };
        match level {
            Emerg | Alert | Critical | Error => tracing::error!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
            Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
            Notice | Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
            Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}"),
        }
        if fac == "FAIL" {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((None, log_message.to_string()));
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if self.repeated("error", reason) {
            tracing::debug!(target: "librdkafka", error = %error, "librdkafka: {reason}");
        } else {
            tracing::warn!(target: "librdkafka", error = %error, "librdkafka: {reason}");
        }
        // Counted: a broker that stops answering shows in `binval_errors_total` too, not
        // only in the logs.
        crate::telemetry::error_classified("kafka", false);
        let code = error.rdkafka_error_code();
        // "n/m brokers are down" follows every failure and says nothing of its cause: keep
        // the error before it.
        if code != Some(RDKafkaErrorCode::AllBrokersDown) {
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((code, format!("{error}: {reason}")));
        }
    }
}

impl ConsumerContext for SecurityContext {}

impl SecurityContext {
    /// The last error librdkafka reported, as text, with a hint when it is a connection the
    /// broker closed before answering (a listener that expects TLS or SASL).
    pub fn last_error(&self) -> Option<String> {
        let text = self.last.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, t)| t.clone())?;
        Some(if text.contains("state APIVERSION_QUERY") {
            format!("{text}; the broker closed the connection before answering: does its listener expect TLS or SASL ([kafka.tls], [kafka.sasl])?")
        } else {
            text
        })
    }

    /// When the last reported error is a TLS or SASL failure retrying cannot fix: the setting
    /// to change and why (`kafka.tls.ca_file`, `kafka.sasl`, ...).
    pub fn explain(&self, cfg: &KafkaConfig) -> Option<FieldError> {
        let (code, text) = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        explain(code, &text, cfg)
    }
}

/// See [`SecurityContext::explain`].
pub fn explain(code: Option<RDKafkaErrorCode>, text: &str, cfg: &KafkaConfig) -> Option<FieldError> {
    if code == Some(RDKafkaErrorCode::Authentication)
        || code == Some(RDKafkaErrorCode::SaslAuthenticationFailed)
        || text.contains("SASL authentication")
    {
        let (field, who) = match &cfg.sasl {
            Some(s) => ("kafka.sasl", format!(" ({} as {})", s.mechanism.as_str(), s.username)),
            None => ("kafka.sasl (not set)", String::new()),
        };
        return Some(FieldError::new(
            field,
            format!("the broker refused binval's SASL authentication{who}: check the mechanism, user and password ({text})"),
        ));
    }
    if code == Some(RDKafkaErrorCode::SSL) || text.contains("SSL") {
        return Some(
            binval_security::tls::explain_tls_failure(text, "kafka.tls")
                .unwrap_or_else(|| FieldError::new("kafka.tls", format!("the TLS connection to the broker failed ({text})"))),
        );
    }
    if text.contains("security.protocol") || text.contains("connecting to a SSL listener") || text.contains("connecting to a SASL listener")
    {
        return Some(FieldError::new(
            "kafka.tls",
            format!("the broker's listener speaks another protocol (TLS or SASL) than binval's settings ({text}): set [kafka.tls] / [kafka.sasl] to match the listener"),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_errors_name_the_setting() {
        let cfg = crate::config::Config::from_toml(
            "[source]\nurl = \"mysql://u@h:1\"\nserver_id = 1\n[redis]\nmode = \"standalone\"\nurls = [\"redis://h:1\"]\n[kafka]\nbrokers = \"h:1\"\n",
        )
        .unwrap();
        let k = &cfg.kafka;
        let ssl = "ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified";
        assert_eq!(explain(Some(RDKafkaErrorCode::SSL), ssl, k).unwrap().field, "kafka.tls.ca_file");
        let sasl = "sasl_plaintext://h:1/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials";
        assert!(explain(Some(RDKafkaErrorCode::Authentication), sasl, k).unwrap().field.starts_with("kafka.sasl"));
        let proto = "h:1/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect security.protocol configuration (connecting to a SSL listener?)";
        assert_eq!(explain(Some(RDKafkaErrorCode::BrokerTransportFailure), proto, k).unwrap().field, "kafka.tls");
        assert!(explain(Some(RDKafkaErrorCode::AllBrokersDown), "1/1 brokers are down", k).is_none());
    }
}
