//! The state store as a cluster of real `mqkv serve` processes on loopback: forming the group,
//! writes and linearizable reads through every node, notifications across nodes, a leader
//! killed with SIGKILL under 16 writers, a node left without a quorum, growing from one node to
//! three and back, a node with the wrong secret kept out, an isolated leader, and a recorded
//! history of concurrent operations through every node, with a partition and a leader killed
//! in the middle, checked for linearizability key by key.

mod common;
#[path = "common/linearizability.rs"]
mod linearizability;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{cli, TestCluster};
use common::store::Client;

fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// The value of a RESP3 bulk string answer (`$3\r\nabc\r\n`), or `None` for a miss.
fn bulk(payload: &[u8]) -> Option<String> {
    let t = text(payload);
    if t == "$-1\r\n" {
        return None;
    }
    Some(
        t.split("\r\n")
            .nth(1)
            .unwrap_or_else(|| panic!("GET answer {t:?}"))
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_serve_one_linearizable_store() {
    let cluster = TestCluster::start("form", 3, &[]);
    let leader = cluster.wait_for_leader(1, Duration::from_secs(15));
    // Every node has heard from the leader and applied the group's first entry.
    let start = Instant::now();
    while !cluster.status(leader).is_some_and(|s| {
        s["nodes"].as_array().into_iter().flatten().all(|n| {
            n["applied"].as_u64().is_some() && (n["role"] == "leader" || n["role"] == "follower")
        })
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the followers did not settle"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // The status command, against every node, names the same leader and all three nodes.
    for node in &cluster.nodes {
        let status = cluster.status(node.id).expect("status");
        assert_eq!(status["leader"].as_u64(), Some(leader), "{status}");
        let nodes = status["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 3, "{status}");
        let leaders = nodes.iter().filter(|n| n["role"] == "leader").count();
        assert_eq!(leaders, 1, "{status}");
        for n in nodes {
            assert!(n["applied"].as_u64().is_some(), "{status}");
            assert!(
                n["mqtt"][0]
                    .as_str()
                    .is_some_and(|a| a.starts_with("127.0.0.1:")),
                "{status}"
            );
        }
    }

    // An observer on one node hears about a change made through another.
    let observer_node = cluster
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .expect("a follower")
        .id;
    let mut observer = Client::connect("observer", cluster.port(observer_node)).await;
    let a = observer.call(&[b"KEYNOTIFY", b"watched"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");

    // A write through each node is read back at once through every node, and versions only
    // grow, whichever node took the write.
    let mut last_version = String::new();
    for writer in &cluster.nodes {
        let mut w = Client::connect(&format!("writer-{}", writer.id), writer.mqtt_port).await;
        let key = format!("key-{}", writer.id);
        let value = format!("value-{}", writer.id);
        let a = w.call(&[b"SET", key.as_bytes(), value.as_bytes()]).await;
        assert_eq!(
            text(&a.payload),
            "+OK\r\n",
            "SET through node {}",
            writer.id
        );
        let version = a.user("__ts").expect("a version").to_owned();
        assert!(version > last_version, "{version} after {last_version}");
        last_version = version;
        for reader in &cluster.nodes {
            let mut r = Client::connect(
                &format!("reader-{}-{}", writer.id, reader.id),
                reader.mqtt_port,
            )
            .await;
            let a = r.call(&[b"GET", key.as_bytes()]).await;
            assert_eq!(
                bulk(&a.payload).as_deref(),
                Some(value.as_str()),
                "node {} reads what node {} acknowledged",
                reader.id,
                writer.id
            );
        }
    }
    let mut w = Client::connect("notifier", cluster.port(leader)).await;
    let a = w.call(&[b"SET", b"watched", b"now"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");
    let note = observer
        .wait_for(|p| p.topic.ends_with(b"/watched") || text(&p.topic).contains("notify"))
        .await;
    assert!(
        text(&note.payload).contains("SET"),
        "{:?}",
        text(&note.payload)
    );

    // SCAN through a follower sees the keys written through the others.
    let mut s = Client::connect("scanner", cluster.port(observer_node)).await;
    let a = s.call(&[b"SCAN", b"key-*"]).await;
    let listing = text(&a.payload);
    for id in 1..=3 {
        assert!(listing.contains(&format!("key-{id}")), "{listing:?}");
    }

    // A SCAN continuation token from one node works on another: pages alternate between nodes.
    for i in 0..250 {
        let key = format!("scan-{i:03}");
        assert_eq!(
            text(&w.call(&[b"SET", key.as_bytes(), b"v"]).await.payload),
            "+OK\r\n"
        );
    }
    let mut scanners = Vec::new();
    for node in &cluster.nodes {
        scanners.push(Client::connect(&format!("pager-{}", node.id), node.mqtt_port).await);
    }
    let mut listed = Vec::new();
    let mut token: Option<String> = None;
    for page in 0.. {
        assert!(page < 50, "the walk does not end");
        let scanner = &mut scanners[page % 3];
        let mut args: Vec<&[u8]> = vec![b"SCAN", b"scan-*"];
        if let Some(t) = &token {
            args.push(t.as_bytes());
        }
        let payload = text(&scanner.call(&args).await.payload);
        let items: Vec<&str> = payload
            .split("\r\n")
            .filter(|l| !l.starts_with(['*', '$']) && !l.is_empty())
            .collect();
        listed.extend(
            items
                .iter()
                .filter(|l| l.starts_with("scan-"))
                .map(|l| l.to_string()),
        );
        token = items
            .iter()
            .find(|l| l.starts_with("after:"))
            .map(|t| t.to_string());
        if token.is_none() {
            assert!(page > 0, "250 keys take more than one page");
            break;
        }
    }
    let expected: Vec<String> = (0..250).map(|i| format!("scan-{i:03}")).collect();
    assert_eq!(listed, expected, "every key once, in order, across nodes");

    // Key expiry is proposed by the leader alone: an observer on a follower hears the key's
    // DELETE once, and no node serves it afterwards.
    let a = observer.call(&[b"KEYNOTIFY", b"short"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");
    let a = w.call(&[b"SET", b"short", b"lived", b"PX", b"500"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");
    let about_short = |p: &rumqttc::v5::mqttbytes::v5::Publish| p.topic.ends_with(b"73686F7274");
    let set = observer.wait_for(about_short).await;
    assert!(
        text(&set.payload).contains("SET"),
        "{:?}",
        text(&set.payload)
    );
    let deleted = observer.wait_for(about_short).await;
    assert!(
        text(&deleted.payload).contains("DELETE"),
        "{:?}",
        text(&deleted.payload)
    );
    let more: Vec<_> = observer
        .drain(Duration::from_millis(1500))
        .await
        .into_iter()
        .filter(|p| about_short(p))
        .collect();
    assert!(more.is_empty(), "the DELETE came more than once: {more:?}");
    for node in &cluster.nodes {
        let mut r = Client::connect(&format!("expired-{}", node.id), node.mqtt_port).await;
        assert_eq!(bulk(&r.call(&[b"GET", b"short"]).await.payload), None);
    }
}

/// What one writer saw: per key, the value last acknowledged and the values whose outcome is
/// unknown (sent after it, answered with an error or not at all), and every version it was
/// given.
#[derive(Default)]
struct Seen {
    acked: HashMap<String, String>,
    unknown: HashMap<String, Vec<String>>,
    versions: Vec<String>,
    acked_after_kill: usize,
}

async fn writer(port: u16, w: usize, stop: Arc<AtomicBool>, killed: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut c = Client::connect(&format!("w{w}"), port).await;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{w}-k{}", i % 4);
        let value = format!("w{w}-i{i}");
        let after_kill = killed.load(Ordering::Relaxed);
        match c
            .try_call(&[b"SET", key.as_bytes(), value.as_bytes()])
            .await
        {
            Some(a) if a.payload[..] == b"+OK\r\n"[..] => {
                seen.versions
                    .push(a.user("__ts").expect("a version").to_owned());
                seen.unknown.remove(&key);
                seen.acked.insert(key, value);
                if after_kill {
                    seen.acked_after_kill += 1;
                }
            }
            Some(a) => {
                assert_eq!(
                    a.user("__stat"),
                    Some("503"),
                    "unexpected answer {:?}",
                    text(&a.payload)
                );
                seen.unknown.entry(key).or_default().push(value);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None => {
                seen.unknown.entry(key).or_default().push(value);
                c = Client::connect(&format!("w{w}-again{i}"), port).await;
            }
        }
        i += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_under_load_loses_no_acknowledged_write() {
    let mut cluster = TestCluster::start("kill", 3, &[]);
    let leader = cluster.wait_for_leader(1, Duration::from_secs(15));
    let followers: Vec<u16> = cluster
        .nodes
        .iter()
        .filter(|n| n.id != leader)
        .map(|n| n.mqtt_port)
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| tokio::spawn(writer(followers[w % 2], w, stop.clone(), killed.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let kill_at = Instant::now();
    cluster.kill9(leader);
    killed.store(true, Ordering::Relaxed);
    let survivor = cluster
        .nodes
        .iter()
        .find(|n| n.id != leader)
        .expect("a survivor")
        .id;
    let new_leader = cluster.wait_for_leader(survivor, Duration::from_secs(20));
    eprintln!(
        "new leader {new_leader} reported {:?} after the kill",
        kill_at.elapsed()
    );
    assert_ne!(new_leader, leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for w in writers {
        seen.push(w.await.expect("writer"));
    }
    let acked: usize = seen.iter().map(|s| s.versions.len()).sum();
    let after: usize = seen.iter().map(|s| s.acked_after_kill).sum();
    eprintln!("{acked} writes acknowledged, {after} of them after the kill");
    assert!(after > 0, "the survivors went on serving writes");

    // No version was handed out twice, and each writer's versions only grow.
    let mut all = HashSet::new();
    for s in &seen {
        for pair in s.versions.windows(2) {
            assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
        for v in &s.versions {
            assert!(all.insert(v.clone()), "version {v} handed out twice");
        }
    }

    // The killed node comes back and catches up; every node holds every acknowledged write.
    cluster.restart(leader);
    for node in &cluster.nodes {
        let mut r = Client::connect(&format!("verify-{}", node.id), node.mqtt_port).await;
        for s in &seen {
            for (key, value) in &s.acked {
                let a = r.call(&[b"GET", key.as_bytes()]).await;
                let got = bulk(&a.payload);
                let later = s.unknown.get(key).cloned().unwrap_or_default();
                assert!(
                    got.as_deref() == Some(value.as_str()) || got.as_ref().is_some_and(|g| later.contains(g)),
                    "node {}: {key} holds {got:?}, acknowledged {value}, unknown after it {later:?}",
                    node.id
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_quorum_refuses_promptly_and_recovers() {
    let mut cluster = TestCluster::start("quorum", 3, &["--quorum-wait-ms", "1000"]);
    cluster.wait_for_leader(1, Duration::from_secs(15));
    let mut c = Client::connect("before", cluster.port(1)).await;
    assert_eq!(
        text(&c.call(&[b"SET", b"k", b"before"]).await.payload),
        "+OK\r\n"
    );
    cluster.kill9(2);
    cluster.kill9(3);
    // Alone, node 1 answers within the client's timeout, with the documented status.
    let mut c = Client::connect("alone", cluster.port(1)).await;
    let a = c.call(&[b"SET", b"k", b"alone"]).await;
    assert_eq!(a.user("__stat"), Some("503"), "{:?}", text(&a.payload));
    assert!(
        a.user("__stMsg").is_some_and(|m| m.contains("unavailable")),
        "{:?}",
        a.user("__stMsg")
    );
    let a = c.call(&[b"GET", b"k"]).await;
    assert_eq!(
        a.user("__stat"),
        Some("503"),
        "a read without a quorum is refused too"
    );
    // One node back is a quorum again: node 1 serves without a restart.
    cluster.restart(2);
    let start = Instant::now();
    loop {
        let a = c.call(&[b"SET", b"k", b"after"]).await;
        if a.payload[..] == b"+OK\r\n"[..] {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no service after the quorum came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let a = c.call(&[b"GET", b"k"]).await;
    assert_eq!(bulk(&a.payload).as_deref(), Some("after"));
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "mqkv failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn voters(cluster: &TestCluster, via: u64) -> Vec<u64> {
    let status = cluster.status(via).expect("status");
    let mut ids: Vec<u64> = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["voter"] == true)
        .filter_map(|n| n["id"].as_u64())
        .collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grows_from_one_node_to_three_and_shrinks_back() {
    let mut cluster = TestCluster::start_single("grow", &[]);
    cluster.wait_for_leader(1, Duration::from_secs(15));
    let p1 = cluster.port(1).to_string();
    let mut c = Client::connect("grower", cluster.port(1)).await;
    for i in 0..50 {
        let key = format!("g{i}");
        assert_eq!(
            text(&c.call(&[b"SET", key.as_bytes(), b"v"]).await.payload),
            "+OK\r\n"
        );
    }
    for id in [2u64, 3] {
        let addr = cluster.add_joining(id, &[], true).cluster_addr();
        // Node 3 is added through node 2, which passes the request to the leader.
        let via = if id == 3 {
            cluster.port(2).to_string()
        } else {
            p1.clone()
        };
        let out = ok(cli(&[
            "cluster",
            "add-node",
            &format!("{id}={addr}"),
            "--port",
            &via,
            "--timeout",
            "60000",
        ]));
        assert!(out.contains("added"), "{out}");
    }
    assert_eq!(voters(&cluster, 1), vec![1, 2, 3]);
    // The new node holds what was written before it joined, and serves writes.
    let mut c3 = Client::connect("on-three", cluster.port(3)).await;
    let a = c3.call(&[b"GET", b"g49"]).await;
    assert_eq!(bulk(&a.payload).as_deref(), Some("v"));
    assert_eq!(
        text(&c3.call(&[b"SET", b"from-three", b"x"]).await.payload),
        "+OK\r\n"
    );

    ok(cli(&["cluster", "remove-node", "3", "--port", &p1]));
    assert_eq!(voters(&cluster, 1), vec![1, 2]);
    ok(cli(&["cluster", "remove-node", "2", "--port", &p1]));
    assert_eq!(voters(&cluster, 1), vec![1]);
    cluster.kill9(2);
    cluster.kill9(3);
    // Alone again, node 1 is its own quorum.
    let mut c = Client::connect("shrunk", cluster.port(1)).await;
    assert_eq!(
        text(&c.call(&[b"SET", b"after-shrink", b"y"]).await.payload),
        "+OK\r\n"
    );
    let a = c.call(&[b"GET", b"from-three"]).await;
    assert_eq!(bulk(&a.payload).as_deref(), Some("x"));
    // Refusals: a node that is already a voter; a loopback-only command from the status path.
    let out = cli(&["cluster", "add-node", "1=127.0.0.1:1", "--port", &p1]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_wrong_secret_is_kept_out() {
    let mut cluster = TestCluster::start("secret", 3, &["--cluster-secret", "right"]);
    // Node 3 restarts with another secret: the other two keep their quorum without it.
    cluster.kill9(3);
    cluster.nodes[2].extra = vec!["--cluster-secret".into(), "wrong".into()];
    let _ = std::fs::remove_dir_all(&cluster.nodes[2].dir);
    cluster.restart(3);
    cluster.wait_for_leader(1, Duration::from_secs(15));
    let mut c = Client::connect("secret-writer", cluster.port(1)).await;
    assert_eq!(
        text(&c.call(&[b"SET", b"k", b"v"]).await.payload),
        "+OK\r\n"
    );
    let status = cluster.status(1).expect("status");
    let three = status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["id"] == 3)
        .cloned()
        .expect("node 3 listed");
    assert!(
        three["error"]
            .as_str()
            .is_some_and(|e| e.contains("secret")),
        "{three}"
    );
    // Node 3 never received the write: it has no leader, so it refuses rather than answer.
    let mut c3 = Client::connect("outsider", cluster.port(3)).await;
    let a = c3.call(&[b"GET", b"k"]).await;
    assert_eq!(a.user("__stat"), Some("503"), "{:?}", text(&a.payload));
}

/// `mqkv cluster isolate` against node `on`: it acts as if cut off from `from`.
fn isolate(cluster: &TestCluster, on: u64, from: &[u64]) {
    let port = cluster.port(on).to_string();
    let mut args = vec!["cluster", "isolate", "--port", &port];
    let ids: Vec<String> = from.iter().map(u64::to_string).collect();
    args.extend(ids.iter().map(String::as_str));
    ok(cli(&args));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_refuses_promptly_and_catches_up_after_healing() {
    let cluster = TestCluster::start(
        "partition",
        3,
        &["--fault-injection", "--quorum-wait-ms", "1000"],
    );
    let old = cluster.wait_for_leader(1, Duration::from_secs(15));
    let others: Vec<u64> = (1..=3).filter(|id| *id != old).collect();
    let mut c = Client::connect("before-cut", cluster.port(old)).await;
    assert_eq!(
        text(&c.call(&[b"SET", b"k", b"before"]).await.payload),
        "+OK\r\n"
    );

    // Cut the leader off from the other two, both ways.
    isolate(&cluster, old, &others);
    for id in &others {
        isolate(&cluster, *id, &[old]);
    }
    // The majority elects a leader of its own and serves.
    let start = Instant::now();
    let mut majority = Client::connect("majority", cluster.port(others[0])).await;
    loop {
        let a = majority.call(&[b"SET", b"k", b"during"]).await;
        if a.payload[..] == b"+OK\r\n"[..] {
            break;
        }
        assert_eq!(a.user("__stat"), Some("503"), "{:?}", text(&a.payload));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the majority did not take over"
        );
    }
    eprintln!(
        "the majority served writes {:?} after the cut",
        start.elapsed()
    );
    let mut other = Client::connect("majority-2", cluster.port(others[1])).await;
    assert_eq!(
        bulk(&other.call(&[b"GET", b"k"]).await.payload).as_deref(),
        Some("during")
    );

    // The old leader, alone, neither writes nor serves a stale read.
    let mut cut = Client::connect("cut-off", cluster.port(old)).await;
    let a = cut.call(&[b"SET", b"k", b"lost"]).await;
    assert_eq!(a.user("__stat"), Some("503"), "{:?}", text(&a.payload));
    let a = cut.call(&[b"GET", b"k"]).await;
    assert_eq!(
        a.user("__stat"),
        Some("503"),
        "a stale read was served: {:?}",
        text(&a.payload)
    );

    // Healed, it catches up and reads what the majority wrote.
    for id in 1..=3 {
        isolate(&cluster, id, &[]);
    }
    let start = Instant::now();
    loop {
        let a = cut.call(&[b"GET", b"k"]).await;
        if a.user("__stat") == Some("200") {
            assert_eq!(bulk(&a.payload).as_deref(), Some("during"));
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no service after healing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The write refused during the cut never took effect anywhere.
    for id in 1..=3 {
        let mut r = Client::connect(&format!("after-heal-{id}"), cluster.port(id)).await;
        assert_eq!(
            bulk(&r.call(&[b"GET", b"k"]).await.payload).as_deref(),
            Some("during")
        );
    }
}

/// Connects to the first node of `ports`, starting at `from`, that accepts.
async fn connect_any(name: &str, ports: &[u16], from: usize) -> (Client, usize) {
    for attempt in 0..(ports.len() * 20) {
        let index = (from + attempt) % ports.len();
        let id = format!("{name}-{attempt}");
        // A node that is down makes the connect panic inside its task.
        if let Ok(client) = tokio::spawn(Client::connect_owned(id, ports[index])).await {
            return (client, index);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no node accepted {name}");
}

/// One client's operations on three keys through the nodes, each with when it was sent and
/// when (if ever) it was answered.
async fn record(
    w: usize,
    ports: Vec<u16>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<(String, linearizability::Op)> {
    use linearizability::{Kind, Op};
    use rand::Rng;
    let mut history = Vec::new();
    let (mut client, mut at) = connect_any(&format!("h{w}"), &ports, w).await;
    let mut i = 0usize;
    let mut last_seen: HashMap<String, String> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let key = format!("lin-{}", rand::thread_rng().gen_range(0..3));
        let roll = rand::thread_rng().gen_range(0..100);
        let value = format!("w{w}-{i}");
        let guess = last_seen
            .get(&key)
            .cloned()
            .unwrap_or_else(|| value.clone());
        let args: Vec<Vec<u8>> = match roll {
            0..35 => vec![b"SET".to_vec(), key.clone().into(), value.clone().into()],
            35..70 => vec![b"GET".to_vec(), key.clone().into()],
            70..80 => vec![b"DEL".to_vec(), key.clone().into()],
            _ => vec![b"VDEL".to_vec(), key.clone().into(), guess.clone().into()],
        };
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let call = epoch.elapsed().as_nanos() as u64;
        let answer = client.try_call(&refs).await;
        let ret = epoch.elapsed().as_nanos() as u64;
        let known = answer.as_ref().filter(|a| a.user("__stat") == Some("200"));
        let int = |a: &common::store::Answer| {
            text(&a.payload)
                .trim_start_matches(':')
                .trim_end()
                .parse::<i64>()
                .unwrap_or_else(|_| panic!("an integer answer: {:?}", text(&a.payload)))
        };
        let kind = match (roll, known) {
            (0..35, Some(a)) => {
                assert_eq!(text(&a.payload), "+OK\r\n");
                Some(Kind::Set(value.clone()))
            }
            (0..35, None) => Some(Kind::Set(value.clone())),
            (35..70, Some(a)) => {
                let got = bulk(&a.payload);
                if let Some(v) = &got {
                    last_seen.insert(key.clone(), v.clone());
                }
                Some(Kind::Get(got))
            }
            (35..70, None) => None,
            (70..80, a) => Some(Kind::Del(a.map(int))),
            (_, a) => Some(Kind::VDel(guess, a.map(int))),
        };
        if let Some(kind) = kind {
            let ret = known.map(|_| ret);
            history.push((key, Op { call, ret, kind }));
        }
        if answer.is_none() {
            (client, at) = connect_any(&format!("h{w}-{i}"), &ports, at + 1).await;
        }
        i += 1;
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_through_every_node_with_faults_is_linearizable() {
    let mut cluster = TestCluster::start(
        "history",
        3,
        &["--fault-injection", "--quorum-wait-ms", "1500"],
    );
    let leader = cluster.wait_for_leader(1, Duration::from_secs(15));
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.mqtt_port).collect();
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..6)
        .map(|w| tokio::spawn(record(w, ports.clone(), epoch, stop.clone())))
        .collect();
    // A follower cut off for a while, then the leader killed and brought back.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let rest: Vec<u64> = (1..=3).filter(|id| *id != follower).collect();
    isolate(&cluster, follower, &rest);
    for id in &rest {
        isolate(&cluster, *id, &[follower]);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for id in 1..=3 {
        isolate(&cluster, id, &[]);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = cluster.wait_for_leader(follower, Duration::from_secs(15));
    cluster.kill9(leader);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cluster.restart(leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut by_key: HashMap<String, Vec<linearizability::Op>> = HashMap::new();
    for w in workers {
        for (key, op) in w.await.expect("worker") {
            by_key.entry(key).or_default().push(op);
        }
    }
    let answered: usize = by_key
        .values()
        .flatten()
        .filter(|o| o.ret.is_some())
        .count();
    let pending: usize = by_key
        .values()
        .flatten()
        .filter(|o| o.ret.is_none())
        .count();
    eprintln!(
        "{answered} operations answered, {pending} with an unknown outcome, over {} keys",
        by_key.len()
    );
    assert!(
        answered >= 100,
        "too short a history to say anything: {answered}"
    );
    for (key, history) in &by_key {
        assert!(
            linearizability::linearizable(history),
            "the history of {key} is not linearizable: {history:#?}"
        );
    }
}

/// A writer for the soak: SETs on its own keys through whichever node takes them, noting when
/// each acknowledgement came.
async fn soak_writer(
    w: usize,
    ports: Vec<u16>,
    epoch: Instant,
    stop: Arc<AtomicBool>,
) -> (Seen, Vec<u64>) {
    let mut seen = Seen::default();
    let mut acks = Vec::new();
    let (mut c, mut at) = connect_any(&format!("soak{w}"), &ports, w).await;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("soak-w{w}-k{}", i % 8);
        let value = format!("w{w}-i{i}");
        match c
            .try_call(&[b"SET", key.as_bytes(), value.as_bytes()])
            .await
        {
            Some(a) if a.payload[..] == b"+OK\r\n"[..] => {
                acks.push(epoch.elapsed().as_millis() as u64);
                seen.versions
                    .push(a.user("__ts").expect("a version").to_owned());
                seen.unknown.remove(&key);
                seen.acked.insert(key, value);
            }
            Some(a) => {
                assert_eq!(
                    a.user("__stat"),
                    Some("503"),
                    "unexpected answer {:?}",
                    text(&a.payload)
                );
                seen.unknown.entry(key).or_default().push(value);
            }
            None => {
                seen.unknown.entry(key).or_default().push(value);
                (c, at) = connect_any(&format!("soak{w}-{i}"), &ports, at + 1).await;
            }
        }
        i += 1;
    }
    (seen, acks)
}

/// The long run: mixed writers on all nodes for `MQKV_SOAK_SECS` (default 1800) with a node
/// killed with SIGKILL every `MQKV_SOAK_KILL_EVERY_SECS` (default 60) and restarted 10 s
/// later. Reports writes acknowledged, lost (must be 0) and the longest stretch without an
/// acknowledgement. Run with `cargo nextest run --release -p mqkv --test cluster --run-ignored
/// only soak --no-capture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long run: 30 minutes by default"]
async fn soak_with_a_node_killed_every_minute() {
    use rand::Rng;
    let secs: u64 = std::env::var("MQKV_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1800);
    let every: u64 = std::env::var("MQKV_SOAK_KILL_EVERY_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut cluster = TestCluster::start("soak", 3, &[]);
    cluster.wait_for_leader(1, Duration::from_secs(15));
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.mqtt_port).collect();
    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..16)
        .map(|w| tokio::spawn(soak_writer(w, ports.clone(), epoch, stop.clone())))
        .collect();
    let mut kills = 0;
    while epoch.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(every.saturating_sub(10).max(1))).await;
        let victim = rand::thread_rng().gen_range(1..=3);
        cluster.kill9(victim);
        kills += 1;
        tokio::time::sleep(Duration::from_secs(10)).await;
        cluster.restart(victim);
        eprintln!("{:?}: node {victim} killed and restarted", epoch.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    let mut acks = Vec::new();
    for w in writers {
        let (s, a) = w.await.expect("writer");
        seen.push(s);
        acks.extend(a);
    }
    acks.sort_unstable();
    let longest_gap = acks.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let acked = acks.len();
    let mut lost = 0;
    cluster.wait_for_leader(1, Duration::from_secs(30));
    for node in &cluster.nodes {
        let mut r = Client::connect(&format!("soak-verify-{}", node.id), node.mqtt_port).await;
        for s in &seen {
            for (key, value) in &s.acked {
                let got = bulk(&r.call(&[b"GET", key.as_bytes()]).await.payload);
                let later = s.unknown.get(key).cloned().unwrap_or_default();
                if got.as_deref() != Some(value.as_str())
                    && !got.as_ref().is_some_and(|g| later.contains(g))
                {
                    lost += 1;
                    eprintln!(
                        "node {}: {key} holds {got:?}, acknowledged {value}",
                        node.id
                    );
                }
            }
        }
    }
    eprintln!(
        "soak: {secs} s, {kills} kills, {acked} writes acknowledged, {lost} lost, longest stretch without an acknowledgement {longest_gap} ms"
    );
    assert_eq!(lost, 0);
    assert!(acked > 0);
}
