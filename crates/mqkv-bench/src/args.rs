//! The command line, and the plan it resolves to: which workloads, at which sizes and counts.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use crate::workloads::Settings;

const ALL_WORKLOADS: [&str; 15] = [
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
    "storm-tls",
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
                  second); storm-tls (connects per second over TLS, 1,024 devices resuming their own \
                  sessions, and with full handshakes); mem-conns (RSS per idle connection); mem-keys (RSS per stored key)."
)]
pub(crate) struct Args {
    /// Every workload at tiny sizes and durations, to check that the harness works.
    #[arg(long)]
    pub(crate) smoke: bool,
    /// Directory for results.json, results.md and throughput.png.
    #[arg(long, default_value = "bench-results")]
    pub(crate) out: PathBuf,
    /// Measured seconds per configuration [default: 2; smoke 0.3].
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Warm-up seconds before each measured window [default: 0.5; smoke 0.1].
    #[arg(long)]
    pub(crate) warmup: Option<f64>,
    /// Concurrent clients, comma separated [default: 1,16,64,256; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    pub(crate) clients: Option<Vec<usize>>,
    /// State store value sizes, comma separated; accepts 16, 1k, 64KiB [default: 16,1k,64k;
    /// smoke 16,1k].
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub(crate) value_sizes: Option<Vec<usize>>,
    /// Workloads to run, comma separated, or `all`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) workloads: Option<Vec<String>>,
    /// Client counts for durable (`--storage disk`) SET [default: 1,16,64,256; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    pub(crate) disk_clients: Option<Vec<usize>>,
    /// Requests in flight on the one connection of `pipe`, comma separated [default: 16,256;
    /// smoke 4].
    #[arg(long, value_delimiter = ',')]
    pub(crate) pipeline_depths: Option<Vec<usize>>,
    /// Concurrent clients for the connection storm [default: 1,16,64; smoke 1,4].
    #[arg(long, value_delimiter = ',')]
    pub(crate) storm_clients: Option<Vec<usize>>,
    /// Seconds of the fixed-rate QoS 1 latency run [default: 10; smoke 1].
    #[arg(long)]
    pub(crate) rate_duration: Option<f64>,
    /// Messages per second of the fixed-rate run.
    #[arg(long, default_value_t = 1000)]
    pub(crate) rate: u64,
    /// Idle connections for the memory workload [default: 10000; smoke 200].
    #[arg(long)]
    pub(crate) idle_connections: Option<usize>,
    /// Stored keys (100 B values) for the memory workload [default: 1000000; smoke 5000].
    #[arg(long)]
    pub(crate) keys: Option<u64>,
    /// Pub/sub payload bytes (at least 20).
    #[arg(long, default_value_t = 64)]
    pub(crate) pubsub_payload: usize,
    /// The mqkv binary [default: $MQKV_BIN, else `mqkv` beside this program, else PATH].
    #[arg(long)]
    pub(crate) server_bin: Option<PathBuf>,
    /// An extra argument for every `mqkv serve` (repeatable), e.g. `--server-arg=--workers=1`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub(crate) server_args: Vec<String>,
    /// Run mqkv only, without Mosquitto and Redis.
    #[arg(long)]
    pub(crate) no_anchors: bool,
    /// Do not install missing anchors with apt-get.
    #[arg(long)]
    pub(crate) no_install: bool,
    /// Runs each throughput and latency configuration this many times, mqkv and its anchors
    /// taking turns to go first, and reports the median run of each (by throughput; by p99 for
    /// the fixed-rate run). results.json lists every run's figure. The targets are then
    /// judged on the median of mqkv's figure over its anchor's round by round. Memory workloads
    /// run once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=15))]
    pub(crate) repeat: u32,
    /// Instead of the workloads: durable SET on the mqkv server against this one (another
    /// mqkv binary, or `redis-aof`), both running throughout and the load moving between them
    /// every `--slice-ms` (A B B A, ...), at the first of `--disk-clients` and of
    /// `--value-sizes`. Writes interleave.json.
    #[arg(long, value_name = "BIN|redis-aof")]
    pub(crate) interleave: Option<String>,
    /// Milliseconds per slice of an interleaved run (`--interleave`, and the `set` workload's
    /// durable SET against Redis) [default: 500; smoke 100].
    #[arg(long, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub(crate) slice_ms: Option<u64>,
    /// Slices of an interleaved run, half for each server; a multiple of 4 [default: 80;
    /// smoke 8].
    #[arg(long, value_parser = clap::value_parser!(u64).range(4..=4_000))]
    pub(crate) slices: Option<u64>,
    /// Instead of the workloads: three durable mqkv nodes against a three-member etcd cluster
    /// (Debian `etcd-server`), durable writes and linearizable reads at each of `--clients`
    /// [default: 16,64,256; smoke 4], then a single durable node; writes cluster.json and
    /// cluster.md.
    #[arg(long)]
    pub(crate) cluster: bool,
    /// Value bytes of the cluster comparison.
    #[arg(long, default_value = "256", value_parser = parse_size)]
    pub(crate) cluster_value: usize,
    /// An extra argument for the cluster's nodes only (repeatable), e.g.
    /// `--cluster-arg=--pipeline-depth=1`.
    #[arg(long = "cluster-arg", allow_hyphen_values = true)]
    pub(crate) cluster_args: Vec<String>,
    /// With `--cluster`: the links between the nodes over mutual TLS, for both clusters
    /// (mqkv's `--cluster-tls-*`, etcd's `--peer-cert-file` and `--peer-client-cert-auth`),
    /// with a test CA and certificate made for the run.
    #[arg(long, requires = "cluster")]
    pub(crate) cluster_tls: bool,
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
pub(crate) struct Plan {
    pub(crate) settings: Settings,
    pub(crate) clients: Vec<usize>,
    pub(crate) value_sizes: Vec<usize>,
    pub(crate) disk_clients: Vec<usize>,
    pub(crate) pipeline_depths: Vec<usize>,
    pub(crate) storm_clients: Vec<usize>,
    pub(crate) workloads: Vec<String>,
}

pub(crate) fn plan(a: &Args) -> Result<Plan> {
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
