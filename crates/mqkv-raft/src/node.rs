//! [`StoreNode`]: opening, recovering, writing to and reading from a store.
//!
//! Invariant: a `StoreNode` is handed out only after recovery is complete —
//! the snapshot is loaded, every entry of the log is applied (without the
//! apply hook), and, in a one-member group, this node is the leader — so
//! the first `write` neither fails nor makes the hook see old entries.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mqkv_store::{Entry, StateMachine, StoreConfig};
use openraft::error::Fatal;
use openraft::{BasicNode, Raft, SnapshotPolicy};

use crate::cluster::{self, Cluster, ClusterOptions, MembershipError};
use crate::files::{self, corrupt, io_error, read_meta, FileKind, Location};
use crate::log_store::{LogShared, LogStore};
use crate::network::Network;
use crate::peer::Peers;
use crate::proposer::{PendingWrite, Proposer};
use crate::route::{ReadBarrier, Route};
use crate::runtime::{RaftThread, SharedThread};
use crate::snapshot_file::{self, SnapshotFile, StoredSnapshot, STORE_CONFIG_META};
use crate::state_machine::{AppliedState, Keep, StateMachineStore, StateShared};
use crate::stats::{Counters, StoreStats};
use crate::status::ClusterStatus;
use crate::types::{LogId, Membership, NodeId, TypeConfig, DEFAULT_NODE_ID};
use crate::{legacy_log, log_file};
use crate::{ApplyHook, OpenError, ShutdownError, WriteError};

/// Tuning of a store. The defaults suit a server; tests shrink the
/// snapshot interval to exercise snapshots and purging quickly.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Raft node id of a newly created store. An existing store keeps the
    /// id it was created with.
    pub node_id: NodeId,
    /// Address other nodes reach this one at, recorded in the membership
    /// when the store is created.
    pub advertise_addr: String,
    /// Build a snapshot once this many log entries were applied since the
    /// last one. A log entry carries one write, or several written
    /// concurrently (group commit). Should a snapshot take so long that
    /// twice this many entries follow the newest one, writes wait for it
    /// (up to 5 s).
    pub snapshot_every: u64,
    /// Also build a snapshot once the log written since the last one is
    /// larger than this many bytes and than that snapshot (so a run of big
    /// values cannot make the log outgrow the state it leads to).
    pub snapshot_log_bytes: u64,
    /// Log entries kept behind the latest snapshot (so a follower that lags
    /// a little catches up from the log, not a snapshot).
    pub logs_kept_after_snapshot: u64,
    /// Start a new log segment file once the current one is this long.
    /// Segments are deleted whole once a snapshot covers every entry in
    /// them.
    pub log_segment_bytes: u64,
    /// How long opening waits for a one-member group to elect this node.
    pub ready_timeout: Duration,
    /// A state of at least this many keys is snapshotted piecewise: frozen
    /// at one moment and serialized a piece at a time, writes going on
    /// between the pieces. Serialized whole, a million keys would hold
    /// writes up for a large fraction of a second.
    pub piecewise_snapshot_keys: usize,
    /// Run raft on this thread instead of one of its own (see
    /// [`SharedThread`]); the log's appends are then made durable while the
    /// thread goes on: as direct writes (see `direct_log_writes`), or
    /// synced on a thread of their own.
    pub thread: Option<SharedThread>,
    /// With `thread`, write the log's appends with direct I/O through
    /// io_uring (`O_DIRECT`, `RWF_DSYNC`: durable when done, no page cache
    /// copy, no sync thread), where the system allows it; otherwise, or if
    /// false, through the page cache and an `fdatasync` on a sync thread.
    pub direct_log_writes: bool,
    /// Run as a member of a group of several nodes (see
    /// [`ClusterOptions`]); `None` is a one-member group that talks to
    /// nobody. `node_id` is then the node's id in the group.
    pub cluster: Option<ClusterOptions>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_id: DEFAULT_NODE_ID,
            advertise_addr: String::new(),
            snapshot_every: 10_000,
            snapshot_log_bytes: 64 << 20,
            logs_kept_after_snapshot: 1_000,
            log_segment_bytes: 64 << 20,
            ready_timeout: Duration::from_secs(30),
            piecewise_snapshot_keys: 10_000,
            thread: None,
            direct_log_writes: true,
            cluster: None,
        }
    }
}

impl NodeOptions {
    /// The defaults of a memory store (see [`StoreNode::open_memory`]).
    pub fn memory() -> NodeOptions {
        NodeOptions {
            snapshot_every: 1_000,
            logs_kept_after_snapshot: 0,
            ..NodeOptions::default()
        }
    }
}

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

