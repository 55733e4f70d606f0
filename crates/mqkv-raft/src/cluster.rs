//! A node among others: its options, the listener other nodes talk to, and
//! what it answers them.
//!
//! Invariant: a request is served only on a link whose other end proved it
//! holds the cluster secret (see `wire`), and, with TLS settings, a
//! certificate of the cluster's CA (see `link_tls`), so nothing else on the
//! network can vote, append log entries, propose writes or change the
//! membership.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Raft};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::link_tls::LinkTls;
use crate::peer::Peers;
use crate::proposer::{PendingWrite, Proposals};
use crate::route::{write_error, Route};
use crate::rpc::{self, Envelope, Refusal, Request, Response};
use crate::status::{ClusterStatus, MemberStatus, STATUS_TIMEOUT};
use crate::sync;
use crate::types::{NodeId, TypeConfig};
use crate::wire;

/// How a node finds and joins the others.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where this node listens for the other nodes.
    pub listen: SocketAddr,
    /// The address the other nodes reach this one at (default: `listen`).
    pub advertise: Option<String>,
    /// The group's first members, by node id, with their cluster
    /// addresses. A new node that is one of them forms the group with the
    /// others (every one of them may do so: the same list always forms the
    /// same group). Empty: a group of this node alone, which can grow.
    pub peers: BTreeMap<NodeId, String>,
    /// Start as no member at all, waiting to be added to a running group
    /// (see [`crate::StoreNode::add_node`]).
    pub join: bool,
    /// The secret every node of the group shares.
    pub secret: Vec<u8>,
    /// TLS for the links between the nodes (see [`LinkTls`]); `None` for plain TCP.
    pub tls: Option<Arc<dyn LinkTls>>,
    /// Longest a write or a linearizable read waits for a leader that can
    /// reach a quorum before it is refused as unavailable.
    pub quorum_wait: Duration,
    /// Most proposals of this node on their way to being committed at once (see
    /// `pipeline`); 1 waits for each before proposing the next.
    pub pipeline_depth: usize,
}

/// The default [`ClusterOptions::pipeline_depth`].
pub const DEFAULT_PIPELINE_DEPTH: usize = 1;

impl ClusterOptions {
    pub(crate) fn advertised(&self) -> String {
        self.advertise
            .clone()
            .unwrap_or_else(|| self.listen.to_string())
    }

    /// The members a new group starts with.
    pub(crate) fn initial_members(
        &self,
        me: NodeId,
    ) -> Result<BTreeMap<NodeId, BasicNode>, String> {
        if self.peers.is_empty() {
            return Ok(BTreeMap::from([(me, BasicNode::new(self.advertised()))]));
        }
        if !self.peers.contains_key(&me) {
            return Err(format!(
                "the peer list names nodes {:?} but not this node ({me})",
                self.peers.keys().collect::<Vec<_>>()
            ));
        }
        Ok(self
            .peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect())
    }
}

/// Why a membership change was not made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MembershipError {
    #[error("{0}")]
    Refused(String),
    #[error("no leader could be reached: {0}")]
    Unavailable(String),
}

/// Handles a message of the application's own from another node: its sender, channel and
/// bytes. Called on the link's reading task, in the order the sender sent them: keep it short.
pub type AppHandler = Arc<dyn Fn(NodeId, u8, Vec<u8>) + Send + Sync>;

/// Application messages waiting to be sent: to whom, on which channel, what.
type Outbox = mpsc::UnboundedSender<(NodeId, u8, Vec<u8>)>;

/// What a clustered node keeps beside raft.
pub(crate) struct Cluster {
    pub(crate) peers: Arc<Peers>,
    pub(crate) advertise: String,
    client_addrs: Mutex<Vec<String>>,
    pub(crate) app: std::sync::OnceLock<AppHandler>,
    /// Application messages to send, in order (see [`send_app`]).
    pub(crate) outbox: std::sync::OnceLock<Outbox>,
    /// This node's proposer, for the writes followers send the leader.
    pub(crate) proposals: std::sync::OnceLock<Proposals>,
}

impl Cluster {
    pub(crate) fn new(peers: Arc<Peers>, advertise: String) -> Cluster {
        Cluster {
            peers,
            advertise,
            client_addrs: Mutex::default(),
            app: std::sync::OnceLock::new(),
            outbox: std::sync::OnceLock::new(),
            proposals: std::sync::OnceLock::new(),
        }
    }

    /// Queues a follower's proposal on this node's proposer (see `pipeline`).
    fn submit_write(&self, proposal: crate::types::Proposal) -> Option<Vec<PendingWrite>> {
        self.proposals
            .get()
            .map(|proposals| crate::pipeline::leader_submit(proposals, proposal))
    }

    /// Starts the task that sends application messages, on the current runtime.
    pub(crate) fn start_outbox(self: &Arc<Self>, raft: Raft<TypeConfig>) {
        let (tx, rx) = mpsc::unbounded_channel();
        if self.outbox.set(tx).is_ok() {
            tokio::spawn(send_app(self.peers.clone(), raft, rx));
        }
    }

