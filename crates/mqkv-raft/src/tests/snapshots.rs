//! Snapshots and purging keep the log short; group commit; what survives them.

use super::*;

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
