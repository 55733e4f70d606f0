//! Counters of what the store did to its files, for metrics and for
//! checking group commit.

use std::sync::atomic::{AtomicU64, Ordering};

/// A point-in-time copy of a store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Durable (fsynced) commits of the log file since the store was opened.
    /// Under concurrent writes this grows much slower than the number of
    /// writes: that is group commit.
    pub log_commits: u64,
    /// Log entries written since the store was opened. One log entry
    /// carries every write that was waiting when it was proposed.
    pub log_entries_written: u64,
    /// Log commits made durable by a direct write (see
    /// [`crate::NodeOptions::direct_log_writes`]) rather than a sync.
    pub log_direct_writes: u64,
    /// Entries currently kept in the log (not yet purged behind a snapshot).
    pub log_len: u64,
    /// Snapshots written to the state file since the store was opened.
    pub snapshots_built: u64,
    /// Snapshots serialized piecewise (see [`crate::NodeOptions::piecewise_snapshot_keys`])
    /// since the store was opened, whether built or sent.
    pub snapshots_piecewise: u64,
    /// Index of the last entry the latest snapshot covers.
    pub snapshot_index: Option<u64>,
    /// Index of the last applied entry.
    pub applied_index: Option<u64>,
    /// How long durable log appends took (write and sync of one batch): a count per bucket
    /// of [`LOG_WRITE_BUCKETS_US`], then one for longer.
    pub log_write_buckets: [u64; LOG_WRITE_BUCKETS_US.len() + 1],
    /// The sum of those durations, in microseconds.
    pub log_write_us: u64,
}

/// Upper bounds of the log append latency buckets, in microseconds.
pub const LOG_WRITE_BUCKETS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];

/// Where this node's raft stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaftFigures {
    pub term: u64,
    /// The leader this node knows of, if any.
    pub leader: Option<u64>,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry this node knows is committed.
    pub commit_index: Option<u64>,
    /// Index of the last entry this node applied.
    pub applied_index: Option<u64>,
    pub is_leader: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) log_commits: AtomicU64,
    pub(crate) log_entries_written: AtomicU64,
    /// Appends made durable by a direct write (see `uring`).
    pub(crate) log_direct_writes: AtomicU64,
    pub(crate) snapshots_built: AtomicU64,
    pub(crate) snapshots_piecewise: AtomicU64,
    /// Encoded bytes of log entries written since the latest snapshot.
    pub(crate) log_bytes_since_snapshot: AtomicU64,
    /// Encoded size of the latest snapshot.
    pub(crate) snapshot_bytes: AtomicU64,
    pub(crate) log_write_buckets: [AtomicU64; LOG_WRITE_BUCKETS_US.len() + 1],
    pub(crate) log_write_us: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// A durable log append took `elapsed`.
    pub(crate) fn log_write_took(&self, elapsed: std::time::Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let i = LOG_WRITE_BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(LOG_WRITE_BUCKETS_US.len());
        Self::add(&self.log_write_buckets[i], 1);
        Self::add(&self.log_write_us, us);
    }

    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }

    /// A snapshot of `bytes` now covers the log.
    pub(crate) fn snapshot_taken(&self, bytes: u64) {
        Self::set(&self.snapshot_bytes, bytes);
        Self::set(&self.log_bytes_since_snapshot, 0);
    }

    /// A snapshot of `bytes` now covers the first `covered` bytes of log
    /// counted since the previous one; what was written after them still
    /// counts.
    pub(crate) fn snapshot_covers(&self, covered: u64, bytes: u64) {
        Self::set(&self.snapshot_bytes, bytes);
        let _ =
            self.log_bytes_since_snapshot
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(covered))
                });
    }
}
