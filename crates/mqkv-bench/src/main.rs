//! `mqkv-bench`: load from a separate process over loopback against mqkv, side by side with
//! Mosquitto (pub/sub) and Redis (SET/GET), with throughput, latency percentiles, a JSON record,
//! a Markdown table and a PNG chart of throughput versus concurrency.

mod chart;
mod cluster;
mod etcd;
mod interleave;
mod mqtt;
mod policy;
mod report;
mod servers;
mod store;
mod wire;
mod workloads;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use mqkv_broker::codec::QoS;
use serde_json::json;

use report::RunResult;
use servers::{Binaries, Server, Target};
use wire::{Certs, Wire};
use workloads::{KvMode, Settings};

const ALL_WORKLOADS: [&str; 14] = [
    "set",
    "get",
    "mix",
    "pipe",
    "notify",
    "fanin",
    "fanout",
    "tls",
    "ws",
    "policy",
    "rate",
    "storm",
    "mem-conns",
    "mem-keys",
];

#[derive(Parser, Debug)]
#[command(
    name = "mqkv-bench",
    about = "Benchmarks mqkv against Mosquitto and Redis on this machine",
    after_help = "Workloads: set, get, mix (state store, with Redis as anchor); pipe (SET with \
                  many requests in flight on one connection, with Redis pipelining as anchor); \
                  notify (key notification fan-out, of one key watched exactly and of many keys \
                  watched through one pattern); fanin, fanout (MQTT pub/sub QoS 0 and 1, with \
                  Mosquitto); tls, ws (pub/sub QoS 1 fan-in and fan-out over TLS and over WebSocket, with \
                  Mosquitto on the same transport); policy (pub/sub QoS 1 fan-in and SET with a 100-rule \
                  authorization policy against none); rate (QoS 1 latency at a fixed rate); storm (connects per \
                  second); mem-conns (RSS per idle connection); mem-keys (RSS per stored key)."
)]
struct Args {
    /// Every workload at tiny sizes and durations, to check that the harness works.
    #[arg(long)]
    smoke: bool,
    /// Directory for results.json, results.md and throughput.png.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Measured seconds per configuration [default: 2; smoke 0.3].
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up seconds before each measured window [default: 0.5; smoke 0.1].
    #[arg(long)]
    warmup: Option<f64>,
    /// Concurrent clients, comma separated [default: 1,16,64,256; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// State store value sizes, comma separated; accepts 16, 1k, 64KiB [default: 16,1k,64k;
    /// smoke 16,1k].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    value_sizes: Option<Vec<usize>>,
    /// Workloads to run, comma separated, or `all`.
    #[arg(long, value_delimiter = ',')]
    workloads: Option<Vec<String>>,
    /// Client counts for durable (`--storage disk`) SET [default: 1,16,64,256; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    disk_clients: Option<Vec<usize>>,
    /// Requests in flight on the one connection of `pipe`, comma separated [default: 16,256;
    /// smoke 4].
    #[arg(long, value_delimiter = ',')]
    pipeline_depths: Option<Vec<usize>>,
    /// Concurrent clients for the connection storm [default: 1,16,64; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    storm_clients: Option<Vec<usize>>,
    /// Seconds of the fixed-rate QoS 1 latency run [default: 10; smoke 1].
    #[arg(long)]
    rate_duration: Option<f64>,
    /// Messages per second of the fixed-rate run.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Idle connections for the memory workload [default: 10000; smoke 200].
    #[arg(long)]
    idle_connections: Option<usize>,
    /// Stored keys (100 B values) for the memory workload [default: 1000000; smoke 5000].
    #[arg(long)]
    keys: Option<u64>,
    /// Pub/sub payload bytes (at least 20).
    #[arg(long, default_value_t = 64)]
    pubsub_payload: usize,
    /// The mqkv binary [default: $MQKV_BIN, else `mqkv` beside this program, else PATH].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// An extra argument for every `mqkv serve` (repeatable), e.g. `--server-arg=--workers=1`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Run mqkv only, without Mosquitto and Redis.
    #[arg(long)]
    no_anchors: bool,
    /// Do not install missing anchors with apt-get.
    #[arg(long)]
    no_install: bool,
    /// Runs each throughput and latency configuration this many times, mqkv and its anchors
    /// taking turns to go first, and reports the median run of each (by throughput; by p99 for
    /// the fixed-rate run). results.json lists every run's figure. The targets are then
    /// judged on the median of mqkv's figure over its anchor's round by round. Memory workloads
    /// run once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=15))]
    repeat: u32,
    /// Instead of the workloads: durable SET on the mqkv server against this one (another
    /// mqkv binary, or `redis-aof`), both running throughout and the load moving between them
    /// every `--slice-ms` (A B B A, ...), at the first of `--disk-clients` and of
    /// `--value-sizes`. Writes interleave.json.
    #[arg(long, value_name = "BIN|redis-aof")]
    interleave: Option<String>,
    /// Milliseconds per slice of an interleaved run (`--interleave`, and the `set` workload's
    /// durable SET against Redis) [default: 500; smoke 100].
    #[arg(long, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    slice_ms: Option<u64>,
    /// Slices of an interleaved run, half for each server; a multiple of 4 [default: 80;
    /// smoke 8].
    #[arg(long, value_parser = clap::value_parser!(u64).range(4..=4_000))]
    slices: Option<u64>,
    /// Instead of the workloads: three durable mqkv nodes against a three-member etcd cluster
    /// (Debian `etcd-server`), durable writes and linearizable reads at each of `--clients`
    /// [default: 16,64,256; smoke 4], then a single durable node; writes cluster.json and
    /// cluster.md.
    #[arg(long)]
    cluster: bool,
    /// Value bytes of the cluster comparison.
    #[arg(long, default_value = "256", value_parser = parse_size)]
    cluster_value: usize,
    /// An extra argument for the cluster's nodes only (repeatable), e.g.
    /// `--cluster-arg=--pipeline-depth=1`.
    #[arg(long = "cluster-arg", allow_hyphen_values = true)]
    cluster_args: Vec<String>,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = if let Some(n) = t.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1024 * 1024)
    } else {
        (t, 1)
    };
    num.trim()
        .parse::<usize>()
        .map(|n| n * mult)
        .map_err(|_| format!("not a size: {s}"))
}

