//! Connections moving between threads (see `Conn::try_move`), and requests that reach a
//! connection whose client has gone quiet, with raw MQTT 5 clients.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::broker::Broker;
use crate::codec::{self, Packet, Properties, QoS, SubscriptionOptions};
use crate::config::BrokerConfig;

const LIMIT: Duration = Duration::from_secs(20);

/// A client's byte stream: plain TCP or TLS.
trait Duplex: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Duplex for T {}

/// How the test's clients reach the broker.
#[derive(Clone)]
enum Wire {
    Tcp,
    /// TLS, trusting the broker's self-signed certificate for `localhost`.
    Tls(tokio_rustls::TlsConnector),
}

struct Client {
    stream: Box<dyn Duplex>,
    buf: BytesMut,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr, id: &str) -> Client {
        Client::dial(addr, id, &Wire::Tcp).await
    }

    async fn dial(addr: std::net::SocketAddr, id: &str, wire: &Wire) -> Client {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let stream: Box<dyn Duplex> = match wire {
            Wire::Tcp => Box::new(tcp),
            Wire::Tls(connector) => {
                let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
                Box::new(connector.connect(name, tcp).await.expect("TLS handshake"))
            }
        };
        let mut c = Client {
            stream,
            buf: BytesMut::new(),
        };
        c.send(Packet::Connect(Box::new(codec::Connect::v5(id, 60))))
            .await;
        let (kind, _) = c.frame().await;
        assert_eq!(kind, 2, "CONNACK");
        c
    }

    async fn send(&mut self, p: Packet) {
        let mut out = BytesMut::new();
        p.encode(&mut out, codec::V5);
        self.stream.write_all(&out).await.expect("write");
        self.stream.flush().await.expect("flush");
    }

    async fn subscribe(&mut self, filter: &str, qos: QoS) {
        self.send(Packet::Subscribe(codec::Subscribe {
            packet_id: 1,
            properties: Properties::default(),
            filters: vec![(
                filter.to_owned(),
                SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            )],
        }))
        .await;
        let (kind, _) = self.frame().await;
        assert_eq!(kind, 9, "SUBACK");
    }

    /// The next packet's type and its whole bytes.
    async fn frame(&mut self) -> (u8, BytesMut) {
        tokio::time::timeout(LIMIT, async {
            loop {
                if let Some(len) = whole_frame(&self.buf) {
                    let frame = self.buf.split_to(len);
                    return (frame[0] >> 4, frame);
                }
                let n = self.stream.read_buf(&mut self.buf).await.expect("read");
                assert!(n > 0, "the broker closed the connection");
            }
        })
        .await
        .expect("a packet in time")
    }

    /// The payloads of the next `n` publishes, acknowledging those sent at QoS 1.
    async fn receive(&mut self, n: usize) -> Vec<u32> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            let (kind, mut frame) = self.frame().await;
            if kind != 3 {
                continue;
            }
            let Ok(Some(Packet::Publish(p))) =
                codec::decode(&mut frame, Some(codec::V5), usize::MAX)
            else {
                panic!("undecodable PUBLISH");
            };
            if p.qos == QoS::AtLeastOnce {
                self.send(Packet::PubAck(codec::Ack {
                    packet_id: p.packet_id,
                    ..Default::default()
                }))
                .await;
            }
            got.push(p.payload.clone().get_u32());
        }
        got
    }

    /// Publishes `seq` at QoS 1 in one write, then waits for every PUBACK.
    async fn publish_all(&mut self, topic: &str, seq: std::ops::Range<u32>) {
        let mut out = BytesMut::new();
        let count = seq.len();
        for (i, n) in seq.enumerate() {
            let mut payload = BytesMut::new();
            payload.put_u32(n);
            Packet::Publish(codec::Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: topic.to_owned(),
                packet_id: u16::try_from(i % 60_000 + 1).expect("id"),
                properties: Properties::default(),
                payload: payload.freeze(),
            })
            .encode(&mut out, codec::V5);
        }
        self.stream.write_all(&out).await.expect("write");
        self.stream.flush().await.expect("flush");
        let mut acked = 0;
        while acked < count {
            let (kind, _) = self.frame().await;
            if kind == 4 {
                acked += 1;
            }
        }
    }
}

