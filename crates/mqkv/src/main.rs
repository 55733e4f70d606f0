//! The `mqkv` command: `mqkv serve` runs the broker and state store; the
//! other subcommands (in `cli`) are state store clients.

mod alloc;
mod cli;
mod passwd;

/// mimalloc: fewer cycles per allocation than glibc's malloc on the request path, and
/// memory freed after a snapshot goes back to the system instead of staying resident.
#[global_allocator]
static ALLOCATOR: alloc::MiMalloc = alloc::MiMalloc;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mqkv_broker::QueueFullPolicy;
use mqkv_server::{ListenerConfig, ListenerKind, RaftThread, Server, ServerConfig, StorageKind};

#[derive(Parser)]
#[command(
    name = "mqkv",
    version,
    about = "An MQTT 5 broker with a built-in state store",
    after_help = cli::EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the broker and state store.
    Serve(ServeArgs),
    /// Add a user to a password file, change its password, or delete it (-D).
    Passwd(passwd::PasswdArgs),
    #[command(flatten)]
    Client(cli::ClientCommand),
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file; flags given here override it.
    #[arg(long, short = 'c', env = "MQKV_CONFIG")]
    config: Option<PathBuf>,
    /// Plain TCP listener address (repeatable). Default 127.0.0.1:1883. Port 0 picks a free
    /// port. A listener flag replaces the configuration file's listeners of its kind.
    #[arg(long = "listen", short = 'l', value_name = "ADDR")]
    listen: Vec<SocketAddr>,
    /// TLS listener address (repeatable); needs --tls-cert and --tls-key.
    #[arg(long = "listen-tls", value_name = "ADDR")]
    listen_tls: Vec<SocketAddr>,
    /// WebSocket listener address (repeatable).
    #[arg(long = "listen-ws", value_name = "ADDR")]
    listen_ws: Vec<SocketAddr>,
    /// WebSocket over TLS listener address (repeatable); needs --tls-cert and --tls-key.
    #[arg(long = "listen-wss", value_name = "ADDR")]
    listen_wss: Vec<SocketAddr>,
    /// Path of the WebSocket listeners given by flags (default /mqtt).
    #[arg(long, value_name = "PATH")]
    ws_path: Option<String>,
    /// A web page origin (https://app.example, or *) the WebSocket listeners given by flags
    /// trust besides their own; pages of other origins are then refused. Repeatable.
    #[arg(long = "ws-allowed-origin", value_name = "ORIGIN")]
    ws_allowed_origins: Vec<String>,
    /// TLS certificate chain, PEM (leaf first).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// TLS private key, PEM (PKCS#8, RSA or EC).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA bundle, PEM, that client certificates are verified against.
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Refuse TLS clients without a certificate the client CA bundle vouches for.
    #[arg(long)]
    tls_require_client_cert: bool,
    /// Certificate revocation lists, PEM, for client certificates (with --tls-client-ca).
    #[arg(long, value_name = "FILE")]
    tls_crl: Option<PathBuf>,
    /// The oldest TLS version clients may use: 1.2 (the default) or 1.3.
    #[arg(long, value_name = "VERSION")]
    tls_min_version: Option<mqkv_broker::transport::TlsVersion>,
    /// The password file clients log in against (`mqkv passwd FILE USER` makes one).
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// The authorization policy (YAML, AIO's BrokerAuthorization shape).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// How often the TLS files, the password file, the token keys and the policy are checked
    /// for changes, in milliseconds; changed files are read again as on SIGHUP (default
    /// 10000; 0: only on SIGHUP and `mqkv reload`).
    #[arg(long, value_name = "MS")]
    watch_interval_ms: Option<u64>,
    /// The HTTP listener for /metrics, /healthz and /readyz: ADDR:PORT, or off (default
    /// 127.0.0.1:9600, skipped with a warning when taken).
    #[arg(long, value_name = "ADDR:PORT|off")]
    http: Option<String>,
    /// Logs as text (default) or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", env = "MQKV_LOG_FORMAT")]
    log_format: LogFormat,
    /// Data directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Storage: `disk` (the data directory; default) or `memory` (nothing is kept after exit).
    #[arg(long, value_parser = parse_storage)]
    storage: Option<StorageKind>,
    /// Largest packet accepted from clients, in bytes.
    #[arg(long)]
    max_packet_size: Option<u32>,
    /// Unacknowledged QoS 2 publishes a client may have open towards the broker.
    #[arg(long)]
    receive_maximum: Option<u16>,
    /// Topic aliases a client may use towards the broker.
    #[arg(long)]
    topic_alias_maximum: Option<u16>,
    /// Largest keep alive accepted, in seconds (0: any).
    #[arg(long)]
    max_keep_alive: Option<u16>,
    /// Largest session expiry interval granted, in seconds.
    #[arg(long)]
    max_session_expiry: Option<u32>,
    /// Longest a packet may take to arrive once it began, in seconds, whatever the keep alive
    /// (default 60; 0: no limit).
    #[arg(long, value_name = "SECS")]
    packet_timeout_secs: Option<u32>,
    /// Most retained messages kept (default 100000); beyond, a retained publish gets 0x97.
    #[arg(long, value_name = "N")]
    max_retained_messages: Option<usize>,
    /// Most bytes of retained topics and payloads kept (default 256 MiB).
    #[arg(long, value_name = "N")]
    max_retained_bytes: Option<u64>,
    /// Most sessions, connected or kept (default 100000); beyond, CONNECT gets 0x97.
    #[arg(long, value_name = "N")]
    max_sessions: Option<usize>,
    /// Messages queued per session before --queue-full applies.
    #[arg(long)]
    max_queued_messages: Option<usize>,
    /// Bytes all session queues together may hold before --queue-full applies (default
    /// 256 MiB; 0: no limit).
    #[arg(long, value_name = "BYTES")]
    max_queued_bytes: Option<u64>,
    /// What a full session queue does: drop-new or drop-oldest.
    #[arg(long, value_parser = parse_queue_full)]
    queue_full: Option<QueueFullPolicy>,
    /// Allow clients without credentials on every listener (default: loopback listeners only).
    #[arg(long)]
    allow_anonymous: Option<bool>,
    /// State store: largest number of keys.
    #[arg(long)]
    max_keys: Option<u64>,
    /// State store: largest total of key and value bytes.
    #[arg(long)]
    max_bytes: Option<u64>,
    /// State store: most keys one connection may observe with KEYNOTIFY (default 10000).
    #[arg(long, value_name = "N")]
    max_observed_keys: Option<usize>,
    /// State store: most pattern watches (`KEYNOTIFY pattern`) one connection may have
    /// (default 16).
    #[arg(long, value_name = "N")]
    max_observed_patterns: Option<usize>,
    /// State store: write a snapshot once the log since the last one outgrows this many bytes
    /// and that snapshot (default 64 MiB).
    #[arg(long, value_name = "N")]
    snapshot_log_bytes: Option<u64>,
    /// Threads serving client connections (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Pin each connection thread to a CPU of its own (default: true; never when there are
    /// more threads than CPUs, or only one).
    #[arg(long, value_name = "BOOL")]
    pin_workers: Option<bool>,
    /// Run the connection threads under the kernel's batch scheduling policy, so a woken
    /// connection thread does not preempt the thread running on its CPU (default: true).
    #[arg(long, value_name = "BOOL")]
    batch_scheduling: Option<bool>,
    /// Thread of the state store's raft: `auto` (default: a connection thread's when they are
    /// pinned one to every CPU, else its own), `own`, or `shared`.
    #[arg(long, value_parser = parse_raft_thread, value_name = "auto|own|shared")]
    raft_thread: Option<RaftThread>,
    /// Write the log's appends with direct I/O through io_uring when raft shares a connection
    /// thread (default: true; the page cache and a sync thread where the system refuses it).
    #[arg(long, value_name = "BOOL")]
    direct_log_writes: Option<bool>,
    /// Move a connection to the connection thread whose publishers send it (nearly) all its
    /// messages (default: true).
    #[arg(long, value_name = "BOOL")]
    co_locate: Option<bool>,
    /// Cluster: this node's id (1 or more, unique in the group).
    #[arg(long, value_name = "ID", help_heading = "Cluster")]
    node_id: Option<u64>,
    /// Cluster: where this node listens for the other nodes.
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Cluster")]
    cluster_listen: Option<SocketAddr>,
    /// Cluster: a first member of the group as ID=HOST:PORT (repeatable; this node included).
    #[arg(long = "peer", value_name = "ID=HOST:PORT", value_parser = parse_peer, help_heading = "Cluster")]
    peers: Vec<(u64, String)>,
    /// Cluster: the address other nodes reach this one at (default: --cluster-listen).
    #[arg(long, value_name = "HOST:PORT", help_heading = "Cluster")]
    cluster_advertise: Option<String>,
    /// Cluster: start as no member, waiting for `mqkv cluster add-node` on a running group.
    #[arg(long, help_heading = "Cluster")]
    join: bool,
    /// Cluster: the secret all nodes share (needed unless every cluster address is loopback).
    #[arg(
        long,
        env = "MQKV_CLUSTER_SECRET",
        hide_env_values = true,
        help_heading = "Cluster"
    )]
    cluster_secret: Option<String>,
    /// Cluster: a file whose first line is the shared secret.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    cluster_secret_file: Option<PathBuf>,
    /// Cluster: this node's certificate chain (PEM) for TLS between the nodes; with
    /// --cluster-tls-key and --cluster-tls-ca every link is mutual TLS.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    cluster_tls_cert: Option<PathBuf>,
    /// Cluster: the private key (PEM) of --cluster-tls-cert.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    cluster_tls_key: Option<PathBuf>,
    /// Cluster: the CA certificates (PEM) every node's certificate must chain to.
    #[arg(long, value_name = "FILE", help_heading = "Cluster")]
    cluster_tls_ca: Option<PathBuf>,
    /// Cluster: longest a state store request waits for a leader with a quorum before it is
    /// answered with status 503 (default 3000).
    #[arg(long, value_name = "MS", help_heading = "Cluster")]
    quorum_wait_ms: Option<u64>,
    /// Cluster: most batches of writes this node has on their way to being committed at once;
    /// 1 waits for each before sending the next (default 1).
    #[arg(long, value_name = "N", help_heading = "Cluster")]
    pipeline_depth: Option<usize>,
    /// Cluster: accept `mqkv cluster isolate` from loopback clients, which makes this node act
    /// as if cut off from the nodes it names. For testing.
    #[arg(long, help_heading = "Cluster")]
    fault_injection: bool,
}

