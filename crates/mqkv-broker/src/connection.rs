//! One client connection: CONNECT handshake, then a reader loop and a writer task.
//!
//! The reader decodes and handles packets; everything the connection sends (acks, SUBACK,
//! publishes) goes through the session, and the writer task drains it in batches into one
//! socket write. A protocol violation queues a DISCONNECT with the reason code the
//! specification names and closes the connection; nothing a client sends can take down another
//! connection or the broker.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::auth::AuthRequest;
use crate::broker::{identity, Inner};
use crate::codec::{self, reason, ConnAck, Connect, DecodeError, Packet, Properties, QoS};
use crate::service::{Handled, OutboundMessage, Service, ServiceFuture, ServicePublish};
use crate::session::{Delivery, Link, Message, Session};
use crate::subtree::ClientId;
use crate::topic;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const WRITE_BATCH: usize = 256 * 1024;
/// Most bytes a connection reads to finish what it received when it is taken over.
const HANDOVER_READ_MAX: usize = 256 * 1024;

/// How much room a connection's read buffer gets. Decoded packets split their bytes off the
/// front of the buffer, so its spare room shrinks; it is given a chunk of room back once less
/// than a quarter of a chunk is left, so a read never fetches only a few dozen bytes.
///
/// The chunk starts small: most connections of a broker send little (a device that publishes
/// now and then, a subscriber's acknowledgements), and an idle connection keeps its buffer, so
/// its size is most of what an idle connection costs. A read that fills all the room it had
/// doubles the chunk, and a connection that has sent [`ReadRoom::MAX`] bytes gets the largest
/// chunk, so a busy connection reads in large chunks and takes new room seldom (a request's
/// bytes stay shared with the buffer while its work is under way, so new room is often a new
/// allocation); a connection found idle by its keep alive check starts small again.
#[derive(Debug)]
struct ReadRoom {
    chunk: usize,
    /// Bytes read since the connection began or was last found idle, counted up to
    /// [`ReadRoom::MAX`].
    read: usize,
}

impl ReadRoom {
    const MIN: usize = 1024;
    const MAX: usize = 8 * 1024;

    fn new() -> ReadRoom {
        ReadRoom {
            chunk: Self::MIN,
            read: 0,
        }
    }

    /// Gives `buf` a chunk of room once less than a quarter of one is left; returns the room
    /// the next read has.
    fn make(&self, buf: &mut BytesMut) -> usize {
        if buf.capacity() - buf.len() < self.chunk / 4 {
            buf.reserve(self.chunk);
        }
        buf.capacity() - buf.len()
    }

    /// Notes a read of `n` bytes into `room` bytes of room: one that filled it doubles the
    /// chunk, and so does reading the largest chunk's worth in all.
    fn read(&mut self, n: usize, room: usize) {
        self.read = (self.read + n).min(Self::MAX);
        if self.read >= Self::MAX {
            self.chunk = Self::MAX;
        } else if n >= room {
            self.chunk = (self.chunk * 2).min(Self::MAX);
        }
    }

    /// An idle connection: an empty buffer that grew is given back, and the chunk starts small
    /// again.
    fn idle(&mut self, buf: &mut BytesMut) {
        if buf.is_empty() && buf.capacity() > Self::MIN {
            *buf = BytesMut::with_capacity(Self::MIN);
        }
        *self = ReadRoom::new();
    }
}

/// Counts the connection as live for as long as it exists.
struct LiveGuard(Arc<Inner>);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.live_connections.fetch_sub(1, Ordering::Relaxed);
        self.0.connection_closed.notify_waiters();
    }
}

pub(crate) async fn run(inner: Arc<Inner>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
    inner.live_connections.fetch_add(1, Ordering::Relaxed);
    let live = LiveGuard(inner.clone());
    tracing::debug!(%peer, "connection accepted");
    let (mut rd, mut wr) = stream.into_split();
    let max_in = inner.config.max_packet_size as usize;
    let mut read_room = ReadRoom::new();
    let mut buf = BytesMut::with_capacity(ReadRoom::MIN);

    let connect = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        read_connect(&mut rd, &mut buf, &mut read_room, max_in),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(ConnectFailure::Decode(DecodeError::UnsupportedProtocol(level)))) => {
            tracing::debug!(%peer, level, "unsupported protocol version");
            let ack = Packet::ConnAck(ConnAck {
                reason_code: reason::UNSUPPORTED_PROTOCOL_VERSION,
                ..Default::default()
            });
            let mut out = BytesMut::new();
            ack.encode(
                &mut out,
                if level == codec::V5 {
                    codec::V5
                } else {
                    codec::V311
                },
            );
            let _ = wr.write_all(&out).await;
            return;
        }
        Ok(Err(ConnectFailure::Decode(e))) if peek_level(&buf) == Some(codec::V5) => {
            // An MQTT 5 CONNECT that breaks the rules: say why before closing.
            tracing::debug!(%peer, error = %e, "invalid CONNECT");
            let mut out = BytesMut::new();
            Packet::ConnAck(ConnAck {
                reason_code: e.reason_code(),
                ..Default::default()
            })
            .encode(&mut out, codec::V5);
            let _ = wr.write_all(&out).await;
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = ?e, "connection closed before CONNECT completed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "no CONNECT in time");
            return;
        }
    };
    let level = connect.protocol_level;
    let v5 = level == codec::V5;

    let refuse = |code: u8| async move {
        let mut out = BytesMut::new();
        Packet::ConnAck(ConnAck {
            reason_code: code,
            ..Default::default()
        })
        .encode(&mut out, level);
        out
    };

    // Client identifier.
    let mut assigned = None;
    let client_id: ClientId = if connect.client_id.is_empty() {
        if !v5 && !connect.clean_start {
            let out = refuse(reason::CLIENT_IDENTIFIER_NOT_VALID).await;
            let _ = wr.write_all(&out).await;
            return;
        }
        let id = format!("mqkv-{:016x}", rand::random::<u64>());
        assigned = Some(id.clone());
        id.into()
    } else {
        connect.client_id.as_str().into()
    };

    // Will.
    let will = match &connect.will {
        None => None,
        Some(w) => {
            if !topic::valid_topic_name(&w.topic) {
                let out = refuse(reason::TOPIC_NAME_INVALID).await;
                let _ = wr.write_all(&out).await;
                return;
            }
            if w.properties.payload_format_indicator == Some(1)
                && std::str::from_utf8(&w.payload).is_err()
            {
                let out = refuse(reason::PAYLOAD_FORMAT_INVALID).await;
                let _ = wr.write_all(&out).await;
                return;
            }
            let mut props = w.properties.clone();
            let delay = props.will_delay_interval.take().unwrap_or(0);
            Some((
                Arc::new(Message {
                    topic: w.topic.clone(),
                    payload: w.payload.clone(),
                    qos: w.qos,
                    retain: w.retain,
                    expires_at: props
                        .message_expiry_interval
                        .map(|s| Instant::now() + Duration::from_secs(u64::from(s))),
                    properties: props,
                    publisher: Some(client_id.clone()),
                }),
                delay,
            ))
        }
    };

    // Authentication.
    let principal = match inner.auth.authenticate(&AuthRequest {
        client_id: &client_id,
        username: connect.username.as_deref(),
        password: connect.password.as_ref(),
        authentication_method: connect.properties.authentication_method(),
        peer,
        local,
    }) {
        Ok(p) => p,
        Err(code) => {
            tracing::info!(%peer, client_id = %client_id, code, "connection refused");
            let out = refuse(code).await;
            let _ = wr.write_all(&out).await;
            return;
        }
    };

    // Room for one more session, unless the client has one.
    let full = {
        let sessions = inner.sessions.lock();
        sessions.len() >= inner.config.max_sessions && !sessions.contains_key(&client_id)
    };
    if full {
        tracing::info!(%peer, client_id = %client_id, "connection refused: too many sessions");
        let out = refuse(reason::QUOTA_EXCEEDED).await;
        let _ = wr.write_all(&out).await;
        return;
    }

    // Negotiated parameters.
    let cfg = &inner.config;
    let requested_expiry = if v5 {
        connect.properties.session_expiry_interval.unwrap_or(0)
    } else if connect.clean_start {
        0
    } else {
        u32::MAX
    };
    let expiry = requested_expiry.min(cfg.max_session_expiry);
    let mut keep_alive = connect.keep_alive;
    let mut server_keep_alive = None;
    if cfg.max_keep_alive > 0 && (keep_alive == 0 || keep_alive > cfg.max_keep_alive) {
        keep_alive = cfg.max_keep_alive;
        server_keep_alive = Some(keep_alive);
    }
    let client_receive_max = connect.properties.receive_maximum.unwrap_or(u16::MAX);
    let client_max_packet = connect
        .properties
        .maximum_packet_size
        .map_or(usize::MAX, |v| v as usize);
    let client_alias_max = connect.properties.topic_alias_maximum.unwrap_or(0);

    let conn_id = inner.next_connection_id();
    let link = Link::new(
        conn_id,
        level,
        client_receive_max,
        client_max_packet,
        client_alias_max,
    );
    let notify = link.notify.clone();
    let handover = link.handover.clone();
    let relocate = link.relocate.clone();
    if let Some(federation) = inner.federation.get() {
        let claim = crate::replicated::Claim {
            client_id: client_id.to_string(),
            conn_id,
            clean_start: connect.clean_start,
            expiry_interval: expiry,
            will: will
                .as_ref()
                .map(|(m, delay)| crate::replicated::WillRecord {
                    message: crate::persist::StoredMessage::of(m),
                    delay: *delay,
                }),
        };
        match federation.claim(claim).await {
            Ok(Some(record)) if !connect.clean_start => inner.restore(&client_id, record),
            Ok(_) => {}
            Err(code) => {
                tracing::info!(%peer, client_id = %client_id, code, "connection refused by the cluster");
                let out = refuse(code).await;
                let _ = wr.write_all(&out).await;
                return;
            }
        }
    }
    inner.hand_over(&client_id).await;
    let attached = inner.attach(&client_id, connect.clean_start, expiry, link);
    let session = attached.session;

    let mut props = Properties::default();
    if v5 {
        if assigned.is_some() {
            props.rare_mut().assigned_client_identifier = assigned;
        }
        props.server_keep_alive = server_keep_alive;
        props.receive_maximum = Some(cfg.receive_maximum);
        props.maximum_packet_size = Some(cfg.max_packet_size);
        props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
        if expiry != requested_expiry {
            props.session_expiry_interval = Some(expiry);
        }
        if connect.properties.request_response_information == Some(1) {
            let info = format!("clients/{client_id}");
            // Left out when a very long client id would make it too long to send.
            if info.len() <= codec::limits::MAX_FIELD {
                props.rare_mut().response_information = Some(info);
            }
        }
    }
    session.send_control(
        conn_id,
        Packet::ConnAck(ConnAck {
            session_present: attached.session_present,
            reason_code: reason::SUCCESS,
            properties: props,
        }),
    );
    tracing::debug!(%peer, client_id = %client_id, level, "client connected");

    let ident = identity(&client_id, &principal, peer, conn_id);
    for service in inner.services() {
        service.on_connect(&ident);
    }

    let wr: Writer = Arc::new(tokio::sync::Mutex::new(WriteState {
        half: Some(wr),
        pending: BytesMut::new(),
    }));
    session.set_writer(conn_id, wr.clone());
    let writer = WriterTask::spawn(session.clone(), conn_id, notify.clone(), wr.clone(), level);
    let conn = Conn {
        inner: inner.clone(),
        session: session.clone(),
        conn_id,
        level,
        client_id: client_id.clone(),
        ident: ident.clone(),
        aliases: Vec::new(),
        session_expiry: expiry,
        will,
        wr,
        notify,
        services: inner.service_claims(),
        waker: CachedWaker::default(),
        handover,
        relocate,
        moves: 0,
        move_after: Instant::now(),
        published: false,
        read_room,
        queued: VecDeque::new(),
        front_fresh: false,
    };
    conn.serve(rd, buf, keep_alive, writer, live).await;
}

