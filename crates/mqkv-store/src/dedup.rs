//! Answers to QoS 1 redeliveries.
//!
//! A client that does not get a PUBACK resends the same PUBLISH with the
//! same correlation data. Running a non-idempotent write twice (SET NX,
//! VDEL) would give the second copy a different answer than the first, so
//! the first answer is remembered and repeated.
//!
//! Invariants:
//! - a remembered answer is returned unchanged, with no events and no state
//!   change, until its expiry (`expires_at_ms`, capped at
//!   [`MAX_RETENTION_MS`] after it was remembered);
//! - the table never holds more than [`CAPACITY`] answers; when full, the
//!   answer closest to expiry is forgotten first;
//! - only writes are remembered: reads are idempotent, and not caching GET
//!   values keeps the table small;
//! - an answer is repeated only for the same request: the identity (client
//!   id, correlation data) must match and so must a fingerprint of the
//!   command, so a client that reuses correlation data for a different
//!   command gets that command executed, not an unrelated earlier answer;
//! - eviction order is the same on every replica, restored or not: by
//!   expiry, ties in the order the answers were remembered (a snapshot lists
//!   them in that order and a restore keeps it).

use std::collections::BTreeMap;

use bytes::Bytes;
use hashbrown::HashTable;
use mqkv_protocol::{Hlc, Response};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::snapshot::BytesRef;
use crate::{Applied, DedupId};

/// Most answers remembered at once.
pub const CAPACITY: usize = 100_000;

/// Answers from which the hash index is sized for good (see
/// [`DedupTable::make_room`]).
const INDEX_FINAL_AT: usize = CAPACITY / 8;

/// Longest time an answer is remembered, whatever expiry the request asked
/// for. The SDKs' request timeouts are seconds to a minute; MQTT allows
/// message expiries of over a century, which must not pin memory.
pub const MAX_RETENTION_MS: u64 = 10 * 60 * 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Remembered {
    expires_at_ms: u64,
    fingerprint: u64,
    response: Response,
    version: Option<Hlc>,
}

/// Where an answer sits in the eviction order: its expiry, then when it
/// was remembered.
type ExpiryKey = (u64, u64);

/// One remembered answer and whose it is.
#[derive(Debug, Clone)]
struct Slot {
    /// [`identity_hash`] of the identity.
    hash: u64,
    /// The client id's length as 4 bytes, the client id, the correlation
    /// data: one allocation, a copy (a slice of the request would keep its
    /// whole read buffer alive for as long as the answer is remembered).
    identity: Box<[u8]>,
    remembered: Remembered,
    key: ExpiryKey,
}

impl Slot {
    fn parts(&self) -> (&[u8], &[u8]) {
        let (len, rest) = self.identity.split_at(4);
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        rest.split_at(len)
    }

    fn is(&self, probe: &Probe<'_>) -> bool {
        self.hash == probe.hash && self.parts() == (probe.client_id, probe.correlation)
    }
}

/// An identity to look for, borrowed from the request.
struct Probe<'a> {
    hash: u64,
    client_id: &'a [u8],
    correlation: &'a [u8],
}

impl<'a> Probe<'a> {
    fn new(client_id: &'a [u8], correlation: &'a [u8]) -> Probe<'a> {
        Probe {
            hash: identity_hash(client_id, correlation),
            client_id,
            correlation,
        }
    }

    fn identity(&self) -> Box<[u8]> {
        // Client ids are MQTT strings: at most 65,535 bytes.
        let len = u32::try_from(self.client_id.len()).unwrap_or(u32::MAX);
        let mut bytes = Vec::with_capacity(4 + self.client_id.len() + self.correlation.len());
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(self.client_id);
        bytes.extend_from_slice(self.correlation);
        bytes.into_boxed_slice()
    }
}

/// Where an identity goes in the hash index. Held in memory only (rebuilt
/// on load) and never observable (eviction and snapshot order come from the
/// expiry index), so it is seeded per process: correlation data comes from
/// clients, and identities crafted to collide under a known seed would
/// turn every lookup into a walk of the whole table.
fn identity_hash(client_id: &[u8], correlation: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64));
    let client = xxhash_rust::xxh3::xxh3_64_with_seed(client_id, seed);
    xxhash_rust::xxh3::xxh3_64_with_seed(correlation, client)
}

