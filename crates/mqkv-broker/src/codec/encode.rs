//! Encoding: packets onto the wire, and a PUBLISH written for each of its receivers.

use bytes::{BufMut, BytesMut};

use super::{
    limits, reason, varint_len, write_bin, write_varint, Ack, Connect, Packet, PerReceiver,
    Properties, Publish, QoS, V5,
};

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
    pub(super) fn properties_body(&self, level: u8) -> Option<usize> {
        (level == V5).then(|| self.properties.body_len_with(&self.per_receiver))
    }

    pub(super) fn remaining(&self, properties_body: Option<usize>) -> usize {
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