fn parse_peer(s: &str) -> Result<(u64, String), String> {
    mqkv_server::config::parse_peer(s)
}

fn parse_storage(s: &str) -> Result<StorageKind, String> {
    match s {
        "memory" => Ok(StorageKind::Memory),
        "disk" => Ok(StorageKind::Disk),
        other => Err(format!(
            "unknown storage '{other}' (expected: disk, memory)"
        )),
    }
}

fn parse_raft_thread(s: &str) -> Result<RaftThread, String> {
    match s {
        "auto" => Ok(RaftThread::Auto),
        "own" => Ok(RaftThread::Own),
        "shared" => Ok(RaftThread::Shared),
        other => Err(format!(
            "unknown raft thread '{other}' (expected: auto, own, shared)"
        )),
    }
}

fn parse_queue_full(s: &str) -> Result<QueueFullPolicy, String> {
    match s {
        "drop-new" => Ok(QueueFullPolicy::DropNew),
        "drop-oldest" => Ok(QueueFullPolicy::DropOldest),
        other => Err(format!(
            "unknown policy '{other}' (expected: drop-new, drop-oldest)"
        )),
    }
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<ServerConfig> {
        let mut c = match &self.config {
            Some(path) => ServerConfig::from_file(path)?,
            None => ServerConfig::default(),
        };
        if !self.ws_allowed_origins.is_empty()
            && self.listen_ws.is_empty()
            && self.listen_wss.is_empty()
        {
            anyhow::bail!("--ws-allowed-origin applies to the listeners of --listen-ws and --listen-wss; give one, or allowed_origins in a [[listeners]] table");
        }
        // A listener flag replaces the configuration file's listeners of its kind.
        if !self.listen.is_empty() {
            c.listen = self.listen;
            c.listeners.retain(|l| l.kind != ListenerKind::Tcp);
        }
        for (kind, addrs) in [
            (ListenerKind::Tls, self.listen_tls),
            (ListenerKind::Ws, self.listen_ws),
            (ListenerKind::Wss, self.listen_wss),
        ] {
            if addrs.is_empty() {
                continue;
            }
            let websocket = matches!(kind, ListenerKind::Ws | ListenerKind::Wss);
            let path = self.ws_path.clone().filter(|_| websocket);
            let origins =
                Some(self.ws_allowed_origins.clone()).filter(|o| websocket && !o.is_empty());
            c.listeners.retain(|l| l.kind != kind);
            c.listeners
                .extend(addrs.into_iter().map(|address| ListenerConfig {
                    kind,
                    address,
                    cert: None,
                    key: None,
                    client_ca: None,
                    require_client_cert: None,
                    crl: None,
                    min_version: None,
                    path: path.clone(),
                    allowed_origins: origins.clone(),
                    proxy_protocol: false,
                    forwarded_header: None,
                    proxy_from: None,
                }));
        }
        if let Some(v) = self.tls_cert {
            c.tls.cert = Some(v);
        }
        if let Some(v) = self.tls_key {
            c.tls.key = Some(v);
        }
        if let Some(v) = self.tls_client_ca {
            c.tls.client_ca = Some(v);
        }
        if self.tls_require_client_cert {
            c.tls.require_client_cert = true;
        }
        if let Some(v) = self.tls_crl {
            c.tls.crl = Some(v);
        }
        if let Some(v) = self.tls_min_version {
            c.tls.min_version = v;
        }
        if let Some(v) = self.password_file {
            c.password_file = Some(v);
        }
        if let Some(v) = self.policy {
            c.policy = Some(v);
        }
        if let Some(v) = self.watch_interval_ms {
            c.watch_interval_ms = v;
        }
        if let Some(v) = self.http {
            c.http = Some(v);
        }
        if let Some(v) = self.data_dir {
            c.data_dir = v;
        }
        if let Some(v) = self.storage {
            c.storage = v;
        }
        let b = &mut c.broker;
        if let Some(v) = self.max_packet_size {
            b.max_packet_size = v;
        }
        if let Some(v) = self.receive_maximum {
            b.receive_maximum = v;
        }
        if let Some(v) = self.topic_alias_maximum {
            b.topic_alias_maximum = v;
        }
        if let Some(v) = self.packet_timeout_secs {
            b.packet_timeout_secs = v;
        }
        if let Some(v) = self.max_retained_messages {
            b.max_retained_messages = v;
        }
        if let Some(v) = self.max_retained_bytes {
            b.max_retained_bytes = v;
        }
        if let Some(v) = self.max_sessions {
            b.max_sessions = v;
        }
        if let Some(v) = self.max_keep_alive {
            b.max_keep_alive = v;
        }
        if let Some(v) = self.max_session_expiry {
            b.max_session_expiry = v;
        }
        if let Some(v) = self.max_queued_messages {
            b.max_queued_messages = v;
        }
        if let Some(v) = self.max_queued_bytes {
            b.max_queued_bytes = v;
        }
        if let Some(v) = self.queue_full {
            b.queue_full = v;
        }
        if let Some(v) = self.allow_anonymous {
            b.allow_anonymous = Some(v);
        }
        if let Some(v) = self.max_keys {
            c.state_store.max_keys = Some(v);
        }
        if let Some(v) = self.workers {
            c.workers = Some(v);
        }
        if let Some(v) = self.pin_workers {
            c.pin_workers = v;
        }
        if let Some(v) = self.batch_scheduling {
            c.batch_scheduling = v;
        }
        if let Some(v) = self.raft_thread {
            c.raft_thread = v;
        }
        if let Some(v) = self.direct_log_writes {
            c.direct_log_writes = v;
        }
        if let Some(v) = self.co_locate {
            c.broker.co_locate = v;
        }
        if let Some(v) = self.max_bytes {
            c.state_store.max_bytes = Some(v);
        }
        if let Some(v) = self.max_observed_keys {
            c.state_store.max_observed_keys = v;
        }
        if let Some(v) = self.max_observed_patterns {
            c.state_store.max_observed_patterns = v;
        }
        if let Some(v) = self.snapshot_log_bytes {
            c.state_store.snapshot_log_bytes = v;
        }
        let cluster_flags = self.node_id.is_some()
            || self.cluster_listen.is_some()
            || !self.peers.is_empty()
            || self.cluster_advertise.is_some()
            || self.join
            || self.cluster_secret.is_some()
            || self.cluster_secret_file.is_some()
            || self.cluster_tls_cert.is_some()
            || self.cluster_tls_key.is_some()
            || self.cluster_tls_ca.is_some()
            || self.quorum_wait_ms.is_some()
            || self.pipeline_depth.is_some()
            || self.fault_injection;
        if cluster_flags {
            let mut cluster = match c.cluster.take() {
                Some(cluster) => cluster,
                None => {
                    let (Some(node_id), Some(listen)) = (self.node_id, self.cluster_listen) else {
                        anyhow::bail!("a cluster node needs --node-id and --cluster-listen");
                    };
                    mqkv_server::ClusterConfig {
                        node_id,
                        listen,
                        peers: Vec::new(),
                        advertise: None,
                        join: false,
                        secret: None,
                        secret_file: None,
                        tls_cert: None,
                        tls_key: None,
                        tls_ca: None,
                        quorum_wait_ms: 3_000,
                        pipeline_depth: mqkv_server::DEFAULT_PIPELINE_DEPTH,
                        fault_injection: false,
                    }
                }
            };
            if let Some(v) = self.node_id {
                cluster.node_id = v;
            }
            if let Some(v) = self.cluster_listen {
                cluster.listen = v;
            }
            if !self.peers.is_empty() {
                cluster.peers = self
                    .peers
                    .iter()
                    .map(|(id, addr)| format!("{id}={addr}"))
                    .collect();
            }
            if let Some(v) = self.cluster_advertise {
                cluster.advertise = Some(v);
            }
            if self.join {
                cluster.join = true;
            }
            if let Some(v) = self.cluster_secret {
                cluster.secret = Some(v);
                cluster.secret_file = None;
            }
            if let Some(v) = self.cluster_secret_file {
                cluster.secret_file = Some(v);
                cluster.secret = None;
            }
            if let Some(v) = self.cluster_tls_cert {
                cluster.tls_cert = Some(v);
            }
            if let Some(v) = self.cluster_tls_key {
                cluster.tls_key = Some(v);
            }
            if let Some(v) = self.cluster_tls_ca {
                cluster.tls_ca = Some(v);
            }
            if let Some(v) = self.quorum_wait_ms {
                cluster.quorum_wait_ms = v;
            }
            if let Some(v) = self.pipeline_depth {
                cluster.pipeline_depth = v;
            }
            if self.fault_injection {
                cluster.fault_injection = true;
            }
            c.cluster = Some(cluster);
        }
        Ok(c)
    }
}

