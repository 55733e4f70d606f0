//! Links between nodes over mutual TLS: encrypted on the wire, and only between holders of a
//! certificate of the cluster's CA that names the address dialled.

use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::link_tls::LinkTls;
use crate::types::NodeId;
use crate::wire::{accept, connect, Credentials, FrameReader, FrameWriter, LinkError};

type Ca = (Issuer<'static, KeyPair>, CertificateDer<'static>);

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (Issuer::new(params, key), cert.der().clone())
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Fixed TLS settings: a node certificate for `names`, issued by `issuer`, trusting `trusted`.
#[derive(Debug)]
struct Fixed {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl LinkTls for Fixed {
    fn server(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    fn client(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}

fn node(issuer: &Ca, trusted: &Ca, names: &[&str]) -> Credentials {
    let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
        .expect("params");
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer.0).expect("certificate");
    let chain = vec![cert.der().clone()];
    let private = || PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut roots = RootCertStore::empty();
    roots.add(trusted.1.clone()).expect("CA");
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .expect("verifier");
    let server = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), private())
        .expect("server settings");
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, private())
        .expect("client settings");
    Credentials {
        secret: Arc::from(&b"s"[..]),
        tls: Some(Arc::new(Fixed {
            server: Arc::new(server),
            client: Arc::new(client),
        })),
    }
}

fn plain() -> Credentials {
    Credentials {
        secret: Arc::from(&b"s"[..]),
        tls: None,
    }
}

type Side = Result<(FrameReader, FrameWriter, NodeId), LinkError>;

/// Node 1 (`client`) opens a link to node 2 (`server`) through a relay that keeps a copy of
/// every byte either way.
async fn link(client: Credentials, server: Credentials) -> (Side, Side, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.expect("accept");
        accept(stream, &server, 2).await
    });
    let relay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let relay_addr = relay.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let copy = seen.clone();
    tokio::spawn(async move {
        let (outside, _) = relay.accept().await.expect("accept");
        let inside = TcpStream::connect(addr).await.expect("connect");
        let (mut or, mut ow) = outside.into_split();
        let (mut ir, mut iw) = inside.into_split();
        let up = copy.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = or.read(&mut buf).await {
                up.lock().expect("lock").extend_from_slice(&buf[..n]);
                if iw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = ir.read(&mut buf).await {
            copy.lock().expect("lock").extend_from_slice(&buf[..n]);
            if ow.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let stream = TcpStream::connect(relay_addr).await.expect("connect");
    let opened = connect(stream, &client, 1, &relay_addr.to_string()).await;
    (opened, accepted.await.expect("server task"), seen)
}

const VALUE: &[u8] = b"the value written to key sensor-7";

/// Sends [`VALUE`] each way over an open link.
async fn exchange(client: Side, server: Side) {
    let (mut cr, mut cw, server_id) = client.expect("client side");
    let (mut sr, mut sw, client_id) = server.expect("server side");
    assert_eq!((server_id, client_id), (2, 1));
    cw.write(VALUE).await.expect("write");
    cw.flush().await.expect("flush");
    assert_eq!(sr.read().await.expect("read").as_deref(), Some(VALUE));
    sw.write(VALUE).await.expect("write");
    sw.flush().await.expect("flush");
    assert_eq!(cr.read().await.expect("read").as_deref(), Some(VALUE));
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn frames_between_nodes_of_one_ca_are_encrypted_on_the_wire() {
    let cluster = ca("cluster CA");
    let (client, server, seen) = link(
        node(&cluster, &cluster, &["127.0.0.1"]),
        node(&cluster, &cluster, &["127.0.0.1"]),
    )
    .await;
    exchange(client, server).await;
    let seen = seen.lock().expect("lock").clone();
    assert!(seen.len() > 2 * VALUE.len(), "the relay saw the traffic");
    assert!(!contains(&seen, VALUE), "the value crossed in the clear");
    assert!(
        !contains(&seen, b"MQKVCL01"),
        "the handshake crossed in the clear"
    );
    // Without TLS the same exchange is readable on the wire: the relay does see it.
    let (client, server, seen) = link(plain(), plain()).await;
    exchange(client, server).await;
    assert!(contains(&seen.lock().expect("lock"), VALUE));
}

#[tokio::test]
async fn a_node_whose_certificate_another_ca_issued_is_refused_both_ways() {
    let cluster = ca("cluster CA");
    let other = ca("another CA");
    // The accepting node refuses a client certificate of another CA.
    let (client, server, _) = link(
        node(&other, &cluster, &["127.0.0.1"]),
        node(&cluster, &cluster, &["127.0.0.1"]),
    )
    .await;
    assert!(
        matches!(server, Err(LinkError::Tls(_))),
        "{:?}",
        server.err()
    );
    assert!(client.is_err());
    // The dialling node refuses a server certificate of another CA.
    let (client, server, _) = link(
        node(&cluster, &cluster, &["127.0.0.1"]),
        node(&other, &cluster, &["127.0.0.1"]),
    )
    .await;
    let why = client.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("certificate"), "{why}");
    assert!(server.is_err());
}

#[tokio::test]
async fn a_certificate_that_does_not_name_the_address_dialled_is_refused() {
    let cluster = ca("cluster CA");
    let (client, _, _) = link(
        node(&cluster, &cluster, &["127.0.0.1"]),
        node(&cluster, &cluster, &["node-9.cluster.example"]),
    )
    .await;
    let why = client.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("certificate"), "{why}");
}

#[tokio::test]
async fn a_node_without_tls_and_a_node_with_it_do_not_link() {
    let cluster = ca("cluster CA");
    // Each side says which of the two lacks the settings.
    let (client, server, _) = link(plain(), node(&cluster, &cluster, &["127.0.0.1"])).await;
    let why = server.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("other node has no TLS settings"), "{why}");
    assert!(
        matches!(client, Err(LinkError::PeerUsesTls | LinkError::Io(_))),
        "{:?}",
        client.err()
    );
    let (client, server, _) = link(node(&cluster, &cluster, &["127.0.0.1"]), plain()).await;
    assert!(
        matches!(server, Err(LinkError::PeerUsesTls)),
        "{:?}",
        server.err()
    );
    let why = client.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("TLS"), "{why}");
}

#[tokio::test]
async fn a_client_that_presents_no_certificate_is_refused() {
    let cluster = ca("cluster CA");
    let server = node(&cluster, &cluster, &["127.0.0.1"]);
    let mut roots = RootCertStore::empty();
    roots.add(cluster.1.clone()).expect("CA");
    let anonymous = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = Credentials {
        secret: Arc::from(&b"s"[..]),
        tls: Some(Arc::new(Fixed {
            server: server.tls.as_ref().expect("tls").server(),
            client: Arc::new(anonymous),
        })),
    };
    let (client, server, _) = link(client, server).await;
    assert!(
        matches!(server, Err(LinkError::Tls(_))),
        "{:?}",
        server.err()
    );
    assert!(client.is_err());
}
