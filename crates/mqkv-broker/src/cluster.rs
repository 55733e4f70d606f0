//! What a cluster does with its node's broker (see [`crate::federation`] and
//! [`crate::replicated`]): routes what other nodes forward, learns what is subscribed here, and
//! applies the sessions, client ids and retained messages the cluster keeps.

use std::sync::Arc;

use bytes::Bytes;

use crate::codec::{Properties, QoS};
use crate::federation::{Routes, SessionRecord};
use crate::inner::SharedHere;
use crate::persist::StoredSubscription;
use crate::session::{Message, Session};
use crate::subtree::shared_key;
use crate::{topic, Broker};

/// See [`Broker::downgrade`].
#[derive(Clone)]
pub struct WeakBroker(std::sync::Weak<crate::inner::Inner>);

impl WeakBroker {
    pub fn upgrade(&self) -> Option<Broker> {
        self.0.upgrade().map(|inner| Broker { inner })
    }
}

impl Broker {
    /// Joins this broker to others (see [`crate::federation`]). Only the first call counts.
    pub fn federate(&self, federation: Arc<dyn crate::federation::Federation>) {
        let _ = self.inner.federation.set(federation);
    }

    /// Routes a message another node forwarded: to the plain subscriptions here and to the
    /// shared groups `shared` names (by key). A retained message is not stored: the cluster
    /// sets retained messages on every node itself (see [`Broker::set_retained`]).
    pub fn route_from_peer(&self, message: Message, shared: &[String]) -> usize {
        self.inner
            .deliver_local(Arc::new(message), SharedHere::Only(shared))
    }

    /// Every topic filter and shared group some session here subscribes to, each once, in
    /// order.
    pub fn subscribed_routes(&self) -> Routes {
        let sessions: Vec<Arc<Session>> = self.inner.sessions.lock().values().cloned().collect();
        let mut plain = std::collections::BTreeSet::new();
        let mut shared = std::collections::BTreeSet::new();
        for session in sessions {
            for f in session.state.lock().subscriptions.keys() {
                match topic::parse_filter(f) {
                    Some(spec) => match spec.group {
                        Some(group) => shared.insert(shared_key(group, spec.filter)),
                        None => plain.insert(spec.filter.to_owned()),
                    },
                    None => false,
                };
            }
        }
        Routes {
            plain: plain.into_iter().collect(),
            shared: shared.into_iter().collect(),
        }
    }

    /// A handle that does not keep the broker alive (for what the broker itself holds).
    pub fn downgrade(&self) -> WeakBroker {
        WeakBroker(Arc::downgrade(&self.inner))
    }

    /// The keys of the shared groups here that `topic` matches.
    pub fn shared_groups_matching(&self, topic: &str) -> Vec<String> {
        let subs = self.inner.subs.read();
        let mut m = crate::subtree::Matches::default();
        subs.matches(topic, &mut m);
        m.shared.iter().map(|g| g.key.to_string()).collect()
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
