//! The retained messages: at most one per topic, counted against the limits on their number and
//! bytes, with a record of the topics changed since the state was last saved, so that a save
//! writes what changed and not every message each time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::session::Message;

/// What a retained message counts for in `max_retained_bytes`: its topic and payload.
fn size(topic: &str, payload: &[u8]) -> u64 {
    (topic.len() + payload.len()) as u64
}

/// The topics changed since the last [`Retained::take_changes`].
#[derive(Debug)]
enum Changed {
    Topics(HashSet<String>),
    /// Every topic: what was saved is to be replaced as a whole.
    All,
}

/// Retained messages changed since they were last taken for saving.
#[derive(Debug)]
pub enum RetainedChanges {
    /// These topics changed: each with its message now, or `None` where it was cleared.
    Topics(Vec<(String, Option<Arc<Message>>)>),
    /// Every retained message, replacing all that was saved.
    All(Vec<Arc<Message>>),
}

impl RetainedChanges {
    pub fn is_empty(&self) -> bool {
        matches!(self, RetainedChanges::Topics(t) if t.is_empty())
    }
}

#[derive(Debug)]
pub(crate) struct Retained {
    map: HashMap<String, Arc<Message>>,
    /// Topic and payload bytes of the messages in `map`.
    bytes: u64,
    changed: Changed,
}

impl Default for Retained {
    fn default() -> Self {
        Retained {
            map: HashMap::new(),
            bytes: 0,
            // Nothing is saved yet: the first save writes all there is.
            changed: Changed::All,
        }
    }
}

impl Retained {
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn get(&self, topic: &str) -> Option<&Arc<Message>> {
        self.map.get(topic)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Message>)> {
        self.map.iter()
    }

    fn changed(&mut self, topic: &str) {
        if let Changed::Topics(topics) = &mut self.changed {
            if !topics.contains(topic) {
                topics.insert(topic.to_owned());
            }
        }
    }

    /// Stores `msg` as its topic's retained message or, with an empty payload, clears it. The
    /// message kept is a copy that shares no memory with the packet it came in.
    pub(crate) fn set(&mut self, msg: &Message) {
        if msg.payload.is_empty() {
            self.store(&msg.topic, None);
        } else {
            self.store(&msg.topic, Some(Arc::new(msg.compacted())));
        }
    }

    /// Stores `msg`, whose bytes are its own already (read back from disk), as its topic's
    /// retained message.
    pub(crate) fn keep(&mut self, msg: Arc<Message>) {
        let topic = msg.topic.clone();
        self.store(&topic, Some(msg));
    }

    fn store(&mut self, topic: &str, msg: Option<Arc<Message>>) {
        let old = match msg {
            None => self.map.remove(topic),
            Some(m) => {
                self.bytes += size(&m.topic, &m.payload);
                self.map.insert(topic.to_owned(), m)
            }
        };
        if let Some(old) = old {
            self.bytes -= size(&old.topic, &old.payload);
        }
        self.changed(topic);
    }

    /// Forgets the message of `topic` if it expired by `now`.
    pub(crate) fn remove_expired(&mut self, topic: &str, now: Instant) {
        if self.map.get(topic).is_some_and(|m| m.expired(now)) {
            if let Some(old) = self.map.remove(topic) {
                self.bytes -= size(&old.topic, &old.payload);
            }
            self.changed(topic);
        }
    }

