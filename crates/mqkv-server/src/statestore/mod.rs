//! The state store as an in-process broker service: MQTT requests in, the state machine in the
//! middle, responses and key notifications out.
//!
//! The service claims the request topic, so it sees every request together with the connection
//! identity of the client that sent it. It validates what only the receiving node can judge
//! (protocol version, timestamp syntax and clock skew), builds a log entry carrying the wall
//! clock, and hands it to the replicated log ([`StoreNode::write`]); the answer goes out once the
//! entry is durable and applied. Reads (GET, SCAN) are served from the applied state. Key
//! observations (KEYNOTIFY) are node-local: they belong to one connection and end with it.
//!
//! Ordering guarantee: notifications are sent from the apply hook, in log order, before
//! `write` returns, so the notifications a request causes are in the observers' sessions before
//! the request's response is published; a client that observes and mutates the same key sees the
//! notification first.

pub mod counters;
mod notifier;
mod rate;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use mqkv_broker::access::Reserved;
use mqkv_broker::codec::{PropStr, Properties, QoS};
use mqkv_broker::{Broker, ClientIdentity, Handled, OutboundMessage, Service, ServicePublish};
use mqkv_protocol::properties as prop;
use mqkv_protocol::{
    hex_upper, is_reserved_response_topic, parse_request_bytes, response, Command, Hlc, Response,
    NOTIFY_TOPIC_PREFIX, REQUEST_TOPIC,
};
use mqkv_raft::StoreNode;
use mqkv_store::{DedupId, Entry, Op, Request};

pub use counters::StoreCounters;
pub use notifier::Notifier;

/// How long a request's answer is remembered for redeliveries when the request carries no
/// message expiry (the SDKs always send one).
const DEFAULT_DEDUP_WINDOW_MS: u64 = 60_000;

/// Longest the expiry loop waits before it looks at the earliest deadline again, whatever it
/// expects: a new deadline wakes it sooner, but a snapshot installed from another member
/// does not.
const EXPIRY_LOOK_EVERY: Duration = Duration::from_secs(1);

/// The response topic of requests made inside this process; nothing is published to it.
const LOCAL_RESPONSE_TOPIC: &str = "$mqkv/local/response";

/// The node id in the timestamp of requests made inside this process.
const LOCAL_NODE: &str = "mqkv-dashboard";

/// Reason code sent to a client whose request names a reserved response topic.
const RESERVED_RESPONSE_TOPIC_REASON: u8 = mqkv_broker::codec::reason::NOT_AUTHORIZED;

/// Wall clock in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The running service.
pub struct StateStoreService {
    broker: Broker,
    node: StoreNode,
    notifier: Arc<Notifier>,
    /// Requests per second per connection, when limited.
    rate: Option<rate::RateLimit>,
    counters: Arc<StoreCounters>,
}

impl StateStoreService {
    /// Claims the request topic on `broker` and serves it from `node`. `notifier` must be the
    /// one whose hook `node` was opened with.
    /// `max_requests_per_second` limits each connection (0: no limit).
    pub fn start(
        broker: &Broker,
        node: StoreNode,
        notifier: Arc<Notifier>,
        max_requests_per_second: u32,
        counters: Arc<StoreCounters>,
    ) -> Arc<StateStoreService> {
        let service = Arc::new(StateStoreService {
            broker: broker.clone(),
            node,
            notifier,
            counters,
            rate: (max_requests_per_second > 0)
                .then(|| rate::RateLimit::new(max_requests_per_second)),
        });
        // Notifications are the server's: no client publishes a forged one, nor subscribes by
        // name to another client's.
        broker.reserve(Reserved {
            prefix: NOTIFY_TOPIC_PREFIX.to_owned(),
            own: Box::new(|client_id| {
                format!("{NOTIFY_TOPIC_PREFIX}{}/", hex_upper(client_id.as_bytes()))
            }),
        });
        broker.claim(&[REQUEST_TOPIC], Arc::new(Handle(service.clone())));
        tokio::spawn(service.clone().expire_loop());
        service
    }

