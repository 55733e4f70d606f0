//! `VDEL key value`: delete only if the stored value is `value`.
//!
//! Invariant: like DEL, but a live key with a different value is left
//! untouched and answers `:-1` (never the article's `-1`). Fencing is
//! checked before the value comparison, so a request without a valid
//! token learns nothing about the protected value.

use bytes::Bytes;
use mqkv_protocol::Response;

use crate::{fencing, Applied, Request, StateMachine};

impl StateMachine {
    pub(crate) fn apply_vdel(
        &mut self,
        request: &Request,
        key: &Bytes,
        value: &Bytes,
        now: u64,
    ) -> Applied {
        let mut events = Vec::new();
        self.purge_if_expired(key, now, &mut events);
        let Some(record) = self.keys.get(&key[..]) else {
            return Applied {
                response: Response::Integer(0),
                version: None,
                events,
                created: false,
            };
        };
        let response = if let Err(kind) =
            fencing::check(record.fencing_token.as_deref(), request.ft.as_ref())
        {
            Response::Error(kind)
        } else if *record.value != **value {
            Response::NotApplied
        } else {
            let version = self.delete_with_event(key, now, request.ts.as_ref(), &mut events);
            return Applied {
                response: Response::Integer(1),
                version,
                events,
                created: false,
            };
        };
        Applied {
            response,
            version: None,
            events,
            created: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::{Applied, ChangeKind};
    use mqkv_protocol::{Command, ErrorKind, Hlc, Response};

    fn vdel(key: &str, value: &str) -> Command {
        Command::VDel {
            key: b(key),
            value: b(value),
        }
    }

    #[test]
    fn matching_value_deletes() {
        let mut m = machine();
        let set_version = put(&mut m, 10, "lock", "holder");
        let applied = m.apply(&entry(20, vdel("lock", "holder"), None));
        assert_eq!(applied.response, Response::Integer(1));
        assert!(applied.version.clone().unwrap() > set_version);
        assert_eq!(applied.events.len(), 1);
        assert_eq!(applied.events[0].kind, ChangeKind::Delete);
        assert!(m.is_empty());
    }

    #[test]
    fn mismatch_is_not_applied_and_keeps_the_key() {
        let mut m = machine();
        put(&mut m, 10, "lock", "holder");
        let before = m.clone();
        assert_eq!(
            m.apply(&entry(20, vdel("lock", "other"), None)),
            Applied::reply(Response::NotApplied, None)
        );
        assert_eq!(m, before);
        assert_eq!(&Response::NotApplied.encode()[..], b":-1\r\n");
    }

    #[test]
    fn absent_key_is_zero() {
        let mut m = machine();
        assert_eq!(
            m.apply(&entry(1, vdel("k", "v"), None)),
            Applied::reply(Response::Integer(0), None)
        );
    }

    #[test]
    fn fencing_before_comparison() {
        let mut m = machine();
        let token = Hlc::new(5, 0, "srv");
        m.apply(&entry(
            10,
            set_cmd("k", "v", None, None),
            Some(token.clone()),
        ));
        // Wrong value and no token: the fencing error wins.
        assert_eq!(
            m.apply(&entry(11, vdel("k", "x"), None)),
            Applied::error(ErrorKind::MissingFencingToken)
        );
        assert_eq!(
            m.apply(&entry(11, vdel("k", "v"), Some(Hlc::new(4, 0, "srv")))),
            Applied::error(ErrorKind::FencingTokenLowerVersion)
        );
        // Valid token, wrong value: :-1 (Rust SDK test 22).
        assert_eq!(
            m.apply(&entry(11, vdel("k", "x"), Some(token.clone())))
                .response,
            Response::NotApplied
        );
        assert_eq!(
            m.apply(&entry(12, vdel("k", "v"), Some(token))).response,
            Response::Integer(1)
        );
        assert!(m.is_empty());
    }
}
