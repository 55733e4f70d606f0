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
//!   oldest answer is forgotten first. A redelivery follows its original
//!   within the client's timeout, so the newest answers are the ones worth
//!   keeping;
//! - answers are forgotten in the order they were remembered, expired ones
//!   too: an expired answer behind one that lives longer waits for it (it
//!   is never returned, and still counts towards [`CAPACITY`]);
//! - only writes are remembered: reads are idempotent, and not caching GET
//!   values keeps the table small;
//! - an answer is repeated only for the same request: the identity (client
//!   id, correlation data) must match and so must a fingerprint of the
//!   command, so a client that reuses correlation data for a different
//!   command gets that command executed, not an unrelated earlier answer.
//!   The new answer takes the old one's place in the order;
//! - the order is the same on every replica, restored or not: a snapshot
//!   lists the answers in it and a restore keeps it.
//!
//! Every write looks its identity up and, with the table full, remembers
//! one answer and forgets another, so the layout is chosen for few cache
//! misses: the answers sit in a ring in the order they are forgotten (the
//! next one to forget lies beside the last one forgotten), an identity
//! short enough is stored in its answer's slot, and the hash
//! index is an open-addressing table of 8-byte entries with no tombstones,
//! whose entry for the next answer to forget is fetched ahead.

use std::collections::VecDeque;

use bytes::Bytes;
use mqkv_protocol::{Hlc, Response};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::snapshot::BytesRef;
use crate::{Applied, DedupId};

/// Most answers remembered at once.
pub const CAPACITY: usize = 100_000;

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

/// Identities up to this long (4 bytes of length, client id, correlation
/// data) are stored in their slot: a 16-byte correlation (a UUID, as the
/// SDKs send) with a client id of up to 36 bytes.
const INLINE: usize = 56;

/// The client id's length as 4 bytes, the client id, the correlation data:
/// a copy (a slice of the request would keep its whole read buffer alive
/// for as long as the answer is remembered).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<[u8]>),
}

impl Identity {
    fn bytes(&self) -> &[u8] {
        match self {
            Identity::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Identity::Heap(bytes) => bytes,
        }
    }
}

/// One remembered answer and whose it is.
#[derive(Debug, Clone)]
struct Slot {
    /// [`identity_hash`] of the identity.
    hash: u64,
    identity: Identity,
    remembered: Remembered,
}

impl Slot {
    fn parts(&self) -> (&[u8], &[u8]) {
        let (len, rest) = self.identity.bytes().split_at(4);
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        rest.split_at(len.min(rest.len()))
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

    fn identity(&self) -> Identity {
        // Client ids are MQTT strings: at most 65,535 bytes.
        let len = u32::try_from(self.client_id.len()).unwrap_or(u32::MAX);
        let total = 4 + self.client_id.len() + self.correlation.len();
        if total <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..4].copy_from_slice(&len.to_le_bytes());
            bytes[4..4 + self.client_id.len()].copy_from_slice(self.client_id);
            bytes[4 + self.client_id.len()..total].copy_from_slice(self.correlation);
            // INLINE fits in a byte.
            let len = u8::try_from(total).unwrap_or(u8::MAX);
            return Identity::Inline { len, bytes };
        }
        let mut bytes = Vec::with_capacity(total);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(self.client_id);
        bytes.extend_from_slice(self.correlation);
        Identity::Heap(bytes.into_boxed_slice())
    }
}

/// Where an identity goes in the hash index. Held in memory only (rebuilt
/// on load) and never observable (the order of the answers is their own),
/// so it is seeded per process: correlation data comes from clients, and
/// identities crafted to collide under a known seed would turn every lookup
/// into a walk of the whole table.
fn identity_hash(client_id: &[u8], correlation: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u64));
    let client = xxhash_rust::xxh3::xxh3_64_with_seed(client_id, seed);
    xxhash_rust::xxh3::xxh3_64_with_seed(correlation, client)
}

