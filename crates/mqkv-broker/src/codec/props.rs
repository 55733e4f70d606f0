//! MQTT 5 properties (specification section 2.2.2).
//!
//! One struct serves every packet type; the decoder checks that each property is allowed in the
//! packet it arrived in, that none but User Property and Subscription Identifier repeats, and that
//! every value has the range the specification gives it.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{read_binary, read_string, read_u16, read_u32, read_varint, varint_len, DecodeError};

pub const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
pub const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
pub const CONTENT_TYPE: u8 = 0x03;
pub const RESPONSE_TOPIC: u8 = 0x08;
pub const CORRELATION_DATA: u8 = 0x09;
pub const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
pub const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
pub const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
pub const SERVER_KEEP_ALIVE: u8 = 0x13;
pub const AUTHENTICATION_METHOD: u8 = 0x15;
pub const AUTHENTICATION_DATA: u8 = 0x16;
pub const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
pub const WILL_DELAY_INTERVAL: u8 = 0x18;
pub const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
pub const RESPONSE_INFORMATION: u8 = 0x1A;
pub const SERVER_REFERENCE: u8 = 0x1C;
pub const REASON_STRING: u8 = 0x1F;
pub const RECEIVE_MAXIMUM: u8 = 0x21;
pub const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
pub const TOPIC_ALIAS: u8 = 0x23;
pub const MAXIMUM_QOS: u8 = 0x24;
pub const RETAIN_AVAILABLE: u8 = 0x25;
pub const USER_PROPERTY: u8 = 0x26;
pub const MAXIMUM_PACKET_SIZE: u8 = 0x27;
pub const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
pub const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
pub const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

/// Which packet a property block belongs to: decides which identifiers are legal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropContext {
    Connect,
    Will,
    ConnAck,
    Publish,
    Ack,
    Subscribe,
    SubAck,
    Unsubscribe,
    Disconnect,
    Auth,
}

fn allowed(ctx: PropContext, id: u8) -> bool {
    use PropContext::*;
    match id {
        PAYLOAD_FORMAT_INDICATOR
        | MESSAGE_EXPIRY_INTERVAL
        | CONTENT_TYPE
        | RESPONSE_TOPIC
        | CORRELATION_DATA => matches!(ctx, Publish | Will),
        SUBSCRIPTION_IDENTIFIER => matches!(ctx, Publish | Subscribe),
        SESSION_EXPIRY_INTERVAL => matches!(ctx, Connect | ConnAck | Disconnect),
        ASSIGNED_CLIENT_IDENTIFIER
        | SERVER_KEEP_ALIVE
        | RESPONSE_INFORMATION
        | MAXIMUM_QOS
        | RETAIN_AVAILABLE
        | WILDCARD_SUBSCRIPTION_AVAILABLE
        | SUBSCRIPTION_IDENTIFIER_AVAILABLE
        | SHARED_SUBSCRIPTION_AVAILABLE => ctx == ConnAck,
        AUTHENTICATION_METHOD | AUTHENTICATION_DATA => matches!(ctx, Connect | ConnAck | Auth),
        REQUEST_PROBLEM_INFORMATION | REQUEST_RESPONSE_INFORMATION => ctx == Connect,
        WILL_DELAY_INTERVAL => ctx == Will,
        SERVER_REFERENCE => matches!(ctx, ConnAck | Disconnect),
        REASON_STRING => matches!(ctx, ConnAck | Ack | SubAck | Disconnect | Auth),
        RECEIVE_MAXIMUM | TOPIC_ALIAS_MAXIMUM | MAXIMUM_PACKET_SIZE => {
            matches!(ctx, Connect | ConnAck)
        }
        TOPIC_ALIAS => ctx == Publish,
        USER_PROPERTY => true,
        _ => false,
    }
}

/// The properties of a PUBLISH that differ from one receiver to the next. Encoding a message
/// for a receiver with these in place of the message's own values needs no copy of the
/// message's properties.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerReceiver<'a> {
    pub message_expiry_interval: Option<u32>,
    pub subscription_identifiers: &'a [u32],
    pub topic_alias: Option<u16>,
}

