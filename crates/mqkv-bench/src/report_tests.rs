use super::*;

fn run(workload: &str, throughput: f64, p99: f64) -> RunResult {
    let mut r = RunResult::new(workload, Target::Mqkv, 64);
    r.throughput = throughput;
    r.latency_us = Some(Latency {
        samples: 1,
        mean: p99,
        p50: p99,
        p99,
        p999: p99,
        max: p99,
    });
    r
}

#[test]
fn the_median_run_is_chosen_by_throughput_and_every_run_is_listed() {
    let runs = vec![
        run("get", 120.0, 1.0),
        run("get", 90.0, 2.0),
        run("get", 100.0, 3.0),
    ];
    let m = median_run(runs).expect("a run");
    assert_eq!(m.throughput, 100.0);
    assert_eq!(
        m.extra.get("runs_throughput"),
        Some(&serde_json::json!([120.0, 90.0, 100.0]))
    );
    // Of an even count, the lower of the two middle throughputs.
    let runs = vec![
        run("get", 4.0, 1.0),
        run("get", 1.0, 1.0),
        run("get", 3.0, 1.0),
        run("get", 2.0, 1.0),
    ];
    assert_eq!(median_run(runs).map(|r| r.throughput), Some(2.0));
}

#[test]
fn the_fixed_rate_run_is_chosen_by_p99() {
    let runs = vec![
        run("pubsub-rate", 1000.0, 300.0),
        run("pubsub-rate", 1000.0, 200.0),
        run("pubsub-rate", 1000.0, 250.0),
        run("pubsub-rate", 1000.0, 220.0),
    ];
    // Of an even count, the higher of the two middle p99s.
    let m = median_run(runs).expect("a run");
    assert_eq!(m.latency_us.map(|l| l.p99), Some(250.0));
}

fn pubsub(workload: &str, target: Target, clients: usize, throughput: f64) -> RunResult {
    let mut r = RunResult::new(workload, target, clients);
    r.qos = Some(1);
    r.throughput = throughput;
    r
}

#[test]
fn every_pubsub_concurrency_measured_is_checked_against_mosquitto() {
    let results = vec![
        pubsub("pubsub-fanout", Target::Mqkv, 256, 170.0),
        pubsub("pubsub-fanout", Target::Mosquitto, 256, 140.0),
        pubsub("pubsub-fanout", Target::Mqkv, 16, 100.0),
        pubsub("pubsub-fanout", Target::Mosquitto, 16, 120.0),
        pubsub("pubsub-fanin", Target::Mqkv, 64, 90.0),
    ];
    let checks = target_checks(&results);
    assert_eq!(
        rows_of(&checks, "pubsub-fanout"),
        vec![
            ("pubsub-fanout QoS 1 throughput (16 clients)", Some(false)),
            ("pubsub-fanout QoS 1 throughput (256 clients)", Some(true)),
        ]
    );
    // Without its anchor a concurrency is listed, not judged.
    assert_eq!(
        rows_of(&checks, "pubsub-fanin"),
        vec![("pubsub-fanin QoS 1 throughput (64 clients)", None)]
    );
}

#[test]
fn transports_are_judged_against_mosquitto_on_the_same_transport_when_measured() {
    let results = vec![
        pubsub("pubsub-fanin-tls", Target::Mqkv, 64, 140.0),
        pubsub("pubsub-fanin-tls", Target::Mosquitto, 64, 100.0),
        pubsub("pubsub-fanout-tls", Target::Mqkv, 64, 120.0),
        pubsub("pubsub-fanout-tls", Target::Mosquitto, 64, 100.0),
        pubsub("pubsub-fanin", Target::Mqkv, 64, 90.0),
        pubsub("pubsub-fanin", Target::Mosquitto, 64, 80.0),
    ];
    let checks = target_checks(&results);
    assert_eq!(
        rows_of(&checks, "pubsub-fanin-tls"),
        vec![("pubsub-fanin-tls QoS 1 throughput (64 clients)", Some(true))]
    );
    assert_eq!(
        rows_of(&checks, "pubsub-fanout-tls"),
        vec![(
            "pubsub-fanout-tls QoS 1 throughput (64 clients)",
            Some(false)
        )]
    );
    assert!(rows_of(&checks, "pubsub-fanin-ws").is_empty());
    assert_eq!(
        row(&checks, "pubsub-fanin-tls").requirement,
        ">= 1.3 x Mosquitto"
    );
}

/// The first target row whose name starts with `prefix`.
fn row<'a>(checks: &'a [TargetCheck], prefix: &str) -> &'a TargetCheck {
    checks
        .iter()
        .find(|c| c.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row {prefix}"))
}

