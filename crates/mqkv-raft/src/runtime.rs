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
//! Invariant: the thread runs until [`RaftThread::stop`] (or drop); tasks
//! still on it then are dropped.

use std::future::Future;
use std::io;
use std::sync::Mutex;
use std::thread;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::sync;

pub(crate) struct RaftThread {
    handle: Handle,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl RaftThread {
    pub(crate) fn start() -> io::Result<RaftThread> {
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

    /// Ends the thread; tasks still on it are dropped. Calling it again is
    /// harmless.
    pub(crate) fn stop(&self) {
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
