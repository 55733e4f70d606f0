//! Property tests of the state machine against random entry sequences,
//! using only the public API.

use std::collections::BTreeMap;

use bytes::Bytes;
use mqkv_protocol::{Command, ErrorKind, Hlc, Response, SetCondition};
use mqkv_store::{Applied, ChangeKind, DedupId, Entry, Op, Request, StateMachine, StoreConfig};
use proptest::prelude::*;

const KEYS: [&str; 4] = ["a", "b", "c", "lock"];
const VALUES: [&str; 4] = ["", "v1", "v2", "a-longer-value"];
const PATTERNS: [&str; 4] = ["*", "a*", "?", "[!a]*"];
const START_MS: u64 = 1_000_000;

/// One generated step; times are offsets from the entry's `now_ms`.
#[derive(Debug, Clone)]
struct Step {
    /// Milliseconds since the previous entry; negative values model a new
    /// leader whose clock is slightly behind.
    dt: i64,
    op: StepOp,
}

#[derive(Debug, Clone)]
enum StepOp {
    Request {
        command: Command,
        ts_offset: Option<i64>,
        ft: Option<(i64, u64)>,
        dedup: Option<(u8, u64)>,
    },
    ExpireDue,
}

fn bytes_of(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn arb_command() -> impl Strategy<Value = Command> {
    let key = proptest::sample::select(KEYS.to_vec()).prop_map(bytes_of);
    let value = proptest::sample::select(VALUES.to_vec()).prop_map(bytes_of);
    let condition =
        proptest::option::of(prop_oneof![Just(SetCondition::Nx), Just(SetCondition::Nex)]);
    let px = proptest::option::of(1u64..4_000);
    prop_oneof![
        4 => (key.clone(), value.clone(), condition, px).prop_map(|(key, value, condition, px_ms)| {
            Command::Set { key, value, condition, px_ms }
        }),
        1 => key.clone().prop_map(|key| Command::Del { key }),
        1 => (key.clone(), value).prop_map(|(key, value)| Command::VDel { key, value }),
        1 => key.prop_map(|key| Command::Get { key }),
        1 => proptest::sample::select(PATTERNS.to_vec())
            .prop_map(|p| Command::Scan { pattern: bytes_of(p), token: None }),
    ]
}

fn arb_step() -> impl Strategy<Value = Step> {
    let request = (
        arb_command(),
        // Mostly near the server clock, sometimes far ahead (skew), or absent.
        proptest::option::weighted(
            0.9,
            prop_oneof![8 => -5_000i64..1_000, 1 => 59_000i64..62_000],
        ),
        proptest::option::weighted(
            0.6,
            (
                prop_oneof![8 => -4_000i64..4_000, 1 => 60_001i64..61_000],
                0u64..3,
            ),
        ),
        proptest::option::weighted(0.3, (0u8..3, 0u64..5_000)),
    )
        .prop_map(|(command, ts_offset, ft, dedup)| StepOp::Request {
            command,
            ts_offset,
            ft,
            dedup,
        });
    let op = prop_oneof![6 => request, 1 => Just(StepOp::ExpireDue)];
    (prop_oneof![9 => 0i64..2_000, 1 => -500i64..0], op).prop_map(|(dt, op)| Step { dt, op })
}

fn offset(now: u64, by: i64) -> u64 {
    now.saturating_add_signed(by)
}

fn to_entries(steps: &[Step]) -> Vec<Entry> {
    let mut now = START_MS;
    steps
        .iter()
        .map(|step| {
            now = offset(now, step.dt);
            let op = match &step.op {
                StepOp::ExpireDue => Op::ExpireDue,
                StepOp::Request {
                    command,
                    ts_offset,
                    ft,
                    dedup,
                } => Op::Request(Request {
                    command: command.clone(),
                    ts: ts_offset.map(|o| Hlc::new(offset(now, o), 0, "client")),
                    ft: ft.map(|(o, counter)| Hlc::new(offset(now, o), counter, "srv")),
                    dedup: dedup.map(|(corr, ttl)| DedupId {
                        client_id: "client".into(),
                        correlation: Bytes::from(vec![corr]),
                        expires_at_ms: now + ttl,
                    }),
                }),
            };
            Entry { now_ms: now, op }
        })
        .collect()
}

fn arb_entries() -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec(arb_step(), 1..80).prop_map(|steps| to_entries(&steps))
}

fn fresh() -> StateMachine {
    StateMachine::new(StoreConfig {
        scan_page_size: 2,
        ..StoreConfig::new("srv")
    })
}

fn snapshot(m: &StateMachine) -> Vec<u8> {
    postcard::to_allocvec(m).expect("serializable")
}

fn restore(bytes: &[u8]) -> StateMachine {
    postcard::from_bytes(bytes).expect("deserializable")
}

