//! openraft's log storage: the log in memory, backed by segment files on
//! disk (or by nothing, for a store that does not outlive the process).
//!
//! Every change is written and, where raft needs it durable, synced before
//! the call returns — an append's `LogFlushed` callback is called at the
//! end of `append` itself. These calls run on the raft thread (see
//! `runtime`), which has nothing else to do while its one proposal is being
//! synced, so doing the I/O in place costs no thread hand-off. On a thread
//! lent to raft, which serves connections too, `append` awaits the I/O with
//! the lock on the log released, and the connections are served meanwhile:
//! the append is a direct write submitted through io_uring (see `uring`),
//! or, where the system refuses that (from then on) or it is turned off, a
//! write into the page cache whose sync goes to a sync thread (started by
//! the raft thread, so it may run where that thread may).
//!
//! Recent entries are kept decoded in memory (the state machine applies
//! them right after they are written); older ones are read back from their
//! segment when raft asks for them. A memory store keeps all of them.
//!
//! Invariants:
//! - the entries held are contiguous, from the one after the last purged;
//! - an entry is readable as soon as `append` returns, and is acknowledged
//!   (its callback called) only after the sync that holds it;
//! - changes reach the file in the order raft made them;
//! - the committed log id needs no sync of its own: it is written with the
//!   next change that is synced.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::oneshot;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, StorageIOError,
};

use crate::log_file::{DirectWrite, Loaded, Location, Record, Segments};
use crate::stats::Counters;
use crate::sync;
use crate::types::{LogId, RaftEntry, StorageError, TypeConfig, Vote};
use crate::uring::{self, Ring};

/// Decoded entries kept in memory by a disk store, newest first to stay,
/// counted by their encoded size (decoded, they take a few times that).
/// The state machine reads an entry right after it is written, so this
/// only has to cover the proposals in flight.
const CACHE_BYTES: u64 = 1 << 20;

struct Slot {
    id: LogId,
    location: Option<Location>,
    entry: Option<RaftEntry>,
    size: u64,
}

struct Log {
    /// Appends synced elsewhere are written with direct I/O (see `uring`),
    /// until the system refuses it.
    direct: bool,
    /// The direct write of the latest append, for its caller to submit.
    pending: Option<DirectWrite>,
    /// The buffer of the write before, for the next.
    spare: Vec<u8>,
    /// `None` for a memory store, and once closed.
    segments: Option<Segments>,
    memory: bool,
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// The committed id changed since it was last written.
    committed_dirty: bool,
    last_purged: Option<LogId>,
    /// Index of `slots[0]`.
    first: u64,
    slots: VecDeque<Slot>,
    /// Bytes of the entries held decoded, and the first index held so.
    cached_bytes: u64,
    cached_from: u64,
}

impl Log {
    fn last_id(&self) -> Option<LogId> {
        self.slots.back().map(|s| s.id).or(self.last_purged)
    }

    fn slot(&self, index: u64) -> Option<&Slot> {
        let offset = usize::try_from(index.checked_sub(self.first)?).ok()?;
        self.slots.get(offset)
    }

    fn segments(&mut self) -> io::Result<Option<&mut Segments>> {
        if self.memory {
            return Ok(None);
        }
        self.segments
            .as_mut()
            .map(Some)
            .ok_or_else(|| io::Error::other("the log is closed"))
    }

    /// Stages the committed id if it changed, then `record`, and writes.
    fn write(&mut self, record: Option<Record>, sync: bool) -> io::Result<()> {
        let committed = self.committed.filter(|_| self.committed_dirty);
        let direct = self.direct && !sync;
        let buffer = match direct {
            true => std::mem::take(&mut self.spare),
            false => Vec::new(),
        };
        let Some(segments) = self.segments()? else {
            return Ok(());
        };
        if let Some(id) = committed {
            segments.stage(&Record::Committed(id))?;
        }
        if let Some(record) = &record {
            segments.stage(record)?;
        }
        if direct {
            self.pending = segments.direct_write(buffer)?;
        } else {
            segments.write(sync)?;
        }
        self.committed_dirty = false;
        Ok(())
    }

    /// The newest segment's file, for a sync elsewhere; `None` for a
    /// memory store.
    fn current_file(&mut self) -> io::Result<Option<Arc<File>>> {
        match self.segments()? {
            Some(segments) => segments.current_file().map(Some),
            None => Ok(None),
        }
    }