/// The names and verdicts of the target rows of one workload.
fn rows_of<'a>(checks: &'a [TargetCheck], workload: &str) -> Vec<(&'a str, Option<bool>)> {
    checks
        .iter()
        .filter(|c| c.name.starts_with(workload))
        .map(|c| (c.name.as_str(), c.met))
        .collect()
}

/// A repeated run of `target` whose rounds gave `figures` (throughput, or p99 with
/// `by_p99`), as `median_run` reports it.
fn repeated(workload: &str, target: Target, figures: &[f64], by_p99: bool) -> RunResult {
    let runs = figures
        .iter()
        .map(|&f| {
            let mut r = if by_p99 {
                run(workload, 1000.0, f)
            } else {
                run(workload, f, 1.0)
            };
            r.target = target;
            r.qos = Some(1);
            r
        })
        .collect();
    median_run(runs).expect("a run")
}

#[test]
fn a_target_is_judged_on_the_median_of_the_rounds_ratios() {
    // The anchor's median comes from a quiet round and mqkv's from a busy one: the
    // medians' ratio is 104/120 = 0.87, while round by round mqkv leads twice of three.
    let results = vec![
        repeated("pubsub-fanout", Target::Mqkv, &[100.0, 104.0, 130.0], false),
        repeated(
            "pubsub-fanout",
            Target::Mosquitto,
            &[95.0, 120.0, 125.0],
            false,
        ),
    ];
    let checks = target_checks(&results);
    let c = row(&checks, "pubsub-fanout");
    assert_eq!((c.mqkv, c.anchor), (Some(104.0), Some(120.0)));
    let rounds = c.rounds.as_ref().expect("paired rounds");
    let each: Vec<String> = rounds.each.iter().map(|x| format!("{x:.3}")).collect();
    assert_eq!(each, ["1.053", "0.867", "1.040"]);
    assert_eq!(format!("{:.3}", rounds.median), "1.040");
    assert_eq!(c.met, Some(true));
    // The table shows both.
    let table = targets_table(&checks);
    assert!(
        table.contains("| 104 | 120 | 1.04 (1.05, 0.87, 1.04) | yes |"),
        "{table}"
    );
}

#[test]
fn of_an_even_count_of_rounds_the_worse_middle_ratio_counts() {
    // Throughput: 0.9 and 1.1, the lower one.
    let results = vec![
        repeated("pubsub-fanin", Target::Mqkv, &[90.0, 110.0], false),
        repeated("pubsub-fanin", Target::Mosquitto, &[100.0, 100.0], false),
        // p99 (lower is better): 0.9 and 1.1, the higher one.
        repeated("pubsub-rate", Target::Mqkv, &[90.0, 110.0], true),
        repeated("pubsub-rate", Target::Mosquitto, &[100.0, 100.0], true),
    ];
    let checks = target_checks(&results);
    let fanin = row(&checks, "pubsub-fanin");
    assert_eq!(fanin.rounds.as_ref().map(|r| r.median), Some(0.9));
    assert_eq!(fanin.met, Some(false));
    let p99 = row(&checks, "QoS 1 p99");
    assert_eq!(p99.rounds.as_ref().map(|r| r.median), Some(1.1));
    assert_eq!(p99.met, Some(false));
}

#[test]
fn without_matching_rounds_a_target_is_judged_on_the_two_figures() {
    let results = vec![
        repeated("pubsub-fanout", Target::Mqkv, &[100.0, 104.0, 130.0], false),
        repeated("pubsub-fanout", Target::Mosquitto, &[95.0, 120.0], false),
    ];
    let checks = target_checks(&results);
    let c = row(&checks, "pubsub-fanout");
    assert!(c.rounds.is_none());
    // 104 against the lower middle of (95, 120).
    assert_eq!(
        (c.mqkv, c.anchor, c.met),
        (Some(104.0), Some(95.0), Some(true))
    );
}

#[test]
fn a_failed_run_is_reported_and_a_single_run_is_kept_as_it_is() {
    let mut failed = run("get", 0.0, 0.0);
    failed.failed = Some("server start: boom".to_owned());
    let m = median_run(vec![run("get", 100.0, 1.0), failed]).expect("a run");
    assert_eq!(m.failed.as_deref(), Some("server start: boom"));
    let single = median_run(vec![run("get", 7.0, 1.0)]).expect("a run");
    assert_eq!(single.throughput, 7.0);
    assert!(!single.extra.contains_key("runs_throughput"));
    assert!(median_run(Vec::new()).is_none());
}
