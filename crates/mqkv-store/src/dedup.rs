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
#[path = "dedup_tests.rs"]
mod tests;
