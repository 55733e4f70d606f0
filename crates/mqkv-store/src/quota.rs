//! Key-count and byte quotas.
//!
//! Invariant: with a fixed configuration, `len() <= max_keys` and
//! `stored_bytes() <= max_bytes` hold after every entry. A SET that would
//! break either is refused with `-ERR the quota has been exceeded` and
//! changes nothing stored; an overwrite that does not grow past the limit
//! is allowed. If the limits were lowered below current usage, writes that
//! do not grow usage still go through, so the store can drain.

use mqkv_protocol::ErrorKind;

use crate::machine::footprint;
use crate::{ChangeEvent, StateMachine, StoreConfig};

impl StateMachine {
    /// Would storing `key = value` stay within the quotas? `replaced` is
    /// the footprint of the live record the write replaces, `None` for a
    /// new key.
    pub(crate) fn check_quota(
        &self,
        key: &[u8],
        value: &[u8],
        replaced: Option<u64>,
    ) -> Result<(), ErrorKind> {
        if replaced.is_none() {
            if let Some(max_keys) = self.config.max_keys {
                if self.keys.len() as u64 >= max_keys {
                    return Err(ErrorKind::QuotaExceeded);
                }
            }
        }
        if !bytes_within(
            &self.config,
            self.stored_bytes,
            replaced.unwrap_or(0),
            footprint(key, value),
        ) {
            return Err(ErrorKind::QuotaExceeded);
        }
        Ok(())
    }

    /// Like [`StateMachine::check_quota`], but keys already past their
    /// deadline are absent for every command, so they must not be what
    /// refuses a write: remove them (reporting each deletion) and retry.
    /// The record `replaced` describes is live at `now`, so it is not one
    /// of them.
    pub(crate) fn check_quota_making_room(
        &mut self,
        key: &[u8],
        value: &[u8],
        replaced: Option<u64>,
        now: u64,
        events: &mut Vec<ChangeEvent>,
    ) -> Result<(), ErrorKind> {
        let first = self.check_quota(key, value, replaced);
        if first.is_err() && self.next_expiry_ms().is_some_and(|d| d <= now) {
            self.expire_due_into(now, events);
            return self.check_quota(key, value, replaced);
        }
        first
    }
}

/// Does the byte quota allow `stored` bytes to become `stored - replaced + added`? Growing
/// past the limit is refused; anything that does not grow usage is allowed, even above it.
pub(crate) fn bytes_within(config: &StoreConfig, stored: u64, replaced: u64, added: u64) -> bool {
    let Some(max_bytes) = config.max_bytes else {
        return true;
    };
    let after = stored - replaced + added;
    after <= max_bytes || after <= stored
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::{ChangeKind, StateMachine, StoreConfig};
    use mqkv_protocol::{ErrorKind, Response};

    fn limited(max_keys: Option<u64>, max_bytes: Option<u64>) -> StateMachine {
        StateMachine::new(StoreConfig {
            max_keys,
            max_bytes,
            ..StoreConfig::new("srv")
        })
    }

    #[test]
    fn key_count_quota() {
        let mut m = limited(Some(2), None);
        put(&mut m, 1, "a", "1");
        put(&mut m, 2, "b", "2");
        let refused = m.apply(&entry(3, set_cmd("c", "3", None, None), None));
        assert_eq!(refused.response, Response::Error(ErrorKind::QuotaExceeded));
        assert!(refused.events.is_empty());
        assert_eq!(refused.version, None);
        assert_eq!(m.len(), 2);
        assert_eq!(m.get(b"c", 3), None);
        // Overwriting an existing key is fine.
        put(&mut m, 4, "a", "updated");
        // Deleting frees a slot.
        m.apply(&entry(5, mqkv_protocol::Command::Del { key: b("b") }, None));
        put(&mut m, 6, "c", "3");
    }

    #[test]
    fn byte_quota_counts_keys_and_values() {
        let mut m = limited(None, Some(10));
        put(&mut m, 1, "ab", "cdef"); // 6
        let refused = m.apply(&entry(2, set_cmd("x", "12345", None, None), None)); // +6 = 12
        assert_eq!(refused.response, Response::Error(ErrorKind::QuotaExceeded));
        assert_eq!(m.stored_bytes(), 6);
        put(&mut m, 3, "x", "123"); // 10, exactly the limit
        assert_eq!(m.stored_bytes(), 10);
        // Growing an existing key past the limit is refused...
        let grow = m.apply(&entry(4, set_cmd("ab", "cdefg", None, None), None));
        assert_eq!(grow.response, Response::Error(ErrorKind::QuotaExceeded));
        assert_eq!(m.get(b"ab", 4).unwrap().0, b("cdef"));
        // ...shrinking or keeping the size is allowed.
        put(&mut m, 5, "ab", "wxyz");
        put(&mut m, 6, "ab", "");
        assert_eq!(m.stored_bytes(), 6);
    }

    #[test]
    fn lowered_quota_still_allows_shrinking_writes() {
        let mut m = limited(None, Some(100));
        put(&mut m, 1, "k", "0123456789");
        m.config.max_bytes = Some(5);
        put(&mut m, 2, "k", "0123");
        let grow = m.apply(&entry(3, set_cmd("k", "012345678", None, None), None));
        assert_eq!(grow.response, Response::Error(ErrorKind::QuotaExceeded));
    }

    #[test]
    fn expired_keys_make_room_and_are_reported() {
        let mut m = limited(Some(1), None);
        m.apply(&entry(1, set_cmd("old", "v", None, Some(10)), None));
        // At 11 "old" is past its deadline but no ExpireDue ran yet.
        let applied = m.apply(&entry(11, set_cmd("new", "v", None, None), None));
        assert_eq!(applied.response, Response::Ok);
        assert_eq!(applied.events.len(), 2);
        assert_eq!(applied.events[0].key, b("old"));
        assert_eq!(applied.events[0].kind, ChangeKind::Delete);
        assert_eq!(applied.events[1].key, b("new"));
        assert_eq!(m.len(), 1);
    }
}
