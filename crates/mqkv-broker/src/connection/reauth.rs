//! Re-authentication (AUTH with reason 0x19): a client renews its credential (the AIO SDKs
//! send a new token when their token file changes) without reconnecting. A credential that
//! expires without being renewed ends the connection with 0xA0 (maximum connect time).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Conn, Violation};
use crate::auth::AuthRequest;
use crate::codec::{self, reason, Packet, Properties};

/// The instant a credential expiring at `exp` (Unix seconds) expires.
pub(super) fn expiry_instant(exp: Option<u64>) -> Option<Instant> {
    let exp = exp?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Some(Instant::now() + Duration::from_secs(exp.saturating_sub(now)))
}

impl Conn {
    /// An AUTH packet from the client. Only re-authentication with the method of CONNECT is
    /// expected; it must name the same user. Success is answered with AUTH 0x00, and the new
    /// credential's attributes and expiry apply from then on.
    pub(super) fn auth(&mut self, a: codec::Auth) -> Result<(), Violation> {
        let method = a.properties.authentication_method();
        let Some(expected) = self.auth_method.as_deref() else {
            return Err(Violation(reason::PROTOCOL_ERROR));
        };
        if a.reason_code != reason::RE_AUTHENTICATE || method != Some(expected) {
            return Err(Violation(reason::PROTOCOL_ERROR));
        }
        let data = a
            .properties
            .rare
            .as_ref()
            .and_then(|r| r.authentication_data.as_ref());
        let request = AuthRequest {
            client_id: &self.client_id,
            username: None,
            password: None,
            authentication_method: method,
            authentication_data: data,
            certificate: None,
            foreign_page: None,
            peer: self.ident.peer,
            local: self.local,
        };
        let principal = match self.inner.auth.authenticate(&request) {
            Ok(p) if p.username == self.ident.principal.username => p,
            Ok(p) => {
                tracing::info!(client_id = %self.client_id, was = ?self.ident.principal.username, now = ?p.username, "re-authentication as someone else refused");
                return Err(Violation(reason::NOT_AUTHORIZED));
            }
            Err(code) => {
                tracing::info!(client_id = %self.client_id, code, "re-authentication failed");
                return Err(Violation(code));
            }
        };
        tracing::debug!(client_id = %self.client_id, expires_at = ?principal.expires_at, "re-authenticated");
        self.credential_expires = expiry_instant(principal.expires_at);
        self.expiry_changed = true;
        let principal = Arc::new(principal);
        self.policy_generation = self.inner.policy.generation();
        let grants = self.inner.policy.grants(&self.client_id, &principal);
        // New attributes may allow more or less: the session's subscriptions follow.
        self.inner
            .authorize_session(&self.session, &principal, grants.clone());
        self.ident.principal = principal;
        self.ident.grants = grants;
        let mut properties = Properties::default();
        properties.rare_mut().authentication_method = Some(expected.to_owned());
        self.send(Packet::Auth(codec::Auth {
            reason_code: reason::SUCCESS,
            properties,
        }));
        Ok(())
    }

    /// Whether the client's credential has expired.
    pub(super) fn credential_expired(&self, now: Instant) -> bool {
        self.credential_expires.is_some_and(|at| now >= at)
    }
}