    pub(crate) fn set_client_addrs(&self, addrs: Vec<String>) {
        *sync::lock(&self.client_addrs) = addrs;
    }

    pub(crate) fn own_status(&self, raft: &Raft<TypeConfig>) -> MemberStatus {
        let metrics = raft.metrics().borrow().clone();
        MemberStatus::from_metrics(
            &metrics,
            self.advertise.clone(),
            sync::lock(&self.client_addrs).clone(),
        )
    }

    /// Every member's own status, asked of each (at most
    /// [`STATUS_TIMEOUT`] each, all at once).
    pub(crate) async fn status(&self, raft: &Raft<TypeConfig>) -> ClusterStatus {
        let me = self.own_status(raft);
        let mut members = me.members.clone();
        if !members.iter().any(|(id, _)| *id == me.id) {
            members.push((me.id, me.cluster_addr.clone()));
        }
        let asks = members.into_iter().map(|(id, addr)| {
            let own = (id == me.id).then(|| me.clone());
            let peer = self.peers.get(id, &addr);
            async move {
                let answer = match own {
                    Some(own) => Ok(own),
                    None => match peer.call(Request::Status, STATUS_TIMEOUT).await {
                        Ok(Response::Status(s)) => Ok(*s),
                        Ok(other) => Err(format!("answered {other:?}")),
                        Err(e) => Err(e.to_string()),
                    },
                };
                (id, addr, answer)
            }
        });
        let answers = futures_util::future::join_all(asks).await;
        ClusterStatus::gather(&me, answers)
    }

    /// Adds (on the leader) or asks the leader to add a node.
    pub(crate) async fn add_node(
        &self,
        raft: &Raft<TypeConfig>,
        id: NodeId,
        addr: String,
    ) -> Result<(), MembershipError> {
        self.on_leader(
            raft,
            Request::AddNode {
                id,
                addr: addr.clone(),
            },
            || add_node(raft, id, addr.clone()),
        )
        .await
    }

    /// Removes (on the leader) or asks the leader to remove a node.
    pub(crate) async fn remove_node(
        &self,
        raft: &Raft<TypeConfig>,
        id: NodeId,
    ) -> Result<(), MembershipError> {
        self.on_leader(raft, Request::RemoveNode { id }, || remove_node(raft, id))
            .await
    }

    async fn on_leader<F, Fut>(
        &self,
        raft: &Raft<TypeConfig>,
        request: Request,
        here: F,
    ) -> Result<(), MembershipError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), Refusal>>,
    {
        let leader = raft.metrics().borrow().current_leader;
        let refused = |r: Refusal| match r {
            Refusal::NotLeader(_) => {
                MembershipError::Unavailable("the leader changed; try again".into())
            }
            Refusal::Failed(why) => MembershipError::Refused(why),
        };
        let peer = leader.and_then(|l| self.peers.member(raft, l));
        match (leader, peer) {
            (Some(l), _) if l == self.peers.me() => here().await.map_err(refused),
            (Some(_), Some(peer)) => match peer.call(request, MEMBERSHIP_TIMEOUT).await {
                Ok(Response::Membership(answer)) => answer.map_err(refused),
                Ok(other) => Err(MembershipError::Refused(format!(
                    "the leader answered {other:?}"
                ))),
                Err(e) => Err(MembershipError::Unavailable(e.to_string())),
            },
            _ => Err(MembershipError::Unavailable(
                "this node knows no leader".into(),
            )),
        }
    }
}

/// How long a membership change may take, a new node's catching up
/// included.
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(120);

fn membership_refusal(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> Refusal {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            Refusal::NotLeader(f.leader_id)
        }
        other => Refusal::Failed(write_error(other).to_string()),
    }
}

/// On the leader: the node joins as a learner, catches up (from a snapshot
/// if the log behind it was purged), then becomes a voter.
async fn add_node(raft: &Raft<TypeConfig>, id: NodeId, addr: String) -> Result<(), Refusal> {
    let already = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .any(|v| v == id);
    if already {
        return Err(Refusal::Failed(format!("node {id} is already a voter")));
    }
    tokio::time::timeout(
        MEMBERSHIP_TIMEOUT,
        raft.add_learner(id, BasicNode::new(addr), true),
    )
    .await
    .map_err(|_| {
        Refusal::Failed(format!(
            "node {id} did not catch up within {MEMBERSHIP_TIMEOUT:?}"
        ))
    })?
    .map_err(membership_refusal)?;
    let voters: BTreeSet<NodeId> = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .chain([id])
        .collect();
    raft.change_membership(voters, false)
        .await
        .map_err(membership_refusal)?;
    Ok(())
}

/// On the leader: the node leaves the group (a leader removing itself
/// hands over once the change is committed).
async fn remove_node(raft: &Raft<TypeConfig>, id: NodeId) -> Result<(), Refusal> {
    let (voters, known) = {
        let metrics = raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().filter(|v| *v != id).collect();
        (voters, membership.get_node(&id).is_some())
    };
    if !known {
        return Err(Refusal::Failed(format!("node {id} is not a member")));
    }
    if voters.is_empty() {
        return Err(Refusal::Failed("the last voter cannot be removed".into()));
    }
    raft.change_membership(voters, false)
        .await
        .map_err(membership_refusal)?;
    Ok(())
}

