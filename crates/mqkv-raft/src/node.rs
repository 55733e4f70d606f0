//! [`StoreNode`]: opening, recovering, writing to and reading from a store.
//!
//! Invariant: a `StoreNode` is handed out only after recovery is complete —
//! the snapshot is loaded, every entry of the log is applied (without the
//! apply hook), and, in a one-member group, this node is the leader — so
//! the first `write` neither fails nor makes the hook see old entries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mqkv_store::{Entry, StateMachine, StoreConfig};
use openraft::error::Fatal;
use openraft::{BasicNode, Raft, SnapshotPolicy};

use crate::cluster::{self, Cluster, MembershipError};
use crate::files::Location;
use crate::log_store::LogShared;
use crate::network::Network;
use crate::peer::Peers;
use crate::proposer::{PendingWrite, Proposer};
use crate::route::{ReadBarrier, Route};
use crate::runtime::RaftThread;
use crate::state_machine::{StateMachineStore, StateShared};
use crate::stats::{Counters, StoreStats};
use crate::status::ClusterStatus;
use crate::types::{NodeId, TypeConfig};
use crate::{ApplyHook, OpenError, ShutdownError, WriteError};

use crate::options::NodeOptions;
use crate::recover::{recover, Recovered};

/// A running store: the replicated log and the state machine behind it.
/// Cheap to clone; all clones are the same store.
#[derive(Clone)]
pub struct StoreNode {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) proposer: Proposer,
    pub(crate) thread: RaftThread,
    pub(crate) state: Arc<StateShared>,
    pub(crate) log: Arc<LogShared>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) node_id: NodeId,
    pub(crate) log_path: PathBuf,
    /// Where writes and reads go; with peers, linearizable reads share
    /// rounds here.
    pub(crate) route: Route,
    pub(crate) reads: Option<ReadBarrier>,
    pub(crate) cluster: Option<Arc<Cluster>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle went away without `shutdown`: stop raft and close
        // the files in the background, as far as a runtime is there to do it.
        self.proposer.stop();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let raft = self.raft.clone();
            let log = self.log.clone();
            let state = self.state.clone();
            runtime.spawn(async move {
                let _ = raft.shutdown().await;
                let _ = log.close().await;
                let _ = tokio::task::spawn_blocking(move || state.close()).await;
            });
        }
    }
}

impl StoreNode {
    /// Opens (or creates and initialises) the durable store in `dir`,
    /// creating the directory if it is missing.
    pub async fn open_disk(
        dir: &Path,
        config: StoreConfig,
        on_apply: ApplyHook,
    ) -> Result<StoreNode, OpenError> {
        Self::open_disk_with(dir, config, on_apply, NodeOptions::default()).await
    }

    /// [`Self::open_disk`] with explicit options.
    pub async fn open_disk_with(
        dir: &Path,
        config: StoreConfig,
        on_apply: ApplyHook,
        options: NodeOptions,
    ) -> Result<StoreNode, OpenError> {
        open(Location::Disk(dir.to_path_buf()), config, on_apply, options).await
    }

    /// A store with the same log and state machine path but no disk:
    /// nothing survives the process.
    /// Its snapshots keep no copy of the data and so cost almost nothing;
    /// they are taken ten times as often as on disk, which keeps the log (in
    /// memory too) short.
    pub async fn open_memory(
        config: StoreConfig,
        on_apply: ApplyHook,
    ) -> Result<StoreNode, OpenError> {
        Self::open_memory_with(config, on_apply, NodeOptions::memory()).await
    }

    /// [`Self::open_memory`] with explicit options.
    pub async fn open_memory_with(
        config: StoreConfig,
        on_apply: ApplyHook,
        options: NodeOptions,
    ) -> Result<StoreNode, OpenError> {
        open(Location::Memory, config, on_apply, options).await
    }

    /// Queues the entry for the log at once; the returned future waits until
    /// it is committed (fsynced) and applied, and gives what applying it
    /// answered. The apply hook has seen the outcome before the future
    /// finishes. Concurrent writes share log entries and fsyncs (group
    /// commit). Dropping the future does not withdraw the write.
    pub fn write(&self, entry: Entry) -> PendingWrite {
        self.inner.proposer.propose(entry)
    }

    /// Runs `f` against the applied state. Only committed, durable entries
    /// are ever visible there. Writes wait while `f` runs, so keep it short,
    /// and do not call `read` again from inside it.
    pub fn read<R>(&self, f: impl FnOnce(&StateMachine) -> R) -> R {
        let state = self.inner.state.read();
        f(&state.machine)
    }

