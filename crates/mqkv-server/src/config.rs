//! Server configuration: a TOML file, overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mqkv_broker::BrokerConfig;
use serde::{Deserialize, Serialize};

use crate::cluster_tls::ClusterTls;

/// Where the state store keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum StorageKind {
    /// In memory only: everything is gone when the process ends.
    Memory,
    /// In the data directory: survives restarts and crashes.
    #[default]
    Disk,
}

/// Which thread the state store's raft (its log and state machine) runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RaftThread {
    /// `shared` when the connection threads are pinned one to every CPU the process may use
    /// (so a thread of raft's own would have no CPU to itself), `own` otherwise.
    #[default]
    Auto,
    /// A thread of its own.
    Own,
    /// The last connection thread, beside its connections; with disk storage the log's syncs
    /// run on a thread of their own.
    Shared,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateStoreConfig {
    /// Largest number of keys; `None` is unlimited.
    pub max_keys: Option<u64>,
    /// Largest total of key and value bytes; `None` is unlimited.
    pub max_bytes: Option<u64>,
    /// Keys per SCAN page.
    pub scan_page_size: usize,
    /// Most keys one connection may observe (KEYNOTIFY) at once; beyond it KEYNOTIFY is
    /// answered `-ERR the quota has been exceeded`.
    pub max_observed_keys: usize,
    /// Changes the store keeps for watches that resume (`KEYNOTIFY key SINCE version`, an
    /// extension): at most this many ...
    pub history_changes: usize,
    /// ... of at most this many key and value bytes ...
    pub history_bytes: u64,
    /// ... and none older than this many seconds.
    pub history_seconds: u64,
    /// Most pattern watches (`KEYNOTIFY pattern PATTERN`, an extension) one connection may
    /// have at once; beyond it one is answered `-ERR the quota has been exceeded`.
    pub max_observed_patterns: usize,
    /// Most state store requests per second from one connection (a second's worth may come at
    /// once); beyond it a request is answered `-ERR the quota has been exceeded`. 0: no limit.
    pub max_requests_per_second: u32,
    /// Node id in the versions (HLCs) the store hands out.
    pub node_id: String,
    /// With disk storage, a snapshot of the state is written once the log written since the
    /// last one outgrows both this many bytes and that snapshot. Larger: fewer snapshots
    /// (with large values, less written to disk), a longer log to replay at a restart.
    pub snapshot_log_bytes: u64,
}

impl Default for StateStoreConfig {
    fn default() -> Self {
        StateStoreConfig {
            max_keys: None,
            max_bytes: None,
            scan_page_size: 100,
            max_observed_keys: 10_000,
            max_observed_patterns: 16,
            history_changes: mqkv_store::DEFAULT_HISTORY_CHANGES,
            history_bytes: mqkv_store::DEFAULT_HISTORY_BYTES,
            history_seconds: mqkv_store::DEFAULT_HISTORY_MS / 1000,
            max_requests_per_second: 0,
            node_id: "mqkv".into(),
            snapshot_log_bytes: mqkv_raft::NodeOptions::default().snapshot_log_bytes,
        }
    }
}

/// Attributes a certificate gives its holder: a `[[certificate_attributes]]` table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CertificateAttributes {
    /// A distinguished name (`CN = smart-fan, O = Contoso`): of the client's certificate or of a
    /// certificate up its chain (an intermediate, the root).
    pub subject: String,
    pub attributes: std::collections::BTreeMap<String, String>,
}

/// How tokens are checked: the `[tokens]` table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TokenConfig {
    /// PEM public keys (RSA, EC or Ed25519) that sign accepted tokens.
    pub keys: Vec<PathBuf>,
    /// A JWKS file with the keys (a Kubernetes API server's `/openid/v1/jwks`).
    pub jwks: Option<PathBuf>,
    /// Issuers accepted; empty: any.
    pub issuers: Vec<String>,
    /// Audiences accepted; empty: any.
    pub audiences: Vec<String>,
    /// The claim that names the user (default `sub`).
    pub username_claim: Option<String>,
    /// Attribute name to claim path (`kubernetes.io.namespace`). Default: `namespace` and
    /// `serviceaccount` from a Kubernetes service account token.
    pub attribute_claims: std::collections::BTreeMap<String, String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

