//! Results: one record per (workload, target, parameters), ratios against the anchors, the
//! issue's targets, and the human table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::servers::Target;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: u64,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    /// From a histogram of nanoseconds.
    pub fn from_ns(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let us = |v: u64| v as f64 / 1000.0;
        Some(Latency {
            samples: h.len(),
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        })
    }
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 µs to 100 s, three significant digits; values are nanoseconds.
    Histogram::new_with_bounds(1_000, 100_000_000_000, 3).expect("constant histogram bounds")
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub workload: String,
    pub target: Target,
    /// Concurrent clients: publishers for fan-in, subscribers for fan-out, observers for
    /// notification fan-out, connections for the memory workloads.
    pub clients: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    pub duration_s: f64,
    pub ops: u64,
    /// Operations per second, in `unit`.
    pub throughput: f64,
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<Latency>,
    /// Workload-specific numbers (memory figures, second histograms, deliveries).
    pub extra: BTreeMap<String, serde_json::Value>,
    /// Operations that completed with an unexpected answer, or were lost.
    pub errors: u64,
    /// CPU used during the measurement window, as a fraction of one core.
    pub server_cpu: f64,
    pub bench_cpu: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// The median of repeated runs of one configuration on one target: by throughput, or by p99
/// latency for the fixed-rate run, where throughput is fixed (of an even count, the worse of
/// the two middle runs). A failed run is reported as the result if there is one. With more than
/// one run, every run's throughput and p99 are kept in `extra` (`runs_throughput`,
/// `runs_p99_us`).
pub fn median_run(mut runs: Vec<RunResult>) -> Option<RunResult> {
    if runs.len() <= 1 {
        return runs.pop();
    }
    let throughputs: Vec<f64> = runs.iter().map(|r| r.throughput).collect();
    let p99s: Vec<Option<f64>> = runs
        .iter()
        .map(|r| r.latency_us.as_ref().map(|l| l.p99))
        .collect();
    let n = runs.len();
    let mut chosen = if let Some(at) = runs.iter().position(|r| r.failed.is_some()) {
        runs.swap_remove(at)
    } else {
        let by_p99 = runs[0].workload == "pubsub-rate";
        let key = |r: &RunResult| {
            if by_p99 {
                r.latency_us.as_ref().map_or(f64::INFINITY, |l| l.p99)
            } else {
                r.throughput
            }
        };
        runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
        // Of an even count, the worse of the two middle runs.
        runs.swap_remove(if by_p99 { n / 2 } else { (n - 1) / 2 })
    };
    chosen
        .extra
        .insert("runs_throughput".to_owned(), serde_json::json!(throughputs));
    chosen
        .extra
        .insert("runs_p99_us".to_owned(), serde_json::json!(p99s));
    Some(chosen)
}

impl RunResult {
    pub fn new(workload: &str, target: Target, clients: usize) -> RunResult {
        RunResult {
            workload: workload.to_owned(),
            target,
            clients,
            value_size: None,
            qos: None,
            duration_s: 0.0,
            ops: 0,
            throughput: 0.0,
            unit: "ops/s".to_owned(),
            latency_us: None,
            extra: BTreeMap::new(),
            errors: 0,
            server_cpu: 0.0,
            bench_cpu: 0.0,
            failed: None,
        }
    }

    pub fn same_config(&self, other: &RunResult) -> bool {
        self.workload == other.workload
            && self.clients == other.clients
            && self.value_size == other.value_size
            && self.qos == other.qos
    }

    pub fn extra_f64(&self, name: &str) -> Option<f64> {
        self.extra.get(name).and_then(|v| v.as_f64())
    }
}

/// mqkv against one anchor for one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub workload: String,
    pub clients: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    pub mqkv_target: Target,
    pub anchor: Target,
    /// The figure compared: `throughput`, or a memory figure for the memory workloads.
    pub metric: String,
    pub mqkv: f64,
    pub anchor_value: f64,
    /// mqkv ÷ anchor. For throughput higher is better for mqkv; for memory and latency lower is.
    pub mqkv_over_anchor: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_mqkv_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_anchor_us: Option<f64>,
}

