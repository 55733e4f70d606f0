//! Sessions: what the broker keeps for one client id across connections.
//!
//! A session owns its subscriptions (mirrored in the subscription index), the queue of messages
//! waiting to be sent, the outgoing QoS 1/2 messages in flight, and the packet ids of incoming
//! QoS 2 messages awaiting PUBREL. Publishers only ever push to a session's queue under its own
//! short lock, so a slow or stalled subscriber never holds up a publisher or another subscriber:
//! its queue fills to the configured bound and then the configured policy applies.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::codec::{self, Packet, PerReceiver, Properties, PublishRef, QoS, SubscriptionOptions};
use crate::config::QueueFullPolicy;
use crate::placement::{Output, Relocate, Sources};

/// A published message as routed: shared by every session that receives it.
#[derive(Debug)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Properties forwarded unchanged (no topic alias, no subscription identifiers).
    pub properties: Properties,
    pub expires_at: Option<Instant>,
    /// Client id of the publisher, for No Local.
    pub publisher: Option<Arc<str>>,
}

impl Message {
    /// A message a service sends: the broker itself is the publisher.
    pub fn from_service(m: crate::service::OutboundMessage) -> Message {
        Message {
            expires_at: m
                .properties
                .message_expiry_interval
                .map(|s| Instant::now() + std::time::Duration::from_secs(u64::from(s))),
            topic: m.topic,
            payload: m.payload,
            qos: m.qos,
            retain: m.retain,
            properties: m.properties,
            publisher: None,
        }
    }

    /// A copy that shares no memory with the packet it was read from. The bytes of a packet
    /// share their read buffer with the packets around it, so a message kept for long (a
    /// retained one) would otherwise keep that whole buffer.
    pub fn compacted(&self) -> Message {
        let copy = |b: &Bytes| Bytes::copy_from_slice(b);
        let mut properties = self.properties.clone();
        properties.correlation_data = properties.correlation_data.as_ref().map(copy);
        Message {
            topic: self.topic.clone(),
            payload: copy(&self.payload),
            qos: self.qos,
            retain: self.retain,
            properties,
            expires_at: self.expires_at,
            publisher: self.publisher.clone(),
        }
    }

    pub fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Seconds of message expiry left, rounded up, if the message has an expiry.
    pub fn remaining_expiry(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|t| {
            let left = t.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
        })
    }
}

/// One message on its way to one session.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message: Arc<Message>,
    pub qos: QoS,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
}

#[derive(Debug)]
pub(crate) enum Inflight {
    /// QoS 1 waiting for PUBACK, or QoS 2 waiting for PUBREC.
    Publish(Delivery),
    /// QoS 2 after PUBREC, waiting for PUBCOMP.
    Released,
}

/// A control packet queued on a link. Acknowledgements without properties, nearly every one,
/// are kept as their few bytes; anything else as the packet, boxed, so the queue's entries stay
/// small to move.
#[derive(Debug)]
enum Control {
    Ack {
        /// [`codec::ack_header`].
        header: u8,
        packet_id: u16,
        reason_code: u8,
    },
    Packet(Box<Packet>),
}

/// The per-connection view a session needs to encode for its current connection.
#[derive(Debug)]
pub struct Link {
    pub conn_id: u64,
    pub notify: Arc<Notify>,
    pub protocol_level: u8,
    pub receive_maximum: u16,
    pub max_packet_size: usize,
    pub topic_alias_maximum: u16,
    /// The metric category the client named (see [`crate::stats::Categories`]).
    pub category: usize,
    aliases: HashMap<String, u16>,
    control: VecDeque<Control>,
    /// Set when the connection must end after what is queued has been written.
    pub closing: bool,
    /// Inflight messages must be resent (the session was resumed on this link).
    resend: bool,
    /// The connection's reader is handling a batch of packets and will flush what is queued
    /// when it is done, so queueing need not wake the writer task.
    deferred: bool,
    /// Something was queued, or became ready to send, while `deferred` was set: the reader's
    /// flush has work to do. Without it, the flush can skip the writer's lock.
    queued_while_deferred: bool,
    /// How queued output reaches the connection's socket from the task that queued it.
    output: Option<Arc<dyn Output>>,
    /// The connection thread serving it (see [`crate::placement::current_home`]).
    home: usize,
    /// How a new connection for the same client asks this one to finish what it received.
    pub handover: Arc<Handover>,
    /// Which connection threads the messages routed to this connection came from lately.
    sources: Sources,
    /// How the connection is asked to move to the thread that sends it (nearly) everything.
    pub(crate) relocate: Arc<Relocate>,
}

