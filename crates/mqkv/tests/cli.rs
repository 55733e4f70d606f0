//! The `mqkv` state store commands, run as a user would: the built binary
//! against a real `mqkv serve` process, one server per test.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

const MQKV: &str = env!("CARGO_BIN_EXE_mqkv");
/// Generous: the machine running the tests may be busy.
const WAIT: Duration = Duration::from_secs(20);

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start() -> Server {
        Server::start_on("127.0.0.1:0").expect("server starts")
    }

    fn start_on(addr: &str) -> Option<Server> {
        let mut child = Command::new(MQKV)
            .args(["serve", "--listen", addr, "--storage", "memory"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mqkv serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok());
        match port {
            Some(port) => Some(Server { child, port }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }

    /// Kills the server (SIGKILL) and starts a fresh one on the same port.
    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let addr = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(server) = Server::start_on(&addr) {
                *self = server;
                return;
            }
            assert!(Instant::now() < deadline, "cannot listen on {addr} again");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `mqkv ARGS...` against this server.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(MQKV);
        cmd.args(args)
            .env("MQKV_PORT", self.port.to_string())
            .env_remove("MQKV_HOST")
            .env_remove("MQKV_CLIENT_ID")
            .env_remove("MQKV_USERNAME")
            .env_remove("MQKV_PASSWORD")
            .env("RUST_LOG", "warn");
        cmd
    }

    /// Runs `mqkv ARGS...` to completion.
    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run mqkv")
    }

    fn run_with_stdin(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mqkv");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write stdin");
        child.wait_with_output().expect("wait mqkv")
    }

    /// Starts a long-running `mqkv ARGS...` whose output lines can be read.
    fn spawn(&self, args: &[&str]) -> Running {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mqkv");
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running { child, lines: rx }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(WAIT)
            .expect("a line of output in time")
    }

    fn next_json(&self) -> Value {
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
    }

    /// The next line that is not one of the pings a watch test sent while waiting for the
    /// watch to start (`ping` tells them apart); pings may still be arriving.
    fn next_line_after_pings(&self, ping: impl Fn(&str) -> bool) -> String {
        loop {
            let line = self.next_line();
            if !ping(&line) {
                return line;
            }
        }
    }

    /// As [`Running::next_line_after_pings`], for JSON lines.
    fn next_json_after_pings(&self, ping: impl Fn(&Value) -> bool) -> Value {
        loop {
            let j = self.next_json();
            if !ping(&j) {
                return j;
            }
        }
    }

    /// Reads lines until one satisfies `want`.
    fn wait_for_line(&self, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("the expected line in time");
            if want(&line) {
                return line;
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    /// Waits for exit; returns the exit code and standard error.
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "mqkv did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        (status.code(), stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("not JSON: {:?}: {e}", stdout(output)))
}

/// An error is exactly one line on standard error, starting with `mqkv: `,
/// with status 3 and no trace of a panic.
fn assert_one_line_error(output: &Output, contains: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(3), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("mqkv: "), "{err:?}");
    assert!(
        err.contains(contains),
        "{err:?} should mention {contains:?}"
    );
    assert!(!err.contains("panicked"), "{err:?}");
}

fn temp_dir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("mqkv-cli-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn is_hlc(text: &str) -> bool {
    let parts: Vec<&str> = text.split(':').collect();
    parts.len() == 3
        && parts[0].len() >= 15
        && parts[0].bytes().all(|b| b.is_ascii_digit())
        && parts[1].bytes().all(|b| b.is_ascii_digit())
}

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
