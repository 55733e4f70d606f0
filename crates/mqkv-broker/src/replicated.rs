//! Broker state a cluster keeps for every node: who owns a client id, what a persistent session
//! subscribes to, and the retained messages.
//!
//! The broker does not replicate anything itself. A [`crate::federation::Federation`] is asked
//! to claim a client id before the connection is accepted and is told whenever a session
//! changes; it keeps the records ([`SessionRecord`], [`StoredMessage`]) wherever the cluster
//! keeps its state and applies what other nodes did through the methods here.
//!
//! What moves with a session from one node to another: its subscriptions and expiry interval.
//! What does not: messages queued for it on the node it left, and QoS 1/2 messages in flight
//! there; they are dropped when that node learns that another node took the session over.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::codec::{Properties, QoS, SubscriptionOptions};
use crate::persist::{StoredMessage, StoredSubscription};
use crate::session::{Message, Session};
use crate::Broker;

/// A client asking to connect, as the cluster is asked to let it own its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub client_id: String,
    /// Numbers this connection among this node's connections.
    pub conn_id: u64,
    pub clean_start: bool,
    /// The session expiry interval granted.
    pub expiry_interval: u32,
    /// The connection's will, if it has one.
    pub will: Option<WillRecord>,
}

/// A will as the cluster keeps it while its connection is open, so that another node can
/// publish it if this node dies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WillRecord {
    pub message: StoredMessage,
    /// The will delay interval, in seconds.
    pub delay: u32,
}

