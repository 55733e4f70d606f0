//! The broker's cluster state, kept in the replicated log beside the state store: which node
//! owns each client id, each persistent session's subscriptions, and the retained messages.
//!
//! Records live in the store's cluster table (see `mqkv_store::MetaChange`) under three
//! prefixes: `o/<client id>` (the owning node and connection), `s/<client id>` (a
//! [`SessionRecord`]) and `r/<topic>` (a retained [`StoredMessage`]). Every node applies every
//! record, so:
//! - a client connecting on one node writes its ownership before its CONNACK; a node that
//!   applies an ownership record naming another node ends its own session of that client (the
//!   connection gets DISCONNECT 0x8E, Session taken over);
//! - a client connecting with clean start 0 to a node that does not have its session gets the
//!   subscriptions the cluster kept, and session present 1;
//! - a retained message is stored by every node as its record is applied, and a node that
//!   restarts or installs a snapshot reloads them all from the table;
//! - a connection's will is kept under `w/<client id>` while it is open, so that the others
//!   can publish it if its node dies (see `survivor`).
//!
//! A node cut off from the quorum still accepts connections (at once when it knows of no
//! leader, else after at most [`CLAIM_WAIT`]): the broker stays available to the clients that
//! reach it, and the cluster cannot vouch for their ids until the quorum is back. Session and retained records made meanwhile are written when
//! it is. Records of a node's sessions are written a moment after the change, not before its
//! acknowledgement: a node dying in that moment loses the change. The record of a retained
//! message that expired stays in the table (never loaded again) until the topic's next one.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use mqkv_broker::codec::reason;
use mqkv_broker::persist::StoredMessage;
use mqkv_broker::replicated::{Claim, SessionRecord, WillRecord};
use mqkv_broker::{Broker, Message};
use mqkv_raft::{ApplyHook, NodeId, StoreNode, WriteError};
use mqkv_store::{Entry, MetaChange, Op};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub(crate) const OWNER: &[u8] = b"o/";
pub(crate) const SESSION: &[u8] = b"s/";
const RETAINED: &[u8] = b"r/";
pub(crate) const WILL: &[u8] = b"w/";

/// Longest a connection waits for its client id to be claimed before it is accepted anyway.
pub const CLAIM_WAIT: Duration = Duration::from_secs(1);

/// Changes gathered into one log entry at most.
const MAX_BATCH: usize = 1024;

/// Who owns a client id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub(crate) node: NodeId,
    pub(crate) conn: u64,
}

/// The will of an open connection, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct KeptWill {
    pub(crate) owner: Owner,
    pub(crate) will: WillRecord,
}

