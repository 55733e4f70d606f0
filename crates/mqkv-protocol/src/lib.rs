//! The wire format of the Azure IoT Operations state store protocol.
//!
//! Everything here is pure: no I/O, no clock reads, no async. The server and
//! the client library both build on it, so the bytes one side writes are,
//! by construction, the bytes the other side reads.
//!
//! | module | protects |
//! |---|---|
//! | [`command`] | any payload yields a [`Command`] or exactly one documented error; encoding is what the SDKs send |
//! | [`response`] | responses and notifications are byte-exact for the SDKs; never an empty payload |
//! | [`hlc`] | HLC text form and total order; versions always move forward and past the request |
//! | [`error`] | the twelve `-ERR` texts, byte for byte |
//! | [`topic`] | request/notification topics, upper-case hex |
//! | [`glob`] | SCAN patterns behave like fnmatch / `glob::Pattern` |
//! | [`properties`] | user property names and protocol version rules |
//!
//! Where the public protocol article and what the official SDKs accept
//! disagree, the SDKs win (for example `:-1` rather than `-1` for "not
//! applied", and `DELETE` rather than `DEL` in notifications).

pub mod command;
pub mod error;
pub mod glob;
pub mod hlc;
pub mod properties;
mod resp;
pub mod response;
pub mod topic;

pub use command::{parse_request, parse_request_bytes, Command, SetCondition, MAX_MGET_KEYS};
pub use error::ErrorKind;
pub use glob::{glob_match, GlobPattern};
pub use hlc::{Hlc, HlcClock, HlcError, MAX_CLOCK_SKEW_MS, MAX_COUNTER};
pub use properties::protocol_version_supported;
pub use response::{DecodeError, Notification, Response};
pub use topic::{
    hex_decode, hex_upper, is_reserved_response_topic, notification_filter, notification_topic,
    parse_notification_topic, HexError, NOTIFY_TOPIC_PREFIX, REQUEST_TOPIC,
};
