//! State store requests over the lean MQTT client, and the same SET/GET over RESP2 to Redis.
//!
//! Both sides keep exactly one request in flight per connection (no pipelining), and both
//! patch pre-encoded requests in place: key digits, and for MQTT the packet identifier, the
//! correlation data and the `__ts` wall clock digits.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use mqkv_broker::codec::{Properties, Publish, QoS};
use mqkv_protocol::Command;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::mqtt::{
    peek_frame, put_digits, put_puback, scan_props, Conn, PublishRef, PublishTemplate, PUBLISH,
};

/// Keys are `bench-key-` followed by this many digits.
pub const KEY_DIGITS: usize = 7;
const KEY_PREFIX: &[u8] = b"bench-key-";
const CORR_MARKER: [u8; 16] = *b"\xC0\xC1corr-marker\xC2\xC3\xC4";

pub fn key_len() -> usize {
    KEY_PREFIX.len() + KEY_DIGITS
}

pub fn key_bytes(index: u64) -> Vec<u8> {
    let mut key = KEY_PREFIX.to_vec();
    key.resize(key_len(), b'0');
    put_digits(&mut key[KEY_PREFIX.len()..], index);
    key
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn response_topic(client_id: &str) -> String {
    format!(
        "clients/{client_id}/services/{}/response",
        mqkv_protocol::REQUEST_TOPIC
    )
}

/// A state store request packet with the places that change per request located.
pub struct StoreRequest {
    tpl: PublishTemplate,
    corr: usize,
    ts: usize,
    /// Where the key's digits are, if the request names a benchmark key.
    key: Option<usize>,
}

impl StoreRequest {
    pub fn new(client_id: &str, node_id: &str, command: &Command) -> Result<StoreRequest> {
        let publish = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: false,
            topic: mqkv_protocol::REQUEST_TOPIC.to_owned(),
            packet_id: 1,
            properties: Properties {
                message_expiry_interval: Some(10),
                content_type: Some("application/octet-stream".into()),
                response_topic: Some(response_topic(client_id)),
                correlation_data: Some(Bytes::copy_from_slice(&CORR_MARKER)),
                user_properties: vec![
                    ("__srcId".into(), client_id.to_owned().into()),
                    (
                        "__ts".into(),
                        format!("{:015}:{:05}:{node_id}", 0, 0).into(),
                    ),
                    ("__protVer".into(), "1.0".into()),
                ],
                ..Properties::default()
            },
            payload: command.encode(),
        };
        let tpl = PublishTemplate::new(&publish);
        let corr = tpl
            .find(&CORR_MARKER)
            .context("correlation data not found")?;
        // User property: name length, name, value length, value.
        let ts = tpl.find(b"__ts").context("__ts not found")? + 4 + 2;
        let mut needle = b"\r\n".to_vec();
        needle.extend_from_slice(KEY_PREFIX);
        // A pattern that is not a benchmark key (a pattern watch's) is sent as it is.
        let key = tpl.find(&needle).map(|at| at + 2 + KEY_PREFIX.len());
        Ok(StoreRequest { tpl, corr, ts, key })
    }

    /// Sets the packet identifier, correlation data, `__ts` and key index.
    pub fn prepare(&mut self, packet_id: u16, tag: u64, seq: u64, key_index: u64) -> &[u8] {
        self.tpl.set_packet_id(packet_id);
        let b = &mut self.tpl.bytes;
        b[self.corr..self.corr + 8].copy_from_slice(&tag.to_be_bytes());
        b[self.corr + 8..self.corr + 16].copy_from_slice(&seq.to_be_bytes());
        put_digits(&mut b[self.ts..self.ts + 15], now_ms());
        if let Some(key) = self.key {
            put_digits(&mut b[key..key + KEY_DIGITS], key_index);
        }
        &self.tpl.bytes
    }

    /// Writes `n` as the last 16 bytes of the value (the payload ends with the value and
    /// CRLF). The value must be at least 16 bytes long.
    pub fn patch_value_tail(&mut self, n: u64) {
        let len = self.tpl.bytes.len();
        if len >= 18 {
            put_digits(&mut self.tpl.bytes[len - 18..len - 2], n);
        }
    }

    pub fn correlation(&self) -> &[u8] {
        &self.tpl.bytes[self.corr..self.corr + 16]
    }
}

