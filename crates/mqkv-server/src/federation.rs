//! The broker across a cluster: a message published on one node reaches the subscribers on the
//! others.
//!
//! Each node tells the others which topic filters its sessions subscribe to: at once when they
//! change, and again every [`RESEND_EVERY`], so a node that restarted learns them again. A
//! message published here goes to the nodes with a matching filter only, over the cluster's
//! authenticated links, where it is routed to local subscribers and never forwarded again, so
//! it is delivered once. Messages from one node to another arrive in the order they were
//! published. A shared subscription group with members on several nodes gets each message
//! once: the publishing node hands each matching group's turn to the nodes with members in
//! rotation, and tells each node it forwards to which of its groups get the message.
//! Retained messages, client-id ownership and persistent sessions are kept in the replicated
//! log (see `replicated`).
//!
//! What this does not give: a subscription made on one node takes effect on the others a
//! moment later (one message between the nodes); a message in flight to a node that dies is
//! lost with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use mqkv_broker::federation::{ClaimFuture, Federation, Forwarded, ForwardedMessage, Routes};
use mqkv_broker::replicated::Claim;
use mqkv_broker::{Broker, Message, WeakBroker};
use mqkv_raft::{NodeId, StoreNode};
use parking_lot::RwLock;
use tokio::sync::Notify;

use crate::replicated::ReplicatedBroker;

/// Channel of a node's subscribed filters.
const ROUTES: u8 = 1;
/// Channel of a forwarded message.
const PUBLISH: u8 = 2;
/// How often a node sends its filters even when they did not change.
const RESEND_EVERY: Duration = Duration::from_secs(1);

/// Most shared groups whose turn is remembered; past it, every group starts again.
const TURNS_KEPT: usize = 4096;

/// A forwarded message and the shared groups its receiver delivers it to.
#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    shared: Vec<String>,
    message: ForwardedMessage,
}

/// Forwards this node's messages to the other nodes.
pub struct ClusterFederation {
    node: StoreNode,
    broker: WeakBroker,
    /// What each other node subscribes to, as it last said.
    routes: RwLock<HashMap<NodeId, Routes>>,
    /// Per shared group, how many messages this node has handed out: the next goes to the
    /// node after the last one's.
    turns: parking_lot::Mutex<HashMap<String, usize>>,
    changed: Notify,
    replicated: Arc<ReplicatedBroker>,
}

impl ClusterFederation {
    /// Joins `broker` to the other nodes of `node`'s cluster.
    pub fn start(
        broker: &Broker,
        node: StoreNode,
        replicated: Arc<ReplicatedBroker>,
    ) -> Arc<ClusterFederation> {
        let federation = Arc::new(ClusterFederation {
            node: node.clone(),
            broker: broker.downgrade(),
            routes: RwLock::new(HashMap::new()),
            turns: parking_lot::Mutex::new(HashMap::new()),
            changed: Notify::new(),
            replicated,
        });
        let broker_for_peers = broker.clone();
        let weak_self: Weak<ClusterFederation> = Arc::downgrade(&federation);
        node.set_app_handler(Arc::new(move |from, channel, bytes| {
            let Some(me) = weak_self.upgrade() else {
                return;
            };
            me.received(&broker_for_peers, from, channel, &bytes);
        }));
        broker.federate(federation.clone());
        tokio::spawn(announce(Arc::downgrade(&federation), broker.clone()));
        federation
    }

    fn received(&self, broker: &Broker, from: NodeId, channel: u8, bytes: &[u8]) {
        match channel {
            ROUTES => match postcard::from_bytes::<Routes>(bytes) {
                Ok(routes) => {
                    self.routes.write().insert(from, routes);
                    self.replicated.heard_from(from);
                }
                Err(e) => {
                    tracing::warn!(node = from, error = %e, "filters from a peer do not decode")
                }
            },
            PUBLISH => {
                let message = postcard::from_bytes::<Envelope>(bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|e| {
                        let shared = e.shared;
                        e.message
                            .into_message()
                            .map(|m| (m, shared))
                            .map_err(|e| e.to_string())
                    });
                match message {
                    Ok((message, shared)) => {
                        broker.route_from_peer(message, &shared);
                    }
                    Err(e) => {
                        tracing::warn!(node = from, error = %e, "a message from a peer was refused")
                    }
                }
            }
            other => tracing::warn!(
                node = from,
                channel = other,
                "a peer message on an unknown channel"
            ),
        }
    }
}

impl Federation for ClusterFederation {
    fn forward(&self, message: &Arc<Message>) -> Forwarded {
        if message.retain {
            self.replicated.retained_published(message);
        }
        let topic = message.topic.as_str();
        // The nodes that get the message, each with the shared groups it delivers to.
        let mut targets: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        let mut shared_here = None;
        {
            let routes = self.routes.read();
            let mut groups: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
            for (id, r) in routes.iter() {
                if r.plain_matches(topic) {
                    targets.entry(*id).or_default();
                }
                for key in r.shared_matching(topic) {
                    groups.entry(key.to_owned()).or_default().push(*id);
                }
            }
            // Only when another node has a matching group does this node's share need
            // deciding; otherwise every group here gets it, as on a single node.
            if !groups.is_empty() {
                let me = self.node.node_id();
                if let Some(broker) = self.broker.upgrade() {
                    for key in broker.shared_groups_matching(topic) {
                        groups.entry(key).or_default().push(me);
                    }
                }
                let mut here = Vec::new();
                let mut turns = self.turns.lock();
                if turns.len() > TURNS_KEPT {
                    turns.clear();
                }
                for (key, mut nodes) in groups {
                    nodes.sort_unstable();
                    let turn = turns.entry(key.clone()).or_default();
                    let pick = nodes[*turn % nodes.len()];
                    *turn = turn.wrapping_add(1);
                    if pick == me {
                        here.push(key);
                    } else {
                        targets.entry(pick).or_default().push(key);
                    }
                }
                shared_here = Some(here);
            }
        }
        let nodes = targets.len();
        if nodes > 0 {
            let forwarded = ForwardedMessage::from_message(message);
            for (target, shared) in targets {
                let envelope = Envelope {
                    shared,
                    message: forwarded.clone(),
                };
                match postcard::to_stdvec(&envelope) {
                    Ok(bytes) => self.node.send_app(target, PUBLISH, bytes),
                    Err(e) => tracing::error!(error = %e, "a message to forward does not encode"),
                }
            }
        }
        Forwarded { nodes, shared_here }
    }

    fn filters_changed(&self) {
        self.changed.notify_one();
    }

    fn claim(&self, claim: Claim) -> ClaimFuture {
        let replicated = self.replicated.clone();
        Box::pin(async move { replicated.claim(claim).await })
    }

    fn session_changed(&self, client_id: &str) {
        self.replicated.session_changed(client_id);
    }
}

/// Tells the other nodes this node's filters when they change, and every [`RESEND_EVERY`].
async fn announce(federation: Weak<ClusterFederation>, broker: Broker) {
    loop {
        let Some(me) = federation.upgrade() else {
            return;
        };
        let routes = broker.subscribed_routes();
        match postcard::to_stdvec(&routes) {
            Ok(bytes) => {
                for peer in me.node.peer_ids() {
                    me.node.send_app(peer, ROUTES, bytes.clone());
                }
            }
            Err(e) => tracing::error!(error = %e, "the filter list does not encode"),
        }
        let changed = async {
            me.changed.notified().await;
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(RESEND_EVERY) => {}
        }
        drop(me);
    }
}
