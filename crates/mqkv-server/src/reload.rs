//! Reading the server's files again while it runs: TLS certificates and keys (of the
//! listeners, and of the links between cluster nodes), the password file, the token keys and
//! the policy. SIGHUP and `mqkv reload` read every file again;
//! [`Reloader::reload_changed`] (run every few seconds, see [`crate::watch`]) reads a part
//! again once its files have changed. Connected clients stay; a new policy applies to their
//! next operation. A file that fails to load is reported in the log and in `/metrics`, and
//! what was in force stays.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use mqkv_broker::auth::PasswordStore;
use mqkv_broker::tokens::{TokenStore, TokenVerifier};
use mqkv_broker::Broker;

use crate::cluster_tls::ClusterTls;
use crate::config::{ServerConfig, TokenConfig};
use crate::policy::Policy;
use crate::statestore::Notifier;

/// Server certificates that expire within this many seconds are warned of: two weeks, well
/// after renewal is due (cert-manager and ACME clients renew a third of the way before the end,
/// 30 days for a 90-day certificate), so a warning means renewal has failed.
const EXPIRY_WARNING_SECS: i64 = 14 * 24 * 3600;

/// One part of what the server reads from files, loaded as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    Passwords,
    Tokens,
    Policy,
    /// The TLS settings of some TLS listeners, by their place in [`Reloader`]'s list.
    Tls(usize),
    /// The TLS settings of the links between cluster nodes.
    ClusterTls,
}

impl Part {
    /// The part's name in logs and in `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Part::Passwords => "passwords",
            Part::Tokens => "tokens",
            Part::Policy => "policy",
            Part::Tls(_) => "tls",
            Part::ClusterTls => "cluster_tls",
        }
    }
}

/// What a part's files held: a hash of each one's contents, `None` where it could not be read.
type Stamp = Vec<Option<u64>>;

/// A hash of the file's contents, `None` where it cannot be read.
fn stamp_file(path: &Path) -> Option<u64> {
    let bytes = std::fs::read(path).ok()?;
    let mut h = DefaultHasher::new();
    h.write(&bytes);
    Some(h.finish())
}

fn stamp(files: &[PathBuf]) -> Stamp {
    files.iter().map(|f| stamp_file(f)).collect()
}

/// What the files a configuration names hold, taken before the server reads them at start:
/// a change made while it starts is then noticed by the first checks.
#[derive(Debug, Default)]
pub struct StartStamps(HashMap<PathBuf, Option<u64>>);

impl StartStamps {
    pub fn take(config: &ServerConfig) -> StartStamps {
        let mut files: Vec<&PathBuf> = Vec::new();
        files.extend(&config.password_file);
        files.extend(&config.policy);
        if let Some(t) = &config.tokens {
            files.extend(&t.keys);
            files.extend(&t.jwks);
        }
        let tls = &config.tls;
        files.extend(
            [&tls.cert, &tls.key, &tls.client_ca, &tls.crl]
                .into_iter()
                .flatten(),
        );
        for l in &config.listeners {
            files.extend(
                [&l.cert, &l.key, &l.client_ca, &l.crl]
                    .into_iter()
                    .flatten(),
            );
        }
        if let Some(c) = &config.cluster {
            files.extend([&c.tls_cert, &c.tls_key, &c.tls_ca].into_iter().flatten());
        }
        let stamps = files
            .into_iter()
            .map(|f| (f.clone(), stamp_file(f)))
            .collect();
        StartStamps(stamps)
    }

    fn of(&self, files: &[PathBuf]) -> Stamp {
        let at_start = |f: &PathBuf| self.0.get(f).copied().unwrap_or_else(|| stamp_file(f));
        files.iter().map(at_start).collect()
    }
}

/// What is known of one part's files.
#[derive(Debug, Default)]
struct PartState {
    /// What its files held when it was last loaded (or failed to load).
    loaded: Stamp,
    /// What they held at the last check, when that differed from `loaded`: a change is loaded
    /// once two checks in a row find the same contents, so a file caught half-written is not.
    changing: Option<Stamp>,
}

/// How one part's loads went.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    /// Whether its last load succeeded.
    ok: bool,
    /// Loads that failed since the start.
    failures: u64,
}

impl Default for Outcome {
    /// A part loaded at start, without failures.
    fn default() -> Outcome {
        Outcome {
            ok: true,
            failures: 0,
        }
    }
}

