//! Where a proposal or a read goes: straight into raft on the leader, to
//! the leader over its link on a follower.
//!
//! A write proposed on a follower is proposed by the leader; the follower
//! answers only once it has applied the entry itself, so the apply hook
//! (key notifications to this node's observers) has run and a read on this
//! node that follows the answer sees the write.
//!
//! A linearizable read waits for a read index: the leader confirms with a
//! quorum that it still leads (a heartbeat round; no clock is trusted, so
//! drift between the nodes cannot make a read stale), and the log index it
//! had committed then is what this node must have applied before it reads.
//! Reads that arrive while a round is under way share the next round.
//!
//! Invariants:
//! - in a one-member group without peers, a write is exactly
//!   `client_write` and a read needs no round (every acknowledged write is
//!   already applied on the only node);
//! - no call waits longer than the quorum wait: without a leader that can
//!   reach a quorum, it fails with [`WriteError::Unavailable`] instead.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{Raft, ServerState};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::peer::{Peer, Peers};
use crate::rpc::{Refusal, Request, Response};
use crate::types::{NodeId, Outcome, Proposal, TypeConfig};
use crate::WriteError;

/// How long a retry waits after a refusal that names no new leader.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Routes writes and reads of one node.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) raft: Raft<TypeConfig>,
    /// `None` for a node without peers.
    pub(crate) peers: Option<Arc<Peers>>,
    pub(crate) quorum_wait: Duration,
}

impl Route {
    pub(crate) fn new(
        raft: Raft<TypeConfig>,
        peers: Option<Arc<Peers>>,
        quorum_wait: Duration,
    ) -> Route {
        Route {
            raft,
            peers,
            quorum_wait,
        }
    }