/// Gives the memory the calling thread freed back to the system now. mimalloc returns freed
/// memory lazily, as the thread that freed it goes on allocating; the thread that writes a
/// snapshot then sleeps, and the memory the snapshot went through (its buffer and the state
/// file's page buffers) would stay resident until the next one. Returning memory eagerly
/// everywhere instead (`MIMALLOC_PURGE_DELAY=0`) cost a third of the throughput of 64 KiB
/// SETs.
fn release_freed_memory() {
    // SAFETY: `mi_collect` takes no pointers; it only tidies the calling thread's heap.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// Sends logs to standard error, as text or (`json`) one JSON object per line.
fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

fn main() {
    let cli = Cli::try_parse().unwrap_or_else(|e| cli::exit_on_parse_error(e));
    init_logs(matches!(&cli.command, Command::Serve(args) if args.log_format == LogFormat::Json));
    alloc::without_transparent_huge_pages();
    mqkv_server::set_after_snapshot(release_freed_memory);
    mqkv_broker::set_release_freed_memory(release_freed_memory);
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Passwd(args) => passwd::run(args),
        Command::Client(command) => std::process::exit(cli::run(command)),
    };
    if let Err(e) = result {
        eprintln!("mqkv: {e:#}");
        std::process::exit(1);
    }
}