/// What a state store response looked like.
pub struct StoreAnswer {
    pub payload: Bytes,
    pub status_ok: bool,
}

/// A state store client: one MQTT connection subscribed to its response topic.
pub struct StoreClient {
    pub conn: Conn,
    pub client_id: String,
    tag: u64,
    seq: u64,
    set: Option<StoreRequest>,
    get: Option<StoreRequest>,
}

impl StoreClient {
    pub async fn connect(
        addr: SocketAddr,
        client_id: String,
        tag: u64,
        value_size: usize,
    ) -> Result<StoreClient> {
        let mut conn = Conn::connect(addr, &client_id).await?;
        conn.subscribe(&response_topic(&client_id), QoS::AtLeastOnce)
            .await?;
        let node_id = format!("00000000-0000-4000-8000-{tag:012x}");
        let key = Bytes::from(key_bytes(0));
        let set = StoreRequest::new(
            &client_id,
            &node_id,
            &Command::Set {
                key: key.clone(),
                value: Bytes::from(vec![b'v'; value_size]),
                condition: None,
                px_ms: None,
            },
        )?;
        let get = StoreRequest::new(&client_id, &node_id, &Command::Get { key })?;
        Ok(StoreClient {
            conn,
            client_id,
            tag,
            seq: 0,
            set: Some(set),
            get: Some(get),
        })
    }

    pub async fn set(&mut self, key_index: u64) -> Result<bool> {
        self.call(true, key_index, |ok, payload| ok && payload == b"+OK\r\n")
            .await
    }

    /// SET whose value ends in the 16 decimal digits of `n`.
    pub async fn set_with_value_digits(&mut self, key_index: u64, n: u64) -> Result<bool> {
        if let Some(req) = self.set.as_mut() {
            req.patch_value_tail(n);
        }
        self.set(key_index).await
    }

    /// True when the GET found a value.
    pub async fn get(&mut self, key_index: u64) -> Result<bool> {
        self.call(false, key_index, |ok, payload| {
            ok && payload.first() == Some(&b'$') && payload != b"$-1\r\n"
        })
        .await
    }

    /// Sends a request and waits for the response with its correlation data; `judge` sees
    /// whether its `__stat` was 200, and its payload.
    async fn call(
        &mut self,
        is_set: bool,
        key_index: u64,
        judge: impl FnOnce(bool, &[u8]) -> bool,
    ) -> Result<bool> {
        self.seq += 1;
        let pid = self.conn.ids.next();
        let slot = if is_set { &mut self.set } else { &mut self.get };
        let Some(mut req) = slot.take() else {
            bail!("request template in use");
        };
        let sent = self
            .conn
            .send(req.prepare(pid, self.tag, self.seq, key_index))
            .await;
        let answer = match sent {
            Ok(()) => self.await_response(req.correlation(), judge).await,
            Err(e) => Err(e),
        };
        if is_set {
            self.set = Some(req);
        } else {
            self.get = Some(req);
        }
        answer
    }

    /// Appends a SET of `key_index` to `out` without sending it, for a client with many
    /// requests in flight. Returns its sequence number, the second half of its correlation
    /// data.
    pub fn queue_set(&mut self, key_index: u64, out: &mut BytesMut) -> Result<u64> {
        self.seq += 1;
        let pid = self.conn.ids.next();
        let Some(req) = self.set.as_mut() else {
            bail!("request template in use");
        };
        out.extend_from_slice(req.prepare(pid, self.tag, self.seq, key_index));
        Ok(self.seq)
    }

    /// Reads until at least one response is buffered, then takes every buffered response:
    /// `(sequence number, answered +OK with status 200)` each, in the order they came. Their
    /// acknowledgements go out with the next write.
    pub async fn take_set_answers(&mut self, out: &mut Vec<(u64, bool)>) -> Result<()> {
        let start = out.len();
        loop {
            while self.take_packet(|status_ok, correlation, payload| {
                let seq = correlation
                    .and_then(|c| c.get(8..16))
                    .and_then(|c| <[u8; 8]>::try_from(c).ok())
                    .map_or(0, u64::from_be_bytes);
                out.push((seq, status_ok && payload == b"+OK\r\n"));
            })? {}
            if out.len() > start {
                return Ok(());
            }
            self.conn.fill().await?;
        }
    }