/// What a cluster keeps of a persistent session: enough to resume it on any node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub expiry_interval: u32,
    pub subscriptions: Vec<StoredSubscription>,
}

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl StoredMessage {
    /// `m` as data, its expiry as a wall-clock time.
    pub fn of(m: &Message) -> StoredMessage {
        let now = Instant::now();
        StoredMessage {
            topic: m.topic.clone(),
            payload: m.payload.to_vec(),
            qos: m.qos as u8,
            retain: m.retain,
            properties: m.properties.to_block(),
            expires_at_ms: m.expires_at.map(|t| {
                let left =
                    u64::try_from(t.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
                unix_ms_now().saturating_add(left)
            }),
            publisher: m.publisher.as_deref().map(str::to_owned),
        }
    }

    /// The message again; `None` if it does not decode or has expired.
    pub fn to_message(&self) -> Option<Message> {
        let remaining = match self.expires_at_ms {
            None => None,
            Some(at) => {
                let left = at.checked_sub(unix_ms_now()).filter(|ms| *ms > 0)?;
                Some(Instant::now() + Duration::from_millis(left))
            }
        };
        Some(Message {
            topic: self.topic.clone(),
            payload: Bytes::copy_from_slice(&self.payload),
            qos: QoS::from_u8(self.qos)?,
            retain: self.retain,
            properties: Properties::from_block(self.properties.clone()).ok()?,
            expires_at: remaining,
            publisher: self.publisher.as_deref().map(Arc::from),
        })
    }
}

impl StoredSubscription {
    pub(crate) fn of(filter: &str, options: &SubscriptionOptions, identifier: Option<u32>) -> Self {
        StoredSubscription {
            filter: filter.to_owned(),
            qos: options.qos as u8,
            no_local: options.no_local,
            retain_as_published: options.retain_as_published,
            retain_handling: options.retain_handling,
            identifier,
        }
    }

    pub(crate) fn options(&self) -> Option<SubscriptionOptions> {
        Some(SubscriptionOptions {
            qos: QoS::from_u8(self.qos)?,
            no_local: self.no_local,
            retain_as_published: self.retain_as_published,
            retain_handling: self.retain_handling,
        })
    }
}

impl Broker {
    /// The record of `client_id`'s session here, if it has one that outlives its connection.
    pub fn session_record(&self, client_id: &str) -> Option<SessionRecord> {
        let session = self.inner.sessions.lock().get(client_id).cloned()?;
        let st = session.state.lock();
        if st.expiry_interval == 0 {
            return None;
        }
        let mut subscriptions: Vec<StoredSubscription> = st
            .subscriptions
            .iter()
            .map(|(f, (o, id))| StoredSubscription::of(f, o, *id))
            .collect();
        subscriptions.sort_by(|a, b| a.filter.cmp(&b.filter));
        Some(SessionRecord {
            expiry_interval: st.expiry_interval,
            subscriptions,
        })
    }

    /// Whether connection `conn_id` is the one connected to `client_id`'s session here.
    pub fn is_connected(&self, client_id: &str, conn_id: u64) -> bool {
        let Some(session) = self.inner.sessions.lock().get(client_id).cloned() else {
            return false;
        };
        let st = session.state.lock();
        st.link.as_ref().is_some_and(|l| l.conn_id == conn_id)
    }

    /// Routes a message as if a client here had published it (a will another node could not
    /// publish).
    pub fn route_message(&self, message: Message) -> usize {
        self.inner.route(Arc::new(message))
    }

    /// The client ids of every session here.
    pub fn session_ids(&self) -> Vec<String> {
        self.inner
            .sessions
            .lock()
            .keys()
            .map(|id| id.to_string())
            .collect()
    }

    /// Whether `client_id` has a session here, connected or not.
    pub fn has_session(&self, client_id: &str) -> bool {
        self.inner.sessions.lock().contains_key(client_id)
    }

    /// Another node took `client_id` over: a connection here gets DISCONNECT 0x8E (Session
    /// taken over) and the session here ends with its subscriptions and queued messages. A
    /// will of that connection with no delay is published, as on a takeover within one node.
    /// Returns whether there was a session.
    pub fn evict(&self, client_id: &str) -> bool {
        let session = {
            let mut sessions = self.inner.sessions.lock();
            let Some(session) = sessions.remove(client_id) else {
                return false;
            };
            let mut st = session.state.lock();
            if let Some(link) = st.link.take() {
                link.notify.notify_one();
            }
            st.pending_will = None;
            drop(st);
            session
        };
        self.inner.drop_subscriptions(&session);
        self.inner.touch();
        true
    }

    /// Sets or clears the retained message of `topic` as the cluster decided, without routing
    /// it to anyone.
    pub fn set_retained(&self, topic: &str, message: Option<Message>) {
        match message {
            Some(m) => self.inner.retain(Arc::new(m)),
            None => self.inner.retain(Arc::new(Message {
                topic: topic.to_owned(),
                payload: Bytes::new(),
                qos: QoS::AtMostOnce,
                retain: true,
                properties: Properties::default(),
                expires_at: None,
                publisher: None,
            })),
        }
    }

    /// Makes `messages` the retained messages, dropping every other.
    pub fn replace_retained(&self, messages: Vec<Message>) {
        self.inner.clear_retained();
        for m in messages {
            self.inner.retain(Arc::new(m));
        }
    }
}

impl crate::broker::Inner {
    /// Creates `client_id`'s session, disconnected, from a record kept by the cluster, unless
    /// the session is here already.
    pub(crate) fn restore(&self, client_id: &crate::subtree::ClientId, record: SessionRecord) {
        let session = {
            let mut sessions = self.sessions.lock();
            if sessions.contains_key(client_id) {
                return;
            }
            let session = Arc::new(Session::new(client_id.clone()));
            {
                let mut st = session.state.lock();
                st.expiry_interval = record.expiry_interval;
                st.disconnected_at = Some(Instant::now());
            }
            sessions.insert(client_id.clone(), session.clone());
            session
        };
        for sub in &record.subscriptions {
            if let Some(options) = sub.options() {
                self.subscribe(&session, &sub.filter, options, sub.identifier);
            }
        }
    }

    /// Tells the cluster, if any, that `client_id`'s session changed.
    pub(crate) fn session_changed(&self, client_id: &str) {
        if let Some(federation) = self.federation.get() {
            federation.session_changed(client_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::PropStr;

    #[test]
    fn a_stored_message_keeps_its_expiry_as_a_wall_clock_time() {
        let m = Message {
            topic: "a/b".into(),
            payload: Bytes::from_static(b"x"),
            qos: QoS::ExactlyOnce,
            retain: true,
            properties: Properties {
                content_type: Some(PropStr::Owned("t".into())),
                ..Default::default()
            },
            expires_at: Some(Instant::now() + Duration::from_secs(60)),
            publisher: None,
        };
        let stored = StoredMessage::of(&m);
        let at = stored.expires_at_ms.expect("expiry kept");
        assert!(at > unix_ms_now() + 55_000 && at <= unix_ms_now() + 60_000);
        let back = stored.to_message().expect("decodes");
        assert_eq!(back.qos, QoS::ExactlyOnce);
        assert_eq!(back.payload, m.payload);
        let mut expired = stored.clone();
        expired.expires_at_ms = Some(unix_ms_now() - 1);
        assert!(expired.to_message().is_none());
        let mut broken = stored;
        broken.qos = 7;
        assert!(broken.to_message().is_none());
    }
}
