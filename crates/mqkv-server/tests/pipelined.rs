//! One connection with many state store requests in flight: the writes are under way together
//! and share log entries, and the answers and acknowledgements keep the order of the requests.
//! The client is raw MQTT over TCP, so every request of a test can go out in one write.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use mqkv_broker::codec::props::PropContext;
use mqkv_broker::codec::PropStr;
use mqkv_broker::codec::{
    self, Connect, Disconnect, Packet, Properties, Publish, QoS, Subscribe, SubscriptionOptions,
};
use mqkv_broker::{ClientIdentity, Handled, OutboundMessage, Service, ServicePublish};
use mqkv_protocol::REQUEST_TOPIC;
use mqkv_server::{Server, ServerConfig, StorageKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(20);

async fn start_disk(dir: &std::path::Path) -> Server {
    let config = ServerConfig {
        storage: StorageKind::Disk,
        data_dir: dir.to_path_buf(),
        listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
        workers: Some(1),
        ..ServerConfig::default()
    };
    Server::start(config).await.expect("server starts")
}

/// A disk server in a fresh directory and a client `id` connected to it.
async fn start_with_client(id: &str) -> (tempfile::TempDir, Server, RawClient) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_disk(dir.path()).await;
    let client = RawClient::connect(server.listeners[0], id).await;
    (dir, server, client)
}

fn resp(args: &[&[u8]]) -> Bytes {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out.into()
}

struct RawClient {
    id: String,
    stream: TcpStream,
    buf: BytesMut,
    next_packet_id: u16,
}

/// What came back for one request.
#[derive(Debug)]
struct Answer {
    correlation: Bytes,
    payload: Bytes,
}

/// A packet from the server (the broker's codec decodes only what clients send).
#[derive(Debug)]
enum Incoming {
    ConnAck {
        reason_code: u8,
    },
    SubAck,
    PubAck {
        packet_id: u16,
        reason_code: u8,
    },
    Publish {
        topic: String,
        packet_id: u16,
        correlation: Bytes,
        payload: Bytes,
    },
}

