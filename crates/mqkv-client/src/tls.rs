//! TLS to the broker: the CA certificates the broker's certificate must chain to, and a client
//! certificate for brokers that ask for one.

use std::path::Path;
use std::sync::Arc;

use rumqttc::{TlsConfiguration, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{Error, Result};

/// How to reach the broker over TLS, for [`ClientOptions::tls`](crate::ClientOptions::tls).
/// The broker's certificate must name the host the client connects to (a DNS name, or an IP
/// address as a subject alternative name).
#[derive(Clone)]
pub struct TlsSettings {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings").finish_non_exhaustive()
    }
}

impl TlsSettings {
    /// Trusts the CA certificates in the PEM file `ca` (a private CA's, or the system's
    /// bundle such as `/etc/ssl/certs/ca-certificates.crt`), and presents the certificate
    /// chain and private key of the PEM files `client` to brokers that ask for one.
    pub fn from_files(ca: &Path, client: Option<(&Path, &Path)>) -> Result<TlsSettings> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca)? {
            roots
                .add(cert)
                .map_err(|e| invalid(ca, &format!("not a CA certificate: {e}")))?;
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| Error::InvalidArgument(e.to_string()))?
                .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| invalid(key, &format!("no private key in it: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| invalid(cert, &format!("certificate and key do not fit: {e}")))?
            }
        };
        Ok(TlsSettings::from_config(Arc::new(config)))
    }

    /// Settings made elsewhere: any rustls client configuration.
    pub fn from_config(config: Arc<ClientConfig>) -> TlsSettings {
        TlsSettings { config }
    }

    /// The transport for an MQTT client (rumqttc) that connects with these settings.
    pub fn transport(&self) -> Transport {
        Transport::tls_with_config(self.configuration())
    }

    /// The MQTT library's TLS settings.
    pub(crate) fn configuration(&self) -> TlsConfiguration {
        TlsConfiguration::Rustls(self.config.clone())
    }
}

fn invalid(path: &Path, reason: &str) -> Error {
    Error::InvalidArgument(format!("{}: {reason}", path.display()))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(path, &e.to_string()))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, &e.to_string()))?;
    if certs.is_empty() {
        return Err(invalid(path, "no certificate in it"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_do_not_hold_what_they_should_are_refused_with_their_name() {
        let dir = std::env::temp_dir().join(format!("mqkv-client-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").expect("write");
        let err = TlsSettings::from_files(&empty, None).expect_err("refused");
        assert!(
            err.to_string().contains("empty.pem: no certificate"),
            "{err}"
        );
        let missing = dir.join("missing.pem");
        let err = TlsSettings::from_files(&missing, None).expect_err("refused");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
