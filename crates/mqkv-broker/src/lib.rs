//! The mqkv MQTT broker: MQTT 5.0 and 3.1.1 clients on one listener, sessions, QoS 0/1/2,
//! retained messages, wills, shared subscriptions, flow control, and an in-process service
//! interface through which components inside the server (the state store) take part in
//! messaging with the connection identity of every client.
//!
//! The broker knows nothing about the state store: services claim topics with
//! [`Broker::claim`] and talk back with [`Broker::publish`] and [`Broker::deliver`].

pub mod access;
pub mod auth;
mod backlog;
mod broker;
mod cluster;
pub mod codec;
pub mod config;
mod connection;
pub mod federation;
mod inner;
pub mod inspect;
mod listener;
pub mod passwords;
pub mod persist;
mod placement;
mod policing;
pub mod queue;
pub mod replicated;
mod retained;
mod saved;
pub mod service;
mod session;
pub mod stats;
pub mod subtree;
pub mod tokens;
pub mod topic;
pub mod transport;

pub use broker::Broker;
pub use cluster::WeakBroker;
pub use config::{BrokerConfig, QueueFullPolicy, UserConfig};
pub use placement::{
    release_freed_memory, release_freed_memory_periodically, set_release_freed_memory, LentThread,
};
pub use retained::RetainedChanges;
pub use service::{
    ClientIdentity, Handled, OutboundMessage, Service, ServiceFuture, ServicePublish,
};
pub use session::Message;
pub use transport::{Tls, TlsFiles, Transport};