/// A connection taken over by a new one for the same client first handles every packet it has
/// already received: a client that sends DISCONNECT (with a session expiry of 0, say) and then
/// connects again must find the first connection's DISCONNECT handled, even when another thread
/// serves the new connection and gets to its CONNECT first. The new connection asks and waits
/// (bounded); the old one's reader drains its socket without waiting, handles what it read, and
/// answers: at once if the connection goes on, after leaving the session if what it read ended
/// the connection.
#[derive(Debug, Default)]
pub struct Handover {
    requested: std::sync::atomic::AtomicBool,
    pub(crate) asked: Notify,
    finished: std::sync::atomic::AtomicBool,
    finished_notify: Notify,
}

impl Handover {
    /// Whether a new connection asked (see [`Handover::ask_and_wait`]).
    pub(crate) fn requested(&self) -> bool {
        self.requested.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Asks the connection to finish what it received, and waits until it says it has, or
    /// `limit` passes; whether it said so.
    pub(crate) async fn ask_and_wait(&self, limit: std::time::Duration) -> bool {
        let finished = self.finished_notify.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        self.requested
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.asked.notify_one();
        if self.finished.load(std::sync::atomic::Ordering::SeqCst) {
            return true;
        }
        tokio::time::timeout(limit, finished).await.is_ok()
    }

    /// Says that what the connection received before it was asked has been handled.
    pub(crate) fn finish(&self) {
        self.finished
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.finished_notify.notify_waiters();
    }
}

/// What a task needs to write a connection's queued output itself (see
/// [`Session::enqueue_direct`]).
pub(crate) struct Direct {
    pub(crate) output: Arc<dyn Output>,
    /// The connection thread that owns the socket: only a task on it writes directly.
    pub(crate) home: usize,
}

impl Link {
    /// Counts a delivery routed on connection thread `from` (see [`Sources`]).
    fn count_source(&mut self, from: usize) {
        self.sources.count(from, self.home, &self.relocate);
    }

    /// Wakes the writer unless the reader is about to flush anyway.
    fn wake(&mut self) {
        if self.deferred {
            self.queued_while_deferred = true;
        } else {
            self.notify.notify_one();
        }
    }
}

impl Link {
    pub fn new(
        conn_id: u64,
        protocol_level: u8,
        receive_maximum: u16,
        max_packet_size: usize,
        topic_alias_maximum: u16,
    ) -> Link {
        Link {
            conn_id,
            notify: Arc::new(Notify::new()),
            protocol_level,
            receive_maximum,
            max_packet_size,
            topic_alias_maximum,
            category: 0,
            aliases: HashMap::new(),
            control: VecDeque::new(),
            closing: false,
            resend: true,
            deferred: false,
            queued_while_deferred: false,
            output: None,
            home: 0,
            handover: Arc::new(Handover::default()),
            sources: Sources::default(),
            relocate: Arc::new(Relocate::default()),
        }
    }
}

/// A will waiting for its delay to pass.
#[derive(Debug)]
pub struct PendingWill {
    pub message: Arc<Message>,
    pub due: Instant,
}

#[derive(Debug, Default)]
pub struct SessionState {
    /// Subscriptions by the filter string as the client sent it (including `$share/...`).
    pub subscriptions: HashMap<String, (SubscriptionOptions, Option<u32>)>,
    pub(crate) queue: crate::queue::MessageQueue,
    /// Retained messages a subscription matched that did not fit in `queue` yet.
    pub(crate) retained_backlog: crate::backlog::RetainedBacklog,
    /// The queue length the backlog refills `queue` up to (the queue limit when it filled).
    pub(crate) backlog_limit: usize,
    pub(crate) inflight: VecDeque<(u16, Inflight)>,
    pub incoming_qos2: HashSet<u16>,
    pub(crate) next_packet_id: u16,
    pub link: Option<Link>,
    /// Session expiry interval in seconds; `u32::MAX` never expires.
    pub expiry_interval: u32,
    pub disconnected_at: Option<Instant>,
    pub pending_will: Option<PendingWill>,
    pub dropped_messages: u64,
    /// Who the session's latest connection authenticated as (unknown for a session restored
    /// from disk until its client returns).
    pub principal: Option<Arc<crate::access::Principal>>,
    /// What the policy lets the principal do; `None` without a policy (or principal).
    pub grants: Option<Arc<dyn crate::access::Grants>>,
    /// The subscriptions (of `subscriptions`) whose messages are checked against `grants`.
    pub filtered: HashSet<String>,
    /// Where sending and dropping messages is counted, once a connection attached it.
    pub(crate) stats: Option<Arc<crate::stats::PerThread<crate::stats::Counters>>>,
}

/// Limits a session applies to its queue.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    pub max_queued: usize,
    pub policy: QueueFullPolicy,
}

