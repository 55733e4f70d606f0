//! What the benchmark's MQTT connections travel over: plain TCP, TLS, or WebSocket. The
//! servers under test get a listener of the same kind (see `servers`); the certificates are
//! made here, once per run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::{Bytes, BytesMut};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A connection kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    Tcp,
    Tls,
    Ws,
}

impl Wire {
    /// What workload names get appended: `""`, `"-tls"`, `"-ws"`.
    pub fn suffix(self) -> &'static str {
        match self {
            Wire::Tcp => "",
            Wire::Tls => "-tls",
            Wire::Ws => "-ws",
        }
    }
}

/// The WebSocket path both servers listen on.
pub const WS_PATH: &str = "/mqtt";

/// The test CA and server certificate, as files both servers can read.
#[derive(Debug, Clone)]
pub struct Certs {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA's certificate.
    pub ca: PathBuf,
    client: Arc<rustls::ClientConfig>,
}

impl Certs {
    /// Makes a CA and a certificate for 127.0.0.1 in `dir`, readable by every user; the
    /// certificate has no extended key usage, so it also serves as a client certificate (Mosquitto
    /// started as root reads them after dropping to its own user).
    pub fn make(dir: &Path) -> Result<Certs> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
        std::fs::create_dir_all(dir)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "mqkv-bench CA");
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        let (cert_path, key_path) = (dir.join("server.pem"), dir.join("server.key"));
        let ca_path = dir.join("ca.pem");
        std::fs::write(&cert_path, cert.pem())?;
        std::fs::write(&key_path, key.serialize_pem())?;
        std::fs::write(&ca_path, ca_cert.pem())?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for p in [dir, &cert_path, &key_path, &ca_path] {
                let mode = if p.is_dir() { 0o755 } else { 0o644 };
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
            }
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone())?;
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Certs {
            cert: cert_path,
            key: key_path,
            ca: ca_path,
            client: Arc::new(client),
        })
    }
}

/// How a client reaches a server: the kind, and for TLS the client settings.
#[derive(Debug, Clone)]
pub enum Dial {
    Tcp,
    Tls(Arc<rustls::ClientConfig>),
    Ws,
}

impl Dial {
    pub fn wire(&self) -> Wire {
        match self {
            Dial::Tcp => Wire::Tcp,
            Dial::Tls(_) => Wire::Tls,
            Dial::Ws => Wire::Ws,
        }
    }

    pub fn new(wire: Wire, certs: Option<&Certs>) -> Result<Dial> {
        Ok(match wire {
            Wire::Tcp => Dial::Tcp,
            Wire::Ws => Dial::Ws,
            Wire::Tls => Dial::Tls(certs.context("TLS without certificates")?.client.clone()),
        })
    }

    /// The same, for one device of many: over TLS with a session store of its own, so that
    /// it resumes only its own sessions (`resume`), or with none, so that every connection
    /// makes a full handshake.
    pub fn one_device(&self, resume: bool) -> Dial {
        match self {
            Dial::Tls(shared) => {
                let mut config = (**shared).clone();
                config.resumption = if resume {
                    rustls::client::Resumption::in_memory_sessions(4)
                } else {
                    rustls::client::Resumption::disabled()
                };
                Dial::Tls(Arc::new(config))
            }
            other => other.clone(),
        }
    }

    pub async fn connect(&self, addr: SocketAddr) -> Result<Link> {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        Ok(match self {
            Dial::Tcp => Link::Tcp(tcp),
            Dial::Tls(config) => {
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .context("TLS handshake")?;
                Link::Tls(Box::new(tls))
            }
            Dial::Ws => {
                let mut request = format!("ws://{addr}{WS_PATH}").into_client_request()?;
                request
                    .headers_mut()
                    .insert("Sec-WebSocket-Protocol", "mqtt".parse()?);
                // The library zeroes its read buffer's room before each read; its default of
                // 128 KiB would make the client, not the server, the bottleneck.
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(8 * 1024);
                let (ws, _) =
                    tokio_tungstenite::client_async_with_config(request, tcp, Some(config))
                        .await
                        .context("WebSocket upgrade")?;
                Link::Ws(Box::new(ws))
            }
        })
    }
}

/// One connection's byte stream.
pub enum Link {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Ws(Box<WebSocketStream<TcpStream>>),
}

impl Link {
    /// The TCP connection beneath.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Link::Tcp(s) => s,
            Link::Tls(s) => s.get_ref().0,
            Link::Ws(s) => s.get_ref(),
        }
    }

    /// The TCP stream of a plain TCP connection.
    pub fn into_tcp(self) -> Option<TcpStream> {
        match self {
            Link::Tcp(s) => Some(s),
            _ => None,
        }
    }

    /// Appends what arrives next to `buf`; 0 when the server closed the connection.
    pub async fn read_buf(&mut self, buf: &mut BytesMut) -> Result<usize> {
        Ok(match self {
            Link::Tcp(s) => s.read_buf(buf).await?,
            Link::Tls(s) => s.read_buf(buf).await?,
            Link::Ws(s) => loop {
                match s.next().await {
                    None | Some(Ok(Message::Close(_))) => break 0,
                    Some(Ok(Message::Binary(b))) if !b.is_empty() => {
                        buf.extend_from_slice(&b);
                        break b.len();
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.into()),
                }
            },
        })
    }

    pub async fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        match self {
            Link::Tcp(s) => s.write_all(bytes).await?,
            Link::Tls(s) => {
                s.write_all(bytes).await?;
                s.flush().await?;
            }
            Link::Ws(s) => {
                s.send(Message::Binary(Bytes::copy_from_slice(bytes)))
                    .await?
            }
        }
        Ok(())
    }
}
