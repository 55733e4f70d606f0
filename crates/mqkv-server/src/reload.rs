//! Reading the server's files again while it runs (SIGHUP, `mqkv reload`): TLS certificates
//! and keys, the password file, the token keys and the policy. Connected clients stay; a
//! new policy applies to their next operation. A file that fails to load is reported in the
//! log and what was in force stays.

use std::path::PathBuf;
use std::sync::Arc;

use mqkv_broker::auth::PasswordStore;
use mqkv_broker::tokens::{TokenStore, TokenVerifier};
use mqkv_broker::Broker;

use crate::config::TokenConfig;
use crate::policy::Policy;
use crate::statestore::Notifier;

/// Everything that can be read again, and where it goes.
pub struct Reloader {
    pub(crate) broker: Broker,
    /// The TLS settings of the TLS listeners.
    pub(crate) tls: Vec<Arc<mqkv_broker::Tls>>,
    /// The password file and the users read from it.
    pub(crate) passwords: Option<(PathBuf, Arc<PasswordStore>)>,
    /// The token settings and the keys read for them.
    pub(crate) tokens: Option<(TokenConfig, Arc<TokenStore>)>,
    /// The policy file.
    pub(crate) policy: Option<PathBuf>,
    /// Key observations, which a new policy may end.
    pub(crate) notifier: Arc<Notifier>,
}

impl Reloader {
    /// Reads every file again; returns how many failed.
    pub fn reload(&self) -> usize {
        let mut failed = 0;
        if let Some((path, store)) = &self.passwords {
            match mqkv_broker::passwords::Passwords::load(path) {
                Ok(users) => {
                    store.replace(users);
                    tracing::info!(file = %path.display(), "password file reloaded");
                }
                Err(e) => {
                    failed += 1;
                    tracing::error!(error = %e, "password file reload failed; the previous users stay");
                }
            }
        }
        if let Some((settings, store)) = &self.tokens {
            match TokenVerifier::load(&settings.settings()) {
                Ok(verifier) => {
                    store.replace(verifier);
                    tracing::info!("token keys reloaded");
                }
                Err(e) => {
                    failed += 1;
                    tracing::error!(error = %e, "token keys reload failed; the previous keys stay");
                }
            }
        }
        if let Some(path) = &self.policy {
            match Policy::load(path) {
                Ok(policy) => {
                    let policy = Arc::new(policy);
                    tracing::info!(file = %path.display(), rules = policy.rule_count(), "policy reloaded");
                    self.broker.set_policy(Some(policy.clone()));
                    self.notifier.apply_policy(&*policy);
                }
                Err(e) => {
                    failed += 1;
                    tracing::error!(error = %e, "policy reload failed; the previous policy stays in force");
                }
            }
        }
        for tls in &self.tls {
            let cert = tls.files().cert.display();
            match tls.reload() {
                Ok(()) => tracing::info!(%cert, "TLS certificate and key reloaded"),
                Err(e) => {
                    failed += 1;
                    tracing::error!(%cert, error = %e, "TLS reload failed; the previous certificate stays in use");
                }
            }
        }
        failed
    }
}