#[derive(Debug)]
pub struct Session {
    pub client_id: Arc<str>,
    pub state: Mutex<SessionState>,
}

/// Result of asking a session to take a message.
#[derive(Debug, PartialEq, Eq)]
pub enum Enqueued {
    Yes,
    Dropped,
}

impl Session {
    pub fn new(client_id: Arc<str>) -> Session {
        Session {
            client_id,
            state: Mutex::new(SessionState {
                next_packet_id: 1,
                ..Default::default()
            }),
        }
    }

    /// Whether the session's grants let it receive a message published to `topic`.
    pub fn may_receive(&self, topic: &str) -> bool {
        self.state
            .lock()
            .grants
            .as_ref()
            .is_none_or(|g| g.may_receive(topic))
    }

    /// Drops the queued messages (not yet sent) whose topic `drop` picks; returns how many.
    pub fn drop_queued(&self, drop: impl Fn(&str) -> bool) -> usize {
        let mut st = self.state.lock();
        let before = st.queue.len() + st.retained_backlog.len();
        st.queue.retain(|d| !drop(&d.message.topic));
        st.retained_backlog.retain(|topic| !drop(topic));
        before - st.queue.len() - st.retained_backlog.len()
    }

    /// Queues a message and wakes the connection, if any.
    pub fn enqueue(&self, d: Delivery, limits: QueueLimits) -> Enqueued {
        self.queue(d, limits, None).0
    }

    /// Queues a message like [`Session::enqueue`], but when the connection's writer could take
    /// it straight away, returns the writer instead of waking the writer task: the caller then
    /// writes it with [`Output::write_ready`], which saves a task hand-off per
    /// message and gets the message out before the caller's own acknowledgements. `from` is the
    /// connection thread routing the message (see [`crate::placement::current_home`]): where a
    /// connection's messages come from decides whether it is asked to move (see [`Relocate`]).
    pub(crate) fn enqueue_direct(
        &self,
        d: Delivery,
        limits: QueueLimits,
        from: usize,
    ) -> (Enqueued, Option<Direct>) {
        self.queue(d, limits, Some(from))
    }

