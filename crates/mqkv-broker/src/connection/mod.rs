//! One client connection, from its CONNECT to its end.
//!
//! - [`handshake`]: the transport's handshakes, the CONNECT, and the parameters negotiated
//!   from it.
//! - [`reading`]: the read loop, which waits for input and for what else may end or move the
//!   connection, and the keep alive.
//! - [`packets`]: what each packet from the client does.
//! - [`publish`]: the QoS flows of a client's publishes, and the queue of publishes to
//!   in-process services whose answers and acknowledgements go out in arrival order.
//! - [`writing`]: the writer task, and writes made straight from the task that queued output.
//! - [`moving`]: moving a connection to another connection thread.
//!
//! The reader decodes and handles packets; everything the connection sends (acks, SUBACK,
//! publishes) goes through the session, and the writer drains it in batches into one write.
//! A protocol violation queues a DISCONNECT with the reason code the specification names and
//! closes the connection; nothing a client sends can take down another connection or the
//! broker. The bytes travel over a [`crate::transport`] stream, which the connection does not
//! look behind.

mod authorize;
mod handshake;
mod moving;
mod negotiate;
mod packets;
mod publish;
mod read_room;
mod reading;
mod reauth;
#[cfg(test)]
mod tests;
mod writing;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crate::codec::{self, Packet};
use crate::inner::Inner;
use crate::session::{Message, Session};
use crate::subtree::ClientId;

use crate::placement::CachedWaker;
pub(crate) use handshake::run;
use publish::Queued;
use read_room::ReadRoom;
use writing::Writer;

/// Counts the connection as live for as long as it exists.
/// The listener kinds connections are counted by (see `Inner::live_by_kind`).
pub(crate) const KINDS: [&str; 4] = ["tcp", "tls", "ws", "wss"];

/// Counts a connection as live (by its listener's kind and, under a per-address limit,
/// against its address) until it ends.
pub(super) struct LiveGuard {
    inner: Arc<Inner>,
    /// The address counted in `Inner::per_address`, if it is.
    counted: Option<std::net::IpAddr>,
    /// Its listener kind's index in [`KINDS`].
    kind: usize,
}

impl LiveGuard {
    /// Counts a new connection on a listener of `kind`, and, under a per-address limit,
    /// against its address `ip` if that is known yet (see [`LiveGuard::count`]); the second
    /// value says whether the address is over its limit with it.
    pub(super) fn new(
        inner: Arc<Inner>,
        ip: Option<std::net::IpAddr>,
        kind: &str,
    ) -> (LiveGuard, bool) {
        inner.live_connections.fetch_add(1, Ordering::Relaxed);
        let kind = KINDS.iter().position(|k| *k == kind).unwrap_or(0);
        inner.live_by_kind[kind].fetch_add(1, Ordering::Relaxed);
        let mut guard = LiveGuard {
            inner,
            counted: None,
            kind,
        };
        let over = ip.is_some_and(|ip| guard.count(ip));
        (guard, over)
    }

    /// Counts the connection against its address, once it is known (behind a proxy, when
    /// the proxy has said it); returns whether the address is over its limit with it.
    pub(super) fn count(&mut self, ip: std::net::IpAddr) -> bool {
        let limit = self.inner.config.max_connections_per_address;
        if limit == 0 || self.counted.is_some() {
            return false;
        }
        let mut per_address = self.inner.per_address.lock();
        let n = per_address.entry(ip).or_insert(0);
        *n += 1;
        self.counted = Some(ip);
        *n > limit
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if let Some(ip) = self.counted {
            let mut per_address = self.inner.per_address.lock();
            if let Some(n) = per_address.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    per_address.remove(&ip);
                }
            }
        }
        self.inner.live_by_kind[self.kind].fetch_sub(1, Ordering::Relaxed);
        self.inner.live_connections.fetch_sub(1, Ordering::Relaxed);
        self.inner.connection_closed.notify_waiters();
    }
}

/// Why a connection ended; decides whether the will is published.
#[derive(Debug)]
pub(super) enum End {
    /// DISCONNECT with reason 0x00: no will.
    Normal,
    /// DISCONNECT with reason 0x04, a protocol violation, a keep alive timeout, or network loss.
    Abnormal,
    /// Server shutdown.
    Shutdown,
}