/// Asks the CPU to start loading the cache line at `at`; reads nothing.
#[inline(always)]
fn prefetch<T>(at: *const T) {
    // SAFETY: a prefetch is a hint: it neither faults nor reads memory the
    // program can observe, whatever the address; SSE is part of x86_64.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The hash index: an open-addressing table (linear probing) from an
/// identity's hash to its answer's number. An entry is 0 when empty, else
/// bit 63 set, the low 31 bits of the hash (which give the entry's home, and
/// past the table's size rule out most mismatches without reading a slot)
/// and the low 32 bits of the answer's number (the ring never holds 2^32
/// answers, so they name one). Deleting shifts the entries after it back
/// (no tombstones), so the table never needs rebuilding to clear them; at
/// most half full, probes stay short.
#[derive(Debug, Clone, Default)]
struct Index {
    entries: Vec<u64>,
    len: usize,
}

const USED: u64 = 1 << 63;

const LOW_31: u64 = 0x7FFF_FFFF;

fn entry_of(hash: u64, number: u64) -> u64 {
    USED | ((hash & LOW_31) << 32) | (number & 0xFFFF_FFFF)
}

impl Index {
    fn mask(&self) -> usize {
        self.entries.len().wrapping_sub(1)
    }

    /// Where probing for `hash` starts. Tables are smaller than 2^31
    /// entries, so the bits kept in an entry give it too.
    fn home(&self, hash: u64) -> usize {
        (hash & LOW_31) as usize & self.mask()
    }

    /// Positions probed for `hash`, from its home, until an empty entry.
    fn probe(&self, hash: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
        let mask = self.mask();
        let mut at = self.home(hash);
        std::iter::from_fn(move || {
            let entry = *self.entries.get(at)?;
            (entry != 0).then(|| {
                let here = at;
                at = (at + 1) & mask;
                (here, entry)
            })
        })
    }

    /// The low 32 bits of the numbers of the answers whose hash might be
    /// `hash`.
    fn candidates(&self, hash: u64) -> impl Iterator<Item = u32> + '_ {
        let tag = entry_of(hash, 0);
        self.probe(hash)
            .filter(move |(_, entry)| entry & !0xFFFF_FFFF == tag)
            .map(|(_, entry)| entry as u32)
    }

    fn prefetch(&self, hash: u64) {
        if !self.entries.is_empty() {
            prefetch(self.entries.as_ptr().wrapping_add(self.home(hash)));
        }
    }

    /// Adds an entry; the caller has made room ([`Index::reserve_one`]).
    fn insert(&mut self, hash: u64, number: u64) {
        let mask = self.mask();
        let mut at = self.home(hash);
        while self.entries[at] != 0 {
            at = (at + 1) & mask;
        }
        self.entries[at] = entry_of(hash, number);
        self.len += 1;
    }

    /// Removes the entry for answer `number`, whose identity hash is `hash`.
    fn remove(&mut self, hash: u64, number: u64) {
        let wanted = entry_of(hash, number);
        let Some((mut hole, _)) = self.probe(hash).find(|&(_, entry)| entry == wanted) else {
            return;
        };
        self.len -= 1;
        // Move back each later entry of the run that may sit at the hole:
        // one whose home is not between the hole and where it sits.
        let mask = self.mask();
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let entry = self.entries[at];
            if entry == 0 {
                break;
            }
            let home = self.home(entry >> 32);
            let distance_home = at.wrapping_sub(home) & mask;
            let distance_hole = at.wrapping_sub(hole) & mask;
            if distance_home >= distance_hole {
                self.entries[hole] = entry;
                hole = at;
            }
        }
        self.entries[hole] = 0;
    }

    /// Makes room for one more entry: doubles (rebuilding from `hashes`,
    /// each answer's number and hash) once the table would be over half
    /// full. A full table of answers fits in 2^18 entries (2 MiB), reached
    /// at 65,537 answers, after which it no longer grows.
    fn reserve_one(&mut self, hashes: impl Iterator<Item = (u64, u64)>) {
        if (self.len + 1) * 2 <= self.entries.len() {
            return;
        }
        let size = (self.entries.len() * 2).max(32);
        *self = Index {
            entries: vec![0; size],
            len: 0,
        };
        for (number, hash) in hashes {
            self.insert(hash, number);
        }
    }
}

