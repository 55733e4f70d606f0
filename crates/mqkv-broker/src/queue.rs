//! A session's queue of messages waiting to be sent, and the broker-wide budget of bytes all
//! queues together may hold (`max_queued_bytes`).
//!
//! Invariant: the budget's count is the sum of the sizes of the messages in the queues that
//! draw on it. Every change to a queue goes through [`MessageQueue`], which adds and takes
//! away as it pushes, pops and drops, and gives back what it still holds when it is dropped.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::session::Delivery;

/// Bytes a queued message counts for beyond its topic and payload: the delivery and its share
/// of the message's bookkeeping.
const OVERHEAD: u64 = 64;

/// The bytes every session queue together may hold.
#[derive(Debug, Default)]
pub struct QueueBudget {
    used: AtomicU64,
    /// 0: no limit.
    limit: u64,
}

impl QueueBudget {
    pub fn new(limit: u64) -> QueueBudget {
        QueueBudget {
            used: AtomicU64::new(0),
            limit,
        }
    }

    /// Bytes queued now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// Messages waiting to be sent, oldest first.
#[derive(Debug, Default)]
pub struct MessageQueue {
    items: VecDeque<Delivery>,
    /// The bytes of `items`.
    bytes: u64,
    budget: Option<Arc<QueueBudget>>,
}

/// What one queued delivery counts for.
fn size_of(d: &Delivery) -> u64 {
    (d.message.topic.len() + d.message.payload.len()) as u64 + OVERHEAD
}

impl MessageQueue {
    /// Draws on `budget` from now on (bringing what is queued already).
    pub fn use_budget(&mut self, budget: &Arc<QueueBudget>) {
        if self.budget.as_ref().is_some_and(|b| Arc::ptr_eq(b, budget)) {
            return;
        }
        if let Some(old) = self.budget.take() {
            old.used.fetch_sub(self.bytes, Ordering::Relaxed);
        }
        budget.used.fetch_add(self.bytes, Ordering::Relaxed);
        self.budget = Some(budget.clone());
    }

    /// Whether `d` fits in the budget (always, without one).
    pub fn fits(&self, d: &Delivery) -> bool {
        self.budget
            .as_ref()
            .is_none_or(|b| b.limit == 0 || b.used().saturating_add(size_of(d)) <= b.limit)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn front(&self) -> Option<&Delivery> {
        self.items.front()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Delivery> {
        self.items.iter()
    }

    pub fn push_back(&mut self, d: Delivery) {
        self.add(size_of(&d));
        self.items.push_back(d);
    }

    pub fn pop_front(&mut self) -> Option<Delivery> {
        let d = self.items.pop_front()?;
        self.take(size_of(&d));
        Some(d)
    }

    /// Keeps the deliveries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Delivery) -> bool) {
        let mut dropped = 0;
        self.items.retain(|d| {
            let kept = keep(d);
            if !kept {
                dropped += size_of(d);
            }
            kept
        });
        self.take(dropped);
    }

    fn add(&mut self, n: u64) {
        self.bytes += n;
        if let Some(b) = &self.budget {
            b.used.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn take(&mut self, n: u64) {
        self.bytes -= n;
        if let Some(b) = &self.budget {
            b.used.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

impl Drop for MessageQueue {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.used.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Properties, QoS};
    use crate::session::Message;

    fn delivery(topic: &str, payload: usize) -> Delivery {
        Delivery {
            message: Arc::new(Message {
                topic: topic.to_owned(),
                payload: bytes::Bytes::from(vec![0u8; payload]),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Properties::default(),
                expires_at: None,
                publisher: None,
            }),
            qos: QoS::AtLeastOnce,
            retain: false,
            subscription_ids: Vec::new(),
        }
    }

    #[test]
    fn the_budget_counts_what_every_queue_holds_and_gets_it_all_back() {
        let budget = Arc::new(QueueBudget::new(1_100));
        let mut a = MessageQueue::default();
        a.push_back(delivery("t", 100));
        a.use_budget(&budget);
        assert_eq!(budget.used(), 1 + 100 + OVERHEAD);
        let mut b = MessageQueue::default();
        b.use_budget(&budget);
        for _ in 0..3 {
            b.push_back(delivery("tt", 200));
        }
        assert_eq!(budget.used(), 165 + 3 * 266);
        assert!(!b.fits(&delivery("t", 100)), "963 + 165 > 1100");
        assert!(b.fits(&delivery("t", 10)));
        b.pop_front();
        b.retain(|d| d.message.topic != "tt");
        assert!(b.is_empty());
        assert_eq!(budget.used(), 165);
        drop(a);
        assert_eq!(budget.used(), 0);
    }
}
