//! Shared harness for the AIO SDK interop tests.
//!
//! Every test starts its own `mqkv serve --listen 127.0.0.1:0` ([`Server`]), connects one or
//! more SDK sessions to it ([`AioClient`]) and tears everything down at the end. The server
//! process is killed by `Drop`, so a failing assertion never leaves a server behind.
//!
//! This file is compiled into every test binary of both interop crates (`#[path]`), so it must
//! only use API that `azure_iot_operations_services` 1.3.0 and 1.5.0-beta1 have in common.

#![allow(dead_code)]

use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mqkv_testkit::free_port;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::control_packet::{
    DeliveryQoS, Publish, QoS, RetainOptions, SubscribeProperties, TopicFilter,
};
use azure_iot_operations_mqtt::session::{
    Session, SessionExitHandle, SessionManagedClient, SessionOptionsBuilder, SessionPubReceiver,
};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::state_store::{
    self, ErrorKind, KeyNotification, KeyObservation, Operation, ServiceError,
};

/// Request timeout handed to every SDK call.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Prefix of every key notification topic (wire-compat doc, section 4.1).
pub const NOTIFY_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/";

/// Path of the server binary: `$MQKV_BIN`, else `../../target/debug/mqkv` next to the crate.
pub fn mqkv_bin() -> PathBuf {
    match std::env::var_os("MQKV_BIN") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/mqkv"),
    }
}

/// A running `mqkv serve` process on a free loopback port, or, with `MQKV_INTEROP_CLUSTER` set
/// to `leader` or `follower`, a three-node cluster whose leader's or a follower's MQTT port is
/// [`Server::port`]. Killed on drop.
pub struct Server {
    children: Vec<Child>,
    pub port: u16,
    pub log_path: PathBuf,
    work_dir: PathBuf,
    /// Set for a server started with [`Server::start_tls`]: the files its clients use.
    pub tls: Option<ClientTls>,
    /// Set for a server started with [`Server::start_with_password`]: the user name and the
    /// file holding its password, as the SDK takes them.
    pub credentials: Option<(String, PathBuf)>,
    /// Set for a server started with [`Server::start_with_tokens`]: the token file the SDK
    /// reads (and watches).
    pub sat_file: Option<PathBuf>,
}

