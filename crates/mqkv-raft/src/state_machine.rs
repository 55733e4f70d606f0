//! openraft's state machine: the in-memory [`StateMachine`], the applied log
//! id, and snapshots of both in the state file.
//!
//! Invariants:
//! - the machine, the last applied log id and the membership change together
//!   under one lock, so a snapshot always describes exactly the entries it
//!   says it covers;
//! - readers only ever see applied entries, and an entry is applied only
//!   after raft committed it, i.e. after it was fsynced;
//! - the apply hook runs once per applied client entry, in log order, and
//!   only once it is installed — after startup replay — so entries replayed
//!   from the log never reach it.

use std::cell::RefCell;
use std::io::Cursor;
use std::sync::{Arc, Mutex, OnceLock};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use mqkv_store::{Applied, Entry, Frozen, StateMachine};
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder, Snapshot,
    StorageIOError,
};

use crate::snapshot_file::{Pieces, SnapshotFile, CHUNK_BYTES};
use crate::stats::Counters;
use crate::sync::lock;
use crate::types::{
    LogId, Membership, Outcome, Proposal, RaftEntry, SnapshotMeta, StorageError, TypeConfig,
};

/// Called with every applied client entry and its outcome, in log order,
/// before the write that proposed it returns.
pub type ApplyHook = Arc<dyn Fn(&Entry, &Applied) + Send + Sync>;

/// Called after a snapshot from another member replaced the whole state:
/// the entries it covers never reach the [`ApplyHook`].
pub type InstallHook = Arc<dyn Fn() + Send + Sync>;

/// What the applied entries add up to.
pub(crate) struct AppliedState {
    pub(crate) machine: StateMachine,
    pub(crate) last_applied: Option<LogId>,
    pub(crate) membership: Membership,
}

/// What a snapshot leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Meta and data, in the state file: what a restart starts from.
    Data,
    /// Only the meta, for a store that does not outlive the process. The
    /// state machine in memory is the only copy of the data; a snapshot is
    /// serialized only when raft asks for one (to send to another member),
    /// from the state as it is then.
    MetaOnly,
}

/// Ends a freeze however its serialization ends; the undo map is freed
/// after the lock is released.
struct ThawOnDrop<'a> {
    shared: &'a StateShared,
    frozen: &'a Frozen,
}

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        let thawed = self.shared.write().machine.thaw(self.frozen);
        drop(thawed);
    }
}

/// Shared by the raft state machine worker, snapshot builders and readers.
pub(crate) struct StateShared {
    state: RwLock<AppliedState>,
    hook: OnceLock<ApplyHook>,
    installed: OnceLock<InstallHook>,
    file: SnapshotFile,
    /// The snapshot read at startup, kept until raft asks for it once so the
    /// (possibly large) data is not read from disk twice.
    startup_snapshot: Mutex<Option<(SnapshotMeta, Vec<u8>)>>,
    counters: Arc<Counters>,
    /// Meta of the newest snapshot written or installed.
    current: Mutex<Option<SnapshotMeta>>,
    keep: Keep,
    /// States of at least this many keys are snapshotted piecewise (see
    /// [`mqkv_store::Frozen`]).
    piecewise_keys: usize,
}

