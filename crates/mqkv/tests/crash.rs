//! Crash safety of the state store: concurrent writers, `kill -9` at a random moment, restart,
//! and every acknowledged write must be there with its acknowledged version, while a write that
//! was never acknowledged is either fully there or not at all.
//!
//! `MQKV_CRASH_CYCLES` sets the number of kill/restart cycles (default 3; long runs use more).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::store::Client;
use common::ServerProcess;
use rand::Rng;

const WRITERS: usize = 16;
const KEYS_PER_WRITER: usize = 8;

/// What a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    Value { value: String, version: String },
    Absent,
}

#[derive(Debug, Clone)]
enum Pending {
    Set(String),
    Del,
}

#[derive(Debug, Clone)]
struct KeyState {
    acked: Held,
    pending: Option<Pending>,
}

type Model = HashMap<String, KeyState>;

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mqkv-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One writer: SETs and DELs on its own keys until the connection dies. Each value is padded
/// with `pad` bytes.
async fn writer(mut c: Client, w: usize, cycle: usize, pad: usize, mut model: Model) -> Model {
    let mut i = 0usize;
    loop {
        let key = format!("w{w}-k{}", i % KEYS_PER_WRITER);
        let delete = rand::thread_rng().gen_bool(0.2);
        let value = format!("c{cycle}-w{w}-i{i}-{}", "x".repeat(pad));
        let state = model.entry(key.clone()).or_insert(KeyState {
            acked: Held::Absent,
            pending: None,
        });
        state.pending = Some(if delete {
            Pending::Del
        } else {
            Pending::Set(value.clone())
        });
        let answer = if delete {
            c.try_call(&[b"DEL", key.as_bytes()]).await
        } else {
            c.try_call(&[b"SET", key.as_bytes(), value.as_bytes()])
                .await
        };
        let Some(a) = answer else {
            return model;
        };
        let state = model.get_mut(&key).expect("inserted above");
        match (&a.payload[..], delete) {
            (b"+OK\r\n", false) => {
                let version = a.user("__ts").expect("SET version").to_owned();
                state.acked = Held::Value { value, version };
            }
            (b":1\r\n" | b":0\r\n", true) => state.acked = Held::Absent,
            (other, _) => panic!("unexpected answer {:?}", String::from_utf8_lossy(other)),
        }
        state.pending = None;
        i += 1;
    }
}

/// Reads every key back and checks it against what was acknowledged.
async fn verify(port: u16, model: &mut Model) {
    let mut c = Client::connect("verifier", port).await;
    for (key, state) in model.iter_mut() {
        let a = c.call(&[b"GET", key.as_bytes()]).await;
        let held = if &a.payload[..] == b"$-1\r\n" {
            Held::Absent
        } else {
            let text = String::from_utf8_lossy(&a.payload).into_owned();
            let value = text
                .split("\r\n")
                .nth(1)
                .unwrap_or_else(|| panic!("GET answer {text:?}"))
                .to_owned();
            Held::Value {
                value,
                version: a
                    .user("__ts")
                    .expect("GET hit carries the version")
                    .to_owned(),
            }
        };
        let ok = held == state.acked
            || match (&state.pending, &held) {
                (Some(Pending::Set(v)), Held::Value { value, .. }) => value == v,
                (Some(Pending::Del), Held::Absent) => true,
                _ => false,
            };
        assert!(
            ok,
            "key {key}: found {held:?}, acknowledged {:?}, in flight {:?}",
            state.acked, state.pending
        );
        state.acked = held;
        state.pending = None;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let dir = temp_dir("small");
    kill_9_cycles(&dir, 0, &[]).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Values of 16 KiB and a snapshot due after every MiB of log: snapshots are being written
/// most of the time, so kills land in them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_during_snapshots() {
    let dir = temp_dir("snapshots");
    kill_9_cycles(&dir, 16 << 10, &["--snapshot-log-bytes", "1048576"]).await;
    // The snapshots held data: 128 keys of 16 KiB are 2 MiB.
    let state = std::fs::metadata(dir.join("state.redb"))
        .expect("the state file")
        .len();
    assert!(state > 2 << 20, "state file of {state} bytes");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writers with values padded to `pad` bytes, killed with SIGKILL at a random moment, the
/// server restarted and every key checked, a few times over; then a last check.
async fn kill_9_cycles(dir: &std::path::Path, pad: usize, extra: &[&str]) {
    let cycles: usize = std::env::var("MQKV_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut listen = "127.0.0.1:0".to_string();
    let mut models: Vec<Model> = vec![Model::new(); WRITERS];
    let mut acked_total = 0usize;
    for cycle in 0..cycles {
        let server = ServerProcess::start_disk(dir, &listen, extra);
        listen = format!("127.0.0.1:{}", server.port);
        for m in models.iter_mut() {
            verify(server.port, m).await;
        }
        // Every writer is connected before the clock to the kill starts: the kill is
        // meant to land among writes, not among connects.
        let mut clients = Vec::with_capacity(WRITERS);
        for w in 0..WRITERS {
            clients.push(Client::connect(&format!("writer-{w}"), server.port).await);
        }
        let tasks: Vec<_> = models
            .drain(..)
            .zip(clients)
            .enumerate()
            .map(|(w, (m, c))| tokio::spawn(writer(c, w, cycle, pad, m)))
            .collect();
        let run = rand::thread_rng().gen_range(300..1200);
        tokio::time::sleep(Duration::from_millis(run)).await;
        server.kill9();
        for t in tasks {
            let m = t.await.expect("writer task");
            acked_total += m.values().filter(|s| s.pending.is_none()).count();
            models.push(m);
        }
    }
    let server = ServerProcess::start_disk(dir, &listen, extra);
    for m in models.iter_mut() {
        verify(server.port, m).await;
    }
    assert!(acked_total > 0, "the writers got answers before each crash");
}
