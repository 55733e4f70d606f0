//! Real clusters of `mqkv serve` processes on loopback ports, for integration tests.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::store::Client;
use super::ServerProcess;

use mqkv_testkit::free_port;

pub struct Node {
    pub id: u64,
    pub mqtt_port: u16,
    pub cluster_port: u16,
    pub dir: PathBuf,
    pub process: Option<ServerProcess>,
    /// Extra `serve` flags this node is (re)started with.
    pub extra: Vec<String>,
}

impl Node {
    pub fn cluster_addr(&self) -> String {
        format!("127.0.0.1:{}", self.cluster_port)
    }
}

pub struct TestCluster {
    pub nodes: Vec<Node>,
    root: PathBuf,
    /// The `--peer` flags every first member starts with.
    peers: Vec<String>,
}

impl TestCluster {
    /// A scratch directory for `name`, empty.
    pub fn root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mqkv-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    /// `n` durable nodes that form one group, each started with `extra` flags.
    pub fn start(name: &str, n: u64, extra: &[&str]) -> TestCluster {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Self::start_each(name, n, |_| extra.clone())
    }

    /// `n` durable nodes that form one group, node `id` started with `extra(id)` flags.
    pub fn start_each(name: &str, n: u64, extra: impl Fn(u64) -> Vec<String>) -> TestCluster {
        let root = Self::root(name);
        let mut nodes: Vec<Node> = (1..=n)
            .map(|id| Node {
                id,
                mqtt_port: free_port(),
                cluster_port: free_port(),
                dir: root.join(format!("n{id}")),
                process: None,
                extra: extra(id),
            })
            .collect();
        let peers = nodes
            .iter()
            .map(|node| format!("{}={}", node.id, node.cluster_addr()))
            .collect();
        let mut cluster = TestCluster {
            nodes: Vec::new(),
            root,
            peers,
        };
        for node in nodes.iter_mut() {
            node.process = Some(cluster.spawn(node, false));
        }
        cluster.nodes = nodes;
        cluster
    }

    /// A cluster of one node that can grow (started without a peer list).
    pub fn start_single(name: &str, extra: &[&str]) -> TestCluster {
        let root = Self::root(name);
        let mut cluster = TestCluster {
            nodes: Vec::new(),
            root,
            peers: Vec::new(),
        };
        cluster.add_joining(1, extra, false);
        cluster
    }

