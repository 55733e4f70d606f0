//! `SET key value [NX|NEX] [PX ms]`.
//!
//! Invariants:
//! - checks run in this order: fencing, condition, quota; a refused SET
//!   stores nothing and issues no version;
//! - an applied SET gets a fresh version strictly greater than the request
//!   `__ts` and than every earlier version, emits one SET event with that
//!   version, and answers `+OK` with it;
//! - a SET refused by its condition answers `:-1` with the stored version
//!   (.NET throws without it; Go documents it);
//! - the deadline is `now + PX`; a SET without PX clears any earlier
//!   deadline, as in Redis — so an NEX renewal must repeat its PX to keep
//!   the key expiring, which is what every lease helper does.

use std::num::NonZeroU64;
use std::sync::Arc;

use bytes::Bytes;
use mqkv_protocol::{ErrorKind, Hlc, Response, SetCondition};

use crate::machine::{footprint, overwrite, Record};
use crate::{fencing, Applied, ChangeEvent, ChangeKind, Request, StateMachine};

/// The arguments of one SET, borrowed from its command.
pub(crate) struct SetArgs<'a> {
    pub(crate) key: &'a Bytes,
    pub(crate) value: &'a Bytes,
    pub(crate) condition: Option<&'a SetCondition>,
    pub(crate) px_ms: Option<u64>,
}

impl StateMachine {
    pub(crate) fn apply_set(&mut self, request: &Request, set: &SetArgs<'_>, now: u64) -> Applied {
        // A SET reports one event, or two when it first purges its own expired key.
        let mut events = Vec::with_capacity(1);
        let (response, version, created) = match self.try_set(request, set, now, &mut events) {
            Ok(answer) => answer,
            Err(kind) => (Response::Error(kind), None, false),
        };
        Applied {
            response,
            version,
            events,
            created,
        }
    }

    fn try_set(
        &mut self,
        request: &Request,
        set: &SetArgs<'_>,
        now: u64,
        events: &mut Vec<ChangeEvent>,
    ) -> Result<(Response, Option<Hlc>, bool), ErrorKind> {
        let SetArgs {
            key,
            value,
            condition,
            px_ms,
        } = *set;
        // The common SET, of a live key within the quota, walks the key tree once: the record
        // is checked and replaced through the one reference. Anything else (a new key, an
        // expired one, a quota that only expiring other keys could make room in) goes the
        // general way below, nothing changed yet.
        {
            let StateMachine {
                config,
                clock,
                keys,
                expiry,
                stored_bytes,
                frozen,
                ..
            } = &mut *self;
            if let Some(old) = keys.get_mut(&key[..]).filter(|r| r.is_live(now)) {
                let stored_token = old.fencing_token.as_deref();
                fencing::check(stored_token, request.ft.as_ref())?;
                if let Some((refused, stored)) = refusal(old, condition, value) {
                    return Ok((refused, stored, false));
                }
                let replaced = footprint(key, &old.value);
                if crate::quota::bytes_within(
                    config,
                    *stored_bytes,
                    replaced,
                    footprint(key, value),
                ) {
                    let fencing_token = fencing::after_set(stored_token, request.ft.as_ref());
                    let version =
                        clock.next_version_after(now, request.ts.as_ref(), Some(&old.version));
                    let record = new_record(value, &version, fencing_token, px_ms, now);
                    overwrite(key, old, record, expiry, frozen, stored_bytes);
                    events.push(set_event(key, value, &version));
                    return Ok((Response::Ok, Some(version), false));
                }
            }
        }
        // One walk of the key tree serves the checks below. A record past
        // its deadline is absent for every command: it is purged (reporting
        // the deletion) and the key treated as free.
        let mut existing = self.keys.get(&key[..]);
        if existing.is_some_and(|r| !r.is_live(now)) {
            self.delete_with_event(key, now, None, events);
            existing = None;
        }
        // A compare-and-set needs the key to be there.
        if existing.is_none() && matches!(condition, Some(SetCondition::IfVersion(_))) {
            return Ok((Response::NotApplied, None, false));
        }
        let stored_token = existing.and_then(|r| r.fencing_token.as_deref());
        fencing::check(stored_token, request.ft.as_ref())?;
        if let Some((refused, stored)) = existing.and_then(|r| refusal(r, condition, value)) {
            return Ok((refused, stored, false));
        }
        let created = existing.is_none();

        let fencing_token = fencing::after_set(stored_token, request.ft.as_ref());
        let replaced = existing.map(|r| footprint(key, &r.value));
        let previous = existing.map(|r| r.version.clone());
        self.check_quota_making_room(key, value, replaced, now, events)?;

        let version = self
            .clock
            .next_version_after(now, request.ts.as_ref(), previous.as_ref());
        self.insert(key, new_record(value, &version, fencing_token, px_ms, now));
        events.push(set_event(key, value, &version));
        Ok((Response::Ok, Some(version), created))
    }
}

