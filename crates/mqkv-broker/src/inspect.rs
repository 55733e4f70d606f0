//! What an operator may look at in a running broker: its sessions, their subscriptions and
//! what is waiting in them. Read when asked (a dashboard page), never on the message path.

use std::sync::Arc;

use serde::Serialize;

use crate::access::{Grants, Principal};
use crate::broker::Broker;
use crate::session::Session;

/// One session as an operator sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SessionSummary {
    pub client_id: String,
    /// Whether a connection is attached now.
    pub connected: bool,
    /// The MQTT protocol level of its connection (4: 3.1.1, 5: 5.0), when connected.
    pub protocol_level: Option<u8>,
    /// Who its latest connection authenticated as (`None`: anonymous or not known).
    pub username: Option<String>,
    /// Its subscriptions: the filter as the client sent it and its maximum QoS.
    pub subscriptions: Vec<(String, u8)>,
    /// Messages sent and not yet acknowledged.
    pub inflight: usize,
    /// Messages waiting to be sent.
    pub queued: usize,
    /// Messages its queue limit made it drop.
    pub dropped: u64,
    /// Seconds the session is kept after a disconnect (`u32::MAX`: for ever).
    pub expiry_interval: u32,
}

impl SessionSummary {
    fn of(session: &Session) -> SessionSummary {
        let st = session.state.lock();
        let mut subscriptions: Vec<(String, u8)> = st
            .subscriptions
            .iter()
            .map(|(filter, (options, _))| (filter.clone(), options.qos as u8))
            .collect();
        subscriptions.sort();
        SessionSummary {
            client_id: session.client_id.to_string(),
            connected: st.link.is_some(),
            protocol_level: st.link.as_ref().map(|l| l.protocol_level),
            username: st
                .principal
                .as_ref()
                .and_then(|p| p.username.as_deref().map(str::to_owned)),
            subscriptions,
            inflight: st.inflight.len(),
            queued: st.queue.len() + st.retained_backlog.len(),
            dropped: st.dropped_messages,
            expiry_interval: st.expiry_interval,
        }
    }
}

impl Broker {
    /// Every session (connected or kept for later), sorted by client id.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let sessions: Vec<Arc<Session>> = self.inner.sessions.lock().values().cloned().collect();
        let mut summaries: Vec<SessionSummary> =
            sessions.iter().map(|s| SessionSummary::of(s)).collect();
        summaries.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        summaries
    }

    /// What the policy in force lets `principal` do as client `client_id`; `None` when no
    /// policy is in force (everything is allowed).
    pub fn grants_for(&self, client_id: &str, principal: &Principal) -> Option<Arc<dyn Grants>> {
        self.inner.policy.grants(client_id, principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{QoS, SubscriptionOptions};

    #[test]
    fn a_summary_lists_subscriptions_in_order_and_counts_the_queue() {
        let session = Session::new(Arc::from("c1"));
        {
            let mut st = session.state.lock();
            for (filter, qos) in [("b/#", QoS::AtLeastOnce), ("a", QoS::AtMostOnce)] {
                st.subscriptions.insert(
                    filter.to_owned(),
                    (
                        SubscriptionOptions {
                            qos,
                            no_local: false,
                            retain_as_published: false,
                            retain_handling: 0,
                        },
                        None,
                    ),
                );
            }
            st.principal = Some(Arc::new(Principal::user("alice")));
            st.dropped_messages = 3;
        }
        let s = SessionSummary::of(&session);
        assert_eq!(s.client_id, "c1");
        assert!(!s.connected);
        assert_eq!(s.protocol_level, None);
        assert_eq!(s.username.as_deref(), Some("alice"));
        assert_eq!(
            s.subscriptions,
            vec![("a".to_owned(), 0), ("b/#".to_owned(), 1)]
        );
        assert_eq!((s.inflight, s.queued, s.dropped), (0, 0, 3));
    }
}
