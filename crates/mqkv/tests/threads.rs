//! Connection threads: how many there are, their CPU pinning and scheduling policy, and where
//! the state store's raft runs beside them.

mod common;

use common::{serve_refused, temp_dir, ServerProcess};

#[tokio::test]
async fn workers_flag_is_honoured_and_checked() {
    use common::store::Client;
    let dir = temp_dir("workers");
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--workers", "1"]);
    let mut c = Client::connect("workers", server.port).await;
    assert_eq!(&c.call(&[b"SET", b"a", b"1"]).await.payload[..], b"+OK\r\n");
    assert_eq!(&c.call(&[b"GET", b"a"]).await.payload[..], b"$1\r\n1\r\n");
    drop(c);
    assert!(server.stop().success());
    for bad in ["0", "1025"] {
        let err = serve_refused(&[
            "--listen",
            "127.0.0.1:0",
            "--storage",
            "memory",
            "--workers",
            bad,
        ]);
        assert!(
            err.contains(&format!("workers must be between 1 and 1024, not {bad}")),
            "clear message: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Cpus_allowed_list` of a `/proc` status file.
#[cfg(target_os = "linux")]
fn cpus_allowed(status: impl AsRef<std::path::Path>) -> String {
    std::fs::read_to_string(status)
        .expect("status")
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_owned())
        .expect("Cpus_allowed_list")
}

/// What `read` finds in the `/proc` directory of the process (its main thread's) and in that of
/// each `mqkv-conn-*` thread.
#[cfg(target_os = "linux")]
fn main_and_conn_threads<T>(pid: u32, read: impl Fn(&std::path::Path) -> T) -> (T, Vec<T>) {
    let main = read(std::path::Path::new(&format!("/proc/{pid}")));
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks") {
        let task = task.expect("task").path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if comm.starts_with("mqkv-conn-") {
            threads.push(read(&task));
        }
    }
    (main, threads)
}

/// `Cpus_allowed_list` of the process's main thread and of each `mqkv-conn-*` thread.
#[cfg(target_os = "linux")]
fn conn_thread_cpus(pid: u32) -> (String, Vec<String>) {
    main_and_conn_threads(pid, |dir| cpus_allowed(dir.join("status")))
}

/// The scheduling policy (`stat`, field 41) of the process's main thread and of each
/// `mqkv-conn-*` thread.
#[cfg(target_os = "linux")]
fn conn_thread_policies(pid: u32) -> (u32, Vec<u32>) {
    main_and_conn_threads(pid, |dir| {
        let text = std::fs::read_to_string(dir.join("stat")).expect("stat");
        // Fields after the command name, which ends with the last ')': the state is field 3.
        let after = text.rsplit_once(')').expect("command name").1;
        after
            .split_whitespace()
            .nth(41 - 3)
            .and_then(|f| f.parse().ok())
            .expect("policy field")
    })
}

#[cfg(target_os = "linux")]
#[test]
fn connection_threads_are_batch_scheduled_unless_told_not_to() {
    const NORMAL: u32 = 0;
    const BATCH: u32 = 3;
    let server = ServerProcess::start(&["--workers", "2"]);
    let (main, threads) = conn_thread_policies(server.pid());
    assert!(server.stop().success());
    assert_eq!(main, NORMAL, "the main thread keeps its policy");
    assert_eq!(threads, vec![BATCH; 2], "by default");

    let server = ServerProcess::start(&["--workers", "2", "--batch-scheduling", "false"]);
    let (_, threads) = conn_thread_policies(server.pid());
    assert!(server.stop().success());
    assert_eq!(threads, vec![NORMAL; 2], "told not to");

    let err = serve_refused(&["--listen", "127.0.0.1:0", "--batch-scheduling", "often"]);
    assert!(err.contains("--batch-scheduling"), "names the flag: {err}");
}

#[cfg(target_os = "linux")]
#[test]
fn connection_threads_are_pinned_unless_told_not_to() {
    let own_cpus = cpus_allowed("/proc/self/status");
    let one_cpu = own_cpus.parse::<usize>().is_ok();
    let pinned = |threads: &[String]| {
        assert_eq!(threads.len(), 2, "two connection threads: {threads:?}");
        if one_cpu {
            // One CPU: nothing to pin to.
            assert_eq!(threads, vec![own_cpus.clone(); 2]);
            return;
        }
        let single: Vec<Option<usize>> = threads.iter().map(|t| t.parse().ok()).collect();
        assert!(
            single.iter().all(Option::is_some),
            "one CPU each: {threads:?}"
        );
        assert_ne!(single[0], single[1], "different CPUs: {threads:?}");
    };

    let dir = temp_dir("pinned");
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--workers", "2"]);
    let (main, threads) = conn_thread_cpus(server.pid());
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(main, own_cpus, "the process itself keeps every CPU");
    pinned(&threads);

    let server = ServerProcess::start(&["--workers", "2", "--pin-workers", "true"]);
    let (_, threads) = conn_thread_cpus(server.pid());
    assert!(server.stop().success());
    pinned(&threads);

    // Memory storage: pinned too unless told not to.
    let server = ServerProcess::start(&["--workers", "2"]);
    let (_, threads) = conn_thread_cpus(server.pid());
    assert!(server.stop().success());
    pinned(&threads);

    let server = ServerProcess::start(&["--workers", "2", "--pin-workers", "false"]);
    let (_, threads) = conn_thread_cpus(server.pid());
    assert!(server.stop().success());
    assert_eq!(
        threads,
        vec![own_cpus.clone(); 2],
        "memory storage, told not to"
    );

    let dir = temp_dir("unpinned");
    let server = ServerProcess::start_disk(
        &dir,
        "127.0.0.1:0",
        &["--workers", "2", "--pin-workers", "false"],
    );
    let (_, threads) = conn_thread_cpus(server.pid());
    assert!(server.stop().success());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(threads, vec![own_cpus.clone(); 2], "told not to");

    let err = serve_refused(&["--listen", "127.0.0.1:0", "--pin-workers", "maybe"]);
    assert!(err.contains("--pin-workers"), "names the flag: {err}");
}

/// Names of the server's threads, after one write (the log's sync thread starts with the first
/// append on a lent thread).
#[cfg(target_os = "linux")]
fn thread_names_after_a_write(server: &ServerProcess) -> Vec<String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mqkv"))
        .args(["set", "--port", &server.port.to_string(), "k", "v"])
        .output()
        .expect("mqkv set");
    assert!(out.status.success(), "{out:?}");
    std::fs::read_dir(format!("/proc/{}/task", server.pid()))
        .expect("tasks")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

#[cfg(target_os = "linux")]
#[test]
fn raft_shares_a_connection_thread_when_they_take_every_cpu_or_when_told() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let has = |names: &[String], name: &str| names.iter().any(|n| n == name);
    let own = |names: &[String], why: &str| {
        assert!(has(names, "mqkv-raft"), "{why}: {names:?}");
        assert!(!has(names, "mqkv-sync"), "{why}: {names:?}");
    };
    // Sharing, the log's appends are written directly where the system allows it, and synced
    // on a thread of their own otherwise.
    let shared = |names: &[String], why: &str, direct: bool| {
        assert!(!has(names, "mqkv-raft"), "{why}: {names:?}");
        assert_eq!(has(names, "mqkv-sync"), !direct, "{why}: {names:?}");
    };

    // The default: one pinned connection thread per CPU, so raft shares the last one.
    let dir = temp_dir("raft-auto");
    // The data directory is made by the server, in the temporary directory probed here.
    let direct = mqkv_raft::direct_log_writes_work(&std::env::temp_dir());
    let names_with = |args: &[&str]| {
        let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", args);
        let names = thread_names_after_a_write(&server);
        assert!(server.stop().success());
        names
    };
    let names = names_with(&[]);
    if cpus > 1 {
        shared(&names, "pinned on every CPU", direct);
    } else {
        own(&names, "one CPU: nothing is pinned");
    }
    // What was written there is read back by a server whose raft has a thread of its own.
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--raft-thread", "own"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mqkv"))
        .args(["get", "--port", &server.port.to_string(), "k"])
        .output()
        .expect("mqkv get");
    let names = thread_names_after_a_write(&server);
    assert!(server.stop().success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v");
    own(&names, "told to");

    // Unpinned threads leave the CPUs to the scheduler: raft keeps a thread of its own...
    own(&names_with(&["--pin-workers", "false"]), "unpinned");
    // ...unless told to share.
    let told = names_with(&["--pin-workers", "false", "--raft-thread", "shared"]);
    shared(&told, "told to", direct);
    // Told not to write directly, the log syncs on a thread of its own.
    let told = names_with(&["--raft-thread", "shared", "--direct-log-writes", "false"]);
    shared(&told, "told not to write directly", false);
    let _ = std::fs::remove_dir_all(&dir);

    let err = serve_refused(&["--listen", "127.0.0.1:0", "--raft-thread", "sometimes"]);
    assert!(err.contains("--raft-thread"), "names the flag: {err}");
    let err = serve_refused(&["--listen", "127.0.0.1:0", "--direct-log-writes", "maybe"]);
    assert!(err.contains("--direct-log-writes"), "names the flag: {err}");
}
