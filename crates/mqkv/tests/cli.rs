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

#[path = "cli/coordination.rs"]
mod coordination;
#[path = "cli/kv.rs"]
mod kv;
#[path = "cli/watch.rs"]
mod watch;
