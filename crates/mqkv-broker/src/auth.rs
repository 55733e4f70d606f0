//! Authentication hook.
//!
//! The broker hands user name, password, authentication method and the client certificate TLS
//! verified to an [`Authenticator`]; the default one accepts the users of a password file
//! ([`crate::passwords`]), clients with a verified certificate (as the certificate's common
//! name, or its subject), and anonymous clients only on loopback listeners unless configured
//! otherwise, and tokens sent with the authentication method `K8S-SAT` ([`crate::tokens`]);
//! any other authentication method is refused with 0x8C. Password checks run off the
//! connection threads, and an address that keeps failing is answered ever more slowly
//! ([`Throttle`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

pub use crate::access::Principal;
use crate::codec::reason;
use crate::passwords::Passwords;

/// What a client presented in CONNECT.
#[derive(Debug)]
pub struct AuthRequest<'a> {
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub password: Option<&'a Bytes>,
    pub authentication_method: Option<&'a str>,
    /// The authentication data of CONNECT (or of a re-authenticating AUTH).
    pub authentication_data: Option<&'a Bytes>,
    /// The client certificate TLS verified, on a TLS listener that asks for one.
    pub certificate: Option<&'a crate::transport::PeerCertificate>,
    /// The origin of the web page a WebSocket client runs in, where its listener neither
    /// serves nor lists that origin: the client is then not local, even from loopback.
    pub foreign_page: Option<&'a str>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// Decides who a connecting client is. `Ok` carries the authenticated principal (with no user
/// name for anonymous clients); `Err` carries the CONNACK reason code.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate(&self, req: &AuthRequest<'_>) -> Result<Principal, u8>;

    /// Whether [`Authenticator::authenticate`] may take long for `req` (a password hash to
    /// check): the broker then calls it on a thread for blocking work, so that other clients
    /// are not held up.
    fn is_slow(&self, _req: &AuthRequest<'_>) -> bool {
        false
    }
}

/// A password file's users, replaceable while the broker runs.
#[derive(Debug, Default)]
pub struct PasswordStore(RwLock<Arc<Passwords>>);

impl PasswordStore {
    pub fn new(passwords: Passwords) -> PasswordStore {
        PasswordStore(RwLock::new(Arc::new(passwords)))
    }

    /// The users in force now.
    pub fn current(&self) -> Arc<Passwords> {
        self.0.read().clone()
    }

    /// Puts `passwords` in force for every later CONNECT.
    pub fn replace(&self, passwords: Passwords) {
        *self.0.write() = Arc::new(passwords);
    }
}

/// Attributes a client certificate gives its holder when a certificate with `subject` is in its
/// chain (the client's own, an intermediate's or the root's), as AIO's
/// `authorizationAttributes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectAttributes {
    /// A distinguished name (`CN = smart-fan, O = Contoso`); compared field by field, with
    /// the spaces around `=` and `,` not counting.
    pub subject: String,
    pub attributes: Vec<(String, String)>,
}

/// A distinguished name in one spelling: `CN = a, O = b` and `CN=a,O=b` are the same.
fn normal_name(dn: &str) -> String {
    let mut out = String::with_capacity(dn.len());
    let mut escaped = false;
    let mut field = String::new();
    let flush = |field: &mut String, out: &mut String| {
        let (k, v) = field.split_once('=').unwrap_or((field.as_str(), ""));
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&k.trim().to_ascii_uppercase());
        out.push('=');
        out.push_str(v.trim());
        field.clear();
    };
    for c in dn.chars() {
        match c {
            ',' if !escaped => flush(&mut field, &mut out),
            _ => {
                escaped = c == '\\' && !escaped;
                field.push(c);
            }
        }
    }
    if !field.trim().is_empty() {
        flush(&mut field, &mut out);
    }
    out
}

/// Users from a password file, clients with a verified certificate, and the anonymous rule.
#[derive(Debug)]
pub struct DefaultAuthenticator {
    pub allow_anonymous: Option<bool>,
    pub passwords: Arc<PasswordStore>,
    /// Attributes that certificates give their holders.
    pub certificate_attributes: Vec<SubjectAttributes>,
    /// How tokens (authentication method `K8S-SAT`) are checked; without a verifier in it,
    /// tokens are refused.
    pub tokens: Arc<crate::tokens::TokenStore>,
}