#[derive(Debug)]
enum ConnectFailure {
    Io,
    Decode(DecodeError),
    NotConnect,
}

/// The protocol level of a CONNECT at the front of `buf`, if that much has arrived.
fn peek_level(buf: &[u8]) -> Option<u8> {
    let header_len = 1 + buf.iter().skip(1).take(4).position(|b| b & 0x80 == 0)? + 1;
    let rest = buf.get(header_len..)?;
    if rest.get(..6)? == b"\x00\x04MQTT" {
        rest.get(6).copied()
    } else {
        None
    }
}

async fn read_connect(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
    read_room: &mut ReadRoom,
    max: usize,
) -> Result<Connect, ConnectFailure> {
    loop {
        if buf.first().is_some_and(|b| b >> 4 != 1) {
            // Not a CONNECT: no need to wait for the rest of it.
            return Err(ConnectFailure::NotConnect);
        }
        // Decode from a view so that a rejected CONNECT stays in `buf` for `peek_level`.
        let mut view = buf.clone();
        let decoded = codec::decode(&mut view, None, max);
        if decoded.is_ok() {
            *buf = view;
        }
        match decoded {
            Ok(Some(Packet::Connect(c))) => return Ok(*c),
            Ok(Some(_)) => return Err(ConnectFailure::NotConnect),
            Ok(None) => {}
            Err(e) => return Err(ConnectFailure::Decode(e)),
        }
        let room = read_room.make(buf);
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(ConnectFailure::Io),
            Ok(n) => read_room.read(n, room),
        }
    }
}

/// The write side, shared by the writer task and the reader's inline flush: the socket half
/// and bytes encoded but not yet written.
pub(crate) struct WriteState {
    /// None while the connection moves to another thread (see [`Conn::try_move`]).
    half: Option<OwnedWriteHalf>,
    pending: BytesMut,
}

impl std::fmt::Debug for WriteState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteState")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// A connection's write half and what is waiting to go out on it. Its writer task holds the
/// lock while it waits for the socket; other tasks only ever `try_lock` it.
pub(crate) type Writer = Arc<tokio::sync::Mutex<WriteState>>;

/// Writes what session `conn_id` has ready, from the calling task, as far as the socket takes it
/// without waiting. The rest, and anything unusual (closing, takeover, a busy writer), is left to
/// the writer task, woken through `notify`.
pub(crate) fn write_ready(session: &Session, conn_id: u64, wr: &Writer, notify: &Notify) {
    let Ok(mut guard) = wr.try_lock() else {
        notify.notify_one();
        return;
    };
    let w = &mut *guard;
    if !w.pending.is_empty() {
        notify.notify_one();
        return;
    }
    if session.drain(conn_id, &mut w.pending, WRITE_BATCH) != Some(false) {
        notify.notify_one();
        return;
    }
    if let Some(half) = &w.half {
        while !w.pending.is_empty() {
            match half.try_write(&w.pending) {
                Ok(n) if n > 0 => w.pending.advance(n),
                _ => break,
            }
        }
    }
    if !w.pending.is_empty() || session.has_ready(conn_id) {
        notify.notify_one();
    }
}

/// Writes everything the session has ready for this connection, waiting for the socket as
/// needed. Returns true when the connection is finished (closed, taken over, or failed).
async fn flush(session: &Session, conn_id: u64, level: u8, w: &mut WriteState) -> bool {
    let WriteState { half, pending } = w;
    // Only the connection's own writer task flushes, and it is stopped before the half is
    // taken to move the connection (see `Conn::try_move`).
    let Some(half) = half.as_mut() else {
        return false;
    };
    loop {
        if !pending.is_empty() {
            if half.write_all(pending).await.is_err() {
                return true;
            }
            pending.clear();
        }
        match session.drain(conn_id, pending, WRITE_BATCH) {
            None => {
                // The session moved to another connection.
                if level == codec::V5 {
                    Packet::Disconnect(codec::Disconnect {
                        reason_code: reason::SESSION_TAKEN_OVER,
                        ..Default::default()
                    })
                    .encode(pending, level);
                    let _ = half.write_all(pending).await;
                }
                let _ = half.shutdown().await;
                return true;
            }
            Some(close) => {
                if !pending.is_empty() {
                    if half.write_all(pending).await.is_err() {
                        return true;
                    }
                    pending.clear();
                }
                if close {
                    let _ = half.shutdown().await;
                    return true;
                }
            }
        }
        if !session.has_ready(conn_id) {
            return false;
        }
    }
}

/// Longest the server keeps reading, and discarding, what a client sends after the server's
/// DISCONNECT.
const DRAIN_AFTER_DISCONNECT: Duration = Duration::from_millis(500);