    /// Takes the packet at the front of the read buffer, if a whole one is there, and says
    /// whether there was one. A PUBLISH is shown to `seen` (status 200 or not, correlation
    /// data, payload) where it lies, and acknowledged with the next write.
    fn take_packet(&mut self, seen: impl FnOnce(bool, Option<&[u8]>, &[u8])) -> Result<bool> {
        let Some((header, body)) = peek_frame(&self.conn.rbuf)? else {
            return Ok(false);
        };
        match header >> 4 {
            PUBLISH => {
                let publish = PublishRef::parse(header, &self.conn.rbuf[body.clone()])?;
                if publish.qos > 0 {
                    put_puback(&mut self.conn.wbuf, publish.packet_id);
                }
                let props = scan_props(publish.properties)?;
                seen(props.status_ok, props.correlation, publish.payload);
            }
            crate::mqtt::DISCONNECT => bail!("server disconnected"),
            _ => {}
        }
        self.conn.rbuf.advance(body.end);
        Ok(true)
    }

    /// Sends what [`StoreClient::queue_set`] queued, with the pending acknowledgements, in one
    /// write.
    pub async fn send_queued(&mut self, requests: &[u8]) -> Result<()> {
        self.conn.send(requests).await
    }

    /// Sends another command once (KEYNOTIFY and the like). Its key must be
    /// `key_bytes(key_index)`.
    pub async fn call_command(&mut self, command: &Command, key_index: u64) -> Result<StoreAnswer> {
        self.seq += 1;
        let node_id = format!("00000000-0000-4000-8000-{:012x}", self.tag);
        let mut req = StoreRequest::new(&self.client_id, &node_id, command)?;
        let pid = self.conn.ids.next();
        self.conn
            .send(req.prepare(pid, self.tag, self.seq, key_index))
            .await?;
        self.await_response(req.correlation(), |status_ok, payload| StoreAnswer {
            payload: Bytes::copy_from_slice(payload),
            status_ok,
        })
        .await
    }

    /// Reads until the response with `correlation` arrives and returns what `judge` makes of
    /// it. Responses are read where they lie in the read buffer, as the Redis client reads its
    /// replies: nothing is copied or reference counted.
    async fn await_response<T>(
        &mut self,
        correlation: &[u8],
        judge: impl FnOnce(bool, &[u8]) -> T,
    ) -> Result<T> {
        let mut judge = Some(judge);
        loop {
            let mut verdict = None;
            let took = self.take_packet(|status_ok, got, payload| {
                if got == Some(correlation) {
                    if let Some(judge) = judge.take() {
                        verdict = Some(judge(status_ok, payload));
                    }
                }
            })?;
            if let Some(v) = verdict {
                return Ok(v);
            }
            if !took {
                self.conn.fill().await?;
            }
        }
    }
}

/// One Redis connection speaking RESP2, one request at a time.
pub struct RedisClient {
    stream: TcpStream,
    rbuf: BytesMut,
    set: Vec<u8>,
    set_key: usize,
    get: Vec<u8>,
    get_key: usize,
}

fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Redis reply kinds a benchmark cares about.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple,
    Error,
    Integer,
    Bulk,
    Nil,
}

