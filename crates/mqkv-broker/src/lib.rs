//! The mqkv MQTT broker: MQTT 5.0 and 3.1.1 clients on one listener, sessions, QoS 0/1/2,
//! retained messages, wills, shared subscriptions, flow control, and an in-process service
//! interface through which components inside the server (the state store) take part in
//! messaging with the connection identity of every client.
//!
//! The broker knows nothing about the state store: services claim topics with
//! [`Broker::claim`] and talk back with [`Broker::publish`] and [`Broker::deliver`].

mod affinity;
pub mod auth;
mod broker;
pub mod codec;
pub mod config;
mod connection;
pub mod federation;
pub mod persist;
mod quickack;
pub mod replicated;
pub mod service;
mod session;
pub mod subtree;
mod threads;
pub mod topic;
pub mod transport;

pub use broker::Broker;
pub use config::{BrokerConfig, QueueFullPolicy, UserConfig};
pub use service::{
    ClientIdentity, Handled, OutboundMessage, Service, ServiceFuture, ServicePublish,
};
pub use session::Message;
pub use threads::LentThread;
pub use transport::{Tls, TlsFiles, Transport};
