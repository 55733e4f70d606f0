//! The state store as a cluster of real `mqkv serve` processes on loopback: forming the group,
//! writes and linearizable reads through every node, SCAN pages across nodes, notifications and
//! key expiry across nodes, a node left without a quorum, growing from one node to three and
//! back, and a node with the wrong secret kept out. Faults under load are in `cluster_faults.rs`.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{bulk, cli, member, ok, text, TestCluster};
use common::store::Client;

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
    let three = member(&status, 3);
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

/// Runs `mosquitto_sub` against `port` until `seconds` pass; returns the lines it printed.
fn subscribe_for(port: u16, filter: &str, seconds: u32) -> std::process::Child {
    std::process::Command::new("mosquitto_sub")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            filter,
            "-q",
            "1",
            "-v",
            "-W",
            &seconds.to_string(),
        ])
        .args(["-i", &format!("sub-{port}-{}", filter.len())])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("mosquitto_sub (mosquitto-clients)")
}

/// `mosquitto_pub` of `message` to `topic` on `port` (an empty message as a null one, `-n`).
fn publish(port: u16, topic: &str, message: &str, extra: &[&str]) {
    let body: &[&str] = if message.is_empty() {
        &["-n"]
    } else {
        &["-m", message]
    };
    let status = std::process::Command::new("mosquitto_pub")
        .args(["-p", &port.to_string(), "-t", topic])
        .args(body)
        .args(extra)
        .status()
        .expect("mosquitto_pub (mosquitto-clients)");
    assert!(status.success(), "mosquitto_pub to {port}");
}

fn lines(child: std::process::Child) -> Vec<String> {
    let out = child.wait_with_output().expect("mosquitto_sub output");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_cross_nodes_once_in_order_and_retained_messages_reach_every_node() {
    let cluster = TestCluster::start("pubsub", 3, &[]);
    cluster.wait_for_leader(1, Duration::from_secs(15));
    let (p1, p2, p3) = (cluster.port(1), cluster.port(2), cluster.port(3));
    let everything = subscribe_for(p2, "x/#", 6);
    let ordered = subscribe_for(p3, "seq/#", 6);
    // A subscription reaches the other nodes a moment after it is made.
    std::thread::sleep(Duration::from_millis(1500));
    publish(p1, "x/a", "one", &["-q", "1"]);
    publish(p3, "x/b", "two", &["-q", "0"]);
    publish(p2, "x/c", "three", &["-q", "2"]);
    // One publisher on node 1, twenty messages at QoS 1: they arrive on node 3 in order.
    let mut burst = std::process::Command::new("mosquitto_pub")
        .args(["-p", &p1.to_string(), "-t", "seq/n", "-q", "1", "-l"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("mosquitto_pub");
    {
        use std::io::Write;
        let mut stdin = burst.stdin.take().expect("stdin");
        for i in 0..20 {
            writeln!(stdin, "{i}").expect("write");
        }
    }
    assert!(burst.wait().expect("mosquitto_pub").success());
    let mut got = lines(everything);
    got.sort();
    assert_eq!(
        got,
        ["x/a one", "x/b two", "x/c three"],
        "each message once, from every node"
    );
    let expected: Vec<String> = (0..20).map(|i| format!("seq/n {i}")).collect();
    assert_eq!(
        lines(ordered),
        expected,
        "one publisher's messages in order, once each"
    );

    // A retained message set on node 1 is there for a new subscriber on node 3, and a
    // retained message cleared on node 2 is gone everywhere.
    publish(p1, "r/keep", "kept", &["-r", "-q", "1"]);
    publish(p1, "r/gone", "soon", &["-r", "-q", "1"]);
    std::thread::sleep(Duration::from_millis(300));
    publish(p2, "r/gone", "", &["-r", "-q", "1"]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines(subscribe_for(p3, "r/#", 2)), ["r/keep kept"]);
    assert_eq!(lines(subscribe_for(p1, "r/#", 2)), ["r/keep kept"]);
}
