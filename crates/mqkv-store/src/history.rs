//! The recent changes of every key, for watches that resume (`KEYNOTIFY key SINCE version`,
//! an extension): a client that was away asks for the changes after the last version it saw
//! and gets exactly those, in order.
//!
//! Invariants:
//! - every applied change (SET, DEL, VDEL, expiry) is recorded, in log order, on every
//!   replica: the history is part of the replicated state and of snapshots;
//! - at most `max_changes` changes are kept, holding at most `max_bytes` of keys and values,
//!   none older than `max_age_ms` (by the wall clock of the entry that applied the latest
//!   change); the limits change through the log;
//! - `compacted_ms` is at least the wall clock of every version dropped, and of the first
//!   entry the store ever applied, so a request for the changes after a version no newer
//!   than it may have lost some (or comes from before this store existed) and is told so,
//!   never answered with a partial history.

use std::collections::VecDeque;

use bytes::Bytes;
use mqkv_protocol::Hlc;
use serde::{Deserialize, Serialize};

use crate::{ChangeEvent, ChangeKind};

/// Changes kept by default.
pub const DEFAULT_HISTORY_CHANGES: usize = 10_000;

/// How long changes are kept by default, in milliseconds.
pub const DEFAULT_HISTORY_MS: u64 = 3_600_000;

/// Key and value bytes the kept changes may hold by default.
pub const DEFAULT_HISTORY_BYTES: u64 = 64 * 1024 * 1024;

/// One recorded change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Change {
    key: Bytes,
    version: Hlc,
    /// The new value; `None` for a deletion.
    value: Option<Bytes>,
    /// The wall clock of the entry that applied it.
    at_ms: u64,
}

/// The limits of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryLimits {
    pub max_changes: usize,
    pub max_age_ms: u64,
    pub max_bytes: u64,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            max_changes: DEFAULT_HISTORY_CHANGES,
            max_age_ms: DEFAULT_HISTORY_MS,
            max_bytes: DEFAULT_HISTORY_BYTES,
        }
    }
}

impl Change {
    fn bytes(&self) -> u64 {
        (self.key.len() + self.value.as_ref().map_or(0, |v| v.len())) as u64
    }
}

/// The changes after a version are no longer all kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted;

/// The recent changes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct History {
    changes: VecDeque<Change>,
    limits: HistoryLimits,
    /// At least the wall clock of every version dropped.
    compacted_ms: u64,
    /// Key and value bytes of `changes`; counted again when a snapshot is read, never trusted
    /// from one.
    #[serde(skip)]
    bytes: u64,
    /// The wall clock of the first version the store recorded (`None`: none yet): versions
    /// before it are from before this store, and nothing is known of them.
    started_ms: Option<u64>,
}

impl History {
    /// A history that knows nothing before `ms` (a store restored from a snapshot that had
    /// none).
    pub(crate) fn starting_at(ms: u64) -> History {
        History {
            compacted_ms: ms,
            started_ms: Some(0),
            ..History::default()
        }
    }

    /// Counts the bytes of the changes again (after reading a snapshot).
    pub(crate) fn recount(&mut self) {
        self.bytes = self.changes.iter().map(Change::bytes).sum();
    }

    pub(crate) fn limits(&self) -> HistoryLimits {
        self.limits
    }

    pub(crate) fn set_limits(&mut self, limits: HistoryLimits, now_ms: u64) {
        self.limits = limits;
        self.trim(now_ms);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.changes.len()
    }

    /// Records the changes an entry applied at `now_ms`.
    pub(crate) fn record(&mut self, events: &[ChangeEvent], now_ms: u64) {
        for event in events {
            self.started_ms.get_or_insert(event.version.wall_ms);
            let change = Change {
                key: event.key.clone(),
                version: event.version.clone(),
                // A copy of its own: the event's value may share a whole request's buffer.
                value: match &event.kind {
                    ChangeKind::Set { value } => Some(Bytes::copy_from_slice(value)),
                    ChangeKind::Delete => None,
                },
                at_ms: now_ms,
            };
            self.bytes += change.bytes();
            self.changes.push_back(change);
        }
        self.trim(now_ms);
    }

    /// Roughly the bytes the history takes in a snapshot.
    pub(crate) fn size_hint(&self) -> u64 {
        self.bytes + 64 * self.changes.len() as u64
    }

    fn trim(&mut self, now_ms: u64) {
        while let Some(oldest) = self.changes.front() {
            let too_many = self.changes.len() > self.limits.max_changes;
            let too_big = self.bytes > self.limits.max_bytes;
            let too_old = oldest.at_ms.saturating_add(self.limits.max_age_ms) < now_ms;
            if !too_many && !too_big && !too_old {
                break;
            }
            self.compacted_ms = self.compacted_ms.max(oldest.version.wall_ms);
            self.bytes = self.bytes.saturating_sub(oldest.bytes());
            self.changes.pop_front();
        }
    }

