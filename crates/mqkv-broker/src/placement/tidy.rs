//! Giving memory that long-lived threads freed back to the system while they are quiet.
//!
//! An allocator such as mimalloc keeps the memory a thread freed in that thread's heap and
//! returns it as the thread goes on allocating. After a burst (a storm of connections, a
//! flood of sessions that then expire) the connection threads may go quiet with much of it
//! still resident. The program sets a function that releases the calling thread's freed
//! memory; the broker's threads call it every few seconds.

use std::sync::OnceLock;
use std::time::Duration;

/// How often each thread releases its freed memory.
const EVERY: Duration = Duration::from_secs(5);

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Sets the function that gives the calling thread's freed memory back to the system (for
/// mimalloc, `mi_collect(true)`). Only the first call has an effect.
pub fn set_release_freed_memory(release: fn()) {
    let _ = RELEASE.set(release);
}

/// Gives the calling thread's freed memory back to the system now, for a thread that has just
/// freed much and goes quiet (when a release function is set).
pub fn release_freed_memory() {
    if let Some(release) = RELEASE.get() {
        release();
    }
}

/// Calls the release function every few seconds on the thread that runs this future (for a
/// current-thread runtime, its one thread); returns at once when none is set.
pub async fn release_freed_memory_periodically() {
    let Some(release) = RELEASE.get() else {
        return;
    };
    let mut ticks = tokio::time::interval(EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        release();
    }
}
