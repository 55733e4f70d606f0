//! The policy applied to sessions: when a connection takes up a session and whenever the policy
//! is replaced, each subscription is kept whole, kept filtered (it then gets only the messages
//! the client may receive) or removed, as the client's grants say, and queued messages it may
//! not receive are dropped.

use std::sync::Arc;

use crate::access::{Grants, Principal, Subscription};
use crate::inner::Inner;
use crate::session::Session;
use crate::topic;

impl Inner {
    /// Records who `session`'s new connection is and what it may do, and applies that to the
    /// subscriptions and messages it brought along (a resumed session).
    pub(crate) fn authorize_session(
        &self,
        session: &Arc<Session>,
        principal: &Arc<Principal>,
        grants: Option<Arc<dyn Grants>>,
    ) {
        {
            let mut st = session.state.lock();
            st.principal = Some(principal.clone());
            st.grants = grants.clone();
        }
        if let Some(grants) = grants {
            self.enforce(session, &*grants);
        }
    }

    /// Applies the policy just put in force to every session whose client is known.
    pub(crate) fn apply_policy(&self) {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        for session in sessions {
            let Some(principal) = session.state.lock().principal.clone() else {
                continue;
            };
            let grants = self.policy.grants(&session.client_id, &principal);
            session.state.lock().grants = grants.clone();
            if let Some(grants) = grants {
                self.enforce(&session, &*grants);
            }
        }
    }

    /// Makes `session`'s subscriptions and queue agree with `grants`.
    fn enforce(&self, session: &Arc<Session>, grants: &dyn Grants) {
        // What is the server's own (key notifications) is not the policy's business.
        let reserved = self.reserved.read().clone();
        let subscriptions: Vec<(String, _, bool)> = {
            let st = session.state.lock();
            st.subscriptions
                .iter()
                .map(|(f, (options, id))| (f.clone(), (*options, *id), st.filtered.contains(f)))
                .collect()
        };
        for (filter, (options, identifier), filtered) in subscriptions {
            let own = reserved
                .iter()
                .any(|r| r.is_own(&session.client_id, &filter));
            let grant = match topic::parse_filter(&filter) {
                Some(_) if own => Subscription::Whole,
                Some(spec) => grants.subscription(spec.group, spec.filter),
                None => Subscription::Denied,
            };
            match grant {
                Subscription::Whole if !filtered => {}
                Subscription::Partly if filtered => {}
                Subscription::Whole | Subscription::Partly => {
                    let filtered = grant == Subscription::Partly;
                    self.subscribe_checked(session, &filter, options, identifier, filtered);
                }
                Subscription::Denied => {
                    tracing::info!(client_id = %session.client_id, %filter, "subscription no longer allowed by the policy: removed");
                    self.unsubscribe(session, &filter);
                }
            }
        }
        let dropped = session.drop_queued(|topic| {
            !grants.may_receive(topic) && reserved.iter().all(|r| r.allows_publish(topic))
        });
        if dropped > 0 {
            tracing::info!(client_id = %session.client_id, dropped, "queued messages the policy does not allow dropped");
        }
    }
}
