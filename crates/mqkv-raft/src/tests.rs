//! End-to-end tests of a store: durability across restarts, snapshots and
//! purging, group commit, and refusal of files it must not open.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use mqkv_protocol::{Command, Hlc, Response, SetCondition};
use mqkv_store::{Applied, ChangeKind, DedupId, Entry, Op, Request, StateMachine, StoreConfig};

use crate::files::{test_support::set_format_version, FileKind};
use crate::state_machine::StateMachineStore;
use crate::stats::Counters;
use crate::{ApplyHook, NodeOptions, OpenError, StoreNode, StoreStats, WriteError};
use openraft::storage::RaftStateMachine;

const T0: u64 = 1_700_000_000_000;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn config() -> StoreConfig {
    StoreConfig::new("srv")
}

fn request(now_ms: u64, command: Command, ft: Option<Hlc>, dedup: Option<DedupId>) -> Entry {
    Entry {
        now_ms,
        op: Op::Request(Request {
            command,
            ts: Some(Hlc::new(now_ms, 0, "client")),
            ft,
            dedup,
        }),
    }
}

fn set_with(
    now_ms: u64,
    key: &str,
    value: &str,
    condition: Option<SetCondition>,
    px_ms: Option<u64>,
) -> Entry {
    request(
        now_ms,
        Command::Set {
            key: b(key),
            value: b(value),
            condition,
            px_ms,
        },
        None,
        None,
    )
}

fn set(now_ms: u64, key: &str, value: &str) -> Entry {
    set_with(now_ms, key, value, None, None)
}

fn dedup(now_ms: u64, correlation: &str) -> Option<DedupId> {
    Some(DedupId {
        client_id: "client".into(),
        correlation: b(correlation),
        expires_at_ms: now_ms + 60_000,
    })
}

/// Records what the apply hook sees.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Applied>>>);

impl Recorder {
    fn hook(&self) -> ApplyHook {
        let seen = self.0.clone();
        Arc::new(move |_: &Entry, applied: &Applied| seen.lock().unwrap().push(applied.clone()))
    }

    fn seen(&self) -> Vec<Applied> {
        self.0.lock().unwrap().clone()
    }
}

fn small_snapshots() -> NodeOptions {
    NodeOptions {
        snapshot_every: 20,
        logs_kept_after_snapshot: 5,
        ..NodeOptions::default()
    }
}

/// A snapshot every 7 entries and no log kept behind it: a restart restores
/// from a snapshot taken while the writes went on.
fn frequent_snapshots() -> NodeOptions {
    NodeOptions {
        snapshot_every: 7,
        logs_kept_after_snapshot: 0,
        ..NodeOptions::default()
    }
}

async fn open(dir: &Path, options: NodeOptions) -> (StoreNode, Recorder) {
    let recorder = Recorder::default();
    let node = StoreNode::open_disk_with(dir, config(), recorder.hook(), options)
        .await
        .expect("open store");
    (node, recorder)
}

/// Writes through the node and into `direct`, and checks both answer alike.
async fn write_both(node: &StoreNode, direct: &mut StateMachine, entry: Entry) -> Applied {
    let applied = node.write(entry.clone()).await.expect("write");
    assert_eq!(applied, direct.apply(&entry), "answer for {entry:?}");
    applied
}

fn snapshot_of(node: &StoreNode) -> StateMachine {
    node.read(|machine| machine.clone())
}

