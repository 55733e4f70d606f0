//! Broker state a cluster keeps for every node: who owns a client id, what a persistent session
//! subscribes to, and the retained messages.
//!
//! The broker does not replicate anything itself. A [`crate::federation::Federation`] is asked
//! to claim a client id before the connection is accepted and is told whenever a session
//! changes; it keeps the records ([`SessionRecord`], [`StoredMessage`]) wherever the cluster
//! keeps its state and applies what other nodes did through the methods here.
//!
//! What moves with a session from one node to another: its subscriptions and expiry interval.
//! What does not: messages queued for it on the node it left, and QoS 1/2 messages in flight
//! there; they are dropped when that node learns that another node took the session over.

use serde::{Deserialize, Serialize};

use crate::persist::{StoredMessage, StoredSubscription};

/// A client asking to connect, as the cluster is asked to let it own its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub client_id: String,
    /// Numbers this connection among this node's connections.
    pub conn_id: u64,
    pub clean_start: bool,
    /// The session expiry interval granted.
    pub expiry_interval: u32,
    /// The connection's will, if it has one.
    pub will: Option<WillRecord>,
}

/// A will as the cluster keeps it while its connection is open, so that another node can
/// publish it if this node dies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WillRecord {
    pub message: StoredMessage,
    /// The will delay interval, in seconds.
    pub delay: u32,
}

/// What a cluster keeps of a persistent session: enough to resume it on any node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub expiry_interval: u32,
    pub subscriptions: Vec<StoredSubscription>,
}