impl RedisClient {
    pub async fn connect(addr: SocketAddr, value_size: usize) -> Result<RedisClient> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let key = key_bytes(0);
        let value = vec![b'v'; value_size];
        let set = resp_command(&[b"SET", &key, &value]);
        let get = resp_command(&[b"GET", &key]);
        let find = |packet: &[u8]| {
            packet
                .windows(KEY_PREFIX.len())
                .position(|w| w == KEY_PREFIX)
                .map(|p| p + KEY_PREFIX.len())
        };
        let set_key = find(&set).context("key not in SET")?;
        let get_key = find(&get).context("key not in GET")?;
        Ok(RedisClient {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            set,
            set_key,
            get,
            get_key,
        })
    }

    pub async fn set(&mut self, key_index: u64) -> Result<bool> {
        put_digits(
            &mut self.set[self.set_key..self.set_key + KEY_DIGITS],
            key_index,
        );
        self.stream.write_all(&self.set).await?;
        Ok(self.reply().await? == Reply::Simple)
    }

    pub async fn get(&mut self, key_index: u64) -> Result<bool> {
        put_digits(
            &mut self.get[self.get_key..self.get_key + KEY_DIGITS],
            key_index,
        );
        self.stream.write_all(&self.get).await?;
        Ok(self.reply().await? == Reply::Bulk)
    }

    /// Appends a SET of `key_index` to `out` without sending it (pipelining).
    pub fn queue_set(&mut self, key_index: u64, out: &mut BytesMut) {
        put_digits(
            &mut self.set[self.set_key..self.set_key + KEY_DIGITS],
            key_index,
        );
        out.extend_from_slice(&self.set);
    }

    /// Reads until at least one reply is buffered, then takes every buffered reply: whether
    /// each was `+OK`, in order.
    pub async fn take_set_replies(&mut self, out: &mut Vec<bool>) -> Result<()> {
        let start = out.len();
        loop {
            while let Some((reply, used)) = parse_reply(&self.rbuf)? {
                let _ = self.rbuf.split_to(used);
                out.push(reply == Reply::Simple);
            }
            if out.len() > start {
                return Ok(());
            }
            self.fill().await?;
        }
    }

    /// Sends requests queued with [`RedisClient::queue_set`] in one write.
    pub async fn send_queued(&mut self, requests: &[u8]) -> Result<()> {
        Ok(self.stream.write_all(requests).await?)
    }

    /// Reads more of the replies into the buffer.
    async fn fill(&mut self) -> Result<()> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(64 * 1024);
        }
        if self.stream.read_buf(&mut self.rbuf).await? == 0 {
            bail!("connection closed by redis");
        }
        Ok(())
    }

    async fn reply(&mut self) -> Result<Reply> {
        loop {
            if let Some((reply, used)) = parse_reply(&self.rbuf)? {
                let _ = self.rbuf.split_to(used);
                return Ok(reply);
            }
            self.fill().await?;
        }
    }
}

/// Parses one RESP2 reply (not arrays) at the front of `buf`: the kind and its length.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>> {
    let Some((&first, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let Some(line_len) = rest.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &rest[..line_len];
    let after_line = 1 + line_len + 2;
    Ok(Some(match first {
        b'+' => (Reply::Simple, after_line),
        b'-' => (Reply::Error, after_line),
        b':' => (Reply::Integer, after_line),
        b'$' => {
            if line == b"-1" {
                (Reply::Nil, after_line)
            } else {
                let len: usize = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .context("bad bulk length from redis")?;
                let total = after_line
                    .checked_add(len)
                    .and_then(|t| t.checked_add(2))
                    .context("bulk length out of range")?;
                if buf.len() < total {
                    return Ok(None);
                }
                (Reply::Bulk, total)
            }
        }
        other => bail!("unexpected redis reply type {:?}", other as char),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_request_patches_in_place() {
        let cmd = Command::Set {
            key: Bytes::from(key_bytes(0)),
            value: Bytes::from_static(b"value"),
            condition: None,
            px_ms: None,
        };
        let mut req = StoreRequest::new("c1", "node", &cmd).expect("template");
        let bytes = req.prepare(7, 1, 2, 1234).to_vec();
        let (header, body) = peek_frame(&bytes).expect("valid").expect("whole");
        assert_eq!(body.end, bytes.len());
        let publish = PublishRef::parse(header, &bytes[body]).expect("publish");
        assert_eq!(publish.packet_id, 7);
        let parsed = mqkv_protocol::parse_request(publish.payload).expect("request");
        assert_eq!(parsed.key().as_ref(), &key_bytes(1234)[..]);
        let props = scan_props(publish.properties).expect("props");
        let mut corr = 1u64.to_be_bytes().to_vec();
        corr.extend_from_slice(&2u64.to_be_bytes());
        assert_eq!(props.correlation, Some(&corr[..]));
    }

    #[test]
    fn redis_replies_parse() {
        assert_eq!(
            parse_reply(b"+OK\r\n").expect("ok"),
            Some((Reply::Simple, 5))
        );
        assert_eq!(
            parse_reply(b"$3\r\nabc\r\n").expect("ok"),
            Some((Reply::Bulk, 9))
        );
        assert_eq!(parse_reply(b"$3\r\nab").expect("ok"), None);
        assert_eq!(parse_reply(b"$-1\r\n").expect("ok"), Some((Reply::Nil, 5)));
        assert!(parse_reply(b"\r\n\r\n").is_err());
    }
}
