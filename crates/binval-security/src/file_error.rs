//! [`FileError`]: why a secret, certificate or key file cannot be used, and
//! [`UnknownValue`]: a word that is none of a setting's values. Both name what was given
//! (a path, never a file's content) and are wrapped in a [`FieldError`](crate::FieldError)
//! naming the setting.

use std::path::PathBuf;

/// Why a file named by a setting cannot be used (`*.password_file`, `tls.ca_file`,
/// `tls.client_cert_file`, `tls.client_key_file`).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read (missing, no permission).
    #[error("cannot read `{}`: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A secret file holds nothing but a line break (an empty password is almost always a
    /// mistake in the mount).
    #[error("`{}` is empty", .path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A CA or certificate file that does not parse as PEM.
    #[error("`{}` is not PEM certificates: {source}", .path.display())]
    NotCertificates {
        /// The file.
        path: PathBuf,
        /// What the PEM reader (rustls-pki-types) said.
        source: rustls::pki_types::pem::Error,
    },
    /// A CA or certificate file without any `-----BEGIN CERTIFICATE-----` block.
    #[error("`{}` holds no PEM certificate (-----BEGIN CERTIFICATE-----)", .path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// An encrypted private key: binval reads unencrypted PEM keys only.
    #[error("`{}` is an encrypted key: binval reads unencrypted PEM keys (protect the file instead)", .path.display())]
    EncryptedKey {
        /// The file.
        path: PathBuf,
    },
    /// A key file without a PKCS#8, PKCS#1 or SEC1 private key.
    #[error("`{}` holds no PEM private key: {source}", .path.display())]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM reader (rustls-pki-types) said.
        source: rustls::pki_types::pem::Error,
    },
}

/// A word that is none of a setting's values (`tls.mode`, `sasl.mechanism`): the text given
/// and the values accepted, e.g. ``\`verify\`: use disabled, required, verify-ca or verify-identity``.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}`: use {accepted}")]
pub struct UnknownValue {
    /// The text given.
    pub given: String,
    /// The accepted values, as a sentence.
    pub accepted: &'static str,
}
