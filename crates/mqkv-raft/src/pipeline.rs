//! Pipelined writes: a proposal is handed to the leader and the next one follows at once,
//! before the first is committed, so several batches are on their way to the followers
//! together and a network round trip does not hold up the writes behind it.
//!
//! Order: proposals submitted one after another by one task are proposed in that order. On
//! the leader, [`Route::submit`] hands the proposal to raft (`client_write_ff`: queued, not
//! waited for); on a follower, it sends it over the link to the leader, which reads requests of
//! one link in order and queues each write on its own proposer before it reads the next
//! ([`leader_submit`]). Only a proposal that has to be sent again (leadership moved, a
//! link broke) can land behind one submitted after it; it goes the way of [`Route::write`],
//! which answers a write the old leader did commit from the de-duplication table.

use openraft::error::ClientWriteError;
use openraft::raft::ClientWriteResult;
use tokio::sync::oneshot;
use tokio::time::Instant;

use std::sync::Arc;

use crate::peer::Sent;
use crate::proposer::{PendingWrite, Proposals};
use crate::route::{remaining, Route};
use crate::rpc::{Refusal, Request, Response};
use crate::types::{Outcome, Proposal, TypeConfig};
use crate::WriteError;

type Committed = oneshot::Receiver<ClientWriteResult<TypeConfig>>;

/// A proposal handed over, not yet answered.
pub(crate) struct InFlight {
    proposal: Proposal,
    deadline: Instant,
    waiting: Waiting,
}

enum Waiting {
    /// Proposed to raft on this node, the leader.
    Here(Committed),
    /// Sent to the leader.
    Leader(Sent),
    /// Not handed over in order; written the usual way.
    Again,
    Failed(WriteError),
}

/// What the leader's raft said of a proposal, as a follower is told it.
pub(crate) type LeaderAnswer = Result<(u64, Vec<Outcome>), Refusal>;

impl Route {
    /// Hands `proposal` to the leader and returns once it is on its way (see the module
    /// documentation for the order this keeps).
    pub(crate) async fn submit(&self, proposal: Proposal) -> InFlight {
        let deadline = Instant::now() + self.quorum_wait;
        let waiting = match self.hand_over(&proposal, deadline).await {
            Ok(waiting) => waiting,
            Err(e) => Waiting::Failed(e),
        };
        InFlight {
            proposal,
            deadline,
            waiting,
        }
    }

    async fn hand_over(
        &self,
        proposal: &Proposal,
        deadline: Instant,
    ) -> Result<Waiting, WriteError> {
        let me = self.peers.as_ref().map(|p| p.me());
        let leader = match me {
            None => None,
            Some(_) => Some(self.wait_for_leader(deadline).await?),
        };
        if leader == me {
            return self
                .raft
                .client_write_ff(proposal.clone())
                .await
                .map(Waiting::Here)
                .map_err(crate::node::fatal_error);
        }
        let (Some(peers), Some(leader)) = (&self.peers, leader) else {
            return Ok(Waiting::Again);
        };
        let Some(peer) = self.peer(peers, leader) else {
            return Ok(Waiting::Again);
        };
        Ok(match peer.send(Request::Write(proposal.clone())).await {
            Ok(sent) => Waiting::Leader(sent),
            Err(_) => Waiting::Again,
        })
    }

    /// What applying a submitted proposal answered, once this node has applied it.
    pub(crate) async fn finish(&self, flight: InFlight) -> Result<(u64, Vec<Outcome>), WriteError> {
        let InFlight {
            proposal,
            deadline,
            waiting,
        } = flight;
        match waiting {
            Waiting::Failed(e) => Err(e),
            Waiting::Again => self.write(proposal).await,
            Waiting::Here(committed) => match tokio::time::timeout_at(deadline, committed).await {
                Err(_) => Err(self.no_quorum()),
                Ok(Err(_)) => Err(WriteError::Stopped),
                Ok(Ok(Ok(written))) => Ok((written.log_id.index, written.data)),
                Ok(Ok(Err(ClientWriteError::ForwardToLeader(_)))) => self.write(proposal).await,
                Ok(Ok(Err(e))) => Err(WriteError::Raft(e.to_string())),
            },
            Waiting::Leader(sent) => {
                match tokio::time::timeout(remaining(deadline), sent.answer()).await {
                    Err(_) => Err(self.no_quorum()),
                    Ok(Ok(Response::Write(Ok((index, outcomes))))) => {
                        self.wait_applied(index, deadline).await?;
                        Ok((index, outcomes))
                    }
                    Ok(Ok(Response::Write(Err(Refusal::Failed(why))))) => {
                        Err(WriteError::Raft(why))
                    }
                    Ok(Ok(Response::Write(Err(Refusal::NotLeader(_))))) | Ok(Err(_)) => {
                        self.write(proposal).await
                    }
                    Ok(Ok(other)) => Err(WriteError::Raft(format!(
                        "the leader answered a write with {other:?}"
                    ))),
                }
            }
        }
    }
}

/// A follower's proposal, queued on the leader's proposer in the order its link brought it:
/// proposed with the leader's own writes and those of the other followers, in one entry.
pub(crate) fn leader_submit(proposals: &Proposals, proposal: Proposal) -> Vec<PendingWrite> {
    let entries = Arc::try_unwrap(proposal.0).unwrap_or_else(|shared| (*shared).clone());
    entries.into_iter().map(|e| proposals.propose(e)).collect()
}

/// The answer to a follower's proposal: the index of the last entry that carried a part of it,
/// and every outcome, in order.
pub(crate) async fn leader_finish(pending: Vec<PendingWrite>) -> LeaderAnswer {
    let mut index = 0;
    let mut outcomes = Vec::with_capacity(pending.len());
    for p in pending {
        match p.indexed().await {
            Ok((i, applied)) => {
                index = index.max(i);
                outcomes.push(Outcome::from(applied));
            }
            Err(WriteError::NotLeader { leader }) => return Err(Refusal::NotLeader(leader)),
            Err(e) => return Err(Refusal::Failed(e.to_string())),
        }
    }
    Ok((index, outcomes))
}
