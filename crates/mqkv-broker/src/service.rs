//! The in-process service interface.
//!
//! A component inside the server claims topic filters with [`crate::Broker::claim`]. From then
//! on every PUBLISH to a matching topic goes to the component (and to no subscriber), together
//! with the publisher's connection identity. The component also hears when every client connects
//! and disconnects, in order with that client's publishes, so it can tie per-connection state
//! (like key observations) to the connection's lifetime.
//!
//! A service runs on the publisher's own connection task: a request is handled without a hand-off
//! to another task, and a service that needs to wait (for a disk write, say) returns a future
//! that the connection awaits before it reads the client's next packet. So one client's requests
//! are handled in the order it sent them, a slow service slows down only the clients publishing
//! to it (their QoS 1 acknowledgements wait), and the rest of the broker is not held up.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
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

/// Work a service still has to finish for a publish; the connection awaits it.
pub type ServiceFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// An in-process component that owns some topics.
pub trait Service: Send + Sync + 'static {
    /// A PUBLISH to a claimed topic, called on the publisher's connection task. Return `None`
    /// when it has been handled completely, or a future the connection awaits before it
    /// acknowledges the PUBLISH and reads the next packet.
    fn on_publish(&self, publish: ServicePublish) -> Option<ServiceFuture>;

    /// A client connected (its CONNACK is queued).
    fn on_connect(&self, _who: &ClientIdentity) {}

    /// A client's connection ended (after its last publish was handled).
    fn on_disconnect(&self, _who: &ClientIdentity) {}
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
