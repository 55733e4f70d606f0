//! Several store nodes in one process, talking over real loopback links: a write through any
//! node is applied everywhere in the same order, so every node holds byte-identical state; a
//! node added late catches up from a snapshot; a removed node is left out.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mqkv_protocol::{Command, Hlc};
use mqkv_raft::{ApplyHook, ClusterOptions, NodeOptions, Role, StoreNode};
use mqkv_store::{Entry, Op, Request, StoreConfig};

use mqkv_testkit::free_port;

fn no_hook() -> ApplyHook {
    Arc::new(|_, _| {})
}

fn set(key: &str, value: &str) -> Entry {
    Entry {
        now_ms: 1_700_000_000_000,
        op: Op::Request(Request {
            ts: Some(Hlc::parse("001700000000000:00000:test").expect("an HLC")),
            ..Request::new(Command::Set {
                key: Bytes::from(key.to_owned()),
                value: Bytes::from(value.to_owned()),
                condition: None,
                px_ms: None,
            })
        }),
    }
}

fn options(id: u64, port: u16, peers: &BTreeMap<u64, String>, join: bool) -> NodeOptions {
    NodeOptions {
        node_id: id,
        // Snapshots every few entries with nothing kept behind them: a late node can only
        // catch up from a snapshot.
        snapshot_every: 5,
        logs_kept_after_snapshot: 0,
        cluster: Some(ClusterOptions {
            listen: format!("127.0.0.1:{port}").parse().expect("addr"),
            advertise: None,
            peers: peers.clone(),
            join,
            secret: b"test".to_vec(),
            tls: None,
            quorum_wait: Duration::from_secs(5),
            pipeline_depth: mqkv_raft::DEFAULT_PIPELINE_DEPTH,
        }),
        ..NodeOptions::memory()
    }
}

async fn open(id: u64, port: u16, peers: &BTreeMap<u64, String>, join: bool) -> StoreNode {
    StoreNode::open_memory_with(
        StoreConfig::new("mqkv"),
        no_hook(),
        options(id, port, peers, join),
    )
    .await
    .expect("open")
}

/// The whole state machine, encoded.
fn state(node: &StoreNode) -> Vec<u8> {
    node.read(|m| postcard::to_stdvec(m).expect("encode"))
}

async fn settled(nodes: &[&StoreNode]) {
    let start = Instant::now();
    loop {
        let applied: Vec<_> = nodes.iter().map(|n| n.stats().applied_index).collect();
        if applied.windows(2).all(|w| w[0] == w[1]) && applied[0].is_some() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "not settled: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_holds_the_same_state_and_a_late_node_catches_up_from_a_snapshot() {
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let peers: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", ports[id as usize - 1])))
        .collect();
    let (a, b, c) = tokio::join!(
        open(1, ports[0], &peers, false),
        open(2, ports[1], &peers, false),
        open(3, ports[2], &peers, false)
    );
    let nodes = [&a, &b, &c];
    // Writes through every node, concurrently.
    let mut writes = Vec::new();
    for i in 0..60 {
        let node = nodes[i % 3];
        writes.push(node.write(set(&format!("k{}", i % 20), &format!("v{i}"))));
    }
    for w in writes {
        let applied = w.await.expect("write");
        assert!(applied.version.is_some(), "{:?}", applied.response);
    }
    // Then one at a time: each a log entry of its own, several snapshot periods' worth.
    for i in 0..30 {
        let applied = nodes[i % 3]
            .write(set(&format!("k{}", i % 20), &format!("w{i}")))
            .await
            .expect("write");
        assert!(applied.version.is_some(), "{:?}", applied.response);
    }
    settled(&nodes).await;
    // Snapshots are built beside the writes: wait for the first one on every node.
    let start = Instant::now();
    while nodes.iter().any(|n| n.stats().snapshots_built == 0) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no snapshot was taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reference = state(&a);
    assert_eq!(
        state(&b),
        reference,
        "node 2 applied the same log into the same state"
    );
    assert_eq!(state(&c), reference, "node 3 likewise");

    // A fourth node joins: the log behind the snapshots is gone, so it gets a snapshot.
    let d = open(4, ports[3], &BTreeMap::new(), true).await;
    b.add_node(4, format!("127.0.0.1:{}", ports[3]))
        .await
        .expect("add node 4");
    let more = c.write(set("after-join", "x")).await.expect("write");
    assert!(more.version.is_some());
    settled(&[&a, &b, &c, &d]).await;
    assert_eq!(state(&d), state(&a), "the new node holds the same state");
    assert!(
        d.stats().snapshot_index.is_some(),
        "the new node started from a snapshot: {:?}",
        d.stats()
    );
    d.linearizable()
        .await
        .expect("a read index on the new node");
    let value = d.read(|m| m.get_with(b"after-join", 1_700_000_000_001, |v, _| v.to_vec()));
    assert_eq!(value.as_deref(), Some(&b"x"[..]));

    let status = a.cluster_status().await.expect("a cluster");
    assert_eq!(status.nodes.len(), 4);
    let voters = status.nodes.iter().filter(|n| n.voter).count();
    assert_eq!(voters, 4, "{status:?}");
    assert_eq!(
        status
            .nodes
            .iter()
            .filter(|n| n.role == Some(Role::Leader))
            .count(),
        1,
        "{status:?}"
    );

    // Node 4 leaves; the others go on without it.
    a.remove_node(4).await.expect("remove node 4");
    // A follower learns of the change with the next entries it is sent.
    let start = Instant::now();
    loop {
        let status = b.cluster_status().await.expect("a cluster");
        if status.nodes.len() == 3 {
            assert!(status.nodes.iter().all(|n| n.id != 4), "{status:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "node 4 is still listed: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    d.shutdown().await.expect("shutdown");
    c.write(set("after-leave", "y"))
        .await
        .expect("write without node 4");
    for node in [&a, &b, &c] {
        node.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_names_another_id_than_its_data_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let port = free_port();
    let peers = BTreeMap::new();
    let node = StoreNode::open_disk_with(
        dir.path(),
        StoreConfig::new("mqkv"),
        no_hook(),
        options(1, port, &peers, false),
    )
    .await
    .expect("open");
    node.shutdown().await.expect("shutdown");
    let port = free_port();
    let wrong = StoreNode::open_disk_with(
        dir.path(),
        StoreConfig::new("mqkv"),
        no_hook(),
        options(2, port, &peers, false),
    )
    .await;
    let err = wrong.err().expect("refused").to_string();
    assert!(err.contains("belongs to node 1"), "{err}");
}
