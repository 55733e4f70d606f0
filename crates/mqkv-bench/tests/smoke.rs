//! Runs `mqkv-bench --smoke` against the freshly built server and checks the shape of what it
//! writes. Structure only: nothing here depends on how fast anything was.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use serde_json::Value;

/// The pub/sub workloads judged against Mosquitto, over TCP, TLS and WebSocket.
const PUBSUB: [&str; 6] = [
    "pubsub-fanin",
    "pubsub-fanout",
    "pubsub-fanin-tls",
    "pubsub-fanout-tls",
    "pubsub-fanin-ws",
    "pubsub-fanout-ws",
];

/// The server binary: `MQKV_BIN`, else the newer of `target/release/mqkv` and
/// `target/debug/mqkv` in the target directory this test was built into.
fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MQKV_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/<profile>/deps/smoke-<hash>
    let target = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .expect("target directory");
    let newest = ["release", "debug"]
        .iter()
        .map(|profile| target.join(profile).join("mqkv"))
        .filter(|p| p.is_file())
        .max_by_key(|p| {
            p.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        });
    newest.unwrap_or_else(|| {
        panic!(
            "no mqkv server binary under {}: build it first (cargo build -p mqkv), or set MQKV_BIN",
            target.display()
        )
    })
}

fn results_for<'a>(doc: &'a Value, workload: &str, target: &str) -> Vec<&'a Value> {
    doc["results"]
        .as_array()
        .expect("results array")
        .iter()
        .filter(|r| r["workload"] == workload && r["target"] == target)
        .collect()
}

fn check_present(doc: &Value, workload: &str, target: &str, latency: bool) {
    let rs = results_for(doc, workload, target);
    assert!(!rs.is_empty(), "no {workload} result for {target}");
    for r in rs {
        assert!(
            r.get("failed").is_none(),
            "{workload} on {target} failed: {}",
            r["failed"]
        );
        assert!(
            r["throughput"].is_number(),
            "{workload}/{target} throughput"
        );
        assert!(r["clients"].is_u64(), "{workload}/{target} clients");
        if latency {
            let l = &r["latency_us"];
            for field in ["p50", "p99", "p999", "max"] {
                assert!(l[field].is_number(), "{workload}/{target} latency {field}");
            }
        }
    }
}

