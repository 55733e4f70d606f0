//! Connection threads. Each runs a single-threaded Tokio runtime of its own and serves the
//! connections placed on it: a connection's reads, requests and writes all happen on one
//! thread, each thread waits on its own epoll instance, and no task is stolen by another thread.
//! A work-stealing runtime instead shares one poller among its workers and wakes an idle worker
//! to take over part of a busy one's queue, which costs a futex wake-up and cache misses on
//! every hand-over.
//!
//! A connection moves only as a whole, and only when its messages come (nearly) all from
//! publishers served by one other thread (`co_locate`): then each publish would cost that
//! thread a hand-off and this one a wake-up, where on one thread the publish and its deliveries
//! are handled in one pass. The session counts where its messages come from
//! (`placement::colocate`), the connection's reader moves it between two packets
//! (`connection::Conn::try_move`), and [`ConnThreads::serve_on`] registers the socket with the
//! other thread's poller; [`ConnThreads::may_take`] keeps one thread from taking more than its
//! share.
//!
//! Output that another connection's thread routes to a connection reaches it through the
//! connection's thread's outbox: whatever is posted together costs that thread one wake-up, and
//! the writes themselves happen on the thread that owns the socket. (A message put straight into
//! a session, such as a key notification from the state store's raft thread, wakes the
//! connection's writer task directly.) Wake-ups of a connection's task from other threads
//! (the answer to a state store write, from raft's thread) go through the outbox too: a
//! direct wake from another thread writes to the runtime's eventfd every time, while a batch of
//! answers posted together costs one.
//!
//! With `pin_connection_threads` each thread is pinned to a CPU of its own (see
//! [`super::affinity`]); the threads their runtimes start for blocking work may run on every CPU
//! the process may use.
//!
//! One thread can be lent ([`ConnThreads::lend_last`]) for other work to run on beside its
//! connections: the state store's raft, when the connection threads already take every CPU. A
//! lent thread stops when the loan ends ([`LentThread`] is dropped), not with the others.
//!
//! The threads accept from the listening socket themselves (each on its own poller; up to four
//! of them, see [`ACCEPTING_THREADS`]), so a new connection is usually served by
//! the thread that accepted it, with no hand-over. A thread that already serves two or more
//! connections more than the least busy one hands a connection it accepts over to that thread
//! instead, so long-lived connections end up spread evenly.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, Notify};

use super::affinity;
use super::Output;

thread_local! {
    /// One more than the index of the connection thread running here; 0 elsewhere.
    static HOME: Cell<usize> = const { Cell::new(0) };
    /// The outbox of the connection thread running here.
    static OUTBOX: RefCell<Option<Arc<Outbox>>> = const { RefCell::new(None) };
}

/// The connection thread the caller runs on, as `1 + index`, or 0 on any other thread.
pub(crate) fn current_home() -> usize {
    HOME.with(Cell::get)
}

/// Work posted to a connection thread.
pub(crate) enum Posted {
    /// Output a connection has ready, and whether it is one of a fan-out's deliveries (see
    /// [`Output::write_ready`]).
    Write(Arc<dyn Output>, bool),
    /// A task of the thread to wake.
    Wake(Waker),
}

#[derive(Default)]
struct Outbox {
    ready: Mutex<Vec<Posted>>,
    wake: Notify,
}

impl Outbox {
    /// Queues `posted`, waking the thread's flusher only when the outbox was empty: it takes
    /// everything posted before it runs.
    fn post(&self, posted: Posted) {
        let was_empty = {
            let mut queue = self.ready.lock();
            let was_empty = queue.is_empty();
            queue.push(posted);
            was_empty
        };
        if was_empty {
            self.wake.notify_one();
        }
    }
}

/// A waker for a task of a connection thread that, woken from another thread, goes through the
/// thread's outbox (see the module documentation).
struct HomeWaker {
    home: usize,
    outbox: Arc<Outbox>,
    task: Waker,
}

impl Wake for HomeWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if current_home() == self.home {
            self.task.wake_by_ref();
        } else {
            self.outbox.post(Posted::Wake(self.task.clone()));
        }
    }
}

/// A waker for the calling task that batches wake-ups from other threads, when the caller runs
/// on a connection thread (the only threads with an outbox); elsewhere the task's own waker.
pub(crate) fn home_waker(task: &Waker) -> Waker {
    match OUTBOX.with(|o| o.borrow().clone()) {
        Some(outbox) => Waker::from(Arc::new(HomeWaker {
            home: current_home(),
            outbox,
            task: task.clone(),
        })),
        None => task.clone(),
    }
}

struct ConnThread {
    handle: tokio::runtime::Handle,
    outbox: Arc<Outbox>,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    /// Connections placed on the thread and not yet ended.
    live: Arc<AtomicUsize>,
}

/// How many more connections than the least busy thread a thread may take before it hands the
/// ones it accepts over.
const PLACEMENT_SLACK: usize = 2;

/// Connections a thread may serve beyond twice its share and still take one moved to it (see
/// [`ConnThreads::may_take`]).
const MOVE_SLACK: usize = 8;