impl PartState {
    /// Takes what the part's files hold now. True when that is a change to load: it differs
    /// from what was loaded, and the check before found the same; it then counts as loaded.
    fn settled_change(&mut self, now: Stamp) -> bool {
        if now == self.loaded {
            self.changing = None;
            false
        } else if self.changing.as_ref() == Some(&now) {
            self.changing = None;
            self.loaded = now;
            true
        } else {
            self.changing = Some(now);
            false
        }
    }
}

/// How one part stands, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartReport {
    pub part: Part,
    /// The part's first file: the certificate of TLS settings, the first key of tokens.
    pub file: PathBuf,
    /// Whether its last load succeeded.
    pub ok: bool,
    /// Loads that failed since the start.
    pub failures: u64,
    /// For TLS settings: when the server certificate in use expires, in seconds since the
    /// Unix epoch.
    pub not_after: Option<i64>,
}

/// Everything that can be read again, and where it goes.
pub struct Reloader {
    broker: Broker,
    /// The TLS settings of the TLS listeners.
    tls: Vec<Arc<mqkv_broker::Tls>>,
    /// The TLS settings of the links between cluster nodes.
    cluster_tls: Option<Arc<ClusterTls>>,
    /// The password file and the users read from it.
    passwords: Option<(PathBuf, Arc<PasswordStore>)>,
    /// The token settings and the keys read for them.
    tokens: Option<(TokenConfig, Arc<TokenStore>)>,
    /// The policy file.
    policy: Option<PathBuf>,
    /// Key observations, which a new policy may end.
    notifier: Arc<Notifier>,
    /// What each part's files held; held while a part loads, so that loads never overlap.
    state: Mutex<HashMap<Part, PartState>>,
    /// How each part's loads went.
    outcomes: Mutex<HashMap<Part, Outcome>>,
}