fn scan_all(m: &StateMachine, pattern: &[u8], now: u64) -> Vec<Bytes> {
    let mut all = Vec::new();
    let mut token: Option<Bytes> = None;
    for _ in 0..1_000 {
        match m.scan(pattern, token.as_deref(), now) {
            Response::ScanPage { keys, token: next } => {
                all.extend(keys);
                match next {
                    Some(next) => token = Some(next),
                    None => return all,
                }
            }
            other => panic!("scan answered {other:?}"),
        }
    }
    panic!("scan did not finish");
}

/// What the key space should be, rebuilt only from commands and events.
#[derive(Default)]
struct Model {
    keys: BTreeMap<Bytes, (Bytes, Option<u64>)>,
}

impl Model {
    fn observe(&mut self, entry: &Entry, applied: &Applied) {
        for event in &applied.events {
            match &event.kind {
                ChangeKind::Delete => {
                    self.keys.remove(&event.key);
                }
                ChangeKind::Set { value } => {
                    // Only a SET of this very key produces a SET event.
                    let Op::Request(Request {
                        command: Command::Set { key, px_ms, .. },
                        ..
                    }) = &entry.op
                    else {
                        panic!("SET event from {entry:?}");
                    };
                    assert_eq!(key, &event.key);
                    let deadline = px_ms.map(|px| entry.now_ms.saturating_add(px));
                    self.keys.insert(key.clone(), (value.clone(), deadline));
                }
            }
        }
    }