impl DefaultAuthenticator {
    /// The principal a verified client certificate makes: its common name (or its whole
    /// subject) as the user name, with the attributes configured for any subject in its chain.
    fn certificate_principal(&self, cert: &crate::transport::PeerCertificate) -> Principal {
        let name = cert.common_name.as_deref().unwrap_or(&cert.subject);
        let mut principal = Principal::user(name);
        if self.certificate_attributes.is_empty() {
            return principal;
        }
        // Root first, so that what the client's own certificate says wins.
        let chain: Vec<String> = cert
            .issuers
            .iter()
            .rev()
            .chain(std::iter::once(&cert.subject))
            .map(|s| normal_name(s))
            .collect();
        for subject in &chain {
            for rule in &self.certificate_attributes {
                if normal_name(&rule.subject) == *subject {
                    for (k, v) in &rule.attributes {
                        principal.set_attribute(k, v);
                    }
                }
            }
        }
        principal
    }
}

impl Authenticator for DefaultAuthenticator {
    fn authenticate(&self, req: &AuthRequest<'_>) -> Result<Principal, u8> {
        // Each method in turn, if the CONNECT is for it: a token, a password, a certificate,
        // none.
        if let Some(method) = req.authentication_method {
            let verifier = self.tokens.current();
            return match (method, verifier) {
                (crate::tokens::K8S_SAT, Some(verifier)) => {
                    let data = req.authentication_data.map_or(&b""[..], |d| &d[..]);
                    match verifier.verify(data) {
                        Ok((mut principal, exp)) => {
                            principal.expires_at = Some(exp);
                            Ok(principal)
                        }
                        Err(e) => {
                            tracing::info!(client_id = req.client_id, peer = %req.peer, error = %e, "token refused");
                            Err(reason::NOT_AUTHORIZED)
                        }
                    }
                }
                _ => Err(reason::BAD_AUTHENTICATION_METHOD),
            };
        }
        let passwords = self.passwords.current();
        if let Some(name) = req.username {
            if passwords.contains(name) {
                return match req.password {
                    Some(p) if passwords.verify(name, p) => Ok(Principal::user(name)),
                    _ => Err(reason::BAD_USER_NAME_OR_PASSWORD),
                };
            }
            if !passwords.is_empty() {
                return Err(reason::BAD_USER_NAME_OR_PASSWORD);
            }
        }
        if let Some(cert) = req.certificate {
            // A browser may present a certificate it holds on any page's behalf.
            if let Some(origin) = req.foreign_page {
                tracing::info!(client_id = req.client_id, peer = %req.peer, origin, "client certificate of a web page of another origin not taken: list the origin in the listener's allowed_origins, or log in");
            } else {
                return Ok(self.certificate_principal(cert));
            }
        }
        let anonymous = self
            .allow_anonymous
            .unwrap_or_else(|| req.local.ip().is_loopback() && req.foreign_page.is_none());
        if anonymous {
            Ok(Principal::default())
        } else {
            if let (None, Some(origin)) = (self.allow_anonymous, req.foreign_page) {
                tracing::info!(client_id = req.client_id, peer = %req.peer, origin, "anonymous client in a web page of another origin refused: list the origin in the listener's allowed_origins, or log in");
            }
            Err(reason::NOT_AUTHORIZED)
        }
    }

    fn is_slow(&self, req: &AuthRequest<'_>) -> bool {
        req.username
            .is_some_and(|name| self.passwords.current().contains(name))
    }
}

/// Slows down clients that keep failing to authenticate: after a few failures from one
/// address, each refusal to it waits longer before it is sent (doubling up to 5 s), so
/// guessing passwords costs time. A success clears the address.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
    /// Whether any address is remembered: a success then need not take the lock.
    any: std::sync::atomic::AtomicBool,
}

