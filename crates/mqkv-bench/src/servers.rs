//! Starting and stopping the servers under test: mqkv (memory or disk storage), Mosquitto and
//! Redis (no persistence, or `appendonly yes` with `appendfsync always`), each on a free
//! loopback port, plus installing the anchors from Debian packages when they are missing.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mqkv_testkit::free_port;
use serde::Serialize;

use crate::wire::{Certs, Dial, Wire, WS_PATH};

/// A server under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Target {
    /// mqkv, `--storage memory`.
    #[serde(rename = "mqkv")]
    Mqkv,
    /// mqkv, `--storage disk` in a temporary directory.
    #[serde(rename = "mqkv-disk")]
    MqkvDisk,
    /// mqkv, `--storage memory`, with a 100-rule authorization policy (see [`crate::policy`]).
    #[serde(rename = "mqkv-policy")]
    MqkvPolicy,
    #[serde(rename = "mosquitto")]
    Mosquitto,
    /// Redis without persistence.
    #[serde(rename = "redis")]
    Redis,
    /// Redis with `appendonly yes`, `appendfsync always`.
    #[serde(rename = "redis-aof")]
    RedisAof,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Mqkv => "mqkv",
            Target::MqkvDisk => "mqkv-disk",
            Target::MqkvPolicy => "mqkv-policy",
            Target::Mosquitto => "mosquitto",
            Target::Redis => "redis",
            Target::RedisAof => "redis-aof",
        }
    }

    pub fn is_anchor(self) -> bool {
        !matches!(self, Target::Mqkv | Target::MqkvDisk | Target::MqkvPolicy)
    }

    pub fn is_redis(self) -> bool {
        matches!(self, Target::Redis | Target::RedisAof)
    }
}

/// Where the server binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub mqkv: PathBuf,
    /// Extra arguments for `mqkv serve`.
    pub mqkv_args: Vec<String>,
    /// Certificates for TLS listeners.
    pub certs: Option<Certs>,
    pub mosquitto: Option<PathBuf>,
    pub redis: Option<PathBuf>,
}

impl Binaries {
    pub fn available(&self, target: Target) -> bool {
        match target {
            Target::Mqkv | Target::MqkvDisk | Target::MqkvPolicy => true,
            Target::Mosquitto => self.mosquitto.is_some(),
            Target::Redis | Target::RedisAof => self.redis.is_some(),
        }
    }
}

/// A running server; stopped (SIGTERM, then SIGKILL) and its directory removed on drop.
pub struct Server {
    pub target: Target,
    pub addr: SocketAddr,
    /// How clients reach `addr`.
    pub dial: Dial,
    child: Child,
    dir: PathBuf,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start(target: Target, bins: &Binaries, scratch: &Path) -> Result<Server> {
        Server::start_over(target, Wire::Tcp, None, bins, scratch)
    }

