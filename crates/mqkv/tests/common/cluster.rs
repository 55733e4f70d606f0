//! Real clusters of `mqkv serve` processes on loopback ports, for integration tests.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ServerProcess;

/// A port nobody listens on now (the kernel hands out a free one and it is released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

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
        let root = Self::root(name);
        let mut nodes: Vec<Node> = (1..=n)
            .map(|id| Node {
                id,
                mqtt_port: free_port(),
                cluster_port: free_port(),
                dir: root.join(format!("n{id}")),
                process: None,
                extra: extra.iter().map(|s| s.to_string()).collect(),
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

/// Runs the `mqkv` command line.
pub fn cli(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mqkv"))
        .args(args)
        .output()
        .expect("run mqkv")
}
