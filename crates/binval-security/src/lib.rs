//! Secure connections, shared by the binval service and `binval-consumer` so the two sides
//! read the same settings the same way:
//!
//! * [`tls`]: the TLS modes (`disabled`, `required`, `verify-ca`, `verify-identity`, the names
//!   of MySQL's `--ssl-mode`) and the PEM files of a connection ([`TlsSettings`]), checked
//!   before anything connects, with errors naming the field.
//! * [`redis_tls`]: a Redis client (standalone or Cluster) over rustls with a CA file, a
//!   client certificate and an ACL user ([`RedisAuth`]); what a TLS or `AUTH` failure means,
//!   naming the setting to change ([`redis_tls::explain_failure`]).
//! * [`kafka`]: typed SSL and SASL settings mapped to librdkafka properties
//!   ([`kafka::security_properties`]), and the rule for raw properties that set the same
//!   thing ([`kafka::conflicts`]).
//! * [`secret`]: a password that never prints ([`Secret`]).
//! * [`checks`]: binval's config rules per service (one password per place, modes that fit
//!   the URLs, no raw Kafka property that a typed one sets), without reading files.
//! * [`redact`]: URLs with their password replaced by `***`, for every log line, error and
//!   metric label.
//!
//! rustls with the *ring* provider does the TLS of MySQL and Redis (no OpenSSL at run time);
//! Kafka's TLS is librdkafka's own (OpenSSL). [`install_crypto_provider`] makes ring the
//! process default once, so a rustls config built anywhere in the process finds it.

pub mod checks;
pub mod file_error;
pub mod kafka;
pub mod redact;
pub mod redis_tls;
pub mod secret;
pub mod tls;

pub use file_error::{FileError, UnknownValue};
pub use kafka::{KafkaSasl, SaslMechanism, SaslSettings};
pub use redact::{redact_text, redact_url, redact_urls};
pub use redis_tls::RedisAuth;
pub use secret::Secret;
pub use tls::{FieldError, TlsMode, TlsSettings};

/// Install rustls' *ring* provider as the process default, unless one is installed already
/// (an application linking `binval-consumer` may have chosen another). rustls needs a default
/// provider when a crate builds a `ClientConfig` without naming one (redis-rs does), and it
/// cannot pick one itself when more than one is compiled in.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err only when another thread installed one meanwhile: fine either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
