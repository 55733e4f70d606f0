//! `GET key`.
//!
//! Invariant: a hit returns the value with the version of the SET that
//! stored it (unchanged by reads); a miss — including a key past its
//! deadline — returns nothing, so the server sends `$-1` with no `__ts`
//! (Go decides "exists" from the presence of `__ts`).

use bytes::Bytes;
use mqkv_protocol::Hlc;

use crate::StateMachine;

impl StateMachine {
    /// The value and version of a live key. Pure: expired keys are skipped,
    /// not removed.
    pub fn get(&self, key: &[u8], now_ms: u64) -> Option<(Bytes, Hlc)> {
        self.get_with(key, now_ms, |value, version| {
            (Bytes::copy_from_slice(value), version.clone())
        })
    }

    /// [`StateMachine::get`] without copying the value: `read` sees the
    /// stored value and version of a live key.
    pub fn get_with<R>(
        &self,
        key: &[u8],
        now_ms: u64,
        read: impl FnOnce(&[u8], &Hlc) -> R,
    ) -> Option<R> {
        self.live(key, now_ms)
            .map(|record| read(&record.value, &record.version))
    }

    /// MGET (an extension): the value and version of each live key, at one moment.
    pub fn mget(&self, keys: &[Bytes], now_ms: u64) -> mqkv_protocol::Response {
        mqkv_protocol::Response::Values(keys.iter().map(|k| self.get(k, now_ms)).collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::Applied;
    use mqkv_protocol::{Command, Response};

    #[test]
    fn hit_returns_value_and_set_version() {
        let mut m = machine();
        let version = put(&mut m, 100, "k", "1234");
        assert_eq!(m.get(b"k", 200), Some((b("1234"), version.clone())));
        // Reading through the log gives the same answer and changes nothing.
        let before = m.clone();
        let applied = m.apply(&entry(300, Command::Get { key: b("k") }, None));
        assert_eq!(
            applied,
            Applied::reply(Response::Value(b("1234")), Some(version))
        );
        assert_eq!(m, before);
    }

    #[test]
    fn miss_has_no_version() {
        let mut m = machine();
        assert_eq!(m.get(b"nokey", 1), None);
        let applied = m.apply(&entry(1, Command::Get { key: b("nokey") }, None));
        assert_eq!(applied, Applied::reply(Response::Nil, None));
    }

    #[test]
    fn expired_key_is_a_miss_before_and_after_removal() {
        let mut m = machine();
        m.apply(&entry(10, set_cmd("k", "v", None, Some(5)), None));
        assert!(m.get(b"k", 14).is_some());
        assert_eq!(m.get(b"k", 15), None);
        let applied = m.apply(&entry(15, Command::Get { key: b("k") }, None));
        assert_eq!(applied, Applied::reply(Response::Nil, None));
    }

    #[test]
    fn binary_keys() {
        let mut m = machine();
        let key = bytes::Bytes::from_static(b"\x00\r\n\xff");
        let applied = m.apply(&entry(
            1,
            Command::Set {
                key: key.clone(),
                value: b("v"),
                condition: None,
                px_ms: None,
            },
            None,
        ));
        assert_eq!(applied.response, Response::Ok);
        assert_eq!(m.get(&key, 1).unwrap().0, b("v"));
        assert_eq!(m.get(b"\x00\r\n", 1), None);
    }
}