    fn queue(
        &self,
        d: Delivery,
        limits: QueueLimits,
        direct_from: Option<usize>,
    ) -> (Enqueued, Option<Direct>) {
        let mut st = self.state.lock();
        let offline = st.link.is_none();
        if offline && d.qos == QoS::AtMostOnce {
            // QoS 0 messages are not kept for disconnected sessions.
            if let Some(stats) = &st.stats {
                crate::stats::add(&stats.here().qos0_dropped, 1);
            }
            return (Enqueued::Dropped, None);
        }
        let mut result = Enqueued::Yes;
        if st.queue.len() >= limits.max_queued || !st.queue.fits(&d) {
            st.dropped_messages += 1;
            let dropped_qos = match limits.policy {
                QueueFullPolicy::DropNew => d.qos,
                QueueFullPolicy::DropOldest => st.queue.front().map_or(d.qos, |o| o.qos),
            };
            if let Some(stats) = &st.stats {
                let here = stats.here();
                crate::stats::add(&here.queue_full_dropped, 1);
                if dropped_qos == QoS::AtMostOnce {
                    crate::stats::add(&here.qos0_dropped, 1);
                }
            }
            match limits.policy {
                QueueFullPolicy::DropNew => return (Enqueued::Dropped, None),
                QueueFullPolicy::DropOldest => {
                    // Over the bytes budget with nothing of its own to give up (or still over
                    // after), the session drops the new message instead.
                    if st.queue.pop_front().is_none() || !st.queue.fits(&d) {
                        return (Enqueued::Dropped, None);
                    }
                    result = Enqueued::Dropped;
                }
            }
        }
        if !st.retained_backlog.is_empty() {
            st.retained_backlog.supersede(&d.message.topic);
        }
        st.queue.push_back(d);
        let Some(link) = &mut st.link else {
            return (result, None);
        };
        if let Some(from) = direct_from {
            link.count_source(from);
        }
        if direct_from.is_some() && !link.deferred && !link.closing {
            if let Some(output) = &link.output {
                let handle = Direct {
                    output: output.clone(),
                    home: link.home,
                };
                return (result, Some(handle));
            }
        }
        link.wake();
        (result, None)
    }

    /// The connection thread serving the session's connection (see
    /// [`crate::placement::current_home`]); 0 when offline.
    #[cfg(test)]
    pub(crate) fn home(&self) -> usize {
        self.state.lock().link.as_ref().map_or(0, |l| l.home)
    }

