//! The policy applied to sessions: subscriptions a client's grants do not allow are removed,
//! when its session is taken up by a connection and whenever the policy is replaced.

use std::sync::Arc;

use crate::access::{Grants, Principal};
use crate::inner::Inner;
use crate::session::Session;
use crate::topic;

impl Inner {
    /// Records who `session`'s new connection is and removes the subscriptions it brought
    /// along (a resumed session) that `grants` do not allow.
    pub(crate) fn authorize_session(
        &self,
        session: &Arc<Session>,
        principal: &Arc<Principal>,
        grants: Option<&dyn Grants>,
    ) {
        session.state.lock().principal = Some(principal.clone());
        if let Some(grants) = grants {
            self.drop_disallowed(session, grants);
        }
    }

    /// Applies the policy just put in force to every session whose client is known: the
    /// subscriptions it no longer allows are removed, so they stop receiving at once.
    pub(crate) fn apply_policy(&self) {
        let sessions: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        for session in sessions {
            let Some(principal) = session.state.lock().principal.clone() else {
                continue;
            };
            if let Some(grants) = self.policy.grants(&session.client_id, &principal) {
                self.drop_disallowed(&session, &*grants);
            }
        }
    }

    /// Unsubscribes `session` from every filter `grants` do not allow.
    fn drop_disallowed(&self, session: &Arc<Session>, grants: &dyn Grants) {
        let disallowed: Vec<String> = session
            .state
            .lock()
            .subscriptions
            .keys()
            .filter(|f| {
                topic::parse_filter(f)
                    .is_none_or(|spec| !grants.may_subscribe(spec.group, spec.filter))
            })
            .cloned()
            .collect();
        for filter in disallowed {
            tracing::info!(client_id = %session.client_id, %filter, "subscription no longer allowed by the policy: removed");
            self.unsubscribe(session, &filter);
        }
    }
}
