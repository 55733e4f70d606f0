//! Who is looking at the dashboard: logins checked by the broker's own authenticator, kept as
//! a session cookie, and the grants the policy gives each viewer.
//!
//! With a password file, every viewer logs in as one of its users. Without one, a viewer on a
//! loopback address (or anyone, when anonymous clients are allowed everywhere) may look
//! without logging in. An anonymous viewer only reads; a logged-in one may also change the
//! keys the policy lets that user write.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mqkv_broker::access::{Grants, Principal, Subscription};
use mqkv_broker::auth::{AuthRequest, Authenticator};
use mqkv_broker::{Broker, ClientIdentity};
use parking_lot::Mutex;

/// The cookie a login sets.
pub const COOKIE: &str = "mqkv_session";

/// How long a login lasts without being used.
const IDLE: Duration = Duration::from_secs(3600);

/// Most logins kept at once; the longest idle goes first.
const MAX_LOGINS: usize = 1024;

/// How long a failed login waits before it is answered, so guessing passwords costs time.
pub const FAILED_LOGIN_DELAY: Duration = Duration::from_secs(1);

/// One viewer: who they are and what they may do.
#[derive(Clone)]
pub struct Viewer {
    pub principal: Arc<Principal>,
    /// Whether the viewer logged in (only then may they change anything).
    pub logged_in: bool,
    pub identity: ClientIdentity,
}

impl Viewer {
    /// Whether the viewer may read (`write` false) or change `key`.
    pub fn may_use(&self, key: &[u8], write: bool) -> bool {
        self.identity.may_use(key, write)
    }
}

/// The viewers' logins and how to check new ones.
pub struct Viewers {
    broker: Broker,
    auth: Arc<dyn Authenticator>,
    /// Whether every viewer must log in (a password file is configured).
    login_required: bool,
    /// Whether anonymous viewers are allowed beyond loopback addresses.
    allow_anonymous: Option<bool>,
    logins: Mutex<HashMap<String, (Arc<Principal>, Instant)>>,
    next: AtomicU64,
}

impl Viewers {
    pub fn new(
        broker: Broker,
        auth: Arc<dyn Authenticator>,
        login_required: bool,
        allow_anonymous: Option<bool>,
    ) -> Viewers {
        Viewers {
            broker,
            auth,
            login_required,
            allow_anonymous,
            logins: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    pub fn login_required(&self) -> bool {
        self.login_required
    }

    /// The viewer a request with session cookie `token` from `peer` is, if it may look at all.
    pub fn viewer(&self, token: Option<&str>, peer: SocketAddr) -> Option<Viewer> {
        if let Some(token) = token {
            let mut logins = self.logins.lock();
            if let Some((principal, used)) = logins.get_mut(token) {
                if used.elapsed() < IDLE {
                    *used = Instant::now();
                    return Some(self.as_viewer(principal.clone(), true, peer));
                }
                logins.remove(token);
            }
        }
        let anonymous = !self.login_required
            && self
                .allow_anonymous
                .unwrap_or_else(|| peer.ip().is_loopback());
        anonymous.then(|| self.as_viewer(Arc::new(Principal::default()), false, peer))
    }

    /// Checks `username` and `password` as the broker checks a CONNECT's (on a thread for
    /// blocking work: a password hash is slow on purpose). Returns the new session token.
    pub async fn login(
        self: &Arc<Self>,
        username: String,
        password: String,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Option<String> {
        let me = self.clone();
        let principal = tokio::task::spawn_blocking(move || {
            let password = Bytes::from(password);
            me.auth
                .authenticate(&AuthRequest {
                    client_id: "mqkv-dashboard",
                    username: Some(&username),
                    password: Some(&password),
                    authentication_method: None,
                    authentication_data: None,
                    certificate: None,
                    foreign_page: None,
                    peer,
                    local,
                })
                .ok()
        })
        .await
        .ok()
        .flatten()?;
        // An anonymous answer (no such user, anonymous allowed) is not a login.
        principal.username.as_ref()?;
        let token = format!(
            "{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        let mut logins = self.logins.lock();
        logins.retain(|_, (_, used)| used.elapsed() < IDLE);
        if logins.len() >= MAX_LOGINS {
            let oldest = logins
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(t, _)| t.clone());
            if let Some(oldest) = oldest {
                logins.remove(&oldest);
            }
        }
        logins.insert(token.clone(), (Arc::new(principal), Instant::now()));
        Some(token)
    }

    /// Ends a login.
    pub fn logout(&self, token: &str) {
        self.logins.lock().remove(token);
    }

    fn as_viewer(&self, principal: Arc<Principal>, logged_in: bool, peer: SocketAddr) -> Viewer {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Unlike any MQTT client's, so that the viewer's key observations are its own.
        let client_id: Arc<str> = Arc::from(format!(
            "$mqkv-dashboard-{:016x}-{n}",
            rand::random::<u64>()
        ));
        let policy = self.broker.grants_for(&client_id, &principal);
        let grants: Arc<dyn Grants> = Arc::new(ViewerGrants {
            policy,
            may_write: logged_in,
        });
        Viewer {
            identity: ClientIdentity {
                client_id,
                principal: principal.clone(),
                grants: Some(grants),
                peer,
                // Counted down from the top: MQTT connections count up from 1.
                connection_id: u64::MAX - n,
            },
            principal,
            logged_in,
        }
    }
}

/// A viewer's grants: the policy's for the viewer's user, and reading only for a viewer who
/// did not log in.
#[derive(Debug)]
struct ViewerGrants {
    policy: Option<Arc<dyn Grants>>,
    may_write: bool,
}

impl Grants for ViewerGrants {
    fn may_connect(&self) -> bool {
        true
    }

    fn may_publish(&self, _topic: &str) -> bool {
        false
    }

    fn subscription(&self, _group: Option<&str>, _filter: &str) -> Subscription {
        Subscription::Denied
    }

    fn may_receive(&self, _topic: &str) -> bool {
        false
    }

    fn may_use(&self, resource: &[u8], write: bool) -> bool {
        (!write || self.may_write)
            && self
                .policy
                .as_ref()
                .is_none_or(|g| g.may_use(resource, write))
    }
}

/// The session token in a `Cookie` header's value.
pub fn token_in(cookie_header: &str) -> Option<&str> {
    cookie_header
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        assert_eq!(token_in("a=1; mqkv_session=abc; b=2"), Some("abc"));
        assert_eq!(token_in("mqkv_session=x"), Some("x"));
        assert_eq!(token_in("a=1"), None);
        assert_eq!(token_in(""), None);
        assert_eq!(token_in("mqkv_sessionx=1"), None);
    }

    #[test]
    fn an_anonymous_viewer_only_reads() {
        let anonymous = ViewerGrants {
            policy: None,
            may_write: false,
        };
        assert!(anonymous.may_use(b"k", false));
        assert!(!anonymous.may_use(b"k", true));
        let user = ViewerGrants {
            policy: None,
            may_write: true,
        };
        assert!(user.may_use(b"k", true));
        assert!(!user.may_publish("t"));
    }
}