/// The length of the whole packet at the front of `buf`, if it is all there.
fn whole_frame(buf: &[u8]) -> Option<usize> {
    let mut len = 0usize;
    for i in 0..4 {
        let b = *buf.get(1 + i)?;
        len |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            let total = 2 + i + len;
            return (buf.len() >= total).then_some(total);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_much_larger_than_the_first_read_room_arrive_whole() {
    let (_broker, addr) = broker(true).await;
    let mut sub = Client::connect(addr, "big-sub").await;
    sub.subscribe("big/#", QoS::AtLeastOnce).await;
    let mut publisher = Client::connect(addr, "big-pub").await;
    // In one write: a publish of 100 KiB, then 50 small ones, then another large one.
    let sizes: Vec<usize> = std::iter::once(100 * 1024)
        .chain(std::iter::repeat_n(20, 50))
        .chain(std::iter::once(60 * 1024))
        .collect();
    // Each payload differs from the others, so one delivered in place of another shows.
    let payload = |i: usize, size: usize| -> Vec<u8> {
        (0..size).map(|b| (b % 251) as u8 ^ i as u8).collect()
    };
    let mut out = BytesMut::new();
    for (i, &size) in sizes.iter().enumerate() {
        Packet::Publish(codec::Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: "big/t".to_owned(),
            packet_id: u16::try_from(i + 1).expect("id"),
            properties: Properties::default(),
            payload: payload(i, size).into(),
        })
        .encode(&mut out, codec::V5);
    }
    publisher.stream.write_all(&out).await.expect("write");
    for (i, &size) in sizes.iter().enumerate() {
        let (kind, mut frame) = sub.frame().await;
        assert_eq!(kind, 3, "PUBLISH {i}");
        let Ok(Some(Packet::Publish(p))) = codec::decode(&mut frame, Some(codec::V5), usize::MAX)
        else {
            panic!("undecodable PUBLISH {i}");
        };
        assert!(
            p.payload[..] == payload(i, size)[..],
            "payload {i} of {size} bytes"
        );
        sub.send(Packet::PubAck(codec::Ack {
            packet_id: p.packet_id,
            ..Default::default()
        }))
        .await;
    }
}

async fn broker(co_locate: bool) -> (Broker, std::net::SocketAddr) {
    let (broker, addr, _) = broker_over(co_locate, false).await;
    (broker, addr)
}

/// A broker on two connection threads, listening over plain TCP, or over TLS with a
/// certificate made here; and how its clients reach it.
async fn broker_over(co_locate: bool, tls: bool) -> (Broker, std::net::SocketAddr, Wire) {
    let broker = Broker::new(BrokerConfig {
        connection_threads: 2,
        co_locate,
        ..BrokerConfig::default()
    })
    .expect("broker");
    let any = "127.0.0.1:0".parse().expect("addr");
    if !tls {
        let addr = broker.listen(any).await.expect("listen");
        return (broker, addr, Wire::Tcp);
    }
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let dir = tempfile::tempdir().expect("dir");
    let files = crate::transport::TlsFiles {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        client_ca: None,
        require_client_cert: false,
        crl: None,
        min_version: Default::default(),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write");
    std::fs::write(&files.key, key.serialize_pem()).expect("write");
    let server_tls = crate::transport::Tls::load(files).expect("TLS files");
    let addr = broker
        .listen_on(any, crate::transport::Transport::Tls(Arc::new(server_tls)))
        .await
        .expect("listen");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let wire = Wire::Tls(tokio_rustls::TlsConnector::from(Arc::new(config)));
    (broker, addr, wire)
}

fn home(broker: &Broker, id: &str) -> usize {
    let session = broker.inner.sessions.lock().get(id).cloned();
    session.expect("session").home()
}

/// A publisher and six subscribers (three at QoS 1, three at QoS 0, which never send the
/// broker anything to wake their reader); at least one subscriber starts on the other
/// connection thread. Returns the subscribers' ids.
async fn fan_out(
    broker: &Broker,
    addr: std::net::SocketAddr,
    wire: &Wire,
) -> (Client, Vec<(String, Client)>) {
    let mut subs = Vec::new();
    for i in 0..6 {
        let id = format!("sub-{i}");
        let mut c = Client::dial(addr, &id, wire).await;
        let qos = if i % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        c.subscribe("fan/#", qos).await;
        subs.push((id, c));
    }
    let publisher = Client::dial(addr, "pub", wire).await;
    let p = home(broker, "pub");
    assert!(
        subs.iter().any(|(id, _)| home(broker, id) != p),
        "no subscriber starts on another thread than the publisher"
    );
    (publisher, subs)
}

/// Every subscriber of a one-publisher fan-out ends up on the publisher's thread, and each
/// receives every message once, in order, while it moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_move_to_their_publishers_thread_and_lose_nothing() {
    subscribers_move_and_lose_nothing(false).await;
}

/// The same over TLS: the TLS session moves with its socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_subscribers_move_to_their_publishers_thread_and_lose_nothing() {
    subscribers_move_and_lose_nothing(true).await;
}

