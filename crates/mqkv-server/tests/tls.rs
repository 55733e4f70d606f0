//! rumqttc over TLS and mutual TLS against an in-process server: publish and subscribe at every
//! QoS, a state store request and its answer, and a client whose certificate the server does
//! not trust. Certificates are made by the test (rcgen).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mqkv_server::{ListenerConfig, ListenerKind, Server, ServerConfig, StorageKind};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use rumqttc::{TlsConfiguration, Transport};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const TIMEOUT: Duration = Duration::from_secs(20);

/// A CA and what it signed, in memory and as files.
struct Pki {
    ca: CertificateDer<'static>,
    client: (CertificateDer<'static>, PrivateKeyDer<'static>),
    stranger: (CertificateDer<'static>, PrivateKeyDer<'static>),
}

fn ca(name: &str) -> (Issuer<'static, KeyPair>, CertificateDer<'static>, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("CA certificate");
    let der = cert.der().clone();
    (Issuer::new(params, key), der, cert.pem())
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    cn: &str,
    sans: &[&str],
) -> (
    CertificateDer<'static>,
    PrivateKeyDer<'static>,
    String,
    String,
) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("params");
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params.distinguished_name.push(DnType::CommonName, cn);
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, issuer).expect("certificate");
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.der().clone(), der, cert.pem(), key.serialize_pem())
}

/// Writes a CA, a server certificate and key into `dir`; returns what clients use.
fn make_pki(dir: &Path) -> Pki {
    let (issuer, ca_der, ca_pem) = ca("tls test CA");
    let (_, _, server_pem, server_key) = leaf(&issuer, "localhost", &["localhost"]);
    std::fs::write(dir.join("ca.pem"), ca_pem).expect("write");
    std::fs::write(dir.join("server.pem"), server_pem).expect("write");
    std::fs::write(dir.join("server.key"), server_key).expect("write");
    let (cert, key, _, _) = leaf(&issuer, "device-1", &[]);
    let (other, _, _) = ca("another CA");
    let (scert, skey, _, _) = leaf(&other, "device-1", &[]);
    Pki {
        ca: ca_der,
        client: (cert, key),
        stranger: (scert, skey),
    }
}

async fn start(dir: &Path, require_client_cert: bool) -> (Server, SocketAddr) {
    let config = ServerConfig {
        storage: StorageKind::Memory,
        listen: vec![],
        listeners: vec![ListenerConfig {
            kind: ListenerKind::Tls,
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            cert: Some(dir.join("server.pem")),
            key: Some(dir.join("server.key")),
            client_ca: Some(dir.join("ca.pem")),
            require_client_cert: Some(require_client_cert),
            crl: None,
            min_version: None,
            path: None,
            allowed_origins: None,
            proxy_protocol: false,
            forwarded_header: None,
            proxy_from: None,
        }],
        workers: Some(2),
        ..ServerConfig::default()
    };
    let server = Server::start(config).await.expect("server starts");
    let addr = server.endpoints[0].addr;
    (server, addr)
}

fn client(
    addr: SocketAddr,
    id: &str,
    pki: &Pki,
    identity: Option<&(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> (AsyncClient, EventLoop) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).expect("CA");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    let mut options = MqttOptions::new(id, "localhost", addr.port());
    options.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(
        Arc::new(config),
    )));
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(Some(1 << 20));
    AsyncClient::new(options, 64)
}

/// Polls the event loop until `want` picks something out of an incoming packet.
async fn until<T>(events: &mut EventLoop, mut want: impl FnMut(&Packet) -> Option<T>) -> T {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(p)) => {
                    if let Some(t) = want(&p) {
                        return t;
                    }
                }
                Ok(Event::Outgoing(_)) => {}
                Err(e) => panic!("connection failed: {e}"),
            }
        }
    })
    .await
    .expect("in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_over_mutual_tls_publishes_subscribes_and_asks_the_state_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let (server, addr) = start(dir.path(), true).await;
    let (c, mut events) = client(addr, "rumqttc-tls", &pki, Some(&pki.client));
    until(&mut events, |p| {
        matches!(p, Packet::ConnAck(_)).then_some(())
    })
    .await;

    c.subscribe("tls/#", QoS::ExactlyOnce)
        .await
        .expect("subscribe");
    until(&mut events, |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let payload = vec![qos as u8; 70_000];
        c.publish(format!("tls/{}", qos as u8), qos, false, payload.clone())
            .await
            .expect("publish");
        let got = until(&mut events, |p| match p {
            Packet::Publish(m) => Some(m.payload.clone()),
            _ => None,
        })
        .await;
        assert_eq!(got, Bytes::from(payload));
    }

    // A state store SET and GET (RESP3 in MQTT 5 request and response).
    let response = "clients/rumqttc-tls/statestore/response";
    c.subscribe(response, QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    until(&mut events, |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;
    for (n, request) in [
        &b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n"[..],
        &b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"[..],
    ]
    .into_iter()
    .enumerate()
    {
        let properties = PublishProperties {
            response_topic: Some(response.to_owned()),
            correlation_data: Some(Bytes::from(vec![n as u8; 16])),
            user_properties: vec![("__ts".into(), format!("{:015}:00000:rumqttc", 0))],
            ..Default::default()
        };
        c.publish_with_properties(
            mqkv_protocol::REQUEST_TOPIC,
            QoS::AtLeastOnce,
            false,
            request.to_vec(),
            properties,
        )
        .await
        .expect("request");
        let answer = until(&mut events, |p| match p {
            Packet::Publish(m) if m.topic == response.as_bytes() => Some(m.payload.clone()),
            _ => None,
        })
        .await;
        let expected: &[u8] = if n == 0 { b"+OK\r\n" } else { b"$2\r\nv1\r\n" };
        assert_eq!(answer, Bytes::from_static(expected));
    }
    c.disconnect().await.expect("disconnect");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_from_another_ca_is_refused_and_others_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = make_pki(dir.path());
    let (server, addr) = start(dir.path(), true).await;
    for identity in [None, Some(&pki.stranger)] {
        let (_c, mut events) = client(addr, "refused", &pki, identity);
        let refused = tokio::time::timeout(TIMEOUT, async {
            loop {
                match events.poll().await {
                    Err(e) => return e,
                    Ok(Event::Incoming(Packet::ConnAck(_))) => panic!("accepted"),
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("refused in time");
        // Refused in the handshake (TLS 1.2), or by an alert right after it (TLS 1.3).
        let said = format!("{refused:?}");
        assert!(
            matches!(refused, rumqttc::v5::ConnectionError::Tls(_)) || said.contains("Alert"),
            "{said}"
        );
    }
    let (c, mut events) = client(addr, "welcome", &pki, Some(&pki.client));
    until(&mut events, |p| {
        matches!(p, Packet::ConnAck(_)).then_some(())
    })
    .await;
    c.disconnect().await.expect("disconnect");
    server.shutdown().await;
}
