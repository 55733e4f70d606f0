//! `mqkv-bench --cluster`: three mqkv nodes against a three-member etcd cluster on this machine,
//! doing the same durable writes and linearizable reads side by side.
//!
//! Both clusters run throughout, each on its own loopback ports and data directories with its
//! default durability (mqkv's log and etcd's WAL are synced before a write is answered). Client
//! `i` holds one connection to member `i mod 3`, with one request in flight: mqkv's clients
//! speak MQTT to the state store, etcd's speak etcd's gRPC API (Put, and Range with
//! `serializable` false: a read through the leader's read index, as mqkv's GET is). Each
//! client writes and reads its own keys, preloaded before a read run. Every configuration runs
//! in turns A B B A (`--repeat` times), so a slow stretch of the machine falls on both alike;
//! the figures of a side are the sums of its turns.
//!
//! A single durable mqkv node runs the same loads after the clusters, for the cost of
//! replication.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::json;

use crate::etcd::EtcdClient;
use crate::report::{new_histogram, Latency};
use crate::servers::{find_executable, process_cpu_seconds};
use crate::store::StoreClient;
use crate::wire::Certs;
use crate::workloads::{connect_all, drive_measuring, Settings, Worker};
use mqkv_testkit::free_port;

/// Members of each cluster.
const MEMBERS: usize = 3;
/// Keys each client writes and reads.
const KEYS_PER_CLIENT: u64 = 16;
/// Longest a cluster may take to answer its first write.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Which system a group of processes is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum System {
    #[serde(rename = "mqkv-cluster")]
    MqkvCluster,
    #[serde(rename = "etcd-cluster")]
    EtcdCluster,
    #[serde(rename = "mqkv-single")]
    MqkvSingle,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::MqkvCluster => "mqkv-cluster",
            System::EtcdCluster => "etcd-cluster",
            System::MqkvSingle => "mqkv-single",
        }
    }
}

/// The processes of one system under test; killed and their directory removed on drop.
pub struct Group {
    pub system: System,
    children: Vec<Child>,
    /// Where clients connect, one per member.
    pub endpoints: Vec<SocketAddr>,
    dir: PathBuf,
}

