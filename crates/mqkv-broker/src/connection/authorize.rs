//! What a connected client may publish and subscribe to: the namespaces reserved for the
//! server, then the policy's grants ([`crate::access`]). Refusals are counted and logged.

use super::Conn;
use crate::access::Subscription;

impl Conn {
    /// Whether the client may publish to `topic`.
    pub(super) fn may_publish(&mut self, topic: &str) -> bool {
        self.inner.renew_service_claims(&mut self.services);
        let allowed = self
            .services
            .reserved
            .iter()
            .all(|r| r.allows_publish(topic))
            && self.grants().is_none_or(|g| g.may_publish(topic));
        self.count_decision(allowed);
        if !allowed {
            tracing::debug!(client_id = %self.client_id, %topic, "publish not authorized");
        }
        allowed
    }

    /// How far the client may subscribe to `filter` (without its `$share/GROUP/` prefix, the
    /// group of a shared subscription being `group`).
    pub(super) fn subscription(&mut self, group: Option<&str>, filter: &str) -> Subscription {
        self.inner.renew_service_claims(&mut self.services);
        let client_id = &*self.client_id;
        let reserved_ok = self
            .services
            .reserved
            .iter()
            .all(|r| r.allows_subscribe(client_id, filter));
        let own = group.is_none()
            && self
                .services
                .reserved
                .iter()
                .any(|r| r.is_own(client_id, filter));
        let grant = match (reserved_ok, self.grants()) {
            (false, _) => Subscription::Denied,
            (true, None) => Subscription::Whole,
            // The client's own part of a server namespace (its key notifications).
            (true, Some(_)) if own => Subscription::Whole,
            (true, Some(g)) => g.subscription(group, filter),
        };
        self.count_decision(grant != Subscription::Denied);
        if grant == Subscription::Denied {
            tracing::debug!(client_id = %self.client_id, %filter, "subscription not authorized");
        }
        grant
    }

    /// Counts an authorization decision: every refusal, and every allowance a policy gave.
    fn count_decision(&self, allowed: bool) {
        let counters = self.inner.stats.here();
        if !allowed {
            crate::stats::add(&counters.authorization_deny, 1);
        } else if self.ident.grants.is_some() {
            crate::stats::add(&counters.authorization_allow, 1);
        }
    }
}
