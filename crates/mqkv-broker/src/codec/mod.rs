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

pub mod limits;
pub mod props;
pub mod reason;

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub use props::{PerReceiver, PropContext, PropStr, Properties, RareProperties};

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

// ---------------------------------------------------------------------------------------------
// Primitive readers and writers.

pub(crate) fn read_varint(buf: &mut Bytes) -> Result<u32, DecodeError> {
    let mut value: u32 = 0;
    for i in 0..4 {
        if !buf.has_remaining() {
            return Err(DecodeError::Malformed("variable byte integer truncated"));
        }
        let b = buf.get_u8();
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                // Non-minimal encodings are not forbidden outright, but a trailing zero
                // continuation is never produced by a conforming sender; accept it anyway.
            }
            return Ok(value);
        }
    }
    Err(DecodeError::Malformed(
        "variable byte integer longer than 4 bytes",
    ))
}

pub(crate) fn varint_len(v: usize) -> usize {
    match v {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

pub(crate) fn write_varint(out: &mut BytesMut, mut v: usize) {
    loop {
        let mut b = (v % 128) as u8;
        v /= 128;
        if v > 0 {
            b |= 0x80;
        }
        out.put_u8(b);
        if v == 0 {
            break;
        }
    }
}

pub(crate) fn read_u16(buf: &mut Bytes) -> Result<u16, DecodeError> {
    if buf.remaining() < 2 {
        return Err(DecodeError::Malformed("two byte integer truncated"));
    }
    Ok(buf.get_u16())
}

pub(crate) fn read_u32(buf: &mut Bytes) -> Result<u32, DecodeError> {
    if buf.remaining() < 4 {
        return Err(DecodeError::Malformed("four byte integer truncated"));
    }
    Ok(buf.get_u32())
}

pub(crate) fn read_binary(buf: &mut Bytes) -> Result<Bytes, DecodeError> {
    let len = read_u16(buf)? as usize;
    if buf.remaining() < len {
        return Err(DecodeError::Malformed("binary data truncated"));
    }
    Ok(buf.split_to(len))
}

pub(crate) fn read_string(buf: &mut Bytes) -> Result<String, DecodeError> {
    let len = read_u16(buf)? as usize;
    // Checked and copied in place: splitting off a `Bytes` first would cost a reference count
    // taken and dropped for every string of every packet.
    let raw = buf
        .get(..len)
        .ok_or(DecodeError::Malformed("binary data truncated"))?;
    let s = if ascii_without_nul(raw) {
        // SAFETY: ASCII is UTF-8.
        unsafe { std::str::from_utf8_unchecked(raw) }
    } else {
        let s =
            std::str::from_utf8(raw).map_err(|_| DecodeError::Malformed("invalid UTF-8 string"))?;
        if memchr::memchr(0, raw).is_some() {
            return Err(DecodeError::Malformed("string contains U+0000"));
        }
        s
    };
    let owned = s.to_owned();
    buf.advance(len);
    Ok(owned)
}

/// Whether `raw` is ASCII with no NUL, checked eight bytes at a time: a valid MQTT string, as
/// topics, client ids and the request/response conventions' texts almost always are. The
/// general checks (UTF-8, then a search for U+0000) each go over the bytes again.
fn ascii_without_nul(raw: &[u8]) -> bool {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = raw.chunks_exact(8);
    for word in &mut words {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        let w = u64::from_le_bytes(bytes);
        // A high bit set, or a zero byte (the classic test: exact when no high bit is set).
        if (w | (w.wrapping_sub(LOW) & !w)) & HIGH != 0 {
            return false;
        }
    }
    words.remainder().iter().all(|&b| b != 0 && b.is_ascii())
}

pub(crate) fn write_bin(out: &mut BytesMut, v: &[u8]) {
    // Every packet is checked before it is encoded (see `limits`), so this never cuts.
    let len = v.len().min(u16::MAX as usize);
    out.put_u16(len as u16);
    out.put_slice(&v[..len]);
}

// ---------------------------------------------------------------------------------------------
// Decoding.

/// Peeks at a buffered fixed header. Returns `(header byte, remaining length, header length)`
/// once the whole fixed header is present.
fn peek_fixed_header(buf: &[u8]) -> Result<Option<(u8, usize, usize)>, DecodeError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let mut value: usize = 0;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        value |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((buf[0], value, 2 + i)));
        }
    }
    Err(DecodeError::Malformed(
        "remaining length longer than 4 bytes",
    ))
}

/// The least room a buffer holding part of a packet is given at once.
const GROWTH_FLOOR: usize = 8 * 1024;

/// Decodes one packet from `buf` if a whole one is buffered.
///
/// `protocol_level` is `None` before CONNECT (only CONNECT is then acceptable) and the
/// negotiated level afterwards. `max_packet_size` is the largest whole packet accepted.
pub fn decode(
    buf: &mut BytesMut,
    protocol_level: Option<u8>,
    max_packet_size: usize,
) -> Result<Option<Packet>, DecodeError> {
    let Some((header, remaining, header_len)) = peek_fixed_header(buf)? else {
        return Ok(None);
    };
    if header_len + remaining > max_packet_size {
        return Err(DecodeError::TooLarge);
    }
    if buf.len() < header_len + remaining {
        // Room grows with what has arrived (doubling), not with what the header announces: a
        // client that announces a large packet and sends little makes the server hold little.
        let missing = header_len + remaining - buf.len();
        buf.reserve(missing.min(buf.len().max(GROWTH_FLOOR)));
        return Ok(None);
    }
    buf.advance(header_len);
    let body = buf.split_to(remaining).freeze();
    decode_body(header, body, protocol_level).map(Some)
}

