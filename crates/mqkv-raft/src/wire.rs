//! The node-to-node link: a TCP connection that proves both ends hold the
//! cluster secret, then carries frames that each carry a tag only a holder
//! of the secret can make.
//!
//! Handshake (both ends send a fresh random nonce; `H` is HMAC-SHA-256
//! keyed with the cluster secret):
//!
//! ```text
//! client → server   MAGIC, client node id, client nonce
//! server → client   MAGIC, server node id, server nonce, H("server" ‖ ids ‖ nonces)
//! client → server   H("client" ‖ ids ‖ nonces)
//! server → client   ACCEPTED
//! ```
//!
//! A side that sees a wrong tag closes the connection without sending
//! anything more; the server therefore never answers a request from a
//! client that does not hold the secret, and the client never sends one to
//! a server that does not. Both derive a session key
//! `H("session" ‖ ids ‖ nonces)`; every frame afterwards is
//! `length (u32 BE) ‖ payload ‖ tag`, where the tag is the first 16 bytes of
//! HMAC-SHA-256 under the session key of the direction, the frame's
//! sequence number and the payload. A frame that is injected, altered,
//! replayed, dropped or reordered fails its tag and ends the connection.
//! Payloads are not encrypted by this; with TLS settings (see `link_tls`)
//! the handshake and the frames travel inside mutual TLS.
//!
//! Invariant: nothing read from a peer is handed on before its tag has been
//! checked, and no frame longer than [`MAX_FRAME`] is read into memory.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use crate::link_tls::{LinkTls, ReadPart, Stream, WritePart};
use crate::types::NodeId;

type HmacSha256 = Hmac<Sha256>;

/// Opens every handshake; also tells a stray client (an MQTT client on the
/// wrong port) that it is talking to something else.
const MAGIC: &[u8; 8] = b"MQKVCL01";
const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 16;
const ACCEPTED: u8 = 1;
/// Largest frame read. Log entries are batches of at most a few MiB and
/// replication sends a bounded number of them at once (see `node`).
pub(crate) const MAX_FRAME: usize = 512 << 20;
/// How long either side waits for the other's part of the handshake.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which way a frame goes; part of its tag, so a frame cannot be reflected
/// back to its sender.
#[derive(Clone, Copy)]
enum Direction {
    ToServer = 0,
    ToClient = 1,
}

/// Why a link could not be set up or ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the peer is not an mqkv cluster node")]
    NotANode,
    #[error("the peer does not hold the cluster secret")]
    BadSecret,
    #[error("a frame failed its authentication tag")]
    BadTag,
    #[error("a frame of {0} bytes is over the limit")]
    TooLong(usize),
    #[error("the handshake timed out")]
    Timeout,
    #[error("{0}")]
    Tls(String),
    #[error("the other node uses TLS between the nodes and this one has no TLS settings for them")]
    PeerUsesTls,
}

/// The first byte of a TLS record: a handshake (0x16) or an alert (0x15). A node without TLS
/// settings sees one where the other's hello or reply should start.
fn is_tls_record(first: u8) -> bool {
    first == 0x15 || first == 0x16
}

/// Writes `bytes` and sends them at once (through TLS, too).
async fn send(write: &mut WritePart, bytes: &[u8]) -> io::Result<()> {
    write.write_all(bytes).await?;
    write.flush().await
}

/// What a node proves itself with on its links: the cluster secret, and the TLS settings
/// when links are encrypted.
#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    pub(crate) secret: Arc<[u8]>,
    pub(crate) tls: Option<Arc<dyn LinkTls>>,
}