/// The hash of the identity in slot `at`, for the index to rehash with.
fn hash_at(slots: &[Option<Slot>], at: u32) -> u64 {
    slots
        .get(at as usize)
        .and_then(Option::as_ref)
        .map_or(0, |s| s.hash)
}

/// The remembered answers: a slab of slots, a hash index over it by
/// identity, and the eviction order.
///
/// A hash index, not a B-tree by identity: every write looks its identity
/// up and most remember one, and with the table full that was several
/// cache-missing walks of a 100,000-entry tree per write. A hash table
/// under churn leaves tombstones where a deleted entry sat in a full run of
/// buckets; once they use up its spare room it rebuilds itself (a few
/// milliseconds at this size, stalling the write that triggers it). So the
/// index is kept sparse ([`DedupTable::make_room`]): once the table is
/// past [`INDEX_FINAL_AT`] answers the index is sized in one step for four
/// times [`CAPACITY`], at most a quarter full, where tombstones are too rare
/// to matter. The eviction order is a B-tree keyed by expiry: answers mostly
/// arrive in expiry order, so it is worked at its two ends.
#[derive(Debug, Clone, Default)]
pub(crate) struct DedupTable {
    slots: Vec<Option<Slot>>,
    /// Vacant positions in `slots`.
    vacant: Vec<u32>,
    /// Positions of the occupied slots, by [`Slot::hash`].
    index: HashTable<u32>,
    by_expiry: BTreeMap<ExpiryKey, u32>,
    /// Numbers answers in the order they were remembered.
    next_seq: u64,
}

/// Equal when the same answers are remembered in the same eviction order
/// (the numbering itself may differ: a restored table renumbers).
impl PartialEq for DedupTable {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .in_order()
                .zip(other.in_order())
                .all(|(a, b)| a.identity == b.identity && a.remembered == b.remembered)
    }
}

impl Eq for DedupTable {}

impl DedupTable {
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    fn slot(&self, at: u32) -> Option<&Slot> {
        self.slots.get(at as usize).and_then(Option::as_ref)
    }

    /// The answers in eviction order.
    fn in_order(&self) -> impl Iterator<Item = &Slot> {
        self.by_expiry.values().filter_map(|&at| self.slot(at))
    }

    /// Where the answer to this identity is, if remembered.
    fn position(&self, probe: &Probe<'_>) -> Option<u32> {
        self.index
            .find(probe.hash, |&at| self.slot(at).is_some_and(|s| s.is(probe)))
            .copied()
    }

    /// Forgets the answer in slot `at`, whose place in the eviction order
    /// is still indexed.
    fn forget(&mut self, at: u32) {
        if let Some(slot) = self.slot(at) {
            let key = slot.key;
            self.by_expiry.remove(&key);
            self.forget_popped(at);
        }
    }

    /// Forgets the answer in slot `at`, already taken out of the eviction
    /// order. The slot is dropped where it is: it was remembered long ago,
    /// so its memory is cold, and moving it out would copy all of it.
    fn forget_popped(&mut self, at: u32) {
        let Some(hash) = self.slot(at).map(|slot| slot.hash) else {
            return;
        };
        if let Ok(entry) = self.index.find_entry(hash, |&other| other == at) {
            entry.remove();
        }
        if let Some(slot) = self.slots.get_mut(at as usize) {
            *slot = None;
        }
        self.vacant.push(at);
        if self.index.is_empty() {
            // Give the memory of a burst back once it has all expired.
            *self = DedupTable {
                next_seq: self.next_seq,
                ..DedupTable::default()
            };
        }
    }

    /// Forgets every answer whose expiry is at or before `now_ms`.
    pub(crate) fn prune(&mut self, now_ms: u64) {
        while let Some((&(expires_at_ms, _), &at)) = self.by_expiry.first_key_value() {
            if expires_at_ms > now_ms {
                break;
            }
            self.by_expiry.pop_first();
            self.forget_popped(at);
        }
    }