pub(crate) fn key(prefix: &[u8], name: &str) -> Bytes {
    let mut k = Vec::with_capacity(prefix.len() + name.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(name.as_bytes());
    Bytes::from(k)
}

pub(crate) fn name(key: &[u8], prefix: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(prefix)?;
    std::str::from_utf8(rest).ok().map(str::to_owned)
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Option<Bytes> {
    match postcard::to_stdvec(value) {
        Ok(bytes) => Some(Bytes::from(bytes)),
        Err(e) => {
            tracing::error!(error = %e, "a cluster record does not encode");
            None
        }
    }
}

enum Work {
    Session(String),
    Retained(MetaChange),
}

/// The broker's records in the log.
pub struct ReplicatedBroker {
    pub(crate) broker: Broker,
    pub(crate) node: StoreNode,
    me: NodeId,
    work: mpsc::UnboundedSender<Work>,
    /// When each other node was last heard from (see [`Self::heard_from`]).
    heard: parking_lot::Mutex<std::collections::HashMap<NodeId, std::time::Instant>>,
}

impl ReplicatedBroker {
    /// Starts keeping `broker`'s cluster state in `node`'s log, and loads the retained
    /// messages the cluster holds. `cell` is the one [`hook`] was given.
    pub fn start(
        broker: &Broker,
        node: StoreNode,
        cell: &OnceLock<Arc<ReplicatedBroker>>,
    ) -> Arc<ReplicatedBroker> {
        let (tx, rx) = mpsc::unbounded_channel();
        let me = Arc::new(ReplicatedBroker {
            broker: broker.clone(),
            me: node.node_id(),
            node: node.clone(),
            work: tx,
            heard: parking_lot::Mutex::new(std::collections::HashMap::new()),
        });
        // Installed before the table is read, so no change falls between the two.
        let _ = cell.set(me.clone());
        let weak = Arc::downgrade(&me);
        node.set_install_hook(Arc::new(move || {
            if let Some(me) = weak.upgrade() {
                me.reload_retained();
            }
        }));
        me.reload_retained();
        me.drop_sessions_owned_elsewhere();
        tokio::spawn(write_loop(Arc::downgrade(&me), rx));
        tokio::spawn(crate::survivor::watch(Arc::downgrade(&me)));
        me
    }

    /// Makes the retained messages those of the table.
    fn reload_retained(&self) {
        let messages: Vec<Message> = self.node.read(|m| {
            m.meta_prefixed(RETAINED)
                .filter_map(|(_, v)| postcard::from_bytes::<StoredMessage>(v).ok())
                .filter_map(|s| s.to_message())
                .collect()
        });
        tracing::debug!(
            count = messages.len(),
            "retained messages loaded from the cluster"
        );
        self.broker.replace_retained(messages);
    }

    /// Ends the sessions this node kept from before a restart whose clients another node took
    /// over meanwhile.
    fn drop_sessions_owned_elsewhere(&self) {
        for client_id in self.broker.session_ids() {
            let owner = self.node.read(|m| {
                m.meta(&key(OWNER, &client_id))
                    .and_then(|v| postcard::from_bytes::<Owner>(v).ok())
            });
            if owner.is_some_and(|o| o.node != self.me) {
                self.broker.evict(&client_id);
            }
        }
    }

    /// What applying `changes` means here.
    fn applied(&self, changes: &[MetaChange]) {
        for change in changes {
            if let Some(client_id) = name(&change.key, OWNER) {
                let owner = change
                    .value
                    .as_ref()
                    .and_then(|v| postcard::from_bytes::<Owner>(v).ok());
                if owner.is_some_and(|o| o.node != self.me) && self.broker.evict(&client_id) {
                    tracing::debug!(client_id, "session taken over by another node");
                }
            } else if let Some(topic) = name(&change.key, RETAINED) {
                let message = change
                    .value
                    .as_ref()
                    .and_then(|v| postcard::from_bytes::<StoredMessage>(v).ok())
                    .and_then(|s| s.to_message());
                self.broker.set_retained(&topic, message);
            }
        }
    }

    /// Makes this connection the owner of its client id; see [`Claim`].
    pub async fn claim(&self, claim: Claim) -> Result<Option<SessionRecord>, u8> {
        let owner = Owner {
            node: self.me,
            conn: claim.conn_id,
        };
        let Some(value) = encode(&owner) else {
            return Err(reason::UNSPECIFIED_ERROR);
        };
        if !self.node.leader_known() {
            // No leader to write to (an election, or cut off from the others): accepted at once,
            // unclaimed, rather than after a wait that cannot end well.
            tracing::info!(
                client_id = claim.client_id,
                "client id not claimed: no leader"
            );
            return Ok(self.kept_session(&claim));
        }
        let mut changes = vec![MetaChange::put(key(OWNER, &claim.client_id), value)];
        if claim.clean_start {
            changes.push(MetaChange::delete(key(SESSION, &claim.client_id)));
        }
        let will_key = key(WILL, &claim.client_id);
        match claim.will.clone() {
            Some(will) => match encode(&KeptWill { owner, will }) {
                Some(v) => changes.push(MetaChange::put(will_key, v)),
                None => changes.push(MetaChange::delete(will_key)),
            },
            None => changes.push(MetaChange::delete(will_key)),
        }
        match tokio::time::timeout(CLAIM_WAIT, self.write(changes)).await {
            Ok(Ok(())) => {}
            Ok(Err(WriteError::Stopped)) => return Err(reason::SERVER_SHUTTING_DOWN),
            Ok(Err(e)) => {
                tracing::info!(client_id = claim.client_id, error = %e, "client id not claimed");
            }
            Err(_) => {
                tracing::info!(client_id = claim.client_id, "client id not claimed in time");
            }
        }
        // Our own write is applied here, so the table holds the session as the cluster
        // last recorded it.
        Ok(self.kept_session(&claim))
    }

    /// The session the table keeps for a client that does not start clean.
    fn kept_session(&self, claim: &Claim) -> Option<SessionRecord> {
        if claim.clean_start {
            return None;
        }
        self.node.read(|m| {
            m.meta(&key(SESSION, &claim.client_id))
                .and_then(|v| postcard::from_bytes::<SessionRecord>(v).ok())
        })
    }

    /// Records `client_id`'s session as it is here, a moment from now.
    pub fn session_changed(&self, client_id: &str) {
        let _ = self.work.send(Work::Session(client_id.to_owned()));
    }

    /// Records a retained message published here (an empty one clears the topic's).
    pub fn retained_published(&self, message: &Message) {
        let k = key(RETAINED, &message.topic);
        let change = if message.payload.is_empty() {
            MetaChange::delete(k)
        } else {
            match encode(&StoredMessage::of(message)) {
                Some(v) => MetaChange::put(k, v),
                None => return,
            }
        };
        let _ = self.work.send(Work::Retained(change));
    }

    /// Another node was heard from (its routes arrive every second).
    pub fn heard_from(&self, node: NodeId) {
        self.heard.lock().insert(node, std::time::Instant::now());
    }

    pub(crate) fn last_heard(&self, node: NodeId) -> Option<std::time::Instant> {
        self.heard.lock().get(&node).copied()
    }

    /// The changes that make the records of `client_id` what its session is here.
    fn session_changes(&self, client_id: &str, changes: &mut Vec<MetaChange>) {
        let (owner, stored, will) = self.node.read(|m| {
            (
                m.meta(&key(OWNER, client_id))
                    .and_then(|v| postcard::from_bytes::<Owner>(v).ok()),
                m.meta(&key(SESSION, client_id)).cloned(),
                m.meta(&key(WILL, client_id))
                    .and_then(|v| postcard::from_bytes::<KeptWill>(v).ok()),
            )
        });
        if owner.is_some_and(|o| o.node != self.me) {
            // Another node took it over after this node accepted the connection.
            self.broker.evict(client_id);
            return;
        }
        if let Some(kept) = will {
            // This node publishes the will of a connection it saw close, or drops it.
            if kept.owner.node == self.me && !self.broker.is_connected(client_id, kept.owner.conn) {
                changes.push(MetaChange::delete(key(WILL, client_id)));
            }
        }
        match self.broker.session_record(client_id) {
            Some(record) => {
                let Some(value) = encode(&record) else {
                    return;
                };
                if stored.as_ref() != Some(&value) {
                    changes.push(MetaChange::put(key(SESSION, client_id), value));
                }
            }
            None => {
                if stored.is_some() {
                    changes.push(MetaChange::delete(key(SESSION, client_id)));
                }
                if owner.is_some() && !self.broker.has_session(client_id) {
                    changes.push(MetaChange::delete(key(OWNER, client_id)));
                }
            }
        }
    }

    pub(crate) async fn write(&self, changes: Vec<MetaChange>) -> Result<(), WriteError> {
        let entry = Entry {
            now_ms: crate::statestore::now_ms(),
            op: Op::Meta(changes),
        };
        self.node.write(entry).await.map(|_| ())
    }
}

/// The apply hook of a clustered node: `store`'s, and the broker's records once `cell` holds
/// the [`ReplicatedBroker`].
pub fn hook(store: ApplyHook, cell: Arc<OnceLock<Arc<ReplicatedBroker>>>) -> ApplyHook {
    Arc::new(move |entry, applied| {
        if let Op::Meta(changes) = &entry.op {
            if let Some(replicated) = cell.get() {
                replicated.applied(changes);
            }
        } else {
            store(entry, applied);
        }
    })
}

/// Writes the records of changed sessions and retained messages, in order, one log entry at a
/// time with everything that arrived meanwhile; a write the cluster cannot take now is tried
/// again until it can.
async fn write_loop(me: Weak<ReplicatedBroker>, mut rx: mpsc::UnboundedReceiver<Work>) {
    while let Some(first) = rx.recv().await {
        let mut sessions = BTreeSet::new();
        let mut changes = Vec::new();
        let mut take = |work: Work| match work {
            Work::Session(id) => {
                sessions.insert(id);
            }
            Work::Retained(change) => changes.push(change),
        };
        take(first);
        let mut gathered = 1;
        while gathered < MAX_BATCH {
            match rx.try_recv() {
                Ok(work) => take(work),
                Err(_) => break,
            }
            gathered += 1;
        }
        let Some(me) = me.upgrade() else {
            return;
        };
        for id in &sessions {
            me.session_changes(id, &mut changes);
        }
        if changes.is_empty() {
            continue;
        }
        loop {
            match me.write(changes.clone()).await {
                Ok(()) => break,
                Err(WriteError::Stopped) => return,
                Err(e) => {
                    tracing::info!(error = %e, "broker records not written yet; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_client_or_topic() {
        let k = key(OWNER, "client-\u{e9}");
        assert_eq!(name(&k, OWNER).as_deref(), Some("client-\u{e9}"));
        assert_eq!(name(&k, RETAINED), None);
        assert_eq!(name(b"o/\xff", OWNER), None);
    }
}
