//! One MQTT connection, kept alive across broker restarts, and the RPC
//! exchange on top of it.
//!
//! Invariants:
//! - No request is published on a connection before the broker has
//!   acknowledged the subscriptions to the response topic and to the
//!   notification filter: an answer can never arrive before anyone listens.
//! - A request still waiting when its connection drops is published again,
//!   with the same correlation data, on the next connection, until its
//!   deadline. The server de-duplicates by correlation data, so a retried
//!   NX or VDEL gets the first answer, not a second execution.
//! - Responses and notifications are handled in the order they arrive, one
//!   at a time, so a response's `seq` tells which notifications came before it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::properties as prop;
use mqkv_protocol::{
    notification_filter, parse_notification_topic, protocol_version_supported, Command, Hlc,
    Notification, Response, REQUEST_TOPIC,
};
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish, PublishProperties, SubscribeReasonCode};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::clock::{after, random_uuid_bytes, ClientClock};
use crate::error::{Error, Result, ServerError};
use crate::observe::Registry;
use crate::options::ClientOptions;

/// The largest packet MQTT can carry; asked of the broker as our own limit,
/// so large values are never refused on the way in.
const MQTT_MAX_PACKET: u32 = 268_435_455;
/// Requests the MQTT event loop can queue before publishers wait.
const CHANNEL_CAPACITY: usize = 256;
/// Bytes of a request packet other than payload, topics and user property
/// values, rounded up generously (headers, property ids and lengths).
const PACKET_OVERHEAD: usize = 128;

/// The state of the link, as seen by requests and the resync task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkState {
    /// Incremented each time a connection becomes ready.
    pub(crate) epoch: u64,
    /// Connected and subscribed: requests may be published.
    pub(crate) ready: bool,
    /// Shut down for good.
    pub(crate) closed: bool,
    /// The broker refused a subscription on the current connection.
    pub(crate) refused: Option<String>,
}

/// What came back for one request.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) response: Response,
    /// The `__ts` user property: the key version where the protocol sends one.
    pub(crate) version: Option<Hlc>,
    /// Notifications handled before this answer (see [`Registry::seq`]).
    pub(crate) seq: u64,
}

/// The value of the first user property called `name`, if any.
fn user_property<'a>(properties: &'a PublishProperties, name: &str) -> Option<&'a str> {
    properties
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

struct Reply {
    payload: Bytes,
    properties: PublishProperties,
    seq: u64,
}

pub(crate) struct Shared {
    pub(crate) client_id: String,
    response_topic: String,
    mqtt: AsyncClient,
    pub(crate) clock: ClientClock,
    pub(crate) default_timeout: Duration,
    pending: Mutex<HashMap<[u8; 16], oneshot::Sender<Reply>>>,
    link: watch::Sender<LinkState>,
    shutdown: watch::Sender<bool>,
    pub(crate) observers: Mutex<Registry>,
    /// Serialises changes to the set of observed keys (observe, unobserve,
    /// resync) so that KEYNOTIFY and KEYNOTIFY STOP never race.
    pub(crate) observe_lock: tokio::sync::Mutex<()>,
    max_packet_size: AtomicUsize,
}