    /// Grows the index once it is half full: doubling while the table is
    /// small, and straight to room for four times [`CAPACITY`] once it holds
    /// [`INDEX_FINAL_AT`] answers, so a busy table grows (and stalls to
    /// rehash) a few times on its way up and then no more.
    fn make_room(&mut self) {
        let len = self.index.len();
        if len * 2 >= self.index.capacity() {
            let slots = &self.slots;
            let additional = if len >= INDEX_FINAL_AT {
                (4 * CAPACITY).saturating_sub(len)
            } else {
                len.max(16)
            };
            self.index.reserve(additional, |&at| hash_at(slots, at));
        }
    }

    /// Forgets the answer remembered for this identity, if any.
    fn forget_identity(&mut self, probe: &Probe<'_>) {
        if let Some(at) = self.position(probe) {
            self.forget(at);
        }
    }

    /// Adds an answer for an identity that has none remembered.
    fn insert(&mut self, probe: &Probe<'_>, remembered: Remembered) {
        let key = (remembered.expires_at_ms, self.next_seq);
        self.next_seq += 1;
        let slot = Slot {
            hash: probe.hash,
            identity: probe.identity(),
            remembered,
            key,
        };
        let at = match self.vacant.pop() {
            Some(at) => {
                self.slots[at as usize] = Some(slot);
                at
            }
            None => {
                // At most CAPACITY slots are ever in use.
                let at = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Some(slot));
                at
            }
        };
        self.make_room();
        let slots = &self.slots;
        self.index
            .insert_unique(probe.hash, at, |&at| hash_at(slots, at));
        self.by_expiry.insert(key, at);
    }

    /// The first answer to the request with this identity, if remembered
    /// and not expired.
    pub(crate) fn lookup(&self, id: &DedupId, fingerprint: u64, now_ms: u64) -> Option<Applied> {
        let at = self.position(&Probe::new(id.client_id.as_bytes(), &id.correlation))?;
        let remembered = &self.slot(at)?.remembered;
        (remembered.expires_at_ms > now_ms && remembered.fingerprint == fingerprint)
            .then(|| Applied::reply(remembered.response.clone(), remembered.version.clone()))
    }

    /// Remembers the answer to a request.
    pub(crate) fn remember(
        &mut self,
        id: &DedupId,
        fingerprint: u64,
        applied: &Applied,
        now_ms: u64,
    ) {
        let expires_at_ms = id
            .expires_at_ms
            .min(now_ms.saturating_add(MAX_RETENTION_MS));
        if expires_at_ms <= now_ms {
            return;
        }
        let probe = Probe::new(id.client_id.as_bytes(), &id.correlation);
        self.forget_identity(&probe);
        while self.len() >= CAPACITY {
            let Some((_, evicted)) = self.by_expiry.pop_first() else {
                break;
            };
            self.forget_popped(evicted);
        }
        self.insert(
            &probe,
            Remembered {
                expires_at_ms,
                fingerprint,
                response: applied.response.clone(),
                version: applied.version.clone(),
            },
        );
    }
}

/// A stable 64-bit fingerprint of a request: XXH3-64 (seed 0) over its wire
/// encoding, the same on every replica and across versions, unlike `std`'s
/// hasher, and fast enough for large values (the byte-at-a-time FNV-1a it
/// replaced cost about 1 µs per KiB on the apply path). Answers remembered
/// by a version that used FNV-1a no longer match after an upgrade: their
/// requests, if redelivered within the retention, run again.
///
/// Computed on the apply path of every write, so a request whose encoding
/// fits is encoded on the stack, and a larger one is hashed piece by piece
/// as it would be encoded, its value where it lies: neither is copied into
/// an allocation.
pub(crate) fn fingerprint(command: &mqkv_protocol::Command) -> u64 {
    const ON_STACK: usize = 512;
    if command.encoded_len_bound() > ON_STACK {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        command.encode_pieces(|piece| hasher.update(piece));
        return hasher.digest();
    }
    let mut buf = [0u8; ON_STACK];
    let mut rest = &mut buf[..];
    command.encode_into(&mut rest);
    let written = ON_STACK - rest.len();
    xxhash_rust::xxh3::xxh3_64(&buf[..written])
}