/// Everything resolved from the arguments.
struct Plan {
    settings: Settings,
    clients: Vec<usize>,
    value_sizes: Vec<usize>,
    disk_clients: Vec<usize>,
    pipeline_depths: Vec<usize>,
    storm_clients: Vec<usize>,
    workloads: Vec<String>,
}

fn plan(a: &Args) -> Result<Plan> {
    let smoke = a.smoke;
    let pick =
        |v: Option<f64>, full: f64, small: f64| v.unwrap_or(if smoke { small } else { full });
    let list = |v: &Option<Vec<usize>>, full: &[usize], small: &[usize]| {
        v.clone()
            .unwrap_or_else(|| if smoke { small.to_vec() } else { full.to_vec() })
    };
    let workloads = match &a.workloads {
        None => ALL_WORKLOADS.iter().map(|s| s.to_string()).collect(),
        Some(w) if w.iter().any(|x| x == "all") => {
            ALL_WORKLOADS.iter().map(|s| s.to_string()).collect()
        }
        Some(w) => {
            for x in w {
                if !ALL_WORKLOADS.contains(&x.as_str()) {
                    bail!(
                        "unknown workload {x:?} (known: {})",
                        ALL_WORKLOADS.join(", ")
                    );
                }
            }
            w.clone()
        }
    };
    let secs = |v: f64| Duration::from_secs_f64(v.max(0.0));
    let clients = list(&a.clients, &[1, 16, 64, 256], &[1, 4]);
    if clients.contains(&0) {
        bail!("--clients must be positive");
    }
    // The server accepts 1,024 unacknowledged QoS 1 requests per connection by default.
    if a.pipeline_depths
        .as_ref()
        .is_some_and(|d| d.iter().any(|&d| d == 0 || d > 1024))
    {
        bail!("--pipeline-depths must be from 1 to 1024");
    }
    let value_sizes = a.value_sizes.clone().unwrap_or_else(|| {
        if smoke {
            vec![16, 1024]
        } else {
            vec![16, 1024, 65536]
        }
    });
    if value_sizes.iter().any(|v| *v < 16) {
        bail!("--value-sizes must be at least 16 bytes");
    }
    Ok(Plan {
        settings: Settings {
            duration: secs(pick(a.duration, 2.0, 0.3)),
            warmup: secs(pick(a.warmup, 0.5, 0.1)),
            rate_duration: secs(pick(a.rate_duration, 10.0, 1.0)),
            rate: a.rate.max(1),
            pubsub_payload: a.pubsub_payload.max(20),
            idle_connections: a
                .idle_connections
                .unwrap_or(if smoke { 200 } else { 10_000 }),
            stored_keys: a.keys.unwrap_or(if smoke { 5_000 } else { 1_000_000 }),
            keys_per_client: 16,
        },
        clients,
        value_sizes,
        disk_clients: list(&a.disk_clients, &[1, 16, 64, 256], &[1, 4]),
        pipeline_depths: list(&a.pipeline_depths, &[16, 256], &[4]),
        storm_clients: list(&a.storm_clients, &[1, 16, 64], &[1, 4]),
        workloads,
    })
}

