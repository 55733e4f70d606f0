//! The in-process service interface.
//!
//! A component inside the server claims a topic filter with [`crate::Broker::claim`]. From then
//! on every PUBLISH to a matching topic goes to the component (and to no subscriber), together
//! with the publisher's connection identity. The same channel carries connect and disconnect
//! events of every client, in the order they happened relative to that client's publishes, so a
//! service can tie per-connection state (like key observations) to the connection's lifetime.
//!
//! The channel is bounded: a service that falls behind slows down the clients publishing to it
//! (their QoS 1 acknowledgements wait), never the rest of the broker.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;

use crate::codec::{Properties, QoS};

/// Who sent something: the connection's own identity, not anything the client claims inside a
/// message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub client_id: Arc<str>,
    /// The principal the authenticator returned (`None` for anonymous clients).
    pub principal: Option<Arc<str>>,
    pub peer: SocketAddr,
    /// A number unique to this connection (a client id can reconnect).
    pub connection_id: u64,
}

/// A PUBLISH addressed to a claimed topic.
#[derive(Debug, Clone)]
pub struct ServicePublish {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub properties: Properties,
    pub from: ClientIdentity,
}

#[derive(Debug, Clone)]
pub enum ServiceEvent {
    Publish(Box<ServicePublish>),
    Connected(ClientIdentity),
    Disconnected(ClientIdentity),
}

/// A message a service sends.
#[derive(Debug, Clone, Default)]
pub struct OutboundMessage {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: Properties,
}
