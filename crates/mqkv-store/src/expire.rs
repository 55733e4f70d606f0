//! Key expiry (`PX`).
//!
//! Invariants:
//! - a key whose deadline is at or before `now` is never returned by a
//!   read and is absent for every command;
//! - every removal by expiry emits a DELETE event with a fresh version, the
//!   same as an explicit DEL, because observers (lock waiters in every SDK)
//!   are woken only by that event;
//! - [`StateMachine::next_expiry_ms`] is the earliest deadline still stored,
//!   so a timer that proposes `Op::ExpireDue` at that time removes keys
//!   promptly (the SDK tests allow seconds; a 50 ms sweep is plenty).

use mqkv_protocol::Response;

use crate::{Applied, ChangeEvent, StateMachine};

impl StateMachine {
    /// The earliest deadline of any stored key.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.expiry.first().map(|(deadline, _)| *deadline)
    }

    /// `Op::ExpireDue`: removes every key due at `now`. Answers with the
    /// number of keys removed.
    pub(crate) fn apply_expire_due(&mut self, now: u64) -> Applied {
        let mut events = Vec::new();
        let removed = self.expire_due_into(now, &mut events);
        Applied {
            response: Response::Integer(i64::try_from(removed).unwrap_or(i64::MAX)),
            version: None,
            events,
            created: false,
        }
    }

    /// Removes every key with a deadline at or before `now`, in deadline
    /// order, appending their DELETE events.
    pub(crate) fn expire_due_into(&mut self, now: u64, events: &mut Vec<ChangeEvent>) -> usize {
        let mut removed = 0;
        while let Some((deadline, key)) = self.expiry.first().cloned() {
            if deadline > now {
                break;
            }
            self.delete_with_event(&key, now, None, events);
            removed += 1;
        }
        removed
    }

    /// If `key` is stored but past its deadline, removes it and reports the
    /// deletion, so the command that follows sees it absent.
    pub(crate) fn purge_if_expired(&mut self, key: &[u8], now: u64, events: &mut Vec<ChangeEvent>) {
        if self.keys.get(key).is_some_and(|r| !r.is_live(now)) {
            self.delete_with_event(key, now, None, events);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::{ChangeKind, Entry, Op};
    use mqkv_protocol::{Command, Response};

    fn expire(now_ms: u64) -> Entry {
        Entry {
            now_ms,
            op: Op::ExpireDue,
        }
    }

    #[test]
    fn expire_due_removes_only_due_keys_in_deadline_order() {
        let mut m = machine();
        m.apply(&entry(1_000, set_cmd("b", "1", None, Some(100)), None)); // 1100
        m.apply(&entry(1_000, set_cmd("a", "1", None, Some(200)), None)); // 1200
        m.apply(&entry(1_000, set_cmd("c", "1", None, Some(300)), None)); // 1300
        put(&mut m, 1_000, "forever", "1");
        assert_eq!(m.next_expiry_ms(), Some(1_100));
        let set_versions: Vec<_> = ["b", "a"]
            .iter()
            .map(|k| m.get(k.as_bytes(), 1_000).expect("set").1)
            .collect();

        let applied = m.apply(&expire(1_200));
        assert_eq!(applied.response, Response::Integer(2));
        assert_eq!(applied.version, None);
        let keys: Vec<_> = applied.events.iter().map(|e| e.key.clone()).collect();
        assert_eq!(keys, vec![b("b"), b("a")]);
        assert!(applied.events.iter().all(|e| e.kind == ChangeKind::Delete));
        // Each deletion's version is above the version its key had; keys count their own
        // versions, so two deletions in one millisecond may share one.
        for (event, set) in applied.events.iter().zip(&set_versions) {
            assert!(event.version > *set, "{} after {set}", event.version);
        }
        assert_eq!(m.len(), 2);
        assert_eq!(m.next_expiry_ms(), Some(1_300));
        assert_indexes_consistent(&m);

        assert_eq!(m.apply(&expire(1_200)).response, Response::Integer(0));
        assert_eq!(m.apply(&expire(5_000)).response, Response::Integer(1));
        assert_eq!(m.next_expiry_ms(), None);
        assert_eq!(m.get(b"forever", 5_000).unwrap().0, b("1"));
    }

    #[test]
    fn deadline_is_exclusive_of_the_last_live_millisecond() {
        let mut m = machine();
        m.apply(&entry(1_000, set_cmd("k", "v", None, Some(100)), None));
        assert!(m.get(b"k", 1_099).is_some());
        assert!(m.get(b"k", 1_100).is_none());
        assert_eq!(m.apply(&expire(1_099)).response, Response::Integer(0));
        assert_eq!(m.apply(&expire(1_100)).response, Response::Integer(1));
    }

    #[test]
    fn expired_key_is_absent_for_del_and_vdel_and_reported_deleted() {
        let mut m = machine();
        m.apply(&entry(1_000, set_cmd("k", "v", None, Some(10)), None));
        let del = m.apply(&entry(2_000, Command::Del { key: b("k") }, None));
        assert_eq!(del.response, Response::Integer(0));
        assert_eq!(del.version, None);
        assert_eq!(del.events.len(), 1, "the expiry is still reported");
        assert_eq!(del.events[0].kind, ChangeKind::Delete);
        assert!(m.is_empty());

        m.apply(&entry(3_000, set_cmd("k", "v", None, Some(10)), None));
        let vdel = m.apply(&entry(
            4_000,
            Command::VDel {
                key: b("k"),
                value: b("v"),
            },
            None,
        ));
        assert_eq!(vdel.response, Response::Integer(0));
        assert_eq!(vdel.events.len(), 1);
        assert!(m.is_empty());
    }

    #[test]
    fn expiry_discards_the_fencing_token() {
        let mut m = machine();
        let token = mqkv_protocol::Hlc::new(10, 0, "srv");
        m.apply(&entry(
            1_000,
            set_cmd("k", "v", None, Some(10)),
            Some(token),
        ));
        m.apply(&expire(1_010));
        // No token needed any more.
        put(&mut m, 1_020, "k", "w");
        assert_eq!(m.fencing_token(b"k", 1_020), None);
    }
}