impl StateShared {
    pub(crate) fn new(
        state: AppliedState,
        file: SnapshotFile,
        startup_snapshot: Option<(SnapshotMeta, Vec<u8>)>,
        counters: Arc<Counters>,
        keep: Keep,
        piecewise_keys: usize,
    ) -> StateShared {
        let current = startup_snapshot.as_ref().map(|(meta, _)| meta.clone());
        if let Some((_, data)) = &startup_snapshot {
            counters.snapshot_taken(data.len() as u64);
        }
        StateShared {
            state: RwLock::new(state),
            hook: OnceLock::new(),
            installed: OnceLock::new(),
            file,
            startup_snapshot: Mutex::new(startup_snapshot),
            counters,
            current: Mutex::new(current),
            keep,
            piecewise_keys,
        }
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, AppliedState> {
        self.state.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, AppliedState> {
        self.state.write()
    }

    /// Starts calling `hook` whenever a snapshot from another member is
    /// installed. Only the first call counts.
    pub(crate) fn install_snapshot_hook(&self, hook: InstallHook) {
        let _ = self.installed.set(hook);
    }

    /// Starts calling `hook` for entries applied from now on.
    pub(crate) fn install_hook(&self, hook: ApplyHook) {
        // A store is opened once and the hook installed once; a second call
        // cannot happen through the public API.
        let _ = self.hook.set(hook);
    }

    /// Index of the last entry the newest snapshot covers.
    pub(crate) fn snapshot_index(&self) -> Option<u64> {
        lock(&self.current)
            .as_ref()
            .and_then(|meta| meta.last_log_id)
            .map(|id| id.index)
    }

    /// Notes `meta` as the newest snapshot, unless a newer one was noted
    /// meanwhile: a snapshot built from the state and one installed from
    /// the leader can finish in either order.
    fn note_current(&self, meta: &SnapshotMeta) {
        let mut current = lock(&self.current);
        if current
            .as_ref()
            .is_none_or(|noted| noted.last_log_id <= meta.last_log_id)
        {
            *current = Some(meta.clone());
        }
    }

    pub(crate) fn close(&self) {
        self.file.close();
        drop(lock(&self.startup_snapshot).take());
    }

    /// Serializes the applied state, with the meta describing it.
    fn serialize(&self) -> Result<(SnapshotMeta, Vec<u8>), Failure> {
        // Sized before the lock is taken: grown by doubling, the buffer copied what it held
        // several times over and touched fresh pages while apply waited (a 6 MB snapshot under
        // load: 90-100 ms; sized, 10-30 ms).
        let hint = self.read().machine.snapshot_size_hint();
        let buffer = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
        let mut buffer = Some(buffer);
        self.serialize_into(|| crate::flavor::VecFlavor(buffer.take().unwrap_or_default()))
    }

    /// Serializes the applied state into a flavor from `flavor`, with the
    /// meta describing it. A state of many keys is frozen and serialized a
    /// piece at a time, apply going on between the pieces; otherwise apply
    /// waits meanwhile (and so may readers queued behind it), unless a copy
    /// is much quicker to take than the bytes: then only for the copy.
    fn serialize_into<F: postcard::ser_flavors::Flavor>(
        &self,
        mut flavor: impl FnMut() -> F,
    ) -> Result<(SnapshotMeta, F::Output), Failure> {
        // Looked at under the read lock, so a small state never takes the write lock.
        let piecewise = self.read().machine.len() >= self.piecewise_keys;
        if piecewise {
            match self.serialize_frozen(flavor()) {
                Some(Ok(done)) => return Ok(done),
                // The state was replaced (a snapshot installed) during the walk: the state
                // now is serialized instead.
                Some(Err(e)) => tracing::warn!(error = %e.message, "piecewise snapshot abandoned"),
                // Another snapshot is being taken piecewise: this one goes as a small one would.
                None => {}
            }
        }
        let state = self.read();
        let meta = self.meta_of(&state);
        let output = if state.machine.snapshot_copy_pays() {
            let copy = state.machine.snapshot_copy();
            drop(state);
            postcard::serialize_with_flavor(&copy, flavor())
        } else {
            postcard::serialize_with_flavor(&state.machine, flavor())
        }
        .map_err(|e| Failure::new(ErrorVerb::Write, e))?;
        Ok((meta, output))
    }

    /// The piecewise snapshot of [`Self::serialize_into`]; `None` if another
    /// one is under way.
    fn serialize_frozen<F: postcard::ser_flavors::Flavor>(
        &self,
        flavor: F,
    ) -> Option<Result<(SnapshotMeta, F::Output), Failure>> {
        let mut state = self.write();
        let meta = self.meta_of(&state);
        let frozen = match state.machine.freeze() {
            Ok(Some(frozen)) => frozen,
            Ok(None) => return None,
            Err(e) => return Some(Err(Failure::new(ErrorVerb::Write, e))),
        };
        drop(state);
        let _thaw = ThawOnDrop {
            shared: self,
            frozen: &frozen,
        };
        // Each piece hands the lock straight to a writer waiting for it: released plainly, it
        // would be read-locked again for the next piece before the woken writer got to run, and
        // apply would wait for the whole walk.
        let read = |f: &mut dyn FnMut(&StateMachine)| {
            let state = self.read();
            f(&state.machine);
            RwLockReadGuard::unlock_fair(state);
        };
        let output = frozen.snapshot(&read).write(flavor);
        Some(match output {
            Ok(output) => {
                Counters::add(&self.counters.snapshots_piecewise, 1);
                Ok((meta, output))
            }
            Err(e) => Err(Failure::new(ErrorVerb::Write, e)),
        })
    }

    fn meta_of(&self, state: &AppliedState) -> SnapshotMeta {
        let built = Counters::get(&self.counters.snapshots_built) + 1;
        let snapshot_id = match state.last_applied {
            Some(id) => format!("{}-{}-{built}", id.leader_id, id.index),
            None => format!("none-{built}"),
        };
        SnapshotMeta {
            last_log_id: state.last_applied,
            last_membership: state.membership.clone(),
            snapshot_id,
        }
    }

    /// Takes a snapshot: serializes the applied state and writes it to the
    /// state file, or, with [`Keep::MetaOnly`], only notes how far the
    /// applied state reaches (so raft may purge the log behind it).
    fn build_snapshot(&self) -> Result<(SnapshotMeta, Vec<u8>), Failure> {
        if self.keep == Keep::MetaOnly {
            let meta = self.meta_of(&self.read());
            Counters::add(&self.counters.snapshots_built, 1);
            // The log behind it may go: it no longer counts towards the
            // next snapshot.
            self.counters.snapshot_taken(0);
            self.note_current(&meta);
            return Ok((meta, Vec::new()));
        }
        // Log written from here on (while the snapshot is serialized and
        // saved) is not in it and still counts towards the next one.
        let covered = Counters::get(&self.counters.log_bytes_since_snapshot);
        let mut built = None;
        // The state is serialized straight into the file's transaction, one
        // piece at a time through one buffer: never whole in memory, and no
        // fresh memory to fault in for every piece.
        let written = self.file.save_with(|pieces| {
            let sink = RefCell::new(PieceSink {
                pieces,
                failed: None,
            });
            let serialized = self.serialize_into(|| PieceWriter::new(&sink));
            if let Some(message) = sink.borrow_mut().failed.take() {
                return Err(message);
            }
            let (meta, len) = serialized.map_err(|e| e.message)?;
            built = Some((meta.clone(), len));
            Ok(meta)
        });
        if let Some(hook) = AFTER_SNAPSHOT.get() {
            hook();
        }
        let written = written.map_err(|e| Failure::new(ErrorVerb::Write, e))?;
        let Some((meta, len)) = built else {
            return Err(Failure::new(ErrorVerb::Write, "no snapshot was serialized"));
        };
        if written {
            Counters::add(&self.counters.snapshots_built, 1);
            self.counters.snapshot_covers(covered, len);
            self.note_current(&meta);
        }
        // openraft takes only the meta of a snapshot it asked to be built; a
        // member that needs the data gets it from `current_snapshot`, which
        // reads it back from the file.
        Ok((meta, Vec::new()))
    }

    fn install_snapshot(&self, meta: &SnapshotMeta, data: Vec<u8>) -> Result<(), Failure> {
        let machine: StateMachine =
            postcard::from_bytes(&data).map_err(|e| Failure::new(ErrorVerb::Read, e))?;
        self.file
            .save(meta, &data)
            .map_err(|e| Failure::new(ErrorVerb::Write, e))?;
        self.counters.snapshot_taken(data.len() as u64);
        self.note_current(meta);
        *self.write() = AppliedState {
            machine,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        Ok(())
    }

    fn current_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, Failure> {
        let current = lock(&self.current).clone();
        if self.keep == Keep::MetaOnly {
            // The state now covers at least what the last snapshot covered;
            // while it covers exactly that, it is that snapshot.
            let Some(current) = current else {
                return Ok(None);
            };
            let (meta, data) = self.serialize()?;
            let meta = match meta.last_log_id == current.last_log_id {
                true => current,
                false => meta,
            };
            return Ok(Some(snapshot(meta, data)));
        }
        if let Some((meta, data)) = lock(&self.startup_snapshot).take() {
            if Some(&meta) == current.as_ref() {
                return Ok(Some(snapshot(meta, data)));
            }
        }
        let stored = self
            .file
            .read()
            .map_err(|e| Failure::new(ErrorVerb::Read, e))?;
        Ok(stored.map(|(meta, data)| snapshot(meta, data)))
    }
}

static AFTER_SNAPSHOT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets a function to call on the thread that wrote a snapshot to the state
/// file, once the snapshot's serialized pieces (about the size of the state)
/// are freed. A program sets it to have its allocator give that memory back
/// to the system at once: an allocator may keep what a thread freed until
/// that thread allocates again, and the snapshot thread then sleeps until
/// the next snapshot. Only the first call has an effect.
pub fn set_after_snapshot(hook: fn()) {
    let _ = AFTER_SNAPSHOT.set(hook);
}

/// Where a snapshot's pieces go, and the first failure to put one there.
struct PieceSink<'p, 't> {
    pieces: &'p mut Pieces<'t>,
    failed: Option<String>,
}

/// A postcard flavor that hands the serialized state to a [`PieceSink`] in
/// pieces of [`CHUNK_BYTES`], gathered in one buffer used again for each.
/// Its output is the number of bytes serialized. A new writer starts the
/// data over (a serialization abandoned part way leaves no pieces behind).
struct PieceWriter<'s, 'p, 't> {
    sink: &'s RefCell<PieceSink<'p, 't>>,
    buffer: Vec<u8>,
    len: u64,
}

impl<'s, 'p, 't> PieceWriter<'s, 'p, 't> {
    fn new(sink: &'s RefCell<PieceSink<'p, 't>>) -> Self {
        {
            let mut sink = sink.borrow_mut();
            if let Err(e) = sink.pieces.clear() {
                sink.failed.get_or_insert(e);
            }
        }
        PieceWriter {
            sink,
            buffer: Vec::with_capacity(CHUNK_BYTES),
            len: 0,
        }
    }

    /// Puts the buffer's bytes as the next piece.
    fn flush(&mut self) -> postcard::Result<()> {
        let mut sink = self.sink.borrow_mut();
        if sink.failed.is_none() {
            if let Err(e) = sink.pieces.put(&self.buffer) {
                sink.failed = Some(e);
            }
        }
        self.buffer.clear();
        match sink.failed {
            // postcard's errors carry no message; the sink keeps it.
            Some(_) => Err(postcard::Error::SerializeBufferFull),
            None => Ok(()),
        }
    }
}

impl postcard::ser_flavors::Flavor for PieceWriter<'_, '_, '_> {
    type Output = u64;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.try_extend(&[byte])
    }

