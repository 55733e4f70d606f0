//! The authorization policy: a YAML file in the shape of AIO's `BrokerAuthorization` resource.
//!
//! Allow-only: with a policy in force, a client may connect, publish, subscribe and use state
//! store keys only as some rule that names it allows. A rule names a client by client id, user
//! name or attribute set (any of them); its `brokerResources` allow `Connect`, `Publish` to
//! topics and `Subscribe` to filters; its `stateStoreResources` allow `Read` (GET, KEYNOTIFY,
//! SCAN), `Write` (SET, DEL, VDEL) or `ReadWrite` on keys. Topics and keys may hold
//! `{principal.clientId}`, `{principal.username}` and `{principal.attributes.NAME}`.
//!
//! A subscription is allowed when an allowed filter covers it whole (every topic it matches is
//! allowed): `sensors/#` allows `sensors/+/temp`, but `#` is refused when only `sensors/#` is
//! allowed.

mod file;
mod grants;
mod template;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mqkv_broker::access::{Grants, Principal};

pub use file::PolicyFile;
pub use grants::ClientGrants;

/// A policy file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read the policy file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("policy file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// A checked policy, ready to work out clients' grants.
#[derive(Debug)]
pub struct Policy {
    rules: Vec<file::Rule>,
}

impl Policy {
    /// Checks a policy's text. The error names the line and column at fault.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: PolicyFile = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        Ok(Policy { rules: file.rules })
    }

    /// Reads and checks a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        Policy::parse(&text).map_err(|reason| PolicyError::Invalid {
            path: path.to_owned(),
            reason,
        })
    }

    /// How many rules it has.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The grants of one client.
    pub fn client_grants(&self, client_id: &str, principal: &Principal) -> ClientGrants {
        ClientGrants::resolve(&self.rules, client_id, principal)
    }
}

impl mqkv_broker::access::Policy for Policy {
    fn grants(&self, client_id: &str, principal: &Principal) -> Arc<dyn Grants> {
        self.client_grants(client_id, principal).into_arc()
    }
}

#[cfg(test)]
mod tests;
