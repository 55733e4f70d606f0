//! A real `mqkv serve` process on an ephemeral port, for integration tests.

#![allow(dead_code)]

pub mod cluster;
pub mod store;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct ServerProcess {
    child: Child,
    pub port: u16,
}

impl ServerProcess {
    /// Starts `mqkv serve --listen 127.0.0.1:0 --storage memory` with extra flags and waits for
    /// its port.
    pub fn start(extra: &[&str]) -> ServerProcess {
        let mut args = vec!["--listen", "127.0.0.1:0", "--storage", "memory"];
        args.extend_from_slice(extra);
        Self::spawn(&args)
    }

    /// Starts a durable server on `dir`, listening on `listen` (e.g. `127.0.0.1:0`).
    pub fn start_disk(dir: &std::path::Path, listen: &str, extra: &[&str]) -> ServerProcess {
        let dir = dir.to_str().expect("utf-8 path");
        let mut args = vec!["--listen", listen, "--storage", "disk", "--data-dir", dir];
        args.extend_from_slice(extra);
        Self::spawn(&args)
    }

    /// Starts `mqkv serve` with exactly these arguments and waits for its first listener.
    pub fn start_args(args: &[&str]) -> ServerProcess {
        Self::spawn(args)
    }

    fn spawn(args: &[&str]) -> ServerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mqkv"))
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mqkv");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read port line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        ServerProcess { child, port }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits for the process; returns its exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("wait")
    }

    /// SIGKILL: the process dies at once, with no chance to save anything.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asserts the server process is still running.
    pub fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().expect("try_wait").is_none(),
            "server exited"
        );
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A fresh directory path under the system's temporary directory for test `name` (removed if
/// it was there; not created).
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mqkv-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Runs `mqkv serve` with `args`, which must refuse to start; returns what it printed on
/// standard error.
pub fn serve_refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mqkv"))
        .arg("serve")
        .args(args)
        .output()
        .expect("run");
    assert!(!out.status.success(), "mqkv serve {args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