/// What both sides agreed on.
struct Session {
    key: Vec<u8>,
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; the error case cannot happen.
    <HmacSha256 as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

/// `H(label ‖ client id ‖ server id ‖ client nonce ‖ server nonce)`.
fn handshake_tag(
    secret: &[u8],
    label: &[u8],
    ids: (NodeId, NodeId),
    nonces: (&[u8], &[u8]),
) -> [u8; 32] {
    let mut m = mac(secret);
    m.update(label);
    m.update(&ids.0.to_be_bytes());
    m.update(&ids.1.to_be_bytes());
    m.update(nonces.0);
    m.update(nonces.1);
    m.finalize().into_bytes().into()
}

fn verify(expected: &[u8; 32], got: &[u8]) -> bool {
    // Constant time: a forger learns nothing from how fast it was refused.
    expected.len() == got.len()
        && expected
            .iter()
            .zip(got)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn nonce() -> [u8; NONCE_LEN] {
    rand::random()
}

/// The client side of a new link to the node at `addr`; returns the server's node id with
/// it.
pub(crate) async fn connect(
    tcp: TcpStream,
    credentials: &Credentials,
    me: NodeId,
    addr: &str,
) -> Result<(FrameReader, FrameWriter, NodeId), LinkError> {
    let _ = tcp.set_nodelay(true);
    let handshake = async {
        let stream = match &credentials.tls {
            Some(tls) => Stream::connect(tcp, &**tls, addr)
                .await
                .map_err(LinkError::Tls)?,
            None => Stream::Plain(tcp),
        };
        client_handshake(stream, &credentials.secret, me).await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| LinkError::Timeout)?
}

async fn client_handshake(
    stream: Stream,
    secret: &[u8],
    me: NodeId,
) -> Result<(FrameReader, FrameWriter, NodeId), LinkError> {
    let (mut read, mut write) = stream.split();
    let mine = nonce();
    let mut hello = Vec::with_capacity(MAGIC.len() + 8 + NONCE_LEN);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&me.to_be_bytes());
    hello.extend_from_slice(&mine);
    send(&mut write, &hello).await?;
    let mut reply = [0u8; 8 + 8 + NONCE_LEN + 32];
    read.read_exact(&mut reply[..1]).await?;
    if is_tls_record(reply[0]) {
        return Err(LinkError::PeerUsesTls);
    }
    read.read_exact(&mut reply[1..]).await?;
    if &reply[..8] != MAGIC {
        return Err(LinkError::NotANode);
    }
    let server = NodeId::from_be_bytes(reply[8..16].try_into().map_err(|_| LinkError::NotANode)?);
    let theirs = &reply[16..16 + NONCE_LEN];
    let ids = (me, server);
    let nonces = (&mine[..], theirs);
    if !verify(
        &handshake_tag(secret, b"server", ids, nonces),
        &reply[16 + NONCE_LEN..],
    ) {
        return Err(LinkError::BadSecret);
    }
    send(&mut write, &handshake_tag(secret, b"client", ids, nonces)).await?;
    let mut accepted = [0u8; 1];
    read.read_exact(&mut accepted).await?;
    if accepted[0] != ACCEPTED {
        return Err(LinkError::BadSecret);
    }
    let session = Session {
        key: handshake_tag(secret, b"session", ids, nonces).to_vec(),
    };
    let (reader, writer) = frames(
        read,
        write,
        &session,
        Direction::ToClient,
        Direction::ToServer,
    );
    Ok((reader, writer, server))
}

/// The server side of a new link; returns the client's node id with it.
pub(crate) async fn accept(
    tcp: TcpStream,
    credentials: &Credentials,
    me: NodeId,
) -> Result<(FrameReader, FrameWriter, NodeId), LinkError> {
    let _ = tcp.set_nodelay(true);
    let handshake = async {
        let stream = match &credentials.tls {
            Some(tls) => Stream::accept(tcp, &**tls).await.map_err(LinkError::Tls)?,
            None => Stream::Plain(tcp),
        };
        server_handshake(stream, &credentials.secret, me).await
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| LinkError::Timeout)?
}

async fn server_handshake(
    stream: Stream,
    secret: &[u8],
    me: NodeId,
) -> Result<(FrameReader, FrameWriter, NodeId), LinkError> {
    let (mut read, mut write) = stream.split();
    let mut hello = [0u8; 8 + 8 + NONCE_LEN];
    read.read_exact(&mut hello).await?;
    if is_tls_record(hello[0]) {
        return Err(LinkError::PeerUsesTls);
    }
    if &hello[..8] != MAGIC {
        return Err(LinkError::NotANode);
    }
    let client = NodeId::from_be_bytes(hello[8..16].try_into().map_err(|_| LinkError::NotANode)?);
    let theirs = &hello[16..];
    let mine = nonce();
    let ids = (client, me);
    let nonces = (theirs, &mine[..]);
    let mut reply = Vec::with_capacity(8 + 8 + NONCE_LEN + 32);
    reply.extend_from_slice(MAGIC);
    reply.extend_from_slice(&me.to_be_bytes());
    reply.extend_from_slice(&mine);
    reply.extend_from_slice(&handshake_tag(secret, b"server", ids, nonces));
    send(&mut write, &reply).await?;
    let mut tag = [0u8; 32];
    read.read_exact(&mut tag).await?;
    if !verify(&handshake_tag(secret, b"client", ids, nonces), &tag) {
        return Err(LinkError::BadSecret);
    }
    send(&mut write, &[ACCEPTED]).await?;
    let session = Session {
        key: handshake_tag(secret, b"session", ids, nonces).to_vec(),
    };
    let (reader, writer) = frames(
        read,
        write,
        &session,
        Direction::ToServer,
        Direction::ToClient,
    );
    Ok((reader, writer, client))
}

fn frames(
    read: ReadPart,
    write: WritePart,
    session: &Session,
    incoming: Direction,
    outgoing: Direction,
) -> (FrameReader, FrameWriter) {
    (
        FrameReader {
            inner: BufReader::with_capacity(64 << 10, read),
            tagger: Tagger::new(&session.key, incoming),
        },
        FrameWriter {
            inner: BufWriter::with_capacity(64 << 10, write),
            tagger: Tagger::new(&session.key, outgoing),
        },
    )
}

/// Tags the frames of one direction, counting them.
struct Tagger {
    mac: HmacSha256,
    seq: u64,
}

impl Tagger {
    fn new(key: &[u8], direction: Direction) -> Tagger {
        let mut mac = mac(key);
        mac.update(&[direction as u8]);
        Tagger { mac, seq: 0 }
    }

