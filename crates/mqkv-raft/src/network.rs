//! Raft's view of the other nodes: its RPCs, carried over the peer links
//! (see `peer`). A one-member group that was started without a cluster
//! listener sends none; asked to, it reports the peer unreachable.

use std::sync::Arc;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, Unreachable as UnreachableError,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};

use crate::peer::{CallError, Peer, Peers};
use crate::rpc::{Request, Response};
use crate::types::{NodeId, TypeConfig};

/// Hands out a client per peer.
pub(crate) struct Network {
    pub(crate) peers: Option<Arc<Peers>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        PeerClient {
            target,
            peer: self
                .peers
                .as_ref()
                .map(|peers| peers.get(target, &node.addr)),
        }
    }
}

/// Raft's client of one peer.
pub(crate) struct PeerClient {
    target: NodeId,
    /// `None` without a cluster listener.
    peer: Option<Arc<Peer>>,
}

#[derive(Debug, thiserror::Error)]
#[error("node {0} is unreachable: this node was started without a cluster listener")]
struct NoTransport(NodeId);

#[derive(Debug, thiserror::Error)]
#[error("node {0} answered a {1} request with something else")]
struct WrongAnswer(NodeId, &'static str);

// openraft's `RaftNetwork` trait fixes these error types, large as they are.
#[allow(clippy::result_large_err)]
type Rpc<T, E = RaftError<NodeId>> = Result<T, RPCError<NodeId, BasicNode, E>>;

#[allow(clippy::result_large_err)]
impl PeerClient {
    async fn call<E: std::error::Error>(
        &self,
        request: Request,
        option: &RPCOption,
    ) -> Rpc<Response, E> {
        let Some(peer) = &self.peer else {
            return Err(RPCError::Unreachable(UnreachableError::new(&NoTransport(
                self.target,
            ))));
        };
        peer.call(request, option.hard_ttl())
            .await
            .map_err(|e| match e {
                CallError::Unreachable { .. } => RPCError::Unreachable(UnreachableError::new(&e)),
                CallError::Timeout { .. } => RPCError::Network(NetworkError::new(&e)),
            })
    }

    fn wrong<E: std::error::Error>(&self, what: &'static str) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Network(NetworkError::new(&WrongAnswer(self.target, what)))
    }

    fn remote<T, E: std::error::Error>(
        &self,
        answer: Result<T, RaftError<NodeId, E>>,
    ) -> Rpc<T, RaftError<NodeId, E>> {
        answer.map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<AppendEntriesResponse<NodeId>> {
        match self.call(Request::AppendEntries(rpc), &option).await? {
            Response::AppendEntries(answer) => self.remote(answer),
            _ => Err(self.wrong("append-entries")),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        match self.call(Request::InstallSnapshot(rpc), &option).await? {
            Response::InstallSnapshot(answer) => self.remote(answer),
            _ => Err(self.wrong("install-snapshot")),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Rpc<VoteResponse<NodeId>> {
        match self.call(Request::Vote(rpc), &option).await? {
            Response::Vote(answer) => self.remote(answer),
            _ => Err(self.wrong("vote")),
        }
    }
}
