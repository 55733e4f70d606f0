use super::*;
use crate::machine::test_support::*;
use mqkv_protocol::{Command, SetCondition};

/// XXH3-64 of `*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`, as the reference implementation
/// (Python `xxhash.xxh3_64_intdigest`) computes it.
const PINNED_GET_K: u64 = 16_324_139_510_872_475_369;

fn id(correlation: &str, expires_at_ms: u64) -> DedupId {
    DedupId {
        client_id: "c".into(),
        correlation: b(correlation),
        expires_at_ms,
    }
}

/// Fingerprints are stored in snapshots and compared across versions
/// and replicas, so the function must never change silently.
#[test]
fn fingerprint_is_pinned() {
    let get = Command::Get { key: b("k") };
    assert_eq!(get.encode().as_ref(), b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    assert_eq!(fingerprint(&get), PINNED_GET_K);
}

/// Small requests are encoded into the thread's buffer and large ones
/// hashed piece by piece; both must give the hash of the wire encoding,
/// whatever the buffer held before (the sizes go up, then down again).
#[test]
fn fingerprint_is_the_hash_of_the_encoding_at_every_size() {
    let set_of = |len: usize| set_cmd("k", &"v".repeat(len), None, Some(1_000));
    // The longest value whose request is encoded into the kept buffer.
    let edge = (0..FINGERPRINT_KEPT)
        .rev()
        .find(|&len| set_of(len).encoded_len_bound() <= FINGERPRINT_KEPT)
        .expect("a short SET fits");
    assert!(set_of(edge + 1).encoded_len_bound() > FINGERPRINT_KEPT);
    for len in [
        0,
        1,
        400,
        512,
        513,
        edge - 1,
        edge,
        edge + 1,
        edge + 2,
        4096,
        65536,
        1048576,
        edge,
        edge + 1,
        3,
        0,
    ] {
        let command = set_of(len);
        assert_eq!(
            fingerprint(&command),
            xxhash_rust::xxh3::xxh3_64(&command.encode()),
            "value of {len} bytes"
        );
    }
}

#[test]
fn redelivered_nx_gets_the_first_answer() {
    let mut m = machine();
    let nx = set_cmd("lock", "me", Some(SetCondition::Nx), None);
    let first = m.apply(&deduped(1_000, nx.clone(), "corr-1"));
    assert_eq!(first.response, Response::Ok);
    assert_eq!(first.events.len(), 1);
    let before = m.clone();

    let again = m.apply(&deduped(1_500, nx.clone(), "corr-1"));
    assert_eq!(again.response, Response::Ok, "not :-1");
    assert_eq!(again.version, first.version);
    assert!(again.events.is_empty());
    assert_eq!(m, before);

    // A new correlation is a new request.
    let other = m.apply(&deduped(1_600, nx, "corr-2"));
    assert_eq!(other.response, Response::NotApplied);
}

#[test]
fn redelivered_vdel_gets_the_first_answer() {
    let mut m = machine();
    put(&mut m, 10, "k", "v");
    let vdel = Command::VDel {
        key: b("k"),
        value: b("v"),
    };
    let first = m.apply(&deduped(20, vdel.clone(), "x"));
    assert_eq!(first.response, Response::Integer(1));
    let again = m.apply(&deduped(21, vdel, "x"));
    assert_eq!(again.response, Response::Integer(1));
    assert_eq!(again.version, first.version);
    assert!(again.events.is_empty());
}

#[test]
fn errors_are_remembered_too() {
    let mut m = machine();
    let mut e = deduped(1_000, set_cmd("k", "v", None, None), "e");
    if let crate::Op::Request(r) = &mut e.op {
        r.ts = Some(Hlc::new(70_000, 0, "c"));
    }
    let first = m.apply(&e);
    assert_eq!(
        first,
        Applied::error(mqkv_protocol::ErrorKind::TimestampSkew)
    );
    // Ten seconds later the same request would pass validation, but it
    // is the same request, so it gets the same answer.
    e.now_ms = 9_999;
    assert_eq!(m.apply(&e), first);
    assert!(m.is_empty());
}

#[test]
fn reads_are_not_remembered() {
    let mut m = machine();
    m.apply(&deduped(1, Command::Get { key: b("k") }, "g"));
    assert_eq!(m.dedup_len(), 0);
}

#[test]
fn answers_expire() {
    let mut m = machine();
    let nx = set_cmd("k", "v", Some(SetCondition::Nx), None);
    m.apply(&deduped(1_000, nx.clone(), "c1"));
    assert_eq!(m.dedup_len(), 1);
    // `deduped` sets expiry at now + 10 s.
    let late = m.apply(&deduped(11_000, nx, "c1"));
    assert_eq!(late.response, Response::NotApplied);
    assert_eq!(
        m.dedup_len(),
        1,
        "the old answer was pruned, the new one remembered"
    );
}

#[test]
fn retention_is_capped() {
    let mut table = DedupTable::default();
    let applied = Applied::reply(Response::Ok, None);
    table.remember(&id("a", u64::MAX), 7, &applied, 0);
    assert!(table.lookup(&id("a", 0), 7, MAX_RETENTION_MS - 1).is_some());
    assert!(table.lookup(&id("a", 0), 7, MAX_RETENTION_MS).is_none());
    table.prune(MAX_RETENTION_MS);
    assert_eq!(table.len(), 0);
}

#[test]
fn already_expired_ids_are_not_remembered() {
    let mut table = DedupTable::default();
    table.remember(&id("a", 5), 7, &Applied::reply(Response::Ok, None), 5);
    assert_eq!(table.len(), 0);
}

#[test]
fn capacity_evicts_the_oldest_whatever_its_expiry() {
    let mut table = DedupTable::default();
    let applied = Applied::reply(Response::Ok, None);
    for i in 0..CAPACITY as u64 {
        // Reverse order of expiry: entry 0 lives longest.
        table.remember(&id(&i.to_string(), 500_000 - i), 7, &applied, 0);
    }
    assert_eq!(table.len(), CAPACITY);
    table.remember(&id("new", 450_000), 7, &applied, 0);
    assert_eq!(table.len(), CAPACITY);
    assert!(table.lookup(&id("0", 0), 7, 1).is_none(), "oldest evicted");
    assert!(table.lookup(&id("1", 0), 7, 1).is_some());
    let last = (CAPACITY as u64 - 1).to_string();
    assert!(table.lookup(&id(&last, 0), 7, 1).is_some());
    assert!(table.lookup(&id("new", 0), 7, 1).is_some());

    // Answering an identity again replaces its answer in place: nothing
    // is evicted and it keeps its turn.
    table.remember(&id("1", 450_000), 8, &applied, 0);
    assert_eq!(table.len(), CAPACITY);
    assert!(table.lookup(&id("2", 0), 7, 1).is_some());
    assert!(
        table.lookup(&id("1", 0), 7, 1).is_none(),
        "old answer replaced"
    );
    assert!(table.lookup(&id("1", 0), 8, 1).is_some());
    table.remember(&id("newer", 450_000), 7, &applied, 0);
    assert!(table.lookup(&id("1", 0), 8, 1).is_none(), "its turn came");
    assert!(table.lookup(&id("2", 0), 7, 1).is_some());
}

#[test]
fn expired_answers_go_from_the_front_and_are_never_returned() {
    let mut table = DedupTable::default();
    let applied = Applied::reply(Response::Ok, None);
    table.remember(&id("long", 1_000), 7, &applied, 0);
    table.remember(&id("short", 10), 7, &applied, 0);
    table.prune(20);
    assert_eq!(table.len(), 2, "waits behind the longer-lived answer");
    assert!(table.lookup(&id("short", 0), 7, 20).is_none());
    assert!(table.lookup(&id("long", 0), 7, 20).is_some());
    table.prune(1_000);
    assert_eq!(table.len(), 0);
}

#[test]
fn equal_expiries_are_evicted_in_remembered_order_also_after_a_restore() {
    let applied = Applied::reply(Response::Ok, None);
    let mut live = DedupTable::default();
    // Remembered in an order unlike their identities' byte order.
    for i in 0..CAPACITY as u64 {
        let correlation = format!("{}", (i * 7_919) % CAPACITY as u64);
        live.remember(&id(&correlation, 1_000), 7, &applied, 0);
    }
    let mut restored: DedupTable =
        postcard::from_bytes(&postcard::to_allocvec(&live).unwrap()).unwrap();
    assert_eq!(restored, live);
    for table in [&mut live, &mut restored] {
        table.remember(&id("new-1", 2_000), 7, &applied, 0);
        table.remember(&id("new-2", 2_000), 7, &applied, 0);
        // The first two remembered went, the third stayed.
        assert!(table.lookup(&id("0", 0), 7, 1).is_none());
        assert!(table.lookup(&id("7919", 0), 7, 1).is_none());
        assert!(table.lookup(&id("15838", 0), 7, 1).is_some());
    }
    assert_eq!(restored, live);
}

#[test]
fn serde_round_trip_rebuilds_the_index() {
    let mut table = DedupTable::default();
    let hit = Applied::reply(Response::Integer(1), Some(Hlc::new(5, 0, "s")));
    table.remember(&id("a", 100), 7, &hit, 0);
    table.remember(
        &id("b", 50),
        7,
        &Applied::reply(Response::NotApplied, None),
        0,
    );
    let bytes = postcard::to_allocvec(&table).unwrap();
    let restored: DedupTable = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(restored, table);
    assert_eq!(restored.lookup(&id("a", 0), 7, 1), Some(hit));

    // A list naming one identity twice keeps the last answer only.
    let remembered = |expires_at_ms| Remembered {
        expires_at_ms,
        fingerprint: 7,
        response: Response::Ok,
        version: None,
    };
    let key = ("c".to_owned(), Bytes::from_static(b"x"));
    let list = vec![(key.clone(), remembered(10)), (key, remembered(90))];
    let mut restored: DedupTable =
        postcard::from_bytes(&postcard::to_allocvec(&list).unwrap()).unwrap();
    assert_eq!(restored.len(), 1);
    assert_eq!(restored.index.len, 1);
    restored.prune(10);
    assert_eq!(
        restored.len(),
        1,
        "a stale expiry must not evict the kept answer"
    );
}

/// The ring and the hash index describe the same answers, every answer
/// is found through the index, and the index is at most half full.
fn assert_consistent(table: &DedupTable) {
    assert_eq!(table.index.len, table.len());
    let used = table.index.entries.iter().filter(|&&e| e != 0).count();
    assert_eq!(used, table.len());
    assert!(table.len() * 2 <= table.index.entries.len().max(1));
    for (at, slot) in table.ring.iter().enumerate() {
        let (client_id, correlation) = slot.parts();
        let probe = Probe::new(client_id, correlation);
        assert_eq!(slot.hash, probe.hash);
        assert_eq!(table.position(&probe), Some(at));
    }
}

#[test]
fn churn_keeps_the_ring_and_the_index_in_step() {
    let applied = Applied::reply(Response::Ok, None);
    let mut table = DedupTable::default();
    let mut remembered = Vec::new();
    // Far more answers than fit, with expiries that mostly rise, some
    // repeated identities, and pruning as time goes on.
    let total = CAPACITY as u64 * 5 / 2;
    let mut now = 0;
    for i in 0..total {
        now = i / 1_000;
        let correlation = if i % 97 == 0 {
            format!("{}", i / 2)
        } else {
            format!("{i}")
        };
        // The last few outlive everything before them.
        let expires = if i + 64 >= total {
            now + 10_000
        } else {
            now + 1_000 + (i * 7_919) % 500
        };
        table.remember(&id(&correlation, expires), i, &applied, now);
        if i + 64 >= total {
            remembered.push(correlation);
        }
        if i % 4_096 == 0 {
            table.prune(now);
            assert_consistent(&table);
        }
    }
    assert_consistent(&table);
    assert_eq!(table.len(), CAPACITY);
    // The longest-lived answers are all there, each with its own
    // fingerprint.
    for (correlation, fingerprint) in remembered.iter().zip(total - 64..) {
        assert!(table
            .lookup(&id(correlation, 0), fingerprint, now)
            .is_some());
        assert!(table
            .lookup(&id(correlation, 0), fingerprint + 1, now)
            .is_none());
    }
    // Once everything has expired the table is empty and lets its
    // memory go.
    table.prune(u64::MAX);
    assert_eq!(table.len(), 0);
    assert_eq!(table.ring.capacity(), 0);
    assert!(table.index.entries.is_empty());
    assert_consistent(&table);
}

/// Deleting from runs that wrap around the end of the table and hold
/// entries far from home keeps every other entry findable; checked
/// against a plain map over many random operations on small tables.
#[test]
fn index_deletes_keep_every_run_findable() {
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for round in 0..200u64 {
        let mut index = Index::default();
        let mut live = std::collections::BTreeMap::new();
        let mut number = round << 20;
        for _ in 0..400 {
            if live.is_empty() || next() % 3 != 0 {
                // Few distinct homes, so runs are long and wrap.
                let hash = (next() & !LOW_31) | (next() % 8) | 24;
                let entries: Vec<(u64, u64)> = live.iter().map(|(&n, &h)| (n, h)).collect();
                index.reserve_one(entries.into_iter());
                index.insert(hash, number);
                live.insert(number, hash);
                number += 1;
            } else {
                let pick = next() as usize % live.len();
                let (&gone, &hash) = live.iter().nth(pick).expect("non-empty");
                index.remove(hash, gone);
                live.remove(&gone);
            }
            assert_eq!(index.len, live.len());
            for (&n, &hash) in &live {
                assert!(
                    index.candidates(hash).any(|low| low == n as u32),
                    "entry {n} lost"
                );
            }
        }
    }
}

#[test]
fn identities_of_every_length_round_trip() {
    let applied = Applied::reply(Response::Ok, None);
    let mut table = DedupTable::default();
    let mut ids = Vec::new();
    for client_len in [0, 1, 20, 35, 36, 37, 52, 53, 1_000, 65_535] {
        for correlation_len in [0, 1, 16, 17, 100] {
            let id = DedupId {
                client_id: "c".repeat(client_len).into(),
                correlation: Bytes::from(vec![b'x'; correlation_len]),
                expires_at_ms: 1_000,
            };
            table.remember(&id, 7, &applied, 0);
            ids.push(id);
        }
    }
    // A client id that is another's with the first correlation byte
    // moved into it is another identity.
    let moved = DedupId {
        client_id: "cx".into(),
        correlation: Bytes::from_static(b"x"),
        expires_at_ms: 1_000,
    };
    assert!(table.lookup(&moved, 7, 1).is_none());
    assert_eq!(table.len(), ids.len());
    let restored: DedupTable =
        postcard::from_bytes(&postcard::to_allocvec(&table).unwrap()).unwrap();
    assert_eq!(restored, table);
    for t in [&table, &restored] {
        assert_consistent(t);
        for id in &ids {
            assert!(t.lookup(id, 7, 1).is_some());
        }
    }
}

#[test]
fn numbering_past_32_bits_still_names_the_right_answers() {
    let applied = Applied::reply(Response::Ok, None);
    let mut table = DedupTable {
        first: u64::from(u32::MAX) - 5,
        ..DedupTable::default()
    };
    for i in 0..40u64 {
        table.remember(&id(&i.to_string(), 1_000 + i), i, &applied, 0);
    }
    table.prune(1_010);
    assert_eq!(table.first, u64::from(u32::MAX) + 6);
    assert_consistent(&table);
    for i in 0..40u64 {
        let found = table.lookup(&id(&i.to_string(), 0), i, 1_010);
        assert_eq!(found.is_some(), i > 10, "answer {i}");
    }
}

#[test]
fn a_restored_list_longer_than_the_table_keeps_its_newest() {
    let remembered = Remembered {
        expires_at_ms: 100,
        fingerprint: 7,
        response: Response::Ok,
        version: None,
    };
    let list: Vec<((String, Bytes), Remembered)> = (0..CAPACITY + 3)
        .map(|i| ((i.to_string(), Bytes::new()), remembered.clone()))
        .collect();
    let restored: DedupTable =
        postcard::from_bytes(&postcard::to_allocvec(&list).unwrap()).unwrap();
    assert_eq!(restored.len(), CAPACITY);
    let ask = |i: usize| DedupId {
        client_id: i.to_string().into(),
        correlation: Bytes::new(),
        expires_at_ms: 0,
    };
    assert!(restored.lookup(&ask(2), 7, 1).is_none());
    assert!(restored.lookup(&ask(3), 7, 1).is_some());
    assert!(restored.lookup(&ask(CAPACITY + 2), 7, 1).is_some());
}

#[test]
fn same_correlation_from_another_client_is_another_request() {
    let mut table = DedupTable::default();
    table.remember(&id("x", 100), 7, &Applied::reply(Response::Ok, None), 0);
    let other = DedupId {
        client_id: "d".into(),
        ..id("x", 100)
    };
    assert!(table.lookup(&other, 7, 1).is_none());
}

#[test]
fn a_different_command_with_the_same_identity_is_not_answered_from_memory() {
    let mut table = DedupTable::default();
    table.remember(&id("c", 100), 1, &Applied::reply(Response::Ok, None), 0);
    assert!(table.lookup(&id("c", 0), 1, 1).is_some());
    assert!(table.lookup(&id("c", 0), 2, 1).is_none());
    let set = mqkv_protocol::Command::Get {
        key: Bytes::from_static(b"k"),
    };
    let del = mqkv_protocol::Command::Del {
        key: Bytes::from_static(b"k"),
    };
    assert_ne!(fingerprint(&set), fingerprint(&del));
    assert_eq!(fingerprint(&set), fingerprint(&set.clone()));
}
