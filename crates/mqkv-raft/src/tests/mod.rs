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

mod crash;
mod damage;
mod masking;
mod model;
mod openraft_suite;
mod restart;
mod snapshots;
mod tls_links;
