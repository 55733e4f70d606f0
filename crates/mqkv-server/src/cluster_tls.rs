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

#[cfg(test)]
mod tests {
    use super::*;
    use mqkv_raft::LinkTls;
    use mqkv_testkit::pki::TestCa;
    use rustls::pki_types::ServerName;

    /// Runs a TLS handshake in memory; the first error either side raises.
    fn handshake(
        client: Arc<ClientConfig>,
        server: Arc<rustls::ServerConfig>,
    ) -> Result<(), rustls::Error> {
        let name = ServerName::try_from("127.0.0.1").expect("a name");
        let mut c = rustls::ClientConnection::new(client, name)?;
        let mut s = rustls::ServerConnection::new(server)?;
        for _ in 0..10 {
            let mut bytes = Vec::new();
            c.write_tls(&mut bytes).expect("to memory");
            s.read_tls(&mut &bytes[..]).expect("from memory");
            s.process_new_packets()?;
            let mut bytes = Vec::new();
            s.write_tls(&mut bytes).expect("to memory");
            c.read_tls(&mut &bytes[..]).expect("from memory");
            c.process_new_packets()?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return Ok(());
            }
        }
        Err(rustls::Error::General(
            "the handshake did not finish".into(),
        ))
    }

    #[test]
    fn nodes_of_the_cluster_ca_link_and_others_are_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let cluster = TestCa::new(dir.path(), "cluster-ca");
        let other = TestCa::new(dir.path(), "other-ca");
        let load = |(cert, key): (PathBuf, PathBuf)| {
            ClusterTls::load(&cert, &key, &cluster.cert).expect("loads")
        };
        let a = load(cluster.issue(dir.path(), "a"));
        let b = load(cluster.issue(dir.path(), "b"));
        handshake(a.client(), b.server()).expect("two nodes of the cluster's CA");
        // A certificate of another CA, from a node that trusts the cluster's CA: its links are
        // refused by the accepting node.
        let stranger = load(other.issue(dir.path(), "stranger"));
        let refused = handshake(stranger.client(), b.server()).expect_err("refused");
        assert!(
            matches!(refused, rustls::Error::InvalidCertificate(_)),
            "{refused:?}"
        );
        // No certificate at all: refused too.
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&cluster.cert).expect("CA") {
            roots.add(cert).expect("CA");
        }
        let anonymous =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        assert!(handshake(Arc::new(anonymous), b.server()).is_err());
    }

    #[test]
    fn a_reload_takes_new_files_and_a_failed_one_keeps_both_old_settings() {
        let dir = tempfile::tempdir().expect("a directory");
        let cluster = TestCa::new(dir.path(), "cluster-ca");
        let other = TestCa::new(dir.path(), "other-ca");
        let (cert, key) = cluster.issue(dir.path(), "a");
        let a = ClusterTls::load(&cert, &key, &cluster.cert).expect("loads");
        let b = ClusterTls::load(&cert, &key, &cluster.cert).expect("loads");
        // A certificate and key that do not fit: refused, and both sides stay as they were.
        let (_, other_key) = cluster.issue(dir.path(), "unrelated");
        std::fs::copy(&other_key, &key).expect("copy");
        assert!(a.reload().expect_err("no fit").contains("do not fit"));
        handshake(a.client(), b.server()).expect("the old settings, both ways");
        handshake(b.client(), a.server()).expect("the old settings, both ways");
        // Files of another CA's certificate, consistent: taken, for new links both ways.
        let (stranger_cert, stranger_key) = other.issue(dir.path(), "renewed");
        std::fs::copy(&stranger_cert, &cert).expect("copy");
        std::fs::copy(&stranger_key, &key).expect("copy");
        a.reload().expect("reloads");
        assert!(
            handshake(a.client(), b.server()).is_err(),
            "a's new client certificate"
        );
        assert!(
            handshake(b.client(), a.server()).is_err(),
            "a's new server certificate"
        );
    }
}