/// After the server's DISCONNECT (sent, and the sending side closed): reads and discards what
/// the client still sends until it closes, or for [`DRAIN_AFTER_DISCONNECT`]. Closing a socket
/// with unread input resets the connection, and a client still sending would meet the reset
/// before it read the DISCONNECT and its reason.
async fn drain_input(rd: &mut OwnedReadHalf) {
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(DRAIN_AFTER_DISCONNECT, async {
        while let Ok(n) = rd.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// A connection's writer task, and the flag it raises when it ends (returning, failing or
/// stopped): the read loop polls the task's handle once, to be woken when it ends, and after
/// that only once the flag is up. Polling the handle on every pass would cost the read loop a
/// poll of the task's state and of the cooperative budget for every packet.
struct WriterTask {
    handle: tokio::task::JoinHandle<()>,
    ended: Arc<std::sync::atomic::AtomicBool>,
    registered: bool,
}

impl WriterTask {
    fn spawn(
        session: Arc<Session>,
        conn_id: u64,
        notify: Arc<tokio::sync::Notify>,
        wr: Writer,
        level: u8,
    ) -> WriterTask {
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let raise = RaiseOnDrop(ended.clone());
        let handle = tokio::spawn(async move {
            let _raise = raise;
            write_loop(session, conn_id, notify, wr, level).await;
        });
        WriterTask {
            handle,
            ended,
            registered: false,
        }
    }

    /// Ready once the writer task has ended.
    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let ended = self.ended.load(Ordering::Acquire);
        // Outside the cooperative budget, so the first poll always registers this task.
        let handle = std::pin::pin!(tokio::task::unconstrained(&mut self.handle));
        poll_event(handle, &mut self.registered, ended, cx).map(|_| ())
    }
}

/// Raises its flag when dropped: when the task holding it ends, however it ends.
struct RaiseOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

async fn write_loop(
    session: Arc<Session>,
    conn_id: u64,
    notify: Arc<tokio::sync::Notify>,
    wr: Writer,
    level: u8,
) {
    loop {
        notify.notified().await;
        let mut w = wr.lock().await;
        if flush(&session, conn_id, level, &mut w).await {
            return;
        }
    }
}

/// Polls `event`, a future that registers the task on its first poll (a `Notified`, a watch
/// channel's change), on its first poll and afterwards only when `happened` says it may be
/// ready: polling it on every pass would take the lock of the notifier it waits on. The
/// `select!` branch it serves stays enabled, because a branch's condition is read once per
/// select: a connection whose client has gone quiet waits in one select, and would never see
/// the event.
fn poll_event<F: std::future::Future>(
    event: std::pin::Pin<&mut F>,
    registered: &mut bool,
    happened: bool,
    cx: &mut Context<'_>,
) -> Poll<F::Output> {
    if *registered && !happened {
        return Poll::Pending;
    }
    *registered = true;
    event.poll(cx)
}

/// How a connection's read loop ended.
enum Exit {
    Ended(End),
    /// To go on on connection thread `home`: the writer task is stopped, and `guard` holds the
    /// write half's lock with nothing pending.
    Move {
        home: usize,
        buf: BytesMut,
        guard: tokio::sync::OwnedMutexGuard<WriteState>,
    },
}

/// A connection's remaining work, spawned on the thread it moves to.
type Moved = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Why a connection ended; decides whether the will is published.
#[derive(Debug)]
enum End {
    /// DISCONNECT with reason 0x00: no will.
    Normal,
    /// DISCONNECT with reason 0x04, a protocol violation, a keep alive timeout, or network loss.
    Abnormal,
    /// Server shutdown.
    Shutdown,
}

struct Conn {
    inner: Arc<Inner>,
    session: Arc<Session>,
    conn_id: u64,
    level: u8,
    client_id: ClientId,
    ident: crate::service::ClientIdentity,
    /// Inbound topic aliases, indexed by alias - 1.
    aliases: Vec<Option<String>>,
    session_expiry: u32,
    will: Option<(Arc<Message>, u32)>,
    wr: Writer,
    notify: Arc<tokio::sync::Notify>,
    /// This connection's copy of the service claims.
    services: crate::broker::ServiceClaims,
    /// The waker services' futures get (see [`crate::threads::home_waker`]).
    waker: CachedWaker,
    handover: Arc<crate::session::Handover>,
    /// How the session asks the connection to move to another thread.
    relocate: Arc<crate::session::Relocate>,
    /// Times the connection moved, and when it may move again: each move doubles the wait, so
    /// two connections that feed each other from different threads do not trade places for long.
    moves: u32,
    move_after: Instant,
    /// Whether the connection published to other clients since it was last asked to move.
    published: bool,
    read_room: ReadRoom,
    /// Publishes to services whose acknowledgement has not gone out yet, in arrival order (see
    /// [`crate::service`]). Invariant: the ones not yet started are at the back, and the front
    /// one is never done (a done front is acknowledged and removed at once).
    queued: VecDeque<Queued>,
    /// The front publish's work was started, and with it polled, in the pass over received
    /// packets under way, and no publish waits to start behind it: looked at again before
    /// anything wakes that work, the queue would give nothing new.
    front_fresh: bool,
}

/// A publish to a service, waiting for its work or for earlier answers and acknowledgements.
struct Queued {
    work: Work,
    /// PUBACK or PUBREC to send once it is this publish's turn; none at QoS 0.
    ack: Option<PendingAck>,
}

/// A PUBACK or PUBREC still to send: a few bytes where the packet it becomes takes hundreds,
/// so queueing and moving it stays cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingAck {
    /// PUBREC (QoS 2) rather than PUBACK (QoS 1).
    rec: bool,
    packet_id: u16,
    reason_code: u8,
}

impl PendingAck {
    /// The acknowledgement's fixed header byte ([`codec::ack_header`]).
    fn header(self) -> u8 {
        if self.rec {
            codec::ack_header::PUBREC
        } else {
            codec::ack_header::PUBACK
        }
    }
}

/// Where a synchronous pass over the received packets stopped (see `Conn::process_ready`).
enum Step {
    /// No whole packet left.
    Drained,
    /// A publish for a service, with the Receive Maximum of publishes queued already. Boxed,
    /// as is the DISCONNECT: both are rare, and every pass's result stays small to move.
    Room(Box<Handoff>),
    /// A DISCONNECT, handled once the queued publishes are done.
    Disconnect(Box<codec::Disconnect>),
}

/// A publish to give to the service that claims its topic, with the acknowledgement it gets once
/// its work is done.
struct Handoff {
    service: Arc<dyn Service>,
    publish: ServicePublish,
    ack: Option<PendingAck>,
}

// Held unboxed like [`Handled`]: an allocation per request costs more than the moves.
#[allow(clippy::large_enum_variant)]
enum Work {
    /// Finished; the answer to publish when it is this publish's turn.
    Done(Option<OutboundMessage>),
    Running(ServiceFuture),
    /// Handed back by the service: started once every earlier publish has finished.
    NotStarted(Box<ServicePublish>, Arc<dyn Service>),
}

/// A task's waker wrapped by [`crate::threads::home_waker`], made once and reused while the
/// task's waker stays the same.
#[derive(Default)]
struct CachedWaker(Option<(Waker, Waker)>);

impl CachedWaker {
    fn get(&mut self, task: &Waker) -> &Waker {
        let fresh = !matches!(&self.0, Some((t, _)) if t.will_wake(task));
        if fresh {
            self.0 = None;
        }
        let (_, wrapped) = self
            .0
            .get_or_insert_with(|| (task.clone(), crate::threads::home_waker(task)));
        wrapped
    }

    /// Polls a service's future with the task's waker, wrapped.
    fn poll(
        &mut self,
        future: &mut ServiceFuture,
        cx: &mut Context<'_>,
    ) -> Poll<Option<OutboundMessage>> {
        future
            .as_mut()
            .poll(&mut Context::from_waker(self.get(cx.waker())))
    }
}

/// What a connection asked to hand over found in what it had received.
enum Received {
    /// Handled; the connection goes on until it is taken over.
    Handled,
    /// What it received ended the connection (DISCONNECT, a protocol violation).
    Ended(End),
    /// The peer closed the connection.
    PeerGone,
}

/// A violation detected while handling a packet: DISCONNECT with this reason code.
struct Violation(u8);

/// The acknowledgement a publish of `qos` gets: PUBACK, PUBREC, or none at QoS 0.
fn ack_for(qos: QoS, packet_id: u16, reason_code: u8) -> Option<PendingAck> {
    let rec = match qos {
        QoS::AtMostOnce => return None,
        QoS::AtLeastOnce => false,
        QoS::ExactlyOnce => true,
    };
    Some(PendingAck {
        rec,
        packet_id,
        reason_code,
    })
}

impl Conn {
    fn v5(&self) -> bool {
        self.level == codec::V5
    }

    fn send(&self, p: Packet) {
        self.session.send_control(self.conn_id, p);
    }

    /// Writes what is queued from the reader's own task, without waiting: as much as the socket
    /// takes at once. The rest, and anything unusual (closing, takeover, a busy writer), is left
    /// to the writer task. This saves a task hand-off per request and puts an ack and the
    /// response it belongs with into one write.
    fn flush_inline(&self) {
        if self.session.end_deferral(self.conn_id) {
            write_ready(&self.session, self.conn_id, &self.wr, &self.notify);
        }
    }

    /// Queues DISCONNECT (MQTT 5) and makes the writer close after flushing.
    fn close_with(&self, code: u8) {
        self.session.close(self.conn_id, Some(code));
    }

    async fn read_loop(
        &mut self,
        rd: &mut OwnedReadHalf,
        mut buf: BytesMut,
        keep_alive: u16,
        mut writer: WriterTask,
    ) -> Exit {
        let max_in = self.inner.config.max_packet_size as usize;
        let inner = self.inner.clone();
        let mut shutdown = self.inner.shutdown.subscribe();
        // One future for the whole connection: registered once, not once per read.
        // Outside the cooperative budget, so its first poll always registers this task.
        let mut shutdown = std::pin::pin!(tokio::task::unconstrained(shutdown.changed()));
        let ka = (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
        let packet_timeout = match self.inner.config.packet_timeout_secs {
            0 => None,
            secs => Some(Duration::from_secs(u64::from(secs))),
        };
        let mut last = Instant::now();
        // When the part of a packet that `buf` holds began to arrive.
        let mut partial_since: Option<Instant> = None;
        // The timer checks the keep alive and how long a partial packet has been arriving. It
        // is armed once and moved only when it fires: re-arming it on every read would take
        // the timer driver's lock twice per packet.
        let check_every = |ka: Option<Duration>| match (ka, packet_timeout) {
            (Some(k), Some(p)) => k.min(p),
            (Some(k), None) => k,
            (None, Some(p)) => p,
            (None, None) => Duration::MAX,
        };
        let mut idle = std::pin::pin!(tokio::time::sleep(check_every(ka)));
        // Polled to register this task with the timer, then only once it has fired (a look at
        // its state), like the events below: a poll on every pass took the task's cooperative
        // budget and looked at the timer's waker each time.
        let mut idle_registered = false;
        // The shutdown future is polled once to register this task as its waiter; after that
        // only when the flag says shutdown began. Polling it again on every packet would take
        // the lock of the one notifier all connections share.
        let mut shutdown_registered = false;
        // A new connection for the same client asks through this (see `Handover`), registered
        // and then polled the same way as the shutdown future.
        let handover = self.handover.clone();
        let mut asked = std::pin::pin!(tokio::task::unconstrained(handover.asked.notified()));
        let mut handover_registered = false;
        let mut handed_over = false;
        // Registered and polled the same way.
        let relocate = self.relocate.clone();
        let mut move_asked = std::pin::pin!(tokio::task::unconstrained(relocate.asked.notified()));
        let mut move_registered = false;
        // Packets may already be buffered behind CONNECT, so process before the first read.
        let mut received = true;
        // The queued publishes' first look is skipped when it would only poll the work that the
        // pass just started (see `Conn::front_fresh`): whatever wakes that work wakes this task,
        // and the look after the wake-up polls it.
        let mut skip_queued;
        // Whether this side ended the connection with a DISCONNECT of its own.
        let mut told = false;
        let end = loop {
            if !shutdown_registered && self.inner.shutting_down.load(Ordering::SeqCst) {
                // Shutdown began before this loop watched for it (a connection that moved).
                self.close_with(reason::SERVER_SHUTTING_DOWN);
                told = true;
                break End::Shutdown;
            }
            if received {
                // While the batch is handled, queueing output does not wake the writer task:
                // the reader writes it itself afterwards, acks and responses together in one
                // write.
                self.session.defer(self.conn_id);
                let processed = self.process(&mut buf, max_in).await;
                partial_since = match buf.is_empty() {
                    true => None,
                    false => partial_since.or(Some(last)),
                };
                self.flush_inline();
                skip_queued = self.front_fresh;
                match processed {
                    Ok(None) => {}
                    Ok(Some(end)) => break end,
                    Err(Violation(code)) => {
                        tracing::debug!(client_id = %self.client_id, code, "protocol violation");
                        self.close_with(code);
                        told = true;
                        break End::Abnormal;
                    }
                }
            } else {
                skip_queued = false;
            }
            let room = self.read_room.make(&mut buf);
            let held = buf.len();
            // Until a read brings more, `buf` holds no whole packet.
            received = false;
            // In this order: a client that never stops sending still sees a shutdown.
            tokio::select! {
                biased;
                _ = std::future::poll_fn(|cx| poll_event(
                    shutdown.as_mut(),
                    &mut shutdown_registered,
                    inner.shutting_down.load(Ordering::SeqCst),
                    cx,
                )) => {
                    self.close_with(reason::SERVER_SHUTTING_DOWN);
                    told = true;
                    break End::Shutdown;
                }
                () = std::future::poll_fn(|cx| poll_event(
                    asked.as_mut(),
                    &mut handover_registered,
                    handover.requested(),
                    cx,
                )), if !handed_over => {
                    handed_over = true;
                    match self.finish_received(rd, &mut buf, max_in).await {
                        Received::Ended(end) => break end,
                        Received::PeerGone => {
                            // As for a read that finds the peer gone.
                            writer.handle.abort();
                            return Exit::Ended(End::Abnormal);
                        }
                        // Still connected: the new connection takes over, and the writer ends.
                        Received::Handled => handover.finish(),
                    }
                }
                () = std::future::poll_fn(|cx| writer.poll_ended(cx)) => {
                    // Write failure or takeover.
                    return Exit::Ended(End::Abnormal);
                }
                () = std::future::poll_fn(|cx| poll_event(
                    move_asked.as_mut(),
                    &mut move_registered,
                    relocate.pending(),
                    cx,
                )) => {
                    move_asked.set(tokio::task::unconstrained(relocate.asked.notified()));
                    move_registered = false;
                    if !handed_over {
                        match self.try_move(&mut writer.handle).await {
                            None => {}
                            Some(Ok((home, guard))) => {
                                let buf = std::mem::take(&mut buf);
                                return Exit::Move { home, buf, guard };
                            }
                            Some(Err(())) => return Exit::Ended(End::Abnormal),
                        }
                    }
                }
                () = std::future::poll_fn(|cx| {
                    if std::mem::take(&mut skip_queued) {
                        Poll::Pending
                    } else {
                        self.poll_queued(cx)
                    }
                }), if !self.queued.is_empty() => {}
                r = rd.read_buf(&mut buf) => match r {
                    Ok(0) | Err(_) => {
                        // The peer is gone: nothing more can be written to it.
                        writer.handle.abort();
                        return Exit::Ended(End::Abnormal);
                    }
                    Ok(n) => {
                        last = Instant::now();
                        received = true;
                        self.read_room.read(n, room);
                        if held == 0 && crate::quickack::only_acknowledgements(&buf) {
                            crate::quickack::ack_at_once(rd.as_ref());
                        }
                    }
                },
                () = std::future::poll_fn(|cx| {
                    let fired = idle.is_elapsed();
                    poll_event(idle.as_mut(), &mut idle_registered, fired, cx)
                }), if ka.is_some() || packet_timeout.is_some() => {
                    let now = Instant::now();
                    let stalled = match (partial_since, packet_timeout) {
                        (Some(since), Some(limit)) => now >= since + limit,
                        _ => false,
                    };
                    if stalled {
                        tracing::debug!(client_id = %self.client_id, "a packet stopped arriving midway");
                    }
                    if stalled || ka.is_some_and(|k| now >= last + k) {
                        self.close_with(reason::KEEP_ALIVE_TIMEOUT);
                        told = true;
                        break End::Abnormal;
                    }
                    let deadline = match ka {
                        Some(k) => (last + k).min(now + check_every(None).min(k)),
                        None => now + check_every(None),
                    };
                    idle.as_mut().reset(deadline.into());
                    idle_registered = false;
                    // At most once per keep alive period: a good time to give back a buffer
                    // that a burst made large.
                    self.read_room.idle(&mut buf);
                }
            }
        };
        // Let the writer flush a final DISCONNECT, but do not wait on a stuck peer forever.
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut writer.handle).await;
        writer.handle.abort();
        if told {
            drain_input(rd).await;
        }
        Exit::Ended(end)
    }

    /// Serves the connection once its CONNECT is handled, until it ends: here, or on the
    /// thread it moves to.
    fn serve(
        mut self,
        mut rd: OwnedReadHalf,
        buf: BytesMut,
        keep_alive: u16,
        writer: WriterTask,
        live: LiveGuard,
    ) -> Moved {
        Box::pin(async move {
            match self.read_loop(&mut rd, buf, keep_alive, writer).await {
                Exit::Ended(end) => self.end(end),
                Exit::Move {
                    home,
                    buf,
                    mut guard,
                } => {
                    let Some(wr) = guard.half.take() else {
                        self.end(End::Abnormal);
                        return;
                    };
                    let stream = match rd.reunite(wr).map(TcpStream::into_std) {
                        Ok(Ok(stream)) => stream,
                        failed => {
                            if let Ok(Err(e)) = failed {
                                tracing::warn!(client_id = %self.client_id, error = %e, "cannot move a connection");
                            }
                            drop(guard);
                            self.end(End::Abnormal);
                            return;
                        }
                    };
                    tracing::debug!(client_id = %self.client_id, from = crate::threads::current_home(), to = home, "connection moves");
                    let inner = self.inner.clone();
                    inner.threads.serve_on(home - 1, stream, move |stream| {
                        self.resume(stream, buf, keep_alive, guard, live)
                    });
                }
            }
        })
    }

    /// Goes on serving the connection on the thread it moved to.
    fn resume(
        mut self,
        stream: TcpStream,
        buf: BytesMut,
        keep_alive: u16,
        mut guard: tokio::sync::OwnedMutexGuard<WriteState>,
        live: LiveGuard,
    ) -> Moved {
        let (rd, wr) = stream.into_split();
        guard.half = Some(wr);
        drop(guard);
        // Output for the connection is written from this thread from now on.
        self.session.set_writer(self.conn_id, self.wr.clone());
        self.waker = CachedWaker::default();
        let writer = WriterTask::spawn(
            self.session.clone(),
            self.conn_id,
            self.notify.clone(),
            self.wr.clone(),
            self.level,
        );
        // What was queued while the connection moved.
        self.notify.notify_one();
        self.serve(rd, buf, keep_alive, writer, live)
    }

    /// The thread the connection may move to now, if it was asked to move and can: nothing is
    /// under way for it, its output is written out, the thread it goes to is not overfull, and
    /// its last move is long enough ago. Then its writer task is stopped and the write half's
    /// lock returned, held. `Err` when the writer task had ended (the connection is over).
    async fn try_move(
        &mut self,
        writer: &mut tokio::task::JoinHandle<()>,
    ) -> Option<Result<(usize, tokio::sync::OwnedMutexGuard<WriteState>), ()>> {
        let home = self.relocate.take();
        let here = crate::threads::current_home();
        // A connection that publishes as well may be one side of a request and response whose
        // other side is asked to move to it at the same time: only the one on the later thread
        // moves, so the two do not trade places.
        let published = std::mem::take(&mut self.published);
        if home == 0
            || (published && home > here)
            || here == 0
            || home == here
            || !self.queued.is_empty()
            || self.inner.shutting_down.load(Ordering::SeqCst)
            || Instant::now() < self.move_after
            || !self.inner.threads.may_take(home)
        {
            return None;
        }
        // Another task writing to the socket right now, or output not yet written: not now.
        let guard = self.wr.clone().try_lock_owned().ok()?;
        if !guard.pending.is_empty() || guard.half.is_none() {
            return None;
        }
        // Holding the lock, the writer task waits for work or for the lock: stopping it there
        // loses nothing, and whatever is queued meanwhile is written by the one started on the
        // other thread.
        writer.abort();
        if (&mut *writer).await.is_ok() {
            return Some(Err(()));
        }
        self.moves = self.moves.saturating_add(1);
        self.move_after = Instant::now() + Duration::from_secs(1 << self.moves.min(6));
        Some(Ok((home, guard)))
    }

    /// The connection has ended: the will, the session, the services.
    fn end(mut self, end: End) {
        tracing::debug!(client_id = %self.client_id, ?end, "connection closed");
        self.let_running_finish();
        let will = match end {
            End::Normal => None,
            _ => self.will.take(),
        };
        self.inner.detach(&self.session, self.conn_id, will);
        self.handover.finish();
        for service in self.inner.services() {
            service.on_disconnect(&self.ident);
        }
    }

    /// Reads what the socket already holds, without waiting, and handles it: for a new
    /// connection that takes this one's session over.
    async fn finish_received(
        &mut self,
        rd: &mut tokio::net::tcp::OwnedReadHalf,
        buf: &mut BytesMut,
        max_in: usize,
    ) -> Received {
        // Bounded, so a client that never stops sending cannot hold the new connection up.
        let mut room = HANDOVER_READ_MAX;
        let mut closed = false;
        while room > 0 {
            self.read_room.make(buf);
            match rd.try_read_buf(buf) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(n) => room = room.saturating_sub(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        self.session.defer(self.conn_id);
        let processed = self.process(buf, max_in).await;
        if processed.is_ok() {
            // What it received is answered here, before the new connection takes over.
            self.finish_queued().await;
        }
        self.flush_inline();
        match processed {
            Ok(None) if closed => Received::PeerGone,
            Ok(None) => Received::Handled,
            Ok(Some(end)) => Received::Ended(end),
            Err(Violation(code)) => {
                tracing::debug!(client_id = %self.client_id, code, "protocol violation");
                self.close_with(code);
                Received::Ended(End::Abnormal)
            }
        }
    }

    /// Decodes and handles every whole packet in `buf`.
    async fn process(
        &mut self,
        buf: &mut BytesMut,
        max_in: usize,
    ) -> Result<Option<End>, Violation> {
        self.front_fresh = false;
        loop {
            // Everything but the two waits below is done in one synchronous pass: no packet is
            // moved into a future of its own on its way to a service.
            let step =
                std::future::poll_fn(|cx| Poll::Ready(self.process_ready(buf, max_in, cx))).await?;
            match step {
                Step::Drained => return Ok(None),
                Step::Room(handoff) => {
                    // The Receive Maximum of publishes is queued already: wait for the oldest.
                    self.wait_for_room().await;
                    let mut handoff = Some(handoff);
                    std::future::poll_fn(|cx| {
                        if let Some(h) = handoff.take() {
                            self.hand_over(*h, cx);
                        }
                        Poll::Ready(())
                    })
                    .await;
                }
                Step::Disconnect(d) => {
                    // Every answer and acknowledgement first.
                    self.finish_queued().await;
                    return self.disconnect(&d).map(Some);
                }
            }
        }
    }

    /// Handles whole packets from `buf` until none is left or one has to wait (see [`Step`]).
    fn process_ready(
        &mut self,
        buf: &mut BytesMut,
        max_in: usize,
        cx: &mut Context<'_>,
    ) -> Result<Step, Violation> {
        loop {
            // Most acknowledgements are a packet id and at most a reason code: taken as that.
            if let Some(ack) = codec::take_plain_ack(buf, self.level, max_in) {
                self.inner.touch();
                self.acknowledged(ack.header, ack.packet_id, ack.reason_code);
                continue;
            }
            let packet = match codec::decode(buf, Some(self.level), max_in) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(Step::Drained),
                Err(e) => return Err(Violation(e.reason_code())),
            };
            if matches!(
                packet,
                Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubRel(_) | Packet::PubComp(_)
            ) {
                self.inner.touch();
            }
            match packet {
                Packet::Publish(p) => {
                    if let Some(handoff) = self.publish(p)? {
                        if self.queued.len() >= self.work_limit() {
                            return Ok(Step::Room(Box::new(handoff)));
                        }
                        self.hand_over(handoff, cx);
                    }
                }
                Packet::PubAck(a) => {
                    self.acknowledged(codec::ack_header::PUBACK, a.packet_id, a.reason_code);
                }
                Packet::PubComp(a) => {
                    self.acknowledged(codec::ack_header::PUBCOMP, a.packet_id, a.reason_code);
                }
                Packet::PubRec(a) => {
                    self.acknowledged(codec::ack_header::PUBREC, a.packet_id, a.reason_code);
                }
                Packet::PubRel(a) => {
                    let known = self.session.state.lock().incoming_qos2.remove(&a.packet_id);
                    self.session.send_ack(
                        self.conn_id,
                        codec::ack_header::PUBCOMP,
                        a.packet_id,
                        if known {
                            reason::SUCCESS
                        } else {
                            reason::PACKET_IDENTIFIER_NOT_FOUND
                        },
                    );
                }
                Packet::Subscribe(s) => self.subscribe(s)?,
                Packet::Unsubscribe(u) => {
                    let codes = u
                        .filters
                        .iter()
                        .map(|f| {
                            if self.inner.unsubscribe(&self.session, f) {
                                reason::SUCCESS
                            } else {
                                reason::NO_SUBSCRIPTION_EXISTED
                            }
                        })
                        .collect();
                    self.send(Packet::UnsubAck(codec::UnsubAck {
                        packet_id: u.packet_id,
                        properties: Properties::default(),
                        reason_codes: codes,
                    }));
                }
                Packet::PingReq => self.send(Packet::PingResp),
                Packet::Disconnect(d) => return Ok(Step::Disconnect(Box::new(d))),
                Packet::Auth(_) => return Err(Violation(reason::PROTOCOL_ERROR)),
                Packet::Connect(_)
                | Packet::ConnAck(_)
                | Packet::SubAck(_)
                | Packet::UnsubAck(_)
                | Packet::PingResp => return Err(Violation(reason::PROTOCOL_ERROR)),
            }
        }
    }

    /// A PUBACK, PUBCOMP or PUBREC (as `header` says, [`codec::ack_header`]) from the client
    /// for a message sent to it.
    fn acknowledged(&self, header: u8, packet_id: u16, reason_code: u8) {
        if header == codec::ack_header::PUBREC {
            if !self.session.received(self.conn_id, packet_id, reason_code) {
                self.session.send_ack(
                    self.conn_id,
                    codec::ack_header::PUBREL,
                    packet_id,
                    reason::PACKET_IDENTIFIER_NOT_FOUND,
                );
            }
        } else {
            self.session.complete(self.conn_id, packet_id);
        }
    }

    /// Takes a DISCONNECT's session expiry and closes the session; how the connection ended.
    fn disconnect(&mut self, d: &codec::Disconnect) -> Result<End, Violation> {
        if let Some(new_expiry) = d.properties.session_expiry_interval {
            if self.session_expiry == 0 && new_expiry != 0 {
                return Err(Violation(reason::PROTOCOL_ERROR));
            }
            let granted = new_expiry.min(self.inner.config.max_session_expiry);
            self.session_expiry = granted;
            self.session.state.lock().expiry_interval = granted;
        }
        self.session.close(self.conn_id, None);
        Ok(if d.reason_code == reason::DISCONNECT_WITH_WILL {
            End::Abnormal
        } else {
            End::Normal
        })
    }

    /// Checks and routes a PUBLISH, and acknowledges it unless a service claims its topic: then
    /// it is returned, for [`Conn::hand_over`]. Not `async`, so the packet is not moved
    /// into a future of its own on its way.
    fn publish(&mut self, mut p: codec::Publish) -> Result<Option<Handoff>, Violation> {
        let v5 = self.v5();
        // Topic alias.
        if let Some(alias) = p.properties.topic_alias.take() {
            let max = self.inner.config.topic_alias_maximum;
            if alias == 0 || alias > max {
                return Err(Violation(reason::TOPIC_ALIAS_INVALID));
            }
            let idx = usize::from(alias - 1);
            if self.aliases.len() <= idx {
                self.aliases.resize(idx + 1, None);
            }
            if p.topic.is_empty() {
                match &self.aliases[idx] {
                    Some(t) => p.topic = t.clone(),
                    None => return Err(Violation(reason::PROTOCOL_ERROR)),
                }
            } else {
                self.aliases[idx] = Some(p.topic.clone());
            }
        } else if p.topic.is_empty() {
            return Err(Violation(if v5 {
                reason::PROTOCOL_ERROR
            } else {
                reason::MALFORMED_PACKET
            }));
        }
        if !topic::valid_topic_name(&p.topic) {
            return Err(Violation(reason::TOPIC_NAME_INVALID));
        }
        if p.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| !topic::valid_topic_name(t))
        {
            return Err(Violation(reason::PROTOCOL_ERROR));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            return Err(Violation(reason::PROTOCOL_ERROR));
        }
        let bad_payload = p.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&p.payload).is_err();
        if bad_payload && p.qos == QoS::AtMostOnce {
            return Err(Violation(reason::PAYLOAD_FORMAT_INVALID));
        }
        if p.retain && !p.payload.is_empty() && !self.inner.retained_room(&p.topic, &p.payload) {
            // Refused whole (not published either): the retained messages are at their limit.
            tracing::debug!(client_id = %self.client_id, topic = %p.topic, "retained message over the limit refused");
            if let Some(ack) = ack_for(p.qos, p.packet_id, reason::QUOTA_EXCEEDED) {
                self.acknowledge(ack);
            }
            return Ok(None);
        }
        if p.qos == QoS::ExactlyOnce {
            let mut st = self.session.state.lock();
            if st.incoming_qos2.contains(&p.packet_id) {
                // A redelivery of a message already accepted: acknowledge it again only.
                drop(st);
                self.acknowledge(PendingAck {
                    rec: true,
                    packet_id: p.packet_id,
                    reason_code: reason::SUCCESS,
                });
                return Ok(None);
            }
            if st.incoming_qos2.len() >= usize::from(self.inner.config.receive_maximum) {
                return Err(Violation(reason::RECEIVE_MAXIMUM_EXCEEDED));
            }
            if !bad_payload {
                st.incoming_qos2.insert(p.packet_id);
            }
        }
        let mut code = reason::SUCCESS;
        self.inner.renew_service_claims(&mut self.services);
        if bad_payload {
            code = reason::PAYLOAD_FORMAT_INVALID;
        } else if let Some(service) = self.services.find(&p.topic) {
            let service = service.clone();
            let sp = ServicePublish {
                topic: p.topic,
                payload: p.payload,
                qos: p.qos,
                properties: p.properties,
                from: self.ident.clone(),
            };
            return Ok(Some(Handoff {
                service,
                publish: sp,
                ack: ack_for(p.qos, p.packet_id, code),
            }));
        } else {
            let msg = Arc::new(Message {
                expires_at: p
                    .properties
                    .message_expiry_interval
                    .map(|s| Instant::now() + Duration::from_secs(u64::from(s))),
                topic: p.topic,
                payload: p.payload,
                qos: p.qos,
                retain: p.retain,
                properties: p.properties,
                publisher: Some(self.client_id.clone()),
            });
            self.published = true;
            if self.inner.route(msg) == 0 && v5 {
                code = reason::NO_MATCHING_SUBSCRIBERS;
            }
        }
        if let Some(ack) = ack_for(p.qos, p.packet_id, code) {
            self.acknowledge(ack);
        }
        Ok(None)
    }

    /// Sends an acknowledgement, after the answers and acknowledgements of the publishes still
    /// queued: they arrived first.
    fn acknowledge(&mut self, ack: PendingAck) {
        self.finished(None, Some(ack));
    }

    /// A publish whose work is done: its answer is published and its acknowledgement sent now,
    /// or after those of the publishes still queued.
    fn finished(&mut self, answer: Option<OutboundMessage>, ack: Option<PendingAck>) {
        if self.queued.is_empty() {
            self.answer_and_ack(answer, ack);
        } else if answer.is_some() || ack.is_some() {
            self.queued.push_back(Queued {
                work: Work::Done(answer),
                ack,
            });
        }
    }

    fn answer_and_ack(&self, answer: Option<OutboundMessage>, ack: Option<PendingAck>) {
        if let Some(answer) = answer {
            self.inner.publish(answer);
        }
        if let Some(ack) = ack {
            self.session
                .send_ack(self.conn_id, ack.header(), ack.packet_id, ack.reason_code);
        }
    }

    /// How many publishes may be queued (under way or waiting) before the next one waits.
    fn work_limit(&self) -> usize {
        usize::from(self.inner.config.receive_maximum).max(1)
    }

    /// Waits until fewer than [`Conn::work_limit`] publishes are queued.
    async fn wait_for_room(&mut self) {
        while self.queued.len() >= self.work_limit() {
            std::future::poll_fn(|cx| self.poll_queued(cx)).await;
        }
    }

    /// Hands a publish to its service and goes on: its acknowledgement is sent once the work
    /// has finished and the earlier publishes have been acknowledged (see [`crate::service`]).
    fn hand_over(&mut self, handoff: Handoff, cx: &mut Context<'_>) {
        let Handoff {
            service,
            publish,
            ack,
        } = handoff;
        let was_empty = self.queued.is_empty();
        let work = if matches!(
            self.queued.back(),
            Some(Queued {
                work: Work::NotStarted(..),
                ..
            })
        ) {
            // Behind a publish that waits for its turn: so does this one.
            Work::NotStarted(Box::new(publish), service)
        } else {
            let earlier = !self.queued.is_empty();
            self.start(&service, publish, earlier, cx)
        };
        match work {
            Work::Done(answer) => self.finished(answer, ack),
            work => {
                // A publish left waiting to start may be started alongside on the next look.
                self.front_fresh = match work {
                    Work::Running(_) => self.front_fresh || was_empty,
                    _ => false,
                };
                self.queued.push_back(Queued { work, ack });
            }
        }
    }

    /// Offers a publish to its service; a future it returns is polled once at once, so the
    /// work starts in arrival order.
    fn start(
        &mut self,
        service: &Arc<dyn Service>,
        publish: ServicePublish,
        earlier_running: bool,
        cx: &mut Context<'_>,
    ) -> Work {
        // Output stays deferred while a service works, so an answer queued in the poll that
        // finishes it goes out with its acknowledgement, in one write.
        self.session.defer(self.conn_id);
        match service.on_publish(publish, earlier_running) {
            Handled::Done(answer) => Work::Done(answer),
            Handled::AfterEarlier(publish) if earlier_running => {
                Work::NotStarted(publish, service.clone())
            }
            Handled::AfterEarlier(publish) => {
                // Nothing earlier is under way: a service that hands it back anyway would see
                // it again at once, for ever. Dropped, as a service error.
                tracing::warn!(client_id = %self.client_id, topic = %publish.topic, "a service handed back a publish with nothing before it; dropped");
                Work::Done(None)
            }
            Handled::Running(future) => self.poll_work(future, cx),
        }
    }

    /// Polls a service's future once.
    fn poll_work(&mut self, mut future: ServiceFuture, cx: &mut Context<'_>) -> Work {
        match self.waker.poll(&mut future, cx) {
            Poll::Ready(answer) => Work::Done(answer),
            Poll::Pending => Work::Running(future),
        }
    }

    /// Polls the queued publishes' work in order, answering and acknowledging each finished one
    /// whose turn it is, and starts those not started yet once the service lets them. Ready
    /// once at least one was acknowledged.
    fn poll_queued(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.front_fresh = false;
        let before = self.queued.len();
        // Output is deferred (and flushed at the end) only once there is some: most polls find
        // the oldest publish still under way and have nothing to write.
        let mut deferred = false;
        // The oldest publish's work is polled where it lies in the queue: an entry is a few
        // hundred bytes, and most polls leave it there.
        while let Some(front) = self.queued.front_mut() {
            let answer = match &mut front.work {
                Work::Done(answer) => answer.take(),
                Work::Running(future) => match self.waker.poll(future, cx) {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => break,
                },
                Work::NotStarted(..) => {
                    // Everything before it has finished: its turn.
                    let Some(Queued {
                        work: Work::NotStarted(publish, service),
                        ack,
                    }) = self.queued.pop_front()
                    else {
                        break;
                    };
                    deferred = true;
                    match self.start(&service, *publish, false, cx) {
                        Work::Done(answer) => self.answer_and_ack(answer, ack),
                        work => {
                            self.queued.push_front(Queued { work, ack });
                            break;
                        }
                    }
                    continue;
                }
            };
            let ack = front.ack;
            self.queued.pop_front();
            if !deferred {
                self.session.defer(self.conn_id);
                deferred = true;
            }
            self.answer_and_ack(answer, ack);
        }
        deferred |= self.start_alongside(cx);
        if deferred {
            self.flush_inline();
        }
        if self.queued.len() < before {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Starts the publishes that wait for their turn while the service lets them run alongside
    /// the ones under way before them (writes behind writes, say), oldest first. Returns
    /// whether it offered any to the service (which defers output, see [`Conn::start`]).
    fn start_alongside(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(first) = self
            .queued
            .iter()
            .position(|q| matches!(q.work, Work::NotStarted(..)))
        else {
            return false;
        };
        if first == 0 {
            return false;
        }
        for at in first..self.queued.len() {
            let Some(queued) = self.queued.get_mut(at) else {
                break;
            };
            let Work::NotStarted(publish, service) =
                std::mem::replace(&mut queued.work, Work::Done(None))
            else {
                break;
            };
            let work = self.start(&service, *publish, true, cx);
            let still_waiting = matches!(work, Work::NotStarted(..));
            if let Some(queued) = self.queued.get_mut(at) {
                queued.work = work;
            }
            if still_waiting {
                break;
            }
        }
        true
    }

    /// Waits until every queued publish has finished and been acknowledged.
    async fn finish_queued(&mut self) {
        while !self.queued.is_empty() {
            std::future::poll_fn(|cx| self.poll_queued(cx)).await;
        }
    }

    /// The connection has ended: work under way runs to completion on its own and its answers
    /// are published (a persistent session keeps them); publishes not started are dropped,
    /// unacknowledged.
    fn let_running_finish(&mut self) {
        for queued in self.queued.drain(..) {
            let inner = self.inner.clone();
            match queued.work {
                Work::Running(future) => {
                    tokio::spawn(async move {
                        if let Some(answer) = future.await {
                            inner.publish(answer);
                        }
                    });
                }
                Work::Done(Some(answer)) => {
                    inner.publish(answer);
                }
                Work::Done(None) | Work::NotStarted(..) => {}
            }
        }
    }

    fn subscribe(&mut self, s: codec::Subscribe) -> Result<(), Violation> {
        let identifier = s.properties.subscription_identifiers.first().copied();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut retained = Vec::new();
        for (filter, opts) in &s.filters {
            let Some(spec) = topic::parse_filter(filter) else {
                codes.push(reason::TOPIC_FILTER_INVALID);
                continue;
            };
            if spec.group.is_some() && opts.no_local {
                return Err(Violation(reason::PROTOCOL_ERROR));
            }
            let existed = self
                .inner
                .subscribe(&self.session, filter, *opts, identifier);
            codes.push(opts.qos as u8);
            let send_retained = spec.group.is_none()
                && match opts.retain_handling {
                    0 => true,
                    1 => !existed,
                    _ => false,
                };
            if send_retained {
                for m in self.inner.retained_matching(spec.filter) {
                    retained.push(Delivery {
                        qos: m.qos.min(opts.qos),
                        message: m,
                        retain: true,
                        subscription_ids: identifier.into_iter().collect(),
                    });
                }
            }
        }
        self.send(Packet::SubAck(codec::SubAck {
            packet_id: s.packet_id,
            properties: Properties::default(),
            reason_codes: codes,
        }));
        let limits = self.inner.queue_limits();
        for d in retained {
            self.session.enqueue(d, limits);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Connections moving between threads (see [`Conn::try_move`]), and requests that reach a
    //! connection whose client has gone quiet, with raw MQTT 5 clients.

    use std::time::Duration;

    use bytes::{Buf, BufMut, BytesMut};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use crate::broker::Broker;
    use crate::codec::{self, Packet, Properties, QoS, SubscriptionOptions};
    use crate::config::BrokerConfig;

    const LIMIT: Duration = Duration::from_secs(20);

    struct Client {
        stream: TcpStream,
        buf: BytesMut,
    }

    impl Client {
        async fn connect(addr: std::net::SocketAddr, id: &str) -> Client {
            let stream = TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let mut c = Client {
                stream,
                buf: BytesMut::new(),
            };
            c.send(Packet::Connect(Box::new(codec::Connect::v5(id, 60))))
                .await;
            let (kind, _) = c.frame().await;
            assert_eq!(kind, 2, "CONNACK");
            c
        }

        async fn send(&mut self, p: Packet) {
            let mut out = BytesMut::new();
            p.encode(&mut out, codec::V5);
            self.stream.write_all(&out).await.expect("write");
        }

        async fn subscribe(&mut self, filter: &str, qos: QoS) {
            self.send(Packet::Subscribe(codec::Subscribe {
                packet_id: 1,
                properties: Properties::default(),
                filters: vec![(
                    filter.to_owned(),
                    SubscriptionOptions {
                        qos,
                        ..Default::default()
                    },
                )],
            }))
            .await;
            let (kind, _) = self.frame().await;
            assert_eq!(kind, 9, "SUBACK");
        }

        /// The next packet's type and its whole bytes.
        async fn frame(&mut self) -> (u8, BytesMut) {
            tokio::time::timeout(LIMIT, async {
                loop {
                    if let Some(len) = whole_frame(&self.buf) {
                        let frame = self.buf.split_to(len);
                        return (frame[0] >> 4, frame);
                    }
                    let n = self.stream.read_buf(&mut self.buf).await.expect("read");
                    assert!(n > 0, "the broker closed the connection");
                }
            })
            .await
            .expect("a packet in time")
        }

        /// The payloads of the next `n` publishes, acknowledging those sent at QoS 1.
        async fn receive(&mut self, n: usize) -> Vec<u32> {
            let mut got = Vec::with_capacity(n);
            while got.len() < n {
                let (kind, mut frame) = self.frame().await;
                if kind != 3 {
                    continue;
                }
                let Ok(Some(Packet::Publish(p))) =
                    codec::decode(&mut frame, Some(codec::V5), usize::MAX)
                else {
                    panic!("undecodable PUBLISH");
                };
                if p.qos == QoS::AtLeastOnce {
                    self.send(Packet::PubAck(codec::Ack {
                        packet_id: p.packet_id,
                        ..Default::default()
                    }))
                    .await;
                }
                got.push(p.payload.clone().get_u32());
            }
            got
        }

        /// Publishes `seq` at QoS 1 in one write, then waits for every PUBACK.
        async fn publish_all(&mut self, topic: &str, seq: std::ops::Range<u32>) {
            let mut out = BytesMut::new();
            let count = seq.len();
            for (i, n) in seq.enumerate() {
                let mut payload = BytesMut::new();
                payload.put_u32(n);
                Packet::Publish(codec::Publish {
                    dup: false,
                    qos: QoS::AtLeastOnce,
                    retain: false,
                    topic: topic.to_owned(),
                    packet_id: u16::try_from(i % 60_000 + 1).expect("id"),
                    properties: Properties::default(),
                    payload: payload.freeze(),
                })
                .encode(&mut out, codec::V5);
            }
            self.stream.write_all(&out).await.expect("write");
            let mut acked = 0;
            while acked < count {
                let (kind, _) = self.frame().await;
                if kind == 4 {
                    acked += 1;
                }
            }
        }
    }

    /// The length of the whole packet at the front of `buf`, if it is all there.
    fn whole_frame(buf: &[u8]) -> Option<usize> {
        let mut len = 0usize;
        for i in 0..4 {
            let b = *buf.get(1 + i)?;
            len |= usize::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                let total = 2 + i + len;
                return (buf.len() >= total).then_some(total);
            }
        }
        None
    }

    #[test]
    fn a_read_room_grows_with_what_the_connection_sends_and_shrinks_when_idle() {
        let mut room = super::ReadRoom::new();
        let mut buf = BytesMut::new();
        // A new connection gets the small chunk.
        let r = room.make(&mut buf);
        assert!(
            (super::ReadRoom::MIN..2 * super::ReadRoom::MIN).contains(&r),
            "{r}"
        );
        // Reads that leave room change nothing until the largest chunk's worth has come.
        room.read(100, r);
        assert_eq!(room.chunk, super::ReadRoom::MIN);
        // A read that filled its room doubles the chunk, up to the largest.
        room.read(r, r);
        assert_eq!(room.chunk, 2 * super::ReadRoom::MIN);
        for _ in 0..10 {
            room.read(1, 1);
        }
        assert_eq!(room.chunk, super::ReadRoom::MAX);
        buf.put_bytes(0, 10);
        let r = room.make(&mut buf);
        assert!(r >= super::ReadRoom::MAX, "{r}");
        // Idle with bytes of a packet still buffered: the buffer is kept, the chunk starts over.
        room.idle(&mut buf);
        assert_eq!((buf.len(), room.chunk), (10, super::ReadRoom::MIN));
        // Idle and empty: a grown buffer is given back.
        buf.clear();
        room.idle(&mut buf);
        assert!(buf.capacity() <= super::ReadRoom::MIN, "{}", buf.capacity());
        // Small reads add up: the largest chunk's worth in all grows the chunk to the largest.
        let mut room = super::ReadRoom::new();
        for _ in 0..super::ReadRoom::MAX / 100 {
            room.read(100, 1000);
        }
        assert_eq!(room.chunk, super::ReadRoom::MIN);
        room.read(100, 1000);
        assert_eq!(room.chunk, super::ReadRoom::MAX);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn packets_much_larger_than_the_first_read_room_arrive_whole() {
        let (_broker, addr) = broker(true).await;
        let mut sub = Client::connect(addr, "big-sub").await;
        sub.subscribe("big/#", QoS::AtLeastOnce).await;
        let mut publisher = Client::connect(addr, "big-pub").await;
        // In one write: a publish of 100 KiB, then 50 small ones, then another large one.
        let sizes: Vec<usize> = std::iter::once(100 * 1024)
            .chain(std::iter::repeat_n(20, 50))
            .chain(std::iter::once(60 * 1024))
            .collect();
        // Each payload differs from the others, so one delivered in place of another shows.
        let payload = |i: usize, size: usize| -> Vec<u8> {
            (0..size).map(|b| (b % 251) as u8 ^ i as u8).collect()
        };
        let mut out = BytesMut::new();
        for (i, &size) in sizes.iter().enumerate() {
            Packet::Publish(codec::Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: "big/t".to_owned(),
                packet_id: u16::try_from(i + 1).expect("id"),
                properties: Properties::default(),
                payload: payload(i, size).into(),
            })
            .encode(&mut out, codec::V5);
        }
        publisher.stream.write_all(&out).await.expect("write");
        for (i, &size) in sizes.iter().enumerate() {
            let (kind, mut frame) = sub.frame().await;
            assert_eq!(kind, 3, "PUBLISH {i}");
            let Ok(Some(Packet::Publish(p))) =
                codec::decode(&mut frame, Some(codec::V5), usize::MAX)
            else {
                panic!("undecodable PUBLISH {i}");
            };
            assert!(
                p.payload[..] == payload(i, size)[..],
                "payload {i} of {size} bytes"
            );
            sub.send(Packet::PubAck(codec::Ack {
                packet_id: p.packet_id,
                ..Default::default()
            }))
            .await;
        }
    }

    async fn broker(co_locate: bool) -> (Broker, std::net::SocketAddr) {
        let broker = Broker::new(BrokerConfig {
            connection_threads: 2,
            co_locate,
            ..BrokerConfig::default()
        })
        .expect("broker");
        let addr = broker
            .listen("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("listen");
        (broker, addr)
    }

    fn home(broker: &Broker, id: &str) -> usize {
        let session = broker.inner.sessions.lock().get(id).cloned();
        session.expect("session").home()
    }

    /// A publisher and six subscribers (three at QoS 1, three at QoS 0, which never send the
    /// broker anything to wake their reader); at least one subscriber starts on the other
    /// connection thread. Returns the subscribers' ids.
    async fn fan_out(
        broker: &Broker,
        addr: std::net::SocketAddr,
    ) -> (Client, Vec<(String, Client)>) {
        let mut subs = Vec::new();
        for i in 0..6 {
            let id = format!("sub-{i}");
            let mut c = Client::connect(addr, &id).await;
            let qos = if i % 2 == 0 {
                QoS::AtLeastOnce
            } else {
                QoS::AtMostOnce
            };
            c.subscribe("fan/#", qos).await;
            subs.push((id, c));
        }
        let publisher = Client::connect(addr, "pub").await;
        let p = home(broker, "pub");
        assert!(
            subs.iter().any(|(id, _)| home(broker, id) != p),
            "no subscriber starts on another thread than the publisher"
        );
        (publisher, subs)
    }

    /// Every subscriber of a one-publisher fan-out ends up on the publisher's thread, and each
    /// receives every message once, in order, while it moves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subscribers_move_to_their_publishers_thread_and_lose_nothing() {
        let (broker, addr) = broker(true).await;
        let (mut publisher, subs) = fan_out(&broker, addr).await;
        const N: u32 = 3_000;
        let readers: Vec<_> = subs
            .into_iter()
            .map(|(id, mut c)| {
                tokio::spawn(async move {
                    let got = c.receive(N as usize).await;
                    (id, got, c)
                })
            })
            .collect();
        for chunk in 0..(N / 500) {
            publisher
                .publish_all("fan/x", chunk * 500..(chunk + 1) * 500)
                .await;
        }
        let p = home(&broker, "pub");
        for reader in readers {
            let (id, got, _client) = reader.await.expect("reader");
            assert_eq!(
                got,
                (0..N).collect::<Vec<_>>(),
                "{id} received every message once, in order"
            );
            assert_eq!(
                home(&broker, &id),
                p,
                "{id} moved to the publisher's thread"
            );
        }
        broker.shutdown(Duration::from_secs(1)).await;
    }

    /// With `co_locate` off nobody moves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_co_location_connections_stay() {
        let (broker, addr) = broker(false).await;
        let (mut publisher, subs) = fan_out(&broker, addr).await;
        let before: Vec<usize> = subs.iter().map(|(id, _)| home(&broker, id)).collect();
        let readers: Vec<_> = subs
            .into_iter()
            .map(|(_, mut c)| {
                tokio::spawn(async move {
                    let got = c.receive(1_000).await;
                    (got, c)
                })
            })
            .collect();
        publisher.publish_all("fan/x", 0..1_000).await;
        let mut clients = Vec::new();
        for reader in readers {
            let (got, client) = reader.await.expect("reader");
            assert_eq!(got, (0..1_000).collect::<Vec<_>>());
            clients.push(client);
        }
        let after: Vec<usize> = (0..6).map(|i| home(&broker, &format!("sub-{i}"))).collect();
        assert_eq!(before, after);
        broker.shutdown(Duration::from_secs(1)).await;
    }

    /// Two clients that answer each other from different threads end up on one thread, the
    /// earlier one, instead of trading places.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_and_response_pair_meets_on_one_thread() {
        let (broker, addr) = broker(true).await;
        // Clients until two of them are served by different threads.
        let mut clients: Vec<(String, Client)> = Vec::new();
        for i in 0..8 {
            let id = format!("peer-{i}");
            let c = Client::connect(addr, &id).await;
            clients.push((id, c));
        }
        let on = |t: usize| {
            clients
                .iter()
                .position(|(id, _)| home(&broker, id) == t)
                .expect("a client on each thread")
        };
        let (a, b) = (on(1), on(2));
        let (a_id, b_id) = (clients[a].0.clone(), clients[b].0.clone());
        clients[a]
            .1
            .subscribe("pair/response", QoS::AtLeastOnce)
            .await;
        clients[b]
            .1
            .subscribe("pair/request", QoS::AtLeastOnce)
            .await;
        for n in 0..1_000u32 {
            clients[a].1.publish_all("pair/request", n..n + 1).await;
            assert_eq!(clients[b].1.receive(1).await, vec![n]);
            clients[b].1.publish_all("pair/response", n..n + 1).await;
            assert_eq!(clients[a].1.receive(1).await, vec![n]);
        }
        assert_eq!(
            home(&broker, &a_id),
            1,
            "the requester stayed on the earlier thread"
        );
        assert_eq!(home(&broker, &b_id), 1, "the responder moved to it");
        broker.shutdown(Duration::from_secs(1)).await;
    }

    /// A subscriber fed by publishers on both threads stays where it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscriber_fed_from_both_threads_stays() {
        let (broker, addr) = broker(true).await;
        let mut sub = Client::connect(addr, "sink").await;
        sub.subscribe("in/#", QoS::AtLeastOnce).await;
        let start = home(&broker, "sink");
        // Publishers until two of them are served by different threads.
        let mut pubs: Vec<(usize, Client)> = Vec::new();
        for i in 0..8 {
            let id = format!("source-{i}");
            let c = Client::connect(addr, &id).await;
            pubs.push((home(&broker, &id), c));
        }
        let a = pubs
            .iter()
            .position(|(h, _)| *h == 1)
            .expect("a publisher on thread 1");
        let b = pubs
            .iter()
            .position(|(h, _)| *h == 2)
            .expect("a publisher on thread 2");
        let reader = tokio::spawn(async move {
            let got = sub.receive(2_000).await;
            (got, sub)
        });
        for round in 0..1_000u32 {
            for (k, index) in [a, b].into_iter().enumerate() {
                let n = round * 2 + u32::try_from(k).expect("k");
                pubs[index].1.publish_all("in/x", n..n + 1).await;
            }
        }
        let (got, _sub) = reader.await.expect("reader");
        assert_eq!(got, (0..2_000).collect::<Vec<_>>());
        assert_eq!(home(&broker, "sink"), start, "the subscriber did not move");
        broker.shutdown(Duration::from_secs(1)).await;
    }

    /// Connects and exchanges one PINGREQ, after which the client says nothing more.
    async fn gone_quiet(addr: std::net::SocketAddr, id: &str) -> Client {
        let mut c = Client::connect(addr, id).await;
        c.send(Packet::PingReq).await;
        let (kind, _) = c.frame().await;
        assert_eq!(kind, 13, "PINGRESP");
        c
    }

    /// Reads until the broker closes; the DISCONNECT reason code, if one came.
    async fn disconnect_reason(c: &mut Client) -> Option<u8> {
        let _ = tokio::time::timeout(LIMIT, async {
            while c.stream.read_buf(&mut c.buf).await.is_ok_and(|n| n > 0) {}
        })
        .await;
        (c.buf.first().map(|b| b >> 4) == Some(14)).then(|| c.buf.get(2).copied().unwrap_or(0))
    }

    /// Shutdown reaches a client that has gone quiet at once, not after the grace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_client_hears_of_shutdown() {
        let (broker, addr) = broker(true).await;
        let mut c = gone_quiet(addr, "quiet").await;
        // A grace far longer than the wait: a shutdown that waited it out would not end in time.
        let shutdown = broker.shutdown(Duration::from_secs(600));
        tokio::time::timeout(Duration::from_secs(60), shutdown)
            .await
            .expect("shutdown waited out its grace for a silent client");
        assert_eq!(
            disconnect_reason(&mut c).await,
            Some(codec::reason::SERVER_SHUTTING_DOWN)
        );
    }

    /// A quiet client's connection, taken over by a new one for the same client id, hears of it
    /// at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_client_taken_over_is_told_at_once() {
        let (broker, addr) = broker(true).await;
        let mut first = gone_quiet(addr, "twice").await;
        let started = std::time::Instant::now();
        let _second = Client::connect(addr, "twice").await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the new connection waited for the silent one"
        );
        assert_eq!(
            disconnect_reason(&mut first).await,
            Some(codec::reason::SESSION_TAKEN_OVER)
        );
        broker.shutdown(Duration::from_secs(1)).await;
    }
}
