//! The mqkv server: configuration, the broker, and the state store service wired together.

pub mod admin;
pub mod cluster_tls;
pub mod config;
pub mod dashboard;
pub mod federation;
pub mod http;
pub mod listeners;
pub mod metrics;
pub mod persistence;
pub mod policy;
pub mod reload;
pub mod replicated;
pub mod statestore;
pub mod survivor;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mqkv_broker::Broker;
use mqkv_raft::StoreNode;

pub use config::{ClusterConfig, RaftThread, ServerConfig, StorageKind};
pub use listeners::{Endpoint, ListenerConfig, ListenerKind, TlsDefaults};
pub use mqkv_raft::{set_after_snapshot, DEFAULT_PIPELINE_DEPTH};

/// A started server.
pub struct Server {
    pub broker: Broker,
    /// The bound addresses of the plain TCP listeners, in configuration order.
    pub listeners: Vec<SocketAddr>,
    /// Every bound listener: plain TCP first, then the `[[listeners]]` tables in order.
    pub endpoints: Vec<Endpoint>,
    /// What [`Server::reload`] reads again.
    reloader: Arc<reload::Reloader>,
    /// Reloads changed files, until the server stops.
    _watching: watch::Watching,
    /// The HTTP listener (metrics and health), if any.
    http: Option<http::HttpListener>,
    saver: Option<persistence::Saver>,
    node: StoreNode,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot start the connection threads: {0}")]
    Threads(std::io::Error),
    #[error(transparent)]
    Persist(#[from] persistence::PersistError),
    #[error(transparent)]
    Store(#[from] mqkv_raft::OpenError),
    #[error("cannot apply the state store limits: {0}")]
    Limits(mqkv_raft::WriteError),
    #[error("cannot load broker state: {0}")]
    Import(#[from] mqkv_broker::persist::ImportError),
    #[error("invalid cluster settings: {0}")]
    Cluster(String),
    #[error(transparent)]
    Listener(#[from] listeners::ListenerError),
    #[error(transparent)]
    Passwords(#[from] mqkv_broker::passwords::PasswordFileError),
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    #[error("token authentication: {0}")]
    Tokens(#[from] mqkv_broker::tokens::TokenSetupError),
    #[error("plain-text passwords in the configuration ([[broker.users]]) are not accepted: make a password file with `mqkv passwd FILE USER` and give it as password_file (or --password-file)")]
    PlainPasswords,
    #[error("invalid HTTP address '{0}': give ADDR:PORT or off")]
    HttpAddress(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl Server {
    /// Starts the broker and its services and binds every listener.
    pub async fn start(config: ServerConfig) -> Result<Server, StartError> {
        // Before anything is read: what changes from here on is read again.
        let at_start = reload::StartStamps::take(&config);
        let mut broker_config = config.broker.clone();
        broker_config.connection_threads = config.workers.unwrap_or(0);
        broker_config.pin_connection_threads = config.pin_workers;
        broker_config.batch_connection_threads = config.batch_scheduling;
        let cluster_tls = match &config.cluster {
            Some(c) => c.tls().map_err(StartError::Cluster)?,
            None => None,
        };
        let cluster = match &config.cluster {
            Some(c) => Some(
                c.options(cluster_tls.clone())
                    .map_err(StartError::Cluster)?,
            ),
            None => None,
        };
        if !config.broker.users.is_empty() {
            return Err(StartError::PlainPasswords);
        }
        let passwords = match &config.password_file {
            Some(path) => {
                let users = mqkv_broker::passwords::Passwords::load(path)?;
                let store = Arc::new(mqkv_broker::auth::PasswordStore::new(users));
                Some((path.clone(), store))
            }
            None => None,
        };
        let store = passwords
            .as_ref()
            .map_or_else(Default::default, |(_, store)| store.clone());
        let policy = match &config.policy {
            Some(path) => Some((path.clone(), Arc::new(policy::Policy::load(path)?))),
            None => None,
        };
        let tokens = match &config.tokens {
            Some(t) => {
                let verifier = mqkv_broker::tokens::TokenVerifier::load(&t.settings())?;
                Arc::new(mqkv_broker::tokens::TokenStore::new(verifier))
            }
            None => Arc::default(),
        };
        let auth = mqkv_broker::auth::DefaultAuthenticator {
            tokens: tokens.clone(),
            allow_anonymous: broker_config.allow_anonymous,
            passwords: store,
            certificate_attributes: config
                .certificate_attributes
                .iter()
                .map(|c| mqkv_broker::auth::SubjectAttributes {
                    subject: c.subject.clone(),
                    attributes: c
                        .attributes
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .collect(),
        };
        let auth = Arc::new(auth);
        let allow_anonymous = broker_config.allow_anonymous;
        let broker =
            Broker::with_authenticator(broker_config, auth.clone()).map_err(StartError::Threads)?;
        if let Some((path, policy)) = &policy {
            tracing::info!(file = %path.display(), rules = policy.rule_count(), "authorization policy in force");
            broker.set_policy(Some(policy.clone()));
        }
        let saver = match config.storage {
            StorageKind::Memory => None,
            StorageKind::Disk => {
                let (store, state) = persistence::BrokerStore::open(&config.data_dir)?;
                if let Some(loaded) = state {
                    tracing::info!(
                        retained = loaded.state.retained.len(),
                        sessions = loaded.state.sessions.len(),
                        "broker state loaded"
                    );
                    broker.import_state(loaded.state)?;
                    if loaded.retained_in_place {
                        broker.retained_saved();
                    }
                }
                let interval = Duration::from_millis(config.persist_interval_ms.max(10));
                Some(persistence::Saver::start(store, broker.clone(), interval))
            }
        };
        let store = &config.state_store;
        let mut store_config = mqkv_store::StoreConfig::new(store.node_id.clone());
        store_config.max_keys = store.max_keys;
        store_config.max_bytes = store.max_bytes;
        store_config.scan_page_size = store.scan_page_size;
        let counters = Arc::new(statestore::StoreCounters::new(broker.per_thread()));
        let notifier = statestore::Notifier::new(
            &broker,
            store.max_observed_keys.max(1),
            store.max_observed_patterns,
            counters.clone(),
        );
        let replicated_cell = Arc::new(std::sync::OnceLock::new());
        let hook = match cluster {
            Some(_) => replicated::hook(notifier.hook(), replicated_cell.clone()),
            None => notifier.hook(),
        };
        // A node of a cluster runs raft on a thread of its own: its links to the other nodes
        // and their requests are served there, and must not wait behind client connections.
        let share = cluster.is_none()
            && match config.raft_thread {
                RaftThread::Own => false,
                RaftThread::Shared => true,
                RaftThread::Auto => broker.connection_threads_on_every_cpu(),
            };
        let node_id = config
            .cluster
            .as_ref()
            .map_or(mqkv_raft::DEFAULT_NODE_ID, |c| c.node_id);
        let thread = share
            .then(|| broker.lend_connection_thread())
            .flatten()
            .map(|lent| mqkv_raft::SharedThread::new(lent.handle().clone(), lent));
        let node = match config.storage {
            StorageKind::Memory => {
                let options = mqkv_raft::NodeOptions {
                    thread,
                    node_id,
                    cluster: cluster.clone(),
                    ..mqkv_raft::NodeOptions::memory()
                };
                StoreNode::open_memory_with(store_config, hook, options).await?
            }
            StorageKind::Disk => {
                let options = mqkv_raft::NodeOptions {
                    snapshot_log_bytes: store.snapshot_log_bytes,
                    thread,
                    direct_log_writes: config.direct_log_writes,
                    node_id,
                    cluster: cluster.clone(),
                    ..mqkv_raft::NodeOptions::default()
                };
                StoreNode::open_disk_with(&config.data_dir, store_config, hook, options).await?
            }
        };
        // Limits from the configuration take effect through the log, so that entries written
        // under the old limits replay under them.
        let limits = mqkv_store::Limits {
            max_keys: store.max_keys,
            max_bytes: store.max_bytes,
            scan_page_size: store.scan_page_size,
        };
        let history = mqkv_store::HistoryLimits {
            max_changes: store.history_changes,
            max_bytes: store.history_bytes,
            max_age_ms: store.history_seconds.saturating_mul(1000),
        };
        let mut changes = Vec::new();
        if node.read(|m| m.limits()) != limits {
            changes.push(mqkv_store::Op::SetLimits(limits));
        }
        if node.read(|m| m.history_limits()) != history {
            changes.push(mqkv_store::Op::SetHistory(history));
        }
        for op in changes {
            let entry = mqkv_store::Entry {
                now_ms: statestore::now_ms(),
                op,
            };
            if node.is_clustered() {
                // The group may have no quorum yet: the node serves meanwhile, and the new
                // limits take effect once a leader has written them.
                tokio::spawn(set_limits_when_possible(node.clone(), entry));
            } else {
                node.write(entry).await.map_err(StartError::Limits)?;
            }
        }
        let service = statestore::StateStoreService::start(
            &broker,
            node.clone(),
            notifier.clone(),
            store.max_requests_per_second,
            counters.clone(),
        );
        let fault_injection = config.cluster.as_ref().is_some_and(|c| c.fault_injection);
        let reloader_cell = Arc::new(std::sync::OnceLock::new());
        admin::AdminService::start(
            &broker,
            node.clone(),
            fault_injection,
            reloader_cell.clone(),
        );
        if node.is_clustered() {
            let replicated =
                replicated::ReplicatedBroker::start(&broker, node.clone(), &replicated_cell);
            federation::ClusterFederation::start(&broker, node.clone(), replicated);
        }
        let (planned, tls) = match listeners::plan(&config.listen, &config.listeners, &config.tls) {
            Ok(planned) => planned,
            Err(e) => {
                broker.shutdown(Duration::ZERO).await;
                return Err(e.into());
            }
        };
        let reloader = Arc::new(reload::Reloader::new(
            broker.clone(),
            tls,
            cluster_tls,
            passwords,
            config.tokens.clone().map(|t| (t, tokens)),
            policy.map(|(path, _)| path),
            notifier.clone(),
            &at_start,
        ));
        let _ = reloader_cell.set(reloader.clone());
        let watching = watch::start(&reloader, Duration::from_millis(config.watch_interval_ms));
        let mut endpoints = Vec::new();
        for l in planned {
            let bound = match l.proxy {
                None => broker.listen_on(l.address, l.transport).await,
                Some(proxy) => {
                    broker
                        .listen_behind_proxy(l.address, l.transport, proxy)
                        .await
                }
            };
            match bound {
                Ok(addr) => endpoints.push(Endpoint {
                    kind: l.kind,
                    addr,
                    path: l.path,
                }),
                Err(source) => {
                    // Listeners already bound stop with the broker, not with the process.
                    broker.shutdown(Duration::ZERO).await;
                    return Err(StartError::Listen {
                        addr: l.address,
                        source,
                    });
                }
            }
        }
        node.set_client_addrs(endpoints.iter().map(ToString::to_string).collect());
        let sources = metrics::Sources {
            broker: broker.clone(),
            node: node.clone(),
            counters,
            hostname: metrics::hostname(),
            queue_full: match config.broker.queue_full {
                mqkv_broker::QueueFullPolicy::DropNew => "drop-new",
                mqkv_broker::QueueFullPolicy::DropOldest => "drop-oldest",
            },
            reloader: reloader.clone(),
        };
        let dashboard = Arc::new(dashboard::Dashboard {
            viewers: Arc::new(dashboard::viewers::Viewers::new(
                broker.clone(),
                auth,
                config.password_file.is_some(),
                allow_anonymous,
            )),
            series: dashboard::series::Series::start(broker.clone(), sources.counters.clone()),
            broker: broker.clone(),
            node: node.clone(),
            service,
            notifier,
            started: std::time::Instant::now(),
        });
        let http = match start_http(config.http.as_deref(), sources, dashboard).await {
            Ok(http) => http,
            Err(e) => {
                broker.shutdown(Duration::ZERO).await;
                return Err(e);
            }
        };
        let listeners = endpoints
            .iter()
            .filter(|e| e.kind == ListenerKind::Tcp)
            .map(|e| e.addr)
            .collect();
        Ok(Server {
            broker,
            listeners,
            endpoints,
            reloader,
            _watching: watching,
            http,
            saver,
            node,
        })
    }

    /// Reads the TLS listeners' certificates, keys and CA bundles, the password file, the
    /// token keys and the policy again (see [`reload::Reloader`]). Returns the parts that
    /// failed, by name and first file.
    pub fn reload(&self) -> Vec<String> {
        self.reloader.reload()
    }

    /// What [`Server::reload`] runs, to run it elsewhere (on a thread for blocking work).
    pub fn reloader(&self) -> Arc<reload::Reloader> {
        self.reloader.clone()
    }

    /// What the state store has done to its files so far (log commits, entries written,
    /// snapshots).
    pub fn store_stats(&self) -> mqkv_raft::StoreStats {
        self.node.stats()
    }

    /// The state store's replicated log.
    pub fn store(&self) -> &StoreNode {
        &self.node
    }

    /// The HTTP listener's address (metrics and health), if it has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|h| h.addr)
    }

    /// Disconnects every client with reason 0x8B and stops.
    pub async fn shutdown(self) {
        if let Some(http) = &self.http {
            http.stop();
        }
        self.broker.shutdown(Duration::from_secs(5)).await;
        if let Some(saver) = self.saver {
            if let Err(e) = saver.finish().await {
                tracing::error!(error = %e, "saving broker state at shutdown failed");
            }
        }
        if let Err(e) = self.node.shutdown().await {
            tracing::error!(error = %e, "closing the state store failed");
        }
    }
}

/// The default HTTP address.
const DEFAULT_HTTP: &str = "127.0.0.1:9600";

/// Starts the HTTP listener `setting` names (unset: the default address, given up with a
/// warning when it is taken; `off`: none).
async fn start_http(
    setting: Option<&str>,
    sources: metrics::Sources,
    dashboard: Arc<dashboard::Dashboard>,
) -> Result<Option<http::HttpListener>, StartError> {
    let (text, explicit) = match setting {
        Some(text) => (text, true),
        None => (DEFAULT_HTTP, false),
    };
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let addr: SocketAddr = text
        .parse()
        .map_err(|_| StartError::HttpAddress(text.to_owned()))?;
    match http::HttpListener::start(addr, sources, dashboard).await {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if !explicit => {
            tracing::warn!(%addr, error = %e, "no HTTP listener (metrics, health): the default address is taken; give --http ADDR:PORT or --http off");
            Ok(None)
        }
        Err(source) => Err(StartError::Listen { addr, source }),
    }
}

/// Writes new state store limits once the group can take them, trying again every second.
async fn set_limits_when_possible(node: StoreNode, entry: mqkv_store::Entry) {
    loop {
        match node.write(entry.clone()).await {
            Ok(_) => return,
            Err(mqkv_raft::WriteError::Stopped) => return,
            Err(e) => {
                tracing::info!(error = %e, "state store limits not written yet; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
