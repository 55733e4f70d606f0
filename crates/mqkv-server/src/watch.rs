//! Reloading without a signal. Certificates are renewed and policies edited by tools that only
//! replace files (cert-manager renewing a Kubernetes secret, a configuration manager): every
//! `watch_interval_ms` the server checks whether the files it reads have changed, and reads a
//! part again once its files have changed and stayed the same for one more check. Once a day
//! it warns of server certificates that are about to expire.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use crate::reload::Reloader;

/// How often certificates are checked for their expiry.
const EXPIRY_CHECK: Duration = Duration::from_secs(24 * 3600);

/// The shortest interval between checks of the files: each check reads them all.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The checks; they stop when this is dropped.
pub(crate) struct Watching(Vec<AbortHandle>);

impl Drop for Watching {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Starts checking the files every `every` (at least 100 ms; none when zero), and the
/// certificates' expiry daily.
pub(crate) fn start(reloader: &Arc<Reloader>, every: Duration) -> Watching {
    let mut tasks = Vec::new();
    if !every.is_zero() {
        let every = every.max(MIN_INTERVAL);
        tasks.push(tokio::spawn(check_files(Arc::downgrade(reloader), every)).abort_handle());
    }
    tasks.push(tokio::spawn(check_expiry(Arc::downgrade(reloader))).abort_handle());
    Watching(tasks)
}

async fn check_files(reloader: Weak<Reloader>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(reloader) = reloader.upgrade() else {
            return;
        };
        // Reading files and building TLS settings may block.
        if tokio::task::spawn_blocking(move || reloader.reload_changed())
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn check_expiry(reloader: Weak<Reloader>) {
    let mut tick = tokio::time::interval(EXPIRY_CHECK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(reloader) = reloader.upgrade() else {
            return;
        };
        reloader.warn_of_expiry(crate::reload::unix_now());
    }
}
