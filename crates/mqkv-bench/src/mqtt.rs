//! A lean MQTT 5 client for load generation.
//!
//! Packets going out are encoded once with `mqkv_broker::codec` and then patched in place
//! (packet identifier, correlation data, timestamps, key digits), so the hot path is a copy and a
//! `write_all`. Packets coming in are framed and read here without allocating: a PUBLISH is
//! only split into byte ranges, and properties are scanned for the two a benchmark needs
//! (correlation data and the `__stat` user property).

use std::net::SocketAddr;
use std::time::Duration;

use crate::wire::{Dial, Link};
use anyhow::{anyhow, bail, Result};
use bytes::{Buf, Bytes, BytesMut};
use mqkv_broker::codec::{
    Connect, Packet, Properties, Publish, QoS, Subscribe, SubscriptionOptions, V5,
};

/// Fixed header type nibbles of the packets a client receives.
pub const CONNACK: u8 = 2;
pub const PUBLISH: u8 = 3;
pub const PUBACK: u8 = 4;
pub const SUBACK: u8 = 9;
pub const DISCONNECT: u8 = 14;

const READ_CHUNK: usize = 64 * 1024;

/// One frame read from the socket: the fixed header byte and the body after the remaining
/// length.
pub struct Frame {
    pub header: u8,
    pub body: Bytes,
}

impl Frame {
    pub fn kind(&self) -> u8 {
        self.header >> 4
    }
}

/// The parts of a received PUBLISH a benchmark looks at.
pub struct PublishView {
    pub qos: u8,
    pub packet_id: u16,
    pub topic: Bytes,
    pub payload: Bytes,
}

impl PublishView {
    pub fn parse(frame: Frame) -> Result<PublishView> {
        let body = &frame.body;
        let r = PublishRef::parse(frame.header, body)?;
        Ok(PublishView {
            qos: r.qos,
            packet_id: r.packet_id,
            topic: body.slice_ref(r.topic),
            payload: body.slice_ref(r.payload),
        })
    }
}

/// A received PUBLISH read in place, in the read buffer.
pub struct PublishRef<'a> {
    pub qos: u8,
    pub packet_id: u16,
    pub topic: &'a [u8],
    pub properties: &'a [u8],
    pub payload: &'a [u8],
}

/// What a property scan found, in place.
pub struct ScannedRef<'a> {
    pub correlation: Option<&'a [u8]>,
    pub status_ok: bool,
}

/// Takes `n` bytes off the front of `buf`.
fn take_ref<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if buf.len() < n {
        bail!("truncated packet");
    }
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    Ok(head)
}

fn take_u16_ref(buf: &mut &[u8]) -> Result<u16> {
    let b = take_ref(buf, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]))
}

fn take_bin_ref<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8]> {
    let n = take_u16_ref(buf)? as usize;
    take_ref(buf, n)
}