    /// Lets other tasks write connection `conn_id`'s output through `output`; `home` is the
    /// connection thread that serves the connection.
    pub(crate) fn set_output(&self, conn_id: u64, output: Arc<dyn Output>, home: usize) {
        let mut st = self.state.lock();
        if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            link.output = Some(output);
            link.home = home;
        }
    }

    /// Queues a control packet (SUBACK, PINGRESP, DISCONNECT, ...) for the given connection.
    pub fn send_control(&self, conn_id: u64, p: Packet) {
        self.push_control(conn_id, Control::Packet(Box::new(p)));
    }

    /// Queues an acknowledgement without properties (PUBACK, PUBREC, PUBREL or PUBCOMP, as
    /// `header` says: [`codec::ack_header`]) for the given connection.
    pub fn send_ack(&self, conn_id: u64, header: u8, packet_id: u16, reason_code: u8) {
        self.push_control(
            conn_id,
            Control::Ack {
                header,
                packet_id,
                reason_code,
            },
        );
    }

    fn push_control(&self, conn_id: u64, control: Control) {
        let mut st = self.state.lock();
        if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            link.control.push_back(control);
            link.wake();
        }
    }

    /// The connection's reader will flush queued output itself (see `Link`) until
    /// [`Session::end_deferral`].
    pub fn defer(&self, conn_id: u64) {
        let mut st = self.state.lock();
        if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            // `queued_while_deferred` is left as it is: a deferral already under way (a service
            // started while the reader defers) keeps what it has seen; only the end clears it.
            link.deferred = true;
        }
    }

    /// Queueing wakes the writer again. Returns whether anything was queued for connection
    /// `conn_id`, or became ready to send, since [`Session::defer`]: what the reader must
    /// flush. True also when the session is no longer on that connection, so that the flush
    /// finds out.
    pub fn end_deferral(&self, conn_id: u64) -> bool {
        let mut st = self.state.lock();
        match st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            Some(link) => {
                link.deferred = false;
                std::mem::take(&mut link.queued_while_deferred)
            }
            None => true,
        }
    }

    /// Ends connection `conn_id` after what is queued has been written, with a DISCONNECT
    /// carrying `reason` first for MQTT 5 clients. Returns false if that connection is gone.
    pub fn close(&self, conn_id: u64, reason: Option<u8>) -> bool {
        let mut st = self.state.lock();
        let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) else {
            return false;
        };
        if let Some(reason_code) = reason.filter(|_| link.protocol_level == codec::V5) {
            link.control
                .push_back(Control::Packet(Box::new(Packet::Disconnect(
                    codec::Disconnect {
                        reason_code,
                        ..Default::default()
                    },
                ))));
        }
        link.closing = true;
        link.notify.notify_one();
        true
    }

    /// Handles PUBACK (QoS 1) or PUBCOMP (QoS 2 completed). Returns false for unknown ids.
    pub fn complete(&self, conn_id: u64, packet_id: u16) -> bool {
        let mut st = self.state.lock();
        let Some(pos) = st.inflight.iter().position(|(id, _)| *id == packet_id) else {
            return false;
        };
        st.inflight.remove(pos);
        // A freed place in the window can only let a queued (or backlogged) message go.
        if st.queue.is_empty() && st.retained_backlog.is_empty() {
            return true;
        }
        if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            link.wake();
        }
        true
    }

    /// Handles PUBREC: the message is now released; answer PUBREL.
    pub fn received(&self, conn_id: u64, packet_id: u16, reason: u8) -> bool {
        let mut st = self.state.lock();
        let Some(pos) = st.inflight.iter().position(|(id, _)| *id == packet_id) else {
            return false;
        };
        if reason >= 0x80 {
            // The receiver refused the message: it is done.
            st.inflight.remove(pos);
        } else {
            st.inflight[pos].1 = Inflight::Released;
            if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
                link.control.push_back(Control::Ack {
                    header: codec::ack_header::PUBREL,
                    packet_id,
                    reason_code: codec::reason::SUCCESS,
                });
            }
        }
        if let Some(link) = st.link.as_mut().filter(|l| l.conn_id == conn_id) {
            link.wake();
        }
        true
    }

    /// Encodes what is ready to go for connection `conn_id` into `out`. Returns `None` when the
    /// connection is no longer this session's, else whether it must close after writing.
    pub fn drain(&self, conn_id: u64, out: &mut BytesMut, budget: usize) -> Option<bool> {
        let now = Instant::now();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if !st.retained_backlog.is_empty() {
            st.retained_backlog.refill(&mut st.queue, st.backlog_limit);
        }
        let link = st.link.as_mut().filter(|l| l.conn_id == conn_id)?;
        let level = link.protocol_level;
        // PUBLISH packets written, and their payload bytes.
        let (mut sent, mut bytes) = (0u64, 0u64);
        while let Some(control) = link.control.pop_front() {
            match control {
                Control::Ack {
                    header,
                    packet_id,
                    reason_code,
                } => codec::encode_plain_ack(out, header, packet_id, reason_code, level),
                Control::Packet(p) => p.encode(out, level),
            }
        }
        if link.closing {
            return Some(true);
        }
        if link.resend {
            link.resend = false;
            for (id, inf) in &st.inflight {
                match inf {
                    Inflight::Publish(d) => {
                        if let Some(p) = build_publish(d, *id, true, now, link) {
                            p.encode(out, level);
                            sent += 1;
                            bytes += d.message.payload.len() as u64;
                        }
                    }
                    Inflight::Released => Packet::PubRel(codec::Ack {
                        packet_id: *id,
                        ..Default::default()
                    })
                    .encode(out, level),
                }
            }
        }
        while out.len() < budget {
            let head_qos = match st.queue.front() {
                None => break,
                Some(d) => d.qos,
            };
            if head_qos != QoS::AtMostOnce && st.inflight.len() >= usize::from(link.receive_maximum)
            {
                break;
            }
            let Some(d) = st.queue.pop_front() else { break };
            if d.message.expired(now) {
                continue;
            }
            let mut packet_id = 0;
            if d.qos != QoS::AtMostOnce {
                packet_id = next_id(&mut st.next_packet_id, &st.inflight);
            }
            let Some(p) = build_publish(&d, packet_id, false, now, link) else {
                // Larger than the client accepts: discarded as if delivered [MQTT-3.1.2-25].
                continue;
            };
            p.encode(out, level);
            sent += 1;
            bytes += d.message.payload.len() as u64;
            if d.qos != QoS::AtMostOnce {
                st.inflight.push_back((packet_id, Inflight::Publish(d)));
            }
        }
        // Not a clone of the shared `Arc`: its count would move between threads on every pass.
        if let Some(stats) = st.stats.as_deref().filter(|_| sent > 0) {
            let category = st.link.as_ref().map_or(0, |l| l.category);
            let here = &stats.here().traffic[category];
            crate::stats::add(&here.publishes_sent, sent);
            crate::stats::add(&here.payload_bytes_sent, bytes);
        }
        Some(false)
    }

    /// Queues the retained messages a new subscription matched: as many as the queue has room
    /// for, the others waiting until it drains (see [`crate::backlog`]).
    pub fn enqueue_retained(&self, deliveries: Vec<Delivery>, limits: QueueLimits) {
        let mut st = self.state.lock();
        if st.link.is_none() {
            drop(st);
            for d in deliveries {
                self.enqueue(d, limits);
            }
            return;
        }
        // Half the queue at most, so live messages still find room while retained ones catch
        // up.
        st.backlog_limit = (limits.max_queued / 2).max(1);
        for d in deliveries {
            if st.retained_backlog.is_empty() && st.queue.len() < st.backlog_limit {
                st.queue.push_back(d);
            } else {
                st.retained_backlog.push(d);
            }
        }
        if let Some(link) = &mut st.link {
            link.wake();
        }
    }

    /// Whether more can be written right now (more queued and flow control allows it).
    pub fn has_ready(&self, conn_id: u64) -> bool {
        let st = self.state.lock();
        let Some(link) = st.link.as_ref().filter(|l| l.conn_id == conn_id) else {
            return false;
        };
        if !link.control.is_empty() {
            return true;
        }
        match st.queue.front() {
            // The next drain refills the queue from the retained backlog.
            None => {
                !st.retained_backlog.is_empty()
                    && st.inflight.len() < usize::from(link.receive_maximum)
            }
            Some(d) => {
                d.qos == QoS::AtMostOnce || st.inflight.len() < usize::from(link.receive_maximum)
            }
        }
    }
}

