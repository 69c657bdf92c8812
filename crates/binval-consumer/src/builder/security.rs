//! Options of secure connections: TLS and the ACL user for Redis, SSL and SASL for Kafka. The
//! settings types and their rules are `binval-security`'s, shared with the binval service, so
//! an app instance and binval read the same TLS files the same way.

use binval_security::{KafkaSasl, RedisAuth, Secret, TlsSettings};

use super::ConsumerBuilder;
use crate::error::ConsumerError;

/// # Security: TLS, users and passwords
///
/// Redis: TLS is on when the URLs are `rediss://`; [`ConsumerBuilder::redis_tls`] adds the CA
/// file, a client certificate and the mode, [`ConsumerBuilder::redis_user`] the ACL user.
/// Kafka: [`ConsumerBuilder::kafka_tls`] and [`ConsumerBuilder::kafka_sasl`] set librdkafka's
/// `security.protocol`, `ssl.*` and `sasl.*` properties (a [`ConsumerBuilder::kafka_property`]
/// naming one of those is refused). Passwords are held as [`Secret`]: they never appear in
/// `Debug` output, errors or metric labels.
impl ConsumerBuilder {
    /// TLS settings for the Redis connections (the URLs must be `rediss://`): CA file, client
    /// certificate and key (for `tls-auth-clients yes`), mode (`verify-identity` by default;
    /// `verify-ca` for Cluster nodes that announce IPs their certificates do not name).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// use binval_consumer::{TlsMode, TlsSettings};
    /// let b = b.redis_cluster(["rediss://10.0.0.1:6380"]).redis_tls(TlsSettings {
    ///     mode: Some(TlsMode::VerifyIdentity),
    ///     ca_file: Some("/etc/app/tls/redis-ca.pem".into()),
    ///     ..Default::default()
    /// });
    /// ```
    pub fn redis_tls(mut self, tls: TlsSettings) -> Self {
        self.redis_tls = tls;
        self
    }

    /// The Redis ACL user and its password (`AUTH username password`, Redis 6+; `None` user =
    /// the `default` user). Read the password from a file with
    /// [`Secret::from_file`] (e.g. a mounted Kubernetes
    /// Secret).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// use binval_consumer::Secret;
    /// let b = b.redis_user(Some("app"), Secret::new("s3cret"));
    /// ```
    pub fn redis_user(mut self, username: Option<&str>, password: Secret) -> Self {
        self.redis_auth = RedisAuth { username: username.map(String::from), password: Some(password) };
        self
    }

    /// SSL to the Kafka brokers (`security.protocol` `SSL`, or `SASL_SSL` with
    /// [`ConsumerBuilder::kafka_sasl`]; `ssl.ca.location`, `ssl.certificate.location`,
    /// `ssl.key.location`, and the verification of the mode).
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// use binval_consumer::TlsSettings;
    /// let b = b.kafka_tls(TlsSettings { ca_file: Some("/etc/app/tls/kafka-ca.pem".into()), ..Default::default() });
    /// ```
    pub fn kafka_tls(mut self, tls: TlsSettings) -> Self {
        self.kafka_tls = tls;
        self
    }

    /// SASL authentication to the Kafka brokers: `PLAIN` (over TLS only), `SCRAM-SHA-256` or
    /// `SCRAM-SHA-512`.
    ///
    /// ```no_run
    /// # let b = binval_consumer::Consumer::builder();
    /// use binval_consumer::{KafkaSasl, SaslMechanism, Secret};
    /// let b = b.kafka_sasl(KafkaSasl { mechanism: SaslMechanism::ScramSha512, username: "app".into(), password: Secret::new("s3cret") });
    /// ```
    pub fn kafka_sasl(mut self, sasl: KafkaSasl) -> Self {
        self.kafka_sasl = Some(sasl);
        self
    }

    /// The librdkafka properties of the typed Kafka settings, checked against the raw ones.
    pub(super) fn kafka_security_properties(&self) -> Result<Vec<(String, String)>, ConsumerError> {
        let typed = binval_security::kafka::security_properties(&self.kafka_tls, "kafka_tls", self.kafka_sasl.as_ref(), "kafka_sasl")
            .map_err(|f| ConsumerError::Config { field: "kafka_tls", reason: f.to_string() })?;
        if let Some((raw, typed_by)) =
            binval_security::kafka::conflicts(self.kafka_properties.iter().map(|(k, _)| k.as_str()), &typed).into_iter().next()
        {
            return Err(ConsumerError::Config {
                field: "kafka_property",
                reason: format!("`{raw}` is also set by {typed_by}: keep one of the two"),
            });
        }
        Ok(typed.into_iter().map(|(k, _, v)| (k.to_string(), v)).collect())
    }

    /// A Kafka failure of `build()` with TLS or SASL in use, said so: librdkafka reports a
    /// refused handshake or authentication only in its log, the request itself just times out.
    pub(super) fn explain_kafka_failure(&self, e: ConsumerError) -> ConsumerError {
        match e {
            ConsumerError::Kafka { op, source } if self.kafka_tls.effective_mode().encrypted() || self.kafka_sasl.is_some() => ConsumerError::Kafka {
                op: format!("{op} (with kafka_tls / kafka_sasl: a CA that did not sign the broker's certificate, a refused client certificate or refused credentials show here as this failure; librdkafka's log names the cause)"),
                source,
            },
            e => e,
        }
    }

    /// TLS files readable, schemes and modes that agree, typed Kafka settings without raw
    /// duplicates.
    pub(super) fn validate_security(&self) -> Result<(), ConsumerError> {
        let cfg = |field, f: binval_security::FieldError| ConsumerError::Config { field, reason: f.to_string() };
        self.redis_tls.check_files("redis_tls").map_err(|f| cfg("redis_tls", f))?;
        if let Some(t) = &self.redis {
            binval_security::redis_tls::effective_mode(t.urls(), &self.redis_tls, "redis_tls", "redis urls")
                .map_err(|f| cfg("redis_tls", f))?;
        }
        self.kafka_tls.check_files("kafka_tls").map_err(|f| cfg("kafka_tls", f))?;
        self.kafka_security_properties().map(|_| ())
    }
}
