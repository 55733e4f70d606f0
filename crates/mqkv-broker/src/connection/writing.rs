//! Writing a connection's output: its writer task, and writes made straight from the task
//! that queued the output.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::sync::Notify;

use crate::codec::{self, reason, Packet};
use crate::session::Session;
use crate::transport::WriteHalf;

const WRITE_BATCH: usize = 256 * 1024;

/// The write side, shared by the writer task and the reader's inline flush: the socket half
/// and bytes encoded but not yet written.
pub(super) struct WriteState {
    /// None while the connection moves to another thread (see [`Conn::try_move`]).
    pub(super) half: Option<WriteHalf>,
    pub(super) pending: BytesMut,
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
pub(super) type Writer = Arc<tokio::sync::Mutex<WriteState>>;

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
    let mut flushed = true;
    if let Some(half) = &mut w.half {
        while !w.pending.is_empty() {
            match half.try_write(&w.pending) {
                Ok(n) if n > 0 => w.pending.advance(n),
                _ => break,
            }
        }
        flushed = half.try_flush();
    }
    if !w.pending.is_empty() || !flushed || session.has_ready(conn_id) {
        notify.notify_one();
    }
}

/// Writes everything the session has ready for this connection, waiting for the socket as
/// needed. Returns true when the connection is finished (closed, taken over, or failed).
pub(super) async fn flush(session: &Session, conn_id: u64, level: u8, w: &mut WriteState) -> bool {
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
                half.shutdown().await;
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
                    half.shutdown().await;
                    return true;
                }
            }
        }
        if !session.has_ready(conn_id) {
            // What TLS or WebSocket still holds from a write made without waiting.
            return half.flush().await.is_err();
        }
    }
}

/// A connection's writer task, and the flag it raises when it ends (returning, failing or
/// stopped): the read loop polls the task's handle once, to be woken when it ends, and after
/// that only once the flag is up. Polling the handle on every pass would cost the read loop a
/// poll of the task's state and of the cooperative budget for every packet.
pub(super) struct WriterTask {
    pub(super) handle: tokio::task::JoinHandle<()>,
    ended: Arc<std::sync::atomic::AtomicBool>,
    registered: bool,
}

impl WriterTask {
    pub(super) fn spawn(
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
    pub(super) fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let ended = self.ended.load(Ordering::Acquire);
        // Outside the cooperative budget, so the first poll always registers this task.
        let handle = std::pin::pin!(tokio::task::unconstrained(&mut self.handle));
        super::poll_event(handle, &mut self.registered, ended, cx).map(|_| ())
    }
}

/// Raises its flag when dropped: when the task holding it ends, however it ends.
pub(super) struct RaiseOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

pub(super) async fn write_loop(
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

/// How the session's output reaches this connection's socket, for tasks other than the
/// connection's own (see [`crate::placement::Output`]). The session holds it, so it holds the
/// session weakly.
#[derive(Debug)]
struct Outlet {
    session: std::sync::Weak<Session>,
    conn_id: u64,
    wr: Writer,
    notify: Arc<Notify>,
    writes: Writes,
}

/// When tasks other than the connection's own write its output themselves, rather than wake
/// its writer task (see [`attach`]).
#[derive(Debug)]
enum Writes {
    /// Always.
    Direct,
    /// For one of a fan-out's deliveries, when the output ready before it came at least
    /// [`SPARSE`] earlier; else the writer task is woken.
    WhenSparse {
        /// When the outlet was made: what `last` counts from.
        since: Instant,
        /// Nanoseconds from `since` to the last time output was ready; 0 before the first.
        last: AtomicU64,
    },
}

/// How far apart messages to a TLS or WebSocket connection must come to be written at once by
/// whoever routed them (see [`attach`]).
const SPARSE: Duration = Duration::from_micros(50);

impl Writes {
    /// Whether the caller writes now, itself; `fan_out` as for
    /// [`crate::placement::Output::write_ready`].
    fn now(&self, fan_out: bool) -> bool {
        match self {
            Writes::Direct => true,
            Writes::WhenSparse { since, last } => {
                let at = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                // Every output is recorded, a fan-out's or not, so `sparse` comes first.
                sparse(last, at) && fan_out
            }
        }
    }
}

/// Records output ready `at` nanoseconds into an outlet's life; whether the output ready
/// before it, recorded in `last`, came at least [`SPARSE`] earlier, or none did.
fn sparse(last: &AtomicU64, at: u64) -> bool {
    let at = at.max(1);
    let before = last.swap(at, Ordering::Relaxed);
    before == 0 || at.saturating_sub(before) >= SPARSE.as_nanos() as u64
}

impl crate::placement::Output for Outlet {
    fn write_ready(&self, fan_out: bool) {
        if !self.writes.now(fan_out) {
            self.notify.notify_one();
        } else if let Some(session) = self.session.upgrade() {
            write_ready(&session, self.conn_id, &self.wr, &self.notify);
        }
    }
}

/// Lets tasks other than the connection's own write `session`'s output for connection
/// `conn_id` through `wr`, or have them wake its writer task instead, which then writes
/// everything queued meanwhile at once. Called on the thread that serves the connection.
///
/// Where writes are `cheap` (plain TCP), a message routed to the connection goes out in the
/// publisher's pass, without a task hand-off. Over TLS and WebSocket each write is a TLS record
/// or a WebSocket frame of its own, whose cost is the write's rather than the bytes' (fan-in to
/// one WebSocket subscriber at 64 publishers measured 62.5k messages a second written one by
/// one, against 84k over TCP). There, one of a fan-out's deliveries is written at once when
/// the output before it came at least [`SPARSE`] earlier: each subscriber then has one message
/// from each publish, and a hand-off per subscriber is all the writer task would add. Other
/// output, such as a fan-in's, whose messages to one subscriber come from many publishers
/// close together, is left to the writer task, which puts what was queued while it waited to
/// run into one write (see `docs/design/performance.md`).
pub(super) fn attach(
    session: &Arc<Session>,
    conn_id: u64,
    wr: &Writer,
    notify: &Arc<Notify>,
    cheap: bool,
) {
    let writes = if cheap {
        Writes::Direct
    } else {
        Writes::WhenSparse {
            since: Instant::now(),
            last: AtomicU64::new(0),
        }
    };
    let outlet = Outlet {
        session: Arc::downgrade(session),
        conn_id,
        wr: wr.clone(),
        notify: notify.clone(),
        writes,
    };
    session.set_output(conn_id, Arc::new(outlet), crate::placement::current_home());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_written_at_once_only_when_it_comes_sparsely() {
        let gap = SPARSE.as_nanos() as u64;
        let last = AtomicU64::new(0);
        assert!(sparse(&last, 0), "the first output");
        assert!(!sparse(&last, gap / 2), "output soon after");
        // Counted from the output just before, not from the last written at once.
        assert!(!sparse(&last, gap + gap / 4), "a burst goes on");
        assert!(sparse(&last, 3 * gap), "output after a pause");
        assert!(sparse(&last, 4 * gap), "output as sparse as a fan-out's");
    }
}
