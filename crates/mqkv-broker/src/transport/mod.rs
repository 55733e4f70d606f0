//! The byte streams a client connection runs over: plain TCP, TLS, and WebSocket over either.
//!
//! A listener says which ([`Transport`]); `accept` runs the TLS and WebSocket handshakes on an
//! accepted socket and gives a `Stream`, which a connection splits into a `ReadHalf` and a
//! `WriteHalf`. The connection reads and writes MQTT bytes through these and does not look
//! behind them: packets split across WebSocket frames, or several in one frame, reach it as one
//! stream of bytes.

pub mod forwarded;
mod io;
pub mod origin;
pub mod proxy;
mod quickack;
mod socket;
pub mod tls;
pub mod ws;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub use forwarded::Forwarded;
pub use io::Io;
pub use origin::Origins;
pub use proxy::ProxyProtocol;
pub(crate) use quickack::only_acknowledgements;
pub use socket::Socket;
pub use tls::{PeerCertificate, Tls, TlsError, TlsFiles, TlsVersion};

/// How clients reach a listener.
#[derive(Debug, Clone)]
pub enum Transport {
    /// MQTT straight over TCP.
    Tcp,
    /// MQTT over TLS.
    Tls(Arc<Tls>),
    /// MQTT over WebSocket, upgraded from an HTTP request for `path`, trusting web pages of
    /// `origins` as well as its own, and the forwarding headers of the proxies `forwarded`
    /// names.
    Ws {
        path: String,
        origins: Origins,
        forwarded: Option<Forwarded>,
    },
    /// MQTT over WebSocket over TLS.
    Wss {
        tls: Arc<Tls>,
        path: String,
        origins: Origins,
        forwarded: Option<Forwarded>,
    },
}

impl Transport {
    /// The short name used in configuration and logs: `tcp`, `tls`, `ws` or `wss`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls(_) => "tls",
            Transport::Ws { .. } => "ws",
            Transport::Wss { .. } => "wss",
        }
    }

    /// Whether traffic on it is encrypted.
    pub fn is_secure(&self) -> bool {
        matches!(self, Transport::Tls(_) | Transport::Wss { .. })
    }

    /// The proxies whose forwarding headers a WebSocket listener takes, if it takes any.
    pub fn forwarded(&self) -> Option<&Forwarded> {
        match self {
            Transport::Ws { forwarded, .. } | Transport::Wss { forwarded, .. } => {
                forwarded.as_ref()
            }
            _ => None,
        }
    }
}

/// Why a transport handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("WebSocket upgrade refused: {0}")]
    WebSocket(#[from] ws::UpgradeError),
}

/// An accepted connection once its transport's handshakes are done.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<Socket>>),
    Ws(Box<WebSocketStream<Io>>),
}

/// An accepted connection once its transport's handshakes are done.
pub(crate) struct Accepted {
    pub stream: Stream,
    /// The client certificate TLS verified, if any.
    pub certificate: Option<PeerCertificate>,
    /// The origin of the web page a WebSocket client runs in, where the listener neither
    /// serves nor lists it: such a client is not local, wherever its browser runs.
    pub foreign_page: Option<String>,
    /// The client behind a WebSocket proxy, as its forwarding headers name it.
    pub forwarded_client: Option<SocketAddr>,
}

/// Runs the handshakes `transport` needs on a socket accepted from `peer`: TLS, then the
/// WebSocket upgrade. `max_message` bounds a WebSocket message (and frame).
pub(crate) async fn accept(
    tcp: TcpStream,
    peer: SocketAddr,
    transport: &Transport,
    max_message: usize,
) -> Result<Accepted, AcceptError> {
    let plain = |stream, certificate| Accepted {
        stream,
        certificate,
        foreign_page: None,
        forwarded_client: None,
    };
    let upgraded = |u: ws::Upgraded, certificate| Accepted {
        stream: Stream::Ws(Box::new(u.ws)),
        certificate,
        foreign_page: u.foreign_page,
        forwarded_client: u.client,
    };
    Ok(match transport {
        Transport::Tcp => plain(Stream::Tcp(tcp), None),
        Transport::Tls(tls) => {
            let stream = tls.accept(tcp).await.map_err(AcceptError::Tls)?;
            let cert = tls::peer_certificate(stream.get_ref().1);
            plain(Stream::Tls(Box::new(stream)), cert)
        }
        Transport::Ws {
            path,
            origins,
            forwarded,
        } => {
            let endpoint = ws::Endpoint {
                path,
                origins,
                forwarded: forwarded.as_ref(),
                secure: false,
            };
            let u = ws::upgrade(Io::Tcp(tcp), &endpoint, peer, max_message).await?;
            upgraded(u, None)
        }
        Transport::Wss {
            tls,
            path,
            origins,
            forwarded,
        } => {
            let stream = tls.accept(tcp).await.map_err(AcceptError::Tls)?;
            let cert = tls::peer_certificate(stream.get_ref().1);
            let endpoint = ws::Endpoint {
                path,
                origins,
                forwarded: forwarded.as_ref(),
                secure: true,
            };
            let io = Io::Tls(Box::new(stream));
            let u = ws::upgrade(io, &endpoint, peer, max_message).await?;
            upgraded(u, cert)
        }
    })
}

