//! A TLS handshake with the settings of a connection, for `binval check`: which protocol
//! version and cipher suite the server agrees to, and that its certificate passes the mode's
//! checks. Used for Redis and Kafka, whose clients do not say what they negotiated (MySQL's
//! server does: `security::mysql::session_tls`). The probe uses rustls like the Redis client;
//! librdkafka uses OpenSSL, which may choose another cipher suite with the same server.

use std::sync::Arc;
use std::time::Duration;

use binval_security::{TlsMode, TlsSettings};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// What a handshake agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsReport {
    /// `TLSv1.3`, `TLSv1.2`.
    pub version: String,
    /// IANA name of the cipher suite, e.g. `TLS13_AES_256_GCM_SHA384`.
    pub cipher: String,
}

/// Handshake with `host:port` as `mode` and `tls` say (the certificate is checked against
/// `host`, or `tls.server_name`), within `timeout`. Errors are the handshake's own text (a
/// certificate the mode refuses, a server that does not speak TLS, a refused connection).
pub async fn probe(host: &str, port: u16, tls: &TlsSettings, mode: TlsMode, timeout: Duration) -> Result<TlsReport, String> {
    binval_security::install_crypto_provider();
    let config = client_config(tls, mode)?;
    let name = tls.server_name.as_deref().unwrap_or(host).trim_start_matches('[').trim_end_matches(']').to_string();
    let server_name = ServerName::try_from(name.clone()).map_err(|e| format!("`{name}` is not a DNS name or IP address: {e}"))?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("connect to {host}:{port}: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server_name, tcp).await.map_err(|e| e.to_string())?;
        let (_, conn) = stream.get_ref();
        let version = match conn.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
            other => format!("{other:?}"),
        };
        let cipher = conn.negotiated_cipher_suite().map(|c| format!("{:?}", c.suite())).unwrap_or_default();
        Ok(TlsReport { version, cipher })
    };
    tokio::time::timeout(timeout, connect).await.map_err(|_| format!("no TLS handshake with {host}:{port} within {timeout:?}"))?
}

fn client_config(tls: &TlsSettings, mode: TlsMode) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            for c in binval_security::tls::read_certificates(ca)? {
                roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
            }
        }
        None => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        }
    }
    let webpki = WebPkiServerVerifier::builder(Arc::new(roots)).build().map_err(|e| e.to_string())?;
    let verifier = Arc::new(ModeVerifier { inner: webpki, mode });
    let builder = ClientConfig::builder().dangerous().with_custom_certificate_verifier(verifier);
    match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(binval_security::tls::read_certificates(c)?, binval_security::tls::read_key(k)?)
            .map_err(|e| format!("client certificate: {e}")),
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// WebPKI verification as `mode` asks: all of it (`verify-identity`), all but the name
/// (`verify-ca`), none of the certificate (`required`; the handshake signatures are still
/// checked).
#[derive(Debug)]
struct ModeVerifier {
    inner: Arc<WebPkiServerVerifier>,
    mode: TlsMode,
}

impl ServerCertVerifier for ModeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match (self.mode, self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)) {
            (TlsMode::Required, _) => Ok(ServerCertVerified::assertion()),
            (
                TlsMode::VerifyCa,
                Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })),
            ) => Ok(ServerCertVerified::assertion()),
            (_, r) => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
