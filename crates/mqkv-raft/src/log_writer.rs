//! The one thread that writes the log file.
//!
//! Every change raft makes to the log file — appends, votes, truncations,
//! purges — is queued here and reported done (for an append: its
//! `LogFlushed` callback called) only after a redb commit with
//! `Durability::Immediate`, an fsync, that contains it. Whatever is queued
//! when a commit starts goes into that one transaction. (openraft 0.9 waits
//! for each append to be flushed before it issues the next, so concurrent
//! client writes are batched earlier, by `proposer`, into one log entry.)
//! Keeping the blocking redb calls on this thread keeps them off the async
//! runtime.
//!
//! Invariants:
//! - changes reach the file in the order they were queued (raft requires
//!   log and vote I/O to be serialized), and a transaction is all-or-nothing;
//! - no completion is reported before the commit that holds the change
//!   returned successfully; a failed commit fails every change in it;
//! - a change that needs no sync (the committed log id) never causes a
//!   commit of its own: it waits for the next one;
//! - an appended entry leaves the in-memory pending set only after the
//!   commit holding it, so a reader always finds it in one place or the
//!   other.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use openraft::storage::LogFlushed;
use redb::{Database, Durability};
use tokio::sync::oneshot;

use crate::log_file::{self, LogWrite};
use crate::stats::Counters;
use crate::sync;
use crate::types::{RaftEntry, TypeConfig};

/// Entries appended but not yet known to be durable, by index. Readers look
/// here before they look at the file.
#[derive(Default)]
pub(crate) struct Pending(Mutex<BTreeMap<u64, RaftEntry>>);

impl Pending {
    pub(crate) fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, RaftEntry>> {
        sync::lock(&self.0)
    }

    /// Forgets entries the file now holds, unless a newer entry took the
    /// same index meanwhile (after a truncation).
    fn settle(&self, written: &[RaftEntry]) {
        let mut pending = self.lock();
        for entry in written {
            if pending.get(&entry.log_id.index).map(|e| e.log_id) == Some(entry.log_id) {
                pending.remove(&entry.log_id.index);
            }
        }
    }
}

/// Who to tell once a change is on disk.
enum Done {
    Flushed(LogFlushed<TypeConfig>),
    Reply(oneshot::Sender<io::Result<()>>),
    Nobody,
}

impl Done {
    fn complete(self, result: io::Result<()>) {
        match self {
            Done::Flushed(callback) => callback.log_io_completed(result),
            Done::Reply(tx) => {
                // The caller may have given up waiting; nothing to do then.
                let _ = tx.send(result);
            }
            Done::Nobody => {}
        }
    }
}

enum Request {
    Write(LogWrite, Done),
    /// Write what is pending, close the file, then answer.
    Close(oneshot::Sender<io::Result<()>>),
}

/// Handle to the writer thread.
pub(crate) struct LogWriter {
    tx: mpsc::Sender<Request>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    path: PathBuf,
}

impl LogWriter {
    /// Starts the thread; it owns `db` from now on.
    pub(crate) fn start(
        db: Arc<Database>,
        path: PathBuf,
        pending: Arc<Pending>,
        counters: Arc<Counters>,
    ) -> io::Result<LogWriter> {
        let (tx, rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("mqkv-log-writer".into())
            .spawn(move || run(db, rx, &pending, &counters))?;
        Ok(LogWriter {
            tx,
            thread: Mutex::new(Some(thread)),
            path,
        })
    }

    /// Queues entries; `flushed` is called once they are durable.
    pub(crate) fn append(&self, write: LogWrite, flushed: LogFlushed<TypeConfig>) {
        if let Err(mpsc::SendError(Request::Write(_, done))) =
            self.tx.send(Request::Write(write, Done::Flushed(flushed)))
        {
            done.complete(Err(self.closed()));
        }
    }

    /// Queues a change that needs no acknowledgement.
    pub(crate) fn note(&self, write: LogWrite) {
        // After close there is nobody left to care about a hint.
        let _ = self.tx.send(Request::Write(write, Done::Nobody));
    }

    /// Queues a change and waits until it is durable.
    pub(crate) async fn write(&self, write: LogWrite) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Request::Write(write, Done::Reply(tx)))
            .map_err(|_| self.closed())?;
        rx.await.map_err(|_| self.closed())?
    }

    /// Writes what is queued, closes the file and ends the thread. Later
    /// changes fail. Calling it again is harmless.
    pub(crate) async fn close(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Request::Close(tx)).is_err() {
            return Ok(());
        }
        let result = rx.await.unwrap_or(Ok(()));
        let thread = sync::lock(&self.thread).take();
        if let Some(thread) = thread {
            // The thread has answered and only returns now; a panic in it
            // would already have failed the changes it held.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        result
    }

    fn closed(&self) -> io::Error {
        io::Error::other(format!("{} is closed", self.path.display()))
    }
}

