//! Connection storm: connect, CONNECT, CONNACK, DISCONNECT, close, again.

use std::net::SocketAddr;

use anyhow::{bail, Result};
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{drive, Settings, Worker};
use crate::mqtt::{connect_packet, split_frame};
use crate::report::RunResult;
use crate::servers::Server;

struct Storm {
    addr: SocketAddr,
    idx: usize,
    buf: BytesMut,
}

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
        // Reset rather than linger in TIME_WAIT, so a long storm cannot run out of ports.
        reset_on_close(&stream);
        Ok(true)
    }
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
