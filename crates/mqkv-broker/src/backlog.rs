//! Retained messages waiting for room in a session's queue.
//!
//! A subscription can match more retained messages than a session queue holds
//! (`max_queued_messages`). Those that do not fit in half the queue (the other half stays free
//! for live messages) wait here, and move into the queue as it drains, so the subscriber gets
//! every one of them, paced by how fast it reads, instead of the queue policy dropping all
//! but the first.
//!
//! Invariants:
//! - at most one delivery waits per topic (a retained message is the one of its topic);
//! - a live message routed to the session removes the waiting retained message of its topic:
//!   it is newer, and the retained one delivered after it would be stale;
//! - waiting deliveries move to the queue in the order they were added.

use std::collections::{HashMap, VecDeque};

use crate::queue::MessageQueue;
use crate::session::Delivery;

/// The retained deliveries of one session waiting for room in its queue.
#[derive(Debug, Default)]
pub struct RetainedBacklog {
    order: VecDeque<String>,
    waiting: HashMap<String, Delivery>,
}

impl RetainedBacklog {
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Adds a delivery at the back (replacing one waiting for the same topic).
    pub fn push(&mut self, d: Delivery) {
        let topic = d.message.topic.clone();
        if self.waiting.insert(topic.clone(), d).is_none() {
            self.order.push_back(topic);
        }
    }

    /// A live message on `topic` supersedes the retained one waiting for it.
    pub fn supersede(&mut self, topic: &str) {
        self.waiting.remove(topic);
        if self.waiting.is_empty() {
            self.order.clear();
        }
    }

    /// Keeps only the deliveries whose topic `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.waiting.retain(|topic, _| keep(topic));
        self.order.retain(|topic| self.waiting.contains_key(topic));
    }

    /// The oldest waiting delivery.
    pub fn pop(&mut self) -> Option<Delivery> {
        while let Some(topic) = self.order.pop_front() {
            if let Some(d) = self.waiting.remove(&topic) {
                return Some(d);
            }
        }
        None
    }

    /// Moves waiting deliveries into `queue` until it holds `limit`, or the budget of queued
    /// bytes has no room for the next.
    pub fn refill(&mut self, queue: &mut MessageQueue, limit: usize) {
        while queue.len() < limit {
            let Some(d) = self.pop() else { break };
            if !queue.fits(&d) {
                // It waits at the front for the next refill.
                let topic = d.message.topic.clone();
                self.waiting.insert(topic.clone(), d);
                self.order.push_front(topic);
                break;
            }
            queue.push_back(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Properties, QoS};
    use crate::session::Message;
    use std::sync::Arc;

    fn delivery(topic: &str, payload: &'static str) -> Delivery {
        Delivery {
            message: Arc::new(Message {
                topic: topic.to_owned(),
                payload: bytes::Bytes::from_static(payload.as_bytes()),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Properties::default(),
                expires_at: None,
                publisher: None,
            }),
            qos: QoS::AtLeastOnce,
            retain: true,
            subscription_ids: Vec::new(),
        }
    }

    #[test]
    fn waiting_deliveries_refill_the_queue_in_order_and_once_per_topic() {
        let mut b = RetainedBacklog::default();
        for i in 0..5 {
            b.push(delivery(&format!("t/{i}"), "old"));
        }
        b.push(delivery("t/1", "again"));
        assert_eq!(b.len(), 5);
        b.supersede("t/2");
        let mut queue = MessageQueue::default();
        b.refill(&mut queue, 2);
        let topics: Vec<&str> = queue.iter().map(|d| d.message.topic.as_str()).collect();
        assert_eq!(topics, ["t/0", "t/1"]);
        assert_eq!(
            &queue.iter().nth(1).expect("two").message.payload[..],
            b"again"
        );
        let mut queue = MessageQueue::default();
        b.refill(&mut queue, 10);
        let topics: Vec<&str> = queue.iter().map(|d| d.message.topic.as_str()).collect();
        assert_eq!(topics, ["t/3", "t/4"], "t/2 was superseded");
        assert!(b.is_empty());
    }
}
