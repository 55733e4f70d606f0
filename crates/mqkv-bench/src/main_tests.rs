use super::*;
use crate::workloads::KvMode;

fn binaries(redis: bool) -> Binaries {
    Binaries {
        mqkv: PathBuf::from("mqkv"),
        mqkv_args: Vec::new(),
        mosquitto: None,
        redis: redis.then(|| PathBuf::from("redis-server")),
        certs: None,
    }
}

/// The (target, clients) pairs of the SET jobs with `size`-byte values.
fn set_jobs(jobs: &[(Target, Job)], size: usize) -> Vec<(Target, usize)> {
    jobs.iter()
        .filter_map(|(t, j)| match j {
            Job::Kv(KvMode::Set, c, s) if *s == size => Some((*t, *c)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_default_run_measures_durable_set_at_every_client_count_with_its_anchor() {
    let args = Args::parse_from(["mqkv-bench", "--workloads", "set"]);
    let plan = plan(&args).unwrap();
    assert_eq!(plan.disk_clients, [1, 16, 64, 256]);
    let jobs = jobs(&plan, &binaries(true));
    for size in [16, 1024, 65536] {
        let set = set_jobs(&jobs, size);
        for c in [1, 16, 64, 256] {
            for t in [
                Target::Mqkv,
                Target::MqkvDisk,
                Target::Redis,
                Target::RedisAof,
            ] {
                assert_eq!(
                    set.iter().filter(|&&p| p == (t, c)).count(),
                    1,
                    "{t:?} at {c} clients, {size} B"
                );
            }
        }
    }
}

#[test]
fn durable_set_at_counts_outside_clients_keeps_its_memory_row_and_anchor() {
    let args = Args::parse_from([
        "mqkv-bench",
        "--workloads",
        "set",
        "--clients",
        "16",
        "--disk-clients",
        "64",
        "--value-sizes",
        "16",
    ]);
    let plan = plan(&args).unwrap();
    let set = set_jobs(&jobs(&plan, &binaries(true)), 16);
    let mut want = vec![
        (Target::Mqkv, 16),
        (Target::Redis, 16),
        (Target::Mqkv, 64),
        (Target::MqkvDisk, 64),
        (Target::RedisAof, 64),
    ];
    let mut got = set;
    want.sort();
    got.sort();
    assert_eq!(got, want);
    // Without Redis only mqkv's rows are planned.
    let set = set_jobs(&jobs(&plan, &binaries(false)), 16);
    assert!(set
        .iter()
        .all(|(t, _)| matches!(t, Target::Mqkv | Target::MqkvDisk)));
    assert_eq!(set.len(), 3);
}