    /// Starts node `id` as a new process; with `join`, it waits to be added.
    pub fn add_joining(&mut self, id: u64, extra: &[&str], join: bool) -> &Node {
        let mut node = Node {
            id,
            mqtt_port: free_port(),
            cluster_port: free_port(),
            dir: self.root.join(format!("n{id}")),
            process: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        node.process = Some(self.spawn(&node, join));
        self.nodes.push(node);
        self.nodes.last().expect("just pushed")
    }

    fn spawn(&self, node: &Node, join: bool) -> ServerProcess {
        let mqtt = format!("127.0.0.1:{}", node.mqtt_port);
        let cluster = node.cluster_addr();
        let id = node.id.to_string();
        let dir = node.dir.to_str().expect("utf-8 path").to_owned();
        let mut args: Vec<String> = [
            "--listen",
            &mqtt,
            "--data-dir",
            &dir,
            "--node-id",
            &id,
            "--cluster-listen",
            &cluster,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for peer in &self.peers {
            args.push("--peer".into());
            args.push(peer.clone());
        }
        if join {
            args.push("--join".into());
        }
        args.extend(node.extra.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        ServerProcess::start_args(&args)
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .expect("a node of the cluster")
    }

    pub fn port(&self, id: u64) -> u16 {
        self.node(id).mqtt_port
    }

    /// SIGKILL node `id`.
    pub fn kill9(&mut self, id: u64) {
        let node = self.nodes.iter_mut().find(|n| n.id == id).expect("node");
        if let Some(p) = node.process.take() {
            p.kill9();
        }
    }

    /// Starts node `id` again on its data directory and ports.
    pub fn restart(&mut self, id: u64) {
        let index = self.nodes.iter().position(|n| n.id == id).expect("node");
        assert!(self.nodes[index].process.is_none(), "node {id} is running");
        let process = self.spawn(&self.nodes[index], false);
        self.nodes[index].process = Some(process);
    }

    pub fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.process.is_some())
    }

    /// `mqkv cluster status --json` against node `id`, or `None` if it failed.
    pub fn status(&self, id: u64) -> Option<Value> {
        let out = cli(&[
            "cluster",
            "status",
            "--json",
            "--timeout",
            "5000",
            "--port",
            &self.port(id).to_string(),
        ]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Waits until node `via` reports a leader that is running and that every running node
    /// agrees on; returns it.
    pub fn wait_for_leader(&self, via: u64, within: Duration) -> u64 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.status(via) {
                if let Some(leader) = status["leader"].as_u64() {
                    let running: Vec<u64> = self.running().map(|n| n.id).collect();
                    let leads = status["nodes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|n| n["id"].as_u64() == Some(leader) && n["role"] == "leader");
                    if leads && running.contains(&leader) {
                        return leader;
                    }
                }
            }
            assert!(start.elapsed() < within, "no leader within {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(p) = node.process.take() {
                p.kill9();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Node `id`'s entry in a `mqkv cluster status --json` answer.
pub fn member(status: &Value, id: u64) -> Value {
    status["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("node {id} is not listed: {status}"))
}

/// Runs the `mqkv` command line.
pub fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mqkv"))
        .args(args)
        .output()
        .expect("run mqkv")
}

pub fn text(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// The value of a RESP3 bulk string answer (`$3\r\nabc\r\n`), or `None` for a miss.
pub fn bulk(payload: &[u8]) -> Option<String> {
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

pub fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "mqkv failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `mqkv cluster isolate` against node `on`: it acts as if cut off from `from`.
pub fn isolate(cluster: &TestCluster, on: u64, from: &[u64]) {
    let port = cluster.port(on).to_string();
    let mut args = vec!["cluster", "isolate", "--port", &port];
    let ids: Vec<String> = from.iter().map(u64::to_string).collect();
    args.extend(ids.iter().map(String::as_str));
    ok(cli(&args));
}

/// Connects to the first node of `ports`, starting at `from`, that accepts.
pub async fn connect_any(name: &str, ports: &[u16], from: usize) -> (Client, usize) {
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

/// What one writer saw: per key, the value last acknowledged and the values whose outcome is
/// unknown (sent after it, answered with an error or not at all), every version it was given,
/// and when each acknowledgement came (milliseconds since the run began).
#[derive(Default)]
pub struct Seen {
    pub acked: HashMap<String, String>,
    pub unknown: HashMap<String, Vec<String>>,
    /// Every acknowledged write's key and version, in the order they were acknowledged.
    pub versions: Vec<(String, String)>,
    pub acks_ms: Vec<u64>,
    pub acked_after_kill: usize,
}

/// A writer: SETs on its own keys through the nodes of `ports`, starting with the one at
/// `start` and moving on whenever a node goes away, until `stop`.
pub async fn writer(
    w: usize,
    ports: Vec<u16>,
    start: usize,
    epoch: Instant,
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
) -> Seen {
    let mut seen = Seen::default();
    let (mut c, mut at) = connect_any(&format!("w{w}"), &ports, start).await;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("w{w}-k{}", i % 8);
        let value = format!("w{w}-i{i}");
        let after_kill = killed.load(Ordering::Relaxed);
        match c
            .try_call(&[b"SET", key.as_bytes(), value.as_bytes()])
            .await
        {
            Some(a) if a.payload[..] == b"+OK\r\n"[..] => {
                seen.acks_ms.push(epoch.elapsed().as_millis() as u64);
                seen.versions
                    .push((key.clone(), a.user("__ts").expect("a version").to_owned()));
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
                (c, at) = connect_any(&format!("w{w}-{i}"), &ports, at + 1).await;
            }
        }
        i += 1;
    }
    seen
}

/// Reads every acknowledged key back through every node; returns one line for each key that
/// holds neither its acknowledged value nor a later value of unknown outcome.
pub async fn lost_writes(cluster: &TestCluster, seen: &[Seen]) -> Vec<String> {
    let mut lost = Vec::new();
    for node in cluster.running() {
        let mut r = Client::connect(&format!("verify-{}", node.id), node.mqtt_port).await;
        for s in seen {
            for (key, value) in &s.acked {
                let got = bulk(&r.call(&[b"GET", key.as_bytes()]).await.payload);
                let later = s.unknown.get(key).cloned().unwrap_or_default();
                if got.as_deref() != Some(value.as_str())
                    && !got.as_ref().is_some_and(|g| later.contains(g))
                {
                    lost.push(format!(
                        "node {}: {key} holds {got:?}, acknowledged {value}, unknown after it {later:?}",
                        node.id
                    ));
                }
            }
        }
    }
    lost
}