/// An acknowledgement taken from the buffer by [`take_plain_ack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlainAck {
    /// [`ack_header::PUBACK`], [`ack_header::PUBREC`] or [`ack_header::PUBCOMP`].
    pub header: u8,
    pub packet_id: u16,
    pub reason_code: u8,
}

/// Takes a whole PUBACK, PUBREC or PUBCOMP without properties from the front of `buf` (the
/// acknowledgements nearly every client sends), without building a [`Packet`]. `None`, with
/// `buf` untouched, for anything else, including such a packet that is incomplete or invalid:
/// [`decode`] then decodes it, or reports what is wrong with it.
pub fn take_plain_ack(buf: &mut BytesMut, level: u8, max_packet_size: usize) -> Option<PlainAck> {
    let (&header, rest) = buf.split_first()?;
    if !matches!(
        header,
        ack_header::PUBACK | ack_header::PUBREC | ack_header::PUBCOMP
    ) {
        return None;
    }
    let (&remaining, rest) = rest.split_first()?;
    let reason_code = match (remaining, level) {
        (2, _) => 0,
        (3, V5) => *rest.get(2)?,
        _ => return None,
    };
    let len = 2 + usize::from(remaining);
    let packet_id = u16::from_be_bytes([*rest.first()?, *rest.get(1)?]);
    if packet_id == 0 || len > max_packet_size {
        return None;
    }
    buf.advance(len);
    Some(PlainAck {
        header,
        packet_id,
        reason_code,
    })
}

fn expect_flags(header: u8, flags: u8) -> Result<(), DecodeError> {
    if header & 0x0F != flags {
        return Err(DecodeError::Malformed("reserved fixed header flags"));
    }
    Ok(())
}

fn decode_body(header: u8, mut body: Bytes, level: Option<u8>) -> Result<Packet, DecodeError> {
    let kind = header >> 4;
    let Some(level) = level else {
        if kind != 1 {
            return Err(DecodeError::Protocol("first packet is not CONNECT"));
        }
        expect_flags(header, 0)?;
        return decode_connect(&mut body).map(|c| Packet::Connect(Box::new(c)));
    };
    let v5 = level == V5;
    let packet = match kind {
        1 => return Err(DecodeError::Protocol("second CONNECT")),
        3 => Packet::Publish(decode_publish(header, &mut body, v5)?),
        4 | 5 | 7 => {
            expect_flags(header, 0)?;
            let ack = decode_ack(&mut body, v5)?;
            match kind {
                4 => Packet::PubAck(ack),
                5 => Packet::PubRec(ack),
                _ => Packet::PubComp(ack),
            }
        }
        6 => {
            expect_flags(header, 0b0010)?;
            Packet::PubRel(decode_ack(&mut body, v5)?)
        }
        8 => {
            expect_flags(header, 0b0010)?;
            Packet::Subscribe(decode_subscribe(&mut body, v5)?)
        }
        10 => {
            expect_flags(header, 0b0010)?;
            Packet::Unsubscribe(decode_unsubscribe(&mut body, v5)?)
        }
        12 => {
            expect_flags(header, 0)?;
            Packet::PingReq
        }
        14 => {
            expect_flags(header, 0)?;
            let mut d = Disconnect::default();
            if v5 && body.has_remaining() {
                d.reason_code = body.get_u8();
                if body.has_remaining() {
                    d.properties = Properties::decode(&mut body, PropContext::Disconnect)?;
                }
            }
            Packet::Disconnect(d)
        }
        15 if v5 => {
            expect_flags(header, 0)?;
            let mut a = Auth::default();
            if body.has_remaining() {
                a.reason_code = body.get_u8();
                if body.has_remaining() {
                    a.properties = Properties::decode(&mut body, PropContext::Auth)?;
                }
            }
            Packet::Auth(a)
        }
        2 | 9 | 11 | 13 => {
            return Err(DecodeError::Protocol("server-to-client packet from client"))
        }
        _ => return Err(DecodeError::Malformed("reserved packet type")),
    };
    if body.has_remaining() {
        return Err(DecodeError::Malformed("trailing bytes after packet"));
    }
    Ok(packet)
}

