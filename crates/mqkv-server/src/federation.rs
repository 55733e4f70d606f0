//! The broker across a cluster: a message published on one node reaches the subscribers on the
//! others.
//!
//! Each node tells the others which topic filters its sessions subscribe to: at once when they
//! change, and again every [`RESEND_EVERY`], so a node that restarted learns them again. A
//! message published here goes to the nodes with a matching filter only, over the cluster's
//! authenticated links, where it is routed to local subscribers and never forwarded again, so
//! it is delivered once. Messages from one node to another arrive in the order they were
//! published. Retained messages, client-id ownership and persistent sessions are kept in the
//! replicated log (see `replicated`).
//!
//! What this does not give: a subscription made on one node takes effect on the others a
//! moment later (one message between the nodes); a message in flight to a node that dies is
//! lost with it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use mqkv_broker::federation::{ClaimFuture, Federation, ForwardedMessage};
use mqkv_broker::replicated::Claim;
use mqkv_broker::{topic, Broker, Message};
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

/// Forwards this node's messages to the other nodes.
pub struct ClusterFederation {
    node: StoreNode,
    /// The filters each other node subscribes to, as it last said.
    routes: RwLock<HashMap<NodeId, Vec<String>>>,
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
            routes: RwLock::new(HashMap::new()),
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
            ROUTES => match postcard::from_bytes::<Vec<String>>(bytes) {
                Ok(filters) => {
                    self.routes.write().insert(from, filters);
                }
                Err(e) => {
                    tracing::warn!(node = from, error = %e, "filters from a peer do not decode")
                }
            },
            PUBLISH => {
                let message = postcard::from_bytes::<ForwardedMessage>(bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|m| m.into_message().map_err(|e| e.to_string()));
                match message {
                    Ok(message) => {
                        broker.route_from_peer(message);
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
    fn forward(&self, message: &Arc<Message>) -> usize {
        if message.retain {
            self.replicated.retained_published(message);
        }
        let targets: Vec<NodeId> = self
            .routes
            .read()
            .iter()
            .filter(|(_, filters)| filters.iter().any(|f| topic::matches(f, &message.topic)))
            .map(|(id, _)| *id)
            .collect();
        if targets.is_empty() {
            return 0;
        }
        let bytes = match postcard::to_stdvec(&ForwardedMessage::from_message(message)) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::error!(error = %e, "a message to forward does not encode");
                return 0;
            }
        };
        for target in &targets {
            self.node.send_app(*target, PUBLISH, bytes.clone());
        }
        targets.len()
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
        let filters = broker.subscribed_filters();
        match postcard::to_stdvec(&filters) {
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