    fn live_at(&self, now: u64) -> impl Iterator<Item = (&Bytes, &Bytes)> {
        self.keys
            .iter()
            .filter(move |(_, (_, deadline))| deadline.is_none_or(|d| d > now))
            .map(|(k, (v, _))| (k, v))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every version a key gets (in SET and DELETE events, and in the
    /// responses that carry a new version) is strictly greater than the
    /// previous one and than the request's `__ts`.
    #[test]
    fn versions_strictly_increase_per_key(entries in arb_entries()) {
        let mut m = fresh();
        let mut last: BTreeMap<Bytes, Hlc> = BTreeMap::new();
        for entry in &entries {
            let applied = m.apply(entry);
            for event in &applied.events {
                if let Some(previous) = last.get(&event.key) {
                    prop_assert!(event.version > *previous, "{} after {}", event.version, previous);
                }
                prop_assert_eq!(&*event.version.node_id, "srv");
                last.insert(event.key.clone(), event.version.clone());
            }
            if let Op::Request(request) = &entry.op {
                // A replayed answer (de-duplication) has no events and may
                // belong to a request with another `__ts`: skip those.
                let fresh_version = matches!(applied.response, Response::Ok | Response::Integer(1))
                    && applied.events.iter().any(|e| e.key == *request.command.key());
                if fresh_version && request.command.is_write() {
                    let version = applied.version.clone().expect("new version on the response");
                    if let Some(ts) = &request.ts {
                        prop_assert!(version > *ts);
                    }
                    // The response carries the version of the command's own event.
                    if let Some(own) = applied.events.iter().rev().find(|e| e.key == *request.command.key()) {
                        prop_assert_eq!(&own.version, &version);
                    }
                }
            }
        }
    }

    /// A fenced key is never changed by a write without a token at least as
    /// high as its own, and its token never goes down while it lives.
    #[test]
    fn fenced_key_never_accepts_a_lower_token(entries in arb_entries()) {
        let mut m = fresh();
        for entry in &entries {
            let now = entry.now_ms;
            let Op::Request(request) = &entry.op else {
                m.apply(entry);
                continue;
            };
            let key = request.command.key().clone();
            let stored = m.fencing_token(&key, now).cloned();
            let before = m.get(&key, now);
            let applied = m.apply(entry);
            let Some(stored) = stored else { continue };
            if request.command.is_write() && request.ft.as_ref().is_none_or(|ft| *ft < stored) {
                prop_assert_eq!(m.get(&key, now), before);
                prop_assert_eq!(m.fencing_token(&key, now), Some(&stored));
                prop_assert!(applied.events.iter().all(|e| e.key != key));
                if let Response::Error(kind) = applied.response {
                    prop_assert!(matches!(
                        kind,
                        ErrorKind::MissingFencingToken
                            | ErrorKind::FencingTokenLowerVersion
                            | ErrorKind::TimestampSkew
                            | ErrorKind::FencingTokenSkew
                            | ErrorKind::MissingTimestamp
                    ), "{:?}", kind);
                }
            }
            if let Some(token) = m.fencing_token(&key, now) {
                prop_assert!(*token >= stored);
            }
        }
    }

    /// GET and SCAN agree with a model rebuilt from events alone, at the
    /// entry's time and later: a key past its deadline is never returned.
    #[test]
    fn expired_keys_are_never_returned(entries in arb_entries()) {
        let mut m = fresh();
        let mut model = Model::default();
        for entry in &entries {
            let applied = m.apply(entry);
            model.observe(entry, &applied);
            let now = entry.now_ms;
            let mut probes = vec![now, now + 1, now + 2_000, now + 10_000];
            probes.extend(model.keys.values().filter_map(|(_, d)| *d).flat_map(|d| [d.saturating_sub(1), d]));
            for t in probes.into_iter().filter(|&t| t >= now) {
                for key in KEYS {
                    let expected = model.live_at(t).find(|(k, _)| k.as_ref() == key.as_bytes()).map(|(_, v)| v.clone());
                    prop_assert_eq!(m.get(key.as_bytes(), t).map(|(v, _)| v), expected, "key {} at {}", key, t);
                }
                let listed = scan_all(&m, b"*", t);
                let expected: Vec<Bytes> = model.live_at(t).map(|(k, _)| k.clone()).collect();
                prop_assert_eq!(listed, expected, "scan at {}", t);
            }
        }
    }

    /// Serializing and restoring at any point gives a machine that answers
    /// every later entry exactly as the original does.
    #[test]
    fn snapshot_round_trip_behaves_identically(entries in arb_entries(), split in any::<proptest::sample::Index>()) {
        let split = split.index(entries.len() + 1);
        let mut original = fresh();
        for entry in &entries[..split] {
            original.apply(entry);
        }
        let bytes = snapshot(&original);
        let mut restored = restore(&bytes);
        prop_assert_eq!(&restored, &original);
        prop_assert_eq!(snapshot(&restored), bytes);
        for entry in &entries[split..] {
            prop_assert_eq!(original.apply(entry), restored.apply(entry));
            prop_assert_eq!(original.next_expiry_ms(), restored.next_expiry_ms());
        }
        prop_assert_eq!(&original, &restored);
    }

    /// Two fresh machines fed the same entries end up identical, answering
    /// identically along the way.
    #[test]
    fn same_entries_same_state(entries in arb_entries()) {
        let mut a = fresh();
        let mut b = fresh();
        for entry in &entries {
            prop_assert_eq!(a.apply(entry), b.apply(entry));
        }
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(snapshot(&a), snapshot(&b));
    }

    /// Quotas hold after every entry, and a refused SET changes nothing.
    #[test]
    fn quota_never_exceeded(entries in arb_entries(), max_keys in 1u64..4, max_bytes in 3u64..40) {
        let mut m = StateMachine::new(StoreConfig {
            max_keys: Some(max_keys),
            max_bytes: Some(max_bytes),
            ..StoreConfig::new("srv")
        });
        for entry in &entries {
            let key = match &entry.op {
                Op::Request(r) => Some(r.command.key().clone()),
                Op::ExpireDue | Op::SetLimits(_) | Op::Meta(_) | Op::SetHistory(_) => None,
            };
            let before = key.as_ref().map(|k| m.get(k, entry.now_ms));
            let applied = m.apply(entry);
            prop_assert!(m.len() as u64 <= max_keys, "{} keys", m.len());
            prop_assert!(m.stored_bytes() <= max_bytes, "{} bytes", m.stored_bytes());
            if applied.response == Response::Error(ErrorKind::QuotaExceeded) {
                let key = key.expect("only requests are refused");
                prop_assert_eq!(m.get(&key, entry.now_ms), before.flatten());
                prop_assert!(applied.events.iter().all(|e| e.kind == ChangeKind::Delete));
            }
        }
    }
}

proptest! {
    /// The change history: the changes of a key after any version are exactly those applied
    /// after it, in order, or the answer that some are no longer kept, which comes only when
    /// the history dropped changes.
    #[test]
    fn history_replays_exactly_the_changes_after_a_version(
        entries in arb_entries(),
        max_changes in 1usize..40,
        pick in any::<prop::sample::Index>(),
    ) {
        let mut m = StateMachine::new(StoreConfig::new("srv"));
        m.apply(&Entry {
            now_ms: START_MS - 1,
            op: Op::SetHistory(mqkv_store::HistoryLimits {
                max_changes,
                max_age_ms: u64::MAX / 4,
                max_bytes: u64::MAX / 4,
            }),
        });
        let mut log = Vec::new();
        for entry in &entries {
            log.extend(m.apply(entry).events);
        }
        prop_assume!(!log.is_empty());
        let after = log[pick.index(log.len())].version.clone();
        for key in KEYS {
            let expected: Vec<_> = log
                .iter()
                .filter(|e| &e.key[..] == key.as_bytes() && e.version > after)
                .cloned()
                .collect();
            match m.history_since(key.as_bytes(), &after) {
                Ok(changes) => prop_assert_eq!(changes, expected),
                Err(mqkv_store::Compacted) => prop_assert!(
                    log.len() > max_changes,
                    "compacted with all {} changes kept", log.len()
                ),
            }
        }
    }
}
