//! Node-to-node transport.
//!
//! A one-member group never sends an RPC, so for now every peer is
//! unreachable. Clustering replaces [`Unreachable`] with a real client; the
//! rest of the crate does not change, because raft only sees the
//! [`openraft::RaftNetworkFactory`] trait.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable as UnreachableError};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetwork, RaftNetworkFactory};

use crate::types::{NodeId, TypeConfig};

/// Hands out a client per peer.
pub(crate) struct Network;

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Unreachable;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Unreachable {
        Unreachable { target }
    }
}

/// A peer this build cannot talk to.
pub(crate) struct Unreachable {
    target: NodeId,
}

#[derive(Debug, thiserror::Error)]
#[error("node {0} is unreachable: this build has no node-to-node transport")]
struct NoTransport(NodeId);

impl Unreachable {
    fn error<E: std::error::Error>(&self) -> RPCError<NodeId, BasicNode, E> {
        RPCError::Unreachable(UnreachableError::new(&NoTransport(self.target)))
    }
}

impl RaftNetwork<TypeConfig> for Unreachable {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.error())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(self.error())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(self.error())
    }
}