    /// The changes of `key` after version `after`, oldest first; [`Compacted`] when some may
    /// no longer be kept.
    pub fn since(&self, key: &[u8], after: &Hlc) -> Result<Vec<ChangeEvent>, Compacted> {
        self.since_where(after, |k| k == key)
    }

    /// The changes after version `after` of the keys `wanted` picks, oldest first.
    pub fn since_where(
        &self,
        after: &Hlc,
        wanted: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<ChangeEvent>, Compacted> {
        // A store that has recorded no change knows of no version: `after` is from elsewhere.
        let Some(started_ms) = self.started_ms else {
            return Err(Compacted);
        };
        if after.wall_ms <= self.compacted_ms || after.wall_ms < started_ms {
            return Err(Compacted);
        }
        Ok(self
            .changes
            .iter()
            .filter(|c| c.version > *after && wanted(&c.key))
            .map(|c| ChangeEvent {
                key: c.key.clone(),
                kind: match &c.value {
                    Some(value) => ChangeKind::Set {
                        value: value.clone(),
                    },
                    None => ChangeKind::Delete,
                },
                version: c.version.clone(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &'static str, value: &'static str, ms: u64) -> ChangeEvent {
        ChangeEvent {
            key: Bytes::from_static(key.as_bytes()),
            kind: ChangeKind::Set {
                value: Bytes::from_static(value.as_bytes()),
            },
            version: Hlc::new(ms, 0, "n"),
        }
    }

    #[test]
    fn versions_from_before_the_store_began_are_compacted() {
        let mut h = History::default();
        assert_eq!(h.since(b"k", &Hlc::new(900, 0, "old")), Err(Compacted));
        h.record(&[set("k", "a", 1_000)], 1_000);
        assert_eq!(h.since(b"k", &Hlc::new(900, 0, "old")), Err(Compacted));
        assert_eq!(h.since(b"k", &Hlc::new(1_000, 0, "n")), Ok(vec![]));
        h.record(&[set("k", "b", 6_000)], 6_000);
        assert_eq!(
            h.since(b"k", &Hlc::new(1_000, 0, "n")).map(|c| c.len()),
            Ok(1),
            "only the first version marks the start"
        );
    }

    #[test]
    fn the_changes_after_a_version_come_in_order() {
        let mut h = History::default();
        h.record(&[set("k", "a", 100)], 100);
        h.record(&[set("other", "x", 150)], 150);
        h.record(&[set("k", "b", 200)], 200);
        let del = ChangeEvent {
            key: Bytes::from_static(b"k"),
            kind: ChangeKind::Delete,
            version: Hlc::new(300, 0, "n"),
        };
        h.record(std::slice::from_ref(&del), 300);
        let after_a = h.since(b"k", &Hlc::new(100, 0, "n")).expect("kept");
        assert_eq!(after_a, vec![set("k", "b", 200), del]);
        assert_eq!(h.since(b"k", &Hlc::new(300, 0, "n")), Ok(vec![]));
    }

    #[test]
    fn dropped_changes_make_older_versions_compacted() {
        let mut h = History::default();
        h.set_limits(
            HistoryLimits {
                max_changes: 2,
                max_age_ms: 1_000,
                max_bytes: 1_000,
            },
            0,
        );
        for ms in [100, 200, 300] {
            h.record(&[set("k", "v", ms)], ms);
        }
        assert_eq!(h.len(), 2);
        assert_eq!(h.since(b"k", &Hlc::new(50, 0, "n")), Err(Compacted));
        assert_eq!(h.since(b"k", &Hlc::new(100, 0, "n")), Err(Compacted));
        assert_eq!(
            h.since(b"k", &Hlc::new(200, 0, "n")).map(|c| c.len()),
            Ok(1)
        );
        // Age: a change applied long after drops the old ones.
        h.record(&[set("other", "v", 5_000)], 5_000);
        assert_eq!(h.len(), 1);
        assert_eq!(h.since(b"k", &Hlc::new(300, 0, "n")), Err(Compacted));
        assert_eq!(h.since(b"k", &Hlc::new(5_000, 0, "n")), Ok(vec![]));
        // Bytes: a large value pushes out what came before.
        let big: &'static str = Box::leak("x".repeat(996).into_boxed_str());
        h.record(&[set("big", big, 5_001)], 5_001);
        assert_eq!(h.len(), 1);
        assert_eq!(h.since(b"other", &Hlc::new(5_000, 0, "n")), Err(Compacted));
    }
}