/// Waits for a background snapshot to land (it is built off the write path).
async fn wait_for_snapshot(node: &StoreNode) {
    for _ in 0..500 {
        if node.stats().snapshots_built > 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no snapshot was built");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_round_trip() {
    let recorder = Recorder::default();
    let node = StoreNode::open_memory(config(), recorder.hook())
        .await
        .unwrap();
    let applied = node.write(set(T0, "k", "v")).await.unwrap();
    assert_eq!(applied.response, Response::Ok);
    let version = applied.version.clone().expect("SET OK has a version");
    assert_eq!(node.read(|m| m.get(b"k", T0)), Some((b("v"), version)));
    let deleted = node
        .write(request(T0 + 1, Command::Del { key: b("k") }, None, None))
        .await
        .unwrap();
    assert_eq!(deleted.response, Response::Integer(1));
    assert_eq!(node.read(|m| m.get(b"k", T0 + 1)), None);
    assert_eq!(recorder.seen(), vec![applied, deleted]);
    node.shutdown().await.unwrap();
    assert!(matches!(
        node.write(set(T0 + 2, "k", "v")).await,
        Err(WriteError::Stopped)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_sees_every_write_in_order_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (node, recorder) = open(dir.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    for i in 0..10 {
        let applied =
            write_both(&node, &mut direct, set(T0 + i, &format!("k{}", i % 3), "v")).await;
        let seen = recorder.seen();
        assert_eq!(seen.len() as u64, i + 1);
        assert_eq!(seen.last(), Some(&applied));
        assert!(matches!(applied.events[0].kind, ChangeKind::Set { .. }));
    }
    node.shutdown().await.unwrap();
}

/// Writes keys with a version, a deadline, a fencing token and a remembered
/// answer, restarts, and checks all of it came back and behaves the same.
async fn restart_preserves_state(options: NodeOptions, writes_before: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = StateMachine::new(config());
    let (node, _) = open(dir.path(), options.clone()).await;
    for i in 0..writes_before {
        write_both(
            &node,
            &mut direct,
            set(T0 + i, &format!("filler{}", i % 7), "x"),
        )
        .await;
    }
    let now = T0 + writes_before;
    let plain = write_both(&node, &mut direct, set(now, "plain", "v1")).await;
    write_both(
        &node,
        &mut direct,
        set_with(now, "ttl", "v", None, Some(60_000)),
    )
    .await;
    let fence = Hlc::new(now - 5, 0, "client");
    let fenced = request(
        now,
        Command::Set {
            key: b("fenced"),
            value: b("v"),
            condition: None,
            px_ms: None,
        },
        Some(fence.clone()),
        None,
    );
    write_both(&node, &mut direct, fenced).await;
    let once = request(
        now,
        Command::Set {
            key: b("once"),
            value: b("first"),
            condition: Some(SetCondition::Nx),
            px_ms: None,
        },
        None,
        dedup(now, "corr-1"),
    );
    assert_eq!(
        write_both(&node, &mut direct, once.clone()).await.response,
        Response::Ok
    );
    let before = snapshot_of(&node);
    node.shutdown().await.unwrap();

    let (node, recorder) = open(dir.path(), options).await;
    assert!(
        recorder.seen().is_empty(),
        "replayed entries must not reach the hook"
    );
    let after = snapshot_of(&node);
    assert_eq!(after, before);
    assert_eq!(
        after.get(b"plain", now),
        Some((b("v1"), plain.version.unwrap()))
    );
    assert_eq!(after.expires_at_ms(b"ttl", now), Some(now + 60_000));
    assert_eq!(after.fencing_token(b"fenced", now), Some(&fence));
    assert_eq!(after.clock(), before.clock());
    assert_eq!(after.dedup_len(), 1);

    // The redelivered NX gets its first answer; a new one is refused.
    let later = now + 10;
    let redelivered = Entry {
        now_ms: later,
        ..once
    };
    assert_eq!(
        write_both(&node, &mut direct, redelivered).await.response,
        Response::Ok
    );
    let again = request(
        later,
        Command::Set {
            key: b("once"),
            value: b("second"),
            condition: Some(SetCondition::Nx),
            px_ms: None,
        },
        None,
        dedup(later, "corr-2"),
    );
    assert_eq!(
        write_both(&node, &mut direct, again).await.response,
        Response::NotApplied
    );
    // The fencing token still guards the key: a lower one is refused.
    let stale = request(
        later,
        Command::Set {
            key: b("fenced"),
            value: b("w"),
            condition: None,
            px_ms: None,
        },
        Some(Hlc::new(now - 6, 0, "client")),
        None,
    );
    assert!(matches!(
        write_both(&node, &mut direct, stale).await.response,
        Response::Error(_)
    ));
    // The deadline still fires.
    let expire = Entry {
        now_ms: now + 60_000,
        op: Op::ExpireDue,
    };
    let expired = write_both(&node, &mut direct, expire).await;
    assert!(expired
        .events
        .iter()
        .any(|e| e.key == b("ttl") && e.kind == ChangeKind::Delete));
    assert_eq!(recorder.seen().len(), 4);
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_the_log() {
    restart_preserves_state(NodeOptions::default(), 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_loads_the_snapshot_and_replays_after_it() {
    restart_preserves_state(small_snapshots(), 57).await;
}

/// A thread lent to raft as the broker lends a connection thread: a
/// current-thread runtime on a thread named `lent`, which ends once the
/// loan is dropped (the flag tells when it has).
fn lent_thread() -> (crate::SharedThread, Arc<std::sync::atomic::AtomicBool>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let handle = runtime.handle().clone();
    let (loan, ended) = tokio::sync::oneshot::channel::<()>();
    let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = gone.clone();
    std::thread::Builder::new()
        .name("lent".into())
        .spawn(move || {
            let _ = runtime.block_on(ended);
            drop(runtime);
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .unwrap();
    (crate::SharedThread::new(handle, loan), gone)
}

/// Names of the process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_a_lent_thread_replays_the_log_and_loads_the_snapshot() {
    let (thread, _) = lent_thread();
    for direct_log_writes in [true, false] {
        let lent = |options: NodeOptions| NodeOptions {
            thread: Some(thread.clone()),
            direct_log_writes,
            ..options
        };
        restart_preserves_state(lent(NodeOptions::default()), 5).await;
        restart_preserves_state(lent(small_snapshots()), 57).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_thread_applies_the_writes_its_appends_are_written_directly_and_the_loan_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (stats, names) = writes_on_a_lent_thread(dir.path(), true).await;
    if crate::direct_log_writes_work(dir.path()) {
        assert_eq!(stats.log_direct_writes, stats.log_commits, "{stats:?}");
    } else {
        assert_eq!(stats.log_direct_writes, 0, "{stats:?}");
        assert!(names.iter().any(|n| n == "mqkv-sync"), "{names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_thread_applies_the_writes_a_sync_thread_syncs_and_the_loan_ends_with_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (stats, names) = writes_on_a_lent_thread(dir.path(), false).await;
    assert_eq!(stats.log_direct_writes, 0, "{stats:?}");
    if cfg!(target_os = "linux") {
        assert!(names.iter().any(|n| n == "mqkv-sync"), "{names:?}");
    }
}

/// Writes 20 keys to a store in `dir` whose raft runs on a lent thread,
/// checking that they are applied there and that the loan ends with the
/// store, then reads them back after a restart on a thread of its own.
/// Returns the counters of the first store, and the process's threads
/// while it was open.
async fn writes_on_a_lent_thread(dir: &Path, direct_log_writes: bool) -> (StoreStats, Vec<String>) {
    let (thread, gone) = lent_thread();
    let applied_on = Arc::new(Mutex::new(Vec::new()));
    let seen = applied_on.clone();
    let hook: ApplyHook = Arc::new(move |_: &Entry, _: &Applied| {
        let name = std::thread::current().name().map(str::to_string);
        seen.lock().unwrap().push(name);
    });
    let options = NodeOptions {
        thread: Some(thread),
        direct_log_writes,
        ..NodeOptions::default()
    };
    let node = StoreNode::open_disk_with(dir, config(), hook, options)
        .await
        .expect("open store");
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..20 {
        let node = node.clone();
        writes.spawn(async move { node.write(set(T0 + i, &format!("k{i}"), "v")).await });
    }
    while let Some(applied) = writes.join_next().await {
        assert!(matches!(applied, Ok(Ok(_))), "{applied:?}");
    }
    let applied_on = applied_on.lock().unwrap().clone();
    assert_eq!(applied_on.len(), 20);
    assert!(
        applied_on
            .iter()
            .all(|name| name.as_deref() == Some("lent")),
        "raft ran on the lent thread: {applied_on:?}"
    );
    assert!(!gone.load(std::sync::atomic::Ordering::SeqCst));
    let stats = node.stats();
    assert!(stats.log_commits > 0);
    let names = thread_names();
    node.shutdown().await.unwrap();
    for _ in 0..500 {
        if gone.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        gone.load(std::sync::atomic::Ordering::SeqCst),
        "the lent thread ended once the store shut down"
    );
    // Everything written is there after a restart on a thread of its own.
    let (node, _) = open(dir, NodeOptions::default()).await;
    for i in 0..20 {
        let key = format!("k{i}");
        assert!(
            node.read(|m| m.get(key.as_bytes(), T0 + 100).is_some()),
            "{key} survived"
        );
    }
    node.shutdown().await.unwrap();
    (stats, names)
}

/// Entries the closed store in `dir` has in its log.
fn count_log_rows(dir: &Path) -> u64 {
    let (_, loaded) = crate::log_file::open(dir, 64 << 20).unwrap().unwrap();
    loaded.entries.len() as u64
}

/// Longest the log may get under `options`: two snapshot periods (one
/// being built while the next fills) plus the entries kept behind one.
fn log_bound(options: &NodeOptions) -> u64 {
    2 * options.snapshot_every + options.logs_kept_after_snapshot
}

/// Writes 400 SETs over 50 keys, checking every answer against a machine
/// applying the same entries, until at least ten snapshots were taken and
/// without the log ever growing past `bound`. Returns that machine.
async fn write_through_snapshots(node: &StoreNode, bound: u64) -> StateMachine {
    let mut direct = StateMachine::new(config());
    let mut longest = 0;
    for i in 0..400 {
        write_both(
            node,
            &mut direct,
            set(T0 + i, &format!("k{}", i % 50), &format!("v{i}")),
        )
        .await;
        longest = longest.max(node.stats().log_len);
    }
    wait_for_snapshot(node).await;
    let stats = node.stats();
    assert!(stats.snapshots_built >= 10, "{stats:?}");
    assert!(
        longest <= bound,
        "log grew to {longest} entries (bound {bound}): {stats:?}"
    );
    direct
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_keep_the_log_short() {
    let dir = tempfile::tempdir().unwrap();
    let options = small_snapshots();
    let bound = log_bound(&options);
    let (node, _) = open(dir.path(), options.clone()).await;
    let direct = write_through_snapshots(&node, bound).await;
    node.shutdown().await.unwrap();
    let rows = count_log_rows(dir.path());
    assert!(rows <= bound, "{rows} entries left in the log file");

    let (node, recorder) = open(dir.path(), options).await;
    assert_eq!(snapshot_of(&node), direct);
    assert!(node.stats().snapshot_index.is_some());
    assert!(recorder.seen().is_empty());
    node.shutdown().await.unwrap();
}

/// A memory store keeps no serialized copy of its state: its snapshots only
/// let raft purge the log, and one is serialized when raft asks for it, from
/// the state as it is then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_snapshots_keep_the_log_short_without_a_copy() {
    let options = small_snapshots();
    let bound = log_bound(&options);
    let node = StoreNode::open_memory_with(config(), Recorder::default().hook(), options)
        .await
        .expect("open store");
    let direct = write_through_snapshots(&node, bound).await;
    assert_eq!(Counters::get(&node.inner.counters.snapshot_bytes), 0);

    let mut raft_store = StateMachineStore::new(node.inner.state.clone());
    let current = raft_store
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("a snapshot once one was taken");
    let served: StateMachine = postcard::from_bytes(current.snapshot.get_ref()).unwrap();
    assert_eq!(served, direct);
    assert_eq!(
        current.meta.last_log_id.map(|id| id.index),
        node.stats().applied_index
    );
    node.shutdown().await.unwrap();
}

/// Reopens the store in `dir`: it must start from a snapshot and hold exactly
/// `direct`.
async fn assert_restored_from_a_snapshot(dir: &Path, options: NodeOptions, direct: &StateMachine) {
    let (node, _) = open(dir, options).await;
    let stats = node.stats();
    assert!(
        stats.snapshot_index.is_some_and(|i| i > 0),
        "restored from a snapshot: {stats:?}"
    );
    assert_eq!(&snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

/// With large values a snapshot is serialized from a copy taken under the
/// state lock (the values shared), after the lock is released, while writes
/// go on: what it restores must still be exactly the state it was taken at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_large_values_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let options = frequent_snapshots();
    let mut direct = StateMachine::new(config());
    let (node, _) = open(dir.path(), options.clone()).await;
    for i in 0..60u64 {
        let value = format!("{i:04}").repeat(1024);
        let entry = set_with(T0 + i, &format!("blob{}", i % 5), &value, None, None);
        write_both(&node, &mut direct, entry).await;
    }
    assert!(direct.snapshot_copy_pays());
    wait_for_snapshot(&node).await;
    node.shutdown().await.unwrap();
    assert_restored_from_a_snapshot(dir.path(), options, &direct).await;
}

/// A state of many keys is snapshotted piecewise while writes go on (SETs,
/// DELs, new keys, keys with deadlines): what it restores must be exactly the
/// state at the index it names, and the log after it replays onto that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piecewise_snapshot_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let options = NodeOptions {
        piecewise_snapshot_keys: 8,
        ..frequent_snapshots()
    };
    let mut direct = StateMachine::new(config());
    let (node, _) = open(dir.path(), options.clone()).await;
    for i in 0..240u64 {
        let key = format!("k{:03}", (i * 37) % 97);
        let entry = match i % 6 {
            0 => request(
                T0 + i,
                Command::Del { key: b(&key) },
                None,
                dedup(T0 + i, &key),
            ),
            1 => set_with(T0 + i, &key, "expiring", None, Some(3_600_000)),
            _ => set(T0 + i, &key, &format!("v{i}")),
        };
        write_both(&node, &mut direct, entry).await;
    }
    wait_for_snapshot(&node).await;
    let stats = node.stats();
    assert!(stats.snapshots_piecewise > 0, "{stats:?}");
    node.shutdown().await.unwrap();
    assert_restored_from_a_snapshot(dir.path(), options, &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_values_trigger_snapshots_before_the_entry_count_does() {
    let dir = tempfile::tempdir().unwrap();
    let options = NodeOptions {
        snapshot_every: 1_000_000,
        snapshot_log_bytes: 64 << 10,
        logs_kept_after_snapshot: 0,
        ..NodeOptions::default()
    };
    let (node, _) = open(dir.path(), options).await;
    let mut direct = StateMachine::new(config());
    // The change history keeps one change: the snapshot then holds about one value, so the
    // 64 KiB budget, not the size of the snapshot, is what the log is measured against.
    let one_change = Entry {
        now_ms: T0,
        op: Op::SetHistory(mqkv_store::HistoryLimits {
            max_changes: 1,
            max_age_ms: 3_600_000,
            max_bytes: 64 << 20,
        }),
    };
    write_both(&node, &mut direct, one_change).await;
    let big = "x".repeat(16 << 10);
    for i in 0..40 {
        write_both(&node, &mut direct, set(T0 + i, "blob", &big)).await;
    }
    wait_for_snapshot(&node).await;
    // 40 entries of 16 KiB would be 640 KiB of log; the 64 KiB budget
    // keeps it to a few entries once the snapshot being built (while the
    // last writes went on) lands and the log behind it is purged.
    let mut stats = node.stats();
    for _ in 0..500 {
        if stats.log_len <= 10 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        stats = node.stats();
    }
    assert!(stats.log_len <= 10, "{stats:?}");
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_fsyncs() {
    const WRITERS: u64 = 100;
    const WRITES_EACH: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let (node, recorder) = open(dir.path(), NodeOptions::default()).await;

    // One writer: one fsync per write.
    let start = node.stats();
    for i in 0..20 {
        node.write(set(T0 + i, "solo", "v")).await.unwrap();
    }
    let solo = node.stats();
    let solo_commits = solo.log_commits - start.log_commits;

    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let node = node.clone();
            tokio::spawn(async move {
                for i in 0..WRITES_EACH {
                    let applied = node
                        .write(set(T0 + 100 + i, &format!("w{w}"), &format!("{i}")))
                        .await;
                    assert_eq!(applied.unwrap().response, Response::Ok);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let end = node.stats();
    let writes = WRITERS * WRITES_EACH;
    let commits = end.log_commits - solo.log_commits;
    eprintln!(
        "group commit: 1 writer x 20 writes -> {solo_commits} fsyncs; \
         {WRITERS} writers x {WRITES_EACH} writes = {writes} writes -> {commits} fsyncs \
         ({:.1} entries per fsync)",
        writes as f64 / commits as f64
    );
    assert!(solo_commits >= 20, "each lone write needs its own fsync");
    assert!(
        commits * 4 <= writes,
        "{writes} writes took {commits} fsyncs"
    );
    assert_eq!(recorder.seen().len() as u64, 20 + writes);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_survive_snapshots_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let options = small_snapshots();
    let (node, recorder) = open(dir.path(), options.clone()).await;
    let tasks: Vec<_> = (0..20u64)
        .map(|w| {
            let node = node.clone();
            tokio::spawn(async move {
                for i in 0..25u64 {
                    let now = T0 + i * 10;
                    let key = format!("k{}", (w + i) % 7);
                    let entry = match i % 3 {
                        0 => set_with(now, &key, &format!("{w}-{i}"), None, Some(5_000)),
                        1 => request(
                            now,
                            Command::Set {
                                key: b(&key),
                                value: b("nx"),
                                condition: Some(SetCondition::Nx),
                                px_ms: None,
                            },
                            None,
                            dedup(now, &format!("{w}-{i}")),
                        ),
                        _ => request(now, Command::Del { key: b(&key) }, None, None),
                    };
                    node.write(entry).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = node.stats();
    assert!(
        stats.log_entries_written < 500,
        "writes were not batched: {stats:?}"
    );
    assert_eq!(recorder.seen().len(), 500);
    wait_for_snapshot(&node).await;
    let before = snapshot_of(&node);
    node.shutdown().await.unwrap();

    let (node, recorder) = open(dir.path(), options).await;
    assert_eq!(snapshot_of(&node), before);
    assert!(recorder.seen().is_empty());
    node.shutdown().await.unwrap();
}

async fn create_store(dir: &Path) -> StateMachine {
    let (node, _) = open(dir, small_segments()).await;
    let mut direct = StateMachine::new(config());
    for i in 0..50 {
        write_both(
            &node,
            &mut direct,
            set(T0 + i, &format!("key-{i}"), &"v".repeat(200)),
        )
        .await;
    }
    wait_for_snapshot(&node).await;
    node.shutdown().await.unwrap();
    direct
}

fn file_path(dir: &Path, kind: FileKind) -> PathBuf {
    dir.join(kind.file_name())
}

fn log_dir(dir: &Path) -> PathBuf {
    crate::log_file::dir_of(dir)
}

/// The log's segment files, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(log_dir(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    paths.sort();
    paths
}

/// Options that spread a small store's log over several segments.
fn small_segments() -> NodeOptions {
    NodeOptions {
        log_segment_bytes: 2048,
        ..small_snapshots()
    }
}

/// The files a store can be refused over: the state file, the oldest log
/// segment and the newest one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    State,
    OldestSegment,
    NewestSegment,
}

impl Target {
    const ALL: [Target; 3] = [Target::State, Target::OldestSegment, Target::NewestSegment];

    fn path(self, dir: &Path) -> PathBuf {
        let segments = segments(dir);
        match self {
            Target::State => file_path(dir, FileKind::State),
            Target::OldestSegment => segments.first().unwrap().clone(),
            Target::NewestSegment => segments.last().unwrap().clone(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_format_version_is_refused() {
    for target in Target::ALL {
        let dir = tempfile::tempdir().unwrap();
        create_store(dir.path()).await;
        let path = target.path(dir.path());
        let (other, supported) = match target {
            Target::State => {
                set_format_version(&path, 2);
                (2, crate::FORMAT_VERSION)
            }
            Target::OldestSegment | Target::NewestSegment => {
                let other = crate::LOG_FORMAT + 1;
                let mut bytes = std::fs::read(&path).unwrap();
                bytes[8..16].copy_from_slice(&other.to_le_bytes());
                std::fs::write(&path, bytes).unwrap();
                (other, crate::LOG_FORMAT)
            }
        };
        let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
            .await
            .err()
            .expect("a file of another version must be refused");
        match &error {
            OpenError::UnsupportedFormat {
                path: reported,
                found,
                supported: s,
            } if *s == supported && *found == other => assert_eq!(reported, &path),
            other => panic!("{target:?}: unexpected error {other}"),
        }
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
    }
}

type Damage = fn(&mut Vec<u8>);

/// Ways a file can be damaged. Cutting the end off the newest log segment
/// is not among them for the log: that is what an interrupted write looks
/// like (see `an_interrupted_log_write_is_cut_off`).
fn damages(target: Target) -> Vec<(&'static str, Damage)> {
    let mut damages: Vec<(&'static str, Damage)> = vec![
        ("truncated to nothing", |bytes| bytes.clear()),
        ("header overwritten", |bytes| bytes[..16].fill(0x5a)),
        ("body overwritten", |bytes| {
            let len = bytes.len();
            // From inside the data: past it, in a log segment's space
            // allocated ahead, bytes after zeros are a torn write.
            let data_end = data_of(bytes).len();
            let from = 4096.min(data_end / 3);
            bytes[from..len]
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i * 7 + 13) as u8);
        }),
        ("not a data file at all", |bytes| {
            *bytes = b"this is not a data file\n".repeat(1000);
        }),
    ];
    match target {
        Target::State => damages.extend([
            (
                "truncated to half",
                (|bytes| bytes.truncate(bytes.len() / 2)) as Damage,
            ),
            ("truncated by one page", |bytes| {
                bytes.truncate(bytes.len() - 4096)
            }),
            ("redb header overwritten", |bytes| bytes[..512].fill(0x5a)),
        ]),
        Target::OldestSegment | Target::NewestSegment => damages.push((
            // Every byte of a segment is covered by a check. (A redb file
            // has free pages nobody reads.)
            "one byte flipped in the middle",
            |bytes| {
                // Of the data, not of the space allocated ahead of it.
                let data_end = data_of(bytes).len();
                let middle = data_end / 2;
                bytes[middle] ^= 0x01;
            },
        )),
    }
    match target {
        Target::OldestSegment => damages.extend([
            (
                "truncated to half",
                (|bytes| bytes.truncate(bytes.len() / 2)) as Damage,
            ),
            ("truncated by seven bytes", |bytes| {
                bytes.truncate(bytes.len() - 7)
            }),
        ]),
        Target::State | Target::NewestSegment => {}
    }
    damages
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Every file under `dir`, with its size, sorted.
fn file_names(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            names.extend(file_names(&entry.path()));
        } else {
            names.push((entry.path(), entry.metadata().unwrap().len()));
        }
    }
    names.sort();
    names
}

/// Opens the store in `dir` and checks that it is refused as corrupt, with
/// an error naming one of `named`, and that no file under `dir` was
/// created, removed or resized.
async fn assert_refused_as_corrupt(dir: &Path, named: &[&Path], case: &str) {
    let names = file_names(dir);
    let result =
        StoreNode::open_disk_with(dir, config(), Recorder::default().hook(), small_segments())
            .await;
    let error = match result {
        Ok(node) => {
            node.shutdown().await.unwrap();
            panic!("{case}: opened");
        }
        Err(error) => error,
    };
    assert!(
        matches!(error, OpenError::Corrupt { .. }),
        "{case}: {error}"
    );
    let message = error.to_string();
    assert!(
        named
            .iter()
            .any(|path| message.contains(&path.display().to_string())),
        "{case}: {error}"
    );
    assert_eq!(file_names(dir), names, "{case}: files were changed");
}

/// Writes `entry` to `node` (checking its answer against `direct`), then
/// restarts the store in `dir` and checks that it comes back as `direct`.
async fn write_then_restart(dir: &Path, node: StoreNode, direct: &mut StateMachine, entry: Entry) {
    write_both(&node, direct, entry).await;
    node.shutdown().await.unwrap();
    let (node, _) = open(dir, small_segments()).await;
    assert_eq!(snapshot_of(&node), *direct);
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_files_are_refused_and_left_untouched() {
    let original = tempfile::tempdir().unwrap();
    let direct = create_store(original.path()).await;
    assert!(
        segments(original.path()).len() >= 2,
        "the log has one segment"
    );
    for target in Target::ALL {
        for (what, damage) in damages(target) {
            let case = format!("{target:?} {what}");
            let dir = tempfile::tempdir().unwrap();
            copy_dir(original.path(), dir.path());
            let path = target.path(dir.path());
            let mut bytes = std::fs::read(&path).unwrap();
            damage(&mut bytes);
            std::fs::write(&path, &bytes).unwrap();

            let log = log_dir(dir.path());
            assert_refused_as_corrupt(dir.path(), &[&path, &log], &case).await;
            assert!(
                std::fs::read(&path).unwrap() == bytes,
                "{case}: the damaged file was modified"
            );
        }
    }
    // The undamaged original still opens with everything in it.
    let (node, _) = open(original.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

/// The start of a frame whose payload never reached the disk: a valid
/// length (with its check) and payload hash, then only part of the payload.
fn interrupted_frame() -> Vec<u8> {
    let payload = vec![0x42u8; 100];
    let len = payload.len() as u32;
    let mut frame = len.to_le_bytes().to_vec();
    frame.extend_from_slice(&(xxhash_rust::xxh3::xxh3_64(&len.to_le_bytes()) as u32).to_le_bytes());
    frame.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
    frame.extend_from_slice(&payload[..37]);
    frame
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

fn append_to(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_log_write_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = create_store(dir.path()).await;
    let newest = Target::NewestSegment.path(dir.path());
    let intact = {
        let (segments, _) = crate::log_file::open(dir.path(), 64 << 20)
            .unwrap()
            .unwrap();
        segments.written_len()
    };
    // Into the space allocated ahead, where the next append would go.
    write_at(&newest, intact, &interrupted_frame());

    let (node, recorder) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    assert!(recorder.seen().is_empty());
    assert_eq!(std::fs::metadata(&newest).unwrap().len(), intact);
    // Writing goes on after the cut, and survives a restart.
    write_then_restart(dir.path(), node, &mut direct, set(T0 + 100, "after", "cut")).await;
}

/// The data of a log segment: its bytes up to the last non-zero one.
fn data_of(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.iter().rposition(|b| *b != 0).map_or(0, |at| at + 1)]
}

/// A power loss during a write can keep any of its blocks and lose the
/// others (they read as the zeros allocated ahead). Whatever survived of the
/// write is cut off at its first damaged frame, and the acknowledged log
/// before it is kept whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_torn_by_a_power_loss_is_cut_off() {
    const SECTOR: usize = 512;
    let original = tempfile::tempdir().unwrap();
    let (node, _) = open(original.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    for i in 0..20 {
        write_both(&node, &mut direct, set(T0 + i, &format!("k{i}"), "v")).await;
    }
    node.shutdown().await.unwrap();
    let newest = Target::NewestSegment.path(original.path());
    let intact = data_of(&std::fs::read(&newest).unwrap()).len();

    // What the lost writes would have added: the same store, written on.
    let later = tempfile::tempdir().unwrap();
    copy_dir(original.path(), later.path());
    let (node, _) = open(later.path(), NodeOptions::default()).await;
    let mut states = vec![direct.clone()];
    let mut after = direct.clone();
    for i in 0..6 {
        let value = format!("{i}").repeat(700);
        write_both(
            &node,
            &mut after,
            set(T0 + 100 + i, &format!("late{i}"), &value),
        )
        .await;
        states.push(after.clone());
    }
    node.shutdown().await.unwrap();
    let written = std::fs::read(Target::NewestSegment.path(later.path())).unwrap();
    let appended = &data_of(&written)[intact..];
    let sectors = (intact + appended.len()).div_ceil(SECTOR) - intact / SECTOR;
    assert!(sectors >= 8, "{sectors} sectors written");

    let first = intact / SECTOR;
    let cases: Vec<(&str, Vec<usize>)> = vec![
        ("the first block lost", vec![first]),
        ("a middle block lost", vec![first + sectors / 2]),
        (
            "the first and a late block lost",
            vec![first, first + sectors - 2],
        ),
        (
            "every other block lost",
            (first..first + sectors).step_by(2).collect(),
        ),
        (
            "all but the last block lost",
            (first..first + sectors - 1).collect(),
        ),
    ];
    for (case, lost) in cases {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(original.path(), dir.path());
        let path = Target::NewestSegment.path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[intact..intact + appended.len()].copy_from_slice(appended);
        for sector in &lost {
            let from = (sector * SECTOR).max(intact);
            bytes[from..(sector + 1) * SECTOR].fill(0);
        }
        std::fs::write(&path, &bytes).unwrap();

        let (node, _) = open(dir.path(), NodeOptions::default()).await;
        let state = snapshot_of(&node);
        // Frames wholly before the first lost block are whole: they stay.
        let kept = states
            .iter()
            .position(|s| *s == state)
            .unwrap_or_else(|| panic!("{case}: the state is none of the writes' prefixes"));
        if lost.contains(&first) {
            assert_eq!(kept, 0, "{case}");
        }
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(
            len >= intact && len < intact + appended.len(),
            "{case}: {len} bytes kept"
        );
        let mut direct = state;
        write_then_restart(dir.path(), node, &mut direct, set(T0 + 200, "after", "cut")).await;
    }
}

/// Payloads are masked, so even a value of zeros leaves no run of zeros in
/// the log that could pass for space a torn write never reached; it still
/// reads back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeros_in_values_leave_no_zeros_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    let zeros = "\0".repeat(8192);
    write_both(&node, &mut direct, set(T0, "zeros", &zeros)).await;
    write_both(&node, &mut direct, set(T0 + 1, "", "")).await;
    node.shutdown().await.unwrap();
    let bytes = std::fs::read(Target::NewestSegment.path(dir.path())).unwrap();
    let frames = &data_of(&bytes)[16..];
    let longest = frames
        .split(|b| *b != 0)
        .map(<[u8]>::len)
        .max()
        .unwrap_or(0);
    assert!(longest < 8, "{longest} zero bytes in a row");
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

/// Rewrites a log segment of the current format as the previous one wrote
/// it: payloads not masked.
fn rewrite_unmasked(path: &Path) {
    use xxhash_rust::xxh3::xxh3_64;
    let mut bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes[8..16], crate::LOG_FORMAT.to_le_bytes());
    bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
    let mut at = 16;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let check = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap());
        if len == 0 && check == 0 {
            break;
        }
        let payload = at + 16..at + 16 + len as usize;
        crate::log_file::mask(&mut bytes[payload.clone()], payload.start as u64);
        let hash = xxh3_64(&bytes[payload.clone()]);
        bytes[at + 8..at + 16].copy_from_slice(&hash.to_le_bytes());
        at = payload.end;
    }
    std::fs::write(path, bytes).unwrap();
}

/// A log written by the previous format (payloads not masked) opens, takes
/// new writes and starts its new segments in the current format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_the_previous_format_is_read_and_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = create_store(dir.path()).await;
    let old = segments(dir.path());
    for path in &old {
        rewrite_unmasked(path);
    }
    let newest = old.last().unwrap();
    let before = data_of(&std::fs::read(newest).unwrap()).len();
    let (node, _) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    write_both(&node, &mut direct, set(T0 + 999, "first", "w")).await;
    // Appended to in its own format.
    let bytes = std::fs::read(newest).unwrap();
    assert_eq!(bytes[8..16], 1u64.to_le_bytes());
    assert!(data_of(&bytes).len() > before);
    for i in 0..30 {
        let entry = set(T0 + 1000 + i, &format!("new-{i}"), &"w".repeat(200));
        write_both(&node, &mut direct, entry).await;
    }
    node.shutdown().await.unwrap();
    let (node, _) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
    let formats: Vec<u64> = segments(dir.path())
        .iter()
        .map(|path| {
            let bytes = std::fs::read(path).unwrap();
            u64::from_le_bytes(bytes[8..16].try_into().unwrap())
        })
        .collect();
    assert_eq!(formats.last(), Some(&crate::LOG_FORMAT), "{formats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_frame_before_the_end_of_the_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    let oldest = Target::OldestSegment.path(dir.path());
    append_to(&oldest, &interrupted_frame());
    assert_refused_as_corrupt(dir.path(), &[&oldest], "a torn frame in an older segment").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
        .await
        .err()
        .expect("second open must fail");
    let log = log_dir(dir.path());
    match &error {
        OpenError::InUse { path } => assert_eq!(path, &log),
        other => panic!("unexpected error {other}"),
    }
    assert!(error.to_string().contains(&log.display().to_string()));
    // The first store is unaffected, and the directory opens once it is closed.
    node.write(set(T0 + 1, "k", "w")).await.unwrap();
    node.shutdown().await.unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    assert_eq!(
        node.read(|m| m.get(b"k", T0 + 1).map(|(v, _)| v)),
        Some(b("w"))
    );
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    std::fs::remove_dir_all(log_dir(dir.path())).unwrap();
    let error = StoreNode::open_disk(dir.path(), config(), Recorder::default().hook())
        .await
        .err()
        .expect("a snapshot without its log must be refused");
    assert!(matches!(error, OpenError::Inconsistent { .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_creation_is_started_over() {
    let dir = tempfile::tempdir().unwrap();
    let partial = dir.path().join("raft-log.partial");
    std::fs::create_dir(&partial).unwrap();
    std::fs::write(partial.join("00000000000000000001.seg"), b"half-written").unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    node.shutdown().await.unwrap();
    assert!(!partial.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creation_config_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    node.write(set(T0, "k", "v")).await.unwrap();
    node.shutdown().await.unwrap();
    let other = StoreConfig {
        max_keys: Some(0),
        ..StoreConfig::new("elsewhere")
    };
    let node = StoreNode::open_disk(dir.path(), other, Recorder::default().hook())
        .await
        .unwrap();
    assert_eq!(node.read(|m| m.config().clone()), config());
    node.shutdown().await.unwrap();
}

const CRASH_DIR: &str = "MQKV_RAFT_CRASH_DIR";
const CRASH_ROUND: &str = "MQKV_RAFT_CRASH_ROUND";

/// The child process of `acknowledged_writes_survive_kill_9`: writes from
/// several tasks until it is killed, printing every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "only runs as the child process of acknowledged_writes_survive_kill_9"]
async fn crash_child_writer() {
    let (Ok(dir), Ok(round)) = (std::env::var(CRASH_DIR), std::env::var(CRASH_ROUND)) else {
        panic!("run only by acknowledged_writes_survive_kill_9, which sets {CRASH_DIR} and {CRASH_ROUND}");
    };
    let (node, _) = open(Path::new(&dir), small_snapshots()).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let node = node.clone();
            let round = round.clone();
            tokio::spawn(async move {
                for i in 0..1_000_000u64 {
                    let key = format!("r{round}-w{w}-{i}");
                    node.write(set(T0 + i, &key, &key)).await.unwrap();
                    println!("ack {key}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command as Process, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut acked = Vec::new();
    for (round, kill_after) in [300, 777, 1234].into_iter().enumerate() {
        let mut child = Process::new(std::env::current_exe().unwrap())
            .args([
                "tests::crash_child_writer",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CRASH_DIR, dir.path())
            .env(CRASH_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut this_round = 0;
        for line in stdout.lines() {
            if let Some(key) = line.unwrap().strip_prefix("ack ") {
                acked.push(key.to_string());
                this_round += 1;
                if this_round == kill_after {
                    break;
                }
            }
        }
        // SIGKILL: no shutdown, no flush, mid-write.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(this_round, kill_after, "the child stopped writing early");

        runtime.block_on(async {
            let (node, recorder) = open(dir.path(), small_snapshots()).await;
            for key in &acked {
                let value = node.read(|m| m.get(key.as_bytes(), T0).map(|(value, _)| value));
                assert_eq!(value, Some(b(key)), "acknowledged write {key} was lost");
            }
            assert!(recorder.seen().is_empty());
            node.shutdown().await.unwrap();
        });
    }
}

mod openraft_suite {
    //! openraft's own conformance tests for log and state machine storage:
    //! votes, appends, truncation, purging, membership, snapshots.

    use std::sync::Arc;

    use openraft::testing::{StoreBuilder, Suite};
    use tempfile::TempDir;

    use super::config;
    use crate::files::Location;
    use crate::log_store::LogStore;
    use crate::node::recover;
    use crate::state_machine::StateMachineStore;
    use crate::stats::Counters;
    use crate::types::{StorageError, TypeConfig};
    use crate::NodeOptions;

    /// A fresh store on disk (segments of `segment_bytes`), or in memory.
    struct FreshStore {
        memory: bool,
        segment_bytes: u64,
    }

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FreshStore {
        async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
            let dir = tempfile::tempdir().expect("temporary directory");
            let location = match self.memory {
                true => Location::Memory,
                false => Location::Disk(dir.path().to_path_buf()),
            };
            let counters = Arc::new(Counters::default());
            let options = NodeOptions {
                log_segment_bytes: self.segment_bytes,
                ..NodeOptions::default()
            };
            let recovered =
                recover(&location, config(), &options, counters).expect("a fresh store opens");
            Ok((dir, recovered.log, StateMachineStore::new(recovered.state)))
        }
    }

    #[test]
    fn storage_passes_the_openraft_suite() {
        Suite::test_all(FreshStore {
            memory: false,
            segment_bytes: NodeOptions::default().log_segment_bytes,
        })
        .expect("openraft storage suite");
    }

    /// Segments so small that nearly every append starts a new one, so
    /// purges delete segments and truncations cross them.
    #[test]
    fn tiny_segments_pass_the_openraft_suite() {
        Suite::test_all(FreshStore {
            memory: false,
            segment_bytes: 64,
        })
        .expect("openraft storage suite");
    }

    #[test]
    fn memory_storage_passes_the_openraft_suite() {
        Suite::test_all(FreshStore {
            memory: true,
            segment_bytes: NodeOptions::default().log_segment_bytes,
        })
        .expect("openraft storage suite");
    }
}

mod model {
    //! Property: a store that is written to and restarted at random answers
    //! exactly like one `StateMachine` fed the same entries.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Write {
            advance_ms: u64,
            op: OpSpec,
            dedup: Option<u8>,
        },
        Restart,
    }

    #[derive(Debug, Clone)]
    enum OpSpec {
        Set {
            key: u8,
            value: u8,
            condition: Option<SetCondition>,
            px_ms: Option<u64>,
            ft: Option<u8>,
        },
        Del {
            key: u8,
            ft: Option<u8>,
        },
        VDel {
            key: u8,
            value: u8,
        },
        Get {
            key: u8,
        },
        ExpireDue,
    }

    fn op() -> impl Strategy<Value = OpSpec> {
        let condition = prop_oneof![
            Just(None),
            Just(Some(SetCondition::Nx)),
            Just(Some(SetCondition::Nex))
        ];
        prop_oneof![
            4 => (0..4u8, 0..3u8, condition, proptest::option::of(1..3_000u64), proptest::option::of(0..4u8))
                .prop_map(|(key, value, condition, px_ms, ft)| OpSpec::Set { key, value, condition, px_ms, ft }),
            1 => (0..4u8, proptest::option::of(0..4u8)).prop_map(|(key, ft)| OpSpec::Del { key, ft }),
            1 => (0..4u8, 0..3u8).prop_map(|(key, value)| OpSpec::VDel { key, value }),
            1 => (0..4u8).prop_map(|key| OpSpec::Get { key }),
            1 => Just(OpSpec::ExpireDue),
        ]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (0..2_000u64, op(), proptest::option::of(0..3u8))
                .prop_map(|(advance_ms, op, dedup)| Step::Write { advance_ms, op, dedup }),
            1 => Just(Step::Restart),
        ]
    }

    fn entry(now: u64, op: &OpSpec, correlation: Option<u8>) -> Entry {
        let key = |k: &u8| b(&format!("key{k}"));
        let value = |v: &u8| b(&format!("value{v}"));
        let ft = |f: &Option<u8>| f.map(|f| Hlc::new(T0 + u64::from(f) * 1_000, 0, "client"));
        let dedup = correlation.and_then(|c| dedup(now, &format!("corr{c}")));
        match op {
            OpSpec::Set {
                key: k,
                value: v,
                condition,
                px_ms,
                ft: f,
            } => request(
                now,
                Command::Set {
                    key: key(k),
                    value: value(v),
                    condition: condition.clone(),
                    px_ms: *px_ms,
                },
                ft(f),
                dedup,
            ),
            OpSpec::Del { key: k, ft: f } => {
                request(now, Command::Del { key: key(k) }, ft(f), dedup)
            }
            OpSpec::VDel { key: k, value: v } => request(
                now,
                Command::VDel {
                    key: key(k),
                    value: value(v),
                },
                None,
                dedup,
            ),
            OpSpec::Get { key: k } => request(now, Command::Get { key: key(k) }, None, None),
            OpSpec::ExpireDue => Entry {
                now_ms: now,
                op: Op::ExpireDue,
            },
        }
    }

    async fn run(steps: Vec<Step>) {
        let dir = tempfile::tempdir().unwrap();
        let options = NodeOptions {
            snapshot_every: 4,
            logs_kept_after_snapshot: 2,
            ..NodeOptions::default()
        };
        let mut direct = StateMachine::new(config());
        let (mut node, mut recorder) = open(dir.path(), options.clone()).await;
        let mut now = T0 + 10_000;
        let mut written = 0;
        for step in steps {
            match step {
                Step::Write {
                    advance_ms,
                    op,
                    dedup,
                } => {
                    now += advance_ms;
                    write_both(&node, &mut direct, entry(now, &op, dedup)).await;
                    written += 1;
                    assert_eq!(recorder.seen().len(), written);
                }
                Step::Restart => {
                    node.shutdown().await.unwrap();
                    (node, recorder) = open(dir.path(), options.clone()).await;
                    written = 0;
                    assert_eq!(snapshot_of(&node), direct);
                }
            }
        }
        assert_eq!(snapshot_of(&node), direct);
        node.shutdown().await.unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn store_node_answers_like_a_fresh_state_machine(steps in proptest::collection::vec(step(), 1..40)) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(run(steps));
        }
    }
}

/// Writes the log of the closed store in `dir` as the single redb file
/// earlier versions kept it in (`raft-log.redb`: meta, raft state and entry
/// tables), and removes the log directory.
fn rewrite_log_as_legacy_file(dir: &Path) {
    use redb::TableDefinition;
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("mqkv_meta");
    const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
    const RAFT_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

    let (segments, loaded) = crate::log_file::open(dir, 64 << 20).unwrap().unwrap();
    let db = redb::Database::create(dir.join("raft-log.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(META).unwrap();
        meta.insert("format_version", 1u64.to_le_bytes().as_slice())
            .unwrap();
        meta.insert("file_kind", b"raft-log".as_slice()).unwrap();
        meta.insert("node_id", loaded.node_id.to_le_bytes().as_slice())
            .unwrap();
        let mut state = txn.open_table(RAFT_STATE).unwrap();
        let vote = postcard::to_stdvec(&loaded.vote.unwrap()).unwrap();
        state.insert("vote", vote.as_slice()).unwrap();
        if let Some(id) = loaded.committed {
            let id = postcard::to_stdvec(&id).unwrap();
            state.insert("committed", id.as_slice()).unwrap();
        }
        if let Some(id) = loaded.last_purged {
            let id = postcard::to_stdvec(&id).unwrap();
            state.insert("last_purged", id.as_slice()).unwrap();
        }
        let mut log = txn.open_table(LOG).unwrap();
        for (id, location) in &loaded.entries {
            let crate::log_file::Record::Entry(entry) = segments.read(*location).unwrap() else {
                panic!("entry {} is not an entry record", id.index);
            };
            let bytes = postcard::to_stdvec(&entry).unwrap();
            log.insert(id.index, bytes.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
    drop(db);
    drop(segments);
    std::fs::remove_dir_all(log_dir(dir)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_earlier_versions_is_converted() {
    let dir = tempfile::tempdir().unwrap();
    // A snapshot and entries after it, so both the purged id and entries
    // have to come across.
    let mut direct = create_store(dir.path()).await;
    let (node, _) = open(dir.path(), small_segments()).await;
    for i in 0..7 {
        write_both(
            &node,
            &mut direct,
            set(T0 + 200 + i, &format!("late-{i}"), "v"),
        )
        .await;
    }
    node.shutdown().await.unwrap();
    rewrite_log_as_legacy_file(dir.path());
    assert!(!log_dir(dir.path()).exists());

    let (node, recorder) = open(dir.path(), small_segments()).await;
    assert_eq!(snapshot_of(&node), direct);
    assert!(recorder.seen().is_empty());
    assert!(!dir.path().join("raft-log.redb").exists());
    assert!(log_dir(dir.path()).exists());
    write_then_restart(
        dir.path(),
        node,
        &mut direct,
        set(T0 + 300, "after", "conversion"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_of_earlier_versions_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    create_store(dir.path()).await;
    rewrite_log_as_legacy_file(dir.path());
    let legacy = dir.path().join("raft-log.redb");
    let mut bytes = std::fs::read(&legacy).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&legacy, &bytes).unwrap();
    assert_refused_as_corrupt(dir.path(), &[&legacy], "a damaged old log").await;
}

/// A state larger than one piece of the state file is saved in several and
/// comes back whole: loaded from the snapshot at restart, the log after it
/// replayed on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_in_several_pieces_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut direct = StateMachine::new(config());
    let options = NodeOptions {
        snapshot_every: 30,
        logs_kept_after_snapshot: 2,
        ..NodeOptions::default()
    };
    let (node, _) = open(dir.path(), options.clone()).await;
    let value = "v".repeat(100_000);
    for i in 0..40u64 {
        write_both(&node, &mut direct, set(T0 + i, &format!("big{i}"), &value)).await;
    }
    wait_for_snapshot(&node).await;
    assert!(node.stats().snapshot_index.is_some());
    let serialized = postcard::to_stdvec(&direct).unwrap().len();
    assert!(
        serialized > 3 * crate::snapshot_file::CHUNK_BYTES,
        "the state ({serialized} bytes) should take several pieces"
    );
    write_both(&node, &mut direct, set(T0 + 50, "after", "snapshot")).await;
    let before = snapshot_of(&node);
    node.shutdown().await.unwrap();

    let (node, _) = open(dir.path(), options).await;
    let after = snapshot_of(&node);
    assert_eq!(after, before);
    assert_eq!(after, direct);
    assert_eq!(
        after.get(b"big39", T0 + 60).map(|(v, _)| v.len()),
        Some(100_000)
    );
    node.shutdown().await.unwrap();
}

/// The hook a program sets to hand freed memory back runs once a snapshot is
/// written, on the thread that wrote it, for every snapshot written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_after_snapshot_hook_runs_for_every_snapshot_written() {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    fn count() {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    crate::set_after_snapshot(count);
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), small_snapshots()).await;
    for i in 0..100 {
        node.write(set(T0 + i, &format!("k{i}"), "v"))
            .await
            .expect("write");
    }
    wait_for_snapshot(&node).await;
    node.shutdown().await.unwrap();
    let built = node.stats().snapshots_built;
    let calls = CALLS.load(std::sync::atomic::Ordering::SeqCst);
    assert!(built > 0);
    // At least: run in one process with other tests (`cargo test`), their
    // snapshots call the hook too.
    assert!(calls >= built, "{calls} hook calls for {built} snapshots");
}

/// An append too large for the space allocated ahead grows the segment
/// itself: no zeros are written after it (the file ends with its data),
/// and it reads back after a restart like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_append_grows_the_segment_without_zeros_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    let mut direct = StateMachine::new(config());
    // Fifteen appends of 300 KiB reach past the 4 MiB allocated ahead.
    for i in 0..15u64 {
        let big = format!("{i:02}").repeat(150 << 10);
        write_both(
            &node,
            &mut direct,
            set(T0 + i, &format!("big{}", i % 4), &big),
        )
        .await;
    }
    let bytes = std::fs::read(Target::NewestSegment.path(dir.path())).unwrap();
    let tail = &bytes[bytes.len().saturating_sub(1024)..];
    assert!(
        tail.iter().any(|&b| b != 0),
        "the segment ends in zeros written ahead ({} bytes)",
        bytes.len()
    );
    // Small appends after it have zeros written ahead again.
    write_both(&node, &mut direct, set(T0 + 20, "small", "v")).await;
    let bytes = std::fs::read(Target::NewestSegment.path(dir.path())).unwrap();
    assert!(bytes[bytes.len() - 1024..].iter().all(|&b| b == 0));
    node.shutdown().await.unwrap();
    let (node, _) = open(dir.path(), NodeOptions::default()).await;
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

mod masking {
    use proptest::prelude::*;

    use crate::log_file::mask;

    proptest! {
        /// Masking twice at the same offset gives the bytes back, and masking
        /// in two pieces, each at its own offset, is masking the whole: a
        /// payload is masked where it is encoded and unmasked where it is
        /// read, at any alignment.
        #[test]
        fn mask_is_its_own_inverse_and_works_in_pieces(
            data in proptest::collection::vec(any::<u8>(), 0..100),
            offset in 0u64..1 << 40,
            split in any::<prop::sample::Index>(),
        ) {
            let mut whole = data.clone();
            mask(&mut whole, offset);
            let at = split.index(data.len() + 1);
            let mut pieces = data.clone();
            let (head, tail) = pieces.split_at_mut(at);
            mask(head, offset);
            mask(tail, offset + at as u64);
            prop_assert_eq!(&pieces, &whole);
            mask(&mut whole, offset);
            prop_assert_eq!(whole, data);
        }

        /// The mask is the stream the log's format defines, byte by byte,
        /// whatever the length and alignment (the whole words in the middle
        /// are masked by a vectorized loop).
        #[test]
        fn mask_is_the_format_stream(
            data in proptest::collection::vec(any::<u8>(), 0..600),
            offset in 0u64..1 << 40,
        ) {
            let mut masked = data.clone();
            mask(&mut masked, offset);
            let expected: Vec<u8> = (offset..)
                .zip(&data)
                .map(|(at, byte)| byte ^ stream_byte(at))
                .collect();
            prop_assert_eq!(masked, expected);
        }
    }

    /// The byte the format XORs at offset `at`: byte `at % 8` (little
    /// endian) of SplitMix64's output for word `at / 8`.
    fn stream_byte(at: u64) -> u8 {
        let mut z = (at / 8).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).to_le_bytes()[(at % 8) as usize]
    }

    /// A large payload, as a 64 KiB value makes, at an offset that is not a
    /// whole word.
    #[test]
    fn a_large_payload_is_masked_as_the_format_says() {
        let data: Vec<u8> = (0..65_536 + 13).map(|i| (i * 7) as u8).collect();
        let offset = (1 << 33) + 5;
        let mut masked = data.clone();
        mask(&mut masked, offset);
        for (at, (got, byte)) in (offset..).zip(masked.iter().zip(&data)) {
            assert_eq!(*got, byte ^ stream_byte(at), "offset {at}");
        }
        // The first word's stream, pinned: the format must never change.
        let mut zeros = [0u8; 8];
        mask(&mut zeros, 0);
        assert_eq!(u64::from_le_bytes(zeros), 0xE220_A839_7B1D_CDAF);
    }
}
