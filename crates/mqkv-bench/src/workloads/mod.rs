//! The workloads. Every closed-loop workload runs one task per simulated client, each with
//! exactly one operation in flight; a warm-up period comes before the measured window, and an
//! operation counts when it started inside the window.

mod kv;
mod memory;
mod notify;
mod pubsub;
mod storm;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub(crate) use kv::kv_workers;
pub use kv::{kv, pipelined, KvMode};
pub use memory::{mem_idle, mem_keys};
pub use notify::notify;
pub use pubsub::{pubsub, rate};
pub use storm::{storm, storm_tls};

use crate::mqtt::within;
use crate::report::{new_histogram, Latency, RunResult};
use crate::servers::{self_cpu_seconds, Server};

/// Settings shared by every workload.
#[derive(Debug, Clone)]
pub struct Settings {
    pub duration: Duration,
    pub warmup: Duration,
    pub rate_duration: Duration,
    pub rate: u64,
    pub pubsub_payload: usize,
    pub idle_connections: usize,
    pub stored_keys: u64,
    pub keys_per_client: u64,
}

const OP_TIMEOUT: Duration = Duration::from_secs(10);
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(2);
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// One simulated client of a closed-loop workload.
pub trait Worker: Send + 'static {
    /// Runs one operation. `Ok(false)` is an unexpected answer or a lost message; `Err` ends
    /// this client.
    fn op(&mut self, seq: u64) -> impl Future<Output = Result<bool>> + Send;
}

/// What a closed-loop run measured.
pub struct Outcome {
    pub ops: u64,
    pub errors: u64,
    pub hist: Histogram<u64>,
    pub window: Duration,
    pub server_cpu: f64,
    pub bench_cpu: f64,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn fill(&self, r: &mut RunResult, per_op: f64) {
        r.duration_s = self.window.as_secs_f64();
        r.ops = self.ops;
        r.throughput = self.ops as f64 * per_op / self.window.as_secs_f64();
        r.latency_us = Latency::from_ns(&self.hist);
        r.errors = self.errors;
        r.server_cpu = self.server_cpu;
        r.bench_cpu = self.bench_cpu;
        if let Some(first) = self.failures.first() {
            r.failed = Some(format!(
                "{} of the clients failed; first: {first}",
                self.failures.len()
            ));
        }
    }
}

/// Runs every worker in its own task for warm-up plus the window.
pub async fn drive<W: Worker>(workers: Vec<W>, s: &Settings, server: &Server) -> Outcome {
    drive_measuring(workers, s, || server.cpu_seconds()).await
}

/// [`drive`], with the server CPU time so far given by `server_cpu` (seconds).
pub async fn drive_measuring<W: Worker>(
    workers: Vec<W>,
    s: &Settings,
    server_cpu: impl Fn() -> f64,
) -> Outcome {
    let (tx, rx) = watch::channel::<Option<(Instant, Instant)>>(None);
    let mut set = JoinSet::new();
    for mut w in workers {
        let mut rx = rx.clone();
        set.spawn(async move {
            let mut hist = new_histogram();
            let mut ops = 0u64;
            let mut errors = 0u64;
            let window = match rx.wait_for(|w| w.is_some()).await {
                Ok(w) => *w,
                Err(_) => None,
            };
            let Some((start, end)) = window else {
                return (hist, ops, errors, Some("no window".to_owned()));
            };
            let mut seq = 0u64;
            let mut t0 = Instant::now();
            while t0 < end {
                seq += 1;
                let r = w.op(seq).await;
                let t1 = Instant::now();
                match r {
                    Ok(true) if t0 >= start => {
                        hist.saturating_record((t1 - t0).as_nanos() as u64);
                        ops += 1;
                    }
                    Ok(false) if t0 >= start => errors += 1,
                    Ok(_) => {}
                    Err(e) => return (hist, ops, errors, Some(format!("{e:#}"))),
                }
                // The end of one request is the start of the next.
                t0 = t1;
            }
            (hist, ops, errors, None)
        });
    }
    let start = Instant::now() + s.warmup;
    let end = start + s.duration;
    let _ = tx.send(Some((start, end)));
    tokio::time::sleep_until(start.into()).await;
    let (srv0, me0) = (server_cpu(), self_cpu_seconds());
    tokio::time::sleep_until(end.into()).await;
    let (srv1, me1) = (server_cpu(), self_cpu_seconds());
    let mut out = Outcome {
        ops: 0,
        errors: 0,
        hist: new_histogram(),
        window: s.duration,
        server_cpu: (srv1 - srv0) / s.duration.as_secs_f64(),
        bench_cpu: (me1 - me0) / s.duration.as_secs_f64(),
        failures: Vec::new(),
    };
    let (joined, timed_out) = join_clients(set, end).await;
    out.failures.extend(timed_out);
    for joined in joined {
        match joined {
            Ok((hist, ops, errors, failure)) => {
                let _ = out.hist.add(&hist);
                out.ops += ops;
                out.errors += errors;
                if let Some(f) = failure {
                    out.failures.push(f);
                }
            }
            Err(e) => out.failures.push(format!("client task: {e}")),
        }
    }
    out
}

/// Joins every client task of a run whose load ended at `end`. No timer per request or per
/// client: a client still waiting for an answer `OP_TIMEOUT` after that has waited longer than
/// that, and is stopped; the failure returned says how many were.
pub(crate) async fn join_clients<T: 'static>(
    mut set: JoinSet<T>,
    end: Instant,
) -> (Vec<Result<T, tokio::task::JoinError>>, Option<String>) {
    let mut joined = Vec::with_capacity(set.len());
    loop {
        match tokio::time::timeout_at((end + OP_TIMEOUT).into(), set.join_next()).await {
            Ok(Some(j)) => joined.push(j),
            Ok(None) => return (joined, None),
            Err(_) => {
                let failure = format!(
                    "{} of the clients timed out after {OP_TIMEOUT:?} waiting for a response",
                    set.len()
                );
                set.abort_all();
                while set.join_next().await.is_some() {}
                return (joined, Some(failure));
            }
        }
    }
}

/// Connects `n` clients with `make`, at most 64 at a time.
pub(crate) async fn connect_all<T, F, Fut>(n: usize, make: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let mut set = JoinSet::new();
    for i in 0..n {
        if set.len() >= 64 {
            if let Some(j) = set.join_next().await {
                let (idx, v) = j.context("connect task")?;
                out[idx] = Some(within(SETUP_TIMEOUT, "connect", async { v }).await?);
            }
        }
        let fut = make(i);
        set.spawn(async move { (i, fut.await) });
    }
    while let Some(j) = set.join_next().await {
        let (idx, v) = j.context("connect task")?;
        out[idx] = Some(v?);
    }
    out.into_iter()
        .map(|v| v.context("client missing"))
        .collect()
}