/// Decodes the packet at the front of `buf`, if it is all there.
fn decode_incoming(buf: &mut BytesMut) -> Option<Incoming> {
    let mut len = 0usize;
    let mut at = 1;
    loop {
        let b = *buf.get(at)?;
        len |= usize::from(b & 0x7F) << (7 * (at - 1));
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    if buf.len() < at + len {
        return None;
    }
    let header = buf[0];
    let mut frame = buf.split_to(at + len).freeze();
    frame.advance(at);
    Some(match header >> 4 {
        2 => Incoming::ConnAck {
            reason_code: frame[1],
        },
        9 => Incoming::SubAck,
        4 => Incoming::PubAck {
            packet_id: frame.get_u16(),
            reason_code: if frame.has_remaining() { frame[0] } else { 0 },
        },
        3 => {
            let topic_len = usize::from(frame.get_u16());
            let topic = String::from_utf8(frame.split_to(topic_len).to_vec()).expect("utf-8");
            let packet_id = if (header >> 1) & 3 > 0 {
                frame.get_u16()
            } else {
                0
            };
            let props = Properties::decode(&mut frame, PropContext::Publish).expect("properties");
            Incoming::Publish {
                topic,
                packet_id,
                correlation: props.correlation_data.unwrap_or_default(),
                payload: frame,
            }
        }
        other => panic!("unexpected packet type {other}"),
    })
}

impl RawClient {
    async fn connect(addr: SocketAddr, id: &str) -> RawClient {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let mut c = RawClient {
            id: id.to_owned(),
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            next_packet_id: 0,
        };
        c.write(&[Packet::Connect(Box::new(Connect::v5(id, 60)))])
            .await;
        assert!(matches!(
            c.read().await,
            Some(Incoming::ConnAck { reason_code: 0 })
        ));
        let packet_id = c.packet_id();
        c.write(&[Packet::Subscribe(Subscribe {
            packet_id,
            properties: Properties::default(),
            filters: vec![(
                c.response_topic(),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            )],
        })])
        .await;
        assert!(matches!(c.read().await, Some(Incoming::SubAck)));
        c
    }

    fn response_topic(&self) -> String {
        format!("clients/{}/response", self.id)
    }

    fn packet_id(&mut self) -> u16 {
        self.next_packet_id = self.next_packet_id % u16::MAX + 1;
        self.next_packet_id
    }

    /// A QoS 1 publish of `payload` to `topic`, with `n` as its correlation data.
    fn publish(&mut self, topic: &str, n: u64, payload: &[u8]) -> Packet {
        Packet::Publish(Publish {
            qos: QoS::AtLeastOnce,
            topic: topic.to_owned(),
            packet_id: self.packet_id(),
            properties: Properties {
                response_topic: Some(self.response_topic()),
                correlation_data: Some(correlation(n)),
                ..Default::default()
            },
            payload: Bytes::copy_from_slice(payload),
            ..Default::default()
        })
    }

    /// A QoS 1 request as the SDKs send it, with `n` as its correlation data.
    fn request(&mut self, n: u64, args: &[&[u8]]) -> Packet {
        Packet::Publish(Publish {
            qos: QoS::AtLeastOnce,
            topic: REQUEST_TOPIC.to_owned(),
            packet_id: self.packet_id(),
            properties: Properties {
                response_topic: Some(self.response_topic()),
                correlation_data: Some(Bytes::copy_from_slice(&n.to_be_bytes())),
                message_expiry_interval: Some(10),
                user_properties: vec![(
                    PropStr::Borrowed("__ts"),
                    PropStr::Owned(format!(
                        "{:015}:00000:test-client",
                        mqkv_server::statestore::now_ms()
                    )),
                )],
                ..Default::default()
            },
            payload: resp(args),
            ..Default::default()
        })
    }

    /// Writes every packet in one write.
    async fn write(&mut self, packets: &[Packet]) {
        let mut out = BytesMut::new();
        for p in packets {
            p.encode(&mut out, codec::V5);
        }
        self.stream.write_all(&out).await.expect("write");
    }

    /// The next packet, or `None` once the server has closed the connection.
    async fn read(&mut self) -> Option<Incoming> {
        tokio::time::timeout(TIMEOUT, async {
            loop {
                if let Some(p) = decode_incoming(&mut self.buf) {
                    return Some(p);
                }
                if self.stream.read_buf(&mut self.buf).await.expect("read") == 0 {
                    return None;
                }
            }
        })
        .await
        .expect("a packet in time")
    }

    /// GETs every key with all the requests in one write; the answers' payloads, in order.
    async fn get_all(&mut self, keys: &[String]) -> Vec<Bytes> {
        let reads: Vec<Packet> = keys
            .iter()
            .enumerate()
            .map(|(i, key)| self.request(1_000_000 + i as u64, &[b"GET", key.as_bytes()]))
            .collect();
        self.write(&reads).await;
        let (_, answers) = self.collect(keys.len(), keys.len()).await;
        answers.into_iter().map(|a| a.payload).collect()
    }

    /// Reads until `acks` PUBACKs and `answers` responses have arrived (acknowledging each
    /// response), and returns both in the order they came.
    async fn collect(&mut self, acks: usize, answers: usize) -> (Vec<u16>, Vec<Answer>) {
        let mut got_acks = Vec::new();
        let mut got = Vec::new();
        while got_acks.len() < acks || got.len() < answers {
            match self.read().await.expect("the connection stays open") {
                Incoming::PubAck {
                    packet_id,
                    reason_code,
                } => {
                    assert_eq!(reason_code, 0);
                    got_acks.push(packet_id);
                }
                Incoming::Publish {
                    topic,
                    packet_id,
                    correlation,
                    payload,
                } => {
                    assert_eq!(topic, self.response_topic());
                    got.push(Answer {
                        correlation,
                        payload,
                    });
                    self.write(&[Packet::PubAck(codec::Ack {
                        packet_id,
                        ..Default::default()
                    })])
                    .await;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        (got_acks, got)
    }
}

fn correlation(n: u64) -> Bytes {
    Bytes::copy_from_slice(&n.to_be_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_on_one_connection_share_log_entries_and_stay_in_order() {
    let (_dir, server, mut c) = start_with_client("pipelined-writes").await;

    const N: u64 = 200;
    let before = server.store_stats();
    let keys: Vec<String> = (0..N).map(|i| format!("key-{i}")).collect();
    let mut requests = Vec::new();
    let mut ids = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let request = c.request(i as u64, &[b"SET", key.as_bytes(), b"value"]);
        if let Packet::Publish(p) = &request {
            ids.push(p.packet_id);
        }
        requests.push(request);
    }
    c.write(&requests).await;
    let (acks, answers) = c.collect(N as usize, N as usize).await;

    assert_eq!(acks, ids, "acknowledged in the order sent");
    let order: Vec<Bytes> = answers.iter().map(|a| a.correlation.clone()).collect();
    let expected: Vec<Bytes> = (0..N).map(correlation).collect();
    assert_eq!(order, expected, "answered in the order sent");
    assert!(answers.iter().all(|a| &a.payload[..] == b"+OK\r\n"));

    // Had each write waited for the one before, every write would be a log entry of its own.
    let after = server.store_stats();
    let entries = after.log_entries_written - before.log_entries_written;
    assert!(
        entries < N / 2,
        "{N} pipelined writes took {entries} log entries"
    );

    // Every write is there.
    let values = c.get_all(&keys).await;
    assert!(values.iter().all(|v| &v[..] == b"$5\r\nvalue\r\n"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_behind_writes_in_flight_see_them() {
    let (_dir, server, mut c) = start_with_client("pipelined-reads").await;

    let script: [&[&[u8]]; 9] = [
        &[b"SET", b"k", b"a"],
        &[b"GET", b"k"],
        &[b"SET", b"k", b"b"],
        &[b"SET", b"k", b"c", b"NX"],
        &[b"GET", b"k"],
        &[b"DEL", b"k"],
        &[b"GET", b"k"],
        &[b"VDEL", b"k", b"b"],
        &[b"GET", b"k"],
    ];
    let expected: [&[u8]; 9] = [
        b"+OK\r\n",
        b"$1\r\na\r\n",
        b"+OK\r\n",
        b":-1\r\n",
        b"$1\r\nb\r\n",
        b":1\r\n",
        b"$-1\r\n",
        b":0\r\n",
        b"$-1\r\n",
    ];
    // Twice: once with every request in one write, once with each in a write of its own
    // (the server may then see them one by one or several at a time).
    for round in 0..2u64 {
        let requests: Vec<Packet> = script
            .iter()
            .enumerate()
            .map(|(i, args)| c.request(round * 100 + i as u64, args))
            .collect();
        if round == 0 {
            c.write(&requests).await;
        } else {
            for r in &requests {
                c.write(std::slice::from_ref(r)).await;
            }
        }
        let (_, answers) = c.collect(script.len(), script.len()).await;
        let payloads: Vec<&[u8]> = answers.iter().map(|a| &a.payload[..]).collect();
        assert_eq!(payloads, expected, "round {round}");
        let order: Vec<Bytes> = answers.iter().map(|a| a.correlation.clone()).collect();
        let sent: Vec<Bytes> = (0..script.len() as u64)
            .map(|i| correlation(round * 100 + i))
            .collect();
        assert_eq!(order, sent, "round {round}: answered in the order sent");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_behind_writes_in_flight_answers_them_first() {
    let (_dir, server, mut c) = start_with_client("pipelined-disconnect").await;

    const N: u64 = 50;
    let mut packets: Vec<Packet> = (0..N)
        .map(|i| c.request(i, &[b"SET", format!("d{i}").as_bytes(), b"v"]))
        .collect();
    packets.push(Packet::Disconnect(Disconnect::default()));
    c.write(&packets).await;

    let mut acks = 0;
    let mut answers = 0;
    while let Some(p) = c.read().await {
        match p {
            Incoming::PubAck { .. } => acks += 1,
            Incoming::Publish { .. } => answers += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        (acks, answers),
        (N, N),
        "every write answered before the close"
    );

    let mut c = RawClient::connect(server.listeners[0], "pipelined-check").await;
    let keys: Vec<String> = (0..N).map(|i| format!("d{i}")).collect();
    let values = c.get_all(&keys).await;
    assert!(values.iter().all(|v| &v[..] == b"$1\r\nv\r\n"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_when_the_connection_drops_are_still_applied() {
    let (_dir, server, mut c) = start_with_client("pipelined-drop").await;

    const N: u64 = 50;
    let packets: Vec<Packet> = (0..N)
        .map(|i| c.request(i, &[b"SET", format!("x{i}").as_bytes(), b"v"]))
        .collect();
    c.write(&packets).await;
    // Gone without DISCONNECT, before reading anything.
    drop(c);

    // The writes the server had started finish on their own. Whatever it had read is applied
    // as a whole prefix of what was sent: a later write never without the earlier ones.
    let mut c = RawClient::connect(server.listeners[0], "pipelined-after-drop").await;
    let keys: Vec<String> = (0..N).map(|i| format!("x{i}")).collect();
    // A look at every key is one snapshot only if no entry was applied while it was taken:
    // taken again until the applied index is the same before and after.
    let mut present = None;
    for _ in 0..200 {
        let before = server.store_stats().applied_index;
        let look: Vec<bool> = c
            .get_all(&keys)
            .await
            .iter()
            .map(|v| &v[..] == b"$1\r\nv\r\n")
            .collect();
        if server.store_stats().applied_index == before {
            present = Some(look);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let present = present.expect("a look at the keys with no write applied meanwhile");
    let applied = present.iter().take_while(|p| **p).count();
    assert!(
        present[applied..].iter().all(|p| !p),
        "applied writes are a prefix of those sent: {present:?}"
    );
    server.shutdown().await;
}

/// A service whose work finishes when the test says: a publish `hold` waits for
/// [`Gate::release`], `ready` finishes on its first poll, `done` is answered without a future.
/// Each answer echoes the correlation data to the response topic.
#[derive(Default)]
struct Gate {
    held: Mutex<HashMap<Bytes, tokio::sync::oneshot::Sender<()>>>,
    seen: tokio::sync::Notify,
    count: Mutex<usize>,
}

impl Gate {
    fn release(&self, correlation: &Bytes) {
        let sender = self.held.lock().expect("lock").remove(correlation);
        sender.expect("held").send(()).expect("still waiting");
    }

    async fn wait_for(&self, n: usize) {
        tokio::time::timeout(TIMEOUT, async {
            loop {
                let notified = self.seen.notified();
                if *self.count.lock().expect("lock") >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("publishes reach the service");
    }
}

struct GateService(Arc<Gate>);

impl Service for GateService {
    fn on_publish(&self, publish: ServicePublish, _earlier_running: bool) -> Handled {
        let correlation = publish
            .properties
            .correlation_data
            .clone()
            .unwrap_or_default();
        let answer = OutboundMessage {
            topic: publish
                .properties
                .response_topic
                .clone()
                .unwrap_or_default(),
            payload: publish.payload.clone(),
            qos: QoS::AtLeastOnce,
            properties: Properties {
                correlation_data: Some(correlation.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        *self.0.count.lock().expect("lock") += 1;
        self.0.seen.notify_waiters();
        match &publish.payload[..] {
            b"done" => Handled::Done(Some(answer)),
            b"ready" => Handled::Running(Box::pin(async move { Some(answer) })),
            _ => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.0.held.lock().expect("lock").insert(correlation, tx);
                Handled::Running(Box::pin(async move {
                    let _ = rx.await;
                    Some(answer)
                }))
            }
        }
    }

    fn on_disconnect(&self, _who: &ClientIdentity) {}
}

/// Work that finishes out of order (a later publish's at once, an earlier one's last) is still
/// answered and acknowledged in the order the publishes arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_keep_arrival_order_when_work_finishes_out_of_order() {
    let (_dir, server, mut c) = start_with_client("gate-order").await;
    let gate = Arc::new(Gate::default());
    server
        .broker
        .claim(&["gate/#"], Arc::new(GateService(gate.clone())));

    let kinds: [&[u8]; 6] = [b"hold", b"ready", b"hold", b"done", b"hold", b"ready"];
    let packets: Vec<Packet> = kinds
        .iter()
        .enumerate()
        .map(|(i, kind)| c.publish("gate/x", i as u64, kind))
        .collect();
    let ids: Vec<u16> = packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.packet_id),
            _ => None,
        })
        .collect();
    c.write(&packets).await;
    gate.wait_for(kinds.len()).await;
    // The held ones finish last first.
    for i in [4u64, 2, 0] {
        gate.release(&correlation(i));
    }
    let (acks, answers) = c.collect(kinds.len(), kinds.len()).await;
    assert_eq!(acks, ids, "acknowledged in arrival order");
    let order: Vec<Bytes> = answers.iter().map(|a| a.correlation.clone()).collect();
    let expected: Vec<Bytes> = (0..kinds.len() as u64).map(correlation).collect();
    assert_eq!(order, expected, "answered in arrival order");
    server.shutdown().await;
}