fn decode_connect(body: &mut Bytes) -> Result<Connect, DecodeError> {
    let name = read_binary(body)?;
    if body.remaining() < 1 {
        return Err(DecodeError::Malformed("CONNECT truncated"));
    }
    let level = body.get_u8();
    if &name[..] != b"MQTT" {
        if &name[..] == b"MQIsdp" {
            return Err(DecodeError::UnsupportedProtocol(level));
        }
        return Err(DecodeError::Malformed("protocol name is not MQTT"));
    }
    if level != V5 && level != V311 {
        return Err(DecodeError::UnsupportedProtocol(level));
    }
    if body.remaining() < 3 {
        return Err(DecodeError::Malformed("CONNECT truncated"));
    }
    let flags = body.get_u8();
    if flags & 0x01 != 0 {
        return Err(DecodeError::Malformed("CONNECT reserved flag set"));
    }
    let keep_alive = body.get_u16();
    let clean_start = flags & 0x02 != 0;
    let will_flag = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 0x03;
    let will_retain = flags & 0x20 != 0;
    let password_flag = flags & 0x40 != 0;
    let username_flag = flags & 0x80 != 0;
    if !will_flag && (will_qos != 0 || will_retain) {
        return Err(DecodeError::Malformed(
            "will QoS or retain without will flag",
        ));
    }
    let will_qos = QoS::from_u8(will_qos).ok_or(DecodeError::Malformed("will QoS 3"))?;
    if level == V311 && password_flag && !username_flag {
        return Err(DecodeError::Malformed("password without user name"));
    }
    let properties = if level == V5 {
        Properties::decode(body, PropContext::Connect)?
    } else {
        Properties::default()
    };
    let client_id = read_string(body)?;
    let will = if will_flag {
        let will_properties = if level == V5 {
            Properties::decode(body, PropContext::Will)?
        } else {
            Properties::default()
        };
        let topic = read_string(body)?;
        let payload = read_binary(body)?;
        Some(Will {
            topic,
            payload,
            qos: will_qos,
            retain: will_retain,
            properties: will_properties,
        })
    } else {
        None
    };
    let username = if username_flag {
        Some(read_string(body)?)
    } else {
        None
    };
    let password = if password_flag {
        Some(read_binary(body)?)
    } else {
        None
    };
    if body.has_remaining() {
        return Err(DecodeError::Malformed("trailing bytes after CONNECT"));
    }
    Ok(Connect {
        protocol_level: level,
        clean_start,
        keep_alive,
        client_id,
        username,
        password,
        will,
        properties,
    })
}

fn decode_publish(header: u8, body: &mut Bytes, v5: bool) -> Result<Publish, DecodeError> {
    let dup = header & 0x08 != 0;
    let qos = QoS::from_u8((header >> 1) & 0x03).ok_or(DecodeError::Malformed("PUBLISH QoS 3"))?;
    let retain = header & 0x01 != 0;
    if qos == QoS::AtMostOnce && dup {
        return Err(DecodeError::Malformed("DUP set on QoS 0 PUBLISH"));
    }
    let topic = read_string(body)?;
    let packet_id = if qos != QoS::AtMostOnce {
        let id = read_u16(body)?;
        if id == 0 {
            return Err(DecodeError::Malformed("packet identifier 0"));
        }
        id
    } else {
        0
    };
    let properties = if v5 {
        Properties::decode(body, PropContext::Publish)?
    } else {
        Properties::default()
    };
    let payload = body.split_off(0);
    Ok(Publish {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        properties,
        payload,
    })
}

fn decode_ack(body: &mut Bytes, v5: bool) -> Result<Ack, DecodeError> {
    let packet_id = read_u16(body)?;
    if packet_id == 0 {
        return Err(DecodeError::Malformed("packet identifier 0"));
    }
    let mut ack = Ack {
        packet_id,
        ..Ack::default()
    };
    if v5 && body.has_remaining() {
        ack.reason_code = body.get_u8();
        if body.has_remaining() {
            ack.properties = Properties::decode(body, PropContext::Ack)?;
        }
    }
    Ok(ack)
}

