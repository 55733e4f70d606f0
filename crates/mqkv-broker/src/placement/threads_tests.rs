use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::time::Duration;

/// An accepted loopback connection (the client end is returned too, to keep it open).
async fn accepted() -> (TcpStream, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let client = TcpStream::connect(addr).await.expect("connect");
    let (server, _) = listener.accept().await.expect("accept");
    (server, client)
}

/// A thread takes a moved connection only while it serves at most twice its share of the
/// connections, plus [`MOVE_SLACK`]; there is no thread 0 or beyond the last.
#[test]
fn a_thread_with_more_than_twice_its_share_takes_no_moved_connection() {
    let threads = ConnThreads::start(4, false, false).expect("threads");
    let set = |counts: [usize; 4]| {
        for (t, n) in threads.threads.iter().zip(counts) {
            t.live.store(n, Ordering::Relaxed);
        }
    };
    set([20, 0, 0, 0]);
    // 20 connections, a share of 5: up to 2 * 5 + 8 = 18 on one thread.
    assert!(!threads.may_take(1), "20 is more than 18");
    assert!(threads.may_take(2));
    set([17, 1, 1, 1]);
    assert!(threads.may_take(1), "17 is within 2 * 5 + 8");
    assert!(!threads.may_take(0));
    assert!(!threads.may_take(5));
    set([0, 0, 0, 0]);
    threads.stop();
}

/// Connections placed from a thread that is no connection thread go to the least busy
/// thread. They stay open, so which thread is least busy does not depend on when the
/// earlier ones end.
#[tokio::test]
async fn connections_placed_from_elsewhere_spread_over_the_threads() {
    let threads = ConnThreads::start(2, false, false).expect("threads");
    let (tx, rx) = mpsc::channel();
    let mut clients = Vec::new();
    let mut homes = Vec::new();
    for _ in 0..4 {
        let (server, client) = accepted().await;
        clients.push(client);
        let tx = tx.clone();
        threads.place(server, move |_stream| async move {
            let _ = tx.send(current_home());
            std::future::pending::<()>().await;
        });
        homes.push(rx.recv_timeout(Duration::from_secs(5)).expect("served"));
    }
    assert_eq!(homes, vec![1, 2, 1, 2]);
    assert_eq!(
        current_home(),
        0,
        "the test's own thread is no connection thread"
    );
}

/// What `report` finds when run on each thread in turn.
fn reports<T, F, Fut>(threads: &ConnThreads, report: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    (0..threads.len())
        .map(|i| {
            let (tx, rx) = mpsc::channel();
            let report = report();
            threads.spawn_on(i, async move {
                let _ = tx.send(report.await);
            });
            rx.recv_timeout(Duration::from_secs(5)).expect("reported")
        })
        .collect()
}

/// What each thread reports of the CPUs it may run on.
fn cpus_of(threads: &ConnThreads) -> Vec<Vec<usize>> {
    reports(threads, || async { affinity::allowed_cpus() })
}

#[test]
fn pinned_threads_run_on_a_cpu_each() {
    let allowed = affinity::allowed_cpus();
    let n = allowed.len().min(2);
    let threads = ConnThreads::start(n, true, false).expect("threads");
    let seen = cpus_of(&threads);
    if cfg!(target_os = "linux") && allowed.len() > 1 {
        assert_eq!(seen, vec![vec![allowed[0]], vec![allowed[1]]]);
    } else {
        assert_eq!(seen, vec![allowed; n]);
    }
}

#[test]
fn threads_are_not_pinned_unless_asked_or_when_they_would_share() {
    let allowed = affinity::allowed_cpus();
    let unpinned = ConnThreads::start(2, false, false).expect("threads");
    assert_eq!(cpus_of(&unpinned), vec![allowed.clone(); 2]);
    let more = allowed.len() + 1;
    let crowded = ConnThreads::start(more, true, false).expect("threads");
    assert_eq!(cpus_of(&crowded), vec![allowed; more]);
}

