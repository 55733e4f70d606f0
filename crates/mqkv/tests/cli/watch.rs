//! `watch`: keys and patterns, from a version, as JSON lines, across a server restart.

use super::*;

#[test]
fn watch_prints_each_change_until_interrupted() {
    let server = Server::start();
    server.run(&["set", "w2", "before"]);
    let watch = server.spawn(&["watch", "w1", "w2"]);
    // Wait until the watch is registered: it prints nothing by itself, so
    // poll with a change until a line appears.
    let deadline = Instant::now() + WAIT;
    let first = loop {
        server.run(&["set", "w1", "ping"]);
        if let Ok(line) = watch.lines.recv_timeout(Duration::from_millis(300)) {
            break line;
        }
        assert!(Instant::now() < deadline, "watch never reported anything");
    };
    let fields: Vec<&str> = first.splitn(5, ' ').collect();
    assert_eq!(fields.len(), 5, "{first:?}");
    assert!(
        fields[0].ends_with('Z') && fields[0].contains('T'),
        "time: {first:?}"
    );
    assert_eq!(&fields[1..3], ["SET", "w1"]);
    assert!(is_hlc(fields[3]), "{first:?}");
    assert_eq!(fields[4], "ping");

    server.run(&["set", "w2", "two words"]);
    let line = watch.next_line_after_pings(|l| l.contains(" SET w1 ") && l.ends_with(" ping"));
    assert!(
        line.contains(" SET w2 ") && line.ends_with(" two words"),
        "{line:?}"
    );
    server.run(&["del", "w1"]);
    let line = watch.next_line();
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields.len(), 4, "DELETE has no value: {line:?}");
    assert_eq!(&fields[1..3], ["DELETE", "w1"]);
    // Binary values are shown as hex, never raw on the terminal.
    server.run_with_stdin(&["set", "w2", "-"], b"\x00\x01");
    let line = watch.next_line();
    assert!(
        line.contains(" SET w2 ") && line.ends_with(" 0001"),
        "{line:?}"
    );

    watch.signal("INT");
    let (code, err) = watch.finish();
    assert_eq!(code, Some(0), "stderr: {err}");
    assert!(!err.contains("panicked"));
}

