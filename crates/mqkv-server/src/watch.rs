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
        let files = self::every(Arc::downgrade(reloader), every, |r| {
            r.reload_changed();
        });
        tasks.push(tokio::spawn(files).abort_handle());
    }
    let expiry = self::every(Arc::downgrade(reloader), EXPIRY_CHECK, |r| {
        r.warn_of_expiry(crate::reload::unix_now())
    });
    tasks.push(tokio::spawn(expiry).abort_handle());
    Watching(tasks)
}

/// Runs `check` on a thread for blocking work (reading files and building TLS settings may
/// block) every `every`, until the reloader is gone.
async fn every(
    reloader: Weak<Reloader>,
    every: Duration,
    check: impl Fn(&Reloader) + Send + Sync + Copy + 'static,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(reloader) = reloader.upgrade() else {
            return;
        };
        if tokio::task::spawn_blocking(move || check(&reloader))
            .await
            .is_err()
        {
            return;
        }
    }
}