impl Stream {
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Tls(s) => {
                let io = Io::Tls(s);
                let fd = io.raw_fd();
                let (r, w) = tokio::io::split(io);
                (ReadHalf::Io(r, fd), WriteHalf::Io(w))
            }
            Stream::Ws(s) => {
                let fd = s.get_ref().raw_fd();
                let (w, r) = (*s).split();
                (ReadHalf::Ws(r, fd), WriteHalf::Ws(w))
            }
        }
    }
}

/// The reading side of a connection. Over TLS and WebSocket it keeps the descriptor of the
/// TCP socket beneath, for [`ReadHalf::ack_at_once`]; the half keeps that socket open.
pub(crate) enum ReadHalf {
    Tcp(OwnedReadHalf),
    Io(tokio::io::ReadHalf<Io>, Option<RawFd>),
    Ws(
        futures_util::stream::SplitStream<WebSocketStream<Io>>,
        Option<RawFd>,
    ),
}

/// The writing side of a connection.
pub(crate) enum WriteHalf {
    Tcp(OwnedWriteHalf),
    Io(tokio::io::WriteHalf<Io>),
    Ws(futures_util::stream::SplitSink<WebSocketStream<Io>, Message>),
}

impl ReadHalf {
    /// Appends what arrives next to `buf`, waiting for it; 0 when the peer closed the
    /// connection. Cancel safe: dropped before it completes, it has taken nothing.
    pub(crate) async fn read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        match self {
            ReadHalf::Tcp(r) => r.read_buf(buf).await,
            ReadHalf::Io(r, _) => r.read_buf(buf).await,
            ReadHalf::Ws(r, _) => loop {
                match r.next().await {
                    None => return Ok(0),
                    Some(Ok(m)) => {
                        if let Some(n) = ws::take(m, buf)? {
                            return Ok(n);
                        }
                    }
                    Some(Err(e)) => return Err(ws::io_error(e)),
                }
            },
        }
    }

    /// Appends what has arrived already to `buf`, without waiting: `WouldBlock` when nothing
    /// has.
    pub(crate) fn try_read_buf(&mut self, buf: &mut BytesMut) -> std::io::Result<usize> {
        let would_block = || Err(std::io::ErrorKind::WouldBlock.into());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self {
            ReadHalf::Tcp(r) => r.try_read_buf(buf),
            ReadHalf::Io(r, _) => {
                let room = buf.spare_capacity_mut();
                let mut rb = ReadBuf::uninit(room);
                match std::pin::Pin::new(r).poll_read(&mut cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        // SAFETY: `poll_read` initialised the first `n` bytes of the spare room.
                        unsafe { buf.set_len(buf.len() + n) };
                        Ok(n)
                    }
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => would_block(),
                }
            }
            ReadHalf::Ws(r, _) => loop {
                match r.poll_next_unpin(&mut cx) {
                    Poll::Pending => return would_block(),
                    Poll::Ready(None) => return Ok(0),
                    Poll::Ready(Some(Ok(m))) => {
                        if let Some(n) = ws::take(m, buf)? {
                            return Ok(n);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => return Err(ws::io_error(e)),
                }
            },
        }
    }

    /// Has the kernel acknowledge what was read at once (see [`quickack`]): for input that
    /// holds only acknowledgements, which get no answer to carry the ACK.
    pub(crate) fn ack_at_once(&self) {
        let fd = match self {
            ReadHalf::Tcp(r) => Some(r.as_ref().as_raw_fd()),
            ReadHalf::Io(_, fd) | ReadHalf::Ws(_, fd) => *fd,
        };
        if let Some(fd) = fd {
            quickack::ack_at_once(fd);
        }
    }
}