impl TokenConfig {
    pub fn settings(&self) -> mqkv_broker::tokens::TokenSettings {
        mqkv_broker::tokens::TokenSettings {
            keys: self.keys.clone(),
            jwks: self.jwks.clone(),
            issuers: self.issuers.clone(),
            audiences: self.audiences.clone(),
            username_claim: self.username_claim.clone(),
            attribute_claims: self.attribute_claims.clone(),
            leeway_secs: self.leeway_secs,
        }
    }
}

/// Membership of a cluster: the `[cluster]` table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id in the group (a positive number, unique in the group).
    pub node_id: u64,
    /// Where this node listens for the other nodes.
    pub listen: SocketAddr,
    /// The group's first members as `ID=HOST:PORT`, this node included. Empty: a group of
    /// this node alone, which `mqkv cluster add-node` grows.
    #[serde(default)]
    pub peers: Vec<String>,
    /// The address the other nodes reach this one at (default: `listen`).
    #[serde(default)]
    pub advertise: Option<String>,
    /// Start as no member, waiting for `mqkv cluster add-node` on a running group.
    #[serde(default)]
    pub join: bool,
    /// The secret every node of the group shares. Needed unless every cluster address is a
    /// loopback address.
    #[serde(default)]
    pub secret: Option<String>,
    /// A file holding the secret (its first line), instead of `secret`.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// This node's certificate chain (PEM) for TLS between the nodes; with `tls_key` and
    /// `tls_ca`, every link is mutual TLS 1.3.
    #[serde(default)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    #[serde(default)]
    pub tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) every node's certificate must chain to.
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// Longest a state store request waits for a leader that can reach a quorum before it
    /// is answered with status 503, in milliseconds.
    #[serde(default = "default_quorum_wait_ms")]
    pub quorum_wait_ms: u64,
    /// Most batches of writes this node has on their way to being committed at once; 1 waits
    /// for each before sending the next.
    #[serde(default = "default_pipeline_depth")]
    pub pipeline_depth: usize,
    /// Accept `mqkv cluster isolate` (from loopback clients): the node then acts as if the
    /// network between it and the named nodes were cut. For testing; off by default.
    #[serde(default)]
    pub fault_injection: bool,
}

fn default_quorum_wait_ms() -> u64 {
    3_000
}

fn default_pipeline_depth() -> usize {
    mqkv_raft::DEFAULT_PIPELINE_DEPTH
}

/// A `--peer` value: `ID=HOST:PORT`.
pub fn parse_peer(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}' is not ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("'{id}' in '{text}' is not a node id"))?;
    if id == 0 {
        return Err(format!("node ids start at 1 ('{text}')"));
    }
    let addr = addr.trim();
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
        _ => return Err(format!("'{addr}' in '{text}' is not HOST:PORT")),
    }
    Ok((id, addr.to_owned()))
}

