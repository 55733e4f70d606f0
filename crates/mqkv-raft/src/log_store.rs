//! openraft's log storage over the log file.
//!
//! Entries live in the file. Raft must be able to read an entry as soon as
//! `append` returns, before the writer thread has made it durable, so
//! appended entries are also kept in memory until their commit — and only
//! until then: memory holds what is in flight, never the whole log.
//!
//! Invariants:
//! - a reader looks at the pending entries before the file, and an entry
//!   leaves the pending set only after the commit holding it, so every
//!   appended entry is found;
//! - a pending entry wins over the file at the same index: it is newer (it
//!   replaced a truncated one);
//! - changes reach the file in the order raft made them (one writer thread,
//!   one queue).

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, StorageIOError,
};
use redb::Database;

use crate::log_file::{self, LoadedLog, LogWrite};
use crate::log_writer::{LogWriter, Pending};
use crate::stats::Counters;
use crate::sync;
use crate::types::{LogId, RaftEntry, StorageError, TypeConfig, Vote};

struct RaftMeta {
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
}

/// Shared between the raft core (which writes) and log readers.
pub(crate) struct LogShared {
    meta: Mutex<RaftMeta>,
    pending: Arc<Pending>,
    /// For reads; taken away when the store closes.
    db: RwLock<Option<Arc<Database>>>,
    writer: LogWriter,
    path: PathBuf,
}

impl LogShared {
    fn meta(&self) -> MutexGuard<'_, RaftMeta> {
        sync::lock(&self.meta)
    }

    fn db(&self) -> Result<Arc<Database>, String> {
        sync::read(&self.db)
            .clone()
            .ok_or_else(|| format!("{} is closed", self.path.display()))
    }

    /// Entries of `range`: pending ones first (see the module invariants),
    /// then the file for the rest.
    fn entries<R: RangeBounds<u64>>(&self, range: R) -> Result<Vec<RaftEntry>, String> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        let pending: Vec<RaftEntry> = self
            .pending
            .lock()
            .range(range)
            .map(|(_, e)| e.clone())
            .collect();
        let db = self.db()?;
        let on_disk = log_file::read_entries(&db, range)?;
        let mut merged: std::collections::BTreeMap<u64, RaftEntry> =
            on_disk.into_iter().map(|e| (e.log_id.index, e)).collect();
        merged.extend(pending.into_iter().map(|e| (e.log_id.index, e)));
        Ok(merged.into_values().collect())
    }

    /// Entries currently in the log (on disk or pending), roughly: an entry
    /// just committed may be counted in both places.
    pub(crate) fn len(&self) -> u64 {
        let pending = self.pending.lock().len() as u64;
        let on_disk = self
            .db()
            .and_then(|db| log_file::stored_len(&db))
            .unwrap_or(0);
        pending + on_disk
    }

    pub(crate) async fn close(&self) -> std::io::Result<()> {
        let result = self.writer.close().await;
        drop(sync::write(&self.db).take());
        result
    }
}

/// The log store handed to openraft; clones share everything.
#[derive(Clone)]
pub(crate) struct LogStore {
    shared: Arc<LogShared>,
}

impl LogStore {
    /// Starts the writer thread over `db`.
    pub(crate) fn start(
        loaded: LoadedLog,
        db: Database,
        path: PathBuf,
        counters: Arc<Counters>,
    ) -> std::io::Result<LogStore> {
        let db = Arc::new(db);
        let pending = Arc::new(Pending::default());
        let writer = LogWriter::start(db.clone(), path.clone(), pending.clone(), counters)?;
        let meta = RaftMeta {
            vote: loaded.vote,
            committed: loaded.committed,
            last_purged: loaded.last_purged,
        };
        Ok(LogStore {
            shared: Arc::new(LogShared {
                meta: Mutex::new(meta),
                pending,
                db: RwLock::new(Some(db)),
                writer,
                path,
            }),
        })
    }

    pub(crate) fn shared(&self) -> Arc<LogShared> {
        self.shared.clone()
    }
}

fn io_failure(verb: ErrorVerb, subject: ErrorSubject<u64>, e: std::io::Error) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

fn read_failure(e: String) -> StorageError {
    StorageIOError::read_logs(AnyError::error(e)).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError> {
        self.shared.entries(range).map_err(read_failure)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged = self.shared.meta().last_purged;
        let pending_last = self
            .shared
            .pending
            .lock()
            .values()
            .next_back()
            .map(|e| e.log_id);
        let db = self.shared.db().map_err(read_failure)?;
        let on_disk_last = log_file::last_entry_id(&db).map_err(read_failure)?;
        // Raft asks when no truncation is under way, so the newer of the
        // two is the end of the log.
        let last_entry = pending_last.max(on_disk_last);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last_entry.or(last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.shared.meta().vote = Some(*vote);
        self.shared
            .writer
            .write(LogWrite::Vote(*vote))
            .await
            .map_err(|e| io_failure(ErrorVerb::Write, ErrorSubject::Vote, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.shared.meta().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.shared.meta().committed = committed;
        if let Some(id) = committed {
            self.shared.writer.note(LogWrite::Committed(id));
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.shared.meta().committed)
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
        {
            let mut pending = self.shared.pending.lock();
            for entry in &entries {
                pending.insert(entry.log_id.index, entry.clone());
            }
        }
        self.shared
            .writer
            .append(LogWrite::Append(entries), callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        drop(self.shared.pending.lock().split_off(&log_id.index));
        self.shared
            .writer
            .write(LogWrite::Truncate(log_id.index))
            .await
            .map_err(|e| io_failure(ErrorVerb::Delete, ErrorSubject::Logs, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        {
            let mut pending = self.shared.pending.lock();
            let kept = pending.split_off(&(log_id.index + 1));
            *pending = kept;
        }
        self.shared.meta().last_purged = Some(log_id);
        self.shared
            .writer
            .write(LogWrite::Purge(log_id))
            .await
            .map_err(|e| io_failure(ErrorVerb::Delete, ErrorSubject::Logs, e))
    }
}