impl Throttle {
    /// Failures from one address before refusals are delayed.
    const FREE: u32 = 3;
    const FIRST_DELAY: Duration = Duration::from_millis(100);
    const MAX_DELAY: Duration = Duration::from_secs(5);
    /// A failure is forgotten after this long.
    const MEMORY: Duration = Duration::from_secs(600);
    /// Addresses remembered at most; the oldest is forgotten first.
    const MAX_ADDRESSES: usize = 10_000;

    /// Notes a failed attempt from `ip`; returns how long to wait before refusing it.
    pub fn failed(&self, ip: IpAddr, now: Instant) -> Duration {
        let mut map = self.failures.lock();
        self.any.store(true, std::sync::atomic::Ordering::Relaxed);
        if map.len() >= Self::MAX_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, (_, last)| now.duration_since(*last) < Self::MEMORY);
            if map.len() >= Self::MAX_ADDRESSES {
                if let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, (_, last))| *last)
                    .map(|(k, _)| *k)
                {
                    map.remove(&oldest);
                }
            }
        }
        let entry = map.entry(ip).or_insert((0, now));
        if now.duration_since(entry.1) >= Self::MEMORY {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        match entry.0.checked_sub(Self::FREE + 1) {
            None => Duration::ZERO,
            Some(doublings) => Self::FIRST_DELAY
                .saturating_mul(1u32 << doublings.min(16))
                .min(Self::MAX_DELAY),
        }
    }

    /// Clears `ip` after a successful attempt.
    pub fn succeeded(&self, ip: IpAddr) {
        if self.any.load(std::sync::atomic::Ordering::Relaxed) {
            let mut map = self.failures.lock();
            map.remove(&ip);
            if map.is_empty() {
                self.any.store(false, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authenticator(allow_anonymous: Option<bool>, passwords: Passwords) -> DefaultAuthenticator {
        DefaultAuthenticator {
            allow_anonymous,
            passwords: Arc::new(PasswordStore::new(passwords)),
            certificate_attributes: Vec::new(),
            tokens: Arc::default(),
        }
    }

    fn req<'a>(user: Option<&'a str>, pw: Option<&'a Bytes>, local: &str) -> AuthRequest<'a> {
        AuthRequest {
            client_id: "c",
            username: user,
            password: pw,
            authentication_method: None,
            authentication_data: None,
            certificate: None,
            foreign_page: None,
            peer: "10.0.0.2:5000".parse().unwrap(),
            local: local.parse().unwrap(),
        }
    }

    #[test]
    fn anonymous_only_on_loopback_by_default() {
        let a = authenticator(None, Passwords::default());
        assert_eq!(
            a.authenticate(&req(None, None, "127.0.0.1:1883")),
            Ok(Principal::default())
        );
        assert_eq!(
            a.authenticate(&req(None, None, "10.0.0.1:1883")),
            Err(reason::NOT_AUTHORIZED)
        );
    }

    #[test]
    fn a_web_page_of_another_origin_is_neither_anonymous_nor_its_browsers_certificate() {
        let a = authenticator(None, Passwords::default());
        let cert = device_cert("CN=device-1");
        let mut r = req(None, None, "127.0.0.1:8080");
        r.foreign_page = Some("https://evil.example");
        assert_eq!(a.authenticate(&r), Err(reason::NOT_AUTHORIZED));
        r.certificate = Some(&cert);
        assert_eq!(a.authenticate(&r), Err(reason::NOT_AUTHORIZED));
        // Unless anonymous clients are allowed everywhere.
        let open = authenticator(Some(true), Passwords::default());
        assert_eq!(open.authenticate(&r), Ok(Principal::default()));
    }

    /// The verified certificate of `device-1`, signed by the Contoso root.
    fn device_cert(subject: &str) -> crate::transport::PeerCertificate {
        crate::transport::PeerCertificate {
            subject: subject.into(),
            common_name: Some("device-1".into()),
            subject_alt_names: vec![],
            issuers: vec!["CN=Contoso Root".into()],
            der: vec![],
        }
    }

    #[test]
    fn a_verified_certificate_names_the_client_anywhere() {
        let a = authenticator(None, Passwords::default());
        let mut cert = device_cert("CN=device-1, O=Contoso");
        let mut r = req(None, None, "10.0.0.1:8883");
        r.certificate = Some(&cert);
        assert_eq!(a.authenticate(&r), Ok(Principal::user("device-1")));
        cert.common_name = None;
        let mut r = req(None, None, "10.0.0.1:8883");
        r.certificate = Some(&cert);
        assert_eq!(
            a.authenticate(&r),
            Ok(Principal::user("CN=device-1, O=Contoso"))
        );
    }

    #[test]
    fn certificates_in_the_chain_give_attributes() {
        let mut a = authenticator(None, Passwords::default());
        let rule = |subject: &str, attrs: &[(&str, &str)]| SubjectAttributes {
            subject: subject.into(),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        a.certificate_attributes = vec![
            rule(
                "CN = Contoso Root",
                &[("organization", "contoso"), ("tier", "root")],
            ),
            rule(
                "cn=device-1 , O = Contoso",
                &[("building", "17"), ("tier", "leaf")],
            ),
            rule("CN = someone-else", &[("building", "99")]),
        ];
        let cert = device_cert("CN=device-1,O=Contoso");
        let mut r = req(None, None, "10.0.0.1:8883");
        r.certificate = Some(&cert);
        let p = a.authenticate(&r).expect("accepted");
        assert_eq!(p.username.as_deref(), Some("device-1"));
        assert_eq!(p.attribute("organization"), Some("contoso"));
        assert_eq!(p.attribute("building"), Some("17"));
        // The client's own certificate wins over its root.
        assert_eq!(p.attribute("tier"), Some("leaf"));
    }

    #[test]
    fn distinguished_names_compare_without_spacing() {
        assert_eq!(normal_name("CN = a b, O = c"), "CN=a b,O=c");
        assert_eq!(normal_name("cn=a b,O=c"), "CN=a b,O=c");
        assert_eq!(normal_name("CN=a\\, b,O=c"), "CN=a\\, b,O=c");
    }

    #[test]
    fn users_checked() {
        let mut passwords = Passwords::default();
        passwords.set("u", b"p").expect("set");
        let a = authenticator(Some(false), passwords);
        assert!(a.is_slow(&req(Some("u"), None, "10.0.0.1:1")));
        assert!(!a.is_slow(&req(None, None, "10.0.0.1:1")));
        let good = Bytes::from_static(b"p");
        let bad = Bytes::from_static(b"x");
        assert_eq!(
            a.authenticate(&req(Some("u"), Some(&good), "10.0.0.1:1")),
            Ok(Principal::user("u"))
        );
        assert_eq!(
            a.authenticate(&req(Some("u"), Some(&bad), "10.0.0.1:1")),
            Err(reason::BAD_USER_NAME_OR_PASSWORD)
        );
        assert_eq!(
            a.authenticate(&req(Some("stranger"), Some(&good), "127.0.0.1:1")),
            Err(reason::BAD_USER_NAME_OR_PASSWORD)
        );
        // A new file takes effect for the next attempt.
        a.passwords.replace(Passwords::default());
        assert_eq!(
            a.authenticate(&req(Some("u"), Some(&good), "10.0.0.1:1")),
            Err(reason::NOT_AUTHORIZED)
        );
    }

    #[test]
    fn repeated_failures_from_one_address_wait_longer_and_longer() {
        let t = Throttle::default();
        let ip: IpAddr = "10.0.0.9".parse().expect("ip");
        let other: IpAddr = "10.0.0.10".parse().expect("ip");
        let now = Instant::now();
        let delays: Vec<Duration> = (0..8).map(|_| t.failed(ip, now)).collect();
        assert_eq!(&delays[..3], &[Duration::ZERO; 3]);
        assert_eq!(delays[3], Duration::from_millis(100));
        assert_eq!(delays[4], Duration::from_millis(200));
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(t.failed(other, now), Duration::ZERO, "another address");
        for _ in 0..20 {
            t.failed(ip, now);
        }
        assert_eq!(t.failed(ip, now), Throttle::MAX_DELAY);
        t.succeeded(ip);
        assert_eq!(t.failed(ip, now), Duration::ZERO, "cleared by a success");
        // Forgotten after a while.
        for _ in 0..5 {
            t.failed(other, now);
        }
        assert_eq!(t.failed(other, now + Throttle::MEMORY), Duration::ZERO);
    }
}