/// The answer of a SET its condition refuses on the live record `existing`, if it does.
fn refusal(
    existing: &Record,
    condition: Option<&SetCondition>,
    value: &[u8],
) -> Option<(Response, Option<Hlc>)> {
    let refused = match condition {
        Some(SetCondition::Nx) => true,
        Some(SetCondition::Nex) => *existing.value != *value,
        Some(SetCondition::IfVersion(version)) => existing.version != *version,
        None => false,
    };
    refused.then(|| (Response::NotApplied, Some(existing.version.clone())))
}

fn new_record(
    value: &[u8],
    version: &Hlc,
    fencing_token: Option<Hlc>,
    px_ms: Option<u64>,
    now: u64,
) -> Record {
    Record {
        value: Arc::from(value),
        version: version.clone(),
        fencing_token: fencing_token.map(Box::new),
        // PX is at least 1, so a deadline is never 0.
        expires_at_ms: px_ms.and_then(|px| NonZeroU64::new(now.saturating_add(px))),
    }
}

fn set_event(key: &Bytes, value: &Bytes, version: &Hlc) -> ChangeEvent {
    ChangeEvent {
        key: key.clone(),
        kind: ChangeKind::Set {
            value: value.clone(),
        },
        version: version.clone(),
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::{Applied, ChangeKind, StateMachine};
    use mqkv_protocol::{ErrorKind, Hlc, Response, SetCondition};

    /// A lease renewed while other keys are written in the same millisecond keeps counter 0
    /// (the official SDK's auto-renewal test asserts equal counters); a lease taken anew after
    /// it was deleted gets a version above the deletion's, so an old holder's token is lower.
    #[test]
    fn a_keys_counter_moves_only_for_its_own_writes() {
        let mut m = machine();
        let v1 = m.apply(&entry(
            1_000,
            set_cmd("lease", "me", None, Some(10_000)),
            None,
        ));
        let v1 = v1.version.expect("a version");
        for i in 0..10 {
            put(&mut m, 2_000, &format!("other{i}"), "x");
        }
        let v2 = m
            .apply(&entry(
                2_000,
                set_cmd("lease", "me", None, Some(10_000)),
                None,
            ))
            .version
            .expect("a version");
        assert_eq!(v2.counter, 0, "{v2}");
        assert!(v2 > v1);
        let del = m.apply(&entry(
            2_000,
            mqkv_protocol::Command::Del { key: b("lease") },
            None,
        ));
        let deleted = del.events[0].version.clone();
        assert!(deleted > v2);
        let v3 = m
            .apply(&entry(
                2_000,
                set_cmd("lease", "you", Some(SetCondition::Nx), None),
                None,
            ))
            .version
            .expect("a version");
        assert!(v3 > deleted && v3 > v2, "{v3} after {deleted}");
    }

    fn set_at(
        m: &mut StateMachine,
        now: u64,
        key: &str,
        value: &str,
        c: Option<SetCondition>,
        px: Option<u64>,
        ft: Option<Hlc>,
    ) -> Applied {
        m.apply(&entry(now, set_cmd(key, value, c, px), ft))
    }

    #[test]
    fn set_stores_and_versions() {
        let mut m = machine();
        let applied = set_at(&mut m, 1_000, "k", "v", None, None, None);
        assert_eq!(applied.response, Response::Ok);
        // The request __ts is the same millisecond: bumped past it.
        let v = Hlc::new(1_001, 0, "srv");
        assert_eq!(applied.version, Some(v.clone()));
        assert_eq!(applied.events.len(), 1);
        assert_eq!(applied.events[0].key, b("k"));
        assert_eq!(applied.events[0].kind, ChangeKind::Set { value: b("v") });
        assert_eq!(applied.events[0].version, v);
        assert_eq!(m.get(b"k", 1_000), Some((b("v"), v)));
        assert_eq!(m.stored_bytes(), 2);
    }

    /// A SET creates its key when it was absent or past its deadline, and only when applied.
    #[test]
    fn created_only_when_the_key_was_not_there() {
        let mut m = machine();
        assert!(set_at(&mut m, 1_000, "k", "v", None, Some(50), None).created);
        assert!(!set_at(&mut m, 1_010, "k", "w", None, Some(50), None).created);
        assert!(!set_at(&mut m, 1_020, "k", "w", Some(SetCondition::Nx), None, None).created);
        // Past its deadline the key is gone: the next SET creates it again.
        assert!(set_at(&mut m, 2_000, "k", "x", None, None, None).created);
        assert!(!set_at(&mut m, 2_001, "k", "y", None, None, None).created);
    }

    #[test]
    fn sequential_sets_keep_counter_zero_and_node_id() {
        let mut m = machine();
        let a = put(&mut m, 1_000, "lease", "me");
        let b2 = put(&mut m, 3_000, "lease", "me");
        assert_eq!(a.counter, 0);
        assert_eq!(b2.counter, 0);
        assert_eq!(a.node_id, b2.node_id);
        assert!(b2 > a);
    }

    #[test]
    fn overwrite_replaces_value_and_bytes() {
        let mut m = machine();
        put(&mut m, 1, "k", "long value");
        put(&mut m, 2, "k", "s");
        assert_eq!(m.get(b"k", 2).unwrap().0, b("s"));
        assert_eq!(m.stored_bytes(), 2);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn nx_refuses_existing_key_with_stored_version() {
        let mut m = machine();
        let stored = put(&mut m, 10, "k", "v");
        let applied = set_at(&mut m, 20, "k", "w", Some(SetCondition::Nx), None, None);
        assert_eq!(
            applied,
            Applied::reply(Response::NotApplied, Some(stored.clone()))
        );
        assert_eq!(m.get(b"k", 20), Some((b("v"), stored)));
        let applied = set_at(&mut m, 20, "new", "w", Some(SetCondition::Nx), None, None);
        assert_eq!(applied.response, Response::Ok);
    }

    #[test]
    fn nex_sets_if_absent_or_equal() {
        let mut m = machine();
        let a = set_at(
            &mut m,
            10,
            "lock",
            "me",
            Some(SetCondition::Nex),
            Some(100),
            None,
        );
        assert_eq!(a.response, Response::Ok);
        // Renewal by the holder: applied, new version, new deadline, event.
        let renew = set_at(
            &mut m,
            50,
            "lock",
            "me",
            Some(SetCondition::Nex),
            Some(100),
            None,
        );
        assert_eq!(renew.response, Response::Ok);
        assert!(renew.version > a.version);
        assert_eq!(renew.events.len(), 1);
        assert_eq!(m.expires_at_ms(b"lock", 50), Some(150));
        // Someone else: refused with the holder's version.
        let other = set_at(
            &mut m,
            60,
            "lock",
            "you",
            Some(SetCondition::Nex),
            Some(100),
            None,
        );
        assert_eq!(
            other,
            Applied::reply(Response::NotApplied, renew.version.clone())
        );
        assert_eq!(m.get(b"lock", 60).unwrap().0, b("me"));
    }

    #[test]
    fn px_sets_deadline_and_plain_set_clears_it() {
        let mut m = machine();
        set_at(&mut m, 1_000, "k", "v", None, Some(500), None);
        assert_eq!(m.expires_at_ms(b"k", 1_000), Some(1_500));
        assert_eq!(m.next_expiry_ms(), Some(1_500));
        put(&mut m, 1_200, "k", "v2");
        assert_eq!(m.expires_at_ms(b"k", 1_200), None);
        assert_eq!(m.next_expiry_ms(), None);
        assert_eq!(m.get(b"k", 10_000).unwrap().0, b("v2"));
    }

    #[test]
    fn huge_px_saturates() {
        let mut m = machine();
        set_at(&mut m, 1_000, "k", "v", None, Some(u64::MAX), None);
        assert_eq!(m.expires_at_ms(b"k", 1_000), Some(u64::MAX));
    }

    #[test]
    fn set_on_expired_key_reports_the_expiry_first() {
        let mut m = machine();
        set_at(&mut m, 1_000, "k", "old", None, Some(100), None);
        let applied = set_at(
            &mut m,
            1_100,
            "k",
            "new",
            Some(SetCondition::Nx),
            None,
            None,
        );
        assert_eq!(
            applied.response,
            Response::Ok,
            "an expired key is absent for NX"
        );
        assert_eq!(applied.events.len(), 2);
        assert_eq!(applied.events[0].kind, ChangeKind::Delete);
        assert_eq!(applied.events[1].kind, ChangeKind::Set { value: b("new") });
        assert!(applied.events[1].version > applied.events[0].version);
        assert_eq!(m.next_expiry_ms(), None);
    }

    #[test]
    fn fencing_on_set() {
        let mut m = machine();
        let token = Hlc::new(500, 0, "srv");
        // Absent key: the token is stored.
        let a = set_at(&mut m, 1_000, "p", "1", None, None, Some(token.clone()));
        assert_eq!(a.response, Response::Ok);
        assert_eq!(m.fencing_token(b"p", 1_000), Some(&token));
        // No token: refused.
        assert_eq!(
            set_at(&mut m, 1_001, "p", "2", None, None, None),
            Applied::error(ErrorKind::MissingFencingToken)
        );
        // Lower token (the .NET epoch token): refused.
        assert_eq!(
            set_at(
                &mut m,
                1_001,
                "p",
                "2",
                None,
                None,
                Some(Hlc::new(0, 0, "x"))
            ),
            Applied::error(ErrorKind::FencingTokenLowerVersion)
        );
        assert_eq!(m.get(b"p", 1_001).unwrap().0, b("1"));
        // Equal token: accepted, token unchanged.
        assert_eq!(
            set_at(&mut m, 1_002, "p", "3", None, None, Some(token.clone())).response,
            Response::Ok
        );
        assert_eq!(m.fencing_token(b"p", 1_002), Some(&token));
        // Higher token: accepted and stored.
        let higher = Hlc::new(900, 1, "srv");
        assert_eq!(
            set_at(&mut m, 1_003, "p", "4", None, None, Some(higher.clone())).response,
            Response::Ok
        );
        assert_eq!(m.fencing_token(b"p", 1_003), Some(&higher));
        // The old token no longer works.
        assert_eq!(
            set_at(&mut m, 1_004, "p", "5", None, None, Some(token)).response,
            Response::Error(ErrorKind::FencingTokenLowerVersion)
        );
    }

    #[test]
    fn set_with_token_fences_an_unfenced_existing_key() {
        let mut m = machine();
        put(&mut m, 1, "k", "v");
        let token = Hlc::new(2, 0, "srv");
        assert_eq!(
            set_at(&mut m, 3, "k", "w", None, None, Some(token.clone())).response,
            Response::Ok
        );
        assert_eq!(m.fencing_token(b"k", 3), Some(&token));
    }

    #[test]
    fn set_without_token_keeps_key_unfenced() {
        let mut m = machine();
        put(&mut m, 1, "k", "v");
        put(&mut m, 2, "k", "w");
        assert_eq!(m.fencing_token(b"k", 2), None);
    }

    #[test]
    fn fencing_is_checked_before_the_condition() {
        let mut m = machine();
        let token = Hlc::new(5, 0, "srv");
        set_at(&mut m, 10, "k", "v", None, None, Some(token));
        // NX on an existing fenced key without a token: the fencing error,
        // not :-1.
        assert_eq!(
            set_at(&mut m, 11, "k", "v", Some(SetCondition::Nx), None, None),
            Applied::error(ErrorKind::MissingFencingToken)
        );
    }

    #[test]
    fn version_exceeds_a_client_clock_ahead_of_the_server() {
        let mut m = machine();
        let mut e = entry(1_000, set_cmd("k", "v", None, None), None);
        if let crate::Op::Request(r) = &mut e.op {
            r.ts = Some(Hlc::new(30_000, 7, "client"));
        }
        let v = m.apply(&e).version.unwrap();
        assert_eq!(v, Hlc::new(30_001, 0, "srv"));
    }

    #[test]
    fn empty_value_is_stored() {
        let mut m = machine();
        put(&mut m, 1, "k", "");
        assert_eq!(m.get(b"k", 1).unwrap().0, b(""));
    }
}
