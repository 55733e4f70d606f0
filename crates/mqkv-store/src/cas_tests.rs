//! The extensions beside the AIO commands: compare-and-set (`SET … IFVER v`, `DEL … IFVER v`)
//! and MGET, on the state machine.

use crate::machine::test_support::*;
use bytes::Bytes;
use mqkv_protocol::{Command, ErrorKind, Response, SetCondition};

fn del_if(key: &str, version: &mqkv_protocol::Hlc) -> Command {
    Command::DelIfVersion {
        key: b(key),
        version: version.clone(),
    }
}

#[test]
fn a_set_applies_only_at_the_version_named() {
    let mut m = machine();
    let v1 = put(&mut m, 1_000, "k", "a");
    let cas = |v: &mqkv_protocol::Hlc| Some(SetCondition::IfVersion(v.clone()));
    let applied = m.apply(&entry(2_000, set_cmd("k", "b", cas(&v1), None), None));
    assert_eq!(applied.response, Response::Ok);
    let v2 = applied.version.expect("new version");
    assert!(v2 > v1);
    // A writer that read v1 loses: not applied, told the current version, nothing changed.
    let stale = m.apply(&entry(3_000, set_cmd("k", "c", cas(&v1), None), None));
    assert_eq!(stale.response, Response::NotApplied);
    assert_eq!(stale.version, Some(v2.clone()));
    assert!(stale.events.is_empty());
    assert_eq!(m.get(b"k", 3_000).map(|(v, _)| v), Some(b("b")));
    // A missing key is never at a version.
    let missing = m.apply(&entry(3_000, set_cmd("nope", "x", cas(&v2), None), None));
    assert_eq!(
        (missing.response, missing.version),
        (Response::NotApplied, None)
    );
    assert!(m.get(b"nope", 3_000).is_none());
}

#[test]
fn a_compare_and_set_keeps_fencing() {
    let mut m = machine();
    let token = ts(500).expect("token");
    let v1 = m
        .apply(&entry(
            1_000,
            set_cmd("k", "a", None, None),
            Some(token.clone()),
        ))
        .version
        .expect("version");
    let cas = Some(SetCondition::IfVersion(v1));
    // Right version, no token on a fenced key: the fencing check comes first.
    let refused = m.apply(&entry(2_000, set_cmd("k", "b", cas.clone(), None), None));
    assert_eq!(
        refused.response,
        Response::Error(ErrorKind::MissingFencingToken)
    );
    let applied = m.apply(&entry(2_000, set_cmd("k", "b", cas, None), Some(token)));
    assert_eq!(applied.response, Response::Ok);
}

#[test]
fn a_delete_applies_only_at_the_version_named() {
    let mut m = machine();
    let v1 = put(&mut m, 1_000, "k", "a");
    let v2 = put(&mut m, 2_000, "k", "b");
    let stale = m.apply(&entry(3_000, del_if("k", &v1), None));
    assert_eq!(
        (stale.response, stale.version),
        (Response::NotApplied, Some(v2.clone()))
    );
    assert!(m.get(b"k", 3_000).is_some());
    let deleted = m.apply(&entry(3_000, del_if("k", &v2), None));
    assert_eq!(deleted.response, Response::Integer(1));
    assert!(m.get(b"k", 3_000).is_none());
    let gone = m.apply(&entry(4_000, del_if("k", &v2), None));
    assert_eq!(gone.response, Response::Integer(0));
}

#[test]
fn mget_reads_every_key_at_once() {
    let mut m = machine();
    let va = put(&mut m, 1_000, "a", "1");
    m.apply(&entry(1_000, set_cmd("short", "x", None, Some(5)), None));
    let vc = put(&mut m, 1_000, "c", "3");
    let keys: Vec<Bytes> = ["a", "missing", "short", "c"].into_iter().map(b).collect();
    assert_eq!(
        m.mget(&keys, 2_000),
        Response::Values(vec![Some((b("1"), va)), None, None, Some((b("3"), vc))])
    );
    let applied = m.apply(&entry(2_000, Command::MGet { keys }, None));
    assert!(matches!(applied.response, Response::Values(ref v) if v.len() == 4));
}
