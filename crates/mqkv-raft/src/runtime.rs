//! The thread raft runs on.
//!
//! openraft's core, its state machine worker and the proposer are tasks.
//! On the server's shared runtime they would wait in the same run queues as
//! every client connection, and under load each hand-off between them
//! (propose, append, flushed, commit, apply, answer) would queue behind a
//! burst of connection tasks. They get a single-threaded runtime of their
//! own instead, so a write pays the operating system's thread wake-up per
//! hand-off, not a turn in a queue of connections.
//!
//! The log store writes and syncs its segment files in place, on this
//! thread: with one proposal in flight there is nothing else for it to do
//! meanwhile, and a hand-off to a writer thread and back would cost two
//! wake-ups per write. (Snapshots are built and installed off this thread.)
//!
//! Where the process has no CPU to spare for such a thread (its connection
//! threads are pinned one to every CPU), raft runs on a thread it is lent
//! instead ([`SharedThread`]): one of the broker's connection threads. The
//! hand-offs between raft and that thread's connections are then no
//! thread wake-ups at all, and the log's syncs go to a thread of their own
//! (see `log_store`), so that the connections are served while the disk
//! works. The CPU a write costs stays the same; what it saves is waiting:
//! on two CPUs shared with its clients, durable writes at 64 clients went
//! up by about a twentieth (see `docs/design/performance.md`).
//!
//! Invariant: the thread runs until [`RaftThread::stop`] (or drop); tasks
//! still on it then are dropped. A lent thread is given back then instead
//! (the lender decides what that does).

use std::any::Any;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex};
use std::thread;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::sync;

/// A thread of someone else's for raft to run on: its runtime, and the
/// loan itself, dropped when the store has shut down (or failed to open).
#[derive(Clone)]
pub struct SharedThread {
    handle: Handle,
    loan: Arc<dyn Any + Send + Sync>,
}

impl SharedThread {
    /// Raft's tasks go to `handle`'s runtime, which must be driven by one
    /// thread (a current-thread runtime) for the hand-offs to cost no
    /// wake-ups. `loan` is dropped once the store no longer needs it.
    pub fn new(handle: Handle, loan: impl Any + Send + Sync) -> SharedThread {
        SharedThread {
            handle,
            loan: Arc::new(loan),
        }
    }
}

impl std::fmt::Debug for SharedThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedThread").finish_non_exhaustive()
    }
}

pub(crate) struct RaftThread {
    handle: Handle,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    loan: Mutex<Option<Arc<dyn Any + Send + Sync>>>,
}

impl RaftThread {
    /// A thread of its own, or the `shared` one.
    pub(crate) fn start(shared: Option<SharedThread>) -> io::Result<RaftThread> {
        if let Some(shared) = shared {
            return Ok(RaftThread {
                handle: shared.handle,
                stop: Mutex::new(None),
                thread: Mutex::new(None),
                loan: Mutex::new(Some(shared.loan)),
            });
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name("mqkv-raft".into())
            .spawn(move || {
                // Either a stop request or a dropped sender ends the thread.
                let _ = runtime.block_on(stopped);
            })?;
        Ok(RaftThread {
            handle,
            stop: Mutex::new(Some(stop)),
            thread: Mutex::new(Some(thread)),
            loan: Mutex::new(None),
        })
    }

    /// Runs `future` on the raft thread (tasks it spawns stay there) and
    /// waits for its result from any runtime.
    pub(crate) async fn run<F>(&self, future: F) -> Result<F::Output, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle
            .spawn(future)
            .await
            .map_err(|e| format!("the raft thread dropped a task: {e}"))
    }

    /// Ends the thread, or gives a lent one back; tasks still on it are
    /// dropped (on a lent thread, as its lender decides). Calling it again
    /// is harmless.
    pub(crate) fn stop(&self) {
        drop(sync::lock(&self.loan).take());
        if let Some(stop) = sync::lock(&self.stop).take() {
            let _ = stop.send(());
        }
        // Joining would block an async caller; the thread ends on its own
        // once `block_on` returns.
        drop(sync::lock(&self.thread).take());
    }
}

impl Drop for RaftThread {
    fn drop(&mut self) {
        self.stop();
    }
}