fn start_error(e: impl std::fmt::Display) -> OpenError {
    OpenError::Start(e.to_string())
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
            .map_err(start_error)??
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
    let raft_config = raft_config.validate().map_err(start_error)?;
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
            return Err(start_error(e));
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
                    let peers = Arc::new(Peers::new(node_id, Arc::from(c.secret.as_slice())));
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
                .map_err(start_error)?;
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
                        tokio::net::TcpListener::from_std(listener).map_err(start_error)?;
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
    if !raft.is_initialized().await.map_err(start_error)? {
        match &options.cluster {
            None => {
                let members = BTreeMap::from([(id, BasicNode::new(&options.advertise_addr))]);
                raft.initialize(members).await.map_err(start_error)?;
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
                    Err(e) => return Err(start_error(e)),
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
        .map_err(start_error)?;
    metrics.running_state.map_err(start_error)
}

/// Files opened and checked, state rebuilt from the snapshot: what raft
/// starts from.
pub(crate) struct Recovered {
    pub(crate) log: LogStore,
    pub(crate) state: Arc<StateShared>,
    pub(crate) node_id: NodeId,
    pub(crate) last_index: Option<u64>,
    pub(crate) log_path: PathBuf,
}

pub(crate) fn recover(
    location: &Location,
    config: StoreConfig,
    options: &NodeOptions,
    counters: Arc<Counters>,
) -> Result<Recovered, OpenError> {
    if let Location::Disk(dir) = location {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    }
    // Existing files are checked before anything is created, so a refused
    // directory gains no new file.
    let log = match location {
        Location::Disk(dir) => {
            legacy_log::convert(dir)?;
            log_file::open(dir, options.log_segment_bytes)?
        }
        Location::Memory => None,
    };
    let state_file = files::open_existing(location, FileKind::State)?;
    let snapshot = match &state_file {
        Some(file) => snapshot_file::load(&file.db, &file.path)?,
        None => None,
    };
    let (last_purged, log_is_new) = match &log {
        Some((_, loaded)) => (loaded.last_purged, loaded.is_new()),
        None => (None, true),
    };
    check_consistency(location, last_purged, log_is_new, snapshot.as_ref())?;
    let log = match (location, log) {
        (_, Some(log)) => Some(log),
        (Location::Disk(dir), None) => Some(log_file::create(
            dir,
            options.node_id,
            options.log_segment_bytes,
        )?),
        (Location::Memory, None) => None,
    };
    let state_file = match state_file {
        Some(file) => file,
        None => {
            let config_bytes = postcard::to_stdvec(&config).map_err(start_error)?;
            files::create(
                location,
                FileKind::State,
                &[(STORE_CONFIG_META, config_bytes)],
            )?
        }
    };
    let node_id = match &log {
        Some((_, loaded)) => loaded.node_id,
        None => options.node_id,
    };
    if options.cluster.is_some() && node_id != options.node_id {
        // A node answering to another id would vote and hold log entries
        // under a name the group gave to someone else.
        return Err(OpenError::Inconsistent {
            dir: location.dir(),
            reason: format!(
                "it belongs to node {node_id}, but this node was started as node {}",
                options.node_id
            ),
        });
    }
    let stored_config = read_meta(&state_file.db, STORE_CONFIG_META, &state_file.path)?
        .ok_or_else(|| corrupt(&state_file.path, "it records no store configuration"))?;
    let stored_config: StoreConfig = postcard::from_bytes(&stored_config).map_err(|e| {
        corrupt(
            &state_file.path,
            format!("its store configuration does not decode: {e}"),
        )
    })?;
    if stored_config.node_id != config.node_id {
        // Versions must keep their node id for the life of the store.
        tracing::warn!(
            store = %state_file.path.display(),
            stored = %stored_config.node_id,
            given = %config.node_id,
            "the store keeps the node id it was created with"
        );
    }
    // Entries are replayed under the configuration they were first applied
    // under; new limits take effect through an `Op::SetLimits` entry that the
    // caller proposes after recovery.

    let state = match &snapshot {
        Some((meta, data)) => AppliedState {
            machine: postcard::from_bytes(data).map_err(|e| {
                corrupt(
                    &state_file.path,
                    format!("the snapshot does not decode: {e}"),
                )
            })?,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        },
        None => AppliedState {
            machine: StateMachine::new(stored_config),
            last_applied: None,
            membership: Membership::default(),
        },
    };
    let last_index = log.as_ref().and_then(|(_, loaded)| loaded.last_index());
    let log_path = location.log_path();
    let log = LogStore::start(
        log,
        log_path.clone(),
        counters.clone(),
        options.thread.is_some(),
        options.direct_log_writes,
    );
    let shared = StateShared::new(
        state,
        SnapshotFile::new(state_file.db, state_file.path),
        snapshot,
        counters,
        match location {
            Location::Disk(_) => Keep::Data,
            Location::Memory => Keep::MetaOnly,
        },
        options.piecewise_snapshot_keys,
    );
    Ok(Recovered {
        log,
        state: Arc::new(shared),
        node_id,
        last_index,
        log_path,
    })
}

/// The log and the snapshot must describe one history: entries the log
/// purged must be inside the snapshot, and a snapshot needs the log (with
/// its vote) it was taken from.
fn check_consistency(
    location: &Location,
    last_purged: Option<LogId>,
    log_is_new: bool,
    snapshot: Option<&StoredSnapshot>,
) -> Result<(), OpenError> {
    let log_path = location.log_path();
    let state_path = location.path(FileKind::State);
    let snapshot_end = snapshot.and_then(|(meta, _)| meta.last_log_id);
    let inconsistent = |reason: String| OpenError::Inconsistent {
        dir: location.dir(),
        reason,
    };
    if let Some(purged) = last_purged {
        if snapshot_end < Some(purged) {
            let covered = match snapshot_end {
                Some(end) => format!("its snapshot ends at entry {}", end.index),
                None => "it holds no snapshot".to_string(),
            };
            return Err(inconsistent(format!(
                "{} is purged up to entry {}, but {} {covered}: entries in between are lost",
                log_path.display(),
                purged.index,
                state_path.display(),
            )));
        }
    }
    if let (true, Some(end)) = (log_is_new, snapshot_end) {
        return Err(inconsistent(format!(
            "{} holds a snapshot up to entry {}, but {} is empty: the log file was lost or replaced",
            state_path.display(),
            end.index,
            log_path.display(),
        )));
    }
    Ok(())
}
