//! TLS for listeners: certificates and keys from PEM files, optional client certificates
//! verified against a CA bundle and certificate revocation lists, and reloading the files
//! while clients stay connected.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use super::socket::Socket;

/// Where a TLS listener's certificate, key and client CA bundle are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// The server's private key, PEM: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub key: PathBuf,
    /// CA certificates, PEM, that client certificates are verified against.
    pub client_ca: Option<PathBuf>,
    /// Refuse clients without a certificate the CA bundle vouches for. Without it, a client
    /// may connect without one, but a certificate it presents must still verify.
    pub require_client_cert: bool,
    /// Certificate revocation lists, PEM, from the CAs of the bundle: a client certificate
    /// one of them lists is refused, and so is one whose issuer has no list here.
    pub crl: Option<PathBuf>,
    /// The oldest TLS version a client may use.
    pub min_version: TlsVersion,
}

/// A TLS version, as configured: `"1.2"` or `"1.3"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TlsVersion {
    #[default]
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl std::str::FromStr for TlsVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<TlsVersion, String> {
        match s.trim() {
            "1.2" => Ok(TlsVersion::V1_2),
            "1.3" => Ok(TlsVersion::V1_3),
            other => Err(format!("TLS version {other:?}: give 1.2 or 1.3")),
        }
    }
}

/// Why TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("{0}")]
    Config(String),
}

/// A TLS listener's settings, current and reloadable.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<Loaded>,
}

/// What the files held when they were last read successfully.
#[derive(Debug)]
struct Loaded {
    config: Arc<ServerConfig>,
    /// When the server's own certificate stops being valid, in seconds since the Unix epoch.
    not_after: i64,
}

impl Loaded {
    fn read(files: &TlsFiles) -> Result<Loaded, TlsError> {
        let (config, not_after) = server_config(files)?;
        Ok(Loaded {
            config: Arc::new(config),
            not_after,
        })
    }
}

impl Tls {
    /// Reads and checks the files.
    pub fn load(files: TlsFiles) -> Result<Tls, TlsError> {
        let current = RwLock::new(Loaded::read(&files)?);
        Ok(Tls { files, current })
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Reads the files again; new connections use what they hold, connected clients keep
    /// their sessions. On failure the settings in use stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.current.write() = Loaded::read(&self.files)?;
        Ok(())
    }

    /// When the server certificate in use (the first of its chain) expires, in seconds since
    /// the Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.current.read().not_after
    }

    /// The rustls settings the files make, as last loaded: for TLS that is not an MQTT
    /// listener's (the links between cluster nodes).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current.read().config.clone()
    }

    /// Runs the server side of a TLS handshake.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> std::io::Result<TlsStream<Socket>> {
        let config = self.current.read().config.clone();
        tokio_rustls::TlsAcceptor::from(config)
            .accept(Socket::new(tcp))
            .await
    }
}

/// The versions of a listener that takes TLS 1.3 only.
static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every PEM section of one kind in the file at `path`: certificates, or revocation lists.
fn read_pem<T: PemObject>(path: &Path) -> Result<Vec<T>, TlsError> {
    let read = |e: rustls_pki_types::pem::Error| TlsError::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    T::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = read_pem(path)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let crls = read_pem(path)?;
    if crls.is_empty() {
        return Err(TlsError::Read {
            path: path.to_owned(),
            reason: "no certificate revocation list in it".into(),
        });
    }
    Ok(crls)
}