/// Which mqkv result each anchor result is compared with.
fn mqkv_counterpart(anchor: Target) -> Target {
    match anchor {
        Target::RedisAof => Target::MqkvDisk,
        _ => Target::Mqkv,
    }
}

fn compared_metric(workload: &str) -> &'static str {
    match workload {
        "mem-idle-conns" => "bytes_per_connection",
        "mem-keys" => "overhead_bytes_per_key",
        _ => "throughput",
    }
}

fn metric_of(r: &RunResult, metric: &str) -> Option<f64> {
    if metric == "throughput" {
        Some(r.throughput)
    } else {
        r.extra_f64(metric)
    }
}

pub fn ratios(results: &[RunResult]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for anchor in results
        .iter()
        .filter(|r| r.target.is_anchor() && r.failed.is_none())
    {
        let want = mqkv_counterpart(anchor.target);
        let Some(m) = results
            .iter()
            .find(|r| r.target == want && r.failed.is_none() && r.same_config(anchor))
        else {
            continue;
        };
        let metric = compared_metric(&anchor.workload);
        let (Some(mv), Some(av)) = (metric_of(m, metric), metric_of(anchor, metric)) else {
            continue;
        };
        out.push(Ratio {
            workload: anchor.workload.clone(),
            clients: anchor.clients,
            value_size: anchor.value_size,
            qos: anchor.qos,
            mqkv_target: want,
            anchor: anchor.target,
            metric: metric.to_owned(),
            mqkv: mv,
            anchor_value: av,
            mqkv_over_anchor: if av != 0.0 { mv / av } else { f64::NAN },
            p99_mqkv_us: m.latency_us.as_ref().map(|l| l.p99),
            p99_anchor_us: anchor.latency_us.as_ref().map(|l| l.p99),
        });
    }
    out
}

/// One of the speed targets, checked against this run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetCheck {
    pub name: String,
    pub requirement: String,
    /// mqkv's figure and the anchor's: each the median of its runs.
    pub mqkv: Option<f64>,
    pub anchor: Option<f64>,
    /// With repeated runs, mqkv's figure over the anchor's round by round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<RoundRatios>,
    /// None when the run did not measure it. Judged on the rounds' median ratio when there
    /// are rounds, else on the two figures.
    pub met: Option<bool>,
}

/// mqkv's figure over its anchor's, one per round. A round runs mqkv and the anchor back to
/// back (which goes first alternates), so each ratio compares two runs on the machine as it
/// was at that moment; the ratio of two medians can pair a run from a quiet stretch with one
/// from a busy stretch.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoundRatios {
    /// Round by round, in the order they ran.
    pub each: Vec<f64>,
    /// The median; of an even count, the one of the two middle ratios that is worse for mqkv.
    pub median: f64,
}

impl RoundRatios {
    /// The ratios of `mqkv`'s figures over `anchor`'s, paired by round; `higher_is_better`
    /// says which way is worse for mqkv. None unless both ran the same number of rounds (more
    /// than one), every figure positive.
    fn pair(mqkv: &[f64], anchor: &[f64], higher_is_better: bool) -> Option<RoundRatios> {
        if mqkv.len() < 2 || mqkv.len() != anchor.len() {
            return None;
        }
        let each: Vec<f64> = mqkv
            .iter()
            .zip(anchor)
            .map(|(&m, &a)| (m > 0.0 && a > 0.0).then(|| m / a))
            .collect::<Option<_>>()?;
        let mut sorted = each.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if higher_is_better {
            sorted[(n - 1) / 2]
        } else {
            sorted[n / 2]
        };
        Some(RoundRatios { each, median })
    }
}

/// One figure per round of a repeated run, in round order: throughput, or the p99 latency.
fn round_figures(r: &RunResult, by_p99: bool) -> Option<Vec<f64>> {
    let key = if by_p99 {
        "runs_p99_us"
    } else {
        "runs_throughput"
    };
    r.extra
        .get(key)?
        .as_array()?
        .iter()
        .map(serde_json::Value::as_f64)
        .collect()
}