    /// Serves one request made inside this process (the dashboard) as the client `from`,
    /// exactly as the same request sent over MQTT would be served: the same checks, grants,
    /// counters and log. Returns the response and its version (`__ts`), or the text of a
    /// failure that has no RESP3 form (the store unavailable).
    pub async fn local_request(
        &self,
        command: &Command,
        from: ClientIdentity,
    ) -> Result<(Response, Option<Hlc>), String> {
        let publish = ServicePublish {
            topic: REQUEST_TOPIC.to_owned(),
            payload: command.encode(),
            qos: QoS::AtLeastOnce,
            properties: Properties {
                response_topic: Some(LOCAL_RESPONSE_TOPIC.to_owned()),
                correlation_data: Some(Bytes::from_static(b"local")),
                user_properties: vec![
                    (
                        PropStr::Borrowed(prop::PROTOCOL_VERSION),
                        PropStr::Borrowed(prop::PROTOCOL_VERSION_VALUE),
                    ),
                    (
                        PropStr::Borrowed(prop::TIMESTAMP),
                        PropStr::Owned(Hlc::new(now_ms(), 0, LOCAL_NODE).to_text()),
                    ),
                ],
                ..Default::default()
            },
            from,
        };
        let answer = match self.request(publish) {
            Handled::Done(answer) => answer,
            Handled::Running(future) => future.await,
            Handled::AfterEarlier(_) => None,
        };
        let Some(answer) = answer else {
            return Err("the request was not answered".to_owned());
        };
        let property = |name: &str| {
            answer
                .properties
                .user_properties
                .iter()
                .find(|(k, _)| &**k == name)
                .map(|(_, v)| v.to_string())
        };
        if property(prop::STATUS).as_deref() != Some(prop::STATUS_OK) {
            return Err(property(prop::STATUS_MESSAGE).unwrap_or_else(|| "failed".to_owned()));
        }
        let response = Response::parse(&answer.payload).map_err(|e| e.to_string())?;
        let version = property(prop::TIMESTAMP).and_then(|t| Hlc::parse(&t).ok());
        Ok((response, version))
    }

    /// Counts a SET refused before it reached the log (AIO counts requests, errors included)
    /// as an insertion or a modification, by whether its key exists. Only refusals pay for
    /// the look: an applied SET is classified by the store as it applies it.
    fn count_refused_set(&self, command: &Command, now: u64) {
        if let Command::Set { key, .. } = command {
            let exists = self
                .node
                .read(|m| m.get_with(key, now, |_, _| ()).is_some());
            self.counters.set_applied(!exists);
        }
    }

