//! Snapshots: the whole state as serde data.
//!
//! Invariant: deserializing a serialized machine gives a machine equal to
//! the original — same configuration, HLC clock `(L, C)`, keys with values,
//! versions, fencing tokens and deadlines, and de-duplication answers — so
//! it answers every later entry identically. Only primary data is written;
//! the expiry index and byte count are rebuilt on load, so a snapshot can
//! never carry indexes that disagree with the keys.

use bytes::Bytes;
use mqkv_protocol::HlcClock;
use serde::de::{Error as _, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::dedup::DedupTable;
use crate::history::History;
use crate::machine::{Key, Record};
use crate::meta::MetaTable;
use crate::{StateMachine, StoreConfig};

/// Bumped whenever the snapshot layout changes, so an old binary refuses a
/// newer snapshot instead of misreading it. Format 1 had no cluster table,
/// format 2 no change history; both are still read.
pub const SNAPSHOT_FORMAT: u32 = 3;

/// The oldest format still read.
const OLDEST_FORMAT: u32 = 1;

#[derive(Serialize)]
struct SnapshotRef<'a, K: Serialize> {
    format: u32,
    config: &'a StoreConfig,
    clock: &'a HlcClock,
    keys: K,
    dedup: &'a DedupTable,
    meta: &'a MetaTable,
    history: &'a History,
}

struct KeysRef<'a>(&'a std::collections::BTreeMap<Key, Box<Record>>);

impl Serialize for KeysRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A sequence of pairs rather than a map: keys are bytes, which
        // self-describing formats such as JSON cannot use as map keys.
        serializer.collect_seq(
            self.0
                .iter()
                .map(|(key, record)| (BytesRef(key), &**record)),
        )
    }
}

/// [`KeysRef`] over keys copied out of the map, in its order.
struct KeysCopied<'a>(&'a [(Key, Record)]);

impl Serialize for KeysCopied<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|(key, record)| (BytesRef(key), record)))
    }
}

/// A byte string serialized as bytes (not as a sequence of numbers): the
/// encoding of `Bytes`, so the snapshot format does not depend on how keys
/// and values are held in memory.
pub(crate) struct BytesRef<'a>(pub(crate) &'a [u8]);

impl Serialize for BytesRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// `#[serde(with)]` for a [`Value`] stored with the encoding of `Bytes`.
pub(crate) mod shared_bytes {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::machine::Value;

    pub(crate) fn serialize<S: Serializer>(value: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(value)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Value, D::Error> {
        Bytes::deserialize(deserializer).map(|bytes| Value::from(&bytes[..]))
    }
}

/// A snapshot's content taken out of the machine (see
/// [`StateMachine::snapshot_copy`]): the keys and records copied, their
/// values shared. Serializes to the same bytes as the machine it was taken
/// from did at that moment.
#[derive(Debug, Clone)]
pub struct SnapshotCopy {
    config: StoreConfig,
    clock: HlcClock,
    keys: Vec<(Key, Record)>,
    dedup: DedupTable,
    meta: MetaTable,
    history: History,
}

impl SnapshotCopy {
    pub(crate) fn of(machine: &StateMachine) -> SnapshotCopy {
        SnapshotCopy {
            config: machine.config.clone(),
            clock: machine.clock.clone(),
            keys: machine
                .keys
                .iter()
                .map(|(key, record)| (key.clone(), Record::clone(record)))
                .collect(),
            dedup: machine.dedup.clone(),
            meta: machine.meta.clone(),
            history: machine.history.clone(),
        }
    }
}

impl Serialize for SnapshotCopy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SnapshotRef {
            format: SNAPSHOT_FORMAT,
            config: &self.config,
            clock: &self.clock,
            keys: KeysCopied(&self.keys),
            dedup: &self.dedup,
            meta: &self.meta,
            history: &self.history,
        }
        .serialize(serializer)
    }
}

struct SnapshotOwned {
    config: StoreConfig,
    clock: HlcClock,
    keys: Vec<(Bytes, Record)>,
    dedup: DedupTable,
    meta: MetaTable,
    history: History,
}

/// The fields of a snapshot in order; the cluster table only from format 2, the change
/// history only from format 3.
/// (Read as a tuple so that a format-1 snapshot, one field shorter, reads
/// too: postcard has no field names or lengths to tell them apart by.)
impl<'de> Deserialize<'de> for SnapshotOwned {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = SnapshotOwned;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a state store snapshot")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SnapshotOwned, A::Error> {
                let missing = || A::Error::custom("a truncated state store snapshot");
                let format: u32 = seq.next_element()?.ok_or_else(missing)?;
                if !(OLDEST_FORMAT..=SNAPSHOT_FORMAT).contains(&format) {
                    return Err(A::Error::custom(format_args!(
                        "unsupported state store snapshot format {format} (expected {OLDEST_FORMAT} to {SNAPSHOT_FORMAT})"
                    )));
                }
                let config = seq.next_element()?.ok_or_else(missing)?;
                let clock = seq.next_element()?.ok_or_else(missing)?;
                let keys = seq.next_element()?.ok_or_else(missing)?;
                let dedup = seq.next_element()?.ok_or_else(missing)?;
                let meta = if format >= 2 {
                    seq.next_element()?.ok_or_else(missing)?
                } else {
                    MetaTable::default()
                };
                let history = if format >= 3 {
                    seq.next_element()?.ok_or_else(missing)?
                } else {
                    // Nothing is known of the changes before the snapshot.
                    History::starting_at(HlcClock::current(&clock).wall_ms)
                };
                Ok(SnapshotOwned {
                    config,
                    clock,
                    keys,
                    dedup,
                    meta,
                    history,
                })
            }
        }
        deserializer.deserialize_tuple(7, Fields)
    }
}