/// The remembered answers, oldest first, and a hash index over them by
/// identity. Answers are numbered in the order they were remembered: the
/// one at the front of the ring is number `first`.
#[derive(Debug, Clone, Default)]
pub(crate) struct DedupTable {
    ring: VecDeque<Slot>,
    first: u64,
    index: Index,
}

/// Equal when the same answers are remembered in the same order (the
/// numbering itself may differ: a restored table starts again from 0).
impl PartialEq for DedupTable {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .ring
                .iter()
                .zip(&other.ring)
                .all(|(a, b)| a.identity == b.identity && a.remembered == b.remembered)
    }
}

impl Eq for DedupTable {}

impl DedupTable {
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Where in the ring the answer to this identity is, if remembered:
    /// its number (whose low 32 bits the index gives) less `first`.
    fn position(&self, probe: &Probe<'_>) -> Option<usize> {
        self.index
            .candidates(probe.hash)
            .map(|low| low.wrapping_sub(self.first as u32) as usize)
            .find(|&at| self.ring.get(at).is_some_and(|slot| slot.is(probe)))
    }

    /// Forgets the oldest answer.
    fn pop_front(&mut self) {
        let Some(slot) = self.ring.pop_front() else {
            return;
        };
        self.index.remove(slot.hash, self.first);
        self.first += 1;
        match self.ring.front() {
            // The entry the next pop removes, fetched while the caller goes on.
            Some(next) => self.index.prefetch(next.hash),
            // Give the memory of a burst back once it has all gone.
            None => {
                *self = DedupTable {
                    first: self.first,
                    ..DedupTable::default()
                }
            }
        }
    }

    /// Forgets the oldest answers while they have expired at `now_ms`.
    pub(crate) fn prune(&mut self, now_ms: u64) {
        while self
            .ring
            .front()
            .is_some_and(|slot| slot.remembered.expires_at_ms <= now_ms)
        {
            self.pop_front();
        }
    }

    /// Remembers an answer: in the place of the earlier answer to the same
    /// identity, `earlier` (from [`Self::position`]), if there is one, else
    /// as the newest.
    fn insert(&mut self, probe: &Probe<'_>, earlier: Option<usize>, remembered: Remembered) {
        if let Some(slot) = earlier.and_then(|at| self.ring.get_mut(at)) {
            slot.remembered = remembered;
            return;
        }
        let ring = &self.ring;
        let first = self.first;
        self.index
            .reserve_one((first..).zip(ring.iter().map(|slot| slot.hash)));
        let number = self.first + self.ring.len() as u64;
        self.index.insert(probe.hash, number);
        self.ring.push_back(Slot {
            hash: probe.hash,
            identity: probe.identity(),
            remembered,
        });
    }

    /// Starts loading the part of the hash index where [`Self::find`] will
    /// look for this identity: the index is megabytes, read at random, and a
    /// proposal's entries can have theirs on the way together.
    pub(crate) fn prefetch(&self, id: &DedupId) {
        self.index
            .prefetch(identity_hash(id.client_id.as_bytes(), &id.correlation));
    }

    /// Looks a request's identity up once, for both [`Self::answer`] and
    /// [`Self::remember_found`].
    pub(crate) fn find(&self, id: &DedupId) -> Found {
        let probe = Probe::new(id.client_id.as_bytes(), &id.correlation);
        Found {
            hash: probe.hash,
            at: self.position(&probe),
        }
    }

    /// The first answer to the request `found` is of, if remembered and not
    /// expired, and for the same command.
    pub(crate) fn answer(&self, found: &Found, fingerprint: u64, now_ms: u64) -> Option<Applied> {
        let remembered = &self.ring.get(found.at?)?.remembered;
        (remembered.expires_at_ms > now_ms && remembered.fingerprint == fingerprint)
            .then(|| Applied::reply(remembered.response.clone(), remembered.version.clone()))
    }

    /// The first answer to the request with this identity, if remembered
    /// and not expired.
    #[cfg(test)]
    pub(crate) fn lookup(&self, id: &DedupId, fingerprint: u64, now_ms: u64) -> Option<Applied> {
        self.answer(&self.find(id), fingerprint, now_ms)
    }

