//! `lock` and `leader`: commands run under a lock, waits, lost locks, failover.

use super::*;

#[test]
fn lock_runs_the_command_and_exits_with_its_status() {
    let server = Server::start();
    let out = server.run(&[
        "lock",
        "job",
        "--",
        "sh",
        "-c",
        "echo \"$MQKV_LOCK_NAME $MQKV_FENCING_TOKEN\"; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let line = stdout(&out);
    let (name, token) = line.trim().split_once(' ').expect("name and token");
    assert_eq!(name, "job");
    assert!(is_hlc(token), "{line:?}");
    // Released afterwards.
    assert_eq!(server.run(&["get", "job"]).status.code(), Some(1));

    // The token works as a fencing token for the writes the lock protects.
    let script = format!(
        "\"{MQKV}\" set protected v --fencing-token \"$MQKV_FENCING_TOKEN\" && \"{MQKV}\" set protected w"
    );
    let out = server.run(&["lock", "job", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(3), "the unfenced write is refused");
    assert!(stderr(&out).contains("a fencing token is required"));

    let out = server.run(&["lock", "job", "--", "/no/such/program"]);
    assert_one_line_error(&out, "/no/such/program");
    assert_eq!(
        server.run(&["get", "job"]).status.code(),
        Some(1),
        "released"
    );
}

#[test]
fn lock_wait_gives_up_with_status_2() {
    let server = Server::start();
    server.run(&["set", "busy", "someone-else", "--px", "30000"]);
    let out = server.run(&["lock", "busy", "--wait", "500", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&server.run(&["get", "busy"])), "someone-else\n");
}

/// If the lock is taken away while the command runs, the command is killed
/// rather than left running without it: it never gets to its last step, and `mqkv` exits
/// well before the command would have.
#[test]
fn a_command_that_loses_its_lock_is_stopped() {
    let server = Server::start();
    let dir = temp_dir("fragile");
    let marker = dir.join("finished");
    let marker_arg = marker.to_string_lossy().into_owned();
    let run = server.spawn(&[
        "lock",
        "fragile",
        "--ttl",
        "3000",
        "--",
        "sh",
        "-c",
        "echo running; sleep 120; touch \"$1\"",
        "sh",
        &marker_arg,
    ]);
    assert_eq!(run.next_line(), "running");
    // Someone else deletes the lock and takes it.
    assert_eq!(server.run(&["del", "fragile"]).status.code(), Some(0));
    assert_eq!(
        server
            .run(&["set", "fragile", "intruder", "--px", "30000"])
            .status
            .code(),
        Some(0)
    );
    // `finish` gives up (failing) long before the command's sleep would end.
    let (code, err) = run.finish();
    assert_eq!(code, Some(3), "stderr: {err}");
    assert!(err.contains("lost the lock fragile"), "{err:?}");
    assert!(!marker.exists(), "the command was left running to its end");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        stdout(&server.run(&["get", "fragile"])),
        "intruder\n",
        "not released: not ours"
    );
}

/// Two `mqkv lock` processes contend for one lock; each command appends a
/// start and an end line to a file with a pause between. If their critical
/// sections never overlap, every start is directly followed by its own end.
#[test]
fn lock_contention_between_processes_never_overlaps() {
    let server = Server::start();
    let dir = temp_dir("lock");
    let log = dir.join("log");
    let log_arg = log.to_string_lossy().into_owned();
    let script = "echo \"start $1\" >> \"$2\"; sleep 0.4; echo \"end $1\" >> \"$2\"";
    let rounds = 3;
    for _ in 0..rounds {
        let runs: Vec<Child> = ["a", "b"]
            .iter()
            .map(|who| {
                server
                    .cmd(&[
                        "lock", "crit", "--ttl", "5000", "--", "sh", "-c", script, "sh", who,
                        &log_arg,
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn mqkv lock")
            })
            .collect();
        for run in runs {
            let out = run.wait_with_output().expect("wait");
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
    }
    let text = std::fs::read_to_string(&log).expect("log written");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4 * rounds, "{text}");
    for pair in lines.chunks(2) {
        let who = pair[0].strip_prefix("start ").expect("a start line");
        assert_eq!(
            pair[1],
            format!("end {who}"),
            "critical sections overlap:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The leader is killed without resigning; the other candidate takes over
/// once the term runs out.
#[test]
fn leader_failover_when_the_leader_is_killed() {
    let server = Server::start();
    let a = server.spawn(&[
        "leader",
        "election",
        "--ttl",
        "3000",
        "--client-id",
        "cand-a",
    ]);
    a.wait_for_line(|l| l.ends_with("leader cand-a (this process)"));
    let b = server.spawn(&[
        "leader",
        "election",
        "--ttl",
        "3000",
        "--client-id",
        "cand-b",
    ]);
    b.wait_for_line(|l| l.ends_with("leader cand-a"));

    a.signal("KILL");
    let _ = a.finish();
    // b takes over once cand-a's term runs out (it was never resigned).
    b.wait_for_line(|l| l.ends_with("leader cand-b (this process)"));

    // Interrupting the leader makes it resign.
    b.signal("INT");
    let (code, err) = b.finish();
    assert_eq!(code, Some(0), "stderr: {err}");
    assert_eq!(server.run(&["get", "election"]).status.code(), Some(1));
}

#[test]
fn leader_json_reports_changes() {
    let server = Server::start();
    let a = server.spawn(&[
        "leader",
        "race",
        "--ttl",
        "3000",
        "--client-id",
        "solo",
        "--json",
    ]);
    let first = a.next_json();
    assert!(
        first["leader"].is_null() || first["leader"] == "solo",
        "{first}"
    );
    let j = if first["leader"].is_null() {
        a.next_json()
    } else {
        first
    };
    assert_eq!(j["leader"], "solo");
    assert_eq!(j["self"], true);
    assert_eq!(j["election"], "race");
    // Someone deletes the key: reported, and the candidate wins it back.
    server.run(&["del", "race"]);
    let j = a.next_json();
    assert!(j["leader"].is_null(), "{j}");
    let j = a.next_json();
    assert_eq!(j["leader"], "solo");
    a.signal("TERM");
    assert_eq!(a.finish().0, Some(0));
}
