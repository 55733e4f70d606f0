//! TLS beneath the node-to-node links: what a link travels over, plain TCP or TLS, and the
//! TLS handshake that opens it.
//!
//! With TLS, both ends present a certificate and verify the other's against the cluster's CA
//! (mutual TLS); the node opening the link also checks that the certificate names the host of
//! the address it dialled. The secret handshake of `wire` then runs inside TLS, so a link is
//! encrypted, and its ends proved both to hold a certificate of the CA and to know the secret.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Where the TLS settings of the links come from; they may change while the node runs
/// (certificates renewed), and each new link takes the current ones.
pub trait LinkTls: Send + Sync + std::fmt::Debug {
    /// The settings links from other nodes are accepted with: this node's certificate, and
    /// the CA the other node's certificate must chain to (a certificate is required).
    fn server(&self) -> Arc<rustls::ServerConfig>;
    /// The settings links to other nodes are opened with: the CA the other node's certificate
    /// must chain to, and this node's certificate.
    fn client(&self) -> Arc<rustls::ClientConfig>;
}

type Tls = tokio_rustls::TlsStream<TcpStream>;

/// A link's byte stream.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<Tls>),
}

/// The reading half of a [`Stream`].
pub(crate) enum ReadPart {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<Box<Tls>>),
}

/// The writing half of a [`Stream`].
pub(crate) enum WritePart {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<Box<Tls>>),
}

impl Stream {
    /// Opens TLS to the node at `addr` (`host:port`) over `tcp`, with `tls`'s settings.
    pub(crate) async fn connect(
        tcp: TcpStream,
        tls: &dyn LinkTls,
        addr: &str,
    ) -> Result<Stream, String> {
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))?;
        let stream = tokio_rustls::TlsConnector::from(tls.client())
            .connect(name, tcp)
            .await
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => "TLS: the other node closed the connection in \
                     the handshake (it has no TLS settings for the links between the nodes, \
                     or refused this node's certificate)"
                    .to_owned(),
                _ => format!("TLS: {e}"),
            })?;
        Ok(Stream::Tls(Box::new(Tls::Client(stream))))
    }

    /// Accepts TLS from another node over `tcp`, with `tls`'s settings.
    pub(crate) async fn accept(tcp: TcpStream, tls: &dyn LinkTls) -> Result<Stream, String> {
        let stream = tokio_rustls::TlsAcceptor::from(tls.server())
            .accept(tcp)
            .await
            .map_err(|e| {
                let plain = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|r| {
                        matches!(
                            r,
                            rustls::Error::InvalidMessage(
                                rustls::InvalidMessage::InvalidContentType
                            )
                        )
                    });
                match plain {
                    true => "TLS: the other node has no TLS settings for the links between the \
                             nodes"
                        .to_owned(),
                    false => format!("TLS: {e}"),
                }
            })?;
        Ok(Stream::Tls(Box::new(Tls::Server(stream))))
    }

    pub(crate) fn split(self) -> (ReadPart, WritePart) {
        match self {
            Stream::Plain(tcp) => {
                let (read, write) = tcp.into_split();
                (ReadPart::Plain(read), WritePart::Plain(write))
            }
            Stream::Tls(tls) => {
                let (read, write) = tokio::io::split(tls);
                (ReadPart::Tls(read), WritePart::Tls(write))
            }
        }
    }
}

/// The host of `host:port`, without the brackets of an IPv6 address.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

impl AsyncRead for ReadPart {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadPart::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ReadPart::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WritePart {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WritePart::Plain(s) => Pin::new(s).poll_write(cx, buf),
            WritePart::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WritePart::Plain(s) => Pin::new(s).poll_flush(cx),
            WritePart::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WritePart::Plain(s) => Pin::new(s).poll_shutdown(cx),
            WritePart::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_of_an_address_is_what_its_certificate_must_name() {
        assert_eq!(host_of("10.0.0.5:7001"), "10.0.0.5");
        assert_eq!(host_of("node-2.cluster.local:7001"), "node-2.cluster.local");
        assert_eq!(host_of("[fd00::2]:7001"), "fd00::2");
        assert_eq!(host_of("node-3"), "node-3");
    }
}