    /// Proposes `proposal` and gives the log index of its entry and what applying it
    /// answered.
    pub(crate) async fn write(
        &self,
        proposal: Proposal,
    ) -> Result<(u64, Vec<Outcome>), WriteError> {
        let Some(peers) = &self.peers else {
            return self
                .raft
                .client_write(proposal)
                .await
                .map(|w| (w.log_id.index, w.data))
                .map_err(write_error);
        };
        let deadline = Instant::now() + self.quorum_wait;
        loop {
            let leader = self.wait_for_leader(deadline).await?;
            if leader == peers.me() {
                match tokio::time::timeout_at(deadline, self.raft.client_write(proposal.clone()))
                    .await
                {
                    Err(_) => return Err(self.no_quorum()),
                    Ok(Ok(written)) => return Ok((written.log_id.index, written.data)),
                    Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
                        self.pause(deadline).await?;
                    }
                    Ok(Err(e)) => return Err(write_error(e)),
                }
                continue;
            }
            let Some(peer) = self.peer(peers, leader) else {
                self.pause(deadline).await?;
                continue;
            };
            let answer = peer
                .call(Request::Write(proposal.clone()), remaining(deadline))
                .await;
            match answer {
                Ok(Response::Write(Ok((index, outcomes)))) => {
                    self.wait_applied(index, deadline).await?;
                    return Ok((index, outcomes));
                }
                Ok(Response::Write(Err(Refusal::Failed(why)))) => {
                    return Err(WriteError::Raft(why))
                }
                Ok(Response::Write(Err(Refusal::NotLeader(_)))) | Err(_) => {
                    // Leadership moved, or the leader went away: ask again
                    // whoever leads next. A write the old leader committed
                    // before it went is answered again from the
                    // de-duplication table, not applied twice.
                    self.pause(deadline).await?;
                }
                Ok(other) => {
                    return Err(WriteError::Raft(format!(
                        "the leader answered a write with {other:?}"
                    )))
                }
            }
        }
    }

    /// Waits until a read on this node sees every write acknowledged
    /// anywhere before the call.
    pub(crate) async fn read_index(&self) -> Result<(), WriteError> {
        let Some(peers) = &self.peers else {
            return Ok(());
        };
        let deadline = Instant::now() + self.quorum_wait;
        loop {
            let leader = self.wait_for_leader(deadline).await?;
            let index = if leader == peers.me() {
                match tokio::time::timeout_at(deadline, self.raft.get_read_log_id()).await {
                    Err(_) => return Err(self.no_quorum()),
                    Ok(Ok((read, _applied))) => Ok(read.map_or(0, |l| l.index)),
                    Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(_))))
                    | Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                        Err(())
                    }
                    Ok(Err(RaftError::Fatal(f))) => return Err(crate::node::fatal_error(f)),
                }
            } else {
                match self.peer(peers, leader) {
                    None => Err(()),
                    Some(peer) => match peer.call(Request::ReadIndex, remaining(deadline)).await {
                        Ok(Response::ReadIndex(Ok(index))) => Ok(index),
                        Ok(Response::ReadIndex(Err(Refusal::Failed(why)))) => {
                            return Err(WriteError::Raft(why))
                        }
                        _ => Err(()),
                    },
                }
            };
            match index {
                Ok(index) => return self.wait_applied(index, deadline).await,
                Err(()) => self.pause(deadline).await?,
            }
        }
    }

    /// The leader's read index, asked of this node by a follower.
    pub(crate) async fn leader_read_index(&self) -> Result<u64, Refusal> {
        match tokio::time::timeout(self.quorum_wait, self.raft.get_read_log_id()).await {
            Err(_) => Err(Refusal::Failed(self.no_quorum().to_string())),
            Ok(Ok((read, _))) => Ok(read.map_or(0, |l| l.index)),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Err(Refusal::NotLeader(f.leader_id))
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                Err(Refusal::NotLeader(None))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(Refusal::Failed(f.to_string())),
        }
    }

    /// True while this node leads (and so may propose key expiry).
    pub(crate) fn is_leader(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(m.id)
    }

    pub(crate) fn no_quorum(&self) -> WriteError {
        WriteError::Unavailable(format!(
            "no leader with a quorum answered within {} ms",
            self.quorum_wait.as_millis()
        ))
    }

    async fn pause(&self, deadline: Instant) -> Result<(), WriteError> {
        if Instant::now() + RETRY_PAUSE >= deadline {
            return Err(self.no_quorum());
        }
        tokio::time::sleep(RETRY_PAUSE).await;
        Ok(())
    }

    pub(crate) fn peer(&self, peers: &Peers, leader: NodeId) -> Option<Arc<Peer>> {
        peers.member(&self.raft, leader)
    }

    pub(crate) async fn wait_for_leader(&self, deadline: Instant) -> Result<NodeId, WriteError> {
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(leader) = metrics.borrow_and_update().current_leader {
                return Ok(leader);
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Err(_) => return Err(self.no_quorum()),
                Ok(Err(_)) => return Err(WriteError::Stopped),
                Ok(Ok(())) => {}
            }
        }
    }

    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        deadline: Instant,
    ) -> Result<(), WriteError> {
        self.raft
            .wait(Some(remaining(deadline)))
            .applied_index_at_least(Some(index), "linearizable")
            .await
            .map(drop)
            .map_err(|e| match e {
                openraft::metrics::WaitError::ShuttingDown => WriteError::Stopped,
                openraft::metrics::WaitError::Timeout(..) => WriteError::Unavailable(format!(
                    "this node did not catch up with the leader (entry {index}) within {} ms",
                    self.quorum_wait.as_millis()
                )),
            })
    }
}

pub(crate) fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// A `client_write` error as a write error.
pub(crate) fn write_error(
    e: RaftError<NodeId, ClientWriteError<NodeId, openraft::BasicNode>>,
) -> WriteError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => WriteError::NotLeader {
            leader: forward.leader_id,
        },
        RaftError::APIError(other) => WriteError::Raft(other.to_string()),
        RaftError::Fatal(fatal) => crate::node::fatal_error(fatal),
    }
}

type Waiter = oneshot::Sender<Result<(), WriteError>>;

/// Linearizable reads, many to a round.
pub(crate) struct ReadBarrier {
    tx: mpsc::UnboundedSender<Waiter>,
}

impl ReadBarrier {
    /// Starts the rounds' task on the current runtime.
    pub(crate) fn start(route: Route) -> ReadBarrier {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(rounds(route, rx));
        ReadBarrier { tx }
    }

    /// Resolves once a read on this node is linearizable: in a round that
    /// started after this call.
    pub(crate) fn wait(
        &self,
    ) -> impl std::future::Future<Output = Result<(), WriteError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let queued = self.tx.send(tx).is_ok();
        async move {
            if !queued {
                return Err(WriteError::Stopped);
            }
            rx.await.unwrap_or(Err(WriteError::Stopped))
        }
    }
}

async fn rounds(route: Route, mut rx: mpsc::UnboundedReceiver<Waiter>) {
    while let Some(first) = rx.recv().await {
        let mut waiters = vec![first];
        while let Ok(more) = rx.try_recv() {
            waiters.push(more);
        }
        let result = route.read_index().await;
        for waiter in waiters {
            let _ = waiter.send(result.clone());
        }
    }
}
