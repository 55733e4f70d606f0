//! The state machine: the keyspace, its indexes, and the dispatch of
//! entries to the per-verb modules.
//!
//! Invariants (kept by routing every change through [`StateMachine::insert`]
//! and [`StateMachine::remove`]):
//! - during a freeze, a key's state at the freeze is recorded before its
//!   first change (see `freeze`);
//! - the expiry index holds exactly one `(deadline, key)` for every key that
//!   has a deadline, and nothing else;
//! - `stored_bytes` is the sum of key and value lengths over all keys;
//! - every version is issued by the one [`HlcClock`]: above the key's last
//!   version and the request's `__ts` (a counter above 0 only when the key
//!   itself was written in the same millisecond), and, for a key created anew,
//!   above every version issued before — so a deleted and recreated key (a
//!   lease taken by a new holder) never repeats a version, and a fencing token
//!   of an earlier holder stays below the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU64;
use std::sync::Arc;

use bytes::Bytes;
use mqkv_protocol::{Command, ErrorKind, Hlc, HlcClock, Response};
use serde::{Deserialize, Serialize};

use crate::dedup::DedupTable;
use crate::freeze::FreezeSlot;
use crate::meta::MetaTable;
use crate::set::SetArgs;
use crate::{validate, Applied, ChangeEvent, ChangeKind, Entry, Op, Request, StoreConfig};

/// A stored key: its own allocation of exactly its length, never a slice
/// of the request that carried it (which would keep the whole request, and
/// the read buffer around it, alive).
pub(crate) type Key = Box<[u8]>;

/// A stored value: an exact-size copy, shared (not copied) with a snapshot
/// that is being written while the store goes on.
pub(crate) type Value = Arc<[u8]>;

/// What is stored for one key. Kept boxed in the key map, so the map's
/// nodes hold only two pointers per key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// An exact-size copy of the value.
    #[serde(with = "crate::snapshot::shared_bytes")]
    pub(crate) value: Value,
    /// Version of the last SET; what GET returns as `__ts`.
    pub(crate) version: Hlc,
    /// Fencing token protecting the key, if any.
    pub(crate) fencing_token: Option<Box<Hlc>>,
    /// Unix ms at or after which the key no longer exists.
    pub(crate) expires_at_ms: Option<NonZeroU64>,
}

impl Record {
    /// A key whose deadline has passed behaves as absent for every command,
    /// even before an `ExpireDue` entry removes it.
    pub(crate) fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms
            .is_none_or(|deadline| deadline.get() > now_ms)
    }
}

/// Bytes a key occupies for the `max_bytes` quota.
pub(crate) fn footprint(key: &[u8], value: &[u8]) -> u64 {
    // usize -> u64 is lossless on every supported target.
    key.len() as u64 + value.len() as u64
}

/// The deterministic state store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachine {
    pub(crate) config: StoreConfig,
    pub(crate) clock: HlcClock,
    pub(crate) keys: BTreeMap<Key, Box<Record>>,
    /// `(deadline, key)`, ordered so the next deadline is the first entry.
    pub(crate) expiry: BTreeSet<(u64, Key)>,
    pub(crate) stored_bytes: u64,
    pub(crate) dedup: DedupTable,
    pub(crate) meta: MetaTable,
    /// The recent changes, for watches that resume (see `history`).
    pub(crate) history: crate::history::History,
    /// The undo map of a snapshot being taken piecewise (see `freeze`).
    pub(crate) frozen: FreezeSlot,
}

impl StateMachine {
    /// An empty store.
    pub fn new(config: StoreConfig) -> Self {
        let clock = HlcClock::new(config.node_id.clone());
        StateMachine {
            config,
            clock,
            keys: BTreeMap::new(),
            expiry: BTreeSet::new(),
            stored_bytes: 0,
            dedup: DedupTable::default(),
            meta: MetaTable::default(),
            history: crate::history::History::default(),
            frozen: FreezeSlot::default(),
        }
    }

    /// Rebuilds the derived indexes around restored parts.
    pub(crate) fn from_parts(
        config: StoreConfig,
        clock: HlcClock,
        keys: Vec<(Key, Record)>,
        dedup: DedupTable,
        meta: MetaTable,
        mut history: crate::history::History,
    ) -> Self {
        history.recount();
        let mut machine = StateMachine {
            config,
            clock,
            keys: BTreeMap::new(),
            expiry: BTreeSet::new(),
            stored_bytes: 0,
            dedup,
            meta,
            history,
            frozen: FreezeSlot::default(),
        };
        let own_node = machine.clock.current().node_id;
        for (key, mut record) in keys {
            // Versions issued by this clock share its node id again.
            if record.version.node_id == own_node {
                record.version.node_id = own_node.clone();
            }
            machine.insert_owned(key, record);
        }
        machine
    }

