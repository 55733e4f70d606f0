//! `get`, `set`, `del`, `vdel` and `keys`: values, conditions, expiry, fencing, output and errors.

use super::*;

#[test]
fn set_get_del_with_exit_codes() {
    let server = Server::start();

    let out = server.run(&["set", "greeting", "hello world"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let line = stdout(&out);
    let version = line.trim().strip_prefix("OK ").expect("OK <version>");
    assert!(is_hlc(version), "{line:?}");

    let out = server.run(&["get", "greeting"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), "hello world\n");

    let out = server.run(&["get", "missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "mqkv: missing: not found\n");

    let out = server.run(&["del", "greeting"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("DELETED "));
    let out = server.run(&["del", "greeting"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "NOT FOUND\n");
    assert_eq!(server.run(&["get", "greeting"]).status.code(), Some(1));
}

/// The extensions: `set --if-version`, `del --if-version` and `get K1 K2 ...` (MGET).
#[test]
fn compare_and_set_and_reading_many_keys() {
    let server = Server::start();
    let ok = |out: &Output| {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        stdout(out)
            .trim()
            .strip_prefix("OK ")
            .expect("OK <version>")
            .to_owned()
    };
    let v1 = ok(&server.run(&["set", "config", "a"]));
    let v2 = ok(&server.run(&["set", "config", "b", "--if-version", &v1]));
    // A stale version: not applied (status 2), with the current version.
    let out = server.run(&["set", "config", "c", "--if-version", &v1]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("NOT APPLIED {v2}\n"));
    let out = server.run(&["del", "config", "--if-version", &v1]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("NOT APPLIED {v2}\n"));
    ok(&server.run(&["set", "other", "x"]));
    // Several keys: one line each, KEY VALUE; a missing one on standard error, status 1.
    let out = server.run(&["get", "config", "other"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "config b\nother x\n");
    let out = server.run(&["get", "config", "missing", "other"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "config b\nother x\n");
    assert_eq!(stderr(&out), "mqkv: missing: not found\n");
    let out = server.run(&["get", "--json", "config", "missing"]);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines[0]["version"], v2.as_str());
    assert_eq!(lines[1]["found"], false);
    let out = server.run(&["del", "config", "--if-version", &v2]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Not an HLC: refused by the command line itself.
    let out = server.run(&["set", "config", "d", "--if-version", "yesterday"]);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn conditions_and_expiry() {
    let server = Server::start();
    assert_eq!(
        server.run(&["set", "k", "a", "--nx"]).status.code(),
        Some(0)
    );
    let out = server.run(&["set", "k", "b", "--nx"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "NX on an existing key is not applied"
    );
    assert!(stdout(&out).starts_with("NOT APPLIED"));
    assert_eq!(
        server.run(&["set", "k", "a", "--nex"]).status.code(),
        Some(0)
    );
    assert_eq!(
        server.run(&["set", "k", "c", "--nex"]).status.code(),
        Some(2)
    );
    assert_eq!(stdout(&server.run(&["get", "k"])), "a\n");

    assert_eq!(
        server
            .run(&["set", "short", "v", "--px", "300"])
            .status
            .code(),
        Some(0)
    );
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(server.run(&["get", "short"]).status.code(), Some(1));

    assert_eq!(server.run(&["vdel", "k", "other"]).status.code(), Some(2));
    assert_eq!(server.run(&["vdel", "k", "a"]).status.code(), Some(0));
    assert_eq!(server.run(&["vdel", "k", "a"]).status.code(), Some(1));
}

#[test]
fn values_from_files_and_stdin_binary_shown_safely() {
    let server = Server::start();
    let dir = temp_dir("values");
    let file = dir.join("value.bin");
    std::fs::write(&file, b"\x00\x01binary\xff").unwrap();

    let file_arg = file.to_string_lossy().into_owned();
    assert_eq!(
        server
            .run(&["set", "bin", "--file", &file_arg])
            .status
            .code(),
        Some(0)
    );
    // Not printable: hex by default, bytes exactly with --raw.
    assert_eq!(stdout(&server.run(&["get", "bin"])), "000162696e617279ff\n");
    assert_eq!(
        server.run(&["get", "bin", "--raw"]).stdout,
        b"\x00\x01binary\xff"
    );
    let j = json(&server.run(&["get", "bin", "--json"]));
    assert_eq!(j["value"]["hex"], "000162696e617279ff");

    let out = server.run_with_stdin(&["set", "multi", "-"], b"line one\nline two\n");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        server.run(&["get", "multi", "--raw"]).stdout,
        b"line one\nline two\n"
    );
    assert_eq!(
        stdout(&server.run(&["get", "multi", "--hex"])),
        "6c696e65206f6e650a6c696e652074776f0a\n"
    );

    // `--file -` is standard input too.
    let out = server.run_with_stdin(&["set", "piped", "--file", "-"], b"\x00from stdin");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        server.run(&["get", "piped", "--raw"]).stdout,
        b"\x00from stdin"
    );

    // A value that looks like a flag is still a value.
    assert_eq!(server.run(&["set", "neg", "-5"]).status.code(), Some(0));
    assert_eq!(stdout(&server.run(&["get", "neg"])), "-5\n");

    // VDEL reads its value the same ways.
    let out = server.run(&["vdel", "bin", "--file", &file_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_output_on_every_command() {
    let server = Server::start();
    let j = json(&server.run(&["set", "j", "v", "--json"]));
    assert_eq!(j["applied"], true);
    assert_eq!(j["key"], "j");
    let version = j["version"].as_str().expect("version").to_owned();
    assert!(is_hlc(&version));

    let j = json(&server.run(&["get", "j", "--json"]));
    assert_eq!(j["found"], true);
    assert_eq!(j["value"], "v");
    assert_eq!(j["version"], version.as_str());

    let out = server.run(&["set", "j", "w", "--nx", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let j = json(&out);
    assert_eq!(j["applied"], false);
    assert_eq!(j["version"], version.as_str(), "the stored version");

    let j = json(&server.run(&["keys", "--json"]));
    assert_eq!(j["keys"], serde_json::json!(["j"]));
    assert_eq!(j["pattern"], "*");

    let out = server.run(&["vdel", "j", "x", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["result"], "value_mismatch");
    let j = json(&server.run(&["del", "j", "--json"]));
    assert_eq!(j["deleted"], true);
    let out = server.run(&["get", "j", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["found"], false);
}

#[test]
fn keys_lists_matching_keys() {
    let server = Server::start();
    for key in ["sensor/1", "sensor/2", "sensor/10", "actuator/1"] {
        assert_eq!(server.run(&["set", key, "v"]).status.code(), Some(0));
    }
    let out = server.run(&["keys", "sensor/?"]);
    assert_eq!(out.status.code(), Some(0));
    let mut keys: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    keys.sort();
    assert_eq!(keys, ["sensor/1", "sensor/2"]);
    let out = server.run(&["keys"]);
    assert_eq!(stdout(&out).lines().count(), 4);
    let out = server.run(&["keys", "nothing*"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
}

#[test]
fn fencing_tokens_from_the_command_line() {
    let server = Server::start();
    let token = "001000000000000:00000:ops";
    let out = server.run(&["set", "fenced", "1", "--fencing-token", token]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = server.run(&["set", "fenced", "2"]);
    assert_one_line_error(&out, "a fencing token is required for this request");
    let out = server.run(&[
        "del",
        "fenced",
        "--fencing-token",
        "000000000000000:00000:old",
    ]);
    assert_one_line_error(&out, "lower version");
    let out = server.run(&["del", "fenced", "--fencing-token", token]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn errors_are_one_line_with_status_3() {
    let server = Server::start();
    // Nothing listens on the port of a listener that was just closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = server
        .cmd(&["get", "k", "--port", &port.to_string()])
        .output()
        .unwrap();
    assert_one_line_error(&out, &format!("cannot connect to 127.0.0.1:{port}"));

    assert_one_line_error(&server.run(&["get"]), "required");
    assert_one_line_error(&server.run(&["frobnicate"]), "frobnicate");
    assert_one_line_error(&server.run(&["set", "k", "v", "--px", "0"]), "--px");
    assert_one_line_error(&server.run(&["set", "k", "v", "--nx", "--nex"]), "--nex");
    assert_one_line_error(
        &server.run(&["set", "k", "v", "--fencing-token", "nonsense"]),
        "--fencing-token",
    );
    assert_one_line_error(&server.run(&["set", "", "v"]), "must not be empty");
    assert_one_line_error(
        &server.run(&["set", "k", "--file", "/no/such/file"]),
        "/no/such/file",
    );
    assert_one_line_error(&server.run(&["get", "k", "--password", "p"]), "--username");
    assert_one_line_error(
        &server.run(&["get", "k", "--client-id", "a/b"]),
        "client id",
    );

    let help = server.run(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let help = stdout(&help);
    for needle in [
        "Exit codes",
        "0  found / applied",
        "1  not found",
        "2  not applied",
        "3  error",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}");
    }
    let get_help = stdout(&server.run(&["get", "--help"]));
    assert!(get_help.contains("Exit codes") && get_help.contains("MQKV_HOST"));
}

#[test]
fn environment_variables_configure_the_connection() {
    let server = Server::start();
    // MQKV_PORT comes from the environment in every test; MQKV_CLIENT_ID
    // shows up as the lock holder.
    let out = server
        .cmd(&["lock", "env-lock", "--", "true"])
        .env("MQKV_CLIENT_ID", "from-env")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let holder = server
        .cmd(&["set", "env-lock", "x", "--nx"])
        .env("MQKV_CLIENT_ID", "other")
        .output()
        .unwrap();
    assert_eq!(
        holder.status.code(),
        Some(0),
        "the lock was released after the command"
    );

    let out = server
        .cmd(&["get", "k"])
        .env("MQKV_HOST", "127.0.0.1")
        .env("MQKV_PORT", "1")
        .output()
        .unwrap();
    assert_one_line_error(&out, "127.0.0.1:1");
}
