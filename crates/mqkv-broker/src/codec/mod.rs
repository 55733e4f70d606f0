//! The MQTT wire codec: MQTT 5.0 and 3.1.1 control packets, both directions.
//!
//! Decoding is framing and validation in one step: `decode` consumes nothing until a whole packet
//! is buffered, and every way a packet can break the specification maps to the reason code the
//! specification names for it (`DecodeError::reason_code`). Payloads are zero-copy slices of the
//! read buffer, so one PUBLISH can be shared by every subscriber that receives it.
//!
//! The codec is our own rather than a general-purpose crate because the broker must speak 3.1.1
//! and 5.0 on one listener, classify every violation precisely (0x81 versus 0x82 versus 0x95), and
//! keep payloads as shared `Bytes` from socket to subscriber.

mod decode;
mod encode;
pub mod limits;
pub mod props;
pub mod reason;
#[cfg(test)]
mod tests;
mod wire;

use bytes::Bytes;

pub use decode::{decode, take_plain_ack, PlainAck};
pub use encode::{ack_header, encode_plain_ack, publish_size, PublishRef};
pub use props::{PerReceiver, PropContext, PropStr, Properties, RareProperties};
pub(crate) use wire::{
    read_binary, read_string, read_u16, read_u32, read_varint, varint_len, write_bin, write_varint,
};

/// Protocol level byte of MQTT 3.1.1.
pub const V311: u8 = 4;
/// Protocol level byte of MQTT 5.0.
pub const V5: u8 = 5;

/// Largest remaining length the variable byte integer can express.
pub const MAX_REMAINING_LENGTH: usize = 268_435_455;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("packet too large")]
    TooLarge,
    #[error("unsupported protocol version {0}")]
    UnsupportedProtocol(u8),
    #[error("topic alias invalid")]
    TopicAliasInvalid,
}

impl DecodeError {
    /// The reason code the specification assigns to this violation.
    pub fn reason_code(&self) -> u8 {
        match self {
            DecodeError::Malformed(_) => reason::MALFORMED_PACKET,
            DecodeError::Protocol(_) => reason::PROTOCOL_ERROR,
            DecodeError::TooLarge => reason::PACKET_TOO_LARGE,
            DecodeError::UnsupportedProtocol(_) => reason::UNSUPPORTED_PROTOCOL_VERSION,
            DecodeError::TopicAliasInvalid => reason::TOPIC_ALIAS_INVALID,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    pub fn from_u8(v: u8) -> Option<QoS> {
        match v {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub protocol_level: u8,
    pub clean_start: bool,
    pub keep_alive: u16,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    pub will: Option<Will>,
    pub properties: Properties,
}

impl Connect {
    /// An MQTT 5 CONNECT with a clean start and no credentials, will or properties.
    pub fn v5(client_id: &str, keep_alive: u16) -> Connect {
        Connect {
            protocol_level: V5,
            clean_start: true,
            keep_alive,
            client_id: client_id.to_owned(),
            username: None,
            password: None,
            will: None,
            properties: Properties::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnAck {
    pub session_present: bool,
    pub reason_code: u8,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    pub topic: String,
    pub packet_id: u16,
    pub properties: Properties,
    pub payload: Bytes,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share one shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ack {
    pub packet_id: u16,
    pub reason_code: u8,
    pub properties: Properties,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    pub properties: Properties,
    pub filters: Vec<(String, SubscriptionOptions)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    pub properties: Properties,
    pub reason_codes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    pub properties: Properties,
    pub filters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    pub properties: Properties,
    pub reason_codes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Disconnect {
    pub reason_code: u8,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Auth {
    pub reason_code: u8,
    pub properties: Properties,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    Auth(Auth),
}