/// The configuration the files make, and when the server's certificate expires.
fn server_config(files: &TlsFiles) -> Result<(ServerConfig, i64), TlsError> {
    let chain = read_certs(&files.cert)?;
    let not_after = chain
        .first()
        .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .ok_or_else(|| TlsError::Read {
            path: files.cert.clone(),
            reason: "its first certificate does not parse".into(),
        })?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError::Read {
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(match files.min_version {
            TlsVersion::V1_2 => rustls::DEFAULT_VERSIONS,
            TlsVersion::V1_3 => TLS13_ONLY,
        })
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        None if files.require_client_cert => {
            return Err(TlsError::Config(
                "requiring client certificates needs a client CA bundle".into(),
            ))
        }
        None if files.crl.is_some() => {
            return Err(TlsError::Config(
                "revocation lists are for client certificates: they need a client CA bundle".into(),
            ))
        }
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs(ca)? {
                roots.add(cert).map_err(|e| TlsError::Read {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            if let Some(crl) = &files.crl {
                // The client's own certificate is checked, as OpenSSL's CRL check does; an
                // expired list still counts, so that a late update does not lock every client
                // out.
                verifier = verifier
                    .with_crls(read_crls(crl)?)
                    .only_check_end_entity_revocation();
            }
            let verifier = if files.require_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|e| match (e, &files.crl) {
                (rustls::server::VerifierBuilderError::InvalidCrl(e), Some(path)) => {
                    TlsError::Read {
                        path: path.clone(),
                        reason: format!(
                            "not a revocation list mqkv can use ({e:?}): a list must be \
                             version 2, with a next update time and the CRL number extension"
                        ),
                    }
                }
                (e, _) => TlsError::Config(e.to_string()),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("certificate and key do not fit: {e}")))?;
    // Session tickets let any number of clients resume a session (without the certificate
    // signature of a full handshake) where the session cache remembers only the last few
    // hundred. Each configuration gets a ticketer of its own: a ticket from listeners with
    // other TLS settings, or from before a reload, does not resume, so new certificates, CAs
    // and revocation lists apply to every new connection at once.
    config.ticketer =
        rustls::crypto::ring::Ticketer::new().map_err(|e| TlsError::Config(e.to_string()))?;
    Ok((config, not_after))
}

/// A client certificate that TLS verified: what authentication may identify the client by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The subject, as an RFC 4514 string (`CN=device-1,O=Contoso`).
    pub subject: String,
    /// The subject's common name, if it has one.
    pub common_name: Option<String>,
    /// Subject alternative names: DNS names, e-mail addresses, URIs and IP addresses.
    pub subject_alt_names: Vec<String>,
    /// The subjects of the certificates that vouch for it, nearest first: each presented
    /// certificate's issuer (the intermediates' subjects, then the root's).
    pub issuers: Vec<String>,
    /// The certificate, DER.
    pub der: Vec<u8>,
}

/// The verified client certificate of a finished handshake, if the client sent one.
pub(crate) fn peer_certificate(conn: &ServerConnection) -> Option<PeerCertificate> {
    PeerCertificate::from_chain(conn.peer_certificates()?)
}

impl PeerCertificate {
    /// What a certificate chain (DER, the client's own certificate first) says about the
    /// client; `None` when the chain is empty or its first certificate does not parse.
    /// Certificates further up that do not parse are left out of `issuers`.
    pub fn from_chain<C: AsRef<[u8]>>(chain: &[C]) -> Option<PeerCertificate> {
        let der = chain.first()?.as_ref();
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let common_name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let mut subject_alt_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            use x509_parser::extensions::GeneralName;
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(n) | GeneralName::RFC822Name(n) | GeneralName::URI(n) => {
                        subject_alt_names.push((*n).to_owned())
                    }
                    GeneralName::IPAddress(ip) => subject_alt_names.extend(ip_address(ip)),
                    _ => {}
                }
            }
        }
        let issuers = chain
            .iter()
            .filter_map(|der| x509_parser::parse_x509_certificate(der.as_ref()).ok())
            .map(|(_, c)| c.issuer().to_string())
            .collect();
        Some(PeerCertificate {
            subject: subject.to_string(),
            common_name,
            subject_alt_names,
            issuers,
            der: der.to_vec(),
        })
    }
}

/// An IP address subject alternative name (4 or 16 bytes) as text.
fn ip_address(ip: &[u8]) -> Option<String> {
    let ip = match ip.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(ip).ok()?),
        16 => std::net::IpAddr::from(<[u8; 16]>::try_from(ip).ok()?),
        _ => return None,
    };
    Some(ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};

    fn certificate(cn: &str, issuer: Option<(&CertificateParams, &KeyPair)>) -> Vec<u8> {
        let mut params =
            CertificateParams::new(vec!["device-1.example".to_owned()]).expect("parameters");
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Contoso");
        params.subject_alt_names.extend([
            SanType::IpAddress("10.1.2.3".parse().expect("ip")),
            SanType::IpAddress("fd00::1".parse().expect("ip")),
            SanType::Rfc822Name("ops@example.com".try_into().expect("e-mail")),
        ]);
        let key = KeyPair::generate().expect("key");
        let cert = match issuer {
            None => params.self_signed(&key),
            Some((ca, ca_key)) => {
                let issuer = rcgen::Issuer::from_params(ca, ca_key);
                params.signed_by(&key, &issuer)
            }
        };
        cert.expect("certificate").der().to_vec()
    }

    #[test]
    fn a_chain_gives_the_subject_its_names_and_the_issuers() {
        let mut ca = CertificateParams::new(Vec::new()).expect("parameters");
        ca.distinguished_name.push(DnType::CommonName, "Test CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().expect("key");
        let ca_der = ca.self_signed(&ca_key).expect("CA").der().to_vec();
        let leaf = certificate("device-1", Some((&ca, &ca_key)));
        let got = PeerCertificate::from_chain(&[leaf.clone(), ca_der]).expect("parsed");
        assert_eq!(got.common_name.as_deref(), Some("device-1"));
        assert!(got.subject.contains("CN=device-1"), "{}", got.subject);
        assert!(got.subject.contains("O=Contoso"), "{}", got.subject);
        assert_eq!(
            got.subject_alt_names,
            ["device-1.example", "10.1.2.3", "fd00::1", "ops@example.com"]
        );
        assert_eq!(got.issuers, ["CN=Test CA", "CN=Test CA"]);
        assert_eq!(got.der, leaf);
    }

    #[test]
    fn an_empty_or_unparsable_chain_identifies_nobody() {
        assert_eq!(PeerCertificate::from_chain::<Vec<u8>>(&[]), None);
        assert_eq!(PeerCertificate::from_chain(&[b"not a certificate"]), None);
        let leaf = certificate("device-2", None);
        let mut cut = leaf.clone();
        cut.truncate(leaf.len() / 2);
        assert_eq!(PeerCertificate::from_chain(&[cut]), None);
        // A broken certificate above the client's own is left out of the issuers.
        let got = PeerCertificate::from_chain(&[leaf, b"junk".to_vec()]).expect("parsed");
        assert_eq!(got.issuers.len(), 1);
    }
}