    /// Drops every retained message.
    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.bytes = 0;
        self.changed = Changed::All;
    }

    /// Whether a retained message of `payload` on `topic` keeps within `max_messages` and
    /// `max_bytes`, counting the one it replaces.
    pub(crate) fn room(
        &self,
        topic: &str,
        payload: &[u8],
        max_messages: usize,
        max_bytes: u64,
    ) -> bool {
        let old = self.map.get(topic);
        let count = self.map.len() + usize::from(old.is_none());
        let bytes =
            self.bytes + size(topic, payload) - old.map_or(0, |m| size(&m.topic, &m.payload));
        count <= max_messages && bytes <= max_bytes
    }

    /// The changes since the last call, and a fresh start for the next.
    pub(crate) fn take_changes(&mut self) -> RetainedChanges {
        match std::mem::replace(&mut self.changed, Changed::Topics(HashSet::new())) {
            Changed::All => RetainedChanges::All(self.map.values().cloned().collect()),
            Changed::Topics(topics) => RetainedChanges::Topics(
                topics
                    .into_iter()
                    .map(|t| {
                        let m = self.map.get(&t).cloned();
                        (t, m)
                    })
                    .collect(),
            ),
        }
    }

    /// Counts every topic as changed, so that the next changes taken hold them all: for a save
    /// that failed, or state loaded from a format that kept them elsewhere.
    pub(crate) fn all_changed(&mut self) {
        self.changed = Changed::All;
    }

    /// Counts nothing as changed: for state just loaded from where it is saved.
    pub(crate) fn nothing_changed(&mut self) {
        self.changed = Changed::Topics(HashSet::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Properties, QoS};
    use bytes::Bytes;
    use std::time::Duration;

    fn msg(topic: &str, payload: &'static [u8]) -> Message {
        Message {
            topic: topic.into(),
            payload: Bytes::from_static(payload),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: Properties::default(),
            expires_at: None,
            publisher: None,
        }
    }

    fn topics(c: RetainedChanges) -> Vec<(String, Option<Vec<u8>>)> {
        let RetainedChanges::Topics(mut t) = c else {
            panic!("expected topics, got {c:?}");
        };
        t.sort_by(|a, b| a.0.cmp(&b.0));
        t.into_iter()
            .map(|(t, m)| (t, m.map(|m| m.payload.to_vec())))
            .collect()
    }

    #[test]
    fn changes_name_each_topic_once_with_its_message_now() {
        let mut r = Retained::default();
        r.set(&msg("a", b"1"));
        let RetainedChanges::All(all) = r.take_changes() else {
            panic!("the first changes are all of them");
        };
        assert_eq!(all.len(), 1);
        assert!(r.take_changes().is_empty());

        r.set(&msg("a", b"2"));
        r.set(&msg("b", b"3"));
        r.set(&msg("a", b"4"));
        r.set(&msg("c", b"5"));
        r.set(&msg("c", b""));
        assert_eq!(
            topics(r.take_changes()),
            vec![
                ("a".into(), Some(b"4".to_vec())),
                ("b".into(), Some(b"3".to_vec())),
                ("c".into(), None),
            ]
        );
        assert!(r.take_changes().is_empty());
        assert_eq!((r.len(), r.bytes()), (2, 4));
    }

    #[test]
    fn clearing_or_a_failed_save_makes_every_message_changed() {
        let mut r = Retained::default();
        r.nothing_changed();
        r.set(&msg("a", b"1"));
        r.set(&msg("b", b"2"));
        r.clear();
        r.set(&msg("c", b"3"));
        let RetainedChanges::All(all) = r.take_changes() else {
            panic!("after a clear, what was saved is replaced");
        };
        assert_eq!(all.len(), 1);
        r.all_changed();
        assert!(matches!(r.take_changes(), RetainedChanges::All(m) if m.len() == 1));
    }

    #[test]
    fn an_expired_message_removed_counts_as_a_change() {
        let mut r = Retained::default();
        let mut m = msg("a", b"1");
        m.expires_at = Some(Instant::now());
        r.set(&m);
        r.set(&msg("b", b"2"));
        r.take_changes();
        r.remove_expired("b", Instant::now() + Duration::from_secs(1));
        assert!(r.take_changes().is_empty(), "b has no expiry");
        r.remove_expired("a", Instant::now() + Duration::from_secs(1));
        assert_eq!(topics(r.take_changes()), vec![("a".into(), None)]);
        assert_eq!((r.len(), r.bytes()), (1, 2));
    }

    #[test]
    fn a_message_read_back_is_kept_as_it_is_and_a_published_one_copied() {
        let mut r = Retained::default();
        let read_back = Arc::new(msg("a", b"1"));
        r.keep(read_back.clone());
        assert!(Arc::ptr_eq(r.get("a").expect("kept"), &read_back));
        let published = msg("b", b"2");
        r.set(&published);
        let kept = r.get("b").expect("kept");
        assert_ne!(kept.payload.as_ptr(), published.payload.as_ptr());
        assert_eq!(kept.payload, published.payload);
        assert_eq!((r.len(), r.bytes()), (2, 4));
    }

    #[test]
    fn room_counts_the_message_replaced() {
        let mut r = Retained::default();
        r.set(&msg("a", b"1234"));
        assert!(r.room("a", b"12345", 1, 6));
        assert!(!r.room("a", b"123456", 1, 6));
        assert!(!r.room("b", b"1", 1, 100));
    }
}
