//! Authentication hook.
//!
//! The broker hands user name, password, authentication method and the client certificate TLS
//! verified to an [`Authenticator`]; the default one accepts configured users, clients with a
//! verified certificate (as the certificate's common name, or its subject), and anonymous
//! clients only on loopback listeners unless configured otherwise. Enhanced authentication (AUTH exchanges) is not offered, so any
//! Authentication Method is refused with 0x8C.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;

use crate::codec::reason;
use crate::config::UserConfig;

/// What a client presented in CONNECT.
#[derive(Debug)]
pub struct AuthRequest<'a> {
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub password: Option<&'a Bytes>,
    pub authentication_method: Option<&'a str>,
    /// The client certificate TLS verified, on a TLS listener that asks for one.
    pub certificate: Option<&'a crate::transport::PeerCertificate>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// Decides who a connecting client is. `Ok` carries the authenticated principal (`None` for
/// anonymous); `Err` carries the CONNACK reason code.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate(&self, req: &AuthRequest<'_>) -> Result<Option<Arc<str>>, u8>;
}

/// Static users plus the anonymous rule.
#[derive(Debug, Clone)]
pub struct DefaultAuthenticator {
    pub allow_anonymous: Option<bool>,
    pub users: Vec<UserConfig>,
}

impl Authenticator for DefaultAuthenticator {
    fn authenticate(&self, req: &AuthRequest<'_>) -> Result<Option<Arc<str>>, u8> {
        if req.authentication_method.is_some() {
            return Err(reason::BAD_AUTHENTICATION_METHOD);
        }
        if let Some(name) = req.username {
            if let Some(u) = self.users.iter().find(|u| u.username == name) {
                return match req.password {
                    Some(p) if constant_time_eq(p, u.password.as_bytes()) => Ok(Some(name.into())),
                    _ => Err(reason::BAD_USER_NAME_OR_PASSWORD),
                };
            }
            if !self.users.is_empty() {
                return Err(reason::BAD_USER_NAME_OR_PASSWORD);
            }
        }
        if let Some(cert) = req.certificate {
            let name = cert.common_name.as_deref().unwrap_or(&cert.subject);
            return Ok(Some(name.into()));
        }
        let anonymous = self
            .allow_anonymous
            .unwrap_or_else(|| req.local.ip().is_loopback());
        if anonymous {
            Ok(None)
        } else {
            Err(reason::NOT_AUTHORIZED)
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(user: Option<&'a str>, pw: Option<&'a Bytes>, local: &str) -> AuthRequest<'a> {
        AuthRequest {
            client_id: "c",
            username: user,
            password: pw,
            authentication_method: None,
            certificate: None,
            peer: "10.0.0.2:5000".parse().unwrap(),
            local: local.parse().unwrap(),
        }
    }

    #[test]
    fn anonymous_only_on_loopback_by_default() {
        let a = DefaultAuthenticator {
            allow_anonymous: None,
            users: vec![],
        };
        assert_eq!(a.authenticate(&req(None, None, "127.0.0.1:1883")), Ok(None));
        assert_eq!(
            a.authenticate(&req(None, None, "10.0.0.1:1883")),
            Err(reason::NOT_AUTHORIZED)
        );
    }

    #[test]
    fn a_verified_certificate_names_the_client_anywhere() {
        let a = DefaultAuthenticator {
            allow_anonymous: None,
            users: vec![],
        };
        let mut cert = crate::transport::PeerCertificate {
            subject: "CN=device-1, O=Contoso".into(),
            common_name: Some("device-1".into()),
            subject_alt_names: vec![],
            der: vec![],
        };
        let mut r = req(None, None, "10.0.0.1:8883");
        r.certificate = Some(&cert);
        assert_eq!(a.authenticate(&r), Ok(Some("device-1".into())));
        cert.common_name = None;
        let mut r = req(None, None, "10.0.0.1:8883");
        r.certificate = Some(&cert);
        assert_eq!(
            a.authenticate(&r),
            Ok(Some("CN=device-1, O=Contoso".into()))
        );
    }

    #[test]
    fn users_checked() {
        let a = DefaultAuthenticator {
            allow_anonymous: Some(false),
            users: vec![UserConfig {
                username: "u".into(),
                password: "p".into(),
            }],
        };
        let good = Bytes::from_static(b"p");
        let bad = Bytes::from_static(b"x");
        assert_eq!(
            a.authenticate(&req(Some("u"), Some(&good), "10.0.0.1:1")),
            Ok(Some("u".into()))
        );
        assert_eq!(
            a.authenticate(&req(Some("u"), Some(&bad), "10.0.0.1:1")),
            Err(reason::BAD_USER_NAME_OR_PASSWORD)
        );
    }
}