/// What an SDK client needs to reach a mutual TLS listener: the CA that signed the server's
/// certificate, and a client certificate and key that CA signed.
#[derive(Clone, Debug)]
pub struct ClientTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Runs `openssl` with the whitespace-separated `args` in `dir`, failing the test if it fails.
fn openssl(dir: &PathBuf, args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA, a server certificate for 127.0.0.1 and localhost, and a client certificate,
/// made in `dir` with the openssl command.
fn make_certs(dir: &PathBuf) {
    const EC: &str = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    openssl(
        dir,
        &format!("req -x509 {EC} -keyout ca.key -out ca.pem -days 2 -subj /CN=interop-CA"),
    );
    let extensions = [
        ("server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        ("client.ext", "extendedKeyUsage=clientAuth\n"),
    ];
    for (file, text) in extensions {
        std::fs::write(dir.join(file), text).expect("write extensions");
    }
    for (name, cn) in [("server", "localhost"), ("client", "interop-device")] {
        openssl(
            dir,
            &format!("req {EC} -keyout {name}.key -out {name}.csr -subj /CN={cn}"),
        );
        openssl(
            dir,
            &format!(
                "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                 -out {name}.pem -days 2 -extfile {name}.ext"
            ),
        );
    }
}

/// The server binary, the log file and a fresh working directory for the server of test
/// `name`: the binary resolved against the crate directory (cargo's working directory for
/// tests) before the server starts in a directory of its own, and the working directory fresh,
/// so that what a server keeps on disk is never shared between tests running in parallel.
fn prepare(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let bin = std::fs::canonicalize(mqkv_bin())
        .unwrap_or_else(|e| panic!("server binary {}: {e}", mqkv_bin().display()));
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let log_dir = tmp.join("mqkv-interop-logs");
    std::fs::create_dir_all(&log_dir).expect("create log dir");
    let log_path = log_dir.join(format!("{name}.log"));
    let work_dir = tmp
        .join("mqkv-interop-run")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work_dir);
    std::fs::create_dir_all(&work_dir).expect("create server work dir");
    (bin, log_path, work_dir)
}

impl Server {
    /// Starts the server (or cluster) and waits for its `listening on 127.0.0.1:PORT` line.
    /// `name` only names the server's log file (stderr) under the cargo target tmp dir.
    pub fn start(name: &str) -> Server {
        let (bin, log_path, work_dir) = prepare(name);
        let role = std::env::var("MQKV_INTEROP_CLUSTER")
            .ok()
            .filter(|r| !r.is_empty());
        let Some(role) = role else {
            let (child, port) = spawn(
                &bin,
                &["serve", "--listen", "127.0.0.1:0"],
                &work_dir,
                &log_path,
                "",
            );
            return Server {
                children: vec![child],
                port,
                log_path,
                work_dir,
                tls: None,
                credentials: None,
                sat_file: None,
            };
        };
        assert!(
            role == "leader" || role == "follower",
            "MQKV_INTEROP_CLUSTER is leader or follower, not {role:?}"
        );
        // The nodes' addresses are given to their peers before they start: `free_port` picks
        // them below the ephemeral range, so the port-0 listeners and outgoing connections of
        // tests running beside them cannot take one first.
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers: Vec<String> = cluster_ports
            .iter()
            .enumerate()
            .flat_map(|(i, p)| ["--peer".to_owned(), format!("{}=127.0.0.1:{p}", i + 1)])
            .collect();
        let mut children = Vec::new();
        let mut ports = Vec::new();
        for (i, cluster_port) in cluster_ports.iter().enumerate() {
            let id = (i + 1).to_string();
            let listen = format!("127.0.0.1:{cluster_port}");
            let data = format!("n{id}");
            let mut args = vec![
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--node-id",
                &id,
                "--cluster-listen",
                &listen,
                "--data-dir",
                &data,
            ];
            args.extend(peers.iter().map(String::as_str));
            let log = log_path.with_extension(format!("node{id}.log"));
            let (child, port) = spawn(&bin, &args, &work_dir, &log, "");
            children.push(child);
            ports.push(port);
        }
        let leader = wait_for_settled_leader(&bin, ports[0]);
        // Node ids are 1..=3; a follower is the node after the leader.
        let index = if role == "leader" {
            leader - 1
        } else {
            leader % 3
        };
        Server {
            children,
            port: ports[index],
            log_path,
            work_dir,
            tls: None,
            credentials: None,
            sat_file: None,
        }
    }

    /// Starts a single server whose [`Server::port`] is a TLS listener that requires a client
    /// certificate; the certificates are made for the test (see [`ClientTls`]).
    pub fn start_tls(name: &str) -> Server {
        let (bin, log_path, work_dir) = prepare(name);
        make_certs(&work_dir);
        let args = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--listen-tls",
            "127.0.0.1:0",
            "--tls-cert",
            "server.pem",
            "--tls-key",
            "server.key",
            "--tls-client-ca",
            "ca.pem",
            "--tls-require-client-cert",
        ];
        let (child, port) = spawn(&bin, &args, &work_dir, &log_path, "tls://");
        Server {
            children: vec![child],
            port,
            log_path,
            tls: Some(ClientTls {
                ca: work_dir.join("ca.pem"),
                cert: work_dir.join("client.pem"),
                key: work_dir.join("client.key"),
            }),
            credentials: None,
            sat_file: None,
            work_dir,
        }
    }

    /// Starts a single server that accepts only user `app` with the password it writes to a
    /// file for the SDK (`password_file`); the server's password file is made with
    /// `mqkv passwd`.
    pub fn start_with_password(name: &str) -> Server {
        let (bin, log_path, work_dir) = prepare(name);
        let password = "interop-s3cret";
        let mut passwd = Command::new(&bin)
            .args(["passwd", "passwords", "app", "--password-stdin"])
            .current_dir(&work_dir)
            .stdin(Stdio::piped())
            .spawn()
            .expect("run mqkv passwd");
        {
            use std::io::Write;
            let mut stdin = passwd.stdin.take().expect("stdin");
            writeln!(stdin, "{password}").expect("write the password");
        }
        assert!(passwd.wait().expect("mqkv passwd").success());
        std::fs::write(work_dir.join("app.password"), password).expect("write the SDK's file");
        // The listener is loopback, where anonymous clients are welcome unless told otherwise.
        let args = [
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--password-file",
            "passwords",
            "--allow-anonymous",
            "false",
        ];
        let (child, port) = spawn(&bin, &args, &work_dir, &log_path, "");
        Server {
            children: vec![child],
            port,
            log_path,
            tls: None,
            credentials: Some(("app".to_owned(), work_dir.join("app.password"))),
            sat_file: None,
            work_dir,
        }
    }

    /// Starts a single server that accepts only tokens signed by a key made for the test
    /// (RSA, with the openssl command), with audience `aio-internal`, and lets the service
    /// accounts of namespace `interop` use the state store through a policy. The SDK reads
    /// its token from [`Server::sat_file`], which starts with a token valid for `lifetime`
    /// ([`Server::write_token`] replaces it).
    pub fn start_with_tokens(name: &str, lifetime: Duration) -> Server {
        let (bin, log_path, work_dir) = prepare(name);
        openssl(&work_dir, "genrsa -out signer.key 2048");
        openssl(&work_dir, "rsa -in signer.key -pubout -out signer.pub");
        std::fs::write(
            work_dir.join("mqkv.toml"),
            "[tokens]\nkeys = [\"signer.pub\"]\naudiences = [\"aio-internal\"]\n",
        )
        .expect("write the configuration");
        let notify = format!("{NOTIFY_PREFIX}#");
        let policy = format!(
            "- principals:\n    attributes: [{{ namespace: interop }}]\n  brokerResources:\n    \
             - method: Connect\n    - method: Publish\n      topics: [\"statestore/#\"]\n    \
             - method: Subscribe\n      topics: [\"clients/{{principal.clientId}}/#\", \"{notify}\"]\n  \
             stateStoreResources:\n    - method: ReadWrite\n      keyType: Pattern\n      \
             keys: [\"{{principal.attributes.serviceaccount}}/*\"]\n"
        );
        std::fs::write(work_dir.join("policy.yaml"), policy).expect("write the policy");
        let args = [
            "serve",
            "-c",
            "mqkv.toml",
            "--listen",
            "127.0.0.1:0",
            "--policy",
            "policy.yaml",
            "--allow-anonymous",
            "false",
        ];
        let (child, port) = spawn(&bin, &args, &work_dir, &log_path, "");
        let server = Server {
            children: vec![child],
            port,
            log_path,
            tls: None,
            credentials: None,
            sat_file: Some(work_dir.join("token")),
            work_dir,
        };
        server.write_token("app", lifetime);
        server
    }

    /// Writes a new token for service account `account` of namespace `interop`, valid for
    /// `lifetime`, to [`Server::sat_file`].
    pub fn write_token(&self, account: &str, lifetime: Duration) {
        let path = self
            .sat_file
            .as_ref()
            .expect("a server started with tokens");
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            + lifetime.as_secs();
        let header = base64url(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = format!(
            r#"{{"iss":"interop","aud":["aio-internal"],"sub":"system:serviceaccount:interop:{account}","exp":{exp},"kubernetes.io":{{"namespace":"interop","serviceaccount":{{"name":"{account}"}}}}}}"#
        );
        let signing_input = format!("{header}.{}", base64url(claims.as_bytes()));
        std::fs::write(self.work_dir.join("signing-input"), &signing_input).expect("write");
        openssl(
            &self.work_dir,
            "dgst -sha256 -sign signer.key -out signature signing-input",
        );
        let signature = std::fs::read(self.work_dir.join("signature")).expect("signature");
        // Written whole, then moved into place, as Kubernetes updates a projected token.
        let fresh = self.work_dir.join("token.new");
        std::fs::write(&fresh, format!("{signing_input}.{}", base64url(&signature)))
            .expect("write the token");
        std::fs::rename(&fresh, path).expect("replace the token");
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

/// Base64url without padding, as JSON Web Tokens use it.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// Starts `bin` with `args` in `dir`, standard error to `log`; returns it with the port of its
/// first listener whose `listening on` line goes on with `scheme` (`""` for plain TCP,
/// `"tls://"`).
fn spawn(bin: &PathBuf, args: &[&str], dir: &PathBuf, log: &PathBuf, scheme: &str) -> (Child, u16) {
    let log_file = File::create(log).expect("create server log file");
    // Connection events (accepted, connected, refused, closed and why) go to the log too,
    // so a client that cannot connect leaves a trace of what the server saw.
    let log_filter = std::env::var("RUST_LOG")
        .unwrap_or_else(|_| "info,openraft=warn,mqkv_broker=debug".to_owned());
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env_remove("MQKV_CONFIG")
        .env("RUST_LOG", log_filter)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));

    // Read the first stdout line on a thread so a silent server cannot hang the test, then
    // keep draining stdout so the server can never block on a full pipe.
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let wanted = format!("listening on {scheme}");
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            if !matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                let _ = tx.send(line);
                return;
            }
            let rest = line.trim().strip_prefix(wanted.as_str()).unwrap_or("");
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                let _ = tx.send(line);
                break;
            }
        }
        let mut sink = [0u8; 4096];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    let line = rx.recv_timeout(Duration::from_secs(20)).ok();
    let port = line
        .as_deref()
        .map(str::trim)
        .and_then(|l| l.strip_prefix("listening on "))
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok());
    let Some(port) = port else {
        let _ = child.kill();
        let status = child.wait();
        let bytes = std::fs::read(log).unwrap_or_default();
        let tail = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(2000)..]);
        panic!(
            "{} did not print `listening on 127.0.0.1:PORT` within 20 s (first line: {line:?}, \
             status {status:?}); stderr tail:\n{tail}",
            bin.display()
        );
    };
    (child, port)
}