    /// Proposes an expiry entry whenever the earliest key deadline passes.
    async fn expire_loop(self: Arc<Self>) {
        loop {
            let next = self.node.read(|m| m.next_expiry_ms());
            // Only the leader proposes expiry; every node applies it from the log. Another
            // node looks again now and then, in case it leads by then.
            let wait = match next {
                _ if !self.node.is_leader() => EXPIRY_LOOK_EVERY,
                Some(at) => Duration::from_millis(at.saturating_sub(now_ms())),
                None => EXPIRY_LOOK_EVERY,
            }
            .min(EXPIRY_LOOK_EVERY);
            if wait.is_zero() {
                match self
                    .node
                    .write(Entry {
                        now_ms: now_ms(),
                        op: Op::ExpireDue,
                    })
                    .await
                {
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "expiring keys failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.notifier.deadline_set.notified() => {}
            }
        }
    }

    /// Handles one request: reads and KEYNOTIFY at once, writes through the log (the returned
    /// future finishes when the write is durable and applied). The answer goes back to the
    /// connection, which publishes it in the order the requests arrived.
    fn request(&self, mut p: ServicePublish) -> Handled {
        let (Some(response_topic), Some(correlation)) = (
            p.properties.response_topic.take(),
            p.properties.correlation_data.take(),
        ) else {
            tracing::warn!(client_id = %p.from.client_id, "state store request without response topic or correlation data dropped");
            return Handled::Done(None);
        };
        if is_reserved_response_topic(&response_topic) {
            tracing::warn!(client_id = %p.from.client_id, %response_topic, "state store request with a reserved response topic: client disconnected");
            self.broker.disconnect_client(
                &p.from.client_id,
                p.from.connection_id,
                RESERVED_RESPONSE_TOPIC_REASON,
            );
            return Handled::Done(None);
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
                .map(|(_, v)| &**v)
        };
        if let Some(v) = user(prop::PROTOCOL_VERSION) {
            if !mqkv_protocol::protocol_version_supported(v) {
                return Handled::Done(Some(unsupported_version(reply, v)));
            }
        }
        if let Some(rate) = &self.rate {
            if !rate.take(p.from.connection_id, std::time::Instant::now()) {
                let over = Response::Error(mqkv_protocol::ErrorKind::QuotaExceeded);
                return Handled::Done(Some(respond(reply, &over, None)));
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
            Err(kind) => return Handled::Done(Some(respond(reply, &Response::Error(kind), None))),
        };
        // A SET counts as an insertion or a modification once applied: the store says which.
        self.counters.request(&request.command);
        let started = std::time::Instant::now();
        let command = counters::command_index(&request.command);
        if let Err(kind) = mqkv_store::validate(&request, now) {
            self.count_refused_set(&request.command, now);
            return Handled::Done(Some(respond(reply, &Response::Error(kind), None)));
        }
        if !authorized(&request.command, &p.from) {
            self.count_refused_set(&request.command, now);
            mqkv_broker::stats::add(&self.counters.here().not_authorized, 1);
            tracing::debug!(client_id = %p.from.client_id, command = request.command.verb(), "state store request not authorized");
            let denied = Response::Error(mqkv_protocol::ErrorKind::NotAuthorized);
            return Handled::Done(Some(respond(reply, &denied, None)));
        }
        let answer = match &request.command {
            Command::KeyNotify { key, stop } => {
                let mut observers = self.notifier.observers.lock();
                let response = if *stop {
                    if observers.stop(&p.from, key) {
                        Response::Ok
                    } else {
                        Response::Integer(0)
                    }
                } else if !mqkv_protocol::topic::observable(p.from.client_id.as_bytes(), key) {
                    // No notification of it could be sent: refused before it is registered.
                    Response::Error(mqkv_protocol::ErrorKind::KeyTooLongToObserve)
                } else if observers.start(&p.from, key, self.notifier.max_observed) {
                    Response::Ok
                } else {
                    // As the store's own quotas answer.
                    Response::Error(mqkv_protocol::ErrorKind::QuotaExceeded)
                };
                drop(observers);
                respond(reply, &response, None)
            }
            Command::KeyNotifySince { key, since } => {
                let node = &self.node;
                let response = self.notifier.resume(&p.from, key, since, || {
                    node.read(|m| m.history_since(key, since))
                });
                respond(reply, &response, None)
            }
            Command::KeyNotifyPatternSince { pattern, since } => {
                let node = &self.node;
                let who = &p.from;
                let glob = mqkv_protocol::GlobPattern::new(pattern);
                let response = self.notifier.resume_pattern(who, pattern, since, || {
                    node.read(|m| {
                        m.history_since_where(since, |key| {
                            glob.matches(key) && who.may_use(key, false)
                        })
                    })
                });
                respond(reply, &response, None)
            }
            Command::KeyNotifyPattern { pattern, stop } => {
                let mut observers = self.notifier.observers.lock();
                let response = if *stop {
                    if observers.stop_pattern(&p.from, pattern) {
                        Response::Ok
                    } else {
                        Response::Integer(0)
                    }
                } else if observers.start_pattern(&p.from, pattern, self.notifier.max_patterns) {
                    Response::Ok
                } else {
                    Response::Error(mqkv_protocol::ErrorKind::QuotaExceeded)
                };
                drop(observers);
                respond(reply, &response, None)
            }
            Command::Get { .. } | Command::Scan { .. } | Command::MGet { .. }
                if self.node.is_clustered() =>
            {
                // Served once this node has applied every write acknowledged anywhere before
                // the request arrived.
                let node = self.node.clone();
                let ready = node.linearizable();
                let who = p.from;
                let counters = self.counters.clone();
                return Handled::Running(Box::pin(async move {
                    let answer = match ready.await {
                        Ok(()) => read(&node, &request.command, reply, now_ms(), &who),
                        Err(e) => unavailable(reply, &e.to_string()),
                    };
                    counters.answered(command, started.elapsed());
                    Some(answer)
                }));
            }
            Command::Get { .. } | Command::Scan { .. } | Command::MGet { .. } => {
                read(&self.node, &request.command, reply, now, &p.from)
            }
            Command::Set { .. }
            | Command::Del { .. }
            | Command::VDel { .. }
            | Command::DelIfVersion { .. } => {
                let set = matches!(request.command, Command::Set { .. });
                let window = reply
                    .expiry
                    .map_or(DEFAULT_DEDUP_WINDOW_MS, |s| u64::from(s) * 1000);
                request.dedup = Some(DedupId {
                    client_id: Arc::clone(&p.from.client_id),
                    correlation: reply.correlation.clone(),
                    expires_at_ms: now.saturating_add(window),
                });
                // Queued for the log now; the future the connection keeps holds only the
                // answer's way back, not the entry.
                let written = self.node.write(Entry {
                    now_ms: now,
                    op: Op::Request(request),
                });
                let counters = self.counters.clone();
                return Handled::Running(Box::pin(async move {
                    let answer = match written.await {
                        Ok(applied) => {
                            if set {
                                counters.set_applied(applied.created);
                            }
                            respond(reply, &applied.response, applied.version.as_ref())
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "state store write failed");
                            unavailable(reply, &e.to_string())
                        }
                    };
                    counters.answered(command, started.elapsed());
                    Some(answer)
                }));
            }
        };
        self.counters.answered(command, started.elapsed());
        Handled::Done(Some(answer))
    }
}

/// Whether the client may make this request: `Read` for GET and KEYNOTIFY (and for every key
/// of an MGET), `Write` for SET, DEL and VDEL. SCAN lists only the keys the client may read,
/// and ending an observation needs no grant.
fn authorized(command: &Command, who: &ClientIdentity) -> bool {
    match command {
        Command::Get { key }
        | Command::KeyNotify { key, stop: false }
        | Command::KeyNotifySince { key, .. } => who.may_use(key, false),
        Command::MGet { keys } => keys.iter().all(|key| who.may_use(key, false)),
        Command::Set { key, .. }
        | Command::Del { key }
        | Command::VDel { key, .. }
        | Command::DelIfVersion { key, .. } => who.may_use(key, true),
        // A pattern watch, like SCAN, notifies only the keys the client may read.
        Command::KeyNotify { stop: true, .. }
        | Command::Scan { .. }
        | Command::KeyNotifyPattern { .. }
        | Command::KeyNotifyPatternSince { .. } => true,
    }
}

/// Answers a GET or SCAN from the applied state.
fn read(
    node: &StoreNode,
    command: &Command,
    reply: Reply,
    now: u64,
    who: &ClientIdentity,
) -> OutboundMessage {
    match command {
        Command::Get { key } => {
            // Encoded straight from the stored value, which is not copied first, and its
            // version written out there too: a copy of the version would take and drop a
            // reference to the node id every version shares.
            let hit = node.read(|m| {
                m.get_with(key, now, |value, version| {
                    (response::encode_value(value), version.to_text())
                })
            });
            match hit {
                Some((payload, version)) => respond_payload(reply, payload, Some(version)),
                None => respond(reply, &Response::Nil, None),
            }
        }
        Command::MGet { keys } => {
            let values = node.read(|m| m.mget(keys, now));
            respond(reply, &values, None)
        }
        Command::Scan { pattern, token } => {
            let page = node.read(|m| {
                m.scan_where(pattern, token.as_deref(), now, |key| {
                    who.may_use(key, false)
                })
            });
            respond(reply, &page, None)
        }
        other => {
            tracing::error!(?other, "a request that is not a read was answered as one");
            unavailable(reply, "internal error: not a read")
        }
    }
}

fn respond(reply: Reply, response: &Response, version: Option<&Hlc>) -> OutboundMessage {
    respond_payload(reply, response.encode(), version.map(Hlc::to_text))
}

/// An answer with status 200 and an already encoded response.
fn respond_payload(reply: Reply, payload: Bytes, version: Option<String>) -> OutboundMessage {
    let mut user_properties = Vec::with_capacity(3);
    user_properties.push((
        PropStr::Borrowed(prop::STATUS),
        PropStr::Borrowed(prop::STATUS_OK),
    ));
    user_properties.push((
        PropStr::Borrowed(prop::PROTOCOL_VERSION),
        PropStr::Borrowed(prop::PROTOCOL_VERSION_VALUE),
    ));
    if let Some(v) = version {
        user_properties.push((PropStr::Borrowed(prop::TIMESTAMP), PropStr::Owned(v)));
    }
    answer(reply, payload, user_properties)
}

fn unsupported_version(reply: Reply, requested: &str) -> OutboundMessage {
    let user_properties = vec![
        (
            PropStr::Borrowed(prop::STATUS),
            PropStr::Borrowed(prop::STATUS_VERSION_NOT_SUPPORTED),
        ),
        (
            PropStr::Borrowed(prop::STATUS_MESSAGE),
            PropStr::Owned(format!("protocol version {requested} is not supported")),
        ),
        (
            PropStr::Borrowed(prop::SUPPORTED_MAJOR_VERSIONS),
            PropStr::Borrowed(prop::SUPPORTED_MAJOR_VERSIONS_VALUE),
        ),
        (
            PropStr::Borrowed(prop::REQUEST_PROTOCOL_VERSION),
            PropStr::Owned(requested.to_owned()),
        ),
        (
            PropStr::Borrowed(prop::PROTOCOL_VERSION),
            PropStr::Borrowed(prop::PROTOCOL_VERSION_VALUE),
        ),
    ];
    answer(reply, Bytes::new(), user_properties)
}

/// The store could not take the request (it is shutting down or its disk failed).
fn unavailable(reply: Reply, why: &str) -> OutboundMessage {
    let user_properties = vec![
        (PropStr::Borrowed(prop::STATUS), PropStr::Borrowed("503")),
        (
            PropStr::Borrowed(prop::STATUS_MESSAGE),
            PropStr::Owned(why.to_owned()),
        ),
        (
            PropStr::Borrowed(prop::PROTOCOL_VERSION),
            PropStr::Borrowed(prop::PROTOCOL_VERSION_VALUE),
        ),
    ];
    answer(reply, Bytes::new(), user_properties)
}

fn answer(
    reply: Reply,
    payload: Bytes,
    user_properties: Vec<(PropStr, PropStr)>,
) -> OutboundMessage {
    OutboundMessage {
        topic: reply.topic,
        payload,
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Properties {
            content_type: Some(PropStr::Borrowed(prop::CONTENT_TYPE)),
            correlation_data: Some(reply.correlation),
            message_expiry_interval: reply.expiry,
            user_properties,
            ..Default::default()
        },
    }
}

/// Where and how to answer one request.
struct Reply {
    topic: String,
    correlation: Bytes,
    expiry: Option<u32>,
}

/// The service as the broker sees it.
struct Handle(Arc<StateStoreService>);

/// True for a request that must not start while the same connection's earlier requests are
/// under way: one that reads the state (GET, SCAN) or changes what the connection observes
/// (KEYNOTIFY). A request that cannot be parsed is answered with an error at once, whenever.
fn waits_for_earlier(publish: &ServicePublish) -> bool {
    publish.topic == REQUEST_TOPIC
        && matches!(
            parse_request_bytes(&publish.payload),
            Ok(Command::Get { .. }
                | Command::Scan { .. }
                | Command::MGet { .. }
                | Command::KeyNotify { .. }
                | Command::KeyNotifyPattern { .. }
                | Command::KeyNotifySince { .. }
                | Command::KeyNotifyPatternSince { .. })
        )
}

impl Service for Handle {
    /// Writes run alongside the connection's earlier writes still under way: the log keeps
    /// them in the order they were proposed, which is the order they arrived. Reads and
    /// KEYNOTIFY wait for them, so a client sees its own earlier writes.
    fn on_publish(&self, publish: ServicePublish, earlier_running: bool) -> Handled {
        if earlier_running && waits_for_earlier(&publish) {
            return Handled::AfterEarlier(Box::new(publish));
        }
        self.0.request(publish)
    }

    fn on_disconnect(&self, who: &ClientIdentity) {
        if let Some(rate) = &self.0.rate {
            rate.forget(who.connection_id);
        }
        self.0
            .notifier
            .observers
            .lock()
            .connection_closed(who.connection_id);
    }
}
