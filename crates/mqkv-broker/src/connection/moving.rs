//! Moving a connection to another connection thread (see [`crate::placement`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::writing::{self, WriteState, WriterTask};
use super::{Conn, End, LiveGuard};
use crate::placement::CachedWaker;
use crate::transport::{self, ReadHalf, Stream};

/// How a connection's read loop ended.
pub(super) enum Exit {
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
pub(super) type Moved = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Conn {
    /// Serves the connection once its CONNECT is handled, until it ends: here, or on the
    /// thread it moves to.
    pub(super) fn serve(
        mut self,
        mut rd: ReadHalf,
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
                    // Only plain TCP and TLS connections are asked to move (see
                    // `transport::detach`).
                    let (socket, parked) = match transport::detach(rd, wr) {
                        Ok(Ok(detached)) => detached,
                        failed => {
                            if let Ok(Err(e)) = failed {
                                tracing::warn!(client_id = %self.client_id, error = %e, "cannot move a connection");
                            }
                            drop(guard);
                            self.end(End::Abnormal);
                            return;
                        }
                    };
                    tracing::debug!(client_id = %self.client_id, from = crate::placement::current_home(), to = home, "connection moves");
                    let inner = self.inner.clone();
                    inner.threads.serve_on(home - 1, socket, move |tcp| {
                        self.resume(parked.resume(tcp), buf, keep_alive, guard, live)
                    });
                }
            }
        })
    }

    /// Goes on serving the connection on the thread it moved to.
    pub(super) fn resume(
        mut self,
        stream: Stream,
        buf: BytesMut,
        keep_alive: u16,
        mut guard: tokio::sync::OwnedMutexGuard<WriteState>,
        live: LiveGuard,
    ) -> Moved {
        let (rd, wr) = stream.split();
        guard.half = Some(wr);
        drop(guard);
        // Output for the connection is written from this thread from now on.
        let cheap = transport::cheap_writes(&rd);
        writing::attach(&self.session, self.conn_id, &self.wr, &self.notify, cheap);
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
    pub(super) async fn try_move(
        &mut self,
        writer: &mut tokio::task::JoinHandle<()>,
        movable: bool,
    ) -> Option<Result<(usize, tokio::sync::OwnedMutexGuard<WriteState>), ()>> {
        let home = self.relocate.take();
        let here = crate::placement::current_home();
        // A connection that publishes as well may be one side of a request and response whose
        // other side is asked to move to it at the same time: only the one on the later thread
        // moves, so the two do not trade places.
        let published = std::mem::take(&mut self.published);
        if home == 0
            || !movable
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
}