    /// The configuration the store applies entries under.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The limits currently applied.
    pub fn limits(&self) -> crate::Limits {
        crate::Limits {
            max_keys: self.config.max_keys,
            max_bytes: self.config.max_bytes,
            scan_page_size: self.config.scan_page_size,
        }
    }

    /// The server clock; its last value is the highest version issued.
    pub fn clock(&self) -> &HlcClock {
        &self.clock
    }

    /// Number of stored keys, including keys past their deadline that no
    /// `ExpireDue` entry has removed yet (they count against quotas too).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True if no key is stored.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Sum of key and value lengths over all stored keys.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes
    }

    /// Whether [`Self::snapshot_copy`] is much cheaper than serializing the
    /// state: when values are large, copying the keys and sharing the values
    /// takes a fraction of the time that copying the values' bytes does.
    pub fn snapshot_copy_pays(&self) -> bool {
        const MIN_MEAN_VALUE: u64 = 512;
        self.stored_bytes > MIN_MEAN_VALUE.saturating_mul(self.keys.len() as u64)
    }

    /// What a snapshot of the state holds, with the values shared rather
    /// than copied: it serializes exactly as the machine does, so it can be
    /// serialized after the machine has moved on.
    pub fn snapshot_copy(&self) -> crate::snapshot::SnapshotCopy {
        crate::snapshot::SnapshotCopy::of(self)
    }

    /// About how many bytes a snapshot of this machine takes, erring high:
    /// keys and values plus a record's versions, tokens and deadline, and
    /// each remembered answer with its identity.
    pub fn snapshot_size_hint(&self) -> u64 {
        const PER_KEY: u64 = 64;
        const PER_ANSWER: u64 = 96;
        self.stored_bytes
            .saturating_add(PER_KEY.saturating_mul(self.keys.len() as u64))
            .saturating_add(PER_ANSWER.saturating_mul(self.dedup.len() as u64))
            .saturating_add(self.meta.bytes())
            .saturating_add(PER_KEY.saturating_mul(self.meta.len() as u64))
            .saturating_add(self.history.size_hint())
    }

    /// The cluster table's record under `key`.
    pub fn meta(&self, key: &[u8]) -> Option<&Bytes> {
        self.meta.get(key)
    }

    /// The cluster table's records whose key starts with `prefix`, in key
    /// order.
    pub fn meta_prefixed<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Bytes, &'a Bytes)> + 'a {
        self.meta.prefixed(prefix)
    }

    /// Number of records in the cluster table.
    pub fn meta_len(&self) -> usize {
        self.meta.len()
    }

    /// Number of remembered answers for de-duplication.
    pub fn dedup_len(&self) -> usize {
        self.dedup.len()
    }

    /// The fencing token protecting a live key.
    pub fn fencing_token(&self, key: &[u8], now_ms: u64) -> Option<&Hlc> {
        self.live(key, now_ms)?.fencing_token.as_deref()
    }

    /// The deadline of a live key, if it has one.
    pub fn expires_at_ms(&self, key: &[u8], now_ms: u64) -> Option<u64> {
        self.live(key, now_ms)?.expires_at_ms.map(NonZeroU64::get)
    }

    /// Starts loading each write's identity in the redelivery table's index
    /// (megabytes, read at random), so that applying `entries` in turn finds
    /// it in the cache. Changes nothing.
    pub fn prefetch(&self, entries: &[Entry]) {
        for entry in entries {
            if let Some(id) = remembered_as(&entry.op) {
                self.dedup.prefetch(id);
            }
        }
    }

    /// Applies one log entry. Reads no clock: time is `entry.now_ms`.
    pub fn apply(&mut self, entry: &Entry) -> Applied {
        let applied = self.apply_op(entry);
        if !applied.events.is_empty() {
            self.history.record(&applied.events, entry.now_ms);
        }
        applied
    }

    /// The changes of `key` after version `after`, oldest first, for a watch that resumes;
    /// [`crate::Compacted`] when the history no longer holds them all.
    pub fn history_since(
        &self,
        key: &[u8],
        after: &Hlc,
    ) -> Result<Vec<crate::ChangeEvent>, crate::Compacted> {
        self.history.since(key, after)
    }

    /// The changes after version `after` of the keys `wanted` picks (a pattern watch that
    /// resumes), oldest first.
    pub fn history_since_where(
        &self,
        after: &Hlc,
        wanted: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<crate::ChangeEvent>, crate::Compacted> {
        self.history.since_where(after, wanted)
    }

    /// How much change history is kept.
    pub fn history_limits(&self) -> crate::HistoryLimits {
        self.history.limits()
    }

    fn apply_op(&mut self, entry: &Entry) -> Applied {
        let now = entry.now_ms;
        self.dedup.prune(now);
        match &entry.op {
            Op::SetHistory(limits) => {
                self.history.set_limits(*limits, now);
                Applied::reply(Response::Ok, None)
            }
            Op::ExpireDue => self.apply_expire_due(now),
            Op::SetLimits(limits) => {
                self.config.max_keys = limits.max_keys;
                self.config.max_bytes = limits.max_bytes;
                self.config.scan_page_size = limits.scan_page_size;
                Applied::reply(Response::Ok, None)
            }
            Op::Meta(changes) => {
                self.meta.apply(changes);
                Applied::reply(Response::Ok, None)
            }
            Op::Request(request) => {
                let Some(id) = remembered_as(&entry.op) else {
                    return self.apply_request(request, now);
                };
                let fingerprint = crate::dedup::fingerprint(&request.command);
                let found = self.dedup.find(id);
                if let Some(first) = self.dedup.answer(&found, fingerprint, now) {
                    return first;
                }
                // The request leaves the table as it is, so `found` still holds.
                let applied = self.apply_request(request, now);
                self.dedup
                    .remember_found(id, found, fingerprint, &applied, now);
                applied
            }
        }
    }

    fn apply_request(&mut self, request: &Request, now: u64) -> Applied {
        if let Err(kind) = validate(request, now) {
            return Applied::error(kind);
        }
        match &request.command {
            Command::Set {
                key,
                value,
                condition,
                px_ms,
            } => {
                let set = SetArgs {
                    key,
                    value,
                    condition: condition.as_ref(),
                    px_ms: *px_ms,
                };
                self.apply_set(request, &set, now)
            }
            Command::Del { key } => self.apply_del(request, key, None, now),
            Command::DelIfVersion { key, version } => {
                self.apply_del(request, key, Some(version), now)
            }
            Command::MGet { keys } => Applied::reply(self.mget(keys, now), None),
            Command::VDel { key, value } => self.apply_vdel(request, key, value, now),
            Command::Get { key } => match self.get(key, now) {
                Some((value, version)) => Applied::reply(Response::Value(value), Some(version)),
                None => Applied::reply(Response::Nil, None),
            },
            Command::Scan { pattern, token } => {
                Applied::reply(self.scan(pattern, token.as_deref(), now), None)
            }
            // Observer registrations belong to the node the observer is
            // connected to and are never replicated. Answering here would
            // claim a registration that nobody made, so refuse loudly.
            Command::KeyNotify { .. }
            | Command::KeyNotifyPattern { .. }
            | Command::KeyNotifySince { .. }
            | Command::KeyNotifyPatternSince { .. } => Applied::error(ErrorKind::UnknownCommand),
        }
    }

    /// The record of a key that exists at `now_ms`.
    pub(crate) fn live(&self, key: &[u8], now_ms: u64) -> Option<&Record> {
        self.keys
            .get(key)
            .map(|record| &**record)
            .filter(|record| record.is_live(now_ms))
    }

    /// Stores `record` under `key`, replacing any previous one, and keeps
    /// the indexes in step. A key already stored keeps its key and record
    /// allocations: one B-tree walk.
    pub(crate) fn insert(&mut self, key: &[u8], record: Record) {
        if let Err(record) = self.replace(key, record) {
            self.insert_new(Key::from(key), record);
        }
    }

    /// [`StateMachine::insert`] with a key already allocated.
    pub(crate) fn insert_owned(&mut self, key: Key, record: Record) {
        if let Err(record) = self.replace(&key, record) {
            self.insert_new(key, record);
        }
    }

    /// Replaces the record of a stored key; gives the record back if the
    /// key is not stored.
    fn replace(&mut self, key: &[u8], record: Record) -> Result<(), Record> {
        let Some(old) = self.keys.get_mut(key) else {
            return Err(record);
        };
        overwrite(
            key,
            old,
            record,
            &mut self.expiry,
            &mut self.frozen,
            &mut self.stored_bytes,
        );
        Ok(())
    }

    fn insert_new(&mut self, key: Key, record: Record) {
        self.frozen.before_change(&key, || None);
        if let Some(deadline) = record.expires_at_ms {
            self.expiry.insert((deadline.get(), key.clone()));
        }
        self.stored_bytes += footprint(&key, &record.value);
        self.keys.insert(key, Box::new(record));
    }

    /// Removes a key with its indexes.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Option<Box<Record>> {
        let (key, old) = self.keys.remove_entry(key)?;
        self.frozen
            .before_change(&key, || Some(Record::clone(&old)));
        self.forget_indexes(&key, &old);
        Some(old)
    }

    fn forget_indexes(&mut self, key: &Key, old: &Record) {
        if let Some(deadline) = old.expires_at_ms {
            self.expiry.remove(&(deadline.get(), key.clone()));
        }
        self.stored_bytes -= footprint(key, &old.value);
    }

    /// Deletes `key` and records a DELETE event with a fresh version.
    pub(crate) fn delete_with_event(
        &mut self,
        key: &[u8],
        now: u64,
        request_ts: Option<&Hlc>,
        events: &mut Vec<ChangeEvent>,
    ) -> Option<Hlc> {
        let old = self.remove(key)?;
        let version = self
            .clock
            .next_version_after(now, request_ts, Some(&old.version));
        events.push(ChangeEvent {
            key: Bytes::copy_from_slice(key),
            kind: ChangeKind::Delete,
            version: version.clone(),
        });
        Some(version)
    }
}