pub(super) struct Conn {
    inner: Arc<Inner>,
    session: Arc<Session>,
    conn_id: u64,
    level: u8,
    /// The metric category the client named in CONNECT (see [`crate::stats::Categories`]).
    category: usize,
    client_id: ClientId,
    ident: crate::service::ClientIdentity,
    /// The policy generation `ident`'s grants were worked out under.
    policy_generation: u64,
    /// The authentication method of CONNECT, which re-authentication must use too.
    auth_method: Option<String>,
    /// When the credential the client authenticated with expires: the connection ends then
    /// unless the client re-authenticates.
    credential_expires: Option<Instant>,
    /// Set when re-authentication moved `credential_expires`: the read loop's timer is set
    /// again.
    expiry_changed: bool,
    /// The address the client connected to.
    local: std::net::SocketAddr,
    /// Inbound topic aliases, indexed by alias - 1.
    aliases: Vec<Option<String>>,
    session_expiry: u32,
    will: Option<(Arc<Message>, u32)>,
    wr: Writer,
    notify: Arc<tokio::sync::Notify>,
    /// This connection's copy of the service claims.
    services: crate::inner::ServiceClaims,
    /// The waker services' futures get (see [`crate::placement::CachedWaker`]).
    waker: CachedWaker,
    handover: Arc<crate::session::Handover>,
    /// How the session asks the connection to move to another thread.
    relocate: Arc<crate::placement::Relocate>,
    /// Times the connection moved, and when it may move again: each move doubles the wait, so
    /// two connections that feed each other from different threads do not trade places for long.
    moves: u32,
    move_after: Instant,
    /// Whether the connection published to other clients since it was last asked to move.
    published: bool,
    /// Whether the client has sent a PUBLISH: such a client may hold its next packet until the
    /// ACK of its last acknowledgement comes, so reads of acknowledgements alone ask for that
    /// ACK at once (see `transport::quickack`).
    has_published: bool,
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

/// A violation detected while handling a packet: DISCONNECT with this reason code.
pub(super) struct Violation(u8);

impl Conn {
    /// What the policy lets this client do (`None`: no policy, everything), worked out again
    /// when the policy has been replaced since.
    pub(super) fn grants(&mut self) -> Option<&Arc<dyn crate::access::Grants>> {
        let generation = self.inner.policy.generation();
        if generation != self.policy_generation {
            self.policy_generation = generation;
            self.ident.grants = self
                .inner
                .policy
                .grants(&self.client_id, &self.ident.principal);
        }
        self.ident.grants.as_ref()
    }

    pub(super) fn v5(&self) -> bool {
        self.level == codec::V5
    }

    pub(super) fn send(&self, p: Packet) {
        self.session.send_control(self.conn_id, p);
    }

    /// Writes what is queued from the reader's own task, without waiting: as much as the socket
    /// takes at once. The rest, and anything unusual (closing, takeover, a busy writer), is left
    /// to the writer task. This saves a task hand-off per request and puts an ack and the
    /// response it belongs with into one write.
    pub(super) fn flush_inline(&self) {
        if self.session.end_deferral(self.conn_id) {
            writing::write_ready(&self.session, self.conn_id, &self.wr, &self.notify);
        }
    }

    /// Queues DISCONNECT (MQTT 5) and makes the writer close after flushing.
    pub(super) fn close_with(&self, code: u8) {
        self.session.close(self.conn_id, Some(code));
    }

    /// The connection has ended: the will, the session, the services.
    pub(super) fn end(mut self, end: End) {
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
}

/// Polls `event`, a future that registers the task on its first poll (a `Notified`, a watch
/// channel's change), on its first poll and afterwards only when `happened` says it may be
/// ready: polling it on every pass would take the lock of the notifier it waits on. The
/// `select!` branch it serves stays enabled, because a branch's condition is read once per
/// select: a connection whose client has gone quiet waits in one select, and would never see
/// the event.
pub(super) fn poll_event<F: std::future::Future>(
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