/// The text of a content type or of a user property's name or value. Most are strings a
/// service or a client knows in advance (the RPC conventions' `__stat`, `__protVer`, `1.0`,
/// ...): those are borrowed, outgoing and incoming alike, and cost no allocation.
pub type PropStr = std::borrow::Cow<'static, str>;

/// Property texts decoded without a copy: names and values of the RPC conventions the state
/// store's clients use. Anything else is copied.
const COMMON_TEXTS: [&str; 18] = [
    "__ts",
    "__ft",
    "__stat",
    "__protVer",
    "__srcId",
    "__invId",
    "__stMsg",
    "__apErr",
    "__propName",
    "__propVal",
    "__supProtMajVer",
    "__requestProtVer",
    "1.0",
    "1",
    "200",
    "true",
    "application/octet-stream",
    "application/json",
];

/// Reads a string property text, borrowing it from [`COMMON_TEXTS`] when it is one of them.
fn read_prop_str(buf: &mut Bytes) -> Result<PropStr, DecodeError> {
    if buf.remaining() >= 2 {
        let len = usize::from(u16::from_be_bytes([buf[0], buf[1]]));
        if let Some(raw) = buf.get(2..2 + len) {
            if let Some(common) = COMMON_TEXTS.iter().find(|c| c.as_bytes() == raw) {
                buf.advance(2 + len);
                return Ok(PropStr::Borrowed(common));
            }
        }
    }
    read_string(buf).map(PropStr::Owned)
}

/// Every MQTT 5 property; `None` or empty means absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<PropStr>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub subscription_identifiers: Vec<u32>,
    pub session_expiry_interval: Option<u32>,
    pub server_keep_alive: Option<u16>,
    pub request_problem_information: Option<u8>,
    pub will_delay_interval: Option<u32>,
    pub request_response_information: Option<u8>,
    /// The texts and binary data that only a few packets carry, and rarely; kept out of line
    /// so that the properties of every PUBLISH and acknowledgement stay small to move.
    pub rare: Option<Box<RareProperties>>,
    pub receive_maximum: Option<u16>,
    pub topic_alias_maximum: Option<u16>,
    pub topic_alias: Option<u16>,
    pub maximum_qos: Option<u8>,
    pub retain_available: Option<u8>,
    pub user_properties: Vec<(PropStr, PropStr)>,
    pub maximum_packet_size: Option<u32>,
    pub wildcard_subscription_available: Option<u8>,
    pub subscription_identifier_available: Option<u8>,
    pub shared_subscription_available: Option<u8>,
}

/// Properties that only CONNECT, CONNACK, AUTH, DISCONNECT and acknowledgements carry (see
/// [`Properties::rare`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RareProperties {
    pub assigned_client_identifier: Option<String>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub reason_string: Option<String>,
}

impl Properties {
    /// The rare properties, made present (empty) if they were not.
    pub fn rare_mut(&mut self) -> &mut RareProperties {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The authentication method, if any.
    pub fn authentication_method(&self) -> Option<&str> {
        self.rare.as_ref()?.authentication_method.as_deref()
    }
}

fn set_once<T>(slot: &mut Option<T>, v: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::Protocol("property included more than once"));
    }
    *slot = Some(v);
    Ok(())
}

fn read_u8(buf: &mut Bytes) -> Result<u8, DecodeError> {
    if buf.remaining() < 1 {
        return Err(DecodeError::Malformed("property value truncated"));
    }
    Ok(buf.get_u8())
}

fn read_flag(buf: &mut Bytes) -> Result<u8, DecodeError> {
    let v = read_u8(buf)?;
    if v > 1 {
        return Err(DecodeError::Protocol("property value must be 0 or 1"));
    }
    Ok(v)
}