/// Serialized as a flat list of `((client id, correlation data), answer)`
/// in eviction order; the indexes are rebuilt on load so they can never
/// disagree with the list in a snapshot.
impl Serialize for DedupTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut list = serializer.serialize_seq(Some(self.len()))?;
        for slot in self.in_order() {
            let (client_id, correlation) = slot.parts();
            let client_id = std::str::from_utf8(client_id).map_err(S::Error::custom)?;
            list.serialize_element(&((client_id, BytesRef(correlation)), &slot.remembered))?;
        }
        list.end()
    }
}

impl<'de> Deserialize<'de> for DedupTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut list: Vec<((String, Bytes), Remembered)> = Vec::deserialize(deserializer)?;
        // Eviction order is by expiry, then by position in the list (older
        // snapshots listed answers by identity, which was their tie order).
        list.sort_by_key(|(_, remembered)| remembered.expires_at_ms);
        let mut table = DedupTable::default();
        for ((client_id, correlation), remembered) in list {
            // A repeated identity keeps its last answer, and only that
            // answer's expiry stays indexed.
            let probe = Probe::new(client_id.as_bytes(), &correlation);
            table.forget_identity(&probe);
            table.insert(&probe, remembered);
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
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

    /// Small requests are encoded on the stack and large ones into an
    /// allocation; both must give the hash of the wire encoding.
    #[test]
    fn fingerprint_is_the_hash_of_the_encoding_at_every_size() {
        for len in [
            0, 1, 400, 460, 470, 480, 487, 488, 489, 500, 511, 512, 513, 4096, 65536, 1048576,
        ] {
            let command = set_cmd("k", &"v".repeat(len), None, Some(1_000));
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
    fn capacity_evicts_the_soonest_expiring() {
        let mut table = DedupTable::default();
        let applied = Applied::reply(Response::Ok, None);
        for i in 0..CAPACITY as u64 {
            // Reverse order of expiry: entry 0 lives longest.
            table.remember(&id(&i.to_string(), 500_000 - i), 7, &applied, 0);
        }
        assert_eq!(table.len(), CAPACITY);
        table.remember(&id("new", 450_000), 7, &applied, 0);
        assert_eq!(table.len(), CAPACITY);
        let last = (CAPACITY as u64 - 1).to_string();
        assert!(
            table.lookup(&id(&last, 0), 7, 1).is_none(),
            "soonest expiry evicted"
        );
        assert!(table.lookup(&id("0", 0), 7, 1).is_some());
        assert!(table.lookup(&id("new", 0), 7, 1).is_some());
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
    fn serde_round_trip_rebuilds_the_expiry_index() {
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
        assert_eq!(restored.by_expiry.len(), 1);
        restored.prune(10);
        assert_eq!(
            restored.len(),
            1,
            "a stale expiry must not evict the kept answer"
        );
    }

    /// The slab, the hash index and the eviction order describe the same
    /// answers, and the index stays at most half full (a quarter once
    /// sized for good).
    fn assert_consistent(table: &DedupTable) {
        let occupied = table.slots.iter().filter(|s| s.is_some()).count();
        assert_eq!(occupied, table.len());
        assert_eq!(table.by_expiry.len(), table.len());
        assert_eq!(table.vacant.len(), table.slots.len() - occupied);
        for (key, &at) in &table.by_expiry {
            let slot = table
                .slot(at)
                .expect("the expiry order names an empty slot");
            assert_eq!(slot.key, *key);
            let (client_id, correlation) = slot.parts();
            let probe = Probe::new(client_id, correlation);
            assert_eq!(slot.hash, probe.hash);
            assert_eq!(table.position(&probe), Some(at));
        }
        assert!(table.len() * 2 <= table.index.capacity().max(16));
        if table.len() > INDEX_FINAL_AT {
            assert!(table.len() * 4 <= table.index.capacity());
        }
    }

    #[test]
    fn churn_keeps_the_indexes_in_step() {
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
        assert_eq!(table.slots.capacity(), 0);
        assert_consistent(&table);
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
}