async fn subscribers_move_and_lose_nothing(tls: bool) {
    let (broker, addr, wire) = broker_over(true, tls).await;
    let (mut publisher, subs) = fan_out(&broker, addr, &wire).await;
    const N: u32 = 3_000;
    let readers: Vec<_> = subs
        .into_iter()
        .map(|(id, mut c)| {
            tokio::spawn(async move {
                let got = c.receive(N as usize).await;
                (id, got, c)
            })
        })
        .collect();
    for chunk in 0..(N / 500) {
        publisher
            .publish_all("fan/x", chunk * 500..(chunk + 1) * 500)
            .await;
    }
    let p = home(&broker, "pub");
    for reader in readers {
        let (id, got, _client) = reader.await.expect("reader");
        assert_eq!(
            got,
            (0..N).collect::<Vec<_>>(),
            "{id} received every message once, in order"
        );
        assert_eq!(
            home(&broker, &id),
            p,
            "{id} moved to the publisher's thread"
        );
    }
    broker.shutdown(Duration::from_secs(1)).await;
}

/// With `co_locate` off nobody moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_co_location_connections_stay() {
    let (broker, addr) = broker(false).await;
    let (mut publisher, subs) = fan_out(&broker, addr, &Wire::Tcp).await;
    let before: Vec<usize> = subs.iter().map(|(id, _)| home(&broker, id)).collect();
    let readers: Vec<_> = subs
        .into_iter()
        .map(|(_, mut c)| {
            tokio::spawn(async move {
                let got = c.receive(1_000).await;
                (got, c)
            })
        })
        .collect();
    publisher.publish_all("fan/x", 0..1_000).await;
    let mut clients = Vec::new();
    for reader in readers {
        let (got, client) = reader.await.expect("reader");
        assert_eq!(got, (0..1_000).collect::<Vec<_>>());
        clients.push(client);
    }
    let after: Vec<usize> = (0..6).map(|i| home(&broker, &format!("sub-{i}"))).collect();
    assert_eq!(before, after);
    broker.shutdown(Duration::from_secs(1)).await;
}

/// Two clients that answer each other from different threads end up on one thread, the
/// earlier one, instead of trading places.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_and_response_pair_meets_on_one_thread() {
    let (broker, addr) = broker(true).await;
    // Clients until two of them are served by different threads.
    let mut clients: Vec<(String, Client)> = Vec::new();
    for i in 0..8 {
        let id = format!("peer-{i}");
        let c = Client::connect(addr, &id).await;
        clients.push((id, c));
    }
    let on = |t: usize| {
        clients
            .iter()
            .position(|(id, _)| home(&broker, id) == t)
            .expect("a client on each thread")
    };
    let (a, b) = (on(1), on(2));
    let (a_id, b_id) = (clients[a].0.clone(), clients[b].0.clone());
    clients[a]
        .1
        .subscribe("pair/response", QoS::AtLeastOnce)
        .await;
    clients[b]
        .1
        .subscribe("pair/request", QoS::AtLeastOnce)
        .await;
    for n in 0..1_000u32 {
        clients[a].1.publish_all("pair/request", n..n + 1).await;
        assert_eq!(clients[b].1.receive(1).await, vec![n]);
        clients[b].1.publish_all("pair/response", n..n + 1).await;
        assert_eq!(clients[a].1.receive(1).await, vec![n]);
    }
    assert_eq!(
        home(&broker, &a_id),
        1,
        "the requester stayed on the earlier thread"
    );
    assert_eq!(home(&broker, &b_id), 1, "the responder moved to it");
    broker.shutdown(Duration::from_secs(1)).await;
}