    fn try_extend(&mut self, mut bytes: &[u8]) -> postcard::Result<()> {
        self.len += bytes.len() as u64;
        while !bytes.is_empty() {
            let n = (CHUNK_BYTES - self.buffer.len()).min(bytes.len());
            self.buffer.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buffer.len() == CHUNK_BYTES {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<u64> {
        if !self.buffer.is_empty() {
            self.flush()?;
        }
        Ok(self.len)
    }
}

fn snapshot(meta: SnapshotMeta, data: Vec<u8>) -> Snapshot<TypeConfig> {
    Snapshot {
        meta,
        snapshot: Box::new(Cursor::new(data)),
    }
}

/// A failure of the state file, kept small until it crosses into openraft
/// (whose error type is large).
#[derive(Debug)]
struct Failure {
    verb: ErrorVerb,
    message: String,
}

impl Failure {
    fn new(verb: ErrorVerb, error: impl std::fmt::Display) -> Failure {
        Failure {
            verb,
            message: error.to_string(),
        }
    }
}

impl From<Failure> for StorageError {
    fn from(failure: Failure) -> StorageError {
        StorageIOError::new(
            ErrorSubject::StateMachine,
            failure.verb,
            AnyError::error(failure.message),
        )
        .into()
    }
}

/// Runs blocking state file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, StorageError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(StorageError::from),
        Err(e) => Err(Failure::new(ErrorVerb::Write, e).into()),
    }
}

/// The state machine handed to openraft.
pub(crate) struct StateMachineStore {
    shared: Arc<StateShared>,
}

impl StateMachineStore {
    pub(crate) fn new(shared: Arc<StateShared>) -> StateMachineStore {
        StateMachineStore { shared }
    }
}

/// Builds one snapshot off the apply path.
pub(crate) struct SnapshotBuilder {
    shared: Arc<StateShared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let shared = self.shared.clone();
        let (meta, data) = match shared.keep {
            // Nothing is serialized or written: no need for another thread.
            Keep::MetaOnly => shared.build_snapshot()?,
            Keep::Data => blocking(move || shared.build_snapshot()).await?,
        };
        Ok(snapshot(meta, data))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError> {
        let state = self.shared.read();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, StorageError>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            let outcomes = match entry.payload {
                EntryPayload::Blank => {
                    self.shared.write().last_applied = Some(entry.log_id);
                    Vec::new()
                }
                EntryPayload::Membership(membership) => {
                    let mut state = self.shared.write();
                    state.last_applied = Some(entry.log_id);
                    state.membership = Membership::new(Some(entry.log_id), membership);
                    Vec::new()
                }
                EntryPayload::Normal(Proposal(requests)) => {
                    // The whole proposal is applied under one lock, together
                    // with its log id, so a snapshot never holds half of it.
                    let applied: Vec<Applied> = {
                        let mut state = self.shared.write();
                        state.machine.prefetch(&requests);
                        let applied = requests.iter().map(|r| state.machine.apply(r)).collect();
                        state.last_applied = Some(entry.log_id);
                        applied
                    };
                    // Outside the lock, so the hook may read the store.
                    if let Some(hook) = self.shared.hook.get() {
                        requests
                            .iter()
                            .zip(&applied)
                            .for_each(|(entry, outcome)| hook(entry, outcome));
                    }
                    applied.into_iter().map(Outcome::from).collect()
                }
            };
            replies.push(outcomes);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let shared = self.shared.clone();
        let meta = meta.clone();
        let data = snapshot.into_inner();
        blocking(move || shared.install_snapshot(&meta, data)).await?;
        if let Some(hook) = self.shared.installed.get() {
            hook();
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let shared = self.shared.clone();
        blocking(move || shared.current_snapshot()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot_file::tests::meta;
    use mqkv_protocol::{Command, Hlc};
    use mqkv_store::{Op, Request, StoreConfig};

    /// A state of `keys` keys, snapshotted piecewise from 8 keys on.
    fn shared(dir: &tempfile::TempDir, keys: u64) -> StateShared {
        let mut machine = StateMachine::new(StoreConfig::new("srv"));
        for i in 0..keys {
            machine.apply(&Entry {
                now_ms: 1_000 + i,
                op: Op::Request(Request {
                    command: Command::Set {
                        key: format!("k{i:03}").into_bytes().into(),
                        value: format!("v{i}").into_bytes().into(),
                        condition: None,
                        px_ms: None,
                    },
                    ts: Some(Hlc::new(1_000 + i, 0, "client")),
                    ft: None,
                    dedup: None,
                }),
            });
        }
        let path = dir.path().join("state.redb");
        let db = redb::Database::create(&path).expect("create");
        let state = AppliedState {
            machine,
            last_applied: None,
            membership: Membership::default(),
        };
        StateShared::new(
            state,
            SnapshotFile::new(db, path),
            None,
            Arc::default(),
            Keep::Data,
            8,
        )
    }

    #[test]
    fn many_keys_are_snapshotted_piecewise_and_small_states_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let many = shared(&dir, 1_500);
        let expected = postcard::to_stdvec(&many.read().machine).expect("plain");
        let (_, bytes) = many.serialize().expect("piecewise");
        assert_eq!(bytes, expected);
        assert_eq!(Counters::get(&many.counters.snapshots_piecewise), 1);
        assert!(!many.read().machine.is_frozen(), "thawed after the walk");

        let dir = tempfile::tempdir().expect("tempdir");
        let few = shared(&dir, 7);
        let expected = postcard::to_stdvec(&few.read().machine).expect("plain");
        assert_eq!(few.serialize().expect("whole").1, expected);
        assert_eq!(Counters::get(&few.counters.snapshots_piecewise), 0);
    }

    /// A snapshot that finishes after a newer one does not become the
    /// current one: whichever order a built and an installed snapshot end
    /// in, the newest is what raft is offered and what the log is purged
    /// behind.
    #[test]
    fn an_older_snapshot_finishing_later_does_not_replace_a_newer_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = shared(&dir, 3);
        shared.note_current(&meta(20));
        assert_eq!(shared.snapshot_index(), Some(20));
        shared.note_current(&meta(12));
        assert_eq!(shared.snapshot_index(), Some(20), "an older one came last");
        shared.note_current(&meta(31));
        assert_eq!(shared.snapshot_index(), Some(31));
    }

    /// While one piecewise snapshot is under way, another is taken whole.
    #[test]
    fn a_second_snapshot_during_a_walk_is_taken_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = shared(&dir, 100);
        let expected = postcard::to_stdvec(&shared.read().machine).expect("plain");
        let walk = shared
            .write()
            .machine
            .freeze()
            .expect("encodes")
            .expect("not frozen yet");
        let (_, bytes) = shared.serialize().expect("whole");
        assert_eq!(bytes, expected);
        assert_eq!(Counters::get(&shared.counters.snapshots_piecewise), 0);
        assert!(
            shared.read().machine.is_frozen(),
            "the walk under way goes on"
        );
        drop(shared.write().machine.thaw(&walk));
    }

