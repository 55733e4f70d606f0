//! A real `mqkv serve` process per test, and clients connected to it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mqkv_client::{Client, ClientOptions};

/// Generous: the machine running the tests may be busy.
pub const WAIT: Duration = Duration::from_secs(20);

/// The `mqkv` binary: `$MQKV_BIN`, else the workspace's debug build.
pub fn mqkv_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("MQKV_BIN") {
        return PathBuf::from(bin);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let bin = target.join("debug").join("mqkv");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build -p mqkv) or set MQKV_BIN",
        bin.display()
    );
    bin
}

pub struct Server {
    child: Child,
    pub port: u16,
    /// The data directory of a durable server (`--storage disk`).
    data_dir: Option<PathBuf>,
    /// The flags it was started with beyond the listener and the storage.
    flags: Vec<String>,
}

impl Server {
    /// `mqkv serve --listen 127.0.0.1:0`.
    pub fn start() -> Server {
        Server::start_on("127.0.0.1:0")
    }

    /// `mqkv serve --listen <addr>`; waits for the `listening on` line.
    pub fn start_on(addr: &str) -> Server {
        Server::start_with(addr, None, &[])
    }

    /// `mqkv serve --listen 127.0.0.1:0` with more flags.
    pub fn start_flags(flags: &[&str]) -> Server {
        Server::start_with("127.0.0.1:0", None, flags)
    }

    /// A server that keeps its data in `dir` (`--storage disk`), so a restart keeps it too.
    pub fn start_durable(dir: &std::path::Path) -> Server {
        Server::start_with("127.0.0.1:0", Some(dir.to_path_buf()), &[])
    }

    fn start_with(addr: &str, data_dir: Option<PathBuf>, flags: &[&str]) -> Server {
        let mut command = Command::new(mqkv_bin());
        command.args(["serve", "--listen", addr]).args(flags);
        match &data_dir {
            Some(dir) => command.args(["--storage", "disk", "--data-dir"]).arg(dir),
            None => command.args(["--storage", "memory"]),
        };
        let mut child = command
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mqkv serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        let port = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Server {
            child,
            port,
            data_dir,
            flags: flags.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server and starts a new one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let addr = format!("127.0.0.1:{}", self.port);
        let data_dir = self.data_dir.clone();
        let flags = self.flags.clone();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        // The port was just freed; give the bind a few tries.
        let mut last = None;
        for _ in 0..50 {
            match std::panic::catch_unwind(|| Server::start_with(&addr, data_dir.clone(), &flags)) {
                Ok(server) => {
                    *self = server;
                    return;
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        std::panic::resume_unwind(last.expect("at least one attempt"));
    }

    pub fn options(&self, client_id: &str) -> ClientOptions {
        ClientOptions::new("127.0.0.1", self.port)
            .client_id(client_id)
            .request_timeout(Duration::from_secs(10))
    }

    pub async fn client(&self, client_id: &str) -> Client {
        Client::connect(self.options(client_id))
            .await
            .expect("connect")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
