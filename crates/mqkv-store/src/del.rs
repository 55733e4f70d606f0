//! `DEL key [IFVER version]`.
//!
//! Invariant: deleting a live key answers `:1` with a fresh version (the
//! `__ts` of the response and of the DELETE event) and discards the key's
//! fencing token; a fenced key is only deleted with a token `>=` its own.
//! An absent key answers `:0`, whatever the token, and emits nothing. With
//! `IFVER` (an extension), a key whose version differs is kept and the answer
//! is `:-1` with its version, as a refused NX SET answers.

use bytes::Bytes;
use mqkv_protocol::{Hlc, Response};

use crate::{fencing, Applied, Request, StateMachine};

impl StateMachine {
    pub(crate) fn apply_del(
        &mut self,
        request: &Request,
        key: &Bytes,
        if_version: Option<&Hlc>,
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
        if let Err(kind) = fencing::check(record.fencing_token.as_deref(), request.ft.as_ref()) {
            return Applied {
                response: Response::Error(kind),
                version: None,
                events,
                created: false,
            };
        }
        if if_version.is_some_and(|v| *v != record.version) {
            return Applied {
                response: Response::NotApplied,
                version: Some(record.version.clone()),
                events,
                created: false,
            };
        }
        let version = self.delete_with_event(key, now, request.ts.as_ref(), &mut events);
        Applied {
            response: Response::Integer(1),
            version,
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

    fn del(key: &str) -> Command {
        Command::Del { key: b(key) }
    }

    #[test]
    fn deletes_and_reports() {
        let mut m = machine();
        let set_version = put(&mut m, 100, "k", "v");
        let applied = m.apply(&entry(200, del("k"), None));
        assert_eq!(applied.response, Response::Integer(1));
        let version = applied.version.clone().expect("deletion version");
        assert!(version > set_version);
        assert_eq!(applied.events.len(), 1);
        assert_eq!(applied.events[0].kind, ChangeKind::Delete);
        assert_eq!(applied.events[0].version, version);
        assert!(m.is_empty());
        assert_eq!(m.stored_bytes(), 0);
    }

    #[test]
    fn absent_key_is_zero_without_version_or_event() {
        let mut m = machine();
        assert_eq!(
            m.apply(&entry(1, del("k"), None)),
            Applied::reply(Response::Integer(0), None)
        );
        assert_eq!(
            m.clock().current(),
            Hlc::new(0, 0, "srv"),
            "no version issued"
        );
        // A token on an absent key changes nothing either.
        assert_eq!(
            m.apply(&entry(1, del("k"), Some(Hlc::new(0, 0, "x")))),
            Applied::reply(Response::Integer(0), None)
        );
    }

    #[test]
    fn fenced_key_needs_a_sufficient_token() {
        let mut m = machine();
        let token = Hlc::new(50, 0, "srv");
        m.apply(&entry(
            100,
            set_cmd("k", "v", None, None),
            Some(token.clone()),
        ));
        assert_eq!(
            m.apply(&entry(101, del("k"), None)),
            Applied::error(ErrorKind::MissingFencingToken)
        );
        assert_eq!(
            m.apply(&entry(101, del("k"), Some(Hlc::new(49, 9, "srv")))),
            Applied::error(ErrorKind::FencingTokenLowerVersion)
        );
        assert_eq!(m.len(), 1);
        assert_eq!(
            m.apply(&entry(102, del("k"), Some(token))).response,
            Response::Integer(1)
        );
        // The token went with the key.
        put(&mut m, 103, "k", "again");
        assert_eq!(m.fencing_token(b"k", 103), None);
    }

    #[test]
    fn deletion_version_exceeds_request_timestamp() {
        let mut m = machine();
        put(&mut m, 100, "k", "v");
        let mut e = entry(100, del("k"), None);
        if let crate::Op::Request(r) = &mut e.op {
            r.ts = Some(Hlc::new(5_000, 3, "client"));
        }
        let version = m.apply(&e).version.unwrap();
        assert!(version > Hlc::new(5_000, 3, "client"));
    }

    #[test]
    fn deadline_index_is_cleared() {
        let mut m = machine();
        m.apply(&entry(1, set_cmd("k", "v", None, Some(100)), None));
        m.apply(&entry(2, del("k"), None));
        assert_eq!(m.next_expiry_ms(), None);
        assert_indexes_consistent(&m);
    }
}
