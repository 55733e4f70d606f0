//! A connection's read loop: input, the keep alive, and whatever else may end the connection,
//! move it, or ask it to finish before a new connection takes its session over.

use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::moving::Exit;
use super::writing::WriterTask;
use super::{poll_event, Conn, End, Violation};
use crate::codec::reason;
use crate::transport::ReadHalf;

/// Most bytes a connection reads to finish what it received when it is taken over.
const HANDOVER_READ_MAX: usize = 256 * 1024;

/// Longest the server keeps reading, and discarding, what a client sends after the server's
/// DISCONNECT.
const DRAIN_AFTER_DISCONNECT: Duration = Duration::from_millis(500);

/// After the server's DISCONNECT (sent, and the sending side closed): reads and discards what
/// the client still sends until it closes, or for [`DRAIN_AFTER_DISCONNECT`]. Closing a socket
/// with unread input resets the connection, and a client still sending would meet the reset
/// before it read the DISCONNECT and its reason.
pub(super) async fn drain_input(rd: &mut ReadHalf) {
    let mut scratch = BytesMut::with_capacity(4096);
    let _ = tokio::time::timeout(DRAIN_AFTER_DISCONNECT, async {
        while let Ok(n) = rd.read_buf(&mut scratch).await {
            if n == 0 {
                break;
            }
            scratch.clear();
        }
    })
    .await;
}

/// What a connection asked to hand over found in what it had received.
pub(super) enum Received {
    /// Handled; the connection goes on until it is taken over.
    Handled,
    /// What it received ended the connection (DISCONNECT, a protocol violation).
    Ended(End),
    /// The peer closed the connection.
    PeerGone,
}

impl Conn {
    pub(super) async fn read_loop(
        &mut self,
        rd: &mut ReadHalf,
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
        // A credential that expires (a token) is checked by the same timer.
        let first_check = self.credential_expires.map_or(check_every(ka), |at| {
            check_every(ka).min(at.saturating_duration_since(Instant::now()))
        });
        let mut idle = std::pin::pin!(tokio::time::sleep(first_check));
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
        // Only plain TCP and TLS connections move between threads (see `transport::detach`).
        let movable = crate::transport::movable(rd);
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
                if std::mem::take(&mut self.expiry_changed) {
                    if let Some(at) = self.credential_expires {
                        if at < idle.deadline().into_std() {
                            idle.as_mut().reset(at.into());
                            idle_registered = false;
                        }
                    }
                }
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
                        match self.try_move(&mut writer.handle, movable).await {
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
                        if held == 0
                            && self.has_published
                            && crate::transport::only_acknowledgements(&buf)
                        {
                            rd.ack_at_once();
                        }
                    }
                },
                () = std::future::poll_fn(|cx| {
                    let fired = idle.is_elapsed();
                    poll_event(idle.as_mut(), &mut idle_registered, fired, cx)
                }), if ka.is_some() || packet_timeout.is_some() || self.credential_expires.is_some() => {
                    let now = Instant::now();
                    if self.credential_expired(now) {
                        tracing::info!(client_id = %self.client_id, "credential expired without re-authentication");
                        self.close_with(reason::MAXIMUM_CONNECT_TIME);
                        told = true;
                        break End::Abnormal;
                    }
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
                        None => now.checked_add(check_every(None)).unwrap_or(now + Duration::from_secs(86_400)),
                    };
                    let deadline = self.credential_expires.map_or(deadline, |at| deadline.min(at));
                    // A packet that began arriving since the last check is timed out when its
                    // own limit passes, not a whole check period after.
                    let deadline = match (partial_since, packet_timeout) {
                        (Some(since), Some(limit)) => deadline.min(since + limit),
                        _ => deadline,
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

    /// Reads what the socket already holds, without waiting, and handles it: for a new
    /// connection that takes this one's session over.
    pub(super) async fn finish_received(
        &mut self,
        rd: &mut ReadHalf,
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
}