/// `watch 'sensors/*'` watches every matching key, existing or not yet (an mqkv extension);
/// `--exact` takes the same argument as a key.
#[test]
fn watch_a_pattern() {
    let server = Server::start();
    let watch = server.spawn(&["watch", "sensors/*"]);
    let deadline = Instant::now() + WAIT;
    loop {
        server.run(&["set", "sensors/ping", "ping"]);
        if watch.lines.recv_timeout(Duration::from_millis(300)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "watch never reported anything");
    }
    server.run(&["set", "elsewhere", "x"]);
    server.run(&["set", "sensors/new", "21.5"]);
    let line = watch.next_line_after_pings(|l| l.contains(" sensors/ping "));
    assert!(
        line.contains(" SET sensors/new ") && line.ends_with(" 21.5"),
        "only matching keys: {line:?}"
    );
    watch.signal("INT");
    assert_eq!(watch.finish().0, Some(0));

    let exact = server.spawn(&["watch", "--exact", "sensors/*"]);
    let deadline = Instant::now() + WAIT;
    loop {
        server.run(&["set", "sensors/*", "literal"]);
        if let Ok(line) = exact.lines.recv_timeout(Duration::from_millis(300)) {
            assert!(line.contains(" SET sensors/* "), "{line:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "watch --exact never reported anything"
        );
    }
    server.run(&["set", "sensors/other", "x"]);
    server.run(&["set", "sensors/*", "again"]);
    let line = exact.next_line_after_pings(|l| l.ends_with(" literal"));
    assert!(line.ends_with(" again"), "the literal key only: {line:?}");
    exact.signal("INT");
    assert_eq!(exact.finish().0, Some(0));
}

/// `watch KEY --since VERSION` prints the changes after the version first, then live ones.
#[test]
fn watch_since_a_version() {
    let server = Server::start();
    let out = server.run(&["set", "gate", "a"]);
    let since = stdout(&out)
        .trim()
        .strip_prefix("OK ")
        .expect("OK <version>")
        .to_owned();
    server.run(&["set", "gate", "b"]);
    server.run(&["del", "gate"]);
    let watch = server.spawn(&["watch", "gate", "--since", &since]);
    let first = watch.next_line();
    assert!(
        first.contains(" SET gate ") && first.ends_with(" b"),
        "{first:?}"
    );
    let second = watch.next_line();
    assert!(second.contains(" DELETE gate "), "{second:?}");
    server.run(&["set", "gate", "c"]);
    let third = watch.next_line();
    assert!(
        third.contains(" SET gate ") && third.ends_with(" c"),
        "{third:?}"
    );
    watch.signal("INT");
    assert_eq!(watch.finish().0, Some(0));
    // A pattern resumes too.
    let watch = server.spawn(&["watch", "ga*", "--since", &since]);
    let lines = [watch.next_line(), watch.next_line(), watch.next_line()];
    assert!(lines[0].ends_with(" b"), "{lines:?}");
    assert!(lines[1].contains(" DELETE gate "), "{lines:?}");
    assert!(lines[2].ends_with(" c"), "{lines:?}");
    watch.signal("INT");
    assert_eq!(watch.finish().0, Some(0));
}

#[test]
fn watch_json_lines_and_binary_values() {
    let server = Server::start();
    let watch = server.spawn(&["watch", "bj", "--json"]);
    let deadline = Instant::now() + WAIT;
    let first = loop {
        server.run_with_stdin(&["set", "bj", "-"], b"\x00\xff");
        if let Ok(line) = watch.lines.recv_timeout(Duration::from_millis(300)) {
            break serde_json::from_str::<Value>(&line).expect("JSON line");
        }
        assert!(Instant::now() < deadline, "watch never reported anything");
    };
    assert_eq!(first["operation"], "SET");
    assert_eq!(first["key"], "bj");
    assert_eq!(first["value"]["hex"], "00ff");
    assert_eq!(first["synthesized"], false);
    assert!(is_hlc(first["version"].as_str().unwrap()));
    server.run(&["del", "bj"]);
    let j = watch.next_json_after_pings(|j| j["operation"] == "SET" && j["value"]["hex"] == "00ff");
    assert_eq!(j["operation"], "DELETE");
    assert!(j.get("value").is_none());
    watch.signal("TERM");
    assert_eq!(watch.finish().0, Some(0));
}

/// The server is killed and restarted on the same port in the middle of a
/// watch. The restarted server keeps nothing in memory, so the watched key
/// is gone: the watch reports that change, which it never got a
/// notification for, as a synthesized DELETE, then keeps reporting.
#[test]
fn watch_reports_changes_missed_during_a_server_restart() {
    let mut server = Server::start();
    server.run(&["set", "survivor", "v1"]);
    let watch = server.spawn(&["watch", "survivor", "--json"]);
    let deadline = Instant::now() + WAIT;
    loop {
        server.run(&["set", "survivor", "v1"]);
        if watch.lines.recv_timeout(Duration::from_millis(300)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "watch never reported anything");
    }

    server.restart();
    let j = watch.next_json_after_pings(|j| j["operation"] == "SET" && j["synthesized"] == false);
    assert_eq!(j["operation"], "DELETE", "{j}");
    assert_eq!(j["synthesized"], true, "{j}");

    // Live again on the new server.
    server.run(&["set", "survivor", "v2"]);
    let j = watch.next_json();
    assert_eq!(j["operation"], "SET");
    assert_eq!(j["value"], "v2");
    assert_eq!(j["synthesized"], false);
    watch.signal("INT");
    let (code, err) = watch.finish();
    assert_eq!(code, Some(0), "stderr: {err}");
    assert!(
        err.contains("reconnect"),
        "the watch says it reconnected: {err:?}"
    );
}