    /// Stops raft, writes what is pending and closes the files. Later
    /// writes fail with [`WriteError::Stopped`]; calling it again is
    /// harmless.
    pub async fn shutdown(&self) -> Result<(), ShutdownError> {
        self.inner.proposer.stop();
        let raft = self
            .inner
            .raft
            .shutdown()
            .await
            .map_err(|e| ShutdownError::Raft(e.to_string()));
        let log = self
            .inner
            .log
            .close()
            .await
            .map_err(|e| ShutdownError::Close {
                path: self.inner.log_path.clone(),
                reason: e.to_string(),
            });
        let state = self.inner.state.clone();
        // Waits for a snapshot being written, so not on the async threads.
        let _ = tokio::task::spawn_blocking(move || state.close()).await;
        self.inner.thread.stop();
        raft?;
        log
    }

    /// This node's id in the raft group.
    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    /// True for a node started with [`NodeOptions::cluster`]: reads must
    /// then wait for [`Self::linearizable`].
    pub fn is_clustered(&self) -> bool {
        self.inner.cluster.is_some()
    }

    /// True while this node leads its group (always, for a node without
    /// peers once it is open). Only the leader proposes key expiry.
    pub fn is_leader(&self) -> bool {
        self.inner.route.is_leader()
    }

    /// Resolves once a [`Self::read`] on this node sees every write
    /// acknowledged, on any node, before the call: at once without peers;
    /// otherwise after a read index round with the leader (shared with the
    /// reads that arrive meanwhile). Fails with
    /// [`WriteError::Unavailable`] when no leader with a quorum answers
    /// within the quorum wait.
    pub fn linearizable(
        &self,
    ) -> impl std::future::Future<Output = Result<(), WriteError>> + Send + 'static {
        let waiting = self.inner.reads.as_ref().map(ReadBarrier::wait);
        async move {
            match waiting {
                Some(waiting) => waiting.await,
                None => Ok(()),
            }
        }
    }

    /// Fault injection for tests: from now on this node acts as if the
    /// network dropped every message between it and `nodes` (both ways, as
    /// far as this node sends and answers); an empty list heals. Does
    /// nothing without peers.
    pub fn isolate_from(&self, nodes: impl IntoIterator<Item = NodeId>) {
        if let Some(cluster) = &self.inner.cluster {
            cluster.peers.set_blocked(nodes.into_iter().collect());
        }
    }

    /// Calls `hook` whenever a snapshot from another member replaces the
    /// state (see [`crate::InstallHook`]). Only the first call counts.
    pub fn set_install_hook(&self, hook: crate::InstallHook) {
        self.inner.state.install_snapshot_hook(hook);
    }

    /// Whether this node knows of a leader (itself or another member) now.
    pub fn leader_known(&self) -> bool {
        self.inner.raft.metrics().borrow().current_leader.is_some()
    }

    /// Installs what handles the application's messages from other nodes (see
    /// [`Self::send_app`]). Only the first call counts; nothing happens without peers.
    pub fn set_app_handler(&self, handler: crate::cluster::AppHandler) {
        if let Some(cluster) = &self.inner.cluster {
            let _ = cluster.app.set(handler);
        }
    }

    /// Sends `bytes` on `channel` to member `node`, without waiting: messages to one node
    /// arrive in the order they were sent, or not at all if the node cannot be reached.
    pub fn send_app(&self, node: NodeId, channel: u8, bytes: Vec<u8>) {
        if let Some(outbox) = self.inner.cluster.as_ref().and_then(|c| c.outbox.get()) {
            let _ = outbox.send((node, channel, bytes));
        }
    }

    /// The other members of the group.
    pub fn peer_ids(&self) -> Vec<NodeId> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .filter(|id| *id != self.inner.node_id)
            .collect()
    }

    /// Where clients reach this node, as `cluster status` reports it.
    pub fn set_client_addrs(&self, addrs: Vec<String>) {
        if let Some(cluster) = &self.inner.cluster {
            cluster.set_client_addrs(addrs);
        }
    }

    /// Every member's status, each asked for its own (`None` without
    /// peers).
    pub async fn cluster_status(&self) -> Option<ClusterStatus> {
        let cluster = self.inner.cluster.clone()?;
        let raft = self.inner.raft.clone();
        self.inner
            .thread
            .run(async move { cluster.status(&raft).await })
            .await
            .ok()
    }

    /// Adds node `id`, reached at `addr`, to the group: it joins as a
    /// learner, catches up, then votes. Passed to the leader from any node.
    pub async fn add_node(&self, id: NodeId, addr: String) -> Result<(), MembershipError> {
        self.membership(move |cluster, raft| async move { cluster.add_node(&raft, id, addr).await })
            .await
    }

    /// Removes node `id` from the group. Passed to the leader from any node.
    pub async fn remove_node(&self, id: NodeId) -> Result<(), MembershipError> {
        self.membership(move |cluster, raft| async move { cluster.remove_node(&raft, id).await })
            .await
    }

    async fn membership<F, Fut>(&self, change: F) -> Result<(), MembershipError>
    where
        F: FnOnce(Arc<Cluster>, Raft<TypeConfig>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), MembershipError>> + Send + 'static,
    {
        let Some(cluster) = self.inner.cluster.clone() else {
            return Err(MembershipError::Refused(
                "this node was started without a cluster listener".into(),
            ));
        };
        let raft = self.inner.raft.clone();
        self.inner
            .thread
            .run(change(cluster, raft))
            .await
            .map_err(MembershipError::Unavailable)?
    }

    /// Term, leader and indexes, as raft reports them now.
    pub fn raft_figures(&self) -> crate::stats::RaftFigures {
        let metrics = self.inner.raft.metrics().borrow().clone();
        crate::stats::RaftFigures {
            term: metrics.current_term,
            leader: metrics.current_leader,
            last_log_index: metrics.last_log_index,
            commit_index: self.inner.log.committed_index(),
            applied_index: metrics.last_applied.map(|id| id.index),
            is_leader: self.is_leader(),
        }
    }

    /// Counters of the store's file activity.
    pub fn stats(&self) -> StoreStats {
        let counters = &self.inner.counters;
        StoreStats {
            log_commits: Counters::get(&counters.log_commits),
            log_entries_written: Counters::get(&counters.log_entries_written),
            log_direct_writes: Counters::get(&counters.log_direct_writes),
            log_len: self.inner.log.len(),
            snapshots_built: Counters::get(&counters.snapshots_built),
            snapshots_piecewise: Counters::get(&counters.snapshots_piecewise),
            snapshot_index: self.inner.state.snapshot_index(),
            applied_index: self.inner.state.read().last_applied.map(|id| id.index),
            log_write_buckets: std::array::from_fn(|i| {
                Counters::get(&counters.log_write_buckets[i])
            }),
            log_write_us: Counters::get(&counters.log_write_us),
        }
    }
}