    /// Forgets decoded entries beyond the cache budget, oldest first, but
    /// never the newest (however large, it is about to be applied). A
    /// memory store has nowhere else to read them from and keeps them all.
    fn trim_cache(&mut self) {
        if self.memory {
            return;
        }
        let newest = self.first + self.slots.len() as u64;
        while self.cached_bytes > CACHE_BYTES && self.cached_from + 1 < newest {
            let offset = (self.cached_from - self.first) as usize;
            let Some(slot) = self.slots.get_mut(offset) else {
                break;
            };
            if slot.entry.take().is_some() {
                self.cached_bytes -= slot.size;
            }
            self.cached_from += 1;
        }
    }

    /// Writes `entries`, and syncs them if `sync` (the caller syncs
    /// otherwise, before acknowledging them).
    fn append(
        &mut self,
        entries: Vec<RaftEntry>,
        counters: &Counters,
        sync: bool,
    ) -> io::Result<()> {
        let mut slots = Vec::with_capacity(entries.len());
        let mut bytes = 0;
        let (vote, committed, last_purged) = (self.vote, self.committed, self.last_purged);
        match self.segments()? {
            Some(segments) => {
                if segments.full() {
                    segments.roll(vote, committed, last_purged)?;
                    self.committed_dirty = false;
                }
                let Some(segments) = self.segments()? else {
                    return Err(io::Error::other("the log is closed"));
                };
                for entry in entries {
                    let record = Record::Entry(entry);
                    let location = segments.stage(&record)?;
                    let Record::Entry(entry) = record else {
                        return Err(io::Error::other("an entry record changed its kind"));
                    };
                    segments.staged_entry(entry.log_id.index)?;
                    bytes += u64::from(location.len());
                    slots.push(Slot {
                        id: entry.log_id,
                        size: u64::from(location.len()),
                        location: Some(location),
                        entry: Some(entry),
                    });
                }
                self.write(None, sync)?;
            }
            None => {
                for entry in entries {
                    let size = encoded_size(&entry)?;
                    bytes += size;
                    slots.push(Slot {
                        id: entry.log_id,
                        location: None,
                        entry: Some(entry),
                        size,
                    });
                }
            }
        }
        let written = slots.len() as u64;
        for slot in slots {
            let index = slot.id.index;
            if self.slots.is_empty() {
                self.first = index;
                self.cached_from = index;
            } else if index != self.first + self.slots.len() as u64 {
                return Err(io::Error::other(format!(
                    "entry {index} appended after entry {}",
                    self.first + self.slots.len() as u64 - 1
                )));
            }
            self.cached_bytes += slot.size;
            self.slots.push_back(slot);
        }
        self.trim_cache();
        Counters::add(&counters.log_commits, 1);
        Counters::add(&counters.log_entries_written, written);
        Counters::add(&counters.log_bytes_since_snapshot, bytes);
        Ok(())
    }

    fn truncate(&mut self, since: u64) -> io::Result<()> {
        self.write(Some(Record::Truncate(since)), true)?;
        let keep = since.saturating_sub(self.first) as usize;
        for slot in self.slots.drain(keep.min(self.slots.len())..) {
            if slot.entry.is_some() {
                self.cached_bytes -= slot.size;
            }
        }
        self.cached_from = self.cached_from.min(self.first + self.slots.len() as u64);
        Ok(())
    }

    fn purge(&mut self, upto: LogId) -> io::Result<()> {
        self.write(Some(Record::Purge(upto)), true)?;
        self.last_purged = Some(upto);
        while self.slots.front().is_some_and(|s| s.id.index <= upto.index) {
            if let Some(slot) = self.slots.pop_front() {
                if slot.entry.is_some() {
                    self.cached_bytes -= slot.size;
                }
            }
            self.first += 1;
        }
        if self.slots.is_empty() {
            self.first = upto.index + 1;
        }
        self.cached_from = self.cached_from.max(self.first);
        if let Some(segments) = self.segments()? {
            segments.delete_purged(upto.index)?;
        }
        Ok(())
    }

    fn entries(&self, range: (Bound<u64>, Bound<u64>)) -> io::Result<Vec<RaftEntry>> {
        let start = match range.0 {
            Bound::Included(i) => i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => self.first,
        }
        .max(self.first);
        let end = match range.1 {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => i,
            Bound::Unbounded => u64::MAX,
        }
        .min(self.first + self.slots.len() as u64);
        let mut entries = Vec::with_capacity(end.saturating_sub(start) as usize);
        for index in start..end {
            let Some(slot) = self.slot(index) else {
                break;
            };
            let entry = match (&slot.entry, slot.location, &self.segments) {
                (Some(entry), _, _) => entry.clone(),
                (None, Some(location), Some(segments)) => match segments.read(location)? {
                    Record::Entry(entry) if entry.log_id == slot.id => entry,
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("the log does not hold entry {index} where it was written"),
                        ))
                    }
                },
                _ => return Err(io::Error::other("the log is closed")),
            };
            entries.push(entry);
        }
        Ok(entries)
    }
}