/// Most connection worker threads `workers` may ask for.
const MAX_WORKERS: usize = 1024;

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.into_config()?;
    if let Some(n) = config.workers.filter(|n| !(1..=MAX_WORKERS).contains(n)) {
        anyhow::bail!("workers must be between 1 and {MAX_WORKERS}, not {n}")
    }
    // Connections are accepted and served by the broker's own threads (`workers` of them);
    // this runtime only runs the housekeeping: timers, saving, signals.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.spawn(mqkv_broker::release_freed_memory_periodically());
    rt.block_on(async move {
        // Handlers first: a signal that arrives as soon as the listeners are announced must
        // already mean "shut down gracefully", not the default "die".
        let signals = Signals::install()?;
        let server = Server::start(config).await?;
        {
            // One line per listener on standard output, so scripts and tests can find ports:
            // written at once, and a reader that stopped reading (a closed pipe) does not stop
            // the server.
            let mut text = String::new();
            for endpoint in &server.endpoints {
                text.push_str(&format!("listening on {endpoint}\n"));
            }
            if let Some(addr) = server.http_addr() {
                text.push_str(&format!("http on http://{addr} (dashboard, /metrics, /healthz, /readyz)\n"));
            }
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                tracing::warn!(error = %e, "cannot write the listening addresses to standard output");
            }
        }
        for endpoint in &server.endpoints {
            tracing::info!(%endpoint, "listening");
        }
        // Reading files and building TLS settings block: on a thread for blocking work.
        let reloader = server.reloader();
        signals
            .wait(move || {
                let reloader = reloader.clone();
                tokio::task::spawn_blocking(move || reloader.reload());
            })
            .await;
        tracing::info!("shutting down");
        server.shutdown().await;
        anyhow::Ok(())
    })
}

/// SIGINT and SIGTERM (stop) and SIGHUP (reload TLS files), installed before the server
/// starts.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Signals {})
        }
    }

    /// Waits for a signal to stop, calling `reload` on every SIGHUP meanwhile.
    async fn wait(mut self, reload: impl Fn()) {
        #[cfg(unix)]
        loop {
            tokio::select! {
                _ = self.term.recv() => break,
                _ = self.int.recv() => break,
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading the TLS files, the password file and the policy");
                    reload();
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = reload;
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
