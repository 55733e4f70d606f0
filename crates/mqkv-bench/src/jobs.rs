//! The jobs of a plan, one per workload, configuration and server, and how each is run.

use std::path::Path;

use mqkv_broker::codec::QoS;

use crate::args::Plan;
use crate::report::RunResult;
use crate::servers::{Binaries, Server, Target};
use crate::wire::Wire;
use crate::workloads::{KvMode, Settings};

/// One configuration to measure.
#[derive(Debug, Clone)]
pub(crate) enum Job {
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
    /// A connection storm over TLS: clients, and whether every handshake is a full one.
    StormTls(usize, bool),
    MemConns,
    MemKeys,
}

pub(crate) fn jobs(p: &Plan, bins: &Binaries) -> Vec<(Target, Job)> {
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
            "storm-tls" => {
                for full in [false, true] {
                    for &c in &p.storm_clients {
                        for t in [Target::Mqkv, Target::Mosquitto] {
                            if has(t) {
                                out.push((t, Job::StormTls(c, full)));
                            }
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
        Job::StormTls(_, false) => "conn-storm-tls",
        Job::StormTls(_, true) => "conn-storm-tls-full",
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
        | Job::Storm(c)
        | Job::StormTls(c, _) => *c,
        Job::Rate => 1,
        Job::MemConns => s.idle_connections,
        Job::MemKeys => 64,
    }
}

/// Consecutive entries of `todo` that measure the same configuration on different targets.
pub(crate) fn same_job_groups(todo: &[(Target, Job)]) -> Vec<Vec<&(Target, Job)>> {
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

pub(crate) fn run_job(
    rt: &tokio::runtime::Runtime,
    target: Target,
    job: &Job,
    bins: &Binaries,
    scratch: &Path,
    s: &Settings,
) -> RunResult {
    let wire = match job {
        Job::PubSub(.., wire) => *wire,
        Job::StormTls(..) => Wire::Tls,
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
            Job::Kv(mode, c, size) => crate::workloads::kv(*mode, &server, *c, *size, s).await,
            Job::Pipe(depth, size) => crate::workloads::pipelined(&server, *depth, *size, s).await,
            Job::Notify(c, pattern) => crate::workloads::notify(&server, *c, *pattern, s).await,
            Job::PubSub(fanin, qos, c, _) => {
                crate::workloads::pubsub(*fanin, *qos, &server, *c, s).await
            }
            Job::Rate => crate::workloads::rate(&server, s).await,
            Job::Storm(c) => crate::workloads::storm(&server, *c, s).await,
            Job::StormTls(c, full) => crate::workloads::storm_tls(&server, *c, *full, s).await,
            Job::MemConns => crate::workloads::mem_idle(&server, s.idle_connections).await,
            Job::MemKeys => crate::workloads::mem_keys(&server, s.stored_keys).await,
        }
    });
    drop(server);
    result
}

pub(crate) fn progress(i: usize, n: usize, r: &RunResult) -> String {
    let mut line = format!(
        "[{i}/{n}] {} {} c={}",
        r.workload,
        r.target.name(),
        r.clients
    );
    if let Some(v) = r.value_size {
        line.push_str(&format!(" {}", crate::report::fmt_size(v)));
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
