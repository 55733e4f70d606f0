//! Counters of what the broker does, for metrics.
//!
//! Counting must cost next to nothing where messages flow, so a counter is not one shared
//! atomic: each connection thread has its own slot ([`PerThread`]), which only that thread
//! writes (a relaxed add on a cache line no other thread touches), and a reader sums the slots.
//! Code running on any other thread shares one extra slot. A sum taken while traffic flows is
//! a moment's figure like any other; once traffic stops it is exact.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::placement::current_home;

/// One value per connection thread (and one for every other thread), each on cache lines of
/// its own.
pub struct PerThread<T> {
    slots: Box<[Padded<T>]>,
}

/// Keeps its value off the cache lines of its neighbours.
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

impl<T: Default> PerThread<T> {
    /// Slots for `threads` connection threads and one for the rest.
    pub fn new(threads: usize) -> PerThread<T> {
        PerThread {
            slots: (0..=threads).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> PerThread<T> {
    /// The slot of the thread the caller runs on.
    pub fn here(&self) -> &T {
        let home = current_home();
        let i = if home < self.slots.len() { home } else { 0 };
        &self.slots[i].0
    }

    /// Every slot, to sum.
    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

impl<T> std::fmt::Debug for PerThread<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerThread")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// Adds `n` to a counter of the caller's slot.
pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// The sum of one counter over every slot.
pub fn sum<T>(per_thread: &PerThread<T>, counter: impl Fn(&T) -> &AtomicU64) -> u64 {
    per_thread
        .all()
        .map(|slot| counter(slot).load(Ordering::Relaxed))
        .sum()
}

/// Most metric categories told apart (AIO's `metriccategory` CONNECT user property); clients
/// naming further ones are counted as [`UNCATEGORIZED`].
pub const MAX_CATEGORIES: usize = 16;

/// The category of clients that name none.
pub const UNCATEGORIZED: &str = "uncategorized";

/// The CONNECT user property naming a client's metric category (as AIO's broker reads it).
pub const CATEGORY_PROPERTY: &str = "metriccategory";

/// Publishes counted for one metric category.
#[derive(Debug, Default)]
pub struct Traffic {
    /// PUBLISH packets received from clients (every QoS, refused ones included).
    pub publishes_received: AtomicU64,
    pub payload_bytes_received: AtomicU64,
    /// PUBLISH packets written to clients (redeliveries included).
    pub publishes_sent: AtomicU64,
    pub payload_bytes_sent: AtomicU64,
}

/// The metric categories clients named, each with its number (0: [`UNCATEGORIZED`]).
#[derive(Debug)]
pub struct Categories(parking_lot::Mutex<Vec<Arc<str>>>);

impl Default for Categories {
    fn default() -> Self {
        Categories(parking_lot::Mutex::new(vec![Arc::from(UNCATEGORIZED)]))
    }
}

impl Categories {
    /// The number of category `name` (`None`: uncategorized), given one if it is new and
    /// there is room.
    pub fn number(&self, name: Option<&str>) -> usize {
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return 0;
        };
        let mut names = self.0.lock();
        if let Some(i) = names.iter().position(|n| &**n == name) {
            return i;
        }
        if names.len() >= MAX_CATEGORIES {
            tracing::debug!(
                category = name,
                "too many metric categories: counted as uncategorized"
            );
            return 0;
        }
        names.push(Arc::from(name));
        names.len() - 1
    }

    /// The names, by number.
    pub fn names(&self) -> Vec<Arc<str>> {
        self.0.lock().clone()
    }
}

/// What one thread counted.
#[derive(Debug, Default)]
pub struct Counters {
    /// Publishes by metric category (see [`Categories`]).
    pub traffic: [Traffic; MAX_CATEGORIES],
    /// QoS 0 messages dropped on their way out: for a disconnected session, or a full queue.
    pub qos0_dropped: AtomicU64,
    /// Messages of any QoS dropped by a full session queue (`queue_full`).
    pub queue_full_dropped: AtomicU64,
    pub authentication_successes: AtomicU64,
    pub authentication_failures: AtomicU64,
    /// Decisions of the policy (or of a namespace reserved for the server).
    pub authorization_allow: AtomicU64,
    pub authorization_deny: AtomicU64,
    /// Connections ended before MQTT began, by [`HANDSHAKE_FAILURES`].
    pub handshake_failures: [AtomicU64; HANDSHAKE_FAILURES.len()],
}

/// Why a connection ended before MQTT began: its TLS handshake failed (garbage, plain MQTT on
/// a TLS port, a client certificate that does not verify), its WebSocket upgrade was refused,
/// its PROXY protocol header was, or its handshakes did not finish in time.
pub const HANDSHAKE_FAILURES: [&str; 4] = ["tls", "websocket", "proxy", "timeout"];

/// The broker's counters, summed over threads, and its gauges, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerStats {
    pub publishes_received: u64,
    pub payload_bytes_received: u64,
    pub publishes_sent: u64,
    pub payload_bytes_sent: u64,
    /// The same four, per metric category: (name, received, bytes received, sent, bytes
    /// sent).
    pub by_category: Vec<(Arc<str>, [u64; 4])>,
    pub qos0_dropped: u64,
    pub queue_full_dropped: u64,
    pub authentication_successes: u64,
    pub authentication_failures: u64,
    pub authorization_allow: u64,
    pub authorization_deny: u64,
    /// Sessions with a connection.
    pub connected_sessions: u64,
    /// Sessions, connected or kept for a disconnected client.
    pub total_sessions: u64,
    /// Subscriptions of every session.
    pub total_subscriptions: u64,
    pub retained_messages: u64,
    /// Topic and payload bytes of the retained messages.
    pub retained_bytes: u64,
    /// Open connections by listener kind (`tcp`, `tls`, `ws`, `wss`), handshakes included.
    pub connections: Vec<(&'static str, u64)>,
    /// Connections ended before MQTT began, by reason (see [`HANDSHAKE_FAILURES`]).
    pub handshake_failures: Vec<(&'static str, u64)>,
}

impl BrokerStats {
    /// The counters of `per_thread`, summed.
    pub(crate) fn counters(
        per_thread: &PerThread<Counters>,
        categories: &Categories,
    ) -> BrokerStats {
        let by_category: Vec<(Arc<str>, [u64; 4])> = categories
            .names()
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let t = |f: fn(&Traffic) -> &AtomicU64| sum(per_thread, |c| f(&c.traffic[i]));
                let figures = [
                    t(|x| &x.publishes_received),
                    t(|x| &x.payload_bytes_received),
                    t(|x| &x.publishes_sent),
                    t(|x| &x.payload_bytes_sent),
                ];
                (name, figures)
            })
            .collect();
        let total = |i: usize| by_category.iter().map(|(_, f)| f[i]).sum();
        BrokerStats {
            publishes_received: total(0),
            payload_bytes_received: total(1),
            publishes_sent: total(2),
            payload_bytes_sent: total(3),
            by_category,
            qos0_dropped: sum(per_thread, |c| &c.qos0_dropped),
            queue_full_dropped: sum(per_thread, |c| &c.queue_full_dropped),
            authentication_successes: sum(per_thread, |c| &c.authentication_successes),
            authentication_failures: sum(per_thread, |c| &c.authentication_failures),
            authorization_allow: sum(per_thread, |c| &c.authorization_allow),
            authorization_deny: sum(per_thread, |c| &c.authorization_deny),
            handshake_failures: HANDSHAKE_FAILURES
                .iter()
                .enumerate()
                .map(|(i, reason)| (*reason, sum(per_thread, |c| &c.handshake_failures[i])))
                .collect(),
            ..BrokerStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_add_up_per_category() {
        let p: PerThread<Counters> = PerThread::new(3);
        let categories = Categories::default();
        let plant = categories.number(Some("plant-a"));
        assert_eq!(categories.number(None), 0);
        assert_eq!(categories.number(Some("plant-a")), plant);
        add(&p.here().traffic[0].publishes_received, 2);
        add(
            &p.all().nth(2).expect("slot").traffic[plant].publishes_received,
            5,
        );
        let stats = BrokerStats::counters(&p, &categories);
        assert_eq!(stats.publishes_received, 7);
        assert_eq!(stats.by_category[0].0.as_ref(), UNCATEGORIZED);
        assert_eq!(stats.by_category[0].1[0], 2);
        assert_eq!(stats.by_category[plant].0.as_ref(), "plant-a");
        assert_eq!(stats.by_category[plant].1[0], 5);
    }

    #[test]
    fn categories_beyond_the_limit_count_as_uncategorized() {
        let categories = Categories::default();
        for i in 1..MAX_CATEGORIES {
            assert_eq!(categories.number(Some(&format!("c{i}"))), i);
        }
        assert_eq!(categories.number(Some("one-too-many")), 0);
        assert_eq!(categories.number(Some("")), 0);
        assert_eq!(categories.names().len(), MAX_CATEGORIES);
    }
}