#[test]
fn blocking_threads_of_a_pinned_thread_may_run_on_every_cpu() {
    let allowed = affinity::allowed_cpus();
    let threads = ConnThreads::start(allowed.len().min(2), true, false).expect("threads");
    let (tx, rx) = mpsc::channel();
    threads.spawn_on(0, async move {
        let blocking = tokio::task::spawn_blocking(affinity::allowed_cpus).await;
        let _ = tx.send((affinity::allowed_cpus(), blocking.ok()));
    });
    let (own, blocking) = rx.recv_timeout(Duration::from_secs(5)).expect("reported");
    if cfg!(target_os = "linux") && allowed.len() > 1 {
        assert_eq!(own, vec![allowed[0]], "the connection thread is pinned");
    }
    assert_eq!(blocking, Some(allowed), "its blocking threads are not");
}

/// Whether each thread, and a blocking thread of its runtime, runs under the batch policy.
#[cfg(target_os = "linux")]
fn batch_of(threads: &ConnThreads) -> Vec<(bool, bool)> {
    reports(threads, || async {
        let blocking = tokio::task::spawn_blocking(affinity::current_thread_is_batch)
            .await
            .expect("blocking task");
        (affinity::current_thread_is_batch(), blocking)
    })
}

#[cfg(target_os = "linux")]
#[test]
fn threads_run_under_the_batch_policy_when_asked_only() {
    let batch = ConnThreads::start(2, false, true).expect("threads");
    assert_eq!(batch_of(&batch), vec![(true, true); 2]);
    let normal = ConnThreads::start(2, false, false).expect("threads");
    assert_eq!(batch_of(&normal), vec![(false, false); 2]);
    assert!(
        !affinity::current_thread_is_batch(),
        "the thread that started them keeps its policy"
    );
}

#[test]
fn pinned_threads_on_every_cpu_are_told_apart_from_fewer() {
    let allowed = affinity::allowed_cpus();
    let all = ConnThreads::start(allowed.len(), true, false).expect("threads");
    let unpinned = ConnThreads::start(allowed.len(), false, false).expect("threads");
    assert!(!unpinned.on_every_cpu());
    if cfg!(target_os = "linux") && allowed.len() > 1 {
        assert!(all.on_every_cpu());
        let fewer = ConnThreads::start(allowed.len() - 1, true, false).expect("threads");
        assert!(!fewer.on_every_cpu());
    } else {
        assert!(!all.on_every_cpu(), "one CPU: nothing is pinned");
    }
}