/// Counts a connection as live on its thread until dropped.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(live: &Arc<AtomicUsize>) -> Live {
        live.fetch_add(1, Ordering::Relaxed);
        Live(live.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The broker's connection threads.
pub(crate) struct ConnThreads {
    threads: Vec<ConnThread>,
    next: AtomicUsize,
    /// The threads are pinned, one to each CPU the process may use.
    on_every_cpu: bool,
}

/// A connection thread lent out (see `ConnThreads::lend_last`): tasks spawned through
/// [`LentThread::handle`] run on it beside its connections. Dropping this stops the thread (its
/// connections' tasks and the borrower's are dropped with its runtime).
pub struct LentThread {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl LentThread {
    /// The runtime of the thread.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl std::fmt::Debug for LentThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LentThread").finish_non_exhaustive()
    }
}

impl Drop for LentThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl ConnThreads {
    /// Starts `n` threads (at least one), each pinned to a CPU of its own if `pin` (see
    /// [`affinity::plan`]), and under the batch policy if `batch` (see
    /// [`affinity::batch_current_thread`]; the runtimes' threads for blocking work inherit it).
    pub(crate) fn start(n: usize, pin: bool, batch: bool) -> std::io::Result<ConnThreads> {
        let n = n.max(1);
        let (allowed, cpus) = if pin {
            let allowed = affinity::allowed_cpus();
            let plan = affinity::plan(n, &allowed);
            match &plan {
                Some(cpus) => tracing::debug!(?cpus, "connection threads pinned"),
                None => tracing::debug!(
                    threads = n,
                    cpus = allowed.len(),
                    "connection threads not pinned"
                ),
            }
            (allowed, plan)
        } else {
            (Vec::new(), None)
        };
        let on_every_cpu = cpus.as_ref().is_some_and(|c| c.len() == allowed.len());
        let mut threads = Vec::with_capacity(n);
        // Each thread reports once it is pinned, so the threads run where they should before
        // the first connection reaches them.
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        for index in 0..n {
            let cpu = cpus.as_ref().and_then(|c| c.get(index).copied());
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder.enable_all();
            if cpu.is_some() {
                // Threads inherit the CPUs of the thread that starts them: the runtime's threads
                // for blocking work (snapshots of a state store whose raft runs here, say) get
                // every CPU back.
                let allowed = allowed.clone();
                builder.on_thread_start(move || {
                    if let Err(e) = affinity::set_current_thread_cpus(&allowed) {
                        tracing::debug!(error = %e, "a blocking thread keeps its CPU");
                    }
                });
            }
            let runtime = builder.build()?;
            let handle = runtime.handle().clone();
            let outbox = Arc::new(Outbox::default());
            let (stop, stopped) = oneshot::channel::<()>();
            let flusher = flush_outbox(outbox.clone());
            let own_outbox = outbox.clone();
            let started_tx = started_tx.clone();
            std::thread::Builder::new()
                .name(format!("mqkv-conn-{index}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        if let Err(e) = affinity::pin_current_thread(cpu) {
                            tracing::warn!(cpu, error = %e, "cannot pin a connection thread");
                        }
                    }
                    if batch {
                        if let Err(e) = affinity::batch_current_thread() {
                            tracing::warn!(error = %e, "cannot batch-schedule a connection thread");
                        }
                    }
                    let _ = started_tx.send(());
                    HOME.with(|h| h.set(index + 1));
                    OUTBOX.with(|o| *o.borrow_mut() = Some(own_outbox));
                    runtime.spawn(flusher);
                    runtime.spawn(super::tidy::release_freed_memory_periodically());
                    // Until the broker stops them; dropping the runtime then drops whatever
                    // connections are left.
                    let _ = runtime.block_on(stopped);
                })?;
            threads.push(ConnThread {
                handle,
                outbox,
                stop: Mutex::new(Some(stop)),
                live: Arc::new(AtomicUsize::new(0)),
            });
        }
        drop(started_tx);
        // Ends early only if a thread died before reporting; its runtime then never serves.
        for _ in 0..n {
            if started.recv().is_err() {
                break;
            }
        }
        Ok(ConnThreads {
            threads,
            next: AtomicUsize::new(0),
            on_every_cpu,
        })
    }

    /// Whether the threads are pinned, one on each CPU the process may use: no CPU is left
    /// for another busy thread of the process.
    pub(crate) fn on_every_cpu(&self) -> bool {
        self.on_every_cpu
    }

    /// Lends the last thread out, unless it was lent (or stopped) already: it keeps serving its
    /// connections, and from now on stops only when the loan ends, not with [`Self::stop`].
    pub(crate) fn lend_last(&self) -> Option<LentThread> {
        let thread = self.threads.last()?;
        let stop = thread.stop.lock().take()?;
        Some(LentThread {
            handle: thread.handle.clone(),
            stop: Some(stop),
        })
    }

    /// How many threads there are.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Thread `index`, modulo the number of threads.
    fn thread(&self, index: usize) -> &ConnThread {
        &self.threads[index % self.threads.len()]
    }

    /// Registers `listener` with the poller of thread `index`, to be accepted from by a task
    /// spawned there (see [`Self::spawn_on`]).
    pub(crate) fn listener_on(
        &self,
        index: usize,
        listener: std::net::TcpListener,
    ) -> std::io::Result<tokio::net::TcpListener> {
        let _runtime = self.thread(index).handle.enter();
        tokio::net::TcpListener::from_std(listener)
    }

    /// Runs `task` on thread `index` (modulo the number of threads).
    pub(crate) fn spawn_on<Fut>(&self, index: usize, task: Fut)
    where
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.thread(index).handle.spawn(task);
    }

    /// The least busy thread; among equals, the next in turn.
    fn least_busy(&self) -> usize {
        let n = self.threads.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| self.threads[i].live.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Serves a connection accepted on this thread here, unless this thread already has
    /// [`PLACEMENT_SLACK`] more connections than the least busy one: then there. Off the
    /// connection threads, it goes to the least busy one.
    pub(crate) fn place<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let least = self.least_busy();
        let here = current_home()
            .checked_sub(1)
            .filter(|&i| i < self.threads.len())
            .filter(|&i| {
                let load = |t: usize| self.threads[t].live.load(Ordering::Relaxed);
                load(i) < load(least) + PLACEMENT_SLACK
            });
        match here {
            Some(i) => {
                let live = Live::new(&self.threads[i].live);
                tokio::spawn(async move {
                    let _live = live;
                    serve(stream).await;
                });
            }
            None => self.hand_over(least, stream, serve),
        }
    }

    /// Serves `stream` on thread `index`.
    fn hand_over<F, Fut>(&self, index: usize, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // The socket moves to the thread's own poller.
        match stream.into_std() {
            Ok(stream) => self.serve_on(index, stream, serve),
            Err(e) => tracing::warn!(error = %e, "cannot hand over an accepted connection"),
        }
    }

    /// Serves `stream`, taken off another thread's poller, on thread `index`.
    pub(crate) fn serve_on<F, Fut>(&self, index: usize, stream: std::net::TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let thread = self.thread(index);
        let live = Live::new(&thread.live);
        thread.handle.spawn(async move {
            let _live = live;
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "cannot register a connection"),
            }
        });
    }

    /// Whether thread `home` (as [`current_home`] numbers them) may take one more connection
    /// moved from another thread: one that serves more than twice its share, and then some,
    /// takes no more, so a thread whose publishers feed everyone does not end up with all the
    /// connections of a large machine.
    pub(crate) fn may_take(&self, home: usize) -> bool {
        let Some(thread) = home.checked_sub(1).and_then(|i| self.threads.get(i)) else {
            return false;
        };
        let total: usize = self
            .threads
            .iter()
            .map(|t| t.live.load(Ordering::Relaxed))
            .sum();
        thread.live.load(Ordering::Relaxed) < 2 * total / self.threads.len() + MOVE_SLACK
    }

    /// Posts output for a connection served by thread `home` (as [`current_home`] numbers
    /// them); `fan_out` as for [`Output::write_ready`].
    pub(crate) fn post(&self, home: usize, output: Arc<dyn Output>, fan_out: bool) {
        if let Some(thread) = home.checked_sub(1).and_then(|i| self.threads.get(i)) {
            thread.outbox.post(Posted::Write(output, fan_out));
        }
    }

    /// Stops every thread; connections still open are dropped.
    pub(crate) fn stop(&self) {
        for t in &self.threads {
            if let Some(stop) = t.stop.lock().take() {
                let _ = stop.send(());
            }
        }
    }
}