    fn tag(&mut self, payload: &[u8]) -> [u8; 32] {
        let mut m = self.mac.clone();
        m.update(&self.seq.to_be_bytes());
        m.update(payload);
        self.seq += 1;
        m.finalize().into_bytes().into()
    }
}

/// Reads checked frames.
pub(crate) struct FrameReader {
    inner: BufReader<ReadPart>,
    tagger: Tagger,
}

impl FrameReader {
    /// The next frame's payload, or `None` at a clean end of the stream.
    pub(crate) async fn read(&mut self) -> Result<Option<Vec<u8>>, LinkError> {
        let mut len = [0u8; 4];
        match self.inner.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(LinkError::TooLong(len));
        }
        let mut payload = vec![0u8; len];
        self.inner.read_exact(&mut payload).await?;
        let mut tag = [0u8; TAG_LEN];
        self.inner.read_exact(&mut tag).await?;
        let expected = self.tagger.tag(&payload);
        if !verify_truncated(&expected, &tag) {
            return Err(LinkError::BadTag);
        }
        Ok(Some(payload))
    }
}

fn verify_truncated(expected: &[u8; 32], got: &[u8; TAG_LEN]) -> bool {
    expected[..TAG_LEN]
        .iter()
        .zip(got)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// Writes tagged frames; [`FrameWriter::flush`] sends what was written.
pub(crate) struct FrameWriter {
    inner: BufWriter<WritePart>,
    tagger: Tagger,
}

impl FrameWriter {
    pub(crate) async fn write(&mut self, payload: &[u8]) -> Result<(), LinkError> {
        if payload.len() > MAX_FRAME {
            return Err(LinkError::TooLong(payload.len()));
        }
        let tag = self.tagger.tag(payload);
        let len = u32::try_from(payload.len()).map_err(|_| LinkError::TooLong(payload.len()))?;
        self.inner.write_all(&len.to_be_bytes()).await?;
        self.inner.write_all(payload).await?;
        self.inner.write_all(&tag[..TAG_LEN]).await?;
        Ok(())
    }

    pub(crate) async fn flush(&mut self) -> Result<(), LinkError> {
        self.inner.flush().await?;
        Ok(())
    }

    /// Writes `first` and whatever else `queue` holds now, then sends them all.
    pub(crate) async fn write_batch(
        &mut self,
        first: Vec<u8>,
        queue: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    ) -> Result<(), LinkError> {
        self.write(&first).await?;
        while let Ok(frame) = queue.try_recv() {
            self.write(&frame).await?;
        }
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn holding(secret: &'static [u8]) -> Credentials {
        Credentials {
            secret: Arc::from(secret),
            tls: None,
        }
    }

    async fn pair(
        server_secret: &'static [u8],
        client_secret: &'static [u8],
    ) -> (
        Result<(FrameReader, FrameWriter, NodeId), LinkError>,
        Result<(FrameReader, FrameWriter, NodeId), LinkError>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            accept(stream, &holding(server_secret), 2).await
        });
        let stream = TcpStream::connect(addr).await.expect("connect");
        let client = connect(stream, &holding(client_secret), 1, &addr.to_string()).await;
        (client, server.await.expect("server task"))
    }

    #[tokio::test]
    async fn frames_flow_both_ways_between_holders_of_the_secret() {
        let (client, server) = pair(b"s3cret", b"s3cret").await;
        let (mut cr, mut cw, server_id) = client.expect("client side");
        let (mut sr, mut sw, client_id) = server.expect("server side");
        assert_eq!((server_id, client_id), (2, 1));
        cw.write(b"hello").await.expect("write");
        cw.write(b"").await.expect("write");
        cw.flush().await.expect("flush");
        assert_eq!(sr.read().await.expect("read"), Some(b"hello".to_vec()));
        assert_eq!(sr.read().await.expect("read"), Some(Vec::new()));
        sw.write(b"back").await.expect("write");
        sw.flush().await.expect("flush");
        assert_eq!(cr.read().await.expect("read"), Some(b"back".to_vec()));
        drop(cw);
        assert_eq!(sr.read().await.expect("clean end"), None);
    }

    #[tokio::test]
    async fn a_wrong_secret_is_refused_on_both_sides() {
        let (client, server) = pair(b"right", b"wrong").await;
        assert!(
            matches!(client, Err(LinkError::BadSecret)),
            "{:?}",
            client.err()
        );
        assert!(server.is_err());
    }

    #[tokio::test]
    async fn an_altered_frame_ends_the_link() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            let (mut reader, _writer, _) =
                accept(stream, &holding(b"k"), 2).await.expect("handshake");
            reader.read().await
        });
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (_reader, mut writer, _) = connect(stream, &holding(b"k"), 1, &addr.to_string())
            .await
            .expect("handshake");
        // A frame whose payload was changed after it was tagged.
        let tag = writer.tagger.tag(b"original");
        writer
            .inner
            .write_all(&8u32.to_be_bytes())
            .await
            .expect("write");
        writer.inner.write_all(b"modified").await.expect("write");
        writer
            .inner
            .write_all(&tag[..TAG_LEN])
            .await
            .expect("write");
        writer.flush().await.expect("flush");
        let got = server.await.expect("task");
        assert!(matches!(got, Err(LinkError::BadTag)), "{got:?}");
    }

    #[tokio::test]
    async fn something_that_is_not_a_node_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            accept(stream, &holding(b"k"), 2).await.map(|_| ())
        });
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        // An MQTT CONNECT, padded to the hello's length.
        let mut junk = vec![0x10, 0x2a, 0, 4, b'M', b'Q', b'T', b'T'];
        junk.resize(8 + 8 + NONCE_LEN, 0);
        stream.write_all(&junk).await.expect("write");
        let got = server.await.expect("task");
        assert!(matches!(got, Err(LinkError::NotANode)), "{got:?}");
    }
}
