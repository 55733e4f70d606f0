//! Two servers measured on durable SET in alternating slices of one run: both run throughout,
//! each with its own clients, and the load moves from one to the other every slice. A slow
//! stretch of the machine (they last from one to ten seconds here) then falls on both alike,
//! where runs one after the other let it decide a comparison of a few per cent.
//!
//! Slices go A B B A, A B B A, ..., so a steady drift of the machine cancels out of each group
//! of four. An operation counts in the slice it started and ended in; one still under way when
//! the load moves is not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::servers::Server;
use crate::workloads::{join_clients, kv_workers, KvMode, Worker};

/// One slice: which side had the load, what it completed, and its server's CPU meanwhile.
#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    pub side: usize,
    pub ops: u64,
    pub seconds: f64,
    pub server_cpu_seconds: f64,
}

impl Slice {
    /// SETs a second in this slice.
    fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Which side has the load, and in which slice (`None` while warming up).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Phase {
    slice: Option<usize>,
    side: usize,
    running: bool,
}

/// The side that has slice `i`: A B B A, repeated.
pub fn side_of(i: usize) -> usize {
    usize::from(matches!(i % 4, 1 | 2))
}

/// What the interleaved run asks for.
pub struct Plan {
    pub clients: usize,
    pub value_size: usize,
    pub keys_per_client: u64,
    pub warmup: Duration,
    pub slice: Duration,
    pub slices: usize,
}

/// Runs durable SET against both servers in alternating slices.
pub async fn run(servers: [&Server; 2], plan: &Plan) -> Result<Vec<Slice>> {
    let (tx, rx) = watch::channel(Phase {
        slice: None,
        side: 0,
        running: true,
    });
    let counts: Arc<Vec<AtomicU64>> =
        Arc::new((0..plan.slices).map(|_| AtomicU64::new(0)).collect());
    let mut set = JoinSet::new();
    for (side, server) in servers.iter().enumerate() {
        let workers = kv_workers(
            KvMode::Set,
            server,
            plan.clients,
            plan.value_size,
            plan.keys_per_client,
        )
        .await
        .with_context(|| format!("connecting the clients of {}", server.target.name()))?;
        for w in workers {
            set.spawn(client(w, side, rx.clone(), counts.clone()));
        }
    }
    for side in [0, 1] {
        tx.send_replace(Phase {
            slice: None,
            side,
            running: true,
        });
        tokio::time::sleep(plan.warmup).await;
    }
    let mut slices = Vec::with_capacity(plan.slices);
    for i in 0..plan.slices {
        let side = side_of(i);
        let cpu0 = servers[side].cpu_seconds();
        let t0 = Instant::now();
        tx.send_replace(Phase {
            slice: Some(i),
            side,
            running: true,
        });
        tokio::time::sleep(plan.slice).await;
        slices.push(Slice {
            side,
            ops: 0,
            seconds: t0.elapsed().as_secs_f64(),
            server_cpu_seconds: servers[side].cpu_seconds() - cpu0,
        });
    }
    tx.send_replace(Phase {
        slice: None,
        side: 0,
        running: false,
    });
    let (joined, timed_out) = join_clients(set, Instant::now()).await;
    let mut failures: Vec<String> = timed_out.into_iter().collect();
    for j in joined {
        match j {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("{e:#}")),
            Err(e) => failures.push(format!("client task: {e}")),
        }
    }
    if let Some(first) = failures.first() {
        bail!("{} clients failed; the first: {first}", failures.len());
    }
    for (slice, count) in slices.iter_mut().zip(counts.iter()) {
        slice.ops = count.load(Ordering::Relaxed);
    }
    Ok(slices)
}