impl Serialize for StateMachine {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        SnapshotRef {
            format: SNAPSHOT_FORMAT,
            config: &self.config,
            clock: &self.clock,
            keys: KeysRef(&self.keys),
            dedup: &self.dedup,
            meta: &self.meta,
            history: &self.history,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StateMachine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let snapshot = SnapshotOwned::deserialize(deserializer)?;
        Ok(StateMachine::from_parts(
            snapshot.config,
            snapshot.clock,
            snapshot
                .keys
                .into_iter()
                .map(|(key, record)| (Key::from(&key[..]), record))
                .collect(),
            snapshot.dedup,
            snapshot.meta,
            snapshot.history,
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::test_support::*;
    use crate::{Entry, Op, StateMachine};
    use mqkv_protocol::{Command, Hlc, Response};

    fn populated() -> StateMachine {
        let mut m = machine();
        put(&mut m, 100, "plain", "v");
        m.apply(&entry(100, set_cmd("ttl", "v", None, Some(1_000)), None));
        m.apply(&entry(
            100,
            set_cmd("fenced", "v", None, None),
            Some(Hlc::new(90, 0, "srv")),
        ));
        m.apply(&deduped(100, Command::Del { key: b("plain") }, "corr"));
        put(&mut m, 100, "bin\x00\u{7f}", "\r\n");
        m
    }

    #[test]
    fn a_copy_serializes_as_the_machine_did_when_it_was_taken() {
        let mut m = populated();
        let big = "v".repeat(4096);
        put(&mut m, 100, "big", &big);
        let before = postcard::to_allocvec(&m).unwrap();
        let copy = m.snapshot_copy();
        // The machine moves on; the copy does not.
        put(&mut m, 200, "big", "replaced");
        m.apply(&deduped(200, Command::Del { key: b("ttl") }, "corr-2"));
        assert_ne!(postcard::to_allocvec(&m).unwrap(), before);
        assert_eq!(postcard::to_allocvec(&copy).unwrap(), before);
        let restored: StateMachine = postcard::from_bytes(&before).unwrap();
        assert_eq!(restored.get(b"big", 300).map(|(v, _)| v), Some(b(&big)));
    }

    #[test]
    fn a_copy_pays_only_when_values_are_large() {
        let mut m = machine();
        for i in 0..100 {
            put(&mut m, 100, &format!("k{i}"), "small");
        }
        assert!(!m.snapshot_copy_pays());
        put(&mut m, 100, "large", &"v".repeat(100 * 1024));
        assert!(m.snapshot_copy_pays());
        assert!(!machine().snapshot_copy_pays(), "nothing stored");
    }

    #[test]
    fn postcard_round_trip_is_exact() {
        let m = populated();
        let bytes = postcard::to_allocvec(&m).unwrap();
        let restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(restored, m);
        assert_eq!(restored.next_expiry_ms(), Some(1_100));
        assert_eq!(restored.stored_bytes(), m.stored_bytes());
        assert_eq!(restored.dedup_len(), 1);
        assert_eq!(postcard::to_allocvec(&restored).unwrap(), bytes);
        assert_indexes_consistent(&restored);
    }

    #[test]
    fn restored_machine_behaves_the_same() {
        let mut original = populated();
        let mut restored: StateMachine =
            postcard::from_bytes(&postcard::to_allocvec(&original).unwrap()).unwrap();
        let entries = [
            deduped(200, Command::Del { key: b("plain") }, "corr"),
            entry(200, set_cmd("fenced", "w", None, None), None),
            entry(300, set_cmd("new", "v", None, None), None),
            Entry {
                now_ms: 1_100,
                op: Op::ExpireDue,
            },
        ];
        for e in &entries {
            assert_eq!(original.apply(e), restored.apply(e));
        }
        assert_eq!(original, restored);
        // The remembered answer survived: the redelivered DEL still says 1.
        let mut again = populated();
        let mut copy: StateMachine =
            postcard::from_bytes(&postcard::to_allocvec(&again).unwrap()).unwrap();
        let redelivered = deduped(150, Command::Del { key: b("plain") }, "corr");
        assert_eq!(copy.apply(&redelivered).response, Response::Integer(1));
        assert_eq!(again.apply(&redelivered).response, Response::Integer(1));
    }

    /// The hint sizes the buffer a snapshot is serialized into, so it must
    /// not fall short for what the SDKs send (36-character client ids and
    /// HLC node ids, 16 bytes of correlation data), nor be far above.
    #[test]
    fn size_hint_covers_a_typical_snapshot() {
        let client = "0f8e6d4c-2b1a-4f3e-9d8c-7b6a5f4e3d2c";
        let mut m = machine();
        for i in 0..2_000u64 {
            let key = format!("sensor/{i:06}");
            let command = match i % 4 {
                0 => set_cmd(&key, "0123456789abcdef", None, Some(60_000)),
                1 => Command::Del {
                    key: b(&format!("sensor/{:06}", i - 1)),
                },
                _ => set_cmd(&key, &"v".repeat((i % 300) as usize), None, None),
            };
            let e = Entry {
                now_ms: 1_000 + i,
                op: Op::Request(crate::Request {
                    command,
                    ts: Some(Hlc::new(1_000 + i, 0, client)),
                    ft: (i % 7 == 0).then(|| Hlc::new(500, 0, client)),
                    dedup: Some(crate::DedupId {
                        client_id: client.into(),
                        correlation: bytes::Bytes::copy_from_slice(&(i as u128).to_le_bytes()),
                        expires_at_ms: 11_000 + i,
                    }),
                }),
            };
            m.apply(&e);
        }
        assert!(m.dedup_len() > 1_000 && m.len() > 1_000);
        let actual = postcard::to_allocvec(&m).unwrap().len() as u64;
        let hint = m.snapshot_size_hint();
        assert!(
            hint >= actual,
            "hint {hint} below the snapshot's {actual} bytes"
        );
        assert!(
            hint <= 2 * actual,
            "hint {hint} far above the snapshot's {actual} bytes"
        );
    }

    #[test]
    fn the_cluster_table_is_part_of_the_snapshot() {
        let mut m = populated();
        m.apply(&Entry {
            now_ms: 100,
            op: Op::Meta(vec![
                crate::MetaChange::put(&b"o/client"[..], &b"\x01"[..]),
                crate::MetaChange::put(&b"r/topic"[..], &b"msg"[..]),
            ]),
        });
        let bytes = postcard::to_allocvec(&m).unwrap();
        let restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(restored, m);
        assert_eq!(restored.meta(b"r/topic").map(|v| &v[..]), Some(&b"msg"[..]));
        assert_eq!(postcard::to_allocvec(&m.snapshot_copy()).unwrap(), bytes);
    }

    /// The bytes `m` had serialized to under an older `format`: format 2 without the change
    /// history (the last field), format 1 without the cluster table before it too.
    fn older_snapshot(m: &StateMachine, format: u8) -> Vec<u8> {
        let mut bytes = postcard::to_allocvec(m).unwrap();
        let history = postcard::to_allocvec(&m.history).unwrap();
        bytes.truncate(bytes.len() - history.len());
        if format == 1 {
            // The empty cluster table is a zero-length sequence.
            assert_eq!(bytes.pop(), Some(0));
        }
        assert_eq!(bytes[0], 3);
        bytes[0] = format;
        bytes
    }

    /// Snapshots written before the cluster table (format 1) or the change history (format 2)
    /// existed still read: with an empty table, and a history that knows nothing before the
    /// snapshot, so a watch resuming from before it is told to resynchronise.
    #[test]
    fn older_snapshots_read_with_what_they_lacked_empty() {
        let m = populated();
        for format in [1, 2] {
            let mut restored: StateMachine =
                postcard::from_bytes(&older_snapshot(&m, format)).unwrap();
            assert_eq!(restored.meta_len(), 0);
            assert_eq!(
                restored.history_since(b"fenced", &Hlc::new(1, 0, "srv")),
                Err(crate::Compacted)
            );
            restored.history = m.history.clone();
            assert_eq!(restored, m, "format {format}");
        }
    }

    /// The change history survives a snapshot.
    #[test]
    fn the_change_history_is_part_of_the_snapshot() {
        let mut m = populated();
        put(&mut m, 1_000, "late", "v");
        let before = m.history_since(b"late", &Hlc::new(500, 0, "srv"));
        assert_eq!(before.as_ref().map(Vec::len), Ok(1));
        let bytes = postcard::to_allocvec(&m).unwrap();
        let restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(
            restored.history_since(b"late", &Hlc::new(500, 0, "srv")),
            before
        );
        assert_eq!(postcard::to_allocvec(&m.snapshot_copy()).unwrap(), bytes);
    }

    #[test]
    fn unknown_format_is_refused() {
        let m = machine();
        let mut bytes = postcard::to_allocvec(&m).unwrap();
        // The format number is the first varint.
        bytes[0] = 99;
        assert!(postcard::from_bytes::<StateMachine>(&bytes).is_err());
    }

    #[test]
    fn truncated_snapshot_is_an_error_not_a_panic() {
        let bytes = postcard::to_allocvec(&populated()).unwrap();
        for cut in 0..bytes.len() {
            assert!(postcard::from_bytes::<StateMachine>(&bytes[..cut]).is_err());
        }
    }
}