/// Encoded size of an entry that is never encoded (memory store): what the
/// snapshot policy counts.
fn encoded_size(entry: &RaftEntry) -> io::Result<u64> {
    postcard::serialize_with_flavor::<_, _, usize>(entry, postcard::ser_flavors::Size::default())
        .map(|n| n as u64)
        .map_err(io::Error::other)
}

/// Shared between the raft core (which writes), log readers, and the node
/// (stats, close).
pub(crate) struct LogShared {
    log: Mutex<Log>,
    counters: Arc<Counters>,
    path: PathBuf,
    /// Appends are synced on the sync thread (see the module's notes).
    sync_elsewhere: bool,
    /// The sync thread, once started; `None` if it could not be.
    sync_thread: OnceLock<Option<mpsc::Sender<SyncJob>>>,
    /// The ring for direct writes, once set up on the thread appending;
    /// `None` if it could not be.
    ring: OnceLock<Option<Ring>>,
}

/// A file to sync, and where to say how it went.
type SyncJob = (Arc<File>, oneshot::Sender<io::Result<()>>);

impl LogShared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        sync::lock(&self.log)
    }

    /// Syncs `file` on the sync thread, started on first use by the
    /// calling thread (whose CPUs it inherits); in place if there is none.
    async fn sync_on_sync_thread(&self, file: Arc<File>) -> io::Result<()> {
        let thread = self.sync_thread.get_or_init(|| {
            let (jobs, queue) = mpsc::channel::<SyncJob>();
            let started = std::thread::Builder::new()
                .name("mqkv-sync".into())
                .spawn(move || {
                    for (file, done) in queue {
                        let _ = done.send(file.sync_data());
                    }
                });
            match started {
                Ok(_) => Some(jobs),
                Err(e) => {
                    tracing::warn!(error = %e, "no sync thread: the log syncs on raft's thread");
                    None
                }
            }
        });
        let Some(jobs) = thread else {
            return file.sync_data();
        };
        let (done, synced) = oneshot::channel();
        match jobs.send((file, done)) {
            Ok(()) => synced
                .await
                .unwrap_or_else(|_| Err(io::Error::other("the sync thread dropped a sync"))),
            Err(mpsc::SendError((file, _))) => file.sync_data(),
        }
    }

    /// Makes `write` durable: through the ring, or, where the system
    /// refuses direct writes, through the page cache and a sync (and so
    /// from then on).
    pub(crate) async fn write_direct(&self, write: DirectWrite) -> io::Result<()> {
        let ring = self.ring.get_or_init(|| match Ring::new() {
            Ok(ring) => Some(ring),
            Err(e) => {
                tracing::info!(error = %e, "no io_uring: the log writes through the page cache");
                None
            }
        });
        let (result, write) = match ring {
            Some(ring) => ring.write(write).await,
            None => (Err(io::Error::from_raw_os_error(libc::ENOSYS)), Some(write)),
        };
        let refused = match (result, write) {
            (Ok(()), write) => {
                Counters::add(&self.counters.log_direct_writes, 1);
                if let Some(write) = write {
                    let mut log = self.lock();
                    if log.spare.capacity() == 0 {
                        log.spare = write.into_buffer();
                    }
                }
                return Ok(());
            }
            (Err(e), Some(write)) if uring::refused(&e) => {
                if ring.is_some() {
                    tracing::info!(error = %e, "direct writes refused: the log writes through the page cache");
                }
                write
            }
            (Err(e), _) => return Err(e),
        };
        self.lock().direct = false;
        refused.file.write_all_at(refused.bytes(), refused.offset)?;
        self.sync_on_sync_thread(refused.file.clone()).await
    }

    /// Whether appends are still written directly.
    #[cfg(test)]
    pub(crate) fn writes_directly(&self) -> bool {
        self.lock().direct
    }

    /// Index of the newest entry, or of the last purged one if none is left.
    pub(crate) fn last_index(&self) -> Option<u64> {
        self.lock().last_id().map(|id| id.index)
    }

    /// Index of the newest entry raft has reported committed to this node.
    pub(crate) fn committed_index(&self) -> Option<u64> {
        self.lock().committed.map(|id| id.index)
    }

    /// Entries currently in the log (not yet purged).
    pub(crate) fn len(&self) -> u64 {
        self.lock().slots.len() as u64
    }

    /// Writes what is pending and closes the files. Later changes fail.
    pub(crate) async fn close(&self) -> io::Result<()> {
        let mut log = self.lock();
        if log.memory {
            return Ok(());
        }
        let result = match log.segments.is_some() {
            true => log.write(None, true),
            false => Ok(()),
        };
        log.segments = None;
        result
    }
}