fn run(db: Arc<Database>, rx: mpsc::Receiver<Request>, pending: &Pending, counters: &Counters) {
    let mut pending_hint: Option<LogWrite> = None;
    let mut close_reply = None;
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take() {
            match request {
                Request::Write(write, done) => batch.push((write, done)),
                Request::Close(reply) => {
                    close_reply = Some(reply);
                    break;
                }
            }
            next = rx.try_recv().ok();
        }
        let closing = close_reply.is_some();
        if let Err(e) = commit(
            &db,
            &mut batch,
            &mut pending_hint,
            closing,
            pending,
            counters,
        ) {
            let message = e.to_string();
            for (_, done) in batch.drain(..) {
                done.complete(Err(io::Error::new(e.kind(), message.clone())));
            }
        }
        if closing {
            break;
        }
    }
    drop(db);
    if let Some(reply) = close_reply {
        let _ = reply.send(Ok(()));
    }
}

/// Writes one batch in one transaction. Completes every change on success;
/// leaves them in `batch` on failure.
fn commit(
    db: &Database,
    batch: &mut Vec<(LogWrite, Done)>,
    pending_hint: &mut Option<LogWrite>,
    closing: bool,
    pending: &Pending,
    counters: &Counters,
) -> io::Result<()> {
    // Hints are only written together with something durable; the newest
    // one replaces older ones.
    let mut durable = Vec::with_capacity(batch.len());
    for (write, done) in batch.drain(..) {
        if write.needs_sync() {
            durable.push((write, done));
        } else {
            *pending_hint = Some(write);
            done.complete(Ok(()));
        }
    }
    if durable.is_empty() && !(closing && pending_hint.is_some()) {
        return Ok(());
    }
    let result = write_durably(
        db,
        durable.iter().map(|(w, _)| w).chain(pending_hint.as_ref()),
    );
    match result {
        Ok(appended_bytes) => {
            *pending_hint = None;
            let mut entries = 0;
            for (write, _) in &durable {
                if let LogWrite::Append(written) = write {
                    pending.settle(written);
                    entries += written.len() as u64;
                }
            }
            Counters::add(&counters.log_commits, 1);
            Counters::add(&counters.log_entries_written, entries);
            Counters::add(&counters.log_bytes_since_snapshot, appended_bytes);
            for (_, done) in durable {
                done.complete(Ok(()));
            }
            Ok(())
        }
        Err(e) => {
            batch.extend(durable);
            Err(e)
        }
    }
}

/// Returns the encoded size of the entries appended.
fn write_durably<'a>(
    db: &Database,
    changes: impl Iterator<Item = &'a LogWrite>,
) -> io::Result<u64> {
    let mut txn = db.begin_write().map_err(io::Error::other)?;
    txn.set_durability(Durability::Immediate)
        .map_err(io::Error::other)?;
    let appended = match log_file::write(&txn, changes) {
        Ok(appended) => appended,
        Err(e) => {
            // Dropping the transaction aborts it; the abort's own error adds
            // nothing to the first one.
            let _ = txn.abort();
            return Err(io::Error::other(e));
        }
    };
    txn.commit().map_err(io::Error::other)?;
    Ok(appended)
}
