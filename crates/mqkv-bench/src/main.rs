//! `mqkv-bench`: load from a separate process over loopback against mqkv, side by side with
//! Mosquitto (pub/sub) and Redis (SET/GET), with throughput, latency percentiles, a JSON record,
//! a Markdown table and a PNG chart of throughput versus concurrency.

mod args;
mod chart;
mod cluster;
mod etcd;
mod interleave;
mod jobs;
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
use serde_json::json;

use args::{plan, Args, Plan};
use jobs::{jobs, progress, run_job, same_job_groups, Job};
use report::RunResult;
use servers::{Binaries, Server, Target};
use wire::Certs;

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
            tls: args.cluster_tls,
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