/// The log store handed to openraft; clones share everything.
#[derive(Clone)]
pub(crate) struct LogStore {
    shared: Arc<LogShared>,
}

impl LogStore {
    /// A log over the segments opened (and replayed into `loaded`), or, with
    /// `None`, in memory only.
    /// With `sync_elsewhere`, appends are made durable off the lock (see
    /// the module's notes): with `direct_writes`, as direct writes where
    /// the system allows them, else synced on a sync thread.
    pub(crate) fn start(
        segments: Option<(Segments, Loaded)>,
        path: PathBuf,
        counters: Arc<Counters>,
        sync_elsewhere: bool,
        direct_writes: bool,
    ) -> LogStore {
        let memory = segments.is_none();
        let (segments, loaded) = match segments {
            Some((segments, loaded)) => (Some(segments), Some(loaded)),
            None => (None, None),
        };
        let mut log = Log {
            direct: sync_elsewhere && direct_writes,
            pending: None,
            spare: Vec::new(),
            segments,
            memory,
            vote: None,
            committed: None,
            committed_dirty: false,
            last_purged: None,
            first: 0,
            slots: VecDeque::new(),
            cached_bytes: 0,
            cached_from: 0,
        };
        if let Some(loaded) = loaded {
            log.vote = loaded.vote;
            log.committed = loaded.committed;
            log.last_purged = loaded.last_purged;
            log.first = loaded
                .entries
                .first()
                .map(|(id, _)| id.index)
                .or(loaded.last_purged.map(|id| id.index + 1))
                .unwrap_or(0);
            log.slots = loaded
                .entries
                .into_iter()
                .map(|(id, location)| Slot {
                    id,
                    size: u64::from(location.len()),
                    location: Some(location),
                    entry: None,
                })
                .collect();
            log.cached_from = log.first + log.slots.len() as u64;
        }
        LogStore {
            shared: Arc::new(LogShared {
                log: Mutex::new(log),
                counters,
                path,
                sync_elsewhere,
                sync_thread: OnceLock::new(),
                ring: OnceLock::new(),
            }),
        }
    }

    pub(crate) fn shared(&self) -> Arc<LogShared> {
        self.shared.clone()
    }

    fn failure(&self, verb: ErrorVerb, subject: ErrorSubject<u64>, e: io::Error) -> StorageError {
        let e = io::Error::new(e.kind(), format!("{}: {e}", self.shared.path.display()));
        StorageIOError::new(subject, verb, AnyError::new(&e)).into()
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.shared
            .lock()
            .entries(range)
            .map_err(|e| self.failure(ErrorVerb::Read, ErrorSubject::Logs, e))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let log = self.shared.lock();
        Ok(LogState {
            last_purged_log_id: log.last_purged,
            last_log_id: log.last_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut log = self.shared.lock();
        log.write(Some(Record::Vote(*vote)), true)
            .map_err(|e| self.failure(ErrorVerb::Write, ErrorSubject::Vote, e))?;
        log.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.shared.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let mut log = self.shared.lock();
        if committed.is_some() && committed != log.committed {
            log.committed = committed;
            log.committed_dirty = true;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.shared.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<RaftEntry> = entries.into_iter().collect();
        let started = std::time::Instant::now();
        let elsewhere = self.shared.sync_elsewhere;
        let (written, direct) = {
            let mut log = self.shared.lock();
            // The file to sync elsewhere, unless the append is a direct write.
            let written = log
                .append(entries, &self.shared.counters, !elsewhere)
                .and_then(|()| match elsewhere && log.pending.is_none() {
                    true => log.current_file(),
                    false => Ok(None),
                });
            (written, log.pending.take())
        };
        let result = match (written, direct) {
            (Err(e), _) => Err(e),
            (Ok(_), Some(direct)) => self.shared.write_direct(direct).await,
            (Ok(Some(file)), None) => self.shared.sync_on_sync_thread(file).await,
            (Ok(None), None) => Ok(()),
        };
        match result {
            Ok(()) => {
                self.shared.counters.log_write_took(started.elapsed());
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => Err(self.failure(ErrorVerb::Write, ErrorSubject::Logs, e)),
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.shared
            .lock()
            .truncate(log_id.index)
            .map_err(|e| self.failure(ErrorVerb::Delete, ErrorSubject::Logs, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.shared
            .lock()
            .purge(log_id)
            .map_err(|e| self.failure(ErrorVerb::Delete, ErrorSubject::Logs, e))
    }
}