impl WriteHalf {
    /// Takes as much of `buf` as the transport takes without waiting (`WouldBlock` when it
    /// takes none). TLS and WebSocket take the bytes into their own buffer, encrypted or
    /// framed; [`WriteHalf::try_flush`] then tries to send that on.
    pub(crate) fn try_write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let pending = || Err(std::io::ErrorKind::WouldBlock.into());
        match self {
            WriteHalf::Tcp(w) => w.try_write(buf),
            WriteHalf::Io(w) => match std::pin::Pin::new(w).poll_write(&mut cx, buf) {
                Poll::Ready(r) => r,
                Poll::Pending => pending(),
            },
            WriteHalf::Ws(w) => match w.poll_ready_unpin(&mut cx) {
                Poll::Ready(Ok(())) => {
                    let message = Message::Binary(Bytes::copy_from_slice(buf));
                    w.start_send_unpin(message).map_err(ws::io_error)?;
                    Ok(buf.len())
                }
                Poll::Ready(Err(e)) => Err(ws::io_error(e)),
                Poll::Pending => pending(),
            },
        }
    }

    /// Sends on what TLS or WebSocket holds in its buffer, without waiting; whether nothing is
    /// left. What is left goes out with the next [`WriteHalf::flush`].
    pub(crate) fn try_flush(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self {
            WriteHalf::Tcp(_) => true,
            WriteHalf::Io(w) => matches!(
                std::pin::Pin::new(w).poll_flush(&mut cx),
                Poll::Ready(Ok(()))
            ),
            WriteHalf::Ws(w) => matches!(w.poll_flush_unpin(&mut cx), Poll::Ready(Ok(()))),
        }
    }

    /// Sends what TLS or WebSocket holds in its buffer, waiting for the socket as needed.
    pub(crate) async fn flush(&mut self) -> std::io::Result<()> {
        match self {
            WriteHalf::Tcp(_) => Ok(()),
            WriteHalf::Io(w) => w.flush().await,
            WriteHalf::Ws(w) => w.flush().await.map_err(ws::io_error),
        }
    }

    /// Writes all of `buf` (leaving it empty), waiting for the socket as needed.
    pub(crate) async fn write_all(&mut self, buf: &mut BytesMut) -> std::io::Result<()> {
        match self {
            WriteHalf::Tcp(w) => w.write_all(buf).await?,
            WriteHalf::Io(w) => {
                w.write_all(buf).await?;
                w.flush().await?;
            }
            WriteHalf::Ws(w) => {
                let bytes: Bytes = buf.split().freeze();
                return w.send(Message::Binary(bytes)).await.map_err(ws::io_error);
            }
        }
        buf.clear();
        Ok(())
    }

    /// Closes the sending side: a TCP FIN, TLS close notify, or a WebSocket close frame.
    pub(crate) async fn shutdown(&mut self) {
        match self {
            WriteHalf::Tcp(w) => {
                let _ = w.shutdown().await;
            }
            WriteHalf::Io(w) => {
                let _ = w.shutdown().await;
            }
            WriteHalf::Ws(w) => {
                let _ = w.close().await;
            }
        }
    }
}

/// What a connection taken off its thread's poller keeps besides its socket: over TLS, the
/// TLS session, whole. [`Parked::resume`] puts the two together again on the thread it moved
/// to.
pub(crate) struct Parked(Option<Box<tokio_rustls::server::TlsStream<Socket>>>);

impl Parked {
    /// The connection's stream again, over `tcp`: the socket registered on this thread.
    pub(crate) fn resume(self, tcp: TcpStream) -> Stream {
        match self.0 {
            None => Stream::Tcp(tcp),
            Some(mut tls) => {
                tls.get_mut().0.attach(tcp);
                Stream::Tls(tls)
            }
        }
    }
}

/// Takes a connection split into `rd` and `wr` off this thread's poller, to move to another
/// thread's: its socket, and what goes with it. Plain TCP and TLS connections move. WebSocket
/// connections stay on the thread that accepted them: moving one would mean reuniting the
/// library's split halves and taking the socket from beneath its framing in the same way, which
/// is not done, since WebSocket pub/sub has not needed it. `Err` gives the halves back.
pub(crate) fn detach(
    rd: ReadHalf,
    wr: WriteHalf,
) -> Result<std::io::Result<(std::net::TcpStream, Parked)>, (ReadHalf, WriteHalf)> {
    match (rd, wr) {
        (ReadHalf::Tcp(r), WriteHalf::Tcp(w)) => match r.reunite(w) {
            Ok(s) => Ok(s.into_std().map(|s| (s, Parked(None)))),
            Err(e) => Err((ReadHalf::Tcp(e.0), WriteHalf::Tcp(e.1))),
        },
        (ReadHalf::Io(r, _), WriteHalf::Io(w)) if r.is_pair_of(&w) => match r.unsplit(w) {
            Io::Tls(mut tls) => Ok(tls.get_mut().0.detach().map(|s| (s, Parked(Some(tls))))),
            Io::Tcp(tcp) => Ok(tcp.into_std().map(|s| (s, Parked(None)))),
        },
        (r, w) => Err((r, w)),
    }
}

/// Whether a connection over these halves can move between threads (see [`detach`]).
pub(crate) fn movable(rd: &ReadHalf) -> bool {
    matches!(rd, ReadHalf::Tcp(_) | ReadHalf::Io(..))
}

/// Whether a write costs little more than its bytes: on plain TCP, not over TLS or WebSocket,
/// where each write is a record or a frame of its own (see `connection::writing::attach`).
pub(crate) fn cheap_writes(rd: &ReadHalf) -> bool {
    matches!(rd, ReadHalf::Tcp(_))
}

/// Logs a listener that accepts clients from beyond this machine without encryption.
pub fn warn_if_exposed(addr: SocketAddr, transport: &Transport) {
    if !transport.is_secure() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            kind = transport.kind(),
            "listener without TLS on a non-loopback address: credentials and data cross the network in clear"
        );
    }
}