/// Serves the other nodes on `listener` until the runtime stops.
pub(crate) async fn serve(
    listener: TcpListener,
    raft: Raft<TypeConfig>,
    route: Route,
    cluster: Arc<Cluster>,
) {
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a cluster connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let raft = raft.clone();
        let route = route.clone();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_link(stream, raft, route, cluster).await {
                tracing::warn!(%from, error = %e, "cluster connection refused or ended");
            }
        });
    }
}

async fn serve_link(
    stream: TcpStream,
    raft: Raft<TypeConfig>,
    route: Route,
    cluster: Arc<Cluster>,
) -> Result<(), wire::LinkError> {
    let me = cluster.peers.me();
    let (mut reader, mut writer, node) =
        wire::accept(stream, cluster.peers.credentials(), me).await?;
    tracing::debug!(node, "cluster link from a peer");
    let (answers, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
    let writing = tokio::spawn(async move {
        while let Some(frame) = queue.recv().await {
            writer.write_batch(frame, &mut queue).await?;
        }
        Ok::<_, wire::LinkError>(())
    });
    let result = loop {
        let frame = match reader.read().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if cluster.peers.is_blocked(node) {
            // Fault injection: dropped, as a cut network would.
            continue;
        }
        let (id, request) = match rpc::decode::<Request>(&frame) {
            Ok(Envelope { id, body }) => (id, Ok(body)),
            Err(e) => (0, Err(e.to_string())),
        };
        // The application's messages are handled here, in the order they came.
        let request = match request {
            Ok(Request::App { channel, bytes }) => {
                if let Some(handler) = cluster.app.get() {
                    handler(node, channel, bytes);
                }
                if let Ok(frame) = rpc::encode(&Envelope {
                    id,
                    body: Response::App,
                }) {
                    let _ = answers.send(frame);
                }
                continue;
            }
            // A follower's write is handed to raft here, before the next request of this
            // link is read, so that its writes are proposed in the order it sent them.
            Ok(Request::Write(proposal)) => {
                let submitted = cluster.submit_write(proposal);
                let answers = answers.clone();
                tokio::spawn(async move {
                    let body = Response::Write(match submitted {
                        Some(pending) => crate::pipeline::leader_finish(pending).await,
                        None => Err(Refusal::Failed("the node is starting".to_owned())),
                    });
                    match rpc::encode(&Envelope { id, body }) {
                        Ok(frame) => {
                            let _ = answers.send(frame);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "an answer to a peer does not encode")
                        }
                    }
                });
                continue;
            }
            other => other,
        };
        let raft = raft.clone();
        let route = route.clone();
        let cluster = cluster.clone();
        let answers = answers.clone();
        tokio::spawn(async move {
            let body = match request {
                Ok(request) => answer(request, &raft, &route, &cluster).await,
                Err(why) => Response::Malformed(why),
            };
            match rpc::encode(&Envelope { id, body }) {
                Ok(frame) => {
                    let _ = answers.send(frame);
                }
                Err(e) => tracing::error!(error = %e, "an answer to a peer does not encode"),
            }
        });
    };
    drop(answers);
    writing.abort();
    result
}

async fn answer(
    request: Request,
    raft: &Raft<TypeConfig>,
    route: &Route,
    cluster: &Cluster,
) -> Response {
    match request {
        Request::AppendEntries(r) => Response::AppendEntries(raft.append_entries(r).await),
        Request::Vote(r) => Response::Vote(raft.vote(r).await),
        Request::InstallSnapshot(r) => Response::InstallSnapshot(raft.install_snapshot(r).await),
        Request::Write(p) => Response::Write(match cluster.submit_write(p) {
            Some(pending) => crate::pipeline::leader_finish(pending).await,
            None => Err(Refusal::Failed("the node is starting".to_owned())),
        }),
        Request::ReadIndex => Response::ReadIndex(route.leader_read_index().await),
        Request::Status => Response::Status(Box::new(cluster.own_status(raft))),
        Request::AddNode { id, addr } => Response::Membership(add_node(raft, id, addr).await),
        Request::RemoveNode { id } => Response::Membership(remove_node(raft, id).await),
        // Handled as they arrive (see `serve_link`).
        Request::App { .. } => Response::App,
    }
}

/// Sends queued application messages one after another, so each peer gets them in order. A
/// message for a node that is not a member, or cannot be reached, is dropped.
async fn send_app(
    peers: Arc<Peers>,
    raft: Raft<TypeConfig>,
    mut queue: mpsc::UnboundedReceiver<(NodeId, u8, Vec<u8>)>,
) {
    while let Some((node, channel, bytes)) = queue.recv().await {
        let Some(peer) = peers.member(&raft, node) else {
            continue;
        };
        if let Err(e) = peer.post(Request::App { channel, bytes }).await {
            tracing::debug!(node, error = %e, "an application message was not sent");
        }
    }
}
