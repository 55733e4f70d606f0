//! Brokers that forward to each other: the nodes of a cluster.
//!
//! The broker knows nothing of how the other nodes are reached. A [`Federation`] installed with
//! [`crate::Broker::federate`] is offered every message published on this node once it has been
//! routed here, and is told whenever the set of filters subscribed on this node may have
//! changed; it decides which other nodes get the message. A message that came from another node
//! is routed here only ([`crate::Broker::route_from_peer`]), never forwarded again, so no
//! message is delivered twice.
//!
//! Messages travel as [`ForwardedMessage`]s, with their MQTT 5 properties in wire form and their
//! expiry as the time left.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::codec::{Properties, QoS};
pub use crate::replicated::{Claim, SessionRecord};
use crate::session::Message;

/// The other nodes, as the broker sees them.
pub trait Federation: Send + Sync + 'static {
    /// A message published on this node (by a client, a will or a service), about to be routed
    /// here. Sends it to the other nodes that get it, and says which of this node's shared
    /// groups get it: one member of a shared group across all nodes receives each message, so
    /// the federation picks the node of each matching group.
    fn forward(&self, message: &Arc<Message>) -> Forwarded;

    /// A subscription was added or removed on this node (see
    /// [`crate::Broker::subscribed_routes`]).
    fn filters_changed(&self);

    /// A client is connecting here (see [`crate::replicated`]): the cluster makes this
    /// connection the one owner of its client id, taking the id over from any other node.
    /// Answers the session the cluster keeps for the id, if any, for a connection that does
    /// not start clean, or the reason code to refuse the connection with.
    fn claim(&self, claim: Claim) -> ClaimFuture;

    /// The session of `client_id` here was attached, subscribed, unsubscribed or ended.
    fn session_changed(&self, client_id: &str);
}

/// What [`Federation::forward`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// How many other nodes the message went to.
    pub nodes: usize,
    /// The keys of the shared groups here that get the message ([`crate::subtree::shared_key`]),
    /// or `None` for every matching one.
    pub shared_here: Option<Vec<String>>,
}

/// What a node subscribes to, as it tells the other nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Routes {
    /// Filters of plain subscriptions.
    pub plain: Vec<String>,
    /// Keys of shared groups (`<group>/<filter>`).
    pub shared: Vec<String>,
}

impl Routes {
    /// Whether a plain subscription here matches `topic`.
    pub fn plain_matches(&self, topic: &str) -> bool {
        self.plain.iter().any(|f| crate::topic::matches(f, topic))
    }

    /// The shared groups here that match `topic`.
    pub fn shared_matching<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.shared.iter().map(String::as_str).filter(move |key| {
            key.split_once('/')
                .is_some_and(|(_, filter)| crate::topic::matches(filter, topic))
        })
    }
}

/// What [`Federation::claim`] answers.
pub type ClaimFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Option<SessionRecord>, u8>> + Send>>;

/// A message on its way to another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardedMessage {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: u8,
    pub retain: bool,
    /// The MQTT 5 property block as on the wire (length prefix included).
    pub properties: Vec<u8>,
    /// Milliseconds left before the message expires.
    pub expires_in_ms: Option<u64>,
    pub publisher: Option<String>,
}

/// Why a forwarded message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ForwardError {
    #[error("its properties do not decode")]
    Properties,
    #[error("its QoS is not 0, 1 or 2")]
    Qos,
}

impl ForwardedMessage {
    pub fn from_message(m: &Message) -> ForwardedMessage {
        let now = Instant::now();
        ForwardedMessage {
            topic: m.topic.clone(),
            payload: m.payload.to_vec(),
            qos: m.qos as u8,
            retain: m.retain,
            properties: m.properties.to_block(),
            expires_in_ms: m.expires_at.map(|t| {
                u64::try_from(t.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
            }),
            publisher: m.publisher.as_deref().map(str::to_owned),
        }
    }

    pub fn into_message(self) -> Result<Message, ForwardError> {
        let properties =
            Properties::from_block(self.properties).map_err(|_| ForwardError::Properties)?;
        Ok(Message {
            topic: self.topic,
            payload: Bytes::from(self.payload),
            qos: QoS::from_u8(self.qos).ok_or(ForwardError::Qos)?,
            retain: self.retain,
            properties,
            expires_at: self
                .expires_in_ms
                .map(|ms| Instant::now() + std::time::Duration::from_millis(ms)),
            publisher: self.publisher.map(Arc::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::PropStr;

    #[test]
    fn a_message_survives_the_trip() {
        let m = Message {
            topic: "a/b".into(),
            payload: Bytes::from_static(b"hello"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: Properties {
                content_type: Some(PropStr::Owned("text/plain".into())),
                user_properties: vec![(PropStr::Owned("k".into()), PropStr::Owned("v".into()))],
                ..Default::default()
            },
            expires_at: Some(Instant::now() + std::time::Duration::from_secs(60)),
            publisher: Some(Arc::from("pub")),
        };
        let back = ForwardedMessage::from_message(&m)
            .into_message()
            .expect("decodes");
        assert_eq!(back.topic, m.topic);
        assert_eq!(back.payload, m.payload);
        assert_eq!(back.qos, m.qos);
        assert!(back.retain);
        assert_eq!(back.properties.user_properties.len(), 1);
        assert_eq!(back.publisher.as_deref(), Some("pub"));
        assert!(back.expires_at.is_some());
    }

    #[test]
    fn garbage_is_refused() {
        let mut f = ForwardedMessage::from_message(&Message {
            topic: "t".into(),
            payload: Bytes::new(),
            qos: QoS::AtMostOnce,
            retain: false,
            properties: Properties::default(),
            expires_at: None,
            publisher: None,
        });
        f.qos = 3;
        assert_eq!(f.clone().into_message().err(), Some(ForwardError::Qos));
        f.qos = 0;
        f.properties = vec![5, 0xff, 0xff];
        assert_eq!(f.into_message().err(), Some(ForwardError::Properties));
    }
}
