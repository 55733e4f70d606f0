//! A store reopened: what was written comes back, on a thread of its own or a lent one.

use super::*;

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
