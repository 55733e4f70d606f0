//! The openraft type configuration of the state store group.
//!
//! Invariant: a log entry's application data is a [`Proposal`] — store
//! entries proposed together, applied in their order — so every replica
//! applies the same entries in the same order; what applying them answers
//! travels back to the proposer as [`Outcome`]s and is never replicated.

use std::io::Cursor;
use std::sync::Arc;

use mqkv_protocol::{Hlc, Response};
use mqkv_store::{Applied, ChangeEvent};
use serde::{Deserialize, Serialize};

/// Identity of a node in the raft group. Stable across restarts: it is
/// written into the log file when the store is created.
pub type NodeId = u64;

/// The node id a store created by [`crate::StoreNode::open_disk`] or
/// [`crate::StoreNode::open_memory`] gets.
pub const DEFAULT_NODE_ID: NodeId = 1;

openraft::declare_raft_types!(
    /// Types of the state store's raft group.
    pub(crate) TypeConfig:
        D = Proposal,
        R = Vec<Outcome>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

pub(crate) type LogId = openraft::LogId<NodeId>;
pub(crate) type RaftEntry = openraft::Entry<TypeConfig>;
pub(crate) type Membership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;
pub(crate) type Vote = openraft::Vote<NodeId>;

/// Store entries that share one raft log entry (and so one fsync). See
/// `proposer` for how they are gathered. Shared: openraft copies a log
/// entry on its way to being applied (the log hands out clones), and a copy
/// should not copy every request in it. The vector the proposer gathered
/// them in is shared as it is (a shared slice would be a copy of every
/// entry). Encoded as a sequence, as a `Vec` of entries is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Proposal(pub(crate) Arc<Vec<mqkv_store::Entry>>);

/// What applying one client entry answered. openraft wants responses to be
/// serde types; [`Applied`] is not one, so this mirrors its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Outcome {
    response: Response,
    version: Option<Hlc>,
    events: Vec<ChangeEvent>,
    created: bool,
}

impl From<Applied> for Outcome {
    fn from(applied: Applied) -> Self {
        Outcome {
            response: applied.response,
            version: applied.version,
            events: applied.events,
            created: applied.created,
        }
    }
}

impl From<Outcome> for Applied {
    fn from(outcome: Outcome) -> Self {
        Applied {
            response: outcome.response,
            version: outcome.version,
            events: outcome.events,
            created: outcome.created,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqkv_protocol::Command;
    use mqkv_store::{Entry, Op, Request};

    /// Log files written when a proposal held a `Vec` of entries must read
    /// the same now: the encoding is that of the sequence.
    #[test]
    fn a_proposal_encodes_as_its_sequence_of_entries() {
        let entries = vec![
            Entry {
                now_ms: 5,
                op: Op::Request(Request {
                    command: Command::Get {
                        key: bytes::Bytes::from_static(b"k"),
                    },
                    ts: None,
                    ft: None,
                    dedup: None,
                }),
            },
            Entry {
                now_ms: 6,
                op: Op::ExpireDue,
            },
        ];
        let as_vec = postcard::to_stdvec(&entries).unwrap();
        let proposal = Proposal(Arc::new(entries));
        assert_eq!(postcard::to_stdvec(&proposal).unwrap(), as_vec);
        let read: Proposal = postcard::from_bytes(&as_vec).unwrap();
        assert_eq!(read, proposal);
    }
}