impl Group {
    /// Three `mqkv serve` nodes forming one cluster, or one node alone.
    pub fn start_mqkv(bin: &Path, extra: &[String], scratch: &Path, nodes: usize) -> Result<Group> {
        let system = if nodes == 1 {
            System::MqkvSingle
        } else {
            System::MqkvCluster
        };
        let dir = scratch.join(system.name());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let ports: Vec<u16> = (0..nodes).map(|_| free_port()).collect();
        let mut group = Group {
            system,
            children: Vec::new(),
            endpoints: Vec::new(),
            dir: dir.clone(),
        };
        for i in 0..nodes {
            let mut cmd = Command::new(bin);
            cmd.args(["serve", "--listen", "127.0.0.1:0", "--storage", "disk"])
                .arg("--data-dir")
                .arg(dir.join(format!("n{}", i + 1)));
            if nodes > 1 {
                cmd.args(["--node-id", &(i + 1).to_string()])
                    .args(["--cluster-listen", &format!("127.0.0.1:{}", ports[i])]);
                for (j, port) in ports.iter().enumerate() {
                    cmd.args(["--peer", &format!("{}=127.0.0.1:{port}", j + 1)]);
                }
            }
            cmd.args(extra)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(dir.join(format!("n{}.log", i + 1)))?);
            let mut child = cmd
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            let stdout = child.stdout.take().context("no stdout")?;
            group.children.push(child);
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            let addr = line
                .trim()
                .strip_prefix("listening on ")
                .and_then(|a| a.parse().ok())
                .with_context(|| format!("mqkv node {} printed {line:?}", i + 1))?;
            group.endpoints.push(addr);
        }
        Ok(group)
    }

    /// Three etcd members forming one cluster; with `tls`, their peer links are mutual TLS.
    pub fn start_etcd(bin: &Path, scratch: &Path, tls: Option<&Certs>) -> Result<Group> {
        let peer_scheme = if tls.is_some() { "https" } else { "http" };
        let dir = scratch.join("etcd-cluster");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let clients: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let peers: Vec<u16> = (0..MEMBERS).map(|_| free_port()).collect();
        let initial = (0..MEMBERS)
            .map(|i| format!("e{}={peer_scheme}://127.0.0.1:{}", i + 1, peers[i]))
            .collect::<Vec<_>>()
            .join(",");
        let mut group = Group {
            system: System::EtcdCluster,
            children: Vec::new(),
            endpoints: Vec::new(),
            dir: dir.clone(),
        };
        for i in 0..MEMBERS {
            let client_url = format!("http://127.0.0.1:{}", clients[i]);
            let peer_url = format!("{peer_scheme}://127.0.0.1:{}", peers[i]);
            let mut cmd = Command::new(bin);
            if let Some(c) = tls {
                cmd.arg("--peer-cert-file")
                    .arg(&c.cert)
                    .arg("--peer-key-file")
                    .arg(&c.key)
                    .arg("--peer-trusted-ca-file")
                    .arg(&c.ca)
                    .arg("--peer-client-cert-auth");
            }
            let child = cmd
                .args(["--name", &format!("e{}", i + 1)])
                .arg("--data-dir")
                .arg(dir.join(format!("e{}", i + 1)))
                .args(["--listen-client-urls", &client_url])
                .args(["--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "mqkv-bench"])
                .args(["--logger", "zap", "--log-level", "warn"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("e{}.log", i + 1)))?)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            group.children.push(child);
            group
                .endpoints
                .push(SocketAddr::from(([127, 0, 0, 1], clients[i])));
        }
        Ok(group)
    }

    /// User plus system CPU time of every member so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .map(|c| process_cpu_seconds(c.id()).unwrap_or(0.0))
            .sum()
    }

    /// Waits until every member answers a write.
    async fn wait_ready(&self, value_size: usize) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        for (i, addr) in self.endpoints.iter().enumerate() {
            loop {
                let attempt = async {
                    let mut conn = Conn::connect(self.system, *addr, i, value_size).await?;
                    conn.set(u64::MAX / 2).await
                };
                match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                    Ok(Ok(true)) => break,
                    outcome => {
                        if Instant::now() > deadline {
                            bail!(
                                "{} member {} not ready after {READY_WITHIN:?}: {outcome:?}; logs in {}",
                                self.system.name(),
                                i + 1,
                                self.dir.display()
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One client connection to either system.
enum Conn {
    Mqkv(StoreClient),
    Etcd(EtcdClient),
}

impl Conn {
    async fn connect(
        system: System,
        addr: SocketAddr,
        i: usize,
        value_size: usize,
    ) -> Result<Conn> {
        Ok(match system {
            System::EtcdCluster => Conn::Etcd(EtcdClient::connect(addr, value_size).await?),
            System::MqkvCluster | System::MqkvSingle => {
                let id = format!("bench-cluster-{i}-{}", std::process::id());
                Conn::Mqkv(StoreClient::connect(addr, id, i as u64 + 1, value_size).await?)
            }
        })
    }

    async fn set(&mut self, key: u64) -> Result<bool> {
        match self {
            Conn::Mqkv(c) => c.set(key).await,
            Conn::Etcd(c) => c.put(key).await,
        }
    }

    async fn get(&mut self, key: u64) -> Result<bool> {
        match self {
            Conn::Mqkv(c) => c.get(key).await,
            Conn::Etcd(c) => c.get(key).await,
        }
    }
}

/// A client running writes or reads of its own keys.
struct Client {
    conn: Conn,
    read: bool,
    base: u64,
    next: u64,
}

impl Worker for Client {
    async fn op(&mut self, _seq: u64) -> Result<bool> {
        self.next = (self.next + 1) % KEYS_PER_CLIENT;
        let key = self.base + self.next;
        if self.read {
            self.conn.get(key).await
        } else {
            self.conn.set(key).await
        }
    }
}

async fn clients(group: &Group, n: usize, read: bool, value_size: usize) -> Result<Vec<Client>> {
    let system = group.system;
    let endpoints = group.endpoints.clone();
    let conns = connect_all(n, move |i| {
        let addr = endpoints[i % endpoints.len()];
        Conn::connect(system, addr, i, value_size)
    })
    .await?;
    let mut out: Vec<Client> = conns
        .into_iter()
        .enumerate()
        .map(|(i, conn)| Client {
            conn,
            read,
            base: i as u64 * KEYS_PER_CLIENT,
            next: 0,
        })
        .collect();
    if read {
        for c in &mut out {
            for k in 0..KEYS_PER_CLIENT {
                if !c.conn.set(c.base + k).await? {
                    bail!("preloading a key was refused");
                }
            }
        }
    }
    Ok(out)
}

/// What one system did in one configuration, over all its turns.
struct Tally {
    ops: u64,
    errors: u64,
    seconds: f64,
    server_cpu_seconds: f64,
    hist: Histogram<u64>,
    turns: Vec<f64>,
    failures: Vec<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ops: 0,
            errors: 0,
            seconds: 0.0,
            server_cpu_seconds: 0.0,
            hist: new_histogram(),
            turns: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn json(&self) -> serde_json::Value {
        let latency = Latency::from_ns(&self.hist);
        json!({
            "ops": self.ops,
            "errors": self.errors,
            "seconds": self.seconds,
            "throughput": self.rate(),
            "turns": self.turns,
            "server_cpu_per_second": if self.seconds > 0.0 { self.server_cpu_seconds / self.seconds } else { 0.0 },
            "latency_us": latency,
            "failures": self.failures,
        })
    }
}

async fn turn(
    group: &Group,
    n: usize,
    read: bool,
    s: &Settings,
    value_size: usize,
    tally: &mut Tally,
) {
    let workers = match clients(group, n, read, value_size).await {
        Ok(w) => w,
        Err(e) => {
            tally.failures.push(format!("connecting: {e:#}"));
            return;
        }
    };
    let out = drive_measuring(workers, s, || group.cpu_seconds()).await;
    let seconds = out.window.as_secs_f64();
    tally.ops += out.ops;
    tally.errors += out.errors;
    tally.seconds += seconds;
    tally.server_cpu_seconds += out.server_cpu * seconds;
    let _ = tally.hist.add(&out.hist);
    tally.turns.push(out.ops as f64 / seconds);
    tally.failures.extend(out.failures);
}

/// What the comparison asks for.
pub struct Plan {
    pub clients: Vec<usize>,
    pub value_size: usize,
    pub repeat: u32,
    pub settings: Settings,
    pub mqkv: PathBuf,
    pub mqkv_args: Vec<String>,
    /// Extra arguments for the cluster's nodes, not the single node.
    pub cluster_args: Vec<String>,
    /// The links between the nodes over mutual TLS, in both clusters.
    pub tls: bool,
    pub out: PathBuf,
    pub install: bool,
}

/// The etcd binary, installed from Debian's `etcd-server` if missing and allowed.
fn etcd_binary(install: bool, scratch: &Path) -> Result<PathBuf> {
    if let Some(bin) = find_executable("etcd") {
        return Ok(bin);
    }
    if install {
        crate::servers::apt_install(&["etcd-server"], &scratch.join("apt.log"))?;
    }
    find_executable("etcd").context("etcd is not installed (Debian package etcd-server)")
}

/// Runs the comparison and writes `cluster.json` and `cluster.md` under `plan.out`.
pub fn run(plan: &Plan) -> Result<()> {
    std::fs::create_dir_all(&plan.out)?;
    let scratch = std::env::temp_dir().join(format!("mqkv-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let etcd = etcd_binary(plan.install, &scratch)?;
    let etcd_version = crate::servers::version_of(&etcd, "--version");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let certs = match plan.tls {
        true => Some(Certs::make(&scratch.join("certs")).context("making test certificates")?),
        false => None,
    };
    let mut rows = Vec::new();
    {
        let mut args: Vec<String> = plan
            .mqkv_args
            .iter()
            .chain(&plan.cluster_args)
            .cloned()
            .collect();
        if let Some(c) = &certs {
            for (flag, file) in [
                ("--cluster-tls-cert", &c.cert),
                ("--cluster-tls-key", &c.key),
                ("--cluster-tls-ca", &c.ca),
            ] {
                args.push(flag.to_owned());
                args.push(file.display().to_string());
            }
        }
        let mqkv = Group::start_mqkv(&plan.mqkv, &args, &scratch, MEMBERS)?;
        let etcd = Group::start_etcd(&etcd, &scratch, certs.as_ref())?;
        rt.block_on(async {
            mqkv.wait_ready(plan.value_size).await?;
            etcd.wait_ready(plan.value_size).await
        })?;
        for read in [false, true] {
            for &n in &plan.clients {
                let mut tallies = [Tally::new(), Tally::new()];
                for _ in 0..plan.repeat {
                    for side in [0, 1, 1, 0] {
                        let group = if side == 0 { &mqkv } else { &etcd };
                        rt.block_on(turn(
                            group,
                            n,
                            read,
                            &plan.settings,
                            plan.value_size,
                            &mut tallies[side],
                        ));
                    }
                }
                let [m, e] = &tallies;
                eprintln!(
                    "{} c={n}: mqkv {:.0}/s, etcd {:.0}/s ({:.2}x)",
                    if read { "read" } else { "write" },
                    m.rate(),
                    e.rate(),
                    m.rate() / e.rate().max(f64::MIN_POSITIVE)
                );
                rows.push((read, n, tallies));
            }
        }
    }
    // The single node, for the cost of replication.
    let mut single = Vec::new();
    {
        let group = Group::start_mqkv(&plan.mqkv, &plan.mqkv_args, &scratch, 1)?;
        rt.block_on(group.wait_ready(plan.value_size))?;
        for read in [false, true] {
            for &n in &plan.clients {
                let mut tally = Tally::new();
                for _ in 0..plan.repeat {
                    rt.block_on(turn(
                        &group,
                        n,
                        read,
                        &plan.settings,
                        plan.value_size,
                        &mut tally,
                    ));
                }
                eprintln!(
                    "{} c={n}: mqkv single node {:.0}/s",
                    if read { "read" } else { "write" },
                    tally.rate()
                );
                single.push((read, n, tally));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    write_results(plan, etcd_version, &rows, &single)
}

fn p99_ms(t: &Tally) -> f64 {
    Latency::from_ns(&t.hist).map_or(f64::NAN, |l| l.p99 / 1000.0)
}

fn write_results(
    plan: &Plan,
    etcd_version: Option<String>,
    rows: &[(bool, usize, [Tally; 2])],
    single: &[(bool, usize, Tally)],
) -> Result<()> {
    let op = |read: bool| if read { "read" } else { "write" };
    let json = json!({
        "value_size": plan.value_size,
        "keys_per_client": KEYS_PER_CLIENT,
        "seconds_per_turn": plan.settings.duration.as_secs_f64(),
        "repeat": plan.repeat,
        "etcd_version": etcd_version,
        "links_over_tls": plan.tls,
        "cluster": rows.iter().map(|(read, n, [m, e])| json!({
            "op": op(*read),
            "clients": n,
            "mqkv": m.json(),
            "etcd": e.json(),
            "throughput_ratio": m.rate() / e.rate().max(f64::MIN_POSITIVE),
        })).collect::<Vec<_>>(),
        "single_node": single.iter().map(|(read, n, t)| json!({
            "op": op(*read),
            "clients": n,
            "mqkv": t.json(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        plan.out.join("cluster.json"),
        serde_json::to_vec_pretty(&json)?,
    )?;
    let mut md = String::new();
    md.push_str(&format!(
        "Three mqkv nodes against a three-member etcd cluster ({}){}, durable writes and \
         linearizable reads of {}-byte values, one request in flight per client, \
         {} s turns A B B A x{}.\n\n",
        etcd_version.as_deref().unwrap_or("etcd"),
        if plan.tls {
            ", the links between the nodes over mutual TLS in both"
        } else {
            ""
        },
        plan.value_size,
        plan.settings.duration.as_secs_f64(),
        plan.repeat
    ));
    md.push_str("| op | clients | mqkv ops/s | etcd ops/s | mqkv/etcd | mqkv p99 ms | etcd p99 ms | mqkv single node ops/s |\n");
    md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (read, n, [m, e]) in rows {
        let alone = single
            .iter()
            .find(|(r, c, _)| r == read && c == n)
            .map_or(f64::NAN, |(_, _, t)| t.rate());
        md.push_str(&format!(
            "| {} | {n} | {:.0} | {:.0} | {:.2}x | {:.2} | {:.2} | {:.0} |\n",
            op(*read),
            m.rate(),
            e.rate(),
            m.rate() / e.rate().max(f64::MIN_POSITIVE),
            p99_ms(m),
            p99_ms(e),
            alone
        ));
    }
    let failures: Vec<&String> = rows
        .iter()
        .flat_map(|(_, _, t)| t.iter().flat_map(|t| &t.failures))
        .chain(single.iter().flat_map(|(_, _, t)| &t.failures))
        .collect();
    if !failures.is_empty() {
        md.push_str(&format!(
            "\n{} client failures; the first: {}\n",
            failures.len(),
            failures[0]
        ));
    }
    std::fs::write(plan.out.join("cluster.md"), &md)?;
    std::io::stdout().write_all(md.as_bytes())?;
    if !failures.is_empty() {
        bail!("{} client failures", failures.len());
    }
    Ok(())
}