/// One configuration to measure.
#[derive(Debug, Clone)]
enum Job {
    Kv(KvMode, usize, usize),
    /// SET pipelined on one connection: depth, value size.
    Pipe(usize, usize),
    /// Notification fan-out to this many observers, watching one key, or (true) many keys
    /// through one pattern.
    Notify(usize, bool),
    /// Fan-in (true) or fan-out, QoS, clients, over the connection kind given.
    PubSub(bool, QoS, usize, Wire),
    Rate,
    Storm(usize),
    MemConns,
    MemKeys,
}

fn jobs(p: &Plan, bins: &Binaries) -> Vec<(Target, Job)> {
    let mut out = Vec::new();
    let has = |t: Target| bins.available(t);
    for w in &p.workloads {
        match w.as_str() {
            "set" | "get" | "mix" => {
                let mode = match w.as_str() {
                    "set" => KvMode::Set,
                    "get" => KvMode::Get,
                    _ => KvMode::Mix,
                };
                for &size in &p.value_sizes {
                    for &c in &p.clients {
                        out.push((Target::Mqkv, Job::Kv(mode, c, size)));
                        if mode == KvMode::Set && p.disk_clients.contains(&c) {
                            out.push((Target::MqkvDisk, Job::Kv(mode, c, size)));
                        }
                        if has(Target::Redis) {
                            out.push((Target::Redis, Job::Kv(mode, c, size)));
                            if mode == KvMode::Set && p.disk_clients.contains(&c) {
                                out.push((Target::RedisAof, Job::Kv(mode, c, size)));
                            }
                        }
                    }
                    // Durable SET at client counts not in --clients.
                    if mode == KvMode::Set {
                        for &c in p.disk_clients.iter().filter(|c| !p.clients.contains(c)) {
                            out.push((Target::Mqkv, Job::Kv(mode, c, size)));
                            out.push((Target::MqkvDisk, Job::Kv(mode, c, size)));
                            if has(Target::RedisAof) {
                                out.push((Target::RedisAof, Job::Kv(mode, c, size)));
                            }
                        }
                    }
                }
            }
            "pipe" => {
                // 16-byte values: what is measured is the round trip, not the bytes.
                for &depth in &p.pipeline_depths {
                    for t in [
                        Target::Mqkv,
                        Target::MqkvDisk,
                        Target::Redis,
                        Target::RedisAof,
                    ] {
                        if has(t) {
                            out.push((t, Job::Pipe(depth, 16)));
                        }
                    }
                }
            }
            "notify" => {
                for &c in &p.clients {
                    for pattern in [false, true] {
                        out.push((Target::Mqkv, Job::Notify(c, pattern)));
                    }
                }
            }
            "fanin" | "fanout" => {
                for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
                    for &c in &p.clients {
                        for t in [Target::Mqkv, Target::Mosquitto] {
                            if has(t) {
                                out.push((t, Job::PubSub(w == "fanin", qos, c, Wire::Tcp)));
                            }
                        }
                    }
                }
            }
            "tls" | "ws" => {
                let wire = if w == "tls" { Wire::Tls } else { Wire::Ws };
                for fanin in [true, false] {
                    for &c in &p.clients {
                        for t in [Target::Mqkv, Target::Mosquitto] {
                            if has(t) {
                                out.push((t, Job::PubSub(fanin, QoS::AtLeastOnce, c, wire)));
                            }
                        }
                    }
                }
            }
            "policy" => {
                // Without and with a policy, side by side: pub/sub QoS 1 fan-in and SET.
                for &c in &p.clients {
                    for t in [Target::Mqkv, Target::MqkvPolicy] {
                        out.push((t, Job::PubSub(true, QoS::AtLeastOnce, c, Wire::Tcp)));
                    }
                    for t in [Target::Mqkv, Target::MqkvPolicy] {
                        out.push((t, Job::Kv(KvMode::Set, c, 16)));
                    }
                }
            }
            "rate" => {
                for t in [Target::Mqkv, Target::Mosquitto] {
                    if has(t) {
                        out.push((t, Job::Rate));
                    }
                }
            }
            "storm" => {
                for &c in &p.storm_clients {
                    for t in [Target::Mqkv, Target::Mosquitto] {
                        if has(t) {
                            out.push((t, Job::Storm(c)));
                        }
                    }
                }
            }
            "mem-conns" => {
                for t in [Target::Mqkv, Target::Mosquitto] {
                    if has(t) {
                        out.push((t, Job::MemConns));
                    }
                }
            }
            "mem-keys" => {
                for t in [Target::Mqkv, Target::MqkvDisk, Target::Redis] {
                    if has(t) {
                        out.push((t, Job::MemKeys));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn workload_name(job: &Job) -> &'static str {
    match job {
        Job::Kv(m, ..) => m.name(),
        Job::Pipe(..) => "set-pipelined",
        Job::Notify(_, false) => "notify",
        Job::Notify(_, true) => "notify-pattern",
        Job::PubSub(true, .., Wire::Tcp) => "pubsub-fanin",
        Job::PubSub(false, .., Wire::Tcp) => "pubsub-fanout",
        Job::PubSub(true, .., Wire::Tls) => "pubsub-fanin-tls",
        Job::PubSub(false, .., Wire::Tls) => "pubsub-fanout-tls",
        Job::PubSub(true, .., Wire::Ws) => "pubsub-fanin-ws",
        Job::PubSub(false, .., Wire::Ws) => "pubsub-fanout-ws",
        Job::Rate => "pubsub-rate",
        Job::Storm(_) => "conn-storm",
        Job::MemConns => "mem-idle-conns",
        Job::MemKeys => "mem-keys",
    }
}

fn job_clients(job: &Job, s: &Settings) -> usize {
    match job {
        Job::Kv(_, c, _)
        | Job::Pipe(c, _)
        | Job::Notify(c, _)
        | Job::PubSub(_, _, c, _)
        | Job::Storm(c) => *c,
        Job::Rate => 1,
        Job::MemConns => s.idle_connections,
        Job::MemKeys => 64,
    }
}

/// Consecutive entries of `todo` that measure the same configuration on different targets.
fn same_job_groups(todo: &[(Target, Job)]) -> Vec<Vec<&(Target, Job)>> {
    let mut groups: Vec<Vec<&(Target, Job)>> = Vec::new();
    for entry in todo {
        let key = format!("{:?}", entry.1);
        match groups.last_mut() {
            Some(group) if format!("{:?}", group[0].1) == key => group.push(entry),
            _ => groups.push(vec![entry]),
        }
    }
    groups
}

fn run_job(
    rt: &tokio::runtime::Runtime,
    target: Target,
    job: &Job,
    bins: &Binaries,
    scratch: &Path,
    s: &Settings,
) -> RunResult {
    let wire = match job {
        Job::PubSub(.., wire) => *wire,
        _ => Wire::Tcp,
    };
    let server = match Server::start_over(target, wire, bins.certs.as_ref(), bins, scratch) {
        Ok(server) => server,
        Err(e) => {
            let mut r = RunResult::new(workload_name(job), target, job_clients(job, s));
            r.failed = Some(format!("server start: {e:#}"));
            return r;
        }
    };
    let result = rt.block_on(async {
        match job {
            Job::Kv(mode, c, size) => workloads::kv(*mode, &server, *c, *size, s).await,
            Job::Pipe(depth, size) => workloads::pipelined(&server, *depth, *size, s).await,
            Job::Notify(c, pattern) => workloads::notify(&server, *c, *pattern, s).await,
            Job::PubSub(fanin, qos, c, _) => workloads::pubsub(*fanin, *qos, &server, *c, s).await,
            Job::Rate => workloads::rate(&server, s).await,
            Job::Storm(c) => workloads::storm(&server, *c, s).await,
            Job::MemConns => workloads::mem_idle(&server, s.idle_connections).await,
            Job::MemKeys => workloads::mem_keys(&server, s.stored_keys).await,
        }
    });
    drop(server);
    result
}

fn progress(i: usize, n: usize, r: &RunResult) -> String {
    let mut line = format!(
        "[{i}/{n}] {} {} c={}",
        r.workload,
        r.target.name(),
        r.clients
    );
    if let Some(v) = r.value_size {
        line.push_str(&format!(" {}", report::fmt_size(v)));
    }
    if let Some(q) = r.qos {
        line.push_str(&format!(" qos{q}"));
    }
    if let Some(f) = &r.failed {
        line.push_str(&format!(": FAILED {f}"));
        return line;
    }
    match r.workload.as_str() {
        "mem-idle-conns" => line.push_str(&format!(
            ": {:.0} B/connection",
            r.extra_f64("bytes_per_connection").unwrap_or(f64::NAN)
        )),
        "mem-keys" => line.push_str(&format!(
            ": {:.0} B/key overhead",
            r.extra_f64("overhead_bytes_per_key").unwrap_or(f64::NAN)
        )),
        _ => {
            line.push_str(&format!(": {:.0} {}", r.throughput, r.unit));
            if let Some(l) = &r.latency_us {
                line.push_str(&format!(" p50 {:.0}µs p99 {:.0}µs", l.p50, l.p99));
            }
        }
    }
    if r.errors > 0 {
        line.push_str(&format!(" ({} errors)", r.errors));
    }
    line
}

/// An interleaved run's shape: `--slices` of `--slice-ms`, after a warm-up of each server four
/// times `--warmup` (2 s by default).
fn interleave_plan(
    args: &Args,
    plan: &Plan,
    clients: usize,
    value_size: usize,
) -> interleave::Plan {
    let (slices, slice_ms) = if args.smoke { (8, 100) } else { (80, 500) };
    interleave::Plan {
        clients,
        value_size,
        keys_per_client: plan.settings.keys_per_client,
        warmup: plan.settings.warmup * 4,
        slice: Duration::from_millis(args.slice_ms.unwrap_or(slice_ms)),
        slices: args.slices.unwrap_or(slices) as usize,
    }
}

/// The `set` workload's durable SET against Redis `appendfsync always`, interleaved, at 64
/// clients (or the largest durable client count below) with the smallest value size; none
/// without Redis or without durable SET in the plan.
fn interleaved_against_redis(
    rt: &tokio::runtime::Runtime,
    args: &Args,
    plan: &Plan,
    bins: &Binaries,
    scratch: &Path,
) -> Vec<RunResult> {
    let clients = plan.disk_clients.iter().copied().filter(|&c| c <= 64).max();
    let value_size = plan.value_sizes.iter().copied().min();
    let (Some(clients), Some(value_size)) = (clients, value_size) else {
        return Vec::new();
    };
    if !plan.workloads.iter().any(|w| w == "set")
        || !plan.clients.contains(&clients)
        || !bins.available(Target::RedisAof)
    {
        return Vec::new();
    }
    let ip = interleave_plan(args, plan, clients, value_size);
    let targets = [Target::MqkvDisk, Target::RedisAof];
    let outcome = run_pair(rt, [(targets[0], bins), (targets[1], bins)], scratch, &ip);
    let results = match outcome {
        Ok(slices) => interleave::results(&slices, targets, clients, value_size),
        Err(e) => targets
            .iter()
            .map(|&t| {
                let mut r = RunResult::new(interleave::WORKLOAD, t, clients);
                r.value_size = Some(value_size);
                r.failed = Some(format!("{e:#}"));
                r
            })
            .collect(),
    };
    for (i, r) in results.iter().enumerate() {
        eprintln!("{}", progress(i + 1, results.len(), r));
    }
    results
}

/// Starts both servers and runs the interleaved comparison of `ip` on them; both are stopped
/// when it ends.
fn run_pair(
    rt: &tokio::runtime::Runtime,
    sides: [(Target, &Binaries); 2],
    scratch: &Path,
    ip: &interleave::Plan,
) -> Result<Vec<interleave::Slice>> {
    let a = Server::start(sides[0].0, sides[0].1, scratch).context("starting A")?;
    let b = Server::start(sides[1].0, sides[1].1, scratch).context("starting B")?;
    rt.block_on(interleave::run([&a, &b], ip))
}

/// The `--interleave` run: durable SET on the mqkv server (A) against `other` (B).
fn run_interleaved(
    rt: &tokio::runtime::Runtime,
    scratch: &Path,
    args: &Args,
    plan: &Plan,
    bins: &Binaries,
    other: &str,
) -> Result<()> {
    let (b_target, b_bins, b_name) = if other == "redis-aof" {
        if bins.redis.is_none() {
            bail!("--interleave redis-aof needs Redis (not with --no-anchors)");
        }
        (Target::RedisAof, None, "redis-aof".to_owned())
    } else {
        let path = PathBuf::from(other);
        if !path.is_file() {
            bail!("--interleave: {} is not a file", path.display());
        }
        let b = Binaries {
            mqkv: path.clone(),
            mqkv_args: bins.mqkv_args.clone(),
            mosquitto: None,
            redis: None,
            certs: None,
        };
        (Target::MqkvDisk, Some(b), path.display().to_string())
    };
    let clients = plan.disk_clients.first().copied().unwrap_or(64);
    let value_size = plan.value_sizes.first().copied().unwrap_or(16);
    let ip = interleave_plan(args, plan, clients, value_size);
    eprintln!(
        "mqkv-bench: durable SET, {clients} clients, {} B values, {} slices of {} ms: A {} against B {b_name}",
        value_size,
        ip.slices,
        ip.slice.as_millis(),
        bins.mqkv.display()
    );
    let b_bins = b_bins.as_ref().unwrap_or(bins);
    let sides = [(Target::MqkvDisk, bins), (b_target, b_bins)];
    let slices = run_pair(rt, sides, scratch, &ip)?;
    let summary = interleave::summarize(&slices);
    for (name, s) in [("A", &summary.sides[0]), ("B", &summary.sides[1])] {
        println!(
            "{name}: {:>9.0} SET/s, server CPU {:>6.2} µs per SET",
            s.ops_per_s, s.server_cpu_us_per_op
        );
    }
    let ratios: Vec<String> = summary
        .pair_ratios
        .iter()
        .map(|r| format!("{r:.2}"))
        .collect();
    println!(
        "A / B: {:.3} (means), median of {} pairs {:.3}, A ahead in {}; pairs: {}",
        if summary.sides[1].ops_per_s > 0.0 {
            summary.sides[0].ops_per_s / summary.sides[1].ops_per_s
        } else {
            0.0
        },
        summary.pair_ratios.len(),
        summary.median_pair_ratio,
        summary.pairs_a_ahead,
        ratios.join(" ")
    );
    let doc = json!({
        "a": bins.mqkv.display().to_string(),
        "b": b_name,
        "clients": clients,
        "value_size": value_size,
        "slice_ms": ip.slice.as_millis() as u64,
        "summary": summary,
        "slices": slices,
    });
    let path = args.out.join("interleave.json");
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    let mem_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu_model": cpu,
        "mem_total_bytes": mem_kib.map(|k| k * 1024),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
    })
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("mqkv-bench: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if args.slices.is_some_and(|n| !n.is_multiple_of(4)) {
        bail!("--slices must be a multiple of 4 (slices go A B B A)");
    }
    let plan = plan(&args)?;
    if args.cluster {
        let mqkv = servers::find_mqkv(args.server_bin.as_deref())?;
        return cluster::run(&cluster::Plan {
            clients: args.clients.clone().unwrap_or_else(|| {
                if args.smoke {
                    vec![4]
                } else {
                    vec![16, 64, 256]
                }
            }),
            value_size: args.cluster_value,
            repeat: args.repeat,
            settings: plan.settings,
            mqkv,
            mqkv_args: args.server_args.clone(),
            cluster_args: args.cluster_args.clone(),
            out: args.out.clone(),
            install: !args.no_install,
        });
    }
    let started = Instant::now();
    let load_before = read_trimmed("/proc/loadavg");
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mqkv = servers::find_mqkv(args.server_bin.as_deref())?;
    if !mqkv.is_file() {
        bail!("mqkv server binary {} does not exist", mqkv.display());
    }
    let (mosquitto, redis, notes) = if args.no_anchors {
        (
            None,
            None,
            vec!["--no-anchors: Mosquitto and Redis not run".to_owned()],
        )
    } else {
        servers::ensure_anchors(!args.no_install, &args.out.join("apt.log"))
    };
    for n in &notes {
        eprintln!("note: {n}");
    }
    let scratch = std::env::temp_dir().join(format!("mqkv-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let bins = Binaries {
        mqkv,
        mqkv_args: args.server_args.clone(),
        mosquitto,
        redis,
        certs: Some(Certs::make(&scratch.join("certs")).context("making test certificates")?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(other) = &args.interleave {
        let done = run_interleaved(&rt, &scratch, &args, &plan, &bins, other);
        rt.shutdown_timeout(Duration::from_secs(2));
        let _ = std::fs::remove_dir_all(&scratch);
        return done;
    }
    let versions = json!({
        "mqkv": servers::version_of(&bins.mqkv, "--version"),
        "mosquitto": bins.mosquitto.as_ref().and_then(|b| servers::version_of(b, "-h")),
        "redis": bins.redis.as_ref().and_then(|b| servers::version_of(b, "--version")),
    });
    let todo = jobs(&plan, &bins);
    eprintln!(
        "mqkv-bench: {} configurations, {:.1} s each (+{:.1} s warm-up); server {}",
        todo.len(),
        plan.settings.duration.as_secs_f64(),
        plan.settings.warmup.as_secs_f64(),
        bins.mqkv.display()
    );
    let mut results = Vec::with_capacity(todo.len());
    let mut done = 0;
    for group in same_job_groups(&todo) {
        let rounds = if matches!(group[0].1, Job::MemConns | Job::MemKeys) {
            1
        } else {
            args.repeat as usize
        };
        let mut runs: Vec<Vec<RunResult>> = group.iter().map(|_| Vec::new()).collect();
        for round in 0..rounds {
            // Alternate who goes first, so neither side always runs on a warmer or a quieter
            // machine.
            let order: Vec<usize> = if round % 2 == 0 {
                (0..group.len()).collect()
            } else {
                (0..group.len()).rev().collect()
            };
            for at in order {
                let (target, job) = group[at];
                let r = run_job(&rt, *target, job, &bins, &scratch, &plan.settings);
                let mut line = progress(done + at + 1, todo.len(), &r);
                if rounds > 1 {
                    line.push_str(&format!(" (run {}/{rounds})", round + 1));
                }
                eprintln!("{line}");
                runs[at].push(r);
            }
        }
        done += group.len();
        results.extend(runs.into_iter().filter_map(report::median_run));
    }
    results.extend(interleaved_against_redis(
        &rt, &args, &plan, &bins, &scratch,
    ));
    rt.shutdown_timeout(Duration::from_secs(2));
    let _ = std::fs::remove_dir_all(&scratch);

    let ratios = report::ratios(&results);
    let checks = report::target_checks(&results);
    let load_after = read_trimmed("/proc/loadavg");
    let s = &plan.settings;
    let doc = json!({
        "meta": {
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "smoke": args.smoke,
            "started_unix": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
                .saturating_sub(started.elapsed().as_secs()),
            "wall_seconds": started.elapsed().as_secs_f64(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "machine": machine(),
            "versions": versions,
            "anchor_notes": notes,
            "mosquitto_config": servers::mosquitto_config(0).replace("listener 0 ", "listener PORT "),
            "redis_options": {
                "redis": servers::redis_options(Target::Redis).join(" "),
                "redis-aof": servers::redis_options(Target::RedisAof).join(" "),
            },
            "mqkv_server_args": bins.mqkv_args,
            "settings": {
                "repeat": args.repeat,
                "duration_s": s.duration.as_secs_f64(),
                "warmup_s": s.warmup.as_secs_f64(),
                "clients": plan.clients,
                "value_sizes": plan.value_sizes,
                "disk_clients": plan.disk_clients,
                "pipeline_depths": plan.pipeline_depths,
                "storm_clients": plan.storm_clients,
                "workloads": plan.workloads,
                "rate": s.rate,
                "rate_duration_s": s.rate_duration.as_secs_f64(),
                "pubsub_payload": s.pubsub_payload,
                "idle_connections": s.idle_connections,
                "stored_keys": s.stored_keys,
                "keys_per_client": s.keys_per_client,
            },
        },
        "results": results,
        "ratios": ratios,
        "targets": checks,
    });
    let json_path = args.out.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", json_path.display()))?;

    let table = report::table(&results, &ratios);
    let targets = report::targets_table(&checks);
    let mut md = String::new();
    md.push_str(&format!(
        "Command: `{}`\n\nLoad average before: {}; after: {}\n\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        load_before.as_deref().unwrap_or("?"),
        load_after.as_deref().unwrap_or("?")
    ));
    if args.repeat > 1 {
        md.push_str(&format!(
            "Each row but the memory rows is the median of {} runs, mqkv and its anchor taking \
             turns to go first; results.json has every run.\n\n",
            args.repeat
        ));
    }
    md.push_str(&table);
    md.push('\n');
    md.push_str(&targets);
    for n in &notes {
        md.push_str(&format!("\nNote: {n}\n"));
    }
    std::fs::write(args.out.join("results.md"), &md)?;
    let png = args.out.join("throughput.png");
    if let Err(e) = chart::throughput_chart(&results, &png) {
        eprintln!("chart: {e:#}");
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{table}")?;
    writeln!(out, "{targets}")?;
    writeln!(
        out,
        "wrote {}, {} and {} ({:.0} s)",
        json_path.display(),
        args.out.join("results.md").display(),
        png.display(),
        started.elapsed().as_secs_f64()
    )?;
    Ok(())
}

#[cfg(test)]
#[path = "main_tests.rs"]
mod tests;