impl Reloader {
    /// The reloader of what the server has just loaded from files that held `at_start`.
    /// Warns of server certificates that expire soon.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        broker: Broker,
        tls: Vec<Arc<mqkv_broker::Tls>>,
        cluster_tls: Option<Arc<ClusterTls>>,
        passwords: Option<(PathBuf, Arc<PasswordStore>)>,
        tokens: Option<(TokenConfig, Arc<TokenStore>)>,
        policy: Option<PathBuf>,
        notifier: Arc<Notifier>,
        at_start: &StartStamps,
    ) -> Reloader {
        let reloader = Reloader {
            broker,
            tls,
            cluster_tls,
            passwords,
            tokens,
            policy,
            notifier,
            state: Mutex::new(HashMap::new()),
            outcomes: Mutex::new(HashMap::new()),
        };
        let parts = reloader.parts();
        *reloader.state.lock() = parts
            .iter()
            .map(|(part, files)| {
                let loaded = at_start.of(files);
                let changing = None;
                (*part, PartState { loaded, changing })
            })
            .collect();
        *reloader.outcomes.lock() = parts
            .iter()
            .map(|(part, _)| (*part, Outcome::default()))
            .collect();
        reloader.warn_of_expiry(unix_now());
        reloader
    }

    /// Every part, with the files it is read from.
    fn parts(&self) -> Vec<(Part, Vec<PathBuf>)> {
        let mut parts = Vec::new();
        if let Some((path, _)) = &self.passwords {
            parts.push((Part::Passwords, vec![path.clone()]));
        }
        if let Some((settings, _)) = &self.tokens {
            let files = settings
                .keys
                .iter()
                .chain(&settings.jwks)
                .cloned()
                .collect();
            parts.push((Part::Tokens, files));
        }
        if let Some(path) = &self.policy {
            parts.push((Part::Policy, vec![path.clone()]));
        }
        for (i, tls) in self.tls.iter().enumerate() {
            let f = tls.files();
            let files = [
                Some(&f.cert),
                Some(&f.key),
                f.client_ca.as_ref(),
                f.crl.as_ref(),
            ]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
            parts.push((Part::Tls(i), files));
        }
        if let Some(tls) = &self.cluster_tls {
            parts.push((Part::ClusterTls, tls.files()));
        }
        parts
    }

    /// Reads every file again; returns the parts that failed to load, each as its name and
    /// first file (`policy /etc/mqkv/policy.yaml`).
    pub fn reload(&self) -> Vec<String> {
        let mut state = self.state.lock();
        let mut failed = Vec::new();
        for (part, files) in self.parts() {
            let s = state.entry(part).or_default();
            s.loaded = stamp(&files);
            s.changing = None;
            if !self.load(part, &files, s) {
                let file = files.first().map(|f| f.display().to_string());
                failed.push(format!("{} {}", part.name(), file.unwrap_or_default()));
            }
        }
        failed
    }

    /// Reads again each part whose files changed since it was last loaded and have stayed as
    /// they are since the call before; returns how many parts it read.
    pub fn reload_changed(&self) -> usize {
        let mut state = self.state.lock();
        let mut read = 0;
        for (part, files) in self.parts() {
            let s = state.entry(part).or_default();
            if s.settled_change(stamp(&files)) {
                let file = files.first().map(|f| f.display().to_string());
                tracing::info!(
                    part = part.name(),
                    file,
                    "files changed: reading them again"
                );
                self.load(part, &files, s);
                read += 1;
            }
        }
        read
    }

    /// Loads one part from its `files`, which held `s.loaded` just before; records how it
    /// went. Files that changed while they were read are read again at the next checks.
    fn load(&self, part: Part, files: &[PathBuf], s: &mut PartState) -> bool {
        let ok = match part {
            Part::Passwords => self.load_passwords(),
            Part::Tokens => self.load_tokens(),
            Part::Policy => self.load_policy(),
            Part::Tls(i) => self.load_tls(i),
            Part::ClusterTls => self.load_cluster_tls(),
        };
        let after = stamp(files);
        if after != s.loaded {
            s.changing = Some(after);
        }
        let mut outcomes = self.outcomes.lock();
        let outcome = outcomes.entry(part).or_default();
        outcome.ok = ok;
        if !ok {
            outcome.failures += 1;
        }
        ok
    }

    fn load_passwords(&self) -> bool {
        let Some((path, store)) = &self.passwords else {
            return true;
        };
        match mqkv_broker::passwords::Passwords::load(path) {
            Ok(users) => {
                store.replace(users);
                tracing::info!(file = %path.display(), "password file reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "password file reload failed; the previous users stay");
                false
            }
        }
    }

    fn load_tokens(&self) -> bool {
        let Some((settings, store)) = &self.tokens else {
            return true;
        };
        match TokenVerifier::load(&settings.settings()) {
            Ok(verifier) => {
                store.replace(verifier);
                tracing::info!("token keys reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "token keys reload failed; the previous keys stay");
                false
            }
        }
    }

    fn load_policy(&self) -> bool {
        let Some(path) = &self.policy else {
            return true;
        };
        match Policy::load(path) {
            Ok(policy) => {
                let policy = Arc::new(policy);
                tracing::info!(file = %path.display(), rules = policy.rule_count(), "policy reloaded");
                self.broker.set_policy(Some(policy.clone()));
                self.notifier.apply_policy(&*policy);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "policy reload failed; the previous policy stays in force");
                false
            }
        }
    }

    fn load_tls(&self, i: usize) -> bool {
        let Some(tls) = self.tls.get(i) else {
            return true;
        };
        let cert = tls.files().cert.display();
        match tls.reload() {
            Ok(()) => {
                tracing::info!(%cert, "TLS certificate and key reloaded");
                warn_of_expiry(&tls.files().cert, tls.not_after(), unix_now());
                true
            }
            Err(e) => {
                tracing::error!(%cert, error = %e, "TLS reload failed; the previous certificate stays in use");
                false
            }
        }
    }

    fn load_cluster_tls(&self) -> bool {
        let Some(tls) = &self.cluster_tls else {
            return true;
        };
        let files = tls.files();
        let cert = files.first().map(|f| f.display().to_string());
        match tls.reload() {
            Ok(()) => {
                tracing::info!(cert, "the cluster's TLS certificate and key reloaded");
                if let Some(cert) = files.first() {
                    warn_of_expiry(cert, tls.not_after(), unix_now());
                }
                true
            }
            Err(e) => {
                tracing::error!(cert, error = %e, "the cluster's TLS reload failed; the previous certificate stays in use");
                false
            }
        }
    }

    /// Logs a warning for each server certificate in use that expires within 14 days, and an
    /// error for each one that has expired; `now` in seconds since the Unix epoch.
    pub fn warn_of_expiry(&self, now: i64) {
        for tls in &self.tls {
            warn_of_expiry(&tls.files().cert, tls.not_after(), now);
        }
        if let Some(tls) = &self.cluster_tls {
            if let Some(cert) = tls.files().first() {
                warn_of_expiry(cert, tls.not_after(), now);
            }
        }
    }

    /// How each part stands, in a stable order. TLS settings that share a certificate file
    /// (listeners that differ in other settings) are reported as one: ok if every one loaded,
    /// their failures summed, the earliest expiry.
    pub fn report(&self) -> Vec<PartReport> {
        let outcomes = self.outcomes.lock().clone();
        let mut report: Vec<PartReport> = Vec::new();
        for (part, files) in self.parts() {
            let o = outcomes.get(&part);
            let r = PartReport {
                part,
                file: files.first().cloned().unwrap_or_default(),
                ok: o.is_none_or(|o| o.ok),
                failures: o.map_or(0, |o| o.failures),
                not_after: match part {
                    Part::Tls(i) => self.tls.get(i).map(|t| t.not_after()),
                    Part::ClusterTls => self.cluster_tls.as_ref().map(|t| t.not_after()),
                    _ => None,
                },
            };
            let same = report
                .iter_mut()
                .find(|x| x.part.name() == r.part.name() && x.file == r.file);
            match same {
                Some(x) => {
                    x.ok &= r.ok;
                    x.failures += r.failures;
                    x.not_after = match (x.not_after, r.not_after) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => report.push(r),
            }
        }
        report.sort_by_key(|r| r.part);
        report
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn warn_of_expiry(cert: &Path, not_after: i64, now: i64) {
    const DAY: i64 = 24 * 3600;
    let left = not_after - now;
    if left <= 0 {
        let days_ago = -left / DAY;
        tracing::error!(cert = %cert.display(), days_ago, "the server certificate has expired: clients will refuse it");
    } else if left < EXPIRY_WARNING_SECS {
        let days = left / DAY;
        tracing::warn!(cert = %cert.display(), days, "the server certificate expires soon");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(loaded: &[Option<u64>]) -> PartState {
        PartState {
            loaded: loaded.to_vec(),
            changing: None,
        }
    }

    #[test]
    fn a_change_loads_once_it_has_held_for_one_more_check() {
        let mut s = state(&[Some(1), Some(2)]);
        assert!(!s.settled_change(vec![Some(1), Some(2)]));
        assert!(
            !s.settled_change(vec![Some(1), Some(3)]),
            "seen once: maybe half-written"
        );
        assert!(s.settled_change(vec![Some(1), Some(3)]));
        assert_eq!(s.loaded, vec![Some(1), Some(3)]);
        assert!(!s.settled_change(vec![Some(1), Some(3)]), "loaded already");
    }

    #[test]
    fn a_file_still_being_written_waits() {
        let mut s = state(&[Some(1)]);
        assert!(!s.settled_change(vec![Some(2)]));
        assert!(!s.settled_change(vec![Some(3)]));
        assert!(!s.settled_change(vec![Some(4)]));
        assert!(s.settled_change(vec![Some(4)]));
    }

    #[test]
    fn a_change_undone_before_it_settled_loads_nothing() {
        let mut s = state(&[Some(1)]);
        assert!(!s.settled_change(vec![Some(2)]));
        assert!(!s.settled_change(vec![Some(1)]));
        assert!(!s.settled_change(vec![Some(2)]), "the change starts over");
        assert!(s.settled_change(vec![Some(2)]));
    }

    #[test]
    fn a_file_that_vanishes_is_a_change_too() {
        let mut s = state(&[Some(1)]);
        assert!(!s.settled_change(vec![None]));
        assert!(s.settled_change(vec![None]), "loading it fails and says so");
        assert!(
            !s.settled_change(vec![None]),
            "and is not tried again until it changes"
        );
        assert!(!s.settled_change(vec![Some(1)]));
        assert!(s.settled_change(vec![Some(1)]));
    }

    #[test]
    fn stamps_follow_contents_not_times() {
        let dir = tempfile::tempdir().expect("a directory");
        let a = dir.path().join("a.pem");
        std::fs::write(&a, "one").expect("write");
        let first = stamp(std::slice::from_ref(&a));
        std::fs::write(&a, "one").expect("write");
        assert_eq!(stamp(std::slice::from_ref(&a)), first);
        std::fs::write(&a, "two").expect("write");
        assert_ne!(stamp(std::slice::from_ref(&a)), first);
        assert_eq!(stamp(&[dir.path().join("missing")]), vec![None]);
    }
}
