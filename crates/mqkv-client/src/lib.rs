//! A client for the Azure IoT Operations state store protocol, over any
//! MQTT 5 broker (mqkv, or any broker with a state store service behind it).
//!
//! It speaks the protocol the way the official SDKs do: QoS 1 requests to
//! the request topic, answers on
//! `clients/<clientId>/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke/response`
//! (subscribed before the first request), 16 bytes of correlation data,
//! message expiry set to the timeout rounded up to whole seconds, content
//! type `application/octet-stream`, and the user properties `__srcId`,
//! `__ts` (from a hybrid logical clock merged with the versions the server
//! returns), `__protVer=1.0` and, when given, `__ft`. The bytes come from
//! [`mqkv_protocol`]; nothing here re-encodes them.
//!
//! | module | what it gives |
//! |---|---|
//! | [`Client`] | `get`, `set`, `del`, `vdel`, `observe`, `unobserve`, `scan`; every answer with its version |
//! | [`Observation`] | a key's changes, kept across reconnections, with synthesized notifications for what changed while away |
//! | [`KeyPager`] | SCAN a page at a time |
//! | [`Lease`] | acquire, renew (once or in the background), release, holder, fencing token |
//! | [`Lock`] | wait for a lease, woken by the holder's DELETE |
//! | [`LeaderElection`] | campaign, resign, follow the leader |
//! | [`TlsSettings`] | TLS to the broker: its CA, and a client certificate ([`ClientOptions::tls`]) |
//! | [`ClientOptions::websocket`] | MQTT over WebSocket, or with TLS over secure WebSocket |
//!
//! ```no_run
//! use std::time::Duration;
//! use mqkv_client::{Client, ClientOptions, Lock, SetOptions};
//!
//! # async fn demo() -> Result<(), mqkv_client::Error> {
//! let client = Client::connect(ClientOptions::new("127.0.0.1", 1883)).await?;
//!
//! client.set("config/mode", "eco").await?;
//! let mode = client.get("config/mode").await?;
//!
//! let lock = Lock::for_client(&client, "config/lock");
//! let token = lock.lock(Duration::from_secs(10)).await?;
//! client
//!     .set_with("config/mode", "boost", &SetOptions::new().fencing_token(token))
//!     .await?;
//! lock.unlock().await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod client;
mod clock;
mod connection;
mod error;
mod leader;
mod lease;
mod lock;
mod observe;
mod options;
mod pattern;
mod scan;
mod tls;
mod watch;

pub use client::{
    Client, ConnectionStatus, DelOutcome, SetOutcome, StatusWatch, VDelOutcome, Versioned,
};
pub use error::{Error, Result, ServerError};
pub use leader::{Leader, LeaderChange, LeaderElection, LeaderWatch, Leadership};
pub use lease::{Lease, LeaseLost, Renewal};
pub use lock::Lock;
pub use mqkv_protocol::{ErrorKind, Hlc, SetCondition};
pub use observe::{KeyNotification, Observation, Operation};
pub use options::{ClientOptions, DelOptions, SetOptions};
pub use pattern::PatternObservation;
pub use scan::KeyPager;
pub use tls::TlsSettings;
