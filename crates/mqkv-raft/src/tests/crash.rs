//! Acknowledged writes survive `kill -9` of the process.

use super::*;

const CRASH_DIR: &str = "MQKV_RAFT_CRASH_DIR";
const CRASH_ROUND: &str = "MQKV_RAFT_CRASH_ROUND";

/// The child process of `acknowledged_writes_survive_kill_9`: writes from
/// several tasks until it is killed, printing every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "only runs as the child process of acknowledged_writes_survive_kill_9"]
async fn crash_child_writer() {
    let (Ok(dir), Ok(round)) = (std::env::var(CRASH_DIR), std::env::var(CRASH_ROUND)) else {
        panic!("run only by acknowledged_writes_survive_kill_9, which sets {CRASH_DIR} and {CRASH_ROUND}");
    };
    let (node, _) = open(Path::new(&dir), small_snapshots()).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let node = node.clone();
            let round = round.clone();
            tokio::spawn(async move {
                for i in 0..1_000_000u64 {
                    let key = format!("r{round}-w{w}-{i}");
                    node.write(set(T0 + i, &key, &key)).await.unwrap();
                    println!("ack {key}");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command as Process, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut acked = Vec::new();
    for (round, kill_after) in [300, 777, 1234].into_iter().enumerate() {
        let mut child = Process::new(std::env::current_exe().unwrap())
            .args([
                "tests::crash::crash_child_writer",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CRASH_DIR, dir.path())
            .env(CRASH_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut this_round = 0;
        for line in stdout.lines() {
            if let Some(key) = line.unwrap().strip_prefix("ack ") {
                acked.push(key.to_string());
                this_round += 1;
                if this_round == kill_after {
                    break;
                }
            }
        }
        // SIGKILL: no shutdown, no flush, mid-write.
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(this_round, kill_after, "the child stopped writing early");

        runtime.block_on(async {
            let (node, recorder) = open(dir.path(), small_snapshots()).await;
            for key in &acked {
                let value = node.read(|m| m.get(key.as_bytes(), T0).map(|(value, _)| value));
                assert_eq!(value, Some(b(key)), "acknowledged write {key} was lost");
            }
            assert!(recorder.seen().is_empty());
            node.shutdown().await.unwrap();
        });
    }
}