    /// Starts `target` with its listener of kind `wire` at [`Server::addr`]; TLS uses `certs`.
    pub fn start_over(
        target: Target,
        wire: Wire,
        certs: Option<&Certs>,
        bins: &Binaries,
        scratch: &Path,
    ) -> Result<Server> {
        let dir = unique_dir(scratch, target.name())?;
        let dial = Dial::new(wire, certs)?;
        let (child, addr) = match target {
            Target::Mqkv | Target::MqkvDisk | Target::MqkvPolicy => {
                start_mqkv(target, wire, certs, bins, &dir)?
            }
            Target::Mosquitto => {
                let bin = bins
                    .mosquitto
                    .as_ref()
                    .context("mosquitto is not installed")?;
                start_mosquitto(bin, wire, certs, &dir)?
            }
            Target::Redis | Target::RedisAof => {
                let bin = bins
                    .redis
                    .as_ref()
                    .context("redis-server is not installed")?;
                start_redis(target, bin, &dir)?
            }
        };
        let mut server = Server {
            target,
            addr,
            dial,
            child,
            dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited during start-up ({status}); see {}",
                    self.target.name(),
                    self.dir.join("server.log").display()
                );
            }
            if let Ok(mut s) =
                std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200))
            {
                if !self.target.is_redis() {
                    return Ok(());
                }
                // Redis answers PING only once it has loaded.
                s.set_read_timeout(Some(Duration::from_millis(500)))?;
                if s.write_all(b"PING\r\n").is_ok() {
                    let mut line = String::new();
                    if BufReader::new(&s).read_line(&mut line).is_ok() && line.starts_with("+PONG")
                    {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not start listening on {}",
                    self.target.name(),
                    self.addr
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory in bytes (`VmRSS` in `/proc/<pid>/status`).
    pub fn rss_bytes(&self) -> Result<u64> {
        rss_bytes(self.pid())
    }

    /// User plus system CPU time the server has used so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        process_cpu_seconds(self.pid()).unwrap_or(0.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling a child process this struct started and has not reaped.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique_dir(scratch: &Path, name: &str) -> Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch.join(format!("{name}-{n}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn log_file(dir: &Path) -> Result<std::fs::File> {
    Ok(std::fs::File::create(dir.join("server.log"))?)
}

fn start_mqkv(
    target: Target,
    wire: Wire,
    certs: Option<&Certs>,
    bins: &Binaries,
    dir: &Path,
) -> Result<(Child, SocketAddr)> {
    let bin = &bins.mqkv;
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0"]);
    match wire {
        Wire::Tcp => {}
        Wire::Ws => {
            cmd.args(["--listen-ws", "127.0.0.1:0", "--ws-path", WS_PATH]);
        }
        Wire::Tls => {
            let certs = certs.context("TLS without certificates")?;
            cmd.args(["--listen-tls", "127.0.0.1:0", "--tls-cert"])
                .arg(&certs.cert)
                .arg("--tls-key")
                .arg(&certs.key);
        }
    }
    if target == Target::MqkvDisk {
        cmd.args(["--storage", "disk", "--data-dir"])
            .arg(dir.join("data"));
    } else {
        cmd.args(["--storage", "memory", "--data-dir"])
            .arg(dir.join("data"));
    }
    if target == Target::MqkvPolicy {
        let policy = dir.join("policy.yaml");
        std::fs::write(&policy, crate::policy::yaml())?;
        cmd.arg("--policy").arg(policy);
    }
    cmd.args(&bins.mqkv_args);
    // Log warnings only, like the anchors' configurations below.
    cmd.env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file(dir)?);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut stdout = BufReader::new(stdout);
    // One line per listener: the plain TCP one first, then the one of `wire` as a URL.
    let scheme = match wire {
        Wire::Tcp => "",
        Wire::Tls => "tls://",
        Wire::Ws => "ws://",
    };
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            break None;
        }
        let found = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.strip_prefix(scheme))
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse::<SocketAddr>().ok());
        if found.is_some() {
            break found;
        }
    };
    match addr {
        Some(addr) => Ok((child, addr)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "mqkv did not print its address (got {line:?}); see {}",
                dir.join("server.log").display()
            )
        }
    }
}

/// The Mosquitto configuration used: anonymous, no persistence, no logging, Nagle off (as mqkv
/// does), and no limit on queued messages. With a finite limit (the default 1,000, or 10,000)
/// Mosquitto 2.0.11 stops delivering to the single QoS 1 subscriber of the fan-in workload
/// after about 100,000 messages from 64 or more publishers, although at most one message per
/// publisher is ever outstanding; without the limit it does not.
pub fn mosquitto_config(port: u16) -> String {
    mosquitto_config_over(port, "")
}

/// [`mosquitto_config`] with `listener_options` (TLS files, `protocol websockets`) for the
/// listener.
pub fn mosquitto_config_over(port: u16, listener_options: &str) -> String {
    format!(
        "listener {port} 127.0.0.1\n\
         {listener_options}\
         allow_anonymous true\n\
         persistence false\n\
         log_dest none\n\
         set_tcp_nodelay true\n\
         max_queued_messages 0\n"
    )
}

fn start_mosquitto(
    bin: &Path,
    wire: Wire,
    certs: Option<&Certs>,
    dir: &Path,
) -> Result<(Child, SocketAddr)> {
    let port = free_port();
    let conf = dir.join("mosquitto.conf");
    let options = match wire {
        Wire::Tcp => String::new(),
        // Mosquitto 2.0.11 refuses to start with only WebSocket listeners ("Unable to start
        // any listening sockets"): a plain one on another port comes along, unused.
        Wire::Ws => format!("protocol websockets\nlistener {} 127.0.0.1\n", free_port()),
        Wire::Tls => {
            let certs = certs.context("TLS without certificates")?;
            format!(
                "certfile {}\nkeyfile {}\n",
                certs.cert.display(),
                certs.key.display()
            )
        }
    };
    std::fs::write(&conf, mosquitto_config_over(port, &options))?;
    let child = Command::new(bin)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(dir)?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((child, SocketAddr::from(([127, 0, 0, 1], port))))
}

/// The Redis command-line options used, apart from port and directory.
pub fn redis_options(target: Target) -> Vec<&'static str> {
    let mut opts = vec![
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "no",
        "--save",
        "",
        "--loglevel",
        "warning",
        "--daemonize",
        "no",
    ];
    if target == Target::RedisAof {
        opts.extend(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        opts.extend(["--appendonly", "no"]);
    }
    opts
}

