//! Authorization hook: what a connected client may do.
//!
//! Authentication ([`crate::auth`]) says who a client is: a [`Principal`]. A [`Policy`], when
//! one is configured, turns a client id and principal into [`Grants`] once per connection (and
//! again whenever the policy is replaced), and the broker asks those on every CONNECT, PUBLISH,
//! SUBSCRIBE and will; a service asks them about its own resources (the state store about keys)
//! through the publisher's [`crate::service::ClientIdentity`]. Without a policy everything is
//! allowed.
//!
//! A policy replaced while clients are connected applies to their next operation; subscriptions
//! the new policy no longer allows are removed at once, so they stop receiving.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

/// Who an authenticated client is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    /// The user name authentication settled on (a password file's user, a certificate's
    /// common name, a token's subject); `None` for anonymous clients.
    pub username: Option<Arc<str>>,
    /// Attributes from the client's certificate or token, sorted by name.
    pub attributes: Vec<(Arc<str>, Arc<str>)>,
    /// When the credential it was proven with expires (a token's `exp`, Unix seconds): the
    /// connection ends then unless the client re-authenticates.
    pub expires_at: Option<u64>,
}

impl Principal {
    /// A principal with a user name and no attributes.
    pub fn user(name: impl Into<Arc<str>>) -> Principal {
        Principal {
            username: Some(name.into()),
            attributes: Vec::new(),
            expires_at: None,
        }
    }

    /// The value of attribute `name`.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .binary_search_by(|(k, _)| (**k).cmp(name))
            .ok()
            .map(|i| &*self.attributes[i].1)
    }

    /// Adds (or replaces) an attribute, keeping them sorted.
    pub fn set_attribute(&mut self, name: &str, value: &str) {
        match self.attributes.binary_search_by(|(k, _)| (**k).cmp(name)) {
            Ok(i) => self.attributes[i].1 = value.into(),
            Err(i) => self.attributes.insert(i, (name.into(), value.into())),
        }
    }
}

/// Decides, per client, what it may do.
pub trait Policy: Send + Sync + 'static {
    /// The grants of the client `client_id` authenticated as `principal`.
    fn grants(&self, client_id: &str, principal: &Principal) -> Arc<dyn Grants>;
}

/// How far a client may subscribe to a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subscription {
    /// To every topic the filter matches.
    Whole,
    /// To some of them (a wildcard filter reaching further than the grants): the subscription
    /// is made, and receives only the messages whose topics the client may receive.
    Partly,
    /// To none of them: refused.
    Denied,
}

/// What one client may do, worked out by a [`Policy`] for it.
pub trait Grants: Send + Sync + fmt::Debug + 'static {
    /// Whether the client may connect at all.
    fn may_connect(&self) -> bool;
    /// Whether the client may publish to `topic` (a topic name, no wildcards).
    fn may_publish(&self, topic: &str) -> bool;
    /// How far the client may subscribe to `filter` (without its `$share/GROUP/` prefix; the
    /// group of a shared subscription is `group`).
    fn subscription(&self, group: Option<&str>, filter: &str) -> Subscription;
    /// Whether a subscription of the client may receive a message published to `topic`.
    fn may_receive(&self, topic: &str) -> bool;
    /// Whether the client may read (`write` false) or change (`write` true) `resource`, a
    /// resource of an in-process service (the state store's keys).
    fn may_use(&self, resource: &[u8], write: bool) -> bool;
}

/// A topic namespace only the server publishes in, whatever the policy says: under `prefix`,
/// clients may not publish at all, and may subscribe by name only to their own subtree (as
/// `own` names it for a client id). A service that delivers into it uses
/// [`crate::Broker::deliver`].
pub struct Reserved {
    pub prefix: String,
    pub own: Box<dyn Fn(&str) -> String + Send + Sync>,
}

impl fmt::Debug for Reserved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserved")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Reserved {
    /// Whether a client may publish to `topic`.
    pub fn allows_publish(&self, topic: &str) -> bool {
        !topic.starts_with(&self.prefix)
    }

    /// Whether `filter` lies inside client `client_id`'s own subtree: such a subscription
    /// needs no grant from the policy (the server delivers there only what it decides to).
    pub fn is_own(&self, client_id: &str, filter: &str) -> bool {
        filter.starts_with(&(self.own)(client_id))
    }

    /// Whether client `client_id` may subscribe to `filter`: a filter that names the
    /// namespace (no wildcard before its end) must stay inside the client's own subtree. A
    /// filter that reaches it through a wildcard is allowed; nothing in it is routed to
    /// subscriptions.
    pub fn allows_subscribe(&self, client_id: &str, filter: &str) -> bool {
        let literal_end = filter.find(['+', '#']).unwrap_or(filter.len());
        if !filter[..literal_end].starts_with(&self.prefix) {
            return true;
        }
        filter.starts_with(&(self.own)(client_id))
    }
}

/// The policy in force, replaceable while the broker runs.
#[derive(Default)]
pub struct PolicySlot {
    current: RwLock<Option<Arc<dyn Policy>>>,
    /// Moves on every replacement, so a connection can tell its grants are stale with one load.
    generation: AtomicU64,
}

impl fmt::Debug for PolicySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySlot")
            .field("configured", &self.current.read().is_some())
            .field("generation", &self.generation())
            .finish()
    }
}

impl PolicySlot {
    /// Puts `policy` in force (`None`: everything is allowed).
    pub fn replace(&self, policy: Option<Arc<dyn Policy>>) {
        *self.current.write() = policy;
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// A number that changes whenever the policy is replaced.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The grants of a client under the policy in force; `None` when there is no policy.
    pub fn grants(&self, client_id: &str, principal: &Principal) -> Option<Arc<dyn Grants>> {
        let policy = self.current.read().clone();
        policy.map(|p| p.grants(client_id, principal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_namespace_is_the_server_s() {
        let r = Reserved {
            prefix: "sys/notify/".into(),
            own: Box::new(|id| format!("sys/notify/{id}/")),
        };
        assert!(!r.allows_publish("sys/notify/a/k"));
        assert!(r.allows_publish("sys/notifyx"));
        assert!(r.allows_publish("other/topic"));
        assert!(r.allows_subscribe("a", "sys/notify/a/#"));
        assert!(r.allows_subscribe("a", "sys/notify/a/key"));
        assert!(!r.allows_subscribe("a", "sys/notify/b/#"));
        assert!(!r.allows_subscribe("a", "sys/notify/#"));
        assert!(!r.allows_subscribe("a", "sys/notify/+/k"));
        // Reached through a wildcard only: nothing is routed there.
        assert!(r.allows_subscribe("a", "#"));
        assert!(r.allows_subscribe("a", "sys/+/b/#"));
        assert!(r.allows_subscribe("a", "other/#"));
        assert!(r.is_own("a", "sys/notify/a/#"));
        assert!(!r.is_own("a", "sys/notify/b/#"));
        assert!(!r.is_own("a", "#"));
    }

    #[test]
    fn attributes_stay_sorted_and_found() {
        let mut p = Principal::user("u");
        p.set_attribute("zone", "b");
        p.set_attribute("city", "seattle");
        p.set_attribute("zone", "c");
        assert_eq!(p.attribute("zone"), Some("c"));
        assert_eq!(p.attribute("city"), Some("seattle"));
        assert_eq!(p.attribute("none"), None);
        let names: Vec<&str> = p.attributes.iter().map(|(k, _)| &**k).collect();
        assert_eq!(names, ["city", "zone"]);
    }
}