/// Asks node `port` for the cluster's status until it names a leader and every node follows it
/// (`mqkv cluster status --json`); returns the leader's id.
fn wait_for_settled_leader(bin: &PathBuf, port: u16) -> usize {
    let start = Instant::now();
    loop {
        let out = Command::new(bin)
            .args(["cluster", "status", "--json", "--port", &port.to_string()])
            .output()
            .expect("run mqkv cluster status");
        let text = String::from_utf8_lossy(&out.stdout);
        let leader = text
            .split("\"leader\":")
            .nth(1)
            .and_then(|rest| rest.split([',', '}']).next())
            .and_then(|n| n.trim().parse::<usize>().ok());
        let settled = text.matches("\"role\":\"leader\"").count() == 1
            && text.matches("\"role\":\"follower\"").count() == 2;
        if let (Some(leader), true, true) = (leader, settled, out.status.success()) {
            return leader;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the cluster did not settle within 20 s: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A server that is gone before we kill it crashed or quit during the test.
        let mut exited_early = None;
        for child in &mut self.children {
            if let Some(status) = child.try_wait().ok().flatten() {
                exited_early = Some(status);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.work_dir);
        if std::thread::panicking() {
            eprintln!("mqkv server log: {}", self.log_path.display());
        } else if let Some(status) = exited_early {
            panic!(
                "mqkv exited by itself during the test ({status}); log: {}",
                self.log_path.display()
            );
        }
    }
}

/// A client id that is unique per test, role and test process.
pub fn client_id(test: &str, role: &str) -> String {
    format!("{test}-{role}-{}", std::process::id())
}

/// Writes the SDK's own log (its `log` records: connect attempts and why they failed, retries)
/// to standard error, where the test harness keeps it and shows it for a failing test.
struct SdkLog;

impl SdkLog {
    fn install() {
        static LOGGER: SdkLog = SdkLog;
        // Every test of a binary shares the logger; only the first install takes.
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log::LevelFilter::Debug);
        }
    }
}

