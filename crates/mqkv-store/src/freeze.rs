//! Frozen snapshots: a snapshot of the keyspace as it was at one moment,
//! serialized a piece at a time while the store goes on changing.
//!
//! [`StateMachine::freeze`] notes the moment (under the caller's lock: it
//! copies the configuration and the clock and encodes the de-duplication
//! table, never touching the keys). From then on, the
//! first change to each key records the key's record as it was at the
//! freeze — or its absence — in an undo map. [`StateMachine::frozen_keys`]
//! walks the live keys and the undo map together, in key order, and yields
//! the frozen state of each key: the undo entry where there is one, the
//! live record otherwise. The caller takes its lock around each piece only,
//! so writes go on between pieces. [`StateMachine::thaw`] ends it.
//!
//! Invariants:
//! - a key's undo entry is written once, by its first change after the
//!   freeze, so it holds exactly the frozen state of that key;
//! - every change to the key map goes through `StateMachine::insert`,
//!   `insert_owned` and `remove`, which record the undo entry first;
//! - at most one freeze is under way; each has its own number, and a walk
//!   with another freeze's number (or none) fails rather than mixing two
//!   moments.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};

use mqkv_protocol::HlcClock;
use postcard::ser_flavors::Flavor;
use serde::ser::{Error as _, SerializeSeq};
use serde::{Serialize, Serializer};

use crate::machine::{Key, Record};
use crate::snapshot::{BytesRef, SNAPSHOT_FORMAT};
use crate::{StateMachine, StoreConfig};

/// Keys yielded per piece of a frozen walk: well under a millisecond of
/// work under the caller's lock, even on a busy machine.
pub(crate) const FROZEN_PIECE: usize = 512;

/// Numbers freezes, so a walk can tell its own from a later one.
static FREEZES: AtomicU64 = AtomicU64::new(1);

/// The undo map of a freeze under way, kept in the machine.
#[derive(Default)]
pub(crate) struct FreezeSlot(Option<Box<Undo>>);

struct Undo {
    id: u64,
    /// The frozen state of every key changed since the freeze: its record
    /// then, or `None` if it did not exist.
    before: BTreeMap<Key, Option<Record>>,
}

/// A freeze in progress is not part of the state: machines compare equal
/// whatever their freezes.
impl PartialEq for FreezeSlot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for FreezeSlot {}

/// A copy of a machine is not frozen.
impl Clone for FreezeSlot {
    fn clone(&self) -> Self {
        FreezeSlot(None)
    }
}

impl std::fmt::Debug for FreezeSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(undo) => write!(f, "Frozen({}, {} changed)", undo.id, undo.before.len()),
            None => f.write_str("NotFrozen"),
        }
    }
}

impl FreezeSlot {
    /// Records the frozen state of `key` before its first change since the
    /// freeze; `before` gives it (the record then, or `None`).
    pub(crate) fn before_change(&mut self, key: &[u8], before: impl FnOnce() -> Option<Record>) {
        if let Some(undo) = &mut self.0 {
            if !undo.before.contains_key(key) {
                undo.before.insert(Key::from(key), before());
            }
        }
    }
}

/// What a frozen snapshot holds besides the keys, taken at the freeze.
#[derive(Debug)]
pub struct Frozen {
    id: u64,
    config: StoreConfig,
    clock: HlcClock,
    /// The de-duplication table, encoded at the freeze: it comes last in a
    /// snapshot, and encoding it takes a fraction of the time a copy of it
    /// would (an allocation per remembered answer).
    dedup: Vec<u8>,
    /// The cluster table, encoded at the freeze (it is small).
    meta: Vec<u8>,
    /// The change history, encoded at the freeze (bounded).
    history: Vec<u8>,
    keys: usize,
}

/// Where a walk of frozen keys stands after a piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrozenStep {
    /// Keys after this one remain.
    After(Box<[u8]>),
    /// Every frozen key has been yielded.
    Done,
}