fn read_varint_ref(buf: &mut &[u8]) -> Result<usize> {
    let mut value = 0usize;
    for i in 0..4 {
        let b = take_ref(buf, 1)?[0];
        value |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("variable byte integer longer than 4 bytes")
}

impl<'a> PublishRef<'a> {
    /// Splits a PUBLISH body (after the fixed header) whose first byte was `header`.
    pub fn parse(header: u8, body: &'a [u8]) -> Result<PublishRef<'a>> {
        let qos = (header >> 1) & 0x03;
        let mut body = body;
        let topic = take_bin_ref(&mut body)?;
        let packet_id = if qos > 0 { take_u16_ref(&mut body)? } else { 0 };
        let props_len = read_varint_ref(&mut body)?;
        let properties = take_ref(&mut body, props_len)?;
        Ok(PublishRef {
            qos,
            packet_id,
            topic,
            properties,
            payload: body,
        })
    }
}

/// Scans a PUBLISH property block for correlation data and `__stat=200`.
pub fn scan_props(properties: &[u8]) -> Result<ScannedRef<'_>> {
    let mut p = properties;
    let mut out = ScannedRef {
        correlation: None,
        status_ok: false,
    };
    while !p.is_empty() {
        let id = take_ref(&mut p, 1)?[0];
        match id {
            0x01 => {
                take_ref(&mut p, 1)?;
            }
            0x02 => {
                take_ref(&mut p, 4)?;
            }
            0x23 => {
                take_ref(&mut p, 2)?;
            }
            0x03 | 0x08 => {
                take_bin_ref(&mut p)?;
            }
            0x09 => out.correlation = Some(take_bin_ref(&mut p)?),
            0x0B => {
                read_varint_ref(&mut p)?;
            }
            0x26 => {
                let name = take_bin_ref(&mut p)?;
                let value = take_bin_ref(&mut p)?;
                if name == b"__stat" && value == b"200" {
                    out.status_ok = true;
                }
            }
            other => bail!("unexpected PUBLISH property 0x{other:02x}"),
        }
    }
    Ok(out)
}

/// Appends a PUBACK for `packet_id` (success, no properties: four bytes).
pub fn put_puback(out: &mut BytesMut, packet_id: u16) {
    out.extend_from_slice(&[0x40, 2]);
    out.extend_from_slice(&packet_id.to_be_bytes());
}

/// A packet encoded once, with the packet identifier position known so it can be patched.
#[derive(Clone)]
pub struct PublishTemplate {
    pub bytes: Vec<u8>,
    pid_offset: Option<usize>,
}

impl PublishTemplate {
    pub fn new(publish: &Publish) -> PublishTemplate {
        let mut out = BytesMut::new();
        Packet::Publish(publish.clone()).encode(&mut out, V5);
        let pid_offset = if publish.qos == QoS::AtMostOnce {
            None
        } else {
            // Fixed header byte, remaining length, topic length and topic.
            let mut remaining_len_bytes = 1;
            while out[remaining_len_bytes] & 0x80 != 0 {
                remaining_len_bytes += 1;
            }
            Some(1 + remaining_len_bytes + 2 + publish.topic.len())
        };
        PublishTemplate {
            bytes: out.to_vec(),
            pid_offset,
        }
    }

    pub fn set_packet_id(&mut self, id: u16) {
        if let Some(off) = self.pid_offset {
            self.bytes[off..off + 2].copy_from_slice(&id.to_be_bytes());
        }
    }

    /// Offset of the first occurrence of `marker` in the encoded packet.
    pub fn find(&self, marker: &[u8]) -> Option<usize> {
        self.bytes.windows(marker.len()).position(|w| w == marker)
    }
}

/// Writes `value` as exactly `out.len()` decimal digits (wrapping on overflow).
pub fn put_digits(out: &mut [u8], mut value: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Packet identifiers 1..=65535, in turn.
pub struct PacketIds(u16);

impl PacketIds {
    pub fn new() -> PacketIds {
        PacketIds(0)
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u16 {
        self.0 = self.0.wrapping_add(1);
        if self.0 == 0 {
            self.0 = 1;
        }
        self.0
    }
}

/// One MQTT 5 connection.
pub struct Conn {
    pub stream: Link,
    pub rbuf: BytesMut,
    /// Acknowledgements waiting to go out with the next write.
    pub wbuf: BytesMut,
    pub ids: PacketIds,
}

impl Conn {
    /// TCP connect, CONNECT (clean start, no keep alive, receive maximum 65535), CONNACK.
    pub async fn connect(addr: SocketAddr, client_id: &str) -> Result<Conn> {
        Conn::dial(&Dial::Tcp, addr, client_id).await
    }

    /// As [`Conn::connect`], over the connection kind `dial` says.
    pub async fn dial(dial: &Dial, addr: SocketAddr, client_id: &str) -> Result<Conn> {
        let stream = dial.connect(addr).await?;
        let mut conn = Conn {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(256),
            ids: PacketIds::new(),
        };
        conn.handshake(client_id).await?;
        Ok(conn)
    }

    pub async fn handshake(&mut self, client_id: &str) -> Result<()> {
        let mut out = BytesMut::new();
        connect_packet(client_id).encode(&mut out, V5);
        self.stream.write_all(&out).await?;
        let frame = self.read_frame().await?;
        check_connack(&frame)
    }

    pub async fn subscribe(&mut self, filter: &str, qos: QoS) -> Result<()> {
        let id = self.ids.next();
        let mut out = BytesMut::new();
        Packet::Subscribe(Subscribe {
            packet_id: id,
            properties: Properties::default(),
            filters: vec![(
                filter.to_owned(),
                SubscriptionOptions {
                    qos,
                    ..SubscriptionOptions::default()
                },
            )],
        })
        .encode(&mut out, V5);
        self.stream.write_all(&out).await?;
        loop {
            let frame = self.read_frame().await?;
            match frame.kind() {
                SUBACK => return check_suback(frame),
                DISCONNECT => bail!("server disconnected while subscribing"),
                _ => {}
            }
        }
    }

    /// Reads until one whole frame is buffered and returns it.
    pub async fn read_frame(&mut self) -> Result<Frame> {
        loop {
            if let Some(frame) = split_frame(&mut self.rbuf)? {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    /// Returns a buffered frame, if a whole one is there, without reading.
    pub fn try_frame(&mut self) -> Result<Option<Frame>> {
        split_frame(&mut self.rbuf)
    }

    /// Returns the next buffered PUBLISH, if a whole one is there, without reading; other
    /// packets before it are skipped. A QoS 1 or 2 PUBLISH is acknowledged with the next
    /// write (`send` or `flush_acks`).
    pub fn try_publish(&mut self) -> Result<Option<PublishView>> {
        while let Some(frame) = self.try_frame()? {
            if frame.kind() != PUBLISH {
                continue;
            }
            let view = PublishView::parse(frame)?;
            if view.qos > 0 {
                put_puback(&mut self.wbuf, view.packet_id);
            }
            return Ok(Some(view));
        }
        Ok(None)
    }

    pub async fn fill(&mut self) -> Result<()> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(READ_CHUNK);
        }
        let n = self.stream.read_buf(&mut self.rbuf).await?;
        if n == 0 {
            bail!("connection closed by the server");
        }
        Ok(())
    }

    /// Writes pending acknowledgements followed by `packet`, in one write.
    pub async fn send(&mut self, packet: &[u8]) -> Result<()> {
        if self.wbuf.is_empty() {
            self.stream.write_all(packet).await?;
        } else {
            self.wbuf.extend_from_slice(packet);
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    pub async fn flush_acks(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }
}

/// Keep alive of every benchmark connection: the default of common MQTT clients (rumqttc, paho,
/// the mosquitto tools), so the servers do their keep alive bookkeeping as in production.
const KEEP_ALIVE_SECS: u16 = 60;

pub fn connect_packet(client_id: &str) -> Packet {
    Packet::Connect(Box::new(Connect {
        properties: Properties {
            receive_maximum: Some(u16::MAX),
            ..Properties::default()
        },
        ..Connect::v5(client_id, KEEP_ALIVE_SECS)
    }))
}

pub fn check_connack(frame: &Frame) -> Result<()> {
    if frame.kind() != CONNACK {
        bail!("expected CONNACK, got packet type {}", frame.kind());
    }
    match frame.body.get(1) {
        Some(0) => Ok(()),
        Some(code) => bail!("connection refused with reason 0x{code:02x}"),
        None => bail!("truncated CONNACK"),
    }
}

fn check_suback(frame: Frame) -> Result<()> {
    let mut body = &frame.body[..];
    take_u16_ref(&mut body)?;
    let n = read_varint_ref(&mut body)?;
    take_ref(&mut body, n)?;
    match body.first() {
        Some(code) if *code < 0x80 => Ok(()),
        Some(code) => bail!("subscription refused with reason 0x{code:02x}"),
        None => bail!("SUBACK without reason codes"),
    }
}

/// The fixed header at the front of `buf`, once all of it has arrived: its length and the
/// remaining length it announces.
fn fixed_header(buf: &[u8]) -> Result<Option<(usize, usize)>> {
    let mut remaining = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        remaining |= usize::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((2 + i, remaining)));
        }
    }
    Err(anyhow!("remaining length longer than 4 bytes"))
}

/// The frame at the front of `buf`, if a whole one is buffered: its fixed header byte and the
/// range of its body.
pub fn peek_frame(buf: &[u8]) -> Result<Option<(u8, std::ops::Range<usize>)>> {
    let Some((header_len, remaining)) = fixed_header(buf)? else {
        return Ok(None);
    };
    let end = header_len + remaining;
    Ok((buf.len() >= end).then(|| (buf[0], header_len..end)))
}

/// Splits one whole frame off the front of `buf`, if one is buffered; otherwise makes room for
/// the rest of a frame whose fixed header has arrived.
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<Frame>> {
    let Some((header_len, remaining)) = fixed_header(buf)? else {
        return Ok(None);
    };
    if buf.len() < header_len + remaining {
        buf.reserve(header_len + remaining - buf.len());
        return Ok(None);
    }
    let header = buf[0];
    buf.advance(header_len);
    let body = buf.split_to(remaining).freeze();
    Ok(Some(Frame { header, body }))
}

/// Runs `fut` with a time limit, as an error when it is exceeded.
pub async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => bail!("timed out after {limit:?} waiting for {what}"),
    }
}

/// A QoS 1/0 PUBLISH with no properties.
pub fn plain_publish(topic: &str, qos: QoS, payload: Bytes) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_owned(),
        packet_id: if qos == QoS::AtMostOnce { 0 } else { 1 },
        properties: Properties::default(),
        payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_and_publish_views_parse() {
        let mut publish = plain_publish("a/b", QoS::AtLeastOnce, Bytes::from_static(b"hi"));
        publish.properties.correlation_data = Some(Bytes::from_static(b"0123456789abcdef"));
        publish.properties.user_properties = vec![("__stat".into(), "200".into())];
        let mut template = PublishTemplate::new(&publish);
        template.set_packet_id(0x1234);
        let mut buf = BytesMut::from(&template.bytes[..]);
        buf.extend_from_slice(&[0x40, 2, 0x12, 0x34]);
        let (header, body) = peek_frame(&buf).expect("valid").expect("whole");
        let r = PublishRef::parse(header, &buf[body]).expect("parses in place");
        assert_eq!(r.packet_id, 0x1234);
        assert_eq!(r.payload, b"hi");
        let props = scan_props(r.properties).expect("scans");
        assert!(props.status_ok);
        assert_eq!(props.correlation, Some(&b"0123456789abcdef"[..]));
        let frame = split_frame(&mut buf).expect("valid").expect("whole");
        assert_eq!(frame.kind(), PUBLISH);
        let view = PublishView::parse(frame).expect("parses");
        assert_eq!(view.packet_id, 0x1234);
        assert_eq!(&view.topic[..], b"a/b");
        assert_eq!(&view.payload[..], b"hi");
        let ack = split_frame(&mut buf).expect("valid").expect("whole");
        assert_eq!(ack.kind(), PUBACK);
        assert!(split_frame(&mut buf).expect("valid").is_none());
    }

    #[test]
    fn a_frame_is_whole_only_when_all_of_it_arrived() {
        let publish = plain_publish("t", QoS::AtLeastOnce, Bytes::from_static(b"payload"));
        let bytes = PublishTemplate::new(&publish).bytes;
        for cut in 0..bytes.len() {
            assert!(
                peek_frame(&bytes[..cut]).expect("valid").is_none(),
                "cut {cut}"
            );
        }
        let (_, body) = peek_frame(&bytes).expect("valid").expect("whole");
        assert_eq!(body.end, bytes.len());
        assert!(peek_frame(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF]).is_err());
    }

    #[test]
    fn digits_are_fixed_width() {
        let mut d = [0u8; 5];
        put_digits(&mut d, 42);
        assert_eq!(&d, b"00042");
    }
}