#[tokio::test]
async fn a_lent_thread_outlives_the_others_until_the_loan_ends() {
    let threads = ConnThreads::start(2, false, false).expect("threads");
    let lent = threads.lend_last().expect("lent");
    assert!(threads.lend_last().is_none(), "lent once only");
    // Work spawned through the loan runs on the lent connection thread.
    let home = lent.handle().spawn(async { current_home() }).await;
    assert_eq!(home.ok(), Some(2));
    // Stopping the broker's threads leaves it running...
    let stopped_other = Arc::new(AtomicBool::new(false));
    let stopped_lent = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(stopped_other.clone());
    threads.spawn_on(0, async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    let guard = SetOnDrop(stopped_lent.clone());
    lent.handle().spawn(async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    threads.stop();
    assert!(set_within_5s(&stopped_other), "thread 0 stopped");
    let still = lent.handle().spawn(async { current_home() }).await;
    assert_eq!(still.ok(), Some(2), "the lent thread still runs tasks");
    assert!(!stopped_lent.load(Ordering::SeqCst));
    // ...and ending the loan stops it.
    drop(lent);
    assert!(set_within_5s(&stopped_lent), "the lent thread stopped");
}

/// Pending until `woken` is set; registers the waker `home_waker` makes.
struct WaitFor {
    woken: Arc<AtomicBool>,
    waker: mpsc::Sender<Waker>,
}

impl Future for WaitFor {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.woken.load(Ordering::SeqCst) {
            return Poll::Ready(());
        }
        let _ = self.waker.send(home_waker(cx.waker()));
        Poll::Pending
    }
}

#[tokio::test]
async fn a_wake_from_another_thread_goes_through_the_outbox() {
    let threads = ConnThreads::start(1, false, false).expect("threads");
    let (server, _client) = accepted().await;
    let woken = Arc::new(AtomicBool::new(false));
    let (waker_tx, waker_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let flag = woken.clone();
    threads.place(server, move |_stream| async move {
        WaitFor {
            woken: flag,
            waker: waker_tx,
        }
        .await;
        let _ = done_tx.send(());
    });
    let waker = waker_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("polled once");
    woken.store(true, Ordering::SeqCst);
    // From a thread that is not the task's: the wake is posted, and the thread's flusher
    // wakes the task.
    std::thread::spawn(move || waker.wake())
        .join()
        .expect("waking thread");
    done_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the task was woken and finished");
}

struct SetOnDrop(Arc<AtomicBool>);

/// Whether `flag` is set within 5 s (it is set by another thread).
fn set_within_5s(flag: &AtomicBool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !flag.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    flag.load(Ordering::SeqCst)
}

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn stopping_drops_the_connections_left() {
    let threads = ConnThreads::start(2, false, false).expect("threads");
    let (server, _client) = accepted().await;
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = SetOnDrop(dropped.clone());
    let (started_tx, started_rx) = mpsc::channel();
    threads.place(server, move |_stream| async move {
        let _guard = guard;
        let _ = started_tx.send(());
        std::future::pending::<()>().await;
    });
    started_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("started");
    assert!(!dropped.load(Ordering::SeqCst));
    threads.stop();
    assert!(set_within_5s(&dropped), "the connection outlived stop");
}

/// Accepts one connection on thread `index` and places it there; returns where it is
/// served.
async fn accept_and_place(threads: &Arc<ConnThreads>, index: usize, hold: bool) -> usize {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    let client = TcpStream::connect(addr).await.expect("connect");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let placing = threads.clone();
    threads.spawn_on(index, async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("register");
        let (server, _) = listener.accept().await.expect("accept");
        placing.place(server, move |_stream| async move {
            let _ = tx.send(current_home());
            if hold {
                let _client = client;
                std::future::pending::<()>().await;
            }
        });
    });
    tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .expect("served in time")
        .expect("served")
}

#[tokio::test]
async fn a_connection_is_served_by_the_thread_that_accepted_it() {
    let threads = Arc::new(ConnThreads::start(2, false, false).expect("threads"));
    for index in [0, 1, 1, 0] {
        assert_eq!(accept_and_place(&threads, index, false).await, index + 1);
    }
}

#[tokio::test]
async fn a_busier_thread_hands_what_it_accepts_to_the_least_busy() {
    let threads = Arc::new(ConnThreads::start(2, false, false).expect("threads"));
    let mut homes = Vec::new();
    for _ in 0..6 {
        homes.push(accept_and_place(&threads, 0, true).await);
    }
    // Thread 0 keeps connections while it has fewer than two more than thread 1.
    assert_eq!(homes, vec![1, 1, 2, 1, 2, 1], "served on {homes:?}");
    let live: Vec<usize> = threads
        .threads
        .iter()
        .map(|t| t.live.load(Ordering::Relaxed))
        .collect();
    assert_eq!(live, vec![4, 2]);
}

#[test]
fn a_few_threads_accept_spread_evenly() {
    let accepting = |n| accepting_threads(n).collect::<Vec<_>>();
    assert_eq!(accepting(0), vec![0]);
    assert_eq!(accepting(1), vec![0]);
    assert_eq!(accepting(2), vec![0, 1]);
    assert_eq!(accepting(4), vec![0, 1, 2, 3]);
    assert_eq!(accepting(8), vec![0, 2, 4, 6]);
    assert_eq!(accepting(10), vec![0, 2, 5, 7]);
}