impl log::Log for SdkLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        let most = if metadata.target().starts_with("azure_iot_operations") {
            log::Level::Debug
        } else {
            log::Level::Warn
        };
        metadata.level() <= most
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            eprintln!(
                "[sdk {ms} {} {}] {}",
                record.level(),
                record.target(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// One SDK MQTT session with a state store client on it.
pub struct AioClient {
    pub id: String,
    pub state_store: Arc<state_store::Client>,
    pub managed: SessionManagedClient,
    /// Further state store clients on the same session (same MQTT client id), if asked for.
    pub extra: Vec<Arc<state_store::Client>>,
    exit: SessionExitHandle,
    session_task: tokio::task::JoinHandle<Result<(), String>>,
}

impl AioClient {
    /// Connects a new session with client id `id` to `server`, plain TCP, clean start.
    pub async fn connect(server: &Server, id: &str) -> AioClient {
        Self::connect_with_extra(server, id, 0).await
    }

    /// As [`AioClient::connect`], plus `extra` more state store clients sharing the session.
    pub async fn connect_with_extra(server: &Server, id: &str, extra: usize) -> AioClient {
        SdkLog::install();
        let mut settings = MqttConnectionSettingsBuilder::default()
            .client_id(id)
            .hostname("127.0.0.1")
            .tcp_port(server.port)
            .keep_alive(Duration::from_secs(30))
            .clean_start(true)
            .use_tls(server.tls.is_some());
        if let Some((user, file)) = &server.credentials {
            settings = settings
                .username(Some(user.clone()))
                .password_file(Some(file.display().to_string()));
        }
        if let Some(file) = &server.sat_file {
            settings = settings.sat_file(Some(file.display().to_string()));
        }
        if let Some(tls) = &server.tls {
            let path = |p: &PathBuf| Some(p.display().to_string());
            settings = settings
                .ca_file(path(&tls.ca))
                .cert_file(path(&tls.cert))
                .key_file(path(&tls.key));
        }
        let connection_settings = settings.build().expect("connection settings");
        let session_options = SessionOptionsBuilder::default()
            .connection_settings(connection_settings)
            .build()
            .expect("session options");
        let session = Session::new(session_options).expect("session");
        let managed = session.create_managed_client();
        let monitor = session.create_session_monitor();
        let exit = session.create_exit_handle();
        let make_client = || {
            state_store::Client::new(
                ApplicationContextBuilder::default()
                    .build()
                    .expect("app context"),
                session.create_managed_client(),
                session.create_session_monitor(),
                state_store::ClientOptionsBuilder::default()
                    .build()
                    .expect("client options"),
            )
            .expect("state store client")
        };
        let state_store = make_client();
        let extra = (0..extra).map(|_| Arc::new(make_client())).collect();
        let session_task =
            tokio::spawn(async move { session.run().await.map_err(|e| e.to_string()) });
        // The SDK's `connected()` checks the state and then waits for a change, so a connection
        // made between the two is missed: look at the state again every 100 ms.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !monitor.is_connected() {
            assert!(
                Instant::now() < deadline,
                "{id}: session did not connect to mqkv within 10 s"
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), monitor.connected()).await;
        }
        AioClient {
            id: id.to_string(),
            state_store: Arc::new(state_store),
            managed,
            extra,
            exit,
            session_task,
        }
    }

    /// Shuts the state store client down and ends the session gracefully.
    pub async fn close(self) {
        for (i, c) in self.extra.iter().enumerate() {
            c.shutdown()
                .await
                .unwrap_or_else(|e| panic!("{}: extra client {i} shutdown failed: {e}", self.id));
        }
        self.state_store
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("{}: state store shutdown failed: {e}", self.id));
        self.exit
            .try_exit()
            .unwrap_or_else(|e| panic!("{}: session exit failed: {e}", self.id));
        let res = tokio::time::timeout(Duration::from_secs(10), self.session_task)
            .await
            .unwrap_or_else(|_| panic!("{}: session did not end within 10 s", self.id))
            .expect("session task panicked");
        res.unwrap_or_else(|e| panic!("{}: session ended with an error: {e}", self.id));
    }
}

