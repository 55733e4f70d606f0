//! Connection storm: connect, CONNECT, CONNACK, DISCONNECT, close, again. Over TLS, a fleet
//! of devices reconnects in turn, each resuming its own last session, or (`full`) each making
//! a full handshake.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use bytes::BytesMut;
use rustls::HandshakeKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{drive, Settings, Worker};
use crate::mqtt::{connect_packet, split_frame, Conn};
use crate::report::RunResult;
use crate::servers::Server;
use crate::wire::{Dial, Link};

/// Devices in a TLS storm: more than a server's session cache would remember (rustls keeps
/// 256 sessions, OpenSSL 20,480), so that only session tickets let every device resume.
pub const DEVICES: usize = 1024;

struct Storm {
    addr: SocketAddr,
    idx: usize,
    buf: BytesMut,
}

/// Reset rather than linger in TIME_WAIT, so a long storm cannot run out of ports.
fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setting a socket option on a descriptor owned by `stream`, with a valid struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Opens a connection and completes the MQTT handshake, keeping buffers small.
pub(super) async fn handshake(
    addr: SocketAddr,
    client_id: &str,
    buf: &mut BytesMut,
) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut out = BytesMut::with_capacity(64);
    connect_packet(client_id).encode(&mut out, mqkv_broker::codec::V5);
    stream.write_all(&out).await?;
    buf.clear();
    loop {
        if let Some(frame) = split_frame(buf)? {
            crate::mqtt::check_connack(&frame)?;
            return Ok(stream);
        }
        if stream.read_buf(buf).await? == 0 {
            bail!("connection closed during the handshake");
        }
    }
}

impl Worker for Storm {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        let id = format!("bench-storm-{}-{seq}", self.idx);
        let mut stream = handshake(self.addr, &id, &mut self.buf).await?;
        stream.write_all(&[0xE0, 0]).await?;
        reset_on_close(&stream);
        Ok(true)
    }
}

/// One concurrent client of a TLS storm: the devices it reconnects in turn, each with its own
/// TLS session store.
struct TlsStorm {
    addr: SocketAddr,
    devices: Vec<(String, Dial)>,
    /// Connections made by the load, and how many of them resumed a session.
    counts: Arc<(AtomicU64, AtomicU64)>,
}

impl TlsStorm {
    /// Connects device `i` once and leaves; whether the TLS session was resumed.
    async fn visit(&self, i: usize) -> Result<bool> {
        let Some((id, dial)) = self.devices.get(i % self.devices.len().max(1)) else {
            bail!("no devices");
        };
        let mut conn = Conn::dial(dial, self.addr, id).await?;
        let resumed = match &conn.stream {
            Link::Tls(s) => s.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed),
            _ => false,
        };
        conn.stream.write_all(&[0xE0, 0]).await?;
        reset_on_close(conn.stream.tcp());
        Ok(resumed)
    }
}

impl Worker for TlsStorm {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        let resumed = self.visit(seq as usize).await?;
        self.counts.0.fetch_add(1, Ordering::Relaxed);
        self.counts
            .1
            .fetch_add(u64::from(resumed), Ordering::Relaxed);
        Ok(true)
    }
}

/// A TLS connection storm: [`DEVICES`] devices over `clients` concurrent clients, resuming
/// their sessions or (`full`) not.
pub async fn storm_tls(server: &Server, clients: usize, full: bool, s: &Settings) -> RunResult {
    let name = if full {
        "conn-storm-tls-full"
    } else {
        "conn-storm-tls"
    };
    let mut r = RunResult::new(name, server.target, clients);
    r.unit = "connects/s".to_owned();
    let per_client = DEVICES.div_ceil(clients.max(1));
    let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let workers: Vec<TlsStorm> = (0..clients)
        .map(|c| TlsStorm {
            addr: server.addr,
            counts: counts.clone(),
            devices: (0..per_client)
                .map(|d| {
                    let id = format!("bench-device-{}", c * per_client + d);
                    (id, server.dial.one_device(!full))
                })
                .collect(),
        })
        .collect();
    // Every device has connected once before the load starts, so that it has a session to
    // resume from its first measured connection on.
    if !full {
        for w in &workers {
            for i in 0..w.devices.len() {
                if let Err(e) = w.visit(i).await {
                    r.failed = Some(format!("first connection of a device: {e:#}"));
                    return r;
                }
            }
        }
    }
    drive(workers, s, server).await.fill(&mut r, 1.0);
    r.extra
        .insert("devices".into(), (per_client * clients).into());
    // What the run says it measures, it measured: resumed handshakes, or full ones.
    let (made, resumed) = (
        counts.0.load(Ordering::Relaxed),
        counts.1.load(Ordering::Relaxed),
    );
    let share = resumed as f64 / made.max(1) as f64;
    r.extra.insert("resumed_share".into(), share.into());
    if r.failed.is_none() && made > 0 && full != (resumed == 0) {
        r.failed = Some(format!("{resumed} of {made} connections resumed a session"));
    }
    r
}

pub async fn storm(server: &Server, clients: usize, s: &Settings) -> RunResult {
    let mut r = RunResult::new("conn-storm", server.target, clients);
    r.unit = "connects/s".to_owned();
    let workers = (0..clients)
        .map(|idx| Storm {
            addr: server.addr,
            idx,
            buf: BytesMut::with_capacity(256),
        })
        .collect();
    drive(workers, s, server).await.fill(&mut r, 1.0);
    r
}
