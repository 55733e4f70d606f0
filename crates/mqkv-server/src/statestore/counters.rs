//! What the state store counts: requests by command (AIO's names), notifications sent, and how
//! long each command took to answer. Per connection thread ([`PerThread`]), summed when read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mqkv_broker::stats::{add, sum, PerThread};
use mqkv_protocol::Command;

/// Upper bounds of the latency buckets, in microseconds (the last bucket is unbounded).
pub const BUCKETS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// The commands latency is kept for, in this order.
pub const COMMANDS: [&str; 7] = ["SET", "GET", "DEL", "VDEL", "KEYNOTIFY", "SCAN", "MGET"];

/// The index of `command` in [`COMMANDS`].
pub fn command_index(command: &Command) -> usize {
    COMMANDS
        .iter()
        .position(|c| *c == command.verb())
        .unwrap_or(0)
}

/// A latency histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    /// One count per bucket of [`BUCKETS_US`], plus one for longer.
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn record(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_US.len());
        add(&self.buckets[i], 1);
        add(&self.sum_us, us);
    }
}

/// One thread's counts.
#[derive(Debug, Default)]
pub struct Slot {
    /// SET requests that created their key.
    pub insertions: AtomicU64,
    /// SET requests of a key that existed (applied or refused by their condition).
    pub modifications: AtomicU64,
    /// DEL and VDEL requests.
    pub deletions: AtomicU64,
    /// GET requests.
    pub retrievals: AtomicU64,
    pub keynotify_requests: AtomicU64,
    pub scans: AtomicU64,
    pub notifications_sent: AtomicU64,
    /// Requests refused by the policy.
    pub not_authorized: AtomicU64,
    latency: [Histogram; COMMANDS.len()],
}

/// A histogram summed over threads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative counts per bucket of [`BUCKETS_US`], then the total.
    pub cumulative: Vec<u64>,
    pub sum_us: u64,
}

/// The store's counters.
pub struct StoreCounters(PerThread<Slot>);

impl StoreCounters {
    pub fn new(per_thread: PerThread<Slot>) -> StoreCounters {
        StoreCounters(per_thread)
    }

    /// The caller's thread's slot.
    pub fn here(&self) -> &Slot {
        self.0.here()
    }

    /// A request received, by its command. SETs are counted when the log has answered them
    /// ([`StoreCounters::set_applied`]).
    pub fn request(&self, command: &Command) {
        let slot = self.here();
        let counter = match command {
            Command::Set { .. } => return,
            Command::Del { .. } | Command::VDel { .. } | Command::DelIfVersion { .. } => {
                &slot.deletions
            }
            Command::Get { .. } => &slot.retrievals,
            // Each key of an MGET is a retrieval.
            Command::MGet { keys } => {
                add(&slot.retrievals, keys.len() as u64);
                return;
            }
            Command::KeyNotify { .. }
            | Command::KeyNotifyPattern { .. }
            | Command::KeyNotifySince { .. }
            | Command::KeyNotifyPatternSince { .. } => &slot.keynotify_requests,
            Command::Scan { .. } => &slot.scans,
        };
        add(counter, 1);
    }

    /// A SET answered: an insertion when it created its key (or, refused before the log, when
    /// its key did not exist), else a modification (also when its condition or fencing token
    /// refused it).
    pub fn set_applied(&self, created: bool) {
        let slot = self.here();
        add(
            if created {
                &slot.insertions
            } else {
                &slot.modifications
            },
            1,
        );
    }

    /// A request of command `COMMANDS[i]` answered `elapsed` after it arrived.
    pub fn answered(&self, i: usize, elapsed: Duration) {
        if let Some(h) = self.here().latency.get(i) {
            h.record(elapsed);
        }
    }

    /// The sum of one counter.
    pub fn total(&self, counter: impl Fn(&Slot) -> &AtomicU64) -> u64 {
        sum(&self.0, counter)
    }

    /// The latency histogram of command `COMMANDS[i]`, summed.
    pub fn latency(&self, i: usize) -> HistogramSnapshot {
        let mut cumulative = Vec::with_capacity(BUCKETS_US.len() + 1);
        let mut running = 0;
        for b in 0..=BUCKETS_US.len() {
            running += self
                .0
                .all()
                .map(|s| s.latency[i].buckets[b].load(Ordering::Relaxed))
                .sum::<u64>();
            cumulative.push(running);
        }
        let sum_us = self
            .0
            .all()
            .map(|s| s.latency[i].sum_us.load(Ordering::Relaxed))
            .sum();
        HistogramSnapshot { cumulative, sum_us }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn requests_and_latency_add_up() {
        let c = StoreCounters::new(PerThread::new(2));
        let set = Command::Set {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            condition: None,
            px_ms: None,
        };
        c.request(&set);
        c.set_applied(true);
        c.set_applied(false);
        c.set_applied(false);
        assert_eq!(c.total(|s| &s.insertions), 1);
        assert_eq!(c.total(|s| &s.modifications), 2);
        c.answered(command_index(&set), Duration::from_micros(80));
        c.answered(command_index(&set), Duration::from_secs(5));
        let h = c.latency(0);
        // 80 µs falls in the 100 µs bucket; 5 s beyond the last.
        assert_eq!(h.cumulative[0], 0);
        assert_eq!(h.cumulative[1], 1);
        assert_eq!(h.cumulative[BUCKETS_US.len() - 1], 1);
        assert_eq!(h.cumulative[BUCKETS_US.len()], 2);
        assert_eq!(h.sum_us, 5_000_080);
    }
}