/// Upper-case hex of raw bytes, as used in notification topics.
pub fn hex_upper(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

/// Orders two HLCs by (timestamp, counter); node ids only break exact ties.
pub fn hlc_cmp(a: &HybridLogicalClock, b: &HybridLogicalClock) -> Ordering {
    a.timestamp
        .cmp(&b.timestamp)
        .then(a.counter.cmp(&b.counter))
        .then_with(|| a.node_id.cmp(&b.node_id))
}

/// Asserts `newer` is strictly later than `older`.
#[track_caller]
pub fn assert_later(newer: &HybridLogicalClock, older: &HybridLogicalClock, what: &str) {
    assert_eq!(
        hlc_cmp(newer, older),
        Ordering::Greater,
        "{what}: expected {newer} to be later than {older}"
    );
}

/// Milliseconds since the epoch of an HLC's timestamp.
pub fn hlc_ms(h: &HybridLogicalClock) -> u128 {
    h.timestamp.duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// An HLC with the given timestamp offset from now (may be negative) and a fixed node id.
pub fn hlc_at_offset(offset_ms: i64, node_id: &str) -> HybridLogicalClock {
    let now = SystemTime::now();
    let timestamp = if offset_ms >= 0 {
        now + Duration::from_millis(offset_ms as u64)
    } else {
        now - Duration::from_millis(offset_ms.unsigned_abs())
    };
    // HLCs carry millisecond precision on the wire.
    let ms = timestamp.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    HybridLogicalClock {
        timestamp: UNIX_EPOCH + Duration::from_millis(ms),
        counter: 0,
        node_id: node_id.to_string(),
    }
}

/// The lowest well-formed HLC: `000000000000000:00000:<node>`.
pub fn hlc_zero(node_id: &str) -> HybridLogicalClock {
    HybridLogicalClock {
        timestamp: UNIX_EPOCH,
        counter: 0,
        node_id: node_id.to_string(),
    }
}

/// Returns the `ServiceError` inside a state store error, or panics with the whole error.
#[track_caller]
pub fn service_error(e: &state_store::Error) -> &ServiceError {
    match e.kind() {
        ErrorKind::ServiceError(se) => se,
        other => panic!("expected a state store ServiceError, got {other:?}"),
    }
}

/// Waits up to `within` for the next notification on `obs`.
#[track_caller]
pub fn next_notification<'a>(
    obs: &'a mut KeyObservation,
    within: Duration,
) -> impl std::future::Future<Output = KeyNotification> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(within, obs.recv_notification()).await {
            Ok(Some((n, _ack))) => n,
            Ok(None) => panic!("{caller}: observation channel closed while waiting"),
            Err(_) => panic!("{caller}: no key notification within {within:?}"),
        }
    }
}