/// The write error of a raft that stopped.
pub(crate) fn fatal_error(fatal: Fatal<NodeId>) -> WriteError {
    match fatal {
        Fatal::Stopped => WriteError::Stopped,
        Fatal::StorageError(e) => WriteError::Storage(e.to_string()),
        other => WriteError::Raft(other.to_string()),
    }
}

async fn open(
    location: Location,
    config: StoreConfig,
    on_apply: ApplyHook,
    options: NodeOptions,
) -> Result<StoreNode, OpenError> {
    let counters = Arc::new(Counters::default());
    let recovered = {
        let options = options.clone();
        let counters = counters.clone();
        tokio::task::spawn_blocking(move || recover(&location, config, &options, counters))
            .await
            .map_err(OpenError::start)??
    };
    let mut raft_config = openraft::Config {
        cluster_name: "mqkv-state-store".into(),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_every.max(1)),
        max_in_snapshot_log_to_keep: options.logs_kept_after_snapshot,
        replication_lag_threshold: options.snapshot_every.max(1).saturating_mul(2),
        ..Default::default()
    };
    if options.cluster.is_some() {
        // Heartbeats and elections paced for nodes that share busy CPUs and
        // sync a disk: a leader that is merely slow for a moment is not
        // deposed, one that died is replaced within one to two seconds.
        // openraft also gives every append-entries call (a follower's write
        // and sync included) one heartbeat interval to answer.
        raft_config.heartbeat_interval = 200;
        raft_config.election_timeout_min = 800;
        raft_config.election_timeout_max = 1600;
        // Log entries are batches of up to a few MiB each; a bounded number
        // per message keeps every message far below the links' frame limit.
        raft_config.max_payload_entries = 64;
    }
    let raft_config = raft_config.validate().map_err(OpenError::start)?;
    let listener = match &options.cluster {
        Some(cluster) => Some(
            std::net::TcpListener::bind(cluster.listen)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| {
                    OpenError::Start(format!(
                        "cannot listen for other nodes on {}: {e}",
                        cluster.listen
                    ))
                })?,
        ),
        None => None,
    };

    let Recovered {
        log,
        state,
        node_id,
        last_index,
        log_path,
    } = recovered;
    let log_shared = log.shared();
    let thread = match RaftThread::start(options.thread.clone()) {
        Ok(thread) => thread,
        Err(e) => {
            let _ = log_shared.close().await;
            state.close();
            return Err(OpenError::start(e));
        }
    };
    let started = {
        let state = state.clone();
        let counters = counters.clone();
        let snapshot_log_bytes = options.snapshot_log_bytes;
        let log_for_proposer = log_shared.clone();
        // Two snapshot periods: one being built while the next fills.
        let max_log_entries = options.snapshot_every.max(1).saturating_mul(2);
        let cluster_options = options.cluster.clone();
        // Raft's tasks, the proposer's and the cluster listener's are
        // spawned on the raft thread.
        thread
            .run(async move {
                let cluster = cluster_options.as_ref().map(|c| {
                    let credentials = crate::wire::Credentials {
                        secret: Arc::from(c.secret.as_slice()),
                        tls: c.tls.clone(),
                    };
                    let peers = Arc::new(Peers::new(node_id, credentials));
                    Arc::new(Cluster::new(peers, c.advertised()))
                });
                let network = Network {
                    peers: cluster.as_ref().map(|c| c.peers.clone()),
                };
                let raft = Raft::new(
                    node_id,
                    Arc::new(raft_config),
                    network,
                    log,
                    StateMachineStore::new(state),
                )
                .await
                .map_err(OpenError::start)?;
                let quorum_wait = cluster_options
                    .as_ref()
                    .map_or(Duration::ZERO, |c| c.quorum_wait);
                // Only with peers: alone, one proposal at a time makes the larger batches.
                let depth = match &cluster {
                    Some(_) => cluster_options.as_ref().map_or(1, |c| c.pipeline_depth),
                    None => 1,
                };
                let route = Route::new(
                    raft.clone(),
                    cluster.as_ref().map(|c| c.peers.clone()),
                    quorum_wait,
                );
                let reads = cluster.as_ref().map(|_| ReadBarrier::start(route.clone()));
                if let Some(cluster) = &cluster {
                    cluster.start_outbox(raft.clone());
                }
                if let (Some(listener), Some(cluster)) = (listener, &cluster) {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).map_err(OpenError::start)?;
                    tokio::spawn(cluster::serve(
                        listener,
                        raft.clone(),
                        route.clone(),
                        cluster.clone(),
                    ));
                }
                let proposer = Proposer::start(
                    raft.clone(),
                    route.clone(),
                    counters,
                    snapshot_log_bytes,
                    log_for_proposer,
                    max_log_entries,
                    depth,
                );
                if let Some(cluster) = &cluster {
                    let _ = cluster.proposals.set(proposer.handle());
                }
                Ok::<_, OpenError>((raft, proposer, route, reads, cluster))
            })
            .await
    };
    let (raft, proposer, route, reads, cluster) =
        match started.map_err(OpenError::Start).and_then(|r| r) {
            Ok(started) => started,
            Err(e) => {
                thread.stop();
                let _ = log_shared.close().await;
                state.close();
                return Err(e);
            }
        };
    let node = StoreNode {
        inner: Arc::new(Inner {
            proposer,
            thread,
            raft,
            state,
            log: log_shared,
            counters,
            node_id,
            log_path,
            route,
            reads,
            cluster,
        }),
    };
    match become_ready(&node, &options, last_index).await {
        Ok(()) => {
            node.inner.state.install_hook(on_apply);
            Ok(node)
        }
        Err(e) => {
            let _ = node.shutdown().await;
            Err(e)
        }
    }
}