/// A subscriber fed by publishers on both threads stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_fed_from_both_threads_stays() {
    let (broker, addr) = broker(true).await;
    let mut sub = Client::connect(addr, "sink").await;
    sub.subscribe("in/#", QoS::AtLeastOnce).await;
    let start = home(&broker, "sink");
    // Publishers until two of them are served by different threads.
    let mut pubs: Vec<(usize, Client)> = Vec::new();
    for i in 0..8 {
        let id = format!("source-{i}");
        let c = Client::connect(addr, &id).await;
        pubs.push((home(&broker, &id), c));
    }
    let a = pubs
        .iter()
        .position(|(h, _)| *h == 1)
        .expect("a publisher on thread 1");
    let b = pubs
        .iter()
        .position(|(h, _)| *h == 2)
        .expect("a publisher on thread 2");
    let reader = tokio::spawn(async move {
        let got = sub.receive(2_000).await;
        (got, sub)
    });
    for round in 0..1_000u32 {
        for (k, index) in [a, b].into_iter().enumerate() {
            let n = round * 2 + u32::try_from(k).expect("k");
            pubs[index].1.publish_all("in/x", n..n + 1).await;
        }
    }
    let (got, _sub) = reader.await.expect("reader");
    assert_eq!(got, (0..2_000).collect::<Vec<_>>());
    assert_eq!(home(&broker, "sink"), start, "the subscriber did not move");
    broker.shutdown(Duration::from_secs(1)).await;
}

/// Connects and exchanges one PINGREQ, after which the client says nothing more.
async fn gone_quiet(addr: std::net::SocketAddr, id: &str) -> Client {
    let mut c = Client::connect(addr, id).await;
    c.send(Packet::PingReq).await;
    let (kind, _) = c.frame().await;
    assert_eq!(kind, 13, "PINGRESP");
    c
}

/// Reads until the broker closes; the DISCONNECT reason code, if one came.
async fn disconnect_reason(c: &mut Client) -> Option<u8> {
    let _ = tokio::time::timeout(LIMIT, async {
        while c.stream.read_buf(&mut c.buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
    (c.buf.first().map(|b| b >> 4) == Some(14)).then(|| c.buf.get(2).copied().unwrap_or(0))
}

/// Shutdown reaches a client that has gone quiet at once, not after the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_hears_of_shutdown() {
    let (broker, addr) = broker(true).await;
    let mut c = gone_quiet(addr, "quiet").await;
    // A grace far longer than the wait: a shutdown that waited it out would not end in time.
    let shutdown = broker.shutdown(Duration::from_secs(600));
    tokio::time::timeout(Duration::from_secs(60), shutdown)
        .await
        .expect("shutdown waited out its grace for a silent client");
    assert_eq!(
        disconnect_reason(&mut c).await,
        Some(codec::reason::SERVER_SHUTTING_DOWN)
    );
}

/// A quiet client's connection, taken over by a new one for the same client id, hears of it
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_taken_over_is_told_at_once() {
    let (broker, addr) = broker(true).await;
    let mut first = gone_quiet(addr, "twice").await;
    let _second = Client::connect(addr, "twice").await;
    assert_eq!(
        broker.handovers_unanswered(),
        0,
        "the new connection waited in vain for the silent one"
    );
    assert_eq!(
        disconnect_reason(&mut first).await,
        Some(codec::reason::SESSION_TAKEN_OVER)
    );
    broker.shutdown(Duration::from_secs(1)).await;
}