/// Asserts that no notification arrives on `obs` for `quiet`.
#[track_caller]
pub fn no_notification<'a>(
    obs: &'a mut KeyObservation,
    quiet: Duration,
) -> impl std::future::Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        match tokio::time::timeout(quiet, obs.recv_notification()).await {
            Err(_) => {}
            Ok(Some((n, _))) => panic!("{caller}: unexpected notification {n}"),
            Ok(None) => panic!("{caller}: observation channel closed (disconnected?)"),
        }
    }
}

/// Asserts a notification is a SET carrying `value`.
#[track_caller]
pub fn assert_set_notification(n: &KeyNotification, key: &[u8], value: &[u8]) {
    assert_eq!(n.key, key, "notification key");
    match &n.operation {
        Operation::Set(v) => assert_eq!(v.as_slice(), value, "notified value"),
        Operation::Del => panic!("expected SET notification, got DELETE"),
    }
}

/// Asserts a notification is a DELETE.
#[track_caller]
pub fn assert_del_notification(n: &KeyNotification, key: &[u8]) {
    assert_eq!(n.key, key, "notification key");
    assert_eq!(n.operation, Operation::Del, "expected DELETE notification");
}

/// A raw view of the MQTT publishes reaching one session on its key-notification topics,
/// independent of the SDK's own filtering (which silently drops malformed notifications).
pub struct NotificationTap {
    rx: SessionPubReceiver,
}

impl NotificationTap {
    /// Subscribes `client`'s session to its own notification topics and taps them.
    pub async fn attach(client: &AioClient) -> NotificationTap {
        let filter = format!(
            "{NOTIFY_PREFIX}{}/command/notify/+",
            hex_upper(client.id.as_bytes())
        );
        let topic_filter = TopicFilter::new(filter).expect("topic filter");
        let rx = client
            .managed
            .create_filtered_pub_receiver(topic_filter.clone());
        let token = client
            .managed
            .subscribe(
                topic_filter,
                QoS::AtLeastOnce,
                false,
                RetainOptions::default(),
                SubscribeProperties::default(),
            )
            .await
            .expect("subscribe issued");
        tokio::time::timeout(Duration::from_secs(10), token)
            .await
            .expect("SUBACK within 10 s")
            .expect("subscribe completed");
        NotificationTap { rx }
    }

    /// The next raw notification publish, waiting up to `within`.
    #[track_caller]
    pub fn next<'a>(
        &'a mut self,
        within: Duration,
    ) -> impl std::future::Future<Output = Publish> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            match tokio::time::timeout(within, self.rx.recv()).await {
                Ok(Some(p)) => p,
                Ok(None) => panic!("{caller}: tap closed"),
                Err(_) => panic!("{caller}: no notification publish within {within:?}"),
            }
        }
    }

    /// Asserts no notification publish arrives for `quiet`.
    #[track_caller]
    pub fn silent<'a>(&'a mut self, quiet: Duration) -> impl std::future::Future<Output = ()> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            match tokio::time::timeout(quiet, self.rx.recv()).await {
                Err(_) => {}
                Ok(Some(p)) => panic!(
                    "{caller}: unexpected notification publish on {} payload {:?}",
                    p.topic_name,
                    String::from_utf8_lossy(&p.payload)
                ),
                Ok(None) => panic!("{caller}: tap closed"),
            }
        }
    }
}

/// Looks up a user property on a publish.
pub fn user_property<'a>(p: &'a Publish, name: &str) -> Option<&'a str> {
    p.properties
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Whether a publish was delivered at QoS 1.
pub fn is_qos1(p: &Publish) -> bool {
    matches!(p.qos, DeliveryQoS::AtLeastOnce(_))
}

/// Milliseconds elapsed since `t`.
pub fn ms_since(t: Instant) -> u128 {
    t.elapsed().as_millis()
}
