//! TLS to the server, as libpq's URL parameters ask: `sslmode` (`disable`,
//! `prefer`, `require`, `verify-ca`, `verify-full`) and `sslrootcert=PATH`
//! (the PEM file of the CA certificates to trust), with rustls and its
//! ring provider (no system OpenSSL).
//!
//! - No `sslmode`: a plain connection, as before TLS was supported (libpq
//!   would try TLS first; ask for it with `sslmode=prefer` or stronger).
//! - `prefer` and `require` encrypt without authenticating the server
//!   (anyone on the path can present a certificate), as in libpq;
//!   `require` with `sslrootcert` checks the chain, as libpq does.
//! - `verify-ca` checks that the server's certificate chains to a CA of
//!   `sslrootcert`; `verify-full` also checks that it names the host
//!   connected to (a DNS name or an IP address of its subjectAltName). Both
//!   need `sslrootcert`: there is no default file and no system store.

use crate::error::Field;
use crate::error::{Error, Result};
use postgres::config::SslMode as DriverMode;
use postgres::Config;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS if the server offers it, without authenticating the server.
    Prefer,
    /// TLS or no connection, without authenticating the server (unless
    /// `sslrootcert` is given: then as `VerifyCa`).
    Require,
    /// TLS, the server's certificate signed by a CA of `sslrootcert`.
    VerifyCa,
    /// As `VerifyCa`, and the certificate names the host.
    VerifyFull,
}

impl SslMode {
    /// The mode a URL parameter names.
    pub fn parse(value: &str) -> Result<SslMode> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(Error::invalid(
                    Field::Sslmode,
                    format!(
                        "{value:?}: expected disable, prefer, require, verify-ca or verify-full"
                    ),
                ))
            }
        })
    }

    /// Its name in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The TLS parameters of a URL.
#[derive(Debug, Clone, Default)]
pub(super) struct TlsParams {
    /// `sslmode`, if given.
    pub mode: Option<SslMode>,
    /// `sslrootcert`, if given.
    pub root_cert: Option<PathBuf>,
}

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Not at all (only that the server holds its key).
    Nothing,
    /// Its chain, not the name in it.
    Chain,
    /// Its chain and its name.
    Full,
}

/// Set the driver's mode in `config` and make the TLS connector the
/// parameters ask for (`None`: a plain connection).
pub(super) fn configure(
    params: &TlsParams,
    config: &mut Config,
) -> Result<Option<MakeRustlsConnect>> {
    let (mode, check) = match (params.mode, &params.root_cert) {
        (None, None) => return Ok(None),
        (Some(SslMode::Disable), None) => {
            config.ssl_mode(DriverMode::Disable);
            return Ok(None);
        }
        (Some(SslMode::Prefer), None) => (DriverMode::Prefer, Check::Nothing),
        (Some(SslMode::Require), None) => (DriverMode::Require, Check::Nothing),
        (Some(SslMode::Require | SslMode::VerifyCa), Some(_)) => (DriverMode::Require, Check::Chain),
        (Some(SslMode::VerifyFull), Some(_)) => (DriverMode::Require, Check::Full),
        (Some(mode @ (SslMode::VerifyCa | SslMode::VerifyFull)), None) => {
            return Err(Error::invalid(
                Field::Sslrootcert,
                format!(
                    "sslmode={} needs sslrootcert=PATH: the PEM file of the CA that signed the server's certificate",
                    mode.as_str()
                ),
            ))
        }
        (mode, Some(_)) => {
            let given = mode.map_or("no sslmode was given".to_owned(), |m| {
                format!("not with sslmode={}", m.as_str())
            });
            return Err(Error::invalid(
                Field::Sslrootcert,
                format!("is used only with sslmode=require, verify-ca or verify-full ({given})"),
            ));
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match (check, &params.root_cert) {
        (Check::Nothing, _) | (_, None) => Arc::new(AnyCertificate(provider.clone())),
        (check, Some(path)) => {
            let roots = Arc::new(load_roots(path)?);
            let full = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| {
                    Error::invalid(Field::Sslrootcert, format!("{}: {e}", path.display()))
                })?;
            if check == Check::Full {
                full
            } else {
                Arc::new(ChainOnly(full))
            }
        }
    };
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid(Field::Sslmode, format!("no TLS version to offer: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.ssl_mode(mode);
    Ok(Some(MakeRustlsConnect::new(tls)))
}

/// The CA certificates of a PEM file; an error names the file and what is
/// wrong with it.
fn load_roots(path: &Path) -> Result<RootCertStore> {
    let bad = |reason: String| {
        Error::invalid(Field::Sslrootcert, format!("{}: {reason}", path.display()))
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not a PEM certificate file ({e})")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("a certificate that cannot be a trust anchor ({e})")))?;
    }
    if roots.is_empty() {
        return Err(bad("holds no PEM certificate".to_owned()));
    }
    Ok(roots)
}

/// `sslmode=prefer` or `require` without `sslrootcert`: any certificate
/// (libpq's meaning), but the handshake's signatures are still checked
/// against it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the full check, less the name (which the full
/// check compares only once the chain is verified).
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The TLS error inside a driver error, if the handshake failed on one
/// (a certificate refused, no common protocol): retrying will not help.
pub(super) fn tls_failure(e: &postgres::Error) -> Option<&rustls::Error> {
    let source = std::error::Error::source(e)?;
    let io = source.downcast_ref::<std::io::Error>()?;
    io.get_ref()?.downcast_ref::<rustls::Error>()
}

/// What a refused certificate means, in the words of the parameters.
pub(super) fn hint(e: &rustls::Error) -> Option<&'static str> {
    let rustls::Error::InvalidCertificate(cert) = e else {
        return None;
    };
    Some(match cert {
        CertificateError::UnknownIssuer => {
            "the server's certificate is not signed by a CA in sslrootcert"
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            "the server's certificate does not name the host connected to; sslmode=verify-full checks the name, verify-ca does not"
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "the server's certificate has expired"
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            "the server's certificate is not valid yet (is a clock wrong?)"
        }
        _ => return None,
    })
}
