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
//! that the connection polls while it goes on reading the client's packets. A client that sends
//! many requests without waiting for the answers (as the AIO SDKs do when an application makes
//! concurrent calls over one session) so has them all under way at once: a store's writes from
//! one connection can share one sync of its log.
//!
//! Order, per connection:
//! - publishes are offered to the service in the order they arrived, and a service starts its
//!   work in that order (a future's first poll happens before the next publish is offered);
//! - a publish whose effect must not overlap the connection's earlier publishes still under way
//!   (a read that must see an earlier write's result, say) is handed back
//!   ([`Handled::AfterEarlier`]) and offered again once they have all finished; publishes that
//!   arrive after it wait behind it;
//! - a service hands its answer to a publish (a response message, say) back to the connection
//!   rather than publishing it: the connection publishes each answer, then sends the
//!   acknowledgement (PUBACK, PUBREC), once the publish's own work has finished and every
//!   earlier publish's answer and acknowledgement have gone out. So answers and
//!   acknowledgements keep the order the publishes arrived in, even when later work finishes
//!   first;
//! - at most the broker's Receive Maximum of publishes are under way per connection; beyond that
//!   the connection stops reading until the oldest has finished.
//!
//! A connection that ends while work is under way lets the futures run to completion on their
//! own and publishes their answers (a persistent session keeps them for the client's return);
//! publishes not yet started are dropped unacknowledged, as if they had not arrived. A client
//! that sends DISCONNECT gets every answer and acknowledgement first. A slow service slows down
//! only the clients publishing to it, and the rest of the broker is not held up.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::access::{Grants, Principal};
use crate::codec::{Properties, QoS};

/// Who sent something: the connection's own identity, not anything the client claims inside a
/// message.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub client_id: Arc<str>,
    /// Who the authenticator said the client is.
    pub principal: Arc<Principal>,
    /// What the policy in force lets the client do; `None` without a policy (everything).
    pub grants: Option<Arc<dyn Grants>>,
    pub peer: SocketAddr,
    /// A number unique to this connection (a client id can reconnect).
    pub connection_id: u64,
}

impl ClientIdentity {
    /// Whether the client may read (`write` false) or change (`write` true) a service's
    /// `resource`.
    pub fn may_use(&self, resource: &[u8], write: bool) -> bool {
        self.grants
            .as_ref()
            .is_none_or(|g| g.may_use(resource, write))
    }
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

/// Work a service still has to finish for a publish; the connection polls it to completion.
/// Its output is the answer to publish, if any (see [`Handled::Done`]).
pub type ServiceFuture = Pin<Box<dyn Future<Output = Option<OutboundMessage>> + Send + 'static>>;

/// What a service did with a publish.
// An answer is moved a few times on its way out; boxing it would cost an allocation per
// request instead.
#[allow(clippy::large_enum_variant)]
pub enum Handled {
    /// Handled completely. The connection publishes the answer, if any, when the publish's turn
    /// comes (routed as [`crate::Broker::publish`] routes), then acknowledges the publish.
    Done(Option<OutboundMessage>),
    /// Started; the future's output is the answer, published and followed by the
    /// acknowledgement once it has finished and it is the publish's turn.
    Running(ServiceFuture),
    /// Not started: it must follow the connection's earlier publishes still under way. Offered
    /// again once they have finished.
    AfterEarlier(Box<ServicePublish>),
}

/// An in-process component that owns some topics.
pub trait Service: Send + Sync + 'static {
    /// A PUBLISH to a claimed topic, called on the publisher's connection task in the order the
    /// connection received them. `earlier_running` says whether publishes this connection sent
    /// earlier are still under way; only then may the service answer
    /// [`Handled::AfterEarlier`].
    fn on_publish(&self, publish: ServicePublish, earlier_running: bool) -> Handled;

    /// A client connected (its CONNACK is queued).
    fn on_connect(&self, _who: &ClientIdentity) {}

    /// A client's connection ended, after its last publish was offered (work still under way
    /// for it may finish later).
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
