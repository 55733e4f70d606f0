//! TLS between the nodes of a cluster (`[cluster]` `tls_cert`, `tls_key`, `tls_ca`): each node
//! presents its certificate on every link, as the server of the links it accepts and as the
//! client of those it opens, and accepts only certificates the cluster's CA issued. The files
//! are read again on reload; links already open keep their sessions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mqkv_broker::{Tls, TlsFiles};
use parking_lot::RwLock;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The TLS settings of the links between the nodes.
#[derive(Debug)]
pub struct ClusterTls {
    /// This node as the server of a link: its certificate, and the CA clients must chain to.
    server: Tls,
    /// This node as the client of a link.
    client: RwLock<Arc<ClientConfig>>,
}

impl ClusterTls {
    /// Reads the node's certificate chain and key and the cluster's CA certificates (PEM).
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<ClusterTls, String> {
        let files = TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: Some(ca.to_owned()),
            require_client_cert: true,
            crl: None,
            // Every node is mqkv: nothing older is needed.
            min_version: mqkv_broker::transport::TlsVersion::V1_3,
        };
        let client = client_config(&files)?;
        let server = Tls::load(files).map_err(|e| e.to_string())?;
        Ok(ClusterTls {
            server,
            client: RwLock::new(Arc::new(client)),
        })
    }

    /// Reads the files again; new links use what they hold. On failure the settings in use
    /// stay, both of them.
    pub fn reload(&self) -> Result<(), String> {
        let client = client_config(self.server.files())?;
        self.server.reload().map_err(|e| e.to_string())?;
        *self.client.write() = Arc::new(client);
        Ok(())
    }

    /// The node's certificate, key, and the CA file.
    pub fn files(&self) -> Vec<PathBuf> {
        let f = self.server.files();
        [Some(&f.cert), Some(&f.key), f.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// When the node's certificate expires, in seconds since the Unix epoch.
    pub fn not_after(&self) -> i64 {
        self.server.not_after()
    }
}

impl mqkv_raft::LinkTls for ClusterTls {
    fn server(&self) -> Arc<rustls::ServerConfig> {
        self.server.server_config()
    }

    fn client(&self) -> Arc<ClientConfig> {
        self.client.read().clone()
    }
}

/// The client side: trusts the CA of `files.client_ca`, presents `files.cert`.
fn client_config(files: &TlsFiles) -> Result<ClientConfig, String> {
    let ca = files
        .client_ca
        .as_deref()
        .ok_or("the cluster's TLS needs a CA file")?;
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
    }
    let chain = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("cannot read {}: {e}", files.key.display()))?;
    ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("certificate and key do not fit: {e}"))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}