/// What the undo map of a finished freeze held; dropping it frees that
/// memory, best done outside the caller's lock.
pub struct Thawed(#[allow(dead_code)] Option<Box<Undo>>);

impl StateMachine {
    /// Freezes the state as it is now for a snapshot (see the module
    /// documentation). `Ok(None)` if a freeze is already under way.
    pub fn freeze(&mut self) -> postcard::Result<Option<Frozen>> {
        if self.frozen.0.is_some() {
            return Ok(None);
        }
        let dedup = postcard::to_allocvec(&self.dedup)?;
        let meta = postcard::to_allocvec(&self.meta)?;
        let history = postcard::to_allocvec(&self.history)?;
        let id = FREEZES.fetch_add(1, Ordering::Relaxed);
        self.frozen.0 = Some(Box::new(Undo {
            id,
            before: BTreeMap::new(),
        }));
        Ok(Some(Frozen {
            id,
            config: self.config.clone(),
            clock: self.clock.clone(),
            dedup,
            meta,
            history,
            keys: self.keys.len(),
        }))
    }

    /// Ends the freeze `frozen` (if it is the one under way). Changes stop
    /// being recorded.
    pub fn thaw(&mut self, frozen: &Frozen) -> Thawed {
        match &self.frozen.0 {
            Some(undo) if undo.id == frozen.id => Thawed(self.frozen.0.take()),
            _ => Thawed(None),
        }
    }

    /// Whether a freeze is under way.
    pub fn is_frozen(&self) -> bool {
        self.frozen.0.is_some()
    }

    /// Yields, in key order, up to `max` keys of the frozen state that come
    /// after `after` (all of them from the start if `None`), each with its
    /// record as it was at the freeze, to `emit`. Fails if `frozen` is not
    /// the freeze under way.
    pub(crate) fn frozen_keys<E: serde::ser::Error>(
        &self,
        frozen: &Frozen,
        after: Option<&[u8]>,
        max: usize,
        mut emit: impl FnMut(&[u8], &Record) -> Result<(), E>,
    ) -> Result<FrozenStep, E> {
        let undo = match &self.frozen.0 {
            Some(undo) if undo.id == frozen.id => undo,
            _ => {
                return Err(E::custom(
                    "the store was replaced while a snapshot was taken",
                ))
            }
        };
        let range = (
            after.map_or(Bound::Unbounded, Bound::Excluded),
            Bound::Unbounded,
        );
        let mut live = self.keys.range::<[u8], _>(range).peekable();
        let mut before = undo.before.range::<[u8], _>(range).peekable();
        let mut last = None;
        for _ in 0..max {
            let order = match (live.peek(), before.peek()) {
                (None, None) => return Ok(FrozenStep::Done),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((l, _)), Some((u, _))) => l.cmp(u),
            };
            let next = match order {
                std::cmp::Ordering::Less => live.next().map(|(key, record)| (key, Some(&**record))),
                std::cmp::Ordering::Equal => {
                    // Changed since the freeze: the undo entry holds its state then.
                    live.next();
                    before.next().map(|(key, record)| (key, record.as_ref()))
                }
                std::cmp::Ordering::Greater => {
                    before.next().map(|(key, record)| (key, record.as_ref()))
                }
            };
            let Some((key, record)) = next else {
                return Ok(FrozenStep::Done);
            };
            if let Some(record) = record {
                emit(key, record)?;
            }
            last = Some(key);
        }
        Ok(match last {
            Some(key) => FrozenStep::After(key.clone()),
            None => FrozenStep::Done,
        })
    }
}

impl Frozen {
    /// The snapshot of the frozen state, serialized a piece at a time:
    /// `read` must call the closure it is given with the machine, under
    /// the lock that the machine's writers take (and only for that call).
    pub fn snapshot<'a, R>(&'a self, read: &'a R) -> FrozenSnapshot<'a, R>
    where
        R: Fn(&mut dyn FnMut(&StateMachine)),
    {
        FrozenSnapshot {
            frozen: self,
            read,
            piece: FROZEN_PIECE,
        }
    }
}

/// See [`Frozen::snapshot`].
pub struct FrozenSnapshot<'a, R> {
    frozen: &'a Frozen,
    read: &'a R,
    /// Keys per call of `read`.
    piece: usize,
}