/// Replaces the stored record `old` of `key` with `record`, keeping the deadline index, the
/// undo map of a snapshot being taken and the byte count in step. The parts of the store are
/// passed one by one so that a caller holding `old` from the key tree can call it.
pub(crate) fn overwrite(
    key: &[u8],
    old: &mut Record,
    record: Record,
    expiry: &mut BTreeSet<(u64, Key)>,
    frozen: &mut FreezeSlot,
    stored_bytes: &mut u64,
) {
    if old.expires_at_ms != record.expires_at_ms {
        let owned = Key::from(key);
        if let Some(old_deadline) = old.expires_at_ms {
            expiry.remove(&(old_deadline.get(), owned.clone()));
        }
        if let Some(deadline) = record.expires_at_ms {
            expiry.insert((deadline.get(), owned));
        }
    }
    frozen.before_change(key, || Some(Record::clone(old)));
    *stored_bytes -= footprint(key, &old.value);
    *stored_bytes += footprint(key, &record.value);
    *old = record;
}

/// The identity under which the answer to `op` is remembered for
/// redeliveries: a write's with one. Reads are idempotent and not remembered.
fn remembered_as(op: &Op) -> Option<&crate::DedupId> {
    match op {
        Op::Request(request) => request
            .dedup
            .as_ref()
            .filter(|_| request.command.is_write()),
        Op::ExpireDue | Op::SetLimits(_) | Op::Meta(_) | Op::SetHistory(_) => None,
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Helpers shared by the per-verb unit tests.

    use super::*;
    use crate::DedupId;
    use mqkv_protocol::SetCondition;

    pub(crate) fn machine() -> StateMachine {
        StateMachine::new(StoreConfig::new("srv"))
    }

    pub(crate) fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    pub(crate) fn ts(ms: u64) -> Option<Hlc> {
        Some(Hlc::new(ms, 0, "client"))
    }

    pub(crate) fn set_cmd(
        key: &str,
        value: &str,
        condition: Option<SetCondition>,
        px_ms: Option<u64>,
    ) -> Command {
        Command::Set {
            key: b(key),
            value: b(value),
            condition,
            px_ms,
        }
    }

    pub(crate) fn entry(now_ms: u64, command: Command, ft: Option<Hlc>) -> Entry {
        Entry {
            now_ms,
            op: Op::Request(Request {
                command,
                ts: ts(now_ms),
                ft,
                dedup: None,
            }),
        }
    }

    pub(crate) fn deduped(now_ms: u64, command: Command, correlation: &str) -> Entry {
        Entry {
            now_ms,
            op: Op::Request(Request {
                command,
                ts: ts(now_ms),
                ft: None,
                dedup: Some(DedupId {
                    client_id: "client".into(),
                    correlation: b(correlation),
                    expires_at_ms: now_ms + 10_000,
                }),
            }),
        }
    }

    /// SET k v at `now` with no options; asserts it applied.
    pub(crate) fn put(m: &mut StateMachine, now: u64, key: &str, value: &str) -> Hlc {
        let applied = m.apply(&entry(now, set_cmd(key, value, None, None), None));
        assert_eq!(applied.response, Response::Ok);
        applied.version.expect("SET OK carries a version")
    }

    /// Checks the derived indexes against a recomputation from the keys.
    pub(crate) fn assert_indexes_consistent(m: &StateMachine) {
        let bytes: u64 = m.keys.iter().map(|(k, r)| footprint(k, &r.value)).sum();
        assert_eq!(m.stored_bytes, bytes);
        let expiry: BTreeSet<(u64, Key)> = m
            .keys
            .iter()
            .filter_map(|(k, r)| r.expires_at_ms.map(|d| (d.get(), k.clone())))
            .collect();
        assert_eq!(m.expiry, expiry);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    /// Prefetching is a hint: the state is untouched, and the writes (one
    /// a redelivery) are answered as without it.
    #[test]
    fn prefetch_changes_nothing() {
        let batch = [
            deduped(1, set_cmd("a", "1", None, None), "c1"),
            entry(1, Command::Get { key: b("a") }, None),
            deduped(2, set_cmd("a", "1", None, None), "c1"),
            deduped(2, Command::Del { key: b("a") }, "c2"),
        ];
        let (mut plain, mut hinted) = (machine(), machine());
        for _ in 0..2 {
            let before = hinted.clone();
            hinted.prefetch(&batch);
            assert_eq!(hinted, before);
            for entry in &batch {
                assert_eq!(hinted.apply(entry), plain.apply(entry));
            }
        }
        assert_eq!(hinted, plain);
        assert_eq!(hinted.dedup_len(), 2);
    }

    #[test]
    fn insert_and_remove_keep_indexes_in_step() {
        let mut m = machine();
        fn k(key: &str) -> &[u8] {
            key.as_bytes()
        }
        let record = |value: &str, deadline: Option<u64>| Record {
            value: value.as_bytes().into(),
            version: Hlc::new(1, 0, "srv"),
            fencing_token: None,
            expires_at_ms: deadline.and_then(NonZeroU64::new),
        };
        m.insert(k("a"), record("xyz", Some(10)));
        m.insert(k("b"), record("", None));
        assert_eq!(m.stored_bytes(), 5);
        assert_indexes_consistent(&m);
        // Same deadline again, then a different one, then none.
        m.insert(k("a"), record("xy", Some(10)));
        assert_indexes_consistent(&m);
        m.insert(k("a"), record("x", Some(20)));
        assert_indexes_consistent(&m);
        m.insert(k("a"), record("x", None));
        assert_indexes_consistent(&m);
        assert!(m.expiry.is_empty());
        assert!(m.remove(b"a").is_some());
        assert!(m.remove(b"a").is_none());
        assert_eq!(m.stored_bytes(), 1);
        assert_eq!(m.len(), 1);
        assert_indexes_consistent(&m);
    }

    #[test]
    fn keynotify_is_not_for_the_state_machine() {
        let mut m = machine();
        let applied = m.apply(&entry(
            1,
            Command::KeyNotify {
                key: b("k"),
                stop: false,
            },
            None,
        ));
        assert_eq!(applied, Applied::error(ErrorKind::UnknownCommand));
        assert_eq!(m, machine());
    }

    #[test]
    fn validation_runs_inside_apply() {
        let mut m = machine();
        let mut e = entry(1_000, set_cmd("k", "v", None, None), None);
        if let Op::Request(r) = &mut e.op {
            r.ts = None;
        }
        assert_eq!(m.apply(&e), Applied::error(ErrorKind::MissingTimestamp));
        let mut e = entry(1_000, set_cmd("k", "v", None, None), None);
        if let Op::Request(r) = &mut e.op {
            r.ts = Some(Hlc::new(61_001, 0, "c"));
        }
        assert_eq!(m.apply(&e), Applied::error(ErrorKind::TimestampSkew));
        assert!(m.is_empty());
        assert_eq!(m.clock().current(), Hlc::new(0, 0, "srv"));
    }

    #[test]
    fn limits_change_through_the_log() {
        let mut m = StateMachine::new(StoreConfig::new("n"));
        let limits = crate::Limits {
            max_keys: Some(1),
            max_bytes: None,
            scan_page_size: 5,
        };
        let applied = m.apply(&Entry {
            now_ms: 1,
            op: Op::SetLimits(limits.clone()),
        });
        assert_eq!(applied.response, Response::Ok);
        assert_eq!(m.limits(), limits);
        assert_eq!(m.config().node_id, "n");
    }

    #[test]
    fn node_id_comes_from_config() {
        let mut m = StateMachine::new(StoreConfig::new("node:7"));
        let v = m
            .apply(&entry(5, set_cmd("k", "v", None, None), None))
            .version
            .unwrap();
        assert_eq!(&*v.node_id, "node-7");
    }
}