/// The runs of `workload` against `target` that did not fail and that `pick` accepts.
fn matching<'a>(
    results: &'a [RunResult],
    workload: &'a str,
    target: Target,
    pick: impl Fn(&RunResult) -> bool + 'a,
) -> impl Iterator<Item = &'a RunResult> + 'a {
    results.iter().filter(move |r| {
        r.workload == workload && r.target == target && r.failed.is_none() && pick(r)
    })
}

/// Of [`matching`], the run with the most clients.
fn find<'a>(
    results: &'a [RunResult],
    workload: &'a str,
    target: Target,
    pick: impl Fn(&RunResult) -> bool + 'a,
) -> Option<&'a RunResult> {
    matching(results, workload, target, pick).max_by_key(|r| r.clients)
}

pub fn target_checks(results: &[RunResult]) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    // `ok` holds for mqkv's figure against the anchor's, and is unchanged by scaling both, so
    // a ratio is judged as `ok(ratio, 1.0)`.
    let check = |name: &str,
                 requirement: &str,
                 mqkv: Option<f64>,
                 anchor: Option<f64>,
                 rounds: Option<RoundRatios>,
                 ok: &dyn Fn(f64, f64) -> bool| TargetCheck {
        name: name.to_owned(),
        requirement: requirement.to_owned(),
        mqkv,
        anchor,
        met: match (&rounds, mqkv, anchor) {
            (Some(r), _, _) => Some(ok(r.median, 1.0)),
            (None, Some(m), Some(a)) => Some(ok(m, a)),
            _ => None,
        },
        rounds,
    };
    // A row compared run by run: throughput, or p99 latency (`by_p99`, lower is better).
    let compared = |name: &str,
                    requirement: &str,
                    m: Option<&RunResult>,
                    a: Option<&RunResult>,
                    by_p99: bool,
                    ok: &dyn Fn(f64, f64) -> bool| {
        let figure = |r: &RunResult| {
            if by_p99 {
                r.latency_us.as_ref().map(|l| l.p99)
            } else {
                Some(r.throughput)
            }
        };
        let rounds = m.zip(a).and_then(|(m, a)| {
            RoundRatios::pair(
                &round_figures(m, by_p99)?,
                &round_figures(a, by_p99)?,
                !by_p99,
            )
        });
        check(
            name,
            requirement,
            m.and_then(figure),
            a.and_then(figure),
            rounds,
            ok,
        )
    };
    // A throughput row, named with the concurrency of mqkv's run.
    let throughput = |label: &str,
                      requirement: &str,
                      m: Option<&RunResult>,
                      a: Option<&RunResult>,
                      ok: &dyn Fn(f64, f64) -> bool| {
        compared(
            &format!("{label} ({} clients)", m.map_or(0, |m| m.clients)),
            requirement,
            m,
            a,
            false,
            ok,
        )
    };
    // Pub/sub QoS 1 throughput, fan-in and fan-out: the issue names no concurrency, so every
    // one measured is a row of its own (a single row when none was).
    for wl in ["pubsub-fanin", "pubsub-fanout"] {
        let mut measured: Vec<&RunResult> =
            matching(results, wl, Target::Mqkv, |r| r.qos == Some(1)).collect();
        measured.sort_by_key(|r| r.clients);
        measured.dedup_by_key(|r| r.clients);
        let rows: Vec<Option<&RunResult>> = if measured.is_empty() {
            vec![None]
        } else {
            measured.into_iter().map(Some).collect()
        };
        for m in rows {
            let a = m.and_then(|m| {
                find(results, wl, Target::Mosquitto, |r| {
                    r.qos == Some(1) && r.clients == m.clients
                })
            });
            checks.push(throughput(
                &format!("{wl} QoS 1 throughput"),
                ">= Mosquitto",
                m,
                a,
                &|m, a| m >= a,
            ));
        }
    }
    // Over TLS and over WebSocket, against Mosquitto on the same transport: rows only for what
    // was measured (the `tls` and `ws` workloads are not in every run).
    for wl in [
        "pubsub-fanin-tls",
        "pubsub-fanout-tls",
        "pubsub-fanin-ws",
        "pubsub-fanout-ws",
    ] {
        let mut measured: Vec<&RunResult> =
            matching(results, wl, Target::Mqkv, |r| r.qos == Some(1)).collect();
        measured.sort_by_key(|r| r.clients);
        measured.dedup_by_key(|r| r.clients);
        for m in measured {
            let a = find(results, wl, Target::Mosquitto, |r| {
                r.qos == Some(1) && r.clients == m.clients
            });
            checks.push(throughput(
                &format!("{wl} QoS 1 throughput"),
                ">= 1.3 x Mosquitto",
                Some(m),
                a,
                &|m, a| m >= 1.3 * a,
            ));
        }
    }
    // With a 100-rule policy against none (the `policy` workload): rows only for what was
    // measured. Of two runs without a policy alike, the later (the policy workload's own)
    // is taken.
    for (wl, label) in [
        ("pubsub-fanin", "pubsub-fanin QoS 1 throughput"),
        ("set", "SET throughput"),
    ] {
        let mut measured: Vec<&RunResult> =
            matching(results, wl, Target::MqkvPolicy, |_| true).collect();
        measured.sort_by_key(|r| r.clients);
        measured.dedup_by_key(|r| r.clients);
        for m in measured {
            let a = matching(results, wl, Target::Mqkv, |r| {
                r.clients == m.clients && r.qos == m.qos && r.value_size == m.value_size
            })
            .last();
            checks.push(throughput(
                &format!("{label} with a 100-rule policy"),
                ">= 0.95 x without a policy",
                Some(m),
                a,
                &|m, a| m >= 0.95 * a,
            ));
        }
    }
    let m = find(results, "pubsub-rate", Target::Mqkv, |_| true);
    let a = find(results, "pubsub-rate", Target::Mosquitto, |_| true);
    checks.push(compared(
        "QoS 1 p99 latency at 1,000 msg/s (µs)",
        "<= Mosquitto",
        m,
        a,
        true,
        &|m, a| m <= a,
    ));
    // State store at 64 clients (or the largest measured below it), 16 B values.
    let at64 = |r: &RunResult| r.clients <= 64;
    let small = |r: &RunResult| r.value_size == results_min_size(results);
    let m = find(results, "get", Target::Mqkv, |r| at64(r) && small(r));
    let a = m.and_then(|m| {
        find(results, "get", Target::Redis, |r| {
            r.clients == m.clients && r.value_size == m.value_size
        })
    });
    checks.push(throughput(
        "GET throughput",
        ">= 0.7 x Redis",
        m,
        a,
        &|m, a| m >= 0.7 * a,
    ));
    let m = find(results, "set", Target::MqkvDisk, |r| at64(r) && small(r));
    let a = m.and_then(|m| {
        find(results, "set", Target::RedisAof, |r| {
            r.clients == m.clients && r.value_size == m.value_size
        })
    });
    checks.push(throughput(
        "durable SET throughput",
        ">= Redis appendfsync always",
        m,
        a,
        &|m, a| m >= a,
    ));
    // The same, both servers up and the load alternating between them: judged on the two
    // servers' throughput over all their slices, not slice by slice.
    let m = find(
        results,
        crate::interleave::WORKLOAD,
        Target::MqkvDisk,
        |_| true,
    );
    let a = find(
        results,
        crate::interleave::WORKLOAD,
        Target::RedisAof,
        |_| true,
    );
    checks.push(check(
        &format!(
            "durable SET throughput, interleaved ({} clients)",
            m.map_or(0, |m| m.clients)
        ),
        ">= Redis appendfsync always",
        m.map(|r| r.throughput),
        a.map(|r| r.throughput),
        None,
        &|m, a| m >= a,
    ));
    let m = find(results, "mem-idle-conns", Target::Mqkv, |_| true);
    let a = find(results, "mem-idle-conns", Target::Mosquitto, |_| true);
    checks.push(check(
        "resident memory per idle connection (bytes)",
        "< 30 KiB",
        m.and_then(|r| r.extra_f64("bytes_per_connection")),
        a.and_then(|r| r.extra_f64("bytes_per_connection")),
        None,
        &|m, _| m < 30.0 * 1024.0,
    ));
    let m = find(results, "mem-keys", Target::Mqkv, |_| true);
    let a = find(results, "mem-keys", Target::Redis, |_| true);
    let mut c = check(
        "memory overhead per stored key (bytes)",
        "< 250 B",
        m.and_then(|r| r.extra_f64("overhead_bytes_per_key")),
        a.and_then(|r| r.extra_f64("overhead_bytes_per_key")),
        None,
        &|m, _| m < 250.0,
    );
    if c.met.is_none() {
        c.met = c.mqkv.map(|m| m < 250.0);
    }
    checks.push(c);
    if let Some(c) = checks
        .iter_mut()
        .find(|c| c.name.starts_with("resident memory"))
    {
        if c.met.is_none() {
            c.met = c.mqkv.map(|m| m < 30.0 * 1024.0);
        }
    }
    checks
}