/// Runs `cmd` (mqkv-bench with `what` among its arguments) and fails the test, with its output,
/// unless it succeeds.
fn succeeds(mut cmd: Command, what: &str) {
    let run = cmd.output().expect("run mqkv-bench");
    assert!(
        run.status.success(),
        "mqkv-bench {what} exited with {}:\n{}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn smoke_run_reports_every_workload() {
    let server = server_binary();
    let out = std::env::temp_dir().join(format!("mqkv-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut run = Command::new(env!("CARGO_BIN_EXE_mqkv-bench"));
    run.arg("--smoke")
        .arg("--out")
        .arg(&out)
        .arg("--server-bin")
        .arg(&server);
    succeeds(run, "--smoke");

    let text = std::fs::read_to_string(out.join("results.json")).expect("results.json");
    let doc: Value = serde_json::from_str(&text).expect("results.json is JSON");

    let meta = &doc["meta"];
    assert_eq!(meta["smoke"], true);
    for field in ["nproc", "cpu_model", "mem_total_bytes"] {
        assert!(!meta["machine"][field].is_null(), "machine.{field}");
    }
    assert!(meta["loadavg_before"].is_string() && meta["loadavg_after"].is_string());

    for (workload, latency) in [
        ("set", true),
        ("get", true),
        ("mix", true),
        ("set-pipelined", true),
        ("notify", true),
        ("notify-pattern", true),
        ("pubsub-fanin", true),
        ("pubsub-fanout", true),
        ("pubsub-fanin-tls", true),
        ("pubsub-fanout-tls", true),
        ("pubsub-fanin-ws", true),
        ("pubsub-fanout-ws", true),
        ("pubsub-rate", true),
        ("conn-storm", true),
        ("conn-storm-tls", true),
        ("conn-storm-tls-full", true),
        ("mem-idle-conns", false),
        ("mem-keys", false),
    ] {
        check_present(&doc, workload, "mqkv", latency);
    }
    check_present(&doc, "set", "mqkv-disk", true);
    check_present(&doc, "set-pipelined", "mqkv-disk", true);
    for r in results_for(&doc, "mem-idle-conns", "mqkv") {
        assert!(r["extra"]["bytes_per_connection"].is_number());
    }
    for r in results_for(&doc, "mem-keys", "mqkv") {
        assert!(r["extra"]["overhead_bytes_per_key"].is_number());
    }

    // The anchors are skipped only when they could not be installed, and then the reason is
    // in the record: say it here too.
    let notes: Vec<String> = meta["anchor_notes"]
        .as_array()
        .expect("anchor_notes")
        .iter()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    let has_mosquitto = !meta["versions"]["mosquitto"].is_null();
    let has_redis = !meta["versions"]["redis"].is_null();
    if !has_mosquitto || !has_redis {
        eprintln!("anchor checks skipped in part: {}", notes.join("; "));
        assert!(!notes.is_empty(), "an anchor is missing without a reason");
    }
    if has_redis {
        for wl in ["set", "get", "mix", "set-pipelined"] {
            check_present(&doc, wl, "redis", true);
        }
        check_present(&doc, "set", "redis-aof", true);
        check_present(&doc, "set-pipelined", "redis-aof", true);
        check_present(&doc, "mem-keys", "redis", false);
        // Durable SET against Redis again, both servers up and the load alternating.
        for target in ["mqkv-disk", "redis-aof"] {
            check_present(&doc, "set-interleaved", target, false);
            for r in results_for(&doc, "set-interleaved", target) {
                let rates = r["extra"]["runs_throughput"].as_array().expect("slices");
                assert_eq!(rates.len(), 4, "8 slices, 4 of each: {r}");
                assert!(rates.iter().all(|x| x.as_f64().is_some_and(|v| v > 0.0)));
                assert_eq!(r["extra"]["pair_ratios"].as_array().map(Vec::len), Some(4));
            }
        }
    }
    if has_mosquitto {
        let storms = ["conn-storm", "conn-storm-tls", "conn-storm-tls-full"];
        for wl in PUBSUB.into_iter().chain(["pubsub-rate"]).chain(storms) {
            check_present(&doc, wl, "mosquitto", true);
        }
        check_present(&doc, "mem-idle-conns", "mosquitto", false);
    }
    if has_redis || has_mosquitto {
        let ratios = doc["ratios"].as_array().expect("ratios");
        assert!(!ratios.is_empty(), "anchors ran but no ratios");
        for r in ratios {
            assert!(r["mqkv_over_anchor"].is_number());
        }
    }
    // Six targets (durable SET twice: back to back and interleaved), plus pub/sub QoS 1
    // throughput per concurrency measured (smoke: 1 and 4), over TCP, TLS and WebSocket, plus
    // pub/sub fan-in and SET with a policy against none at each concurrency.
    let targets: Vec<&str> = doc["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(targets.len(), 22, "{targets:?}");
    for clients in [1, 4] {
        let name = format!("SET throughput with a 100-rule policy ({clients} clients)");
        assert!(targets.contains(&name.as_str()), "{name} in {targets:?}");
    }
    if has_redis {
        assert!(
            targets.contains(&"durable SET throughput, interleaved (4 clients)"),
            "{targets:?}"
        );
    }
    for wl in PUBSUB {
        for clients in [1, 4] {
            let name = format!("{wl} QoS 1 throughput ({clients} clients)");
            assert!(targets.contains(&name.as_str()), "{name} in {targets:?}");
        }
    }

    let png = std::fs::read(out.join("throughput.png")).expect("throughput.png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "chart is a PNG");
    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(md.contains("| workload | target |"));
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs `mqkv-bench --interleave` with a few short slices and returns interleave.json.
fn interleave_run(server: &Path, other: &str, name: &str, extra: &[&str]) -> Value {
    let out = std::env::temp_dir().join(format!("mqkv-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut run = Command::new(env!("CARGO_BIN_EXE_mqkv-bench"));
    run.args(["--interleave", other, "--slices", "8", "--slice-ms", "100"])
        .args([
            "--warmup",
            "0.1",
            "--disk-clients",
            "2",
            "--value-sizes",
            "16",
        ])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .arg("--server-bin")
        .arg(server);
    succeeds(run, "--interleave");
    let text = std::fs::read_to_string(out.join("interleave.json")).expect("interleave.json");
    let _ = std::fs::remove_dir_all(&out);
    serde_json::from_str(&text).expect("interleave.json is JSON")
}

fn check_interleaved(doc: &Value) {
    let slices = doc["slices"].as_array().expect("slices");
    let sides: Vec<u64> = slices.iter().filter_map(|s| s["side"].as_u64()).collect();
    assert_eq!(sides, [0, 1, 1, 0, 0, 1, 1, 0], "slices go A B B A");
    for s in slices {
        assert!(
            s["ops"].as_u64().is_some_and(|n| n > 0),
            "a slice without SETs: {s}"
        );
        assert!(
            s["seconds"].as_f64().is_some_and(|t| t > 0.05),
            "slice length: {s}"
        );
    }
    let summary = &doc["summary"];
    assert_eq!(summary["pair_ratios"].as_array().map(Vec::len), Some(4));
    for side in summary["sides"].as_array().expect("sides") {
        assert!(
            side["ops_per_s"].as_f64().is_some_and(|r| r > 0.0),
            "{side}"
        );
    }
    assert_eq!(doc["clients"], 2);
}

#[test]
fn interleaved_run_alternates_two_servers() {
    let server = server_binary();
    let doc = interleave_run(
        &server,
        &server.display().to_string(),
        "interleave",
        &["--no-anchors"],
    );
    check_interleaved(&doc);
    assert_eq!(doc["b"], server.display().to_string());
}

#[test]
fn interleaved_run_against_redis() {
    let doc = interleave_run(&server_binary(), "redis-aof", "interleave-redis", &[]);
    check_interleaved(&doc);
    assert_eq!(doc["b"], "redis-aof");
}

#[test]
fn interleaved_run_refuses_a_slice_count_not_a_multiple_of_four() {
    let run = Command::new(env!("CARGO_BIN_EXE_mqkv-bench"))
        .args(["--interleave", "redis-aof", "--slices", "6", "--no-install"])
        .arg("--server-bin")
        .arg(server_binary())
        .output()
        .expect("run mqkv-bench");
    assert!(!run.status.success());
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("multiple of 4"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// The cluster comparison at tiny sizes: both clusters start, serve writes and reads, and the
/// record and table have every figure.
#[test]
fn cluster_smoke_run_compares_with_etcd() {
    let server = server_binary();
    let out = std::env::temp_dir().join(format!("mqkv-bench-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut run = Command::new(env!("CARGO_BIN_EXE_mqkv-bench"));
    run.args(["--cluster", "--smoke", "--out"])
        .arg(&out)
        .arg("--server-bin")
        .arg(&server);
    succeeds(run, "--cluster --smoke");
    let text = std::fs::read_to_string(out.join("cluster.json")).expect("cluster.json");
    let doc: Value = serde_json::from_str(&text).expect("cluster.json is JSON");
    let rows = doc["cluster"].as_array().expect("cluster rows");
    assert_eq!(rows.len(), 2, "a write and a read row at 4 clients: {doc}");
    for row in rows {
        for side in ["mqkv", "etcd"] {
            let s = &row[side];
            assert!(s["ops"].as_u64().is_some_and(|n| n > 0), "{side}: {row}");
            assert_eq!(s["errors"], 0, "{side}: {row}");
            assert!(s["latency_us"]["p99"].is_number(), "{side}: {row}");
        }
        assert!(row["throughput_ratio"].is_number());
    }
    let single = doc["single_node"].as_array().expect("single node rows");
    assert_eq!(single.len(), 2);
    assert!(doc["etcd_version"].is_string());
    let table = std::fs::read_to_string(out.join("cluster.md")).expect("cluster.md");
    assert!(
        table.contains("| write | 4 |") && table.contains("| read | 4 |"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