/// One client of side `side`: runs requests while its side has the load, counting those that
/// started and ended in one slice.
async fn client<W: Worker>(
    mut w: W,
    side: usize,
    mut rx: watch::Receiver<Phase>,
    counts: Arc<Vec<AtomicU64>>,
) -> Result<()> {
    let mut seq = 0u64;
    loop {
        let phase = *rx.borrow_and_update();
        if !phase.running {
            return Ok(());
        }
        if phase.side != side {
            if rx.changed().await.is_err() {
                return Ok(());
            }
            continue;
        }
        seq += 1;
        let ok = w.op(seq).await?;
        if !ok {
            bail!("an unexpected answer to SET");
        }
        let now = *rx.borrow();
        if let (Some(i), true) = (phase.slice, now.slice == phase.slice) {
            if let Some(count) = counts.get(i) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One side's figures over its slices: totals, and the rates they give.
#[derive(Debug, Clone, Serialize)]
pub struct SideSummary {
    pub ops: u64,
    pub seconds: f64,
    pub server_cpu_seconds: f64,
    pub ops_per_s: f64,
    pub server_cpu_us_per_op: f64,
}

/// The comparison: each side's figures, and A over B in each group of one A and one B slice.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub sides: [SideSummary; 2],
    pub pair_ratios: Vec<f64>,
    pub median_pair_ratio: f64,
    pub pairs_a_ahead: usize,
}

pub fn summarize(slices: &[Slice]) -> Summary {
    let side = |s: usize| {
        let (ops, secs, cpu) = slices
            .iter()
            .filter(|x| x.side == s)
            .fold((0u64, 0.0, 0.0), |(o, t, c), x| {
                (o + x.ops, t + x.seconds, c + x.server_cpu_seconds)
            });
        SideSummary {
            ops,
            seconds: secs,
            server_cpu_seconds: cpu,
            ops_per_s: if secs > 0.0 { ops as f64 / secs } else { 0.0 },
            server_cpu_us_per_op: if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 },
        }
    };
    let pair_ratios: Vec<f64> = slices
        .chunks_exact(2)
        .filter_map(|pair| {
            let a = pair.iter().find(|x| x.side == 0)?;
            let b = pair.iter().find(|x| x.side == 1)?;
            let rb = b.rate();
            (rb > 0.0).then(|| a.rate() / rb)
        })
        .collect();
    let mut sorted = pair_ratios.clone();
    sorted.sort_by(f64::total_cmp);
    let median_pair_ratio = match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    Summary {
        sides: [side(0), side(1)],
        pairs_a_ahead: pair_ratios.iter().filter(|&&r| r > 1.0).count(),
        pair_ratios,
        median_pair_ratio,
    }
}

/// The workload name of an interleaved run in the results.
pub const WORKLOAD: &str = "set-interleaved";

/// An interleaved run as two results, A's and B's: throughput over each side's slices, the
/// server's CPU over them, every slice's rate in `extra.runs_throughput` (in the order each side
/// ran them, so A's k-th and B's k-th are the k-th pair), and the pairs' ratios.
pub fn results(
    slices: &[Slice],
    targets: [crate::servers::Target; 2],
    clients: usize,
    value_size: usize,
) -> Vec<crate::report::RunResult> {
    let summary = summarize(slices);
    (0..2)
        .map(|side| {
            let mine: Vec<&Slice> = slices.iter().filter(|s| s.side == side).collect();
            let totals = &summary.sides[side];
            let mut r = crate::report::RunResult::new(WORKLOAD, targets[side], clients);
            r.value_size = Some(value_size);
            r.ops = totals.ops;
            r.duration_s = totals.seconds;
            r.throughput = totals.ops_per_s;
            r.server_cpu = if totals.seconds > 0.0 {
                totals.server_cpu_seconds / totals.seconds
            } else {
                0.0
            };
            let rates: Vec<f64> = mine.iter().map(|s| s.rate()).collect();
            r.extra
                .insert("runs_throughput".into(), serde_json::json!(rates));
            r.extra
                .insert("pair_ratios".into(), serde_json::json!(summary.pair_ratios));
            r.extra.insert(
                "median_pair_ratio".into(),
                serde_json::json!(summary.median_pair_ratio),
            );
            r.extra.insert(
                "pairs_a_ahead".into(),
                serde_json::json!(summary.pairs_a_ahead),
            );
            r.extra.insert(
                "slice_s".into(),
                serde_json::json!(mine.first().map_or(0.0, |s| s.seconds)),
            );
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(side: usize, ops: u64) -> Slice {
        Slice {
            side,
            ops,
            seconds: 0.5,
            server_cpu_seconds: 0.5,
        }
    }

    #[test]
    fn slices_alternate_a_b_b_a() {
        let sides: Vec<usize> = (0..8).map(side_of).collect();
        assert_eq!(sides, [0, 1, 1, 0, 0, 1, 1, 0]);
    }

    /// Slices in the order they run, each with the SETs given.
    fn run_of(ops: &[u64]) -> Vec<Slice> {
        ops.iter()
            .enumerate()
            .map(|(i, &n)| slice(side_of(i), n))
            .collect()
    }

    #[test]
    fn pairs_compare_a_with_b_whichever_went_first() {
        let slices = run_of(&[100, 50, 40, 60, 30, 60]);
        let s = summarize(&slices);
        assert_eq!(s.pair_ratios, [2.0, 1.5, 0.5]);
        assert_eq!(s.median_pair_ratio, 1.5);
        assert_eq!(s.pairs_a_ahead, 2);
        assert_eq!(s.sides[0].ops_per_s, 190.0 / 1.5);
        assert_eq!(s.sides[1].ops_per_s, 150.0 / 1.5);
        assert_eq!(s.sides[1].server_cpu_us_per_op, 1.5 * 1e6 / 150.0);
    }

    #[test]
    fn results_hold_each_sides_slices_in_the_order_they_ran() {
        use crate::servers::Target;
        let slices = run_of(&[100, 50, 40, 60]);
        let rs = results(&slices, [Target::MqkvDisk, Target::RedisAof], 64, 16);
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].target, Target::MqkvDisk);
        assert_eq!(rs[1].target, Target::RedisAof);
        assert_eq!(rs[0].workload, WORKLOAD);
        assert_eq!((rs[0].ops, rs[1].ops), (160, 90));
        assert_eq!(rs[0].throughput, 160.0);
        assert_eq!(rs[1].duration_s, 1.0);
        assert_eq!(rs[0].server_cpu, 1.0);
        assert_eq!(
            rs[0].extra["runs_throughput"],
            serde_json::json!([200.0, 120.0])
        );
        assert_eq!(
            rs[1].extra["runs_throughput"],
            serde_json::json!([100.0, 80.0])
        );
        assert_eq!(rs[1].extra["pair_ratios"], serde_json::json!([2.0, 1.5]));
        assert_eq!(rs[0].value_size, Some(16));
    }

    #[test]
    fn an_empty_side_has_no_ratio() {
        let s = summarize(&[slice(0, 10), slice(1, 0)]);
        assert!(s.pair_ratios.is_empty());
        assert_eq!(s.median_pair_ratio, 0.0);
        assert_eq!(s.sides[1].server_cpu_us_per_op, 0.0);
    }
}
