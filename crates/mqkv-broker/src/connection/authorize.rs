//! What a connected client may publish and subscribe to: the namespaces reserved for the
//! server, then the policy's grants ([`crate::access`]). Refusals are counted and logged.

use std::sync::atomic::Ordering;

use super::Conn;

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
        if !allowed {
            self.inner.denied.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(client_id = %self.client_id, %topic, "publish not authorized");
        }
        allowed
    }

    /// Whether the client may subscribe to `filter` (without its `$share/GROUP/` prefix, the
    /// group of a shared subscription being `group`).
    pub(super) fn may_subscribe(&mut self, group: Option<&str>, filter: &str) -> bool {
        self.inner.renew_service_claims(&mut self.services);
        let client_id = &*self.client_id;
        let reserved_ok = self
            .services
            .reserved
            .iter()
            .all(|r| r.allows_subscribe(client_id, filter));
        let allowed = reserved_ok && self.grants().is_none_or(|g| g.may_subscribe(group, filter));
        if !allowed {
            self.inner.denied.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(client_id = %self.client_id, %filter, "subscription not authorized");
        }
        allowed
    }
}