fn next_id(counter: &mut u16, inflight: &VecDeque<(u16, Inflight)>) -> u16 {
    loop {
        let id = *counter;
        *counter = counter.wrapping_add(1).max(1);
        if !inflight.iter().any(|(i, _)| *i == id) {
            return id;
        }
    }
}

/// The PUBLISH one session receives, or `None` if it exceeds the client's maximum size. It
/// borrows the message: nothing of it is copied until it is encoded.
fn build_publish<'a>(
    d: &'a Delivery,
    packet_id: u16,
    dup: bool,
    now: Instant,
    link: &mut Link,
) -> Option<PublishRef<'a>> {
    let m = &*d.message;
    let mut p = PublishRef {
        dup,
        qos: d.qos,
        retain: d.retain,
        topic: &m.topic,
        packet_id,
        properties: &m.properties,
        per_receiver: PerReceiver {
            message_expiry_interval: m.remaining_expiry(now),
            subscription_identifiers: &d.subscription_ids,
            topic_alias: None,
        },
        payload: &m.payload,
    };
    if let Err(e) = p.check(link.protocol_level) {
        // Dropped as if delivered, like a packet too large for the client.
        codec::limits::dropped("PUBLISH", e);
        return None;
    }
    if link.protocol_level == codec::V5 {
        if p.size(link.protocol_level) > link.max_packet_size {
            return None;
        }
        if link.topic_alias_maximum > 0 {
            if let Some(alias) = link.aliases.get(&m.topic) {
                p.per_receiver.topic_alias = Some(*alias);
                p.topic = "";
            } else if link.aliases.len() < usize::from(link.topic_alias_maximum) {
                let alias = (link.aliases.len() + 1) as u16;
                link.aliases.insert(m.topic.clone(), alias);
                p.per_receiver.topic_alias = Some(alias);
            }
        }
        return Some(p);
    }
    if p.size(link.protocol_level) > link.max_packet_size {
        return None;
    }
    Some(p)
}