impl Properties {
    /// Decodes a property block (length prefix included) from `buf`.
    pub fn decode(buf: &mut Bytes, ctx: PropContext) -> Result<Properties, DecodeError> {
        let len = read_varint(buf)? as usize;
        if buf.remaining() < len {
            return Err(DecodeError::Malformed("property length exceeds packet"));
        }
        let mut block = buf.split_to(len);
        let mut p = Properties::default();
        while block.has_remaining() {
            let id = read_varint(&mut block)?;
            let id = u8::try_from(id).map_err(|_| DecodeError::Malformed("unknown property"))?;
            if !allowed(ctx, id) {
                return Err(DecodeError::Malformed(
                    "property not allowed in this packet",
                ));
            }
            let b = &mut block;
            match id {
                PAYLOAD_FORMAT_INDICATOR => {
                    set_once(&mut p.payload_format_indicator, read_flag(b)?)?
                }
                MESSAGE_EXPIRY_INTERVAL => set_once(&mut p.message_expiry_interval, read_u32(b)?)?,
                CONTENT_TYPE => set_once(&mut p.content_type, read_prop_str(b)?)?,
                RESPONSE_TOPIC => set_once(&mut p.response_topic, read_string(b)?)?,
                CORRELATION_DATA => set_once(&mut p.correlation_data, read_binary(b)?)?,
                SUBSCRIPTION_IDENTIFIER => {
                    let v = read_varint(b)?;
                    if v == 0 {
                        return Err(DecodeError::Protocol("subscription identifier 0"));
                    }
                    if ctx == PropContext::Subscribe && !p.subscription_identifiers.is_empty() {
                        return Err(DecodeError::Protocol(
                            "more than one subscription identifier",
                        ));
                    }
                    p.subscription_identifiers.push(v);
                }
                SESSION_EXPIRY_INTERVAL => set_once(&mut p.session_expiry_interval, read_u32(b)?)?,
                ASSIGNED_CLIENT_IDENTIFIER => set_once(
                    &mut p.rare_mut().assigned_client_identifier,
                    read_string(b)?,
                )?,
                SERVER_KEEP_ALIVE => set_once(&mut p.server_keep_alive, read_u16(b)?)?,
                AUTHENTICATION_METHOD => {
                    set_once(&mut p.rare_mut().authentication_method, read_string(b)?)?
                }
                AUTHENTICATION_DATA => {
                    set_once(&mut p.rare_mut().authentication_data, read_binary(b)?)?
                }
                REQUEST_PROBLEM_INFORMATION => {
                    set_once(&mut p.request_problem_information, read_flag(b)?)?
                }
                WILL_DELAY_INTERVAL => set_once(&mut p.will_delay_interval, read_u32(b)?)?,
                REQUEST_RESPONSE_INFORMATION => {
                    set_once(&mut p.request_response_information, read_flag(b)?)?
                }
                RESPONSE_INFORMATION => {
                    set_once(&mut p.rare_mut().response_information, read_string(b)?)?
                }
                SERVER_REFERENCE => set_once(&mut p.rare_mut().server_reference, read_string(b)?)?,
                REASON_STRING => set_once(&mut p.rare_mut().reason_string, read_string(b)?)?,
                RECEIVE_MAXIMUM => {
                    let v = read_u16(b)?;
                    if v == 0 {
                        return Err(DecodeError::Protocol("receive maximum 0"));
                    }
                    set_once(&mut p.receive_maximum, v)?
                }
                TOPIC_ALIAS_MAXIMUM => set_once(&mut p.topic_alias_maximum, read_u16(b)?)?,
                TOPIC_ALIAS => set_once(&mut p.topic_alias, read_u16(b)?)?,
                MAXIMUM_QOS => {
                    let v = read_u8(b)?;
                    if v > 1 {
                        return Err(DecodeError::Protocol("maximum qos must be 0 or 1"));
                    }
                    set_once(&mut p.maximum_qos, v)?
                }
                RETAIN_AVAILABLE => set_once(&mut p.retain_available, read_flag(b)?)?,
                USER_PROPERTY => {
                    let k = read_prop_str(b)?;
                    let v = read_prop_str(b)?;
                    p.user_properties.push((k, v));
                }
                MAXIMUM_PACKET_SIZE => {
                    let v = read_u32(b)?;
                    if v == 0 {
                        return Err(DecodeError::Protocol("maximum packet size 0"));
                    }
                    set_once(&mut p.maximum_packet_size, v)?
                }
                WILDCARD_SUBSCRIPTION_AVAILABLE => {
                    set_once(&mut p.wildcard_subscription_available, read_flag(b)?)?
                }
                SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                    set_once(&mut p.subscription_identifier_available, read_flag(b)?)?
                }
                SHARED_SUBSCRIPTION_AVAILABLE => {
                    set_once(&mut p.shared_subscription_available, read_flag(b)?)?
                }
                _ => return Err(DecodeError::Malformed("unknown property")),
            }
        }
        Ok(p)
    }

    /// Encoded length of the properties, without the length prefix.
    pub fn body_len(&self) -> usize {
        self.body_len_with(&self.per_receiver())
    }

    /// The values [`PerReceiver`] can stand in for, as this block has them.
    pub fn per_receiver(&self) -> PerReceiver<'_> {
        PerReceiver {
            message_expiry_interval: self.message_expiry_interval,
            subscription_identifiers: &self.subscription_identifiers,
            topic_alias: self.topic_alias,
        }
    }

    /// Encoded length with `over` in place of the block's own per-receiver values.
    pub fn body_len_with(&self, over: &PerReceiver<'_>) -> usize {
        let s = |v: Option<&str>| v.map_or(0, |s| 3 + s.len());
        let b = |v: Option<&Bytes>| v.map_or(0, |s| 3 + s.len());
        let rare = self.rare.as_deref();
        let rs = |f: fn(&RareProperties) -> Option<&str>| s(rare.and_then(f));
        let n1 = |v: &Option<u8>| v.map_or(0, |_| 2);
        let n2 = |v: &Option<u16>| v.map_or(0, |_| 3);
        let n4 = |v: &Option<u32>| v.map_or(0, |_| 5);
        n1(&self.payload_format_indicator)
            + n4(&over.message_expiry_interval)
            + s(self.content_type.as_deref())
            + s(self.response_topic.as_deref())
            + b(self.correlation_data.as_ref())
            + over
                .subscription_identifiers
                .iter()
                .map(|v| 1 + varint_len(*v as usize))
                .sum::<usize>()
            + n4(&self.session_expiry_interval)
            + rs(|r| r.assigned_client_identifier.as_deref())
            + n2(&self.server_keep_alive)
            + rs(|r| r.authentication_method.as_deref())
            + b(rare.and_then(|r| r.authentication_data.as_ref()))
            + n1(&self.request_problem_information)
            + n4(&self.will_delay_interval)
            + n1(&self.request_response_information)
            + rs(|r| r.response_information.as_deref())
            + rs(|r| r.server_reference.as_deref())
            + rs(|r| r.reason_string.as_deref())
            + n2(&self.receive_maximum)
            + n2(&self.topic_alias_maximum)
            + n2(&over.topic_alias)
            + n1(&self.maximum_qos)
            + n1(&self.retain_available)
            + self
                .user_properties
                .iter()
                .map(|(k, v)| 5 + k.len() + v.len())
                .sum::<usize>()
            + n4(&self.maximum_packet_size)
            + n1(&self.wildcard_subscription_available)
            + n1(&self.subscription_identifier_available)
            + n1(&self.shared_subscription_available)
    }

    /// Encoded length including the length prefix.
    pub fn encoded_len(&self) -> usize {
        let n = self.body_len();
        varint_len(n) + n
    }

    /// Writes the property block, length prefix first.
    pub fn encode(&self, out: &mut BytesMut) {
        self.encode_with(out, &self.per_receiver());
    }

    /// The property block of a PUBLISH as bytes of their own (length prefix first), as a
    /// message is kept in the state file or sent to another node.
    pub fn to_block(&self) -> Vec<u8> {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.to_vec()
    }

    /// Reads back what [`Self::to_block`] wrote; an empty block is no properties.
    pub fn from_block(block: Vec<u8>) -> Result<Properties, DecodeError> {
        if block.is_empty() {
            return Ok(Properties::default());
        }
        Properties::decode(&mut Bytes::from(block), PropContext::Publish)
    }

    /// Writes the property block with `over` in place of the block's own per-receiver values,
    /// length prefix first.
    pub fn encode_with(&self, out: &mut BytesMut, over: &PerReceiver<'_>) {
        self.encode_with_body_len(out, over, self.body_len_with(over));
    }

    /// [`Properties::encode_with`], given the block's [`Properties::body_len_with`].
    pub fn encode_with_body_len(&self, out: &mut BytesMut, over: &PerReceiver<'_>, body: usize) {
        super::write_varint(out, body);
        fn s(out: &mut BytesMut, id: u8, v: Option<&str>) {
            if let Some(v) = v {
                out.put_u8(id);
                super::write_bin(out, v.as_bytes());
            }
        }
        fn b(out: &mut BytesMut, id: u8, v: Option<&Bytes>) {
            if let Some(v) = v {
                out.put_u8(id);
                super::write_bin(out, v);
            }
        }
        fn n1(out: &mut BytesMut, id: u8, v: Option<u8>) {
            if let Some(v) = v {
                out.put_u8(id);
                out.put_u8(v);
            }
        }
        fn n2(out: &mut BytesMut, id: u8, v: Option<u16>) {
            if let Some(v) = v {
                out.put_u8(id);
                out.put_u16(v);
            }
        }
        fn n4(out: &mut BytesMut, id: u8, v: Option<u32>) {
            if let Some(v) = v {
                out.put_u8(id);
                out.put_u32(v);
            }
        }
        n1(out, PAYLOAD_FORMAT_INDICATOR, self.payload_format_indicator);
        n4(out, MESSAGE_EXPIRY_INTERVAL, over.message_expiry_interval);
        s(out, CONTENT_TYPE, self.content_type.as_deref());
        s(out, RESPONSE_TOPIC, self.response_topic.as_deref());
        b(out, CORRELATION_DATA, self.correlation_data.as_ref());
        for id in over.subscription_identifiers {
            out.put_u8(SUBSCRIPTION_IDENTIFIER);
            super::write_varint(out, *id as usize);
        }
        n4(out, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        let rare = self.rare.as_deref();
        s(
            out,
            ASSIGNED_CLIENT_IDENTIFIER,
            rare.and_then(|r| r.assigned_client_identifier.as_deref()),
        );
        n2(out, SERVER_KEEP_ALIVE, self.server_keep_alive);
        s(
            out,
            AUTHENTICATION_METHOD,
            rare.and_then(|r| r.authentication_method.as_deref()),
        );
        b(
            out,
            AUTHENTICATION_DATA,
            rare.and_then(|r| r.authentication_data.as_ref()),
        );
        n1(
            out,
            REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
        );
        n4(out, WILL_DELAY_INTERVAL, self.will_delay_interval);
        n1(
            out,
            REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
        );
        s(
            out,
            RESPONSE_INFORMATION,
            rare.and_then(|r| r.response_information.as_deref()),
        );
        s(
            out,
            SERVER_REFERENCE,
            rare.and_then(|r| r.server_reference.as_deref()),
        );
        s(
            out,
            REASON_STRING,
            rare.and_then(|r| r.reason_string.as_deref()),
        );
        n2(out, RECEIVE_MAXIMUM, self.receive_maximum);
        n2(out, TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        n2(out, TOPIC_ALIAS, over.topic_alias);
        n1(out, MAXIMUM_QOS, self.maximum_qos);
        n1(out, RETAIN_AVAILABLE, self.retain_available);
        for (k, v) in &self.user_properties {
            out.put_u8(USER_PROPERTY);
            super::write_bin(out, k.as_bytes());
            super::write_bin(out, v.as_bytes());
        }
        n4(out, MAXIMUM_PACKET_SIZE, self.maximum_packet_size);
        n1(
            out,
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
        );
        n1(
            out,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifier_available,
        );
        n1(
            out,
            SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
        );
    }
}