fn decode_subscribe(body: &mut Bytes, v5: bool) -> Result<Subscribe, DecodeError> {
    let packet_id = read_u16(body)?;
    if packet_id == 0 {
        return Err(DecodeError::Malformed("packet identifier 0"));
    }
    let properties = if v5 {
        Properties::decode(body, PropContext::Subscribe)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while body.has_remaining() {
        let filter = read_string(body)?;
        if !body.has_remaining() {
            return Err(DecodeError::Malformed("subscription options missing"));
        }
        let o = body.get_u8();
        let reserved = if v5 { 0xC0 } else { 0xFC };
        if o & reserved != 0 {
            return Err(DecodeError::Malformed("reserved subscription option bits"));
        }
        let qos = QoS::from_u8(o & 0x03).ok_or(DecodeError::Malformed("subscription QoS 3"))?;
        let retain_handling = (o >> 4) & 0x03;
        if retain_handling == 3 {
            return Err(DecodeError::Protocol("retain handling 3"));
        }
        filters.push((
            filter,
            SubscriptionOptions {
                qos,
                no_local: o & 0x04 != 0,
                retain_as_published: o & 0x08 != 0,
                retain_handling,
            },
        ));
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe {
        packet_id,
        properties,
        filters,
    })
}

fn decode_unsubscribe(body: &mut Bytes, v5: bool) -> Result<Unsubscribe, DecodeError> {
    let packet_id = read_u16(body)?;
    if packet_id == 0 {
        return Err(DecodeError::Malformed("packet identifier 0"));
    }
    let properties = if v5 {
        Properties::decode(body, PropContext::Unsubscribe)?
    } else {
        Properties::default()
    };
    let mut filters = Vec::new();
    while body.has_remaining() {
        filters.push(read_string(body)?);
    }
    if filters.is_empty() {
        return Err(DecodeError::Protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe {
        packet_id,
        properties,
        filters,
    })
}

// ---------------------------------------------------------------------------------------------
// Encoding.

fn put_header(out: &mut BytesMut, header: u8, remaining: usize) {
    out.put_u8(header);
    write_varint(out, remaining);
}

/// Size of a PUBLISH on the wire, for checks against the receiver's maximum packet size.
pub fn publish_size(p: &Publish, level: u8) -> usize {
    PublishRef::new(p).size(level)
}

/// A PUBLISH to encode, borrowing its parts, with the per-receiver properties given apart from
/// the rest: what a broker sends each subscriber of one message.
#[derive(Debug, Clone, Copy)]
pub struct PublishRef<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty when a topic alias stands for the topic.
    pub topic: &'a str,
    pub packet_id: u16,
    pub properties: &'a Properties,
    pub per_receiver: PerReceiver<'a>,
    pub payload: &'a [u8],
}

impl<'a> PublishRef<'a> {
    /// The PUBLISH exactly as `p` has it.
    pub fn new(p: &'a Publish) -> PublishRef<'a> {
        PublishRef {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: &p.topic,
            packet_id: p.packet_id,
            properties: &p.properties,
            per_receiver: p.properties.per_receiver(),
            payload: &p.payload,
        }
    }

    /// The property block's length without its length prefix, where the level has properties.
    fn properties_body(&self, level: u8) -> Option<usize> {
        (level == V5).then(|| self.properties.body_len_with(&self.per_receiver))
    }

    fn remaining(&self, properties_body: Option<usize>) -> usize {
        let mut n = 2 + self.topic.len() + self.payload.len();
        if self.qos != QoS::AtMostOnce {
            n += 2;
        }
        if let Some(body) = properties_body {
            n += varint_len(body) + body;
        }
        n
    }

    /// The whole packet's size on the wire.
    pub fn size(&self, level: u8) -> usize {
        let remaining = self.remaining(self.properties_body(level));
        1 + varint_len(remaining) + remaining
    }

    /// Appends the packet to `out`, as the given protocol level spells it; nothing if it
    /// cannot be encoded (see [`limits`]).
    pub fn encode(&self, out: &mut BytesMut, level: u8) {
        // Measured once: the length goes both into the fixed header and before the properties.
        let properties_body = match self.checked_properties_body(level) {
            Ok(body) => body,
            Err(e) => {
                limits::dropped("PUBLISH", e);
                return;
            }
        };
        let mut h = 0x30 | ((self.qos as u8) << 1);
        if self.dup {
            h |= 0x08;
        }
        if self.retain {
            h |= 0x01;
        }
        put_header(out, h, self.remaining(properties_body));
        write_bin(out, self.topic.as_bytes());
        if self.qos != QoS::AtMostOnce {
            out.put_u16(self.packet_id);
        }
        if let Some(body) = properties_body {
            self.properties
                .encode_with_body_len(out, &self.per_receiver, body);
        }
        out.put_slice(self.payload);
    }
}

impl Packet {
    /// Appends the packet to `out`, as the given protocol level spells it; nothing if it
    /// cannot be encoded (see [`limits`]).
    pub fn encode(&self, out: &mut BytesMut, level: u8) {
        if let Err(e) = self.check(level) {
            limits::dropped(self.kind(), e);
            return;
        }
        let v5 = level == V5;
        match self {
            Packet::Connect(c) => encode_connect(c, out),
            Packet::ConnAck(c) => {
                let props = if v5 { c.properties.encoded_len() } else { 0 };
                put_header(out, 0x20, 2 + props);
                out.put_u8(u8::from(c.session_present));
                out.put_u8(if v5 {
                    c.reason_code
                } else {
                    reason::connack_v3(c.reason_code)
                });
                if v5 {
                    c.properties.encode(out);
                }
            }
            Packet::Publish(p) => PublishRef::new(p).encode(out, level),
            Packet::PubAck(a) => encode_ack(out, ack_header::PUBACK, a, level),
            Packet::PubRec(a) => encode_ack(out, ack_header::PUBREC, a, level),
            Packet::PubRel(a) => encode_ack(out, ack_header::PUBREL, a, level),
            Packet::PubComp(a) => encode_ack(out, ack_header::PUBCOMP, a, level),
            Packet::Subscribe(s) => {
                let mut n = 2 + s.filters.iter().map(|(f, _)| 3 + f.len()).sum::<usize>();
                if v5 {
                    n += s.properties.encoded_len();
                }
                put_header(out, 0x82, n);
                out.put_u16(s.packet_id);
                if v5 {
                    s.properties.encode(out);
                }
                for (f, o) in &s.filters {
                    write_bin(out, f.as_bytes());
                    let mut b = o.qos as u8;
                    if o.no_local {
                        b |= 0x04;
                    }
                    if o.retain_as_published {
                        b |= 0x08;
                    }
                    b |= o.retain_handling << 4;
                    out.put_u8(b);
                }
            }
            Packet::SubAck(s) => {
                let props = if v5 { s.properties.encoded_len() } else { 0 };
                put_header(out, 0x90, 2 + props + s.reason_codes.len());
                out.put_u16(s.packet_id);
                if v5 {
                    s.properties.encode(out);
                }
                for c in &s.reason_codes {
                    out.put_u8(if v5 || *c < 0x80 {
                        *c
                    } else {
                        reason::v3::SUBACK_FAILURE
                    });
                }
            }
            Packet::Unsubscribe(u) => {
                let mut n = 2 + u.filters.iter().map(|f| 2 + f.len()).sum::<usize>();
                if v5 {
                    n += u.properties.encoded_len();
                }
                put_header(out, 0xA2, n);
                out.put_u16(u.packet_id);
                if v5 {
                    u.properties.encode(out);
                }
                for f in &u.filters {
                    write_bin(out, f.as_bytes());
                }
            }
            Packet::UnsubAck(u) => {
                if v5 {
                    put_header(
                        out,
                        0xB0,
                        2 + u.properties.encoded_len() + u.reason_codes.len(),
                    );
                    out.put_u16(u.packet_id);
                    u.properties.encode(out);
                    out.put_slice(&u.reason_codes);
                } else {
                    put_header(out, 0xB0, 2);
                    out.put_u16(u.packet_id);
                }
            }
            Packet::PingReq => out.put_slice(&[0xC0, 0]),
            Packet::PingResp => out.put_slice(&[0xD0, 0]),
            Packet::Disconnect(d) => {
                if v5 {
                    let props = d.properties.body_len();
                    if props == 0 && d.reason_code == 0 {
                        out.put_slice(&[0xE0, 0]);
                    } else {
                        put_header(out, 0xE0, 1 + d.properties.encoded_len());
                        out.put_u8(d.reason_code);
                        d.properties.encode(out);
                    }
                } else {
                    out.put_slice(&[0xE0, 0]);
                }
            }
            Packet::Auth(a) => {
                put_header(out, 0xF0, 1 + a.properties.encoded_len());
                out.put_u8(a.reason_code);
                a.properties.encode(out);
            }
        }
    }
}

/// The fixed header byte of each acknowledgement.
pub mod ack_header {
    pub const PUBACK: u8 = 0x40;
    pub const PUBREC: u8 = 0x50;
    pub const PUBREL: u8 = 0x62;
    pub const PUBCOMP: u8 = 0x70;
}

/// Encodes an acknowledgement without properties: PUBACK, PUBREC, PUBREL or PUBCOMP as
/// `header` ([`ack_header`]) says. The same bytes as the [`Packet`] with empty properties.
pub fn encode_plain_ack(
    out: &mut BytesMut,
    header: u8,
    packet_id: u16,
    reason_code: u8,
    level: u8,
) {
    // MQTT 5 leaves out a reason code of 0; 3.1.1 has none.
    let with_reason = level == V5 && reason_code != 0;
    put_header(out, header, 2 + usize::from(with_reason));
    out.put_u16(packet_id);
    if with_reason {
        out.put_u8(reason_code);
    }
}

fn encode_ack(out: &mut BytesMut, header: u8, a: &Ack, level: u8) {
    if level != V5 || a.properties.body_len() == 0 {
        encode_plain_ack(out, header, a.packet_id, a.reason_code, level);
    } else {
        put_header(out, header, 3 + a.properties.encoded_len());
        out.put_u16(a.packet_id);
        out.put_u8(a.reason_code);
        a.properties.encode(out);
    }
}

fn encode_connect(c: &Connect, out: &mut BytesMut) {
    let v5 = c.protocol_level == V5;
    let mut body = BytesMut::new();
    write_bin(&mut body, b"MQTT");
    body.put_u8(c.protocol_level);
    let mut flags = 0u8;
    if c.clean_start {
        flags |= 0x02;
    }
    if let Some(w) = &c.will {
        flags |= 0x04 | ((w.qos as u8) << 3);
        if w.retain {
            flags |= 0x20;
        }
    }
    if c.password.is_some() {
        flags |= 0x40;
    }
    if c.username.is_some() {
        flags |= 0x80;
    }
    body.put_u8(flags);
    body.put_u16(c.keep_alive);
    if v5 {
        c.properties.encode(&mut body);
    }
    write_bin(&mut body, c.client_id.as_bytes());
    if let Some(w) = &c.will {
        if v5 {
            w.properties.encode(&mut body);
        }
        write_bin(&mut body, w.topic.as_bytes());
        write_bin(&mut body, &w.payload);
    }
    if let Some(u) = &c.username {
        write_bin(&mut body, u.as_bytes());
    }
    if let Some(p) = &c.password {
        write_bin(&mut body, p);
    }
    put_header(out, 0x10, body.len());
    out.put_slice(&body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;

    /// A PUBLISH announced at 16,000,000 bytes of which 1 KB has come: the buffer grows with
    /// what arrived, doubling, not to what was announced.
    #[test]
    fn room_for_a_partial_packet_follows_what_arrived() {
        let mut buf = BytesMut::new();
        buf.put_u8(0x30);
        let mut announced = BytesMut::new();
        write_varint(&mut announced, 16_000_000);
        buf.extend_from_slice(&announced);
        buf.extend_from_slice(&[0u8; 1024]);
        assert!(matches!(decode(&mut buf, Some(V5), 1 << 30), Ok(None)));
        assert!(buf.capacity() <= 32 * 1024, "{}", buf.capacity());
        let more = buf.capacity() - buf.len();
        buf.extend_from_slice(&vec![0u8; more]);
        let filled = buf.capacity();
        assert!(matches!(decode(&mut buf, Some(V5), 1 << 30), Ok(None)));
        assert!(
            buf.capacity() <= 4 * filled,
            "{} after {filled}",
            buf.capacity()
        );
    }

    fn roundtrip(p: Packet, level: u8) -> Packet {
        let mut out = BytesMut::new();
        p.encode(&mut out, level);
        let lvl = if matches!(p, Packet::Connect(_)) {
            None
        } else {
            Some(level)
        };
        let got = decode(&mut out, lvl, usize::MAX)
            .expect("decodes")
            .expect("whole");
        assert!(out.is_empty());
        got
    }

    #[test]
    fn publish_roundtrip_v5_with_properties() {
        let p = Publish {
            qos: QoS::AtLeastOnce,
            topic: "a/b".into(),
            packet_id: 7,
            properties: Properties {
                message_expiry_interval: Some(30),
                correlation_data: Some(Bytes::from_static(b"\x00\x01")),
                user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
                ..Default::default()
            },
            payload: Bytes::from_static(b"hello"),
            ..Default::default()
        };
        assert_eq!(
            roundtrip(Packet::Publish(p.clone()), V5),
            Packet::Publish(p)
        );
    }

    #[test]
    fn common_property_texts_decode_borrowed_and_others_owned() {
        let p = Publish {
            qos: QoS::AtLeastOnce,
            topic: "a/b".into(),
            packet_id: 7,
            properties: Properties {
                content_type: Some("application/octet-stream".into()),
                user_properties: vec![
                    ("__protVer".into(), "1.0".into()),
                    ("__ts".into(), "0000000000001:00000:n".into()),
                    ("__protVe".into(), "1.00".into()),
                ],
                ..Default::default()
            },
            ..Default::default()
        };
        let Packet::Publish(got) = roundtrip(Packet::Publish(p.clone()), V5) else {
            panic!("not a PUBLISH");
        };
        assert_eq!(got, p);
        let borrowed = |s: &PropStr| matches!(s, PropStr::Borrowed(_));
        assert!(got.properties.content_type.as_ref().is_some_and(borrowed));
        let kinds: Vec<(bool, bool)> = got
            .properties
            .user_properties
            .iter()
            .map(|(k, v)| (borrowed(k), borrowed(v)))
            .collect();
        assert_eq!(kinds, [(true, true), (true, false), (false, false)]);
    }

    #[test]
    fn a_common_property_text_is_checked_like_any_other() {
        // User property whose name's length runs past the block: truncated, not borrowed.
        let props = [0x26u8, 0, 9, b'_', b'_', b'p', b'r', b'o', b't'];
        let mut body = vec![0, 1, b't', 0, 1, props.len() as u8];
        body.extend_from_slice(&props);
        let mut b = BytesMut::from(&[0x32u8, body.len() as u8][..]);
        b.extend_from_slice(&body);
        assert_eq!(
            decode(&mut b, Some(V5), 1000),
            Err(DecodeError::Malformed("binary data truncated"))
        );
    }

    #[test]
    fn connect_roundtrip_both_levels() {
        for level in [V311, V5] {
            let c = Connect {
                protocol_level: level,
                clean_start: true,
                keep_alive: 30,
                client_id: "c1".into(),
                username: Some("u".into()),
                password: Some(Bytes::from_static(b"p")),
                will: Some(Will {
                    topic: "w".into(),
                    payload: Bytes::from_static(b"bye"),
                    qos: QoS::AtLeastOnce,
                    retain: true,
                    properties: Properties::default(),
                }),
                properties: Properties::default(),
            };
            assert_eq!(
                roundtrip(Packet::Connect(Box::new(c.clone())), level),
                Packet::Connect(Box::new(c))
            );
        }
    }

    #[test]
    fn rare_properties_roundtrip_out_of_line() {
        let mut connack = Properties {
            session_expiry_interval: Some(60),
            receive_maximum: Some(10),
            ..Default::default()
        };
        let rare = connack.rare_mut();
        rare.assigned_client_identifier = Some("auto-1".into());
        rare.authentication_method = Some("SCRAM".into());
        rare.authentication_data = Some(Bytes::from_static(b"\x00\x01"));
        rare.response_information = Some("clients/auto-1".into());
        rare.server_reference = Some("other:1883".into());
        rare.reason_string = Some("because".into());
        let mut out = BytesMut::new();
        connack.encode(&mut out);
        assert_eq!(out.len(), connack.encoded_len());
        let mut bytes = out.freeze();
        let got = Properties::decode(&mut bytes, PropContext::ConnAck).expect("decodes");
        assert_eq!(got, connack);
        assert!(bytes.is_empty());
        // A packet without any of them has none allocated, and a rare property is decoded
        // with the context rules of every other one.
        let ack = Packet::PubAck(Ack {
            packet_id: 3,
            reason_code: 0x10,
            properties: Properties {
                rare: Some(Box::new(RareProperties {
                    reason_string: Some("no subscribers".into()),
                    ..Default::default()
                })),
                ..Default::default()
            },
        });
        assert_eq!(roundtrip(ack.clone(), V5), ack);
        let plain = Packet::PubAck(Ack {
            packet_id: 3,
            ..Default::default()
        });
        let Packet::PubAck(got) = roundtrip(plain, V5) else {
            panic!("not a PUBACK");
        };
        assert!(got.properties.rare.is_none());
        // Assigned Client Identifier is a CONNACK property only.
        let mut b = BytesMut::from(&[0x40u8, 6, 0, 3, 0, 3, 0x12, 0][..]);
        assert!(decode(&mut b, Some(V5), 1000).is_err());
    }

    #[test]
    fn properties_stay_small_to_move() {
        // Every PUBLISH and acknowledgement moves its properties a few times on the way
        // through the broker.
        assert!(
            std::mem::size_of::<Properties>() <= 200,
            "{} bytes",
            std::mem::size_of::<Properties>()
        );
    }

    #[test]
    fn strings_are_checked_ascii_or_not() {
        fn read(raw: &[u8]) -> Result<String, DecodeError> {
            let mut encoded = BytesMut::new();
            encoded.put_u16(raw.len() as u16);
            encoded.put_slice(raw);
            encoded.put_u8(b'!');
            let mut buf = encoded.freeze();
            let read = read_string(&mut buf);
            if read.is_ok() {
                assert_eq!(&buf[..], b"!", "consumed exactly the string");
            }
            read
        }
        let long_ascii = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
        for ok in [
            "",
            "a",
            long_ascii,
            "caf\u{e9}",
            "\u{1f600}/topic",
            "x/\u{7ff}/\u{ffff}",
        ] {
            assert_eq!(read(ok.as_bytes()).as_deref(), Ok(ok), "{ok:?}");
        }
        let invalid = Err(DecodeError::Malformed("invalid UTF-8 string"));
        let nul = Err(DecodeError::Malformed("string contains U+0000"));
        let mut nul_late = long_ascii.as_bytes().to_vec();
        nul_late.push(0);
        let cases: [(&[u8], _); 8] = [
            (b"\xff", invalid.clone()),
            (b"abc\xc0\x80", invalid.clone()),
            (b"\x80abc", invalid.clone()),
            (b"caf\xc3", invalid.clone()),
            (b"\xed\xa0\x80", invalid.clone()),
            (b"\0", nul.clone()),
            (&nul_late, nul.clone()),
            ("caf\u{e9}\0".as_bytes(), nul.clone()),
        ];
        for (raw, want) in cases {
            assert_eq!(read(raw), want, "{raw:?}");
        }
    }

    #[test]
    fn plain_acks_are_the_packets_bytes_and_decode_back() {
        type Kind = (u8, fn(Ack) -> Packet);
        let kinds: [Kind; 4] = [
            (ack_header::PUBACK, Packet::PubAck),
            (ack_header::PUBREC, Packet::PubRec),
            (ack_header::PUBREL, Packet::PubRel),
            (ack_header::PUBCOMP, Packet::PubComp),
        ];
        for (header, packet) in kinds {
            for level in [V311, V5] {
                for packet_id in [1, 0x1234, u16::MAX] {
                    for reason_code in [0, 0x10, reason::PACKET_IDENTIFIER_NOT_FOUND] {
                        let ack = Ack {
                            packet_id,
                            reason_code,
                            ..Default::default()
                        };
                        let mut want = BytesMut::new();
                        packet(ack.clone()).encode(&mut want, level);
                        let mut got = BytesMut::new();
                        encode_plain_ack(&mut got, header, packet_id, reason_code, level);
                        assert_eq!(
                            got, want,
                            "header {header:#x} level {level} id {packet_id} reason {reason_code}"
                        );
                        let decoded = decode(&mut got, Some(level), usize::MAX)
                            .expect("decodes")
                            .expect("whole");
                        let reason_kept = if level == V5 { reason_code } else { 0 };
                        assert_eq!(
                            decoded,
                            packet(Ack {
                                reason_code: reason_kept,
                                ..ack
                            })
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn plain_acks_are_taken_as_decode_reads_them() {
        let mut packets = Vec::new();
        for level in [V311, V5] {
            for reason_code in [0, 0x10] {
                for packet_id in [1, 0x1234] {
                    let ack = || Ack {
                        packet_id,
                        reason_code,
                        ..Default::default()
                    };
                    packets.push((level, Packet::PubAck(ack())));
                    packets.push((level, Packet::PubRec(ack())));
                    packets.push((level, Packet::PubComp(ack())));
                    packets.push((level, Packet::PubRel(ack())));
                }
            }
            let with_properties = Ack {
                packet_id: 7,
                reason_code: 0x10,
                properties: Properties {
                    user_properties: vec![("k".into(), "v".into())],
                    ..Default::default()
                },
            };
            packets.push((level, Packet::PubAck(with_properties)));
            packets.push((level, Packet::PingReq));
        }
        for (level, packet) in packets {
            let mut encoded = BytesMut::new();
            packet.encode(&mut encoded, level);
            encoded.extend_from_slice(b"next");
            let mut taken = encoded.clone();
            let mut decoded = encoded.clone();
            let expected = decode(&mut decoded, Some(level), usize::MAX)
                .expect("decodes")
                .expect("whole");
            match take_plain_ack(&mut taken, level, usize::MAX) {
                Some(plain) => {
                    let ack = Ack {
                        packet_id: plain.packet_id,
                        reason_code: plain.reason_code,
                        ..Default::default()
                    };
                    let as_packet = match plain.header {
                        ack_header::PUBACK => Packet::PubAck(ack),
                        ack_header::PUBREC => Packet::PubRec(ack),
                        ack_header::PUBCOMP => Packet::PubComp(ack),
                        other => panic!("taken a packet with header {other:#x}"),
                    };
                    assert_eq!(as_packet, expected);
                    assert_eq!(taken, decoded, "the same bytes are left");
                }
                None => {
                    assert_eq!(taken, encoded, "nothing taken from {expected:?}");
                    let plain = matches!(
                        &expected,
                        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubComp(a)
                            if a.properties == Properties::default()
                    );
                    assert!(!plain, "a plain ack left behind: {expected:?}");
                }
            }
        }
        // Incomplete, invalid or too large: left for `decode` to judge.
        for (bytes, max) in [
            (&[0x40u8][..], usize::MAX),
            (&[0x40, 2, 0][..], usize::MAX),
            (&[0x40, 2, 0, 0][..], usize::MAX),
            (&[0x41, 2, 0, 1][..], usize::MAX),
            (&[0x40, 3, 0, 1][..], usize::MAX),
            (&[0x40, 2, 0, 1][..], 3),
        ] {
            let mut buf = BytesMut::from(bytes);
            assert_eq!(take_plain_ack(&mut buf, V5, max), None, "{bytes:?}");
            assert_eq!(&buf[..], bytes);
        }
        let mut v311_with_reason = BytesMut::from(&[0x40u8, 3, 0, 1, 0x10][..]);
        assert_eq!(
            take_plain_ack(&mut v311_with_reason, V311, usize::MAX),
            None
        );
    }

    #[test]
    fn partial_packet_consumes_nothing() {
        let mut out = BytesMut::new();
        Packet::PingReq.encode(&mut out, V5);
        let mut half = BytesMut::from(&out[..1]);
        assert_eq!(decode(&mut half, Some(V5), 100), Ok(None));
        assert_eq!(half.len(), 1);
    }

    #[test]
    fn violations_map_to_reason_codes() {
        // QoS 3 publish.
        let mut b = BytesMut::from(&[0x36u8, 3, 0, 1, b'a'][..]);
        assert_eq!(
            decode(&mut b, Some(V5), 1000).unwrap_err().reason_code(),
            0x81
        );
        // Too large.
        let mut b = BytesMut::from(&[0x30u8, 0x7F][..]);
        assert_eq!(
            decode(&mut b, Some(V5), 10).unwrap_err(),
            DecodeError::TooLarge
        );
        // Second CONNECT.
        let mut b = BytesMut::from(&[0x10u8, 0][..]);
        assert_eq!(
            decode(&mut b, Some(V5), 10).unwrap_err().reason_code(),
            0x82
        );
        // Bad PUBREL flags.
        let mut b = BytesMut::from(&[0x60u8, 2, 0, 1][..]);
        assert_eq!(
            decode(&mut b, Some(V5), 10).unwrap_err().reason_code(),
            0x81
        );
        // Duplicate property.
        let mut b = BytesMut::from(&[0x30u8, 8, 0, 1, b'a', 4, 1, 0, 1, 0][..]);
        assert_eq!(
            decode(&mut b, Some(V5), 100).unwrap_err().reason_code(),
            0x82
        );
        // Five-byte remaining length.
        let mut b = BytesMut::from(&[0x30u8, 0xFF, 0xFF, 0xFF, 0xFF, 0x01][..]);
        assert_eq!(
            decode(&mut b, Some(V5), usize::MAX)
                .unwrap_err()
                .reason_code(),
            0x81
        );
    }

    proptest::proptest! {
        #[test]
        fn decoder_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
                                level in proptest::option::of(proptest::sample::select(vec![V311, V5]))) {
            let mut b = BytesMut::from(&data[..]);
            while let Ok(Some(_)) = decode(&mut b, level, 1 << 20) {}
        }

        /// A string is taken or refused exactly as the general checks (UTF-8, then no U+0000)
        /// decide: texts mostly ASCII, with NULs, multi-byte characters, stray continuation
        /// bytes and other high bytes mixed in, at every alignment.
        #[test]
        fn strings_are_checked_as_utf8_is(
            lead in 0usize..9,
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => (1u8..0x80).prop_map(|b| vec![b]),
                    1 => proptest::strategy::Just(vec![0u8]),
                    1 => proptest::char::any().prop_map(|c| c.to_string().into_bytes()),
                    1 => (0x80u8..=0xFF).prop_map(|b| vec![b]),
                ],
                0..80,
            ),
        ) {
            let text = pieces.concat();
            let mut framed = vec![b'x'; lead];
            framed.extend_from_slice(&(text.len() as u16).to_be_bytes());
            framed.extend_from_slice(&text);
            framed.push(b'!');
            let mut buf = Bytes::from(framed).slice(lead..);
            let expected = match std::str::from_utf8(&text) {
                Err(_) => Err(DecodeError::Malformed("invalid UTF-8 string")),
                Ok(t) if t.contains('\0') => Err(DecodeError::Malformed("string contains U+0000")),
                Ok(t) => Ok(t.to_owned()),
            };
            let read = read_string(&mut buf);
            if read.is_ok() {
                proptest::prop_assert_eq!(&buf[..], b"!");
            }
            proptest::prop_assert_eq!(read, expected);
        }
    }
}
