//! The TCP socket under a TLS session, which can be taken off its connection thread's poller
//! and registered with another thread's while the TLS session over it stays whole: how a TLS
//! connection moves between threads (see `connection::Conn::try_move`).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP socket registered with the poller of the thread serving it, or, while it moves, with
/// none. Reads and writes while it moves fail with `NotConnected`; nothing makes any, since the
/// connection's tasks are stopped first.
#[derive(Debug)]
pub struct Socket(Option<TcpStream>);

impl Socket {
    pub(crate) fn new(tcp: TcpStream) -> Socket {
        Socket(Some(tcp))
    }

    /// Takes the socket off this thread's poller, for [`Socket::attach`] on another thread.
    pub(crate) fn detach(&mut self) -> std::io::Result<std::net::TcpStream> {
        match self.0.take() {
            Some(tcp) => tcp.into_std(),
            None => Err(moving()),
        }
    }

    /// Puts back the socket [`Socket::detach`] took, registered on the calling thread.
    pub(crate) fn attach(&mut self, tcp: TcpStream) {
        self.0 = Some(tcp);
    }

    /// The socket's descriptor; none while it moves.
    pub(crate) fn raw_fd(&self) -> Option<RawFd> {
        self.0.as_ref().map(AsRawFd::as_raw_fd)
    }

    fn live(self: Pin<&mut Self>) -> std::io::Result<Pin<&mut TcpStream>> {
        match &mut self.get_mut().0 {
            Some(tcp) => Ok(Pin::new(tcp)),
            None => Err(moving()),
        }
    }
}

fn moving() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the connection is moving between threads",
    )
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.live() {
            Ok(tcp) => tcp.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.live() {
            Ok(tcp) => tcp.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.live() {
            Ok(tcp) => tcp.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.live() {
            Ok(tcp) => tcp.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.live() {
            Ok(tcp) => tcp.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}
