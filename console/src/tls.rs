//! TLS to PostgreSQL, through rustls. The URL's `sslmode` decides whether it is used:
//! `prefer` (the default) uses it when the server offers it, `require` refuses a server without
//! it, `disable` never asks. Without `--database-ca` the server's certificate is not checked, as
//! libpq does for `prefer` and `require` (the link is encrypted, not authenticated); with it, the
//! certificate must chain to that CA and name the host connected to (libpq's `verify-full`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The TLS connector of every connection the console makes.
pub fn connector(ca_file: Option<&str>) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let config = match ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("--database-ca {path}: {e}"))?;
            let mut roots = RootCertStore::empty();
            let mut found = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(|e| format!("--database-ca {path}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("--database-ca {path}: {e}"))?;
                found += 1;
            }
            if found == 0 {
                return Err(format!(
                    "--database-ca {path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)"
                ));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// Accepts the server's certificate unchecked (libpq's `sslmode=require`), but still checks the
/// handshake's signatures with it.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