fn start_redis(target: Target, bin: &Path, dir: &Path) -> Result<(Child, SocketAddr)> {
    let port = free_port();
    let child = Command::new(bin)
        .arg("--port")
        .arg(port.to_string())
        .arg("--dir")
        .arg(dir)
        .args(redis_options(target))
        .stdin(Stdio::null())
        .stdout(log_file(dir)?)
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((child, SocketAddr::from(([127, 0, 0, 1], port))))
}

pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("VmRSS:") {
            let kib: u64 = rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .context("VmRSS")?;
            return Ok(kib * 1024);
        }
    }
    bail!("no VmRSS for pid {pid}")
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let utime: f64 = fields
        .get(11)
        .and_then(|v| v.parse().ok())
        .context("utime")?;
    let stime: f64 = fields
        .get(12)
        .and_then(|v| v.parse().ok())
        .context("stime")?;
    Ok((utime + stime) / clock_ticks())
}

/// CPU time of this process (all threads), in seconds.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

/// Finds an executable by name on PATH or in the sbin directories Debian packages use.
pub fn find_executable(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in [
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
        "/usr/local/sbin",
        "/usr/local/bin",
    ] {
        dirs.push(PathBuf::from(d));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// The mqkv server: `--server-bin`, else `MQKV_BIN`, else `mqkv` next to this executable, else
/// on PATH.
pub fn find_mqkv(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("MQKV_BIN") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let sibling = dir.join("mqkv");
            if sibling.is_file() {
                return Ok(sibling);
            }
        }
    }
    find_executable("mqkv").context(
        "mqkv server binary not found: build it (cargo build --release -p mqkv) or pass --server-bin",
    )
}

/// Makes sure Mosquitto and Redis are installed, installing the Debian packages if not.
/// Returns the binaries found and, for each anchor that stays unavailable, why.
pub fn ensure_anchors(
    install: bool,
    log: &Path,
) -> (Option<PathBuf>, Option<PathBuf>, Vec<String>) {
    let mut notes = Vec::new();
    let mut mosquitto = find_executable("mosquitto");
    let mut redis = find_executable("redis-server");
    if (mosquitto.is_none() || redis.is_none()) && install {
        let mut packages = Vec::new();
        if mosquitto.is_none() {
            packages.push("mosquitto");
        }
        if redis.is_none() {
            packages.push("redis-server");
        }
        eprintln!("installing {} (apt-get)...", packages.join(" "));
        match apt_install(&packages, log) {
            Ok(()) => {}
            Err(e) => notes.push(format!("apt-get install {}: {e:#}", packages.join(" "))),
        }
        mosquitto = find_executable("mosquitto");
        redis = find_executable("redis-server");
    }
    if mosquitto.is_none() {
        notes.push(if install {
            "mosquitto unavailable: could not be installed (see notes); pub/sub anchors skipped"
                .to_owned()
        } else {
            "mosquitto not installed and --no-install given; pub/sub anchors skipped".to_owned()
        });
    }
    if redis.is_none() {
        notes.push(if install {
            "redis-server unavailable: could not be installed (see notes); SET/GET anchors skipped"
                .to_owned()
        } else {
            "redis-server not installed and --no-install given; SET/GET anchors skipped".to_owned()
        });
    }
    (mosquitto, redis, notes)
}

pub(crate) fn apt_install(packages: &[&str], log: &Path) -> Result<()> {
    let is_root = unsafe { libc::geteuid() } == 0;
    let prefix: Vec<&str> = if is_root {
        vec![]
    } else if find_executable("sudo").is_some() {
        vec!["sudo", "-n"]
    } else {
        bail!("not root and no sudo");
    };
    let run = |args: &[&str]| -> Result<bool> {
        let mut all: Vec<&str> = prefix.clone();
        all.extend_from_slice(args);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let status = Command::new(all[0])
            .args(&all[1..])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .status()
            .with_context(|| format!("running {}", all.join(" ")))?;
        Ok(status.success())
    };
    let mut install: Vec<&str> = vec!["apt-get", "install", "-y", "-q", "--no-install-recommends"];
    install.extend_from_slice(packages);
    if run(&install)? {
        return Ok(());
    }
    if !run(&["apt-get", "update", "-q"])? {
        bail!("apt-get update failed; see {}", log.display());
    }
    if run(&install)? {
        Ok(())
    } else {
        bail!("apt-get install failed; see {}", log.display())
    }
}

/// First line of `bin --version`-style output, for the record.
pub fn version_of(bin: &Path, arg: &str) -> Option<String> {
    let out = Command::new(bin)
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
}
