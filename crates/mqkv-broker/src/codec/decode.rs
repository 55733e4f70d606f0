//! Decoding: a whole buffered packet framed, validated and turned into a [`Packet`], every
//! violation mapped to the reason code the specification names for it.

use bytes::{Buf, Bytes, BytesMut};

use super::{
    ack_header, read_binary, read_string, read_u16, Ack, Auth, Connect, DecodeError, Disconnect,
    Packet, PropContext, Properties, Publish, QoS, Subscribe, SubscriptionOptions, Unsubscribe,
    Will, V311, V5,
};

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