impl<R: Fn(&mut dyn FnMut(&StateMachine))> FrozenSnapshot<'_, R> {
    /// Writes the snapshot to `flavor`: the bytes the machine itself
    /// serialized to (with postcard) at the freeze.
    pub fn write<F: Flavor>(&self, flavor: F) -> postcard::Result<F::Output> {
        let mut out = postcard::Serializer { output: flavor };
        // The fields of the snapshot in their order; postcard writes a
        // struct as its fields one after the other, as it does a tuple.
        (SNAPSHOT_FORMAT, &self.frozen.config, &self.frozen.clock).serialize(&mut out)?;
        FrozenKeys(self).serialize(&mut out)?;
        out.output.try_extend(&self.frozen.dedup)?;
        out.output.try_extend(&self.frozen.meta)?;
        out.output.try_extend(&self.frozen.history)?;
        out.output.finalize()
    }
}

struct FrozenKeys<'a, 'b, R>(&'a FrozenSnapshot<'b, R>);

impl<R: Fn(&mut dyn FnMut(&StateMachine))> Serialize for FrozenKeys<'_, '_, R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let frozen = self.0.frozen;
        let mut seq = serializer.serialize_seq(Some(frozen.keys))?;
        let mut after: Option<Box<[u8]>> = None;
        let mut yielded = 0usize;
        loop {
            let mut step = Err(S::Error::custom("the snapshot's reader did not run"));
            (self.0.read)(&mut |machine| {
                step =
                    machine.frozen_keys(frozen, after.as_deref(), self.0.piece, |key, record| {
                        yielded += 1;
                        if yielded > frozen.keys {
                            return Err(S::Error::custom("more keys than were frozen"));
                        }
                        seq.serialize_element(&(BytesRef(key), record))
                    });
            });
            match step? {
                FrozenStep::After(key) => after = Some(key),
                FrozenStep::Done => break,
            }
        }
        if yielded != frozen.keys {
            return Err(S::Error::custom(format_args!(
                "{yielded} keys yielded of {} frozen",
                frozen.keys
            )));
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_support::*;
    use crate::{Entry, Op};
    use mqkv_protocol::{Command, Hlc};
    use std::cell::{Cell, RefCell};

    /// A small deterministic generator (xorshift), so a failing seed can be rerun.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Keys spread over the whole key order, some with deadlines or fencing tokens.
    fn populated(keys: u64) -> StateMachine {
        let mut m = machine();
        for i in 0..keys {
            let key = format!("k{:04}", i * 3);
            let command = set_cmd(&key, &format!("v{i}"), None, (i % 5 == 0).then_some(500));
            let ft = (i % 7 == 0).then(|| Hlc::new(50, 0, "fence"));
            m.apply(&entry(100, command, ft));
        }
        m.apply(&deduped(100, Command::Del { key: b("k0003") }, "corr"));
        m.apply(&Entry {
            now_ms: 100,
            op: Op::Meta(vec![crate::MetaChange::put(&b"o/a"[..], &b"1"[..])]),
        });
        m
    }

    /// One random change: SETs and DELs of keys already yielded, not yet yielded, new
    /// and absent, some remembered for de-duplication, and expiries.
    fn change(m: &mut StateMachine, rng: &mut Rng, now: u64) {
        let key = format!("k{:04}", rng.below(1_000));
        let e = match rng.below(7) {
            0 | 1 => entry(now, set_cmd(&key, &format!("w{now}"), None, None), None),
            2 => entry(
                now,
                set_cmd(&key, "short", None, Some(1 + rng.below(50))),
                None,
            ),
            3 => entry(now, Command::Del { key: b(&key) }, None),
            4 => deduped(now, Command::Del { key: b(&key) }, &format!("c{now}")),
            5 => Entry {
                now_ms: now,
                op: Op::Meta(vec![crate::MetaChange::put(
                    bytes::Bytes::from(format!("o/{}", rng.below(3))),
                    bytes::Bytes::from(format!("{now}")),
                )]),
            },
            _ => Entry {
                now_ms: now,
                op: Op::ExpireDue,
            },
        };
        m.apply(&e);
    }

    /// Serializes `frozen` of `machine` in pieces of `piece` keys, applying `per_piece`
    /// random changes before each piece.
    fn serialize_while_changing(
        machine: &RefCell<StateMachine>,
        frozen: &Frozen,
        piece: usize,
        per_piece: u64,
        seed: u64,
    ) -> Result<Vec<u8>, postcard::Error> {
        let rng = RefCell::new(Rng(seed));
        let now = Cell::new(1_000);
        let read = |f: &mut dyn FnMut(&StateMachine)| {
            for _ in 0..per_piece {
                now.set(now.get() + 1);
                change(&mut machine.borrow_mut(), &mut rng.borrow_mut(), now.get());
            }
            f(&machine.borrow());
        };
        let snapshot = FrozenSnapshot {
            frozen,
            read: &read,
            piece,
        };
        snapshot.write(postcard::ser_flavors::AllocVec::new())
    }

    #[test]
    fn a_frozen_snapshot_holds_the_state_of_its_moment() {
        for seed in 1..=60u64 {
            let mut m = populated(300);
            let expected = postcard::to_allocvec(&m).unwrap();
            let at_freeze = m.clone();
            let frozen = m.freeze().unwrap().expect("not frozen yet");
            let machine = RefCell::new(m);
            let piece = 1 + (seed % 9) as usize;
            let bytes = serialize_while_changing(&machine, &frozen, piece, 1 + seed % 4, seed)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(bytes, expected, "seed {seed}: not the state at the freeze");
            let restored: StateMachine = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(restored, at_freeze);
            assert_indexes_consistent(&restored);
            let mut m = machine.into_inner();
            assert_ne!(m, at_freeze, "seed {seed}: the machine went on changing");
            drop(m.thaw(&frozen));
            assert!(!m.is_frozen());
            assert_indexes_consistent(&m);
        }
    }

    #[test]
    fn a_frozen_snapshot_of_an_unchanged_machine_is_its_snapshot() {
        let mut m = populated(50);
        let expected = postcard::to_allocvec(&m).unwrap();
        let frozen = m.freeze().unwrap().expect("not frozen yet");
        let machine = RefCell::new(m);
        let bytes = serialize_while_changing(&machine, &frozen, FROZEN_PIECE, 0, 1).unwrap();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn one_freeze_at_a_time_and_a_walk_needs_its_own() {
        let mut m = populated(20);
        let first = m.freeze().unwrap().expect("not frozen yet");
        assert!(
            m.freeze().unwrap().is_none(),
            "a second freeze while one is under way"
        );
        drop(m.thaw(&first));
        let second = m.freeze().unwrap().expect("thawed");
        // A stale freeze does not end the one under way, and cannot walk it.
        drop(m.thaw(&first));
        assert!(m.is_frozen());
        let machine = RefCell::new(m);
        assert!(serialize_while_changing(&machine, &first, 4, 0, 1).is_err());
        assert!(serialize_while_changing(&machine, &second, 4, 0, 1).is_ok());
        let mut m = machine.into_inner();
        drop(m.thaw(&second));
        assert!(!m.is_frozen());
    }

    #[test]
    fn changes_after_a_thaw_are_not_recorded() {
        let mut m = populated(20);
        let frozen = m.freeze().unwrap().expect("not frozen yet");
        put(&mut m, 200, "k0006", "changed");
        assert!(format!("{:?}", m.frozen).contains("1 changed"));
        drop(m.thaw(&frozen));
        put(&mut m, 300, "k0003", "again");
        assert_eq!(format!("{:?}", m.frozen), "NotFrozen");
        // A copy of a frozen machine is not frozen, and equality ignores freezes.
        let frozen = m.freeze().unwrap().expect("thawed");
        let copy = m.clone();
        assert!(!copy.is_frozen());
        assert_eq!(copy, m);
        drop(m.thaw(&frozen));
    }
}