/// Initialises a new store as a one-member group, then, if this node is
/// the only voter, waits until it leads and has applied every entry found
/// in the log at startup.
async fn become_ready(
    node: &StoreNode,
    options: &NodeOptions,
    last_index: Option<u64>,
) -> Result<(), OpenError> {
    let raft = &node.inner.raft;
    let id = node.inner.node_id;
    if !raft.is_initialized().await.map_err(OpenError::start)? {
        match &options.cluster {
            None => {
                let members = BTreeMap::from([(id, BasicNode::new(&options.advertise_addr))]);
                raft.initialize(members).await.map_err(OpenError::start)?;
            }
            // Added to a running group later; nothing to wait for now.
            Some(cluster) if cluster.join => return Ok(()),
            Some(cluster) => {
                let members = cluster.initial_members(id).map_err(OpenError::Start)?;
                // Every first member does this with the same list, which
                // forms one group; a member that already heard from the
                // others has a log and is refused, which is what it needs.
                match raft.initialize(members).await {
                    Ok(()) => tracing::info!(node = id, "cluster formed"),
                    Err(openraft::error::RaftError::APIError(
                        openraft::error::InitializeError::NotAllowed(_),
                    )) => {}
                    Err(e) => return Err(OpenError::start(e)),
                }
            }
        }
    }
    let metrics = raft
        .wait(Some(options.ready_timeout))
        .metrics(
            |m| {
                let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
                // In a one-member group nobody else can lead or commit:
                // wait for this node to take over and apply its whole log,
                // or the first write would be refused and the hook would
                // see old entries. In a larger group the log beyond the
                // commit point is applied once the leader says so.
                let ready = voters != [id]
                    || (m.current_leader == Some(id)
                        && m.last_applied.map(|applied| applied.index) >= last_index);
                m.running_state.is_err() || (!voters.is_empty() && ready)
            },
            "recovery",
        )
        .await
        .map_err(OpenError::start)?;
    metrics.running_state.map_err(OpenError::start)
}
