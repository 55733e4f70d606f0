//! The state store as an in-process broker service: MQTT requests in, the state machine in the
//! middle, responses and key notifications out.
//!
//! The service claims the request topic, so it sees every request together with the connection
//! identity of the client that sent it. It validates what only the receiving node can judge
//! (protocol version, timestamp syntax and clock skew, who may observe what), builds a log entry
//! carrying the wall clock, and applies it. Key observations (KEYNOTIFY) are node-local: they
//! belong to one connection and end with it.
//!
//! Ordering guarantee: the notifications a request causes are put into the observers' sessions
//! before the request's response is published, so a client that observes and mutates the same
//! key sees the notification first.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mqkv_broker::codec::{Properties, QoS};
use mqkv_broker::{Broker, ClientIdentity, OutboundMessage, ServiceEvent, ServicePublish};
use mqkv_protocol::properties as prop;
use mqkv_protocol::{
    is_reserved_response_topic, notification_topic, parse_request_bytes, Command, Hlc, Response,
    NOTIFY_TOPIC_PREFIX, REQUEST_TOPIC,
};
use mqkv_store::{Applied, DedupId, Entry, Op, Request, StateMachine, StoreConfig};
use tokio::sync::mpsc;

/// How long a request's answer is remembered for redeliveries when the request carries no
/// message expiry (the SDKs always send one).
const DEFAULT_DEDUP_WINDOW_MS: u64 = 60_000;

/// Reason code sent to a client whose request names a reserved response topic.
const RESERVED_RESPONSE_TOPIC_REASON: u8 = mqkv_broker::codec::reason::NOT_AUTHORIZED;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Who observes which keys, per connection.
#[derive(Default)]
struct Observers {
    by_key: HashMap<Bytes, HashMap<Arc<str>, u64>>,
    by_connection: HashMap<u64, HashSet<Bytes>>,
}

impl Observers {
    fn start(&mut self, who: &ClientIdentity, key: &Bytes) {
        self.by_key
            .entry(key.clone())
            .or_default()
            .insert(who.client_id.clone(), who.connection_id);
        self.by_connection
            .entry(who.connection_id)
            .or_default()
            .insert(key.clone());
    }