/// The topic this client's answers come back on, in the shape the Rust SDK uses.
pub(crate) fn response_topic(client_id: &str) -> String {
    format!("clients/{client_id}/services/{REQUEST_TOPIC}/response")
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the data
    // half-updated in a way later users could not cope with.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// The shared state and the (not yet polled) MQTT event loop.
    fn new(options: &ClientOptions) -> Result<(Arc<Shared>, EventLoop)> {
        let client_id = options.client_id.clone();
        if client_id.is_empty() || client_id.contains(['/', '+', '#']) {
            return Err(Error::InvalidArgument(format!(
                "client id {client_id:?} must be non-empty and free of '/', '+' and '#'"
            )));
        }
        let mut mqtt_options = options.mqtt_options()?;
        mqtt_options
            .set_clean_start(true)
            .set_max_packet_size(Some(MQTT_MAX_PACKET))
            .set_connection_timeout(options.connect_timeout.as_secs().max(1));
        // Requests are small and answered one by one: with Nagle's algorithm
        // on, a request written right after the PUBACK of the previous answer
        // waited for the broker's delayed ACK (40 ms) before it left.
        let mut network = mqtt_options.network_options();
        network.set_tcp_nodelay(true);
        mqtt_options.set_network_options(network);
        let (mqtt, eventloop) = AsyncClient::new(mqtt_options, CHANNEL_CAPACITY);
        let (link, _) = watch::channel(LinkState {
            epoch: 0,
            ready: false,
            closed: false,
            refused: None,
        });
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            response_topic: response_topic(&client_id),
            client_id,
            mqtt,
            clock: ClientClock::new(),
            default_timeout: options.request_timeout,
            pending: Mutex::new(HashMap::new()),
            link,
            shutdown,
            observers: Mutex::new(Registry::default()),
            observe_lock: tokio::sync::Mutex::new(()),
            max_packet_size: AtomicUsize::new(MQTT_MAX_PACKET as usize),
        });
        Ok((shared, eventloop))
    }

    /// Connects, subscribes, and returns once the first connection is ready.
    pub(crate) async fn connect(options: &ClientOptions) -> Result<Arc<Shared>> {
        let (shared, eventloop) = Shared::new(options)?;
        let (first_tx, first_rx) = oneshot::channel();
        let driver = Driver {
            shared: shared.clone(),
            eventloop,
            first: Some(first_tx),
            address: format!("{}:{}", options.host, options.port),
            reconnect_min: options.reconnect_min,
            reconnect_max: options.reconnect_max,
        };
        tokio::spawn(driver.run());
        // The event loop's own connect timeout bounds the TCP and CONNACK
        // part; the extra time covers the SUBACK.
        let limit = options
            .connect_timeout
            .saturating_add(Duration::from_secs(5));
        match tokio::time::timeout(limit, first_rx).await {
            Ok(Ok(Ok(()))) => Ok(shared),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                shared.shutdown();
                Err(Error::Connect {
                    address: format!("{}:{}", options.host, options.port),
                    reason: "no answer from the broker".into(),
                })
            }
        }
    }

    pub(crate) fn link(&self) -> watch::Receiver<LinkState> {
        self.link.subscribe()
    }

    pub(crate) fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Sends one request and waits for its answer, publishing it again after
    /// every reconnection until `timeout` has passed.
    pub(crate) async fn call(
        &self,
        command: &Command,
        fencing_token: Option<&Hlc>,
        timeout: Duration,
    ) -> Result<Answer> {
        let verb = command.verb();
        let payload = command.encode();
        let size = payload.len()
            + REQUEST_TOPIC.len()
            + self.response_topic.len()
            + 2 * self.client_id.len()
            + fencing_token.map_or(0, |t| t.to_string().len())
            + 64
            + PACKET_OVERHEAD;
        let limit = self.max_packet_size.load(Ordering::Relaxed);
        if size > limit {
            return Err(Error::TooLarge { size, limit });
        }
        let correlation = random_uuid_bytes();
        let (tx, mut rx) = oneshot::channel();
        lock(&self.pending).insert(correlation, tx);
        let _pending = PendingGuard {
            shared: self,
            correlation,
        };
        let deadline = after(Instant::now(), timeout);
        let mut link = self.link.subscribe();
        let mut sent_on: Option<u64> = None;
        loop {
            let state = tokio::time::timeout_at(
                deadline,
                link.wait_for(|s| {
                    s.closed || s.refused.is_some() || (s.ready && Some(s.epoch) != sent_on)
                }),
            )
            .await
            .map_err(|_| Error::Timeout(timeout))?
            .map_err(|_| Error::Closed)?
            .clone();
            if state.closed {
                return Err(Error::Closed);
            }
            if let Some(topic) = state.refused {
                return Err(Error::SubscriptionRefused(topic));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let properties = self.request_properties(&correlation, fencing_token, remaining);
            tokio::time::timeout_at(
                deadline,
                self.mqtt.publish_with_properties(
                    REQUEST_TOPIC,
                    QoS::AtLeastOnce,
                    false,
                    payload.clone(),
                    properties,
                ),
            )
            .await
            .map_err(|_| Error::Timeout(timeout))?
            .map_err(|_| Error::Closed)?;
            sent_on = Some(state.epoch);
            let epoch = state.epoch;
            tokio::select! {
                reply = &mut rx => {
                    let reply = reply.map_err(|_| Error::Closed)?;
                    return self.interpret(verb, reply);
                }
                changed = link.wait_for(|s| s.closed || !s.ready || s.epoch != epoch) => {
                    if changed.is_err() {
                        return Err(Error::Closed);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Err(Error::Timeout(timeout)),
            }
        }
    }

    /// The MQTT 5 properties the SDKs put on a request, in the Rust SDK's
    /// order: `__ft` first, then `__srcId`, `__ts`, `__protVer`.
    fn request_properties(
        &self,
        correlation: &[u8; 16],
        fencing_token: Option<&Hlc>,
        remaining: Duration,
    ) -> PublishProperties {
        let mut user = Vec::with_capacity(4);
        if let Some(token) = fencing_token {
            user.push((prop::FENCING_TOKEN.to_owned(), token.to_string()));
        }
        user.push((prop::SOURCE_ID.to_owned(), self.client_id.clone()));
        user.push((prop::TIMESTAMP.to_owned(), self.clock.tick().to_string()));
        user.push((
            prop::PROTOCOL_VERSION.to_owned(),
            prop::PROTOCOL_VERSION_VALUE.to_owned(),
        ));
        PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(Bytes::copy_from_slice(correlation)),
            message_expiry_interval: Some(expiry_seconds(remaining)),
            content_type: Some(prop::CONTENT_TYPE.to_owned()),
            user_properties: user,
            ..Default::default()
        }
    }

    /// Checks an answer the way the SDKs do and turns `-ERR` into errors.
    fn interpret(&self, verb: &'static str, reply: Reply) -> Result<Answer> {
        let user = |name: &str| user_property(&reply.properties, name);
        if let Some(version) = user(prop::PROTOCOL_VERSION) {
            if !protocol_version_supported(version) {
                return Err(Error::protocol(
                    verb,
                    format!("unsupported protocol version {version:?}"),
                ));
            }
        }
        let status =
            user(prop::STATUS).ok_or_else(|| Error::protocol(verb, "the answer has no __stat"))?;
        let status: u16 = status
            .parse()
            .map_err(|_| Error::protocol(verb, format!("malformed __stat {status:?}")))?;
        if status != 200 {
            let message = user(prop::STATUS_MESSAGE).map_or(String::new(), |m| format!(": {m}"));
            return Err(Error::protocol(verb, format!("status {status}{message}")));
        }
        if let Some(content_type) = &reply.properties.content_type {
            if content_type != prop::CONTENT_TYPE {
                return Err(Error::protocol(
                    verb,
                    format!("content type {content_type:?}"),
                ));
            }
        }
        let version = Hlc::from_property(user(prop::TIMESTAMP))
            .map_err(|_| Error::protocol(verb, "malformed __ts"))?;
        if let Some(v) = &version {
            self.clock.merge(v);
        }
        // An MGET answer can look like a SCAN page: read it as what was asked for.
        let parse = if verb == "MGET" {
            Response::parse_values
        } else {
            Response::parse
        };
        let response =
            parse(&reply.payload).map_err(|_| Error::protocol(verb, "malformed payload"))?;
        match response {
            Response::Error(kind) => Err(Error::Server(ServerError::Known(kind))),
            Response::ErrorText(text) => Err(Error::Server(ServerError::Unknown(text))),
            response => Ok(Answer {
                response,
                version,
                seq: reply.seq,
            }),
        }
    }

    /// Routes one incoming PUBLISH: an answer to its waiting request, a
    /// notification to the key's observers; anything else is dropped.
    fn dispatch(&self, publish: Publish) {
        let Ok(topic) = std::str::from_utf8(&publish.topic) else {
            return;
        };
        let properties = publish.properties.unwrap_or_default();
        if topic == self.response_topic {
            let Some(correlation) = properties
                .correlation_data
                .as_deref()
                .and_then(|c| <[u8; 16]>::try_from(c).ok())
            else {
                tracing::debug!("answer without 16 bytes of correlation data dropped");
                return;
            };
            // Taken before the answer is handed over, so every notification
            // counted here was handled before the answer.
            let seq = lock(&self.observers).seq();
            if let Some(tx) = lock(&self.pending).remove(&correlation) {
                let _ = tx.send(Reply {
                    payload: publish.payload,
                    properties,
                    seq,
                });
            }
            return;
        }
        let Some((client_id, key)) = parse_notification_topic(topic) else {
            return;
        };
        if client_id != self.client_id.as_bytes() {
            return;
        }
        let user = |name: &str| user_property(&properties, name);
        if let Some(version) = user(prop::PROTOCOL_VERSION) {
            if !protocol_version_supported(version) {
                tracing::debug!(
                    version,
                    "notification with an unsupported protocol version dropped"
                );
                return;
            }
        }
        if properties
            .content_type
            .as_deref()
            .is_some_and(|c| c != prop::CONTENT_TYPE)
        {
            tracing::debug!("notification with a foreign content type dropped");
            return;
        }
        // Like the Rust SDK: a notification without a version cannot be
        // ordered against anything, so it is not delivered.
        let Ok(Some(version)) = Hlc::from_property(user(prop::TIMESTAMP)) else {
            tracing::debug!("notification without a valid __ts dropped");
            return;
        };
        let Ok(notification) = Notification::parse(&publish.payload) else {
            tracing::debug!("malformed notification payload dropped");
            return;
        };
        self.clock.merge(&version);
        lock(&self.observers).deliver(Bytes::from(key), notification, version);
    }

    fn set_link(&self, update: impl FnOnce(&mut LinkState)) {
        self.link.send_modify(update);
    }

    fn close(&self) {
        self.set_link(|s| {
            s.ready = false;
            s.closed = true;
        });
        lock(&self.pending).clear();
        lock(&self.observers).close();
    }
}

/// Whole seconds, rounded up, at least 1: what the SDKs send as message expiry.
fn expiry_seconds(remaining: Duration) -> u32 {
    let secs = remaining
        .as_secs()
        .saturating_add(u64::from(remaining.subsec_nanos() > 0));
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

/// Removes a request from the pending table however the call ends.
struct PendingGuard<'a> {
    shared: &'a Shared,
    correlation: [u8; 16],
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.pending).remove(&self.correlation);
    }
}