    /// The pieces put together are exactly postcard's encoding, whatever
    /// the mix of single bytes and runs that cross a piece's end, and a
    /// second writer starts the data over.
    #[test]
    fn pieces_join_into_the_plain_encoding() {
        let value: (Vec<u8>, Vec<u64>, String, Vec<u8>) = (
            vec![7; CHUNK_BYTES - 3],
            (0..1_000u64).map(|i| i * 1_000_003).collect(),
            "é".repeat(10),
            (0..(2 * CHUNK_BYTES + 5)).map(|i| i as u8).collect(),
        );
        let plain = postcard::to_stdvec(&value).expect("plain");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = crate::snapshot_file::tests::file(&dir);
        let meta = crate::snapshot_file::tests::meta(9);
        let mut len = 0;
        let written = file
            .save_with(|pieces| {
                let sink = RefCell::new(PieceSink {
                    pieces,
                    failed: None,
                });
                let abandoned = (vec![1u8; 3 * CHUNK_BYTES], 5u8);
                postcard::serialize_with_flavor(&abandoned, PieceWriter::new(&sink))
                    .expect("first");
                len = postcard::serialize_with_flavor(&value, PieceWriter::new(&sink))
                    .expect("pieces");
                assert!(sink.borrow().failed.is_none());
                Ok(meta.clone())
            })
            .expect("save");
        assert!(written);
        assert_eq!(len, plain.len() as u64);
        assert_eq!(file.read().expect("read"), Some((meta, plain)));
    }
}