/// Most connection threads that accept from one listener. Each new connection wakes every
/// thread waiting on the listener, and all but one of them find nothing to accept: a few
/// accepting threads spare most connections a hand-over without waking every core for each.
pub(crate) const ACCEPTING_THREADS: usize = 4;

/// Which of `n` connection threads accept: at most [`ACCEPTING_THREADS`], spread evenly.
pub(crate) fn accepting_threads(n: usize) -> impl Iterator<Item = usize> {
    let k = n.clamp(1, ACCEPTING_THREADS);
    (0..k).map(move |i| i * n.max(1) / k)
}

impl ConnThreads {
    /// The threads that accept from a listener (see [`accepting_threads`]).
    pub(crate) fn accepting(&self) -> impl Iterator<Item = usize> {
        accepting_threads(self.len())
    }
}

impl Drop for ConnThreads {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes what other threads post for this thread's connections.
async fn flush_outbox(outbox: Arc<Outbox>) {
    let mut batch = Vec::new();
    loop {
        std::mem::swap(&mut batch, &mut *outbox.ready.lock());
        if batch.is_empty() {
            outbox.wake.notified().await;
            continue;
        }
        for posted in batch.drain(..) {
            match posted {
                Posted::Write(output, fan_out) => output.write_ready(fan_out),
                Posted::Wake(task) => task.wake(),
            }
        }
    }
}

#[cfg(test)]
#[path = "threads_tests.rs"]
mod tests;