/// Polls the MQTT event loop for the life of the client.
struct Driver {
    shared: Arc<Shared>,
    eventloop: EventLoop,
    first: Option<oneshot::Sender<Result<()>>>,
    address: String,
    reconnect_min: Duration,
    reconnect_max: Duration,
}

impl Driver {
    async fn run(mut self) {
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut delay = self.reconnect_min;
        let mut awaiting_suback = false;
        loop {
            let event = tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => {
                    self.disconnect().await;
                    break;
                }
                event = self.eventloop.poll() => event,
            };
            match event {
                Ok(Event::Incoming(Packet::ConnAck(connack))) => {
                    if let Some(max) = connack.properties.as_ref().and_then(|p| p.max_packet_size) {
                        self.shared
                            .max_packet_size
                            .store(max as usize, Ordering::Relaxed);
                    }
                    awaiting_suback = true;
                    self.subscribe();
                }
                Ok(Event::Incoming(Packet::SubAck(suback))) if awaiting_suback => {
                    awaiting_suback = false;
                    let refused = suback
                        .return_codes
                        .iter()
                        .any(|code| !matches!(code, SubscribeReasonCode::Success(_)));
                    if refused {
                        let topics = format!(
                            "{} or {}",
                            self.shared.response_topic,
                            notification_filter(self.shared.client_id.as_bytes())
                        );
                        if let Some(first) = self.first.take() {
                            let _ = first.send(Err(Error::SubscriptionRefused(topics)));
                            break;
                        }
                        self.shared.set_link(|s| s.refused = Some(topics));
                    } else {
                        delay = self.reconnect_min;
                        self.shared.set_link(|s| {
                            s.epoch += 1;
                            s.ready = true;
                            s.refused = None;
                        });
                        if let Some(first) = self.first.take() {
                            let _ = first.send(Ok(()));
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => self.shared.dispatch(publish),
                Ok(_) => {}
                Err(error) => {
                    awaiting_suback = false;
                    self.shared.set_link(|s| {
                        s.ready = false;
                        s.refused = None;
                    });
                    if let Some(first) = self.first.take() {
                        let _ = first.send(Err(Error::Connect {
                            address: self.address.clone(),
                            reason: describe(&error),
                        }));
                        break;
                    }
                    tracing::debug!(error = %describe(&error), ?delay, "connection lost; reconnecting");
                    tokio::select! {
                        _ = stopped(&mut shutdown) => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = delay.saturating_mul(2).min(self.reconnect_max);
                }
            }
        }
        self.shared.close();
    }

    /// Subscribes to the response topic and the notification filter in one
    /// SUBSCRIBE. Sent from a task of its own because the request channel
    /// is drained by this very loop.
    fn subscribe(&self) {
        let filters = vec![
            Filter::new(self.shared.response_topic.clone(), QoS::AtLeastOnce),
            Filter::new(
                notification_filter(self.shared.client_id.as_bytes()),
                QoS::AtLeastOnce,
            ),
        ];
        let mqtt = self.shared.mqtt.clone();
        tokio::spawn(async move {
            let _ = mqtt.subscribe_many(filters).await;
        });
    }

    /// Sends DISCONNECT if connected, giving it a moment to leave.
    async fn disconnect(&mut self) {
        if !self.shared.link.borrow().ready {
            return;
        }
        if self.shared.mqtt.try_disconnect().is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                match self.eventloop.poll().await {
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

/// Resolves once shutdown is requested (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

fn describe(error: &ConnectionError) -> String {
    match error {
        ConnectionError::ConnectionRefused(code) => {
            format!("the broker refused the connection ({code:?})")
        }
        ConnectionError::Io(e) => e.to_string(),
        ConnectionError::Timeout(_) => "timed out".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_rounded_up_to_whole_seconds() {
        assert_eq!(expiry_seconds(Duration::from_secs(10)), 10);
        assert_eq!(expiry_seconds(Duration::from_millis(10_001)), 11);
        assert_eq!(expiry_seconds(Duration::from_millis(1)), 1);
        assert_eq!(expiry_seconds(Duration::ZERO), 1);
        assert_eq!(expiry_seconds(Duration::from_secs(u64::MAX)), u32::MAX);
    }

    fn shared() -> Arc<Shared> {
        let options = ClientOptions::new("127.0.0.1", 1).client_id("unit-client");
        Shared::new(&options).expect("valid options").0
    }

    fn reply(payload: &'static [u8], user: &[(&str, &str)]) -> Reply {
        Reply {
            payload: Bytes::from_static(payload),
            properties: PublishProperties {
                content_type: Some(prop::CONTENT_TYPE.into()),
                user_properties: user
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                ..Default::default()
            },
            seq: 0,
        }
    }

    #[test]
    fn request_properties_are_what_the_sdks_send() {
        let shared = shared();
        let correlation = random_uuid_bytes();
        let token = Hlc::new(5, 0, "srv");
        let p = shared.request_properties(&correlation, Some(&token), Duration::from_millis(2_500));
        assert_eq!(
            p.response_topic.as_deref(),
            Some("clients/unit-client/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response")
        );
        assert_eq!(p.correlation_data.as_deref(), Some(&correlation[..]));
        assert_eq!(p.message_expiry_interval, Some(3));
        assert_eq!(p.content_type.as_deref(), Some("application/octet-stream"));
        assert_eq!(p.payload_format_indicator, None);
        let names: Vec<&str> = p.user_properties.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["__ft", "__srcId", "__ts", "__protVer"]);
        assert_eq!(p.user_properties[0].1, token.to_string());
        assert_eq!(p.user_properties[1].1, "unit-client");
        let ts = Hlc::parse(&p.user_properties[2].1).expect("__ts is an HLC");
        assert_eq!(ts.node_id.len(), 36);
        assert_eq!(p.user_properties[3].1, "1.0");
        // Without a fencing token there is no __ft at all.
        let p = shared.request_properties(&correlation, None, Duration::from_secs(10));
        assert!(p.user_properties.iter().all(|(k, _)| k != "__ft"));
        assert_eq!(p.message_expiry_interval, Some(10));
    }

    #[test]
    fn correlation_data_is_16_bytes_of_a_v4_uuid() {
        let c = random_uuid_bytes();
        assert_eq!(c.len(), 16);
        assert_eq!(c[6] >> 4, 4);
        assert_eq!(c[8] >> 6, 0b10);
        assert_ne!(c, random_uuid_bytes());
    }

    #[test]
    fn answers_are_checked_like_the_sdks_do() {
        let shared = shared();
        let ok = shared
            .interpret(
                "SET",
                reply(
                    b"+OK\r\n",
                    &[("__stat", "200"), ("__ts", "001795318897606:00000:srv")],
                ),
            )
            .expect("valid answer");
        assert_eq!(ok.response, Response::Ok);
        assert_eq!(ok.version, Some(Hlc::new(1_795_318_897_606, 0, "srv")));
        // The clock moved past the version it saw.
        assert!(shared.clock.tick() > Hlc::new(1_795_318_897_606, 0, "srv"));

        let known = shared
            .interpret(
                "SET",
                reply(
                    b"-ERR a fencing token is required for this request\r\n",
                    &[("__stat", "200")],
                ),
            )
            .unwrap_err();
        assert_eq!(
            known.server_kind(),
            Some(mqkv_protocol::ErrorKind::MissingFencingToken)
        );
        let unknown = shared
            .interpret(
                "GET",
                reply(b"-ERR something new\r\n", &[("__stat", "200")]),
            )
            .unwrap_err();
        assert!(
            matches!(&unknown, Error::Server(ServerError::Unknown(t)) if t == "something new"),
            "{unknown:?}"
        );

        for (payload, user, what) in [
            (&b"+OK\r\n"[..], vec![], "missing __stat"),
            (b"+OK\r\n", vec![("__stat", "x")], "bad __stat"),
            (b"", vec![("__stat", "505"), ("__stMsg", "no")], "505"),
            (
                b"+OK\r\n",
                vec![("__stat", "200"), ("__protVer", "2.0")],
                "version 2",
            ),
            (
                b"+OK\r\n",
                vec![("__stat", "200"), ("__ts", "nonsense")],
                "bad __ts",
            ),
            (b"", vec![("__stat", "200")], "empty payload"),
            (b"-1\r\n", vec![("__stat", "200")], "article's -1"),
        ] {
            let mut r = reply(b"", &user);
            r.payload = Bytes::from_static(payload);
            let e = shared.interpret("SET", r).unwrap_err();
            assert!(matches!(e, Error::Protocol { .. }), "{what}: {e:?}");
        }
        let mut foreign = reply(b"+OK\r\n", &[("__stat", "200")]);
        foreign.properties.content_type = Some("text/plain".into());
        assert!(shared.interpret("SET", foreign).is_err());
        let mut absent = reply(b"+OK\r\n", &[("__stat", "200")]);
        absent.properties.content_type = None;
        assert!(shared.interpret("SET", absent).is_ok());
    }

    #[test]
    fn short_keep_alives_and_timeouts_are_raised_not_refused() {
        let options = ClientOptions::new("127.0.0.1", 1)
            .keep_alive(Duration::ZERO)
            .connect_timeout(Duration::ZERO);
        assert!(Shared::new(&options).is_ok());
    }

    #[test]
    fn client_ids_that_break_topics_are_refused() {
        for id in ["", "a/b", "a+b", "a#"] {
            let options = ClientOptions::new("127.0.0.1", 1).client_id(id);
            assert!(matches!(
                Shared::new(&options),
                Err(Error::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn response_topic_is_the_rust_sdk_shape() {
        assert_eq!(
            response_topic("c1"),
            "clients/c1/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response"
        );
    }
}