    /// Remembers the answer to a request.
    #[cfg(test)]
    pub(crate) fn remember(
        &mut self,
        id: &DedupId,
        fingerprint: u64,
        applied: &Applied,
        now_ms: u64,
    ) {
        let found = self.find(id);
        self.remember_found(id, found, fingerprint, applied, now_ms);
    }

    /// Remembers the answer to the request `found` is of. The table must not
    /// have changed since [`Self::find`] gave `found`.
    pub(crate) fn remember_found(
        &mut self,
        id: &DedupId,
        found: Found,
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
        let probe = Probe {
            hash: found.hash,
            client_id: id.client_id.as_bytes(),
            correlation: &id.correlation,
        };
        let remembered = Remembered {
            expires_at_ms,
            fingerprint,
            response: applied.response.clone(),
            version: applied.version.clone(),
        };
        if found.at.is_none() && self.len() >= CAPACITY {
            self.pop_front();
        }
        self.insert(&probe, found.at, remembered);
    }
}

/// Where a request's identity is in a [`DedupTable`], found once for both
/// answering a redelivery and remembering a first answer: its hash, and
/// its answer's place in the ring if there is one.
pub(crate) struct Found {
    hash: u64,
    at: Option<usize>,
}

/// Longest encoding (as [`mqkv_protocol::Command::encoded_len_bound`] bounds
/// it) that [`fingerprint`] encodes into the thread's kept buffer.
const FINGERPRINT_KEPT: usize = 4096;

/// A stable 64-bit fingerprint of a request: XXH3-64 (seed 0) over its wire
/// encoding, the same on every replica and across versions, unlike `std`'s
/// hasher, and fast enough for large values (the byte-at-a-time FNV-1a it
/// replaced cost about 1 µs per KiB on the apply path). Answers remembered
/// by a version that used FNV-1a no longer match after an upgrade: their
/// requests, if redelivered within the retention, run again.
///
/// Computed on the apply path of every write, so a request whose encoding
/// fits is encoded into a buffer the thread keeps (no allocation, and no
/// zeroing first), and a larger one is hashed piece by piece as it would be
/// encoded, its value where it lies: neither is copied into an allocation
/// of its own.
pub(crate) fn fingerprint(command: &mqkv_protocol::Command) -> u64 {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> =
            std::cell::RefCell::new(Vec::with_capacity(FINGERPRINT_KEPT));
    }
    if command.encoded_len_bound() <= FINGERPRINT_KEPT {
        let hashed = BUF.with(|buf| {
            let mut buf = buf.try_borrow_mut().ok()?;
            buf.clear();
            command.encode_into(&mut *buf);
            Some(xxhash_rust::xxh3::xxh3_64(&buf))
        });
        if let Some(hash) = hashed {
            return hash;
        }
    }
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    command.encode_pieces(|piece| hasher.update(piece));
    hasher.digest()
}

/// Serialized as a flat list of `((client id, correlation data), answer)`,
/// oldest first; the index is rebuilt on load so it can never disagree with
/// the list in a snapshot.
impl Serialize for DedupTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeSeq};
        let mut list = serializer.serialize_seq(Some(self.len()))?;
        for slot in &self.ring {
            let (client_id, correlation) = slot.parts();
            let client_id = std::str::from_utf8(client_id).map_err(S::Error::custom)?;
            list.serialize_element(&((client_id, BytesRef(correlation)), &slot.remembered))?;
        }
        list.end()
    }
}

impl<'de> Deserialize<'de> for DedupTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let list: Vec<((String, Bytes), Remembered)> = Vec::deserialize(deserializer)?;
        let mut table = DedupTable::default();
        for ((client_id, correlation), remembered) in list {
            // A repeated identity keeps its last answer, in its first place.
            let probe = Probe::new(client_id.as_bytes(), &correlation);
            let earlier = table.position(&probe);
            table.insert(&probe, earlier, remembered);
        }
        // A list longer than the table holds keeps its newest answers.
        while table.len() > CAPACITY {
            table.pop_front();
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
}
