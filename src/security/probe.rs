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

/// Why a TLS handshake of `binval check` failed; the text is the handshake's own.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A CA, certificate or key file cannot be used.
    #[error(transparent)]
    File(#[from] binval_security::FileError),
    /// A certificate of the CA file is refused by the root store.
    #[error("{}: {source}", .path.display())]
    BadCa { path: std::path::PathBuf, source: rustls::Error },
    /// The certificate verifier cannot be built (no usable root).
    #[error("{0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
    /// The client certificate and key do not form an identity.
    #[error("client certificate: {0}")]
    ClientCertificate(rustls::Error),
    /// `tls.server_name`, or the host, is not a DNS name or IP address.
    #[error("`{name}` is not a DNS name or IP address: {source}")]
    ServerName { name: String, source: rustls::pki_types::InvalidDnsNameError },
    /// The TCP connection was refused or failed.
    #[error("connect to {host}:{port}: {source}")]
    Connect { host: String, port: u16, source: std::io::Error },
    /// The handshake failed (a certificate the mode refuses, a server that does not speak TLS).
    #[error("{0}")]
    Handshake(std::io::Error),
    /// No handshake within the timeout.
    #[error("no TLS handshake with {host}:{port} within {timeout:?}")]
    Timeout { host: String, port: u16, timeout: Duration },
}

/// Handshake with `host:port` as `mode` and `tls` say (the certificate is checked against
/// `host`, or `tls.server_name`), within `timeout`. Errors are the handshake's own text (a
/// certificate the mode refuses, a server that does not speak TLS, a refused connection).
pub async fn probe(host: &str, port: u16, tls: &TlsSettings, mode: TlsMode, timeout: Duration) -> Result<TlsReport, ProbeError> {
    binval_security::install_crypto_provider();
    let config = client_config(tls, mode)?;
    let name = tls.server_name.as_deref().unwrap_or(host).trim_start_matches('[').trim_end_matches(']').to_string();
    let server_name = ServerName::try_from(name.clone()).map_err(|source| ProbeError::ServerName { name: name.clone(), source })?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|source| ProbeError::Connect {
            host: host.to_string(),
            port,
            source,
        })?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(server_name, tcp).await.map_err(ProbeError::Handshake)?;
        let (_, conn) = stream.get_ref();
        let version = match conn.protocol_version() {
            Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3".to_string(),
            Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2".to_string(),
            other => format!("{other:?}"),
        };
        let cipher = conn.negotiated_cipher_suite().map(|c| format!("{:?}", c.suite())).unwrap_or_default();
        Ok(TlsReport { version, cipher })
    };
    tokio::time::timeout(timeout, connect).await.map_err(|_| ProbeError::Timeout { host: host.to_string(), port, timeout })?
}

fn client_config(tls: &TlsSettings, mode: TlsMode) -> Result<ClientConfig, ProbeError> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            for c in binval_security::tls::read_certificates(ca)? {
                roots.add(c).map_err(|source| ProbeError::BadCa { path: ca.clone(), source })?;
            }
        }
        None => {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        }
    }
    let webpki = WebPkiServerVerifier::builder(Arc::new(roots)).build()?;
    let verifier = Arc::new(ModeVerifier { inner: webpki, mode });
    let builder = ClientConfig::builder().dangerous().with_custom_certificate_verifier(verifier);
    match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(c), Some(k)) => builder
            .with_client_auth_cert(binval_security::tls::read_certificates(c)?, binval_security::tls::read_key(k)?)
            .map_err(ProbeError::ClientCertificate),
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