    /// Returns whether the key was observed by this client.
    fn stop(&mut self, who: &ClientIdentity, key: &Bytes) -> bool {
        let Some(clients) = self.by_key.get_mut(key) else {
            return false;
        };
        let Some(conn) = clients.remove(&who.client_id) else {
            return false;
        };
        if clients.is_empty() {
            self.by_key.remove(key);
        }
        if let Some(keys) = self.by_connection.get_mut(&conn) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_connection.remove(&conn);
            }
        }
        true
    }

    /// Drops every registration made on a connection that has closed.
    fn connection_closed(&mut self, connection_id: u64) {
        let Some(keys) = self.by_connection.remove(&connection_id) else {
            return;
        };
        for key in keys {
            if let Some(clients) = self.by_key.get_mut(&key) {
                clients.retain(|_, c| *c != connection_id);
                if clients.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    fn observers_of(&self, key: &[u8]) -> Vec<Arc<str>> {
        self.by_key
            .get(key)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The running service.
pub struct StateStoreService {
    broker: Broker,
    machine: StateMachine,
    observers: Observers,
}

impl StateStoreService {
    /// Claims the request topic on `broker` and runs the service until the broker goes away.
    pub fn spawn(broker: &Broker, config: StoreConfig) -> tokio::task::JoinHandle<()> {
        // The notification namespace is claimed too, so no client can publish forged
        // notifications into it; the service drops whatever arrives there.
        let notify_filter = format!("{NOTIFY_TOPIC_PREFIX}#");
        let rx = broker.claim(&[REQUEST_TOPIC, &notify_filter], 4096);
        let service = StateStoreService {
            broker: broker.clone(),
            machine: StateMachine::new(config),
            observers: Observers::default(),
        };
        tokio::spawn(service.run(rx))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<ServiceEvent>) {
        loop {
            let next_expiry = self.machine.next_expiry_ms();
            let sleep = async {
                match next_expiry {
                    Some(at) => {
                        let wait = at.saturating_sub(now_ms());
                        tokio::time::sleep(Duration::from_millis(wait)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(ServiceEvent::Publish(p)) => self.request(p),
                    Some(ServiceEvent::Connected(_)) => {}
                    Some(ServiceEvent::Disconnected(who)) => {
                        self.observers.connection_closed(who.connection_id)
                    }
                    None => break,
                },
                _ = sleep => {
                    let applied = self.machine.apply(&Entry { now_ms: now_ms(), op: Op::ExpireDue });
                    self.notify(&applied);
                }
            }
        }
    }

    fn request(&mut self, p: ServicePublish) {
        if p.topic != REQUEST_TOPIC {
            tracing::warn!(client_id = %p.from.client_id, topic = %p.topic, "publish into the notification namespace dropped");
            return;
        }
        let (Some(response_topic), Some(correlation)) = (
            p.properties.response_topic.clone(),
            p.properties.correlation_data.clone(),
        ) else {
            tracing::warn!(client_id = %p.from.client_id, "state store request without response topic or correlation data dropped");
            return;
        };
        if is_reserved_response_topic(&response_topic) {
            tracing::warn!(client_id = %p.from.client_id, %response_topic, "state store request with a reserved response topic: client disconnected");
            self.broker.disconnect_client(
                &p.from.client_id,
                p.from.connection_id,
                RESERVED_RESPONSE_TOPIC_REASON,
            );
            return;
        }
        let reply = Reply {
            topic: response_topic,
            correlation,
            expiry: p.properties.message_expiry_interval,
        };
        let user = |name: &str| {
            p.properties
                .user_properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        if let Some(v) = user(prop::PROTOCOL_VERSION) {
            if !mqkv_protocol::protocol_version_supported(v) {
                let v = v.to_owned();
                self.unsupported_version(&reply, &v);
                return;
            }
        }
        let now = now_ms();
        let parsed = parse_request_bytes(&p.payload).and_then(|command| {
            let ts = Hlc::from_property(user(prop::TIMESTAMP))?;
            let ft = Hlc::from_property(user(prop::FENCING_TOKEN))?;
            Ok(Request {
                command,
                ts,
                ft,
                dedup: None,
            })
        });
        let mut request = match parsed {
            Ok(r) => r,
            Err(kind) => {
                self.respond(&reply, &Response::Error(kind), None);
                return;
            }
        };
        if let Err(kind) = mqkv_store::validate(&request, now) {
            self.respond(&reply, &Response::Error(kind), None);
            return;
        }
        match &request.command {
            Command::KeyNotify { key, stop } => {
                let response = if *stop {
                    if self.observers.stop(&p.from, key) {
                        Response::Ok
                    } else {
                        Response::Integer(0)
                    }
                } else {
                    self.observers.start(&p.from, key);
                    Response::Ok
                };
                self.respond(&reply, &response, None);
            }
            Command::Get { key } => match self.machine.get(key, now) {
                Some((value, version)) => {
                    self.respond(&reply, &Response::Value(value), Some(&version))
                }
                None => self.respond(&reply, &Response::Nil, None),
            },
            Command::Scan { pattern, token } => {
                let page = self.machine.scan(pattern, token.as_deref(), now);
                self.respond(&reply, &page, None);
            }
            Command::Set { .. } | Command::Del { .. } | Command::VDel { .. } => {
                let window = reply
                    .expiry
                    .map_or(DEFAULT_DEDUP_WINDOW_MS, |s| u64::from(s) * 1000);
                request.dedup = Some(DedupId {
                    client_id: p.from.client_id.to_string(),
                    correlation: reply.correlation.clone(),
                    expires_at_ms: now.saturating_add(window),
                });
                let applied = self.machine.apply(&Entry {
                    now_ms: now,
                    op: Op::Request(request),
                });
                self.notify(&applied);
                self.respond(&reply, &applied.response, applied.version.as_ref());
            }
        }
    }

    /// Sends every change's notification to every observer of the key.
    fn notify(&self, applied: &Applied) {
        for event in &applied.events {
            let observers = self.observers.observers_of(&event.key);
            if observers.is_empty() {
                continue;
            }
            let payload = event.notification().encode();
            for client in observers {
                let msg = OutboundMessage {
                    topic: notification_topic(client.as_bytes(), &event.key),
                    payload: payload.clone(),
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    properties: Properties {
                        content_type: Some(prop::CONTENT_TYPE.to_owned()),
                        user_properties: vec![
                            (prop::TIMESTAMP.to_owned(), event.version.to_string()),
                            (
                                prop::PROTOCOL_VERSION.to_owned(),
                                prop::PROTOCOL_VERSION_VALUE.to_owned(),
                            ),
                        ],
                        ..Default::default()
                    },
                };
                self.broker.deliver(&client, msg);
            }
        }
    }

    fn respond(&self, reply: &Reply, response: &Response, version: Option<&Hlc>) {
        let mut user_properties = vec![
            (prop::STATUS.to_owned(), prop::STATUS_OK.to_owned()),
            (
                prop::PROTOCOL_VERSION.to_owned(),
                prop::PROTOCOL_VERSION_VALUE.to_owned(),
            ),
        ];
        if let Some(v) = version {
            user_properties.push((prop::TIMESTAMP.to_owned(), v.to_string()));
        }
        self.send(reply, response.encode(), user_properties);
    }

    fn unsupported_version(&self, reply: &Reply, requested: &str) {
        let user_properties = vec![
            (
                prop::STATUS.to_owned(),
                prop::STATUS_VERSION_NOT_SUPPORTED.to_owned(),
            ),
            (
                prop::STATUS_MESSAGE.to_owned(),
                format!("protocol version {requested} is not supported"),
            ),
            (
                prop::SUPPORTED_MAJOR_VERSIONS.to_owned(),
                prop::SUPPORTED_MAJOR_VERSIONS_VALUE.to_owned(),
            ),
            (
                prop::REQUEST_PROTOCOL_VERSION.to_owned(),
                requested.to_owned(),
            ),
            (
                prop::PROTOCOL_VERSION.to_owned(),
                prop::PROTOCOL_VERSION_VALUE.to_owned(),
            ),
        ];
        self.send(reply, Bytes::new(), user_properties);
    }

    fn send(&self, reply: &Reply, payload: Bytes, user_properties: Vec<(String, String)>) {
        self.broker.publish(OutboundMessage {
            topic: reply.topic.clone(),
            payload,
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties {
                content_type: Some(prop::CONTENT_TYPE.to_owned()),
                correlation_data: Some(reply.correlation.clone()),
                message_expiry_interval: reply.expiry,
                user_properties,
                ..Default::default()
            },
        });
    }
}

/// Where and how to answer one request.
struct Reply {
    topic: String,
    correlation: Bytes,
    expiry: Option<u32>,
}