fn results_min_size(results: &[RunResult]) -> Option<usize> {
    results
        .iter()
        .filter(|r| r.workload == "get" || r.workload == "set")
        .filter_map(|r| r.value_size)
        .min()
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_owned();
    }
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub fn fmt_size(v: usize) -> String {
    if v >= 1024 && v.is_multiple_of(1024) {
        format!("{}KiB", v / 1024)
    } else {
        format!("{v}B")
    }
}

/// The results as a Markdown table (also readable as plain text).
pub fn table(results: &[RunResult], ratios: &[Ratio]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| workload | target | clients | size | qos | throughput | unit | p50 µs | p99 µs | p99.9 µs | max µs | mqkv/anchor | srv cpu | gen cpu | err |"
    );
    let _ = writeln!(
        s,
        "|---|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for r in results {
        let ratio = ratios
            .iter()
            .find(|x| {
                x.anchor == r.target
                    && x.workload == r.workload
                    && x.clients == r.clients
                    && x.value_size == r.value_size
                    && x.qos == r.qos
            })
            .map(|x| format!("{:.2}", x.mqkv_over_anchor))
            .unwrap_or_default();
        let (thr, unit) = match r.workload.as_str() {
            "mem-idle-conns" => (
                r.extra_f64("bytes_per_connection").unwrap_or(f64::NAN),
                "B/conn".to_owned(),
            ),
            "mem-keys" => (
                r.extra_f64("overhead_bytes_per_key").unwrap_or(f64::NAN),
                "B/key overhead".to_owned(),
            ),
            _ => (r.throughput, r.unit.clone()),
        };
        let lat = r.latency_us.as_ref();
        let l = |f: fn(&Latency) -> f64| lat.map(|l| fmt_us(f(l))).unwrap_or_default();
        let throughput = if r.failed.is_some() {
            "FAILED".to_owned()
        } else {
            fmt_num(thr)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0}% | {:.0}% | {} |",
            r.workload,
            r.target.name(),
            r.clients,
            r.value_size.map(fmt_size).unwrap_or_default(),
            r.qos.map(|q| q.to_string()).unwrap_or_default(),
            throughput,
            unit,
            l(|l| l.p50),
            l(|l| l.p99),
            l(|l| l.p999),
            l(|l| l.max),
            ratio,
            r.server_cpu * 100.0,
            r.bench_cpu * 100.0,
            r.errors,
        );
    }
    s
}

pub fn targets_table(checks: &[TargetCheck]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| issue target | requirement | mqkv | anchor | mqkv/anchor by round: median (each) | met |"
    );
    let _ = writeln!(s, "|---|---|--:|--:|---|---|");
    for c in checks {
        let rounds = c.rounds.as_ref().map_or_else(
            || "-".to_owned(),
            |r| {
                let each: Vec<String> = r.each.iter().map(|x| format!("{x:.2}")).collect();
                format!("{:.2} ({})", r.median, each.join(", "))
            },
        );
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            c.name,
            c.requirement,
            c.mqkv.map(fmt_num).unwrap_or_else(|| "-".into()),
            c.anchor.map(fmt_num).unwrap_or_else(|| "-".into()),
            rounds,
            match c.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "not measured",
            }
        );
    }
    s
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