impl ClusterConfig {
    /// The TLS settings of the links between the nodes, read from their files; `None` when
    /// the links are plain TCP.
    pub fn tls(&self) -> Result<Option<Arc<ClusterTls>>, String> {
        match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => {
                Ok(Some(Arc::new(ClusterTls::load(cert, key, ca)?)))
            }
            _ => Err(
                "TLS between the nodes needs a certificate, its key and the cluster's CA \
                      (--cluster-tls-cert, --cluster-tls-key, --cluster-tls-ca)"
                    .into(),
            ),
        }
    }

    /// The options of the replicated log: peers parsed, the secret read and checked, with
    /// the links' TLS settings (see [`ClusterConfig::tls`]).
    pub fn options(
        &self,
        tls: Option<Arc<ClusterTls>>,
    ) -> Result<mqkv_raft::ClusterOptions, String> {
        if self.node_id == 0 {
            return Err("the node id must be 1 or more".into());
        }
        let mut peers = std::collections::BTreeMap::new();
        for text in &self.peers {
            let (id, addr) = parse_peer(text)?;
            if peers.insert(id, addr).is_some() {
                return Err(format!("node {id} is named twice in the peer list"));
            }
        }
        if !peers.is_empty() && !peers.contains_key(&self.node_id) {
            return Err(format!(
                "the peer list must name this node ({}) with its own cluster address",
                self.node_id
            ));
        }
        let secret = match (&self.secret, &self.secret_file) {
            (Some(_), Some(_)) => {
                return Err("give the cluster secret or a secret file, not both".into())
            }
            (Some(secret), None) => secret.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| {
                    format!(
                        "cannot read the cluster secret file {}: {e}",
                        path.display()
                    )
                })?
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
            (None, None) => String::new(),
        };
        if secret.is_empty() && tls.is_none() {
            let loopback = |addr: &str| {
                addr.rsplit_once(':')
                    .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
                    .is_some_and(|host| {
                        host == "localhost"
                            || host
                                .parse::<std::net::IpAddr>()
                                .is_ok_and(|ip| ip.is_loopback())
                    })
            };
            let all_loopback = self.listen.ip().is_loopback()
                && peers.values().all(|a| loopback(a))
                && self.advertise.as_deref().is_none_or(loopback);
            if !all_loopback {
                return Err(
                    "a cluster reachable beyond this machine needs a shared secret \
                     (--cluster-secret, --cluster-secret-file or [cluster] secret) \
                     or TLS between the nodes (--cluster-tls-cert, --cluster-tls-key, \
                     --cluster-tls-ca)"
                        .into(),
                );
            }
            tracing::warn!(
                "cluster traffic is authenticated with an empty secret: fine on loopback only"
            );
        }
        Ok(mqkv_raft::ClusterOptions {
            listen: self.listen,
            advertise: self.advertise.clone(),
            peers,
            join: self.join,
            secret: secret.into_bytes(),
            tls: tls.map(|t| t as Arc<dyn mqkv_raft::LinkTls>),
            quorum_wait: std::time::Duration::from_millis(self.quorum_wait_ms.max(1)),
            pipeline_depth: self.pipeline_depth.max(1),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Plain TCP MQTT listeners.
    pub listen: Vec<SocketAddr>,
    /// Listeners of every kind (`tcp`, `tls`, `ws`, `wss`), beside those of `listen`.
    pub listeners: Vec<crate::listeners::ListenerConfig>,
    /// TLS settings for the TLS and WebSocket-over-TLS listeners that give none of their own.
    pub tls: crate::listeners::TlsDefaults,
    /// The password file (`mqkv passwd FILE USER` makes one): the users clients may log in as.
    pub password_file: Option<PathBuf>,
    /// The authorization policy (YAML, in the shape of AIO's `BrokerAuthorization`). Without
    /// one, every client that authenticates may do everything.
    pub policy: Option<PathBuf>,
    /// Attributes client certificates give their holders: `[[certificate_attributes]]` tables
    /// with a `subject` and an `attributes` table.
    pub certificate_attributes: Vec<CertificateAttributes>,
    /// Token authentication (authentication method `K8S-SAT`): the `[tokens]` table.
    pub tokens: Option<TokenConfig>,
    /// The HTTP listener (`/metrics`, `/healthz`, `/readyz`): an address, or `off`. Unset:
    /// `127.0.0.1:9600`, or none (with a warning) when that address is taken.
    pub http: Option<String>,
    pub data_dir: PathBuf,
    pub storage: StorageKind,
    pub broker: BrokerConfig,
    pub state_store: StateStoreConfig,
    /// How often changed broker state (retained messages, persistent sessions) is saved, in
    /// milliseconds; the most a crash can lose of it.
    pub persist_interval_ms: u64,
    /// How often the TLS files, the password file, the token keys and the policy are checked
    /// for changes, in milliseconds; a part whose files changed, and then stayed the same for
    /// one more check, is read again as on SIGHUP. 0: only on SIGHUP and `mqkv reload`.
    pub watch_interval_ms: u64,
    /// Threads serving client connections; `None` is one per core. The state store's log
    /// is written and applied on one of them or on a thread of its own (see `raft_thread`).
    pub workers: Option<usize>,
    /// Pins each connection thread to a CPU of its own (when there are no more of them than
    /// CPUs the process may use); on unless told otherwise, whatever the storage. Unpinned, a
    /// scheduler that packs runnable threads onto few CPUs runs both connection threads on one
    /// CPU at times, each waiting out the other's time slice (GET at 64 clients: a p99 of 4.3
    /// ms instead of 1.5 ms in about half the runs), and with disk storage it leaves the CPU
    /// of the log's thread idle while the connection threads queue on the other (see
    /// `docs/design/performance.md`).
    pub pin_workers: bool,
    /// Runs the connection threads under the kernel's batch scheduling policy (`SCHED_BATCH`,
    /// Linux; on unless told otherwise): a connection thread woken by a packet or a completed
    /// log write does not preempt the thread running on its CPU, so clients sharing the CPU
    /// send more before it runs and each of its passes finds more to do (see
    /// `docs/design/performance.md`). On a CPU busy with other programs, a woken connection thread
    /// waits out their time slice before it answers.
    pub batch_scheduling: bool,
    /// Where the state store's raft runs (see [`RaftThread`]). Sharing a connection thread
    /// saves the thread hand-offs of every write for that thread's half of the clients, and
    /// with disk storage keeps serving them while the disk syncs (durable SET at 64 clients on
    /// two CPUs: see `docs/design/performance.md`).
    pub raft_thread: RaftThread,
    /// With disk storage and raft on a connection thread, the log's appends are written with
    /// direct I/O through io_uring (`O_DIRECT` with `RWF_DSYNC`: durable once done, no copy
    /// into the page cache, no sync thread to wake), where the system allows it, and through
    /// the page cache with an `fdatasync` on a sync thread otherwise or when this is off
    /// (see `docs/design/performance.md`).
    pub direct_log_writes: bool,
    /// Membership of a cluster; `None` runs a single node.
    pub cluster: Option<ClusterConfig>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 1883))],
            listeners: Vec::new(),
            tls: crate::listeners::TlsDefaults::default(),
            password_file: None,
            policy: None,
            certificate_attributes: Vec::new(),
            tokens: None,
            http: None,
            data_dir: PathBuf::from("./mqkv-data"),
            storage: StorageKind::default(),
            broker: BrokerConfig::default(),
            state_store: StateStoreConfig::default(),
            persist_interval_ms: 1000,
            watch_interval_ms: 10_000,
            workers: None,
            pin_workers: true,
            batch_scheduling: true,
            raft_thread: RaftThread::Auto,
            direct_log_writes: true,
            cluster: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration in {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

impl ServerConfig {
    pub fn from_file(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let c: ServerConfig = toml::from_str(
            r#"
            listen = ["127.0.0.1:1884", "[::1]:1885"]
            storage = "memory"
            workers = 3
            pin_workers = false
            batch_scheduling = false
            raft_thread = "shared"
            direct_log_writes = false
            [broker]
            max_packet_size = 1024
            max_queued_messages = 5
            queue_full = "drop-oldest"
            co_locate = false
            [state_store]
            max_keys = 10
            "#,
        )
        .expect("valid");
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.broker.max_packet_size, 1024);
        assert_eq!(
            c.broker.queue_full,
            mqkv_broker::QueueFullPolicy::DropOldest
        );
        assert_eq!(c.state_store.max_keys, Some(10));
        assert!(!c.broker.co_locate);
        assert!(
            ServerConfig::default().broker.co_locate,
            "on unless told otherwise"
        );
        assert_eq!(c.workers, Some(3));
        assert!(!c.pin_workers, "memory storage, told not to pin");
        assert!(!c.batch_scheduling);
        assert!(
            ServerConfig::default().batch_scheduling,
            "on unless told otherwise"
        );
        assert_eq!(c.raft_thread, RaftThread::Shared);
        assert_eq!(ServerConfig::default().raft_thread, RaftThread::Auto);
        assert!(!c.direct_log_writes);
        assert!(
            ServerConfig::default().direct_log_writes,
            "on unless told otherwise"
        );
        for (text, kind) in [("own", RaftThread::Own), ("auto", RaftThread::Auto)] {
            let c: ServerConfig =
                toml::from_str(&format!("raft_thread = \"{text}\"")).expect("valid");
            assert_eq!(c.raft_thread, kind);
        }
        assert!(toml::from_str::<ServerConfig>(r#"raft_thread = "sometimes""#).is_err());
        let disk = ServerConfig::default();
        assert_eq!(disk.storage, StorageKind::Disk);
        assert!(disk.pin_workers, "disk storage pins unless told otherwise");
        let memory: ServerConfig = toml::from_str(r#"storage = "memory""#).expect("valid");
        assert!(
            memory.pin_workers,
            "memory storage pins unless told otherwise"
        );
    }

    #[test]
    fn the_readme_example_is_valid() {
        let readme = include_str!("../../../README.md");
        // Every TOML block parses; the full example is the one that sets a password file.
        let blocks: Vec<ServerConfig> = readme
            .split("```toml")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .map(|block| toml::from_str(block).expect("a README example parses"))
            .collect();
        let c = blocks
            .into_iter()
            .find(|c| c.password_file.is_some())
            .expect("the full example in the README");
        assert_eq!(c.storage, StorageKind::Disk);
        assert!(c.password_file.is_some());
        assert!(c.policy.is_some());
        assert_eq!(c.http.as_deref(), Some("127.0.0.1:9600"));
        assert_eq!(
            c.tokens.as_ref().map(|t| t.audiences.len()),
            Some(1),
            "the [tokens] table"
        );
        assert_eq!(c.certificate_attributes.len(), 1);
        assert_eq!(c.broker.subscription_denied_reason, 0x87);
        assert_eq!(c.listeners.len(), 2);
        assert!(c.tls.cert.is_some());
    }

    #[test]
    fn reads_a_cluster_table() {
        let c: ServerConfig = toml::from_str(
            r#"
            [cluster]
            node_id = 2
            listen = "127.0.0.1:7002"
            peers = ["1=127.0.0.1:7001", "2=127.0.0.1:7002", "3=127.0.0.1:7003"]
            secret = "s"
            "#,
        )
        .expect("valid");
        let cluster = c.cluster.expect("a cluster table");
        let options = cluster.options(None).expect("valid options");
        assert_eq!(options.peers.len(), 3);
        assert_eq!(options.peers[&3], "127.0.0.1:7003");
        assert_eq!(options.secret, b"s");
        assert_eq!(options.quorum_wait, std::time::Duration::from_millis(3000));
        assert!(!options.join);
    }

    #[test]
    fn refuses_bad_cluster_settings() {
        let base = ClusterConfig {
            node_id: 1,
            listen: "127.0.0.1:7001".parse().expect("addr"),
            peers: vec!["1=127.0.0.1:7001".into(), "2=127.0.0.1:7002".into()],
            advertise: None,
            join: false,
            secret: None,
            secret_file: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            quorum_wait_ms: 3000,
            pipeline_depth: 1,
            fault_injection: false,
        };
        assert!(
            base.options(None).is_ok(),
            "loopback without a secret is allowed"
        );
        let wide = ClusterConfig {
            listen: "0.0.0.0:7001".parse().expect("addr"),
            ..base.clone()
        };
        let err = wide
            .options(None)
            .expect_err("a wide listener needs a secret");
        assert!(err.contains("secret"), "{err}");
        let secret = ClusterConfig {
            secret: Some("x".into()),
            ..wide.clone()
        };
        assert!(secret.options(None).is_ok());
        let missing_self = ClusterConfig {
            node_id: 3,
            ..base.clone()
        };
        assert!(missing_self
            .options(None)
            .expect_err("not named")
            .contains("must name this node"));
        let twice = ClusterConfig {
            peers: vec!["1=127.0.0.1:7001".into(), "1=127.0.0.1:7002".into()],
            ..base.clone()
        };
        assert!(twice.options(None).expect_err("twice").contains("twice"));
        // TLS between the nodes stands in for the secret beyond loopback; its settings come
        // whole or not at all.
        let dir = tempfile::tempdir().expect("a directory");
        let authority = mqkv_testkit::pki::TestCa::new(dir.path(), "cluster-ca");
        let (cert, key) = authority.issue(dir.path(), "node");
        let ca = authority.cert.clone();
        let tls = ClusterConfig {
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
            tls_ca: Some(ca.clone()),
            ..wide
        };
        let loaded = tls.tls().expect("the files load").expect("TLS asked for");
        let options = tls.options(Some(loaded)).expect("TLS without a secret");
        assert!(options.tls.is_some() && options.secret.is_empty());
        let half = ClusterConfig {
            tls_ca: None,
            ..tls.clone()
        };
        assert!(half.tls().expect_err("no CA").contains("--cluster-tls-ca"));
        let swapped = ClusterConfig {
            tls_cert: Some(ca),
            tls_key: Some(key),
            ..tls
        };
        assert!(swapped.tls().expect_err("not a fit").contains("do not fit"));
        for bad in [
            "x=127.0.0.1:1",
            "1",
            "0=127.0.0.1:1",
            "1=nohost",
            "1=:80",
            "1=h:port",
        ] {
            assert!(parse_peer(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_peer("7=node-7.local:7007"),
            Ok((7, "node-7.local:7007".into()))
        );
    }

    #[test]
    fn rejects_unknown_keys() {
        assert!(toml::from_str::<ServerConfig>("listn = []").is_err());
    }
}
