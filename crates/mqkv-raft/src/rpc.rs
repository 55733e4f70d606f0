//! What nodes ask each other, and what they answer.
//!
//! Raft's own RPCs travel as openraft defines them. The rest serve the
//! state store: a follower hands its gathered writes to the leader
//! ([`Request::Write`]) and asks it for a read index
//! ([`Request::ReadIndex`]); any node can be asked for its status and any
//! node passes membership changes to the leader.
//!
//! Every message travels in an [`Envelope`] numbered by the asking side, so
//! one link carries many requests at once and answers may come in any
//! order.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::status::MemberStatus;
use crate::types::{NodeId, Outcome, Proposal, TypeConfig};

/// A numbered message.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Envelope<T> {
    pub(crate) id: u64,
    pub(crate) body: T,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// Store entries gathered on a follower, to be proposed as one log
    /// entry by the leader.
    Write(Proposal),
    /// The log index a linearizable read must wait for.
    ReadIndex,
    /// The asked node's own view of itself.
    Status,
    /// Add a node (as a learner until it has caught up, then as a voter).
    AddNode {
        id: NodeId,
        addr: String,
    },
    /// Remove a node from the group.
    RemoveNode {
        id: NodeId,
    },
    /// A message of the application's own (see [`crate::StoreNode::send_app`]), handled in the
    /// order it was sent.
    App {
        channel: u8,
        bytes: Vec<u8>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Response {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// The index of the log entry that carried the write, and what applying
    /// each of its store entries answered.
    Write(Result<(u64, Vec<Outcome>), Refusal>),
    ReadIndex(Result<u64, Refusal>),
    Status(Box<MemberStatus>),
    Membership(Result<(), Refusal>),
    App,
    /// The request could not be decoded.
    Malformed(String),
}

/// Why the leader did not do what a follower asked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The asked node is not the leader (any more); this one may be.
    NotLeader(Option<NodeId>),
    /// Anything else, said in words.
    Failed(String),
}

pub(crate) fn encode<T: Serialize>(message: &Envelope<T>) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_stdvec(message)
}

pub(crate) fn decode<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
) -> Result<Envelope<T>, postcard::Error> {
    postcard::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::Fatal;
    use openraft::{CommittedLeaderId, LogId, Vote};

    #[test]
    fn raft_errors_and_answers_survive_the_trip() {
        let answer = Envelope {
            id: 7,
            body: Response::AppendEntries(Err(RaftError::Fatal(Fatal::Stopped))),
        };
        let bytes = encode(&answer).expect("encode");
        let back: Envelope<Response> = decode(&bytes).expect("decode");
        assert_eq!(back.id, 7);
        assert!(matches!(
            back.body,
            Response::AppendEntries(Err(RaftError::Fatal(Fatal::Stopped)))
        ));

        let vote = Envelope {
            id: 1,
            body: Request::Vote(VoteRequest {
                vote: Vote::new(3, 2),
                last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), 40)),
            }),
        };
        let bytes = encode(&vote).expect("encode");
        let back: Envelope<Request> = decode(&bytes).expect("decode");
        match back.body {
            Request::Vote(v) => {
                assert_eq!(v.vote, Vote::new(3, 2));
                assert_eq!(v.last_log_id.map(|l| l.index), Some(40));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(decode::<Request>(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(decode::<Response>(&[]).is_err());
    }
}
