//! Group commit: concurrent writes share one raft log entry and one fsync.
//!
//! openraft 0.9 appends one log entry per `client_write` and waits for that
//! append to be flushed before it looks at the next request, so batching
//! below raft cannot help: N concurrent writes would cost N fsyncs. Batching
//! happens here instead. Writes queue up; one task takes everything queued
//! (up to a size budget) and proposes it as a single [`Proposal`]. While a
//! proposal is inside raft the next one fills up, so a lone writer pays one
//! fsync per write and N concurrent writers share a few.
//!
//! Invariants:
//! - entries are proposed in the order `propose` was called, and a proposal
//!   applies its entries in that order, so log order is arrival order;
//! - every caller gets exactly the outcome of its own entry, or the error
//!   of the proposal that carried it;
//! - on a node without peers, one proposal is inside raft at a time, from
//!   proposing until it is applied. Each proposal costs several task
//!   hand-offs (raft core, state machine worker) and a sync of the log
//!   whatever its size, so fewer, larger proposals serve more writes: with
//!   64 concurrent writers a single proposal in flight gave about 1.6 times
//!   the durable writes per second of two (measured with `mqkv-bench
//!   --workloads set`);
//! - in a cluster, up to `depth` proposals are on their way at once (see
//!   `pipeline`): a proposal then waits for a network round trip and the
//!   followers' syncs, which the next proposals need not wait behind.
//!
//! The proposer also watches the log's size: raft's snapshot policy counts
//! entries, and a run of large values could grow the log far beyond what
//! that count suggests, so a snapshot is also requested once the log
//! written since the last one outgrows the snapshot itself (or a floor).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use mqkv_protocol::Command;
use mqkv_store::{Applied, Entry, Op};
use openraft::Raft;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::log_store::LogShared;
use crate::route::Route;
use crate::stats::Counters;
use crate::sync;
use crate::types::{Outcome, Proposal, TypeConfig};
use crate::WriteError;

/// How soon an idle proposer asks again for a snapshot that the log's size
/// calls for.
const SNAPSHOT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest a proposal waits for a snapshot to shorten a full log.
const LOG_FULL_MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a proposal waits between looks at a full log.
const LOG_FULL_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Most entries in one proposal.
const MAX_ENTRIES: usize = 1024;
/// Rough byte budget of one proposal; a single larger entry still goes
/// alone.
const MAX_BYTES: usize = 4 << 20;

/// The log index of the entry that carried a write, and what applying it answered.
type Answer = Result<(u64, Applied), WriteError>;
type Reply = oneshot::Sender<Answer>;

struct Pending {
    entry: Entry,
    reply: Reply,
}

/// Gathers writes into proposals.
pub(crate) struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Proposer {
    /// Starts proposing to `raft`. A snapshot is requested whenever the log
    /// written since the last one exceeds both `snapshot_log_bytes` and
    /// the size of that snapshot. No proposal is made while `log` holds
    /// `max_entries` or more entries past raft's newest snapshot: writes
    /// wait (up to [`LOG_FULL_MAX_WAIT`]) for a snapshot.
    pub(crate) fn start(
        raft: Raft<TypeConfig>,
        route: Route,
        counters: Arc<Counters>,
        snapshot_log_bytes: u64,
        log: Arc<LogShared>,
        max_entries: u64,
        depth: usize,
    ) -> Proposer {
        let (tx, rx) = mpsc::unbounded_channel();
        let log_limit = LogLimit {
            counters,
            floor: snapshot_log_bytes,
            log,
            max_entries,
        };
        let task = tokio::spawn(run(raft, route, rx, Arc::new(log_limit), depth.max(1)));
        Proposer {
            tx,
            task: Mutex::new(Some(task)),
        }
    }

    /// Queues `entry` for the next proposal now; the returned future waits for its outcome.
    pub(crate) fn propose(&self, entry: Entry) -> PendingWrite {
        self.handle().propose(entry)
    }

    /// A handle that queues writes as [`Self::propose`] does.
    pub(crate) fn handle(&self) -> Proposals {
        Proposals {
            tx: self.tx.clone(),
        }
    }

    /// Stops proposing. Writes still queued fail with
    /// [`WriteError::Stopped`]; proposals already inside raft finish or fail
    /// with raft.
    pub(crate) fn stop(&self) {
        let task = sync::lock(&self.task).take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

/// Queues writes for the proposer (see [`Proposer::handle`]).
#[derive(Clone)]
pub(crate) struct Proposals {
    tx: mpsc::UnboundedSender<Pending>,
}

impl Proposals {
    /// Queues `entry` for the next proposal now.
    pub(crate) fn propose(&self, entry: Entry) -> PendingWrite {
        let (reply, outcome) = oneshot::channel();
        let outcome = self
            .tx
            .send(Pending { entry, reply })
            .ok()
            .map(|()| outcome);
        PendingWrite { outcome }
    }
}

/// A write queued for a proposal: resolves to the outcome of applying it. Dropping it does not
/// withdraw the write.
///
/// The write is queued when it is made, not when the future is first polled, and the future
/// holds only the receiving end of the answer: a caller that keeps it (a connection waiting to
/// publish the answer) keeps a few bytes, not the entry.
#[must_use = "the write is queued either way; the future only tells its outcome"]
pub struct PendingWrite {
    /// `None` when the proposer had already stopped.
    outcome: Option<oneshot::Receiver<Answer>>,
}

impl PendingWrite {
    /// The outcome with the log index of the entry that carried the write.
    pub(crate) async fn indexed(self) -> Answer {
        match self.outcome {
            None => Err(WriteError::Stopped),
            Some(outcome) => outcome.await.unwrap_or(Err(WriteError::Stopped)),
        }
    }
}

impl Future for PendingWrite {
    type Output = Result<Applied, WriteError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.outcome {
            None => Poll::Ready(Err(WriteError::Stopped)),
            Some(outcome) => Pin::new(outcome).poll(cx).map(|answer| {
                answer
                    .unwrap_or(Err(WriteError::Stopped))
                    .map(|(_, applied)| applied)
            }),
        }
    }
}

struct LogLimit {
    counters: Arc<Counters>,
    floor: u64,
    log: Arc<LogShared>,
    max_entries: u64,
}

impl LogLimit {
    /// Entries past the newest snapshot: what a restart would replay. The
    /// snapshot is the one raft knows of, not the one the state machine
    /// last wrote: raft purges the log behind a snapshot in the same step
    /// in which it learns of it, so counting from there keeps the whole log
    /// within two snapshot periods plus the entries kept behind one.
    fn unsnapshotted(&self, raft: &Raft<TypeConfig>) -> u64 {
        let snapshot = raft.metrics().borrow().snapshot.map(|id| id.index);
        match (self.log.last_index(), snapshot) {
            (Some(last), Some(snapshot)) => last.saturating_sub(snapshot),
            (Some(last), None) => last.saturating_add(1),
            (None, _) => 0,
        }
    }

    fn exceeded(&self) -> bool {
        let since = Counters::get(&self.counters.log_bytes_since_snapshot);
        since > self.floor.max(Counters::get(&self.counters.snapshot_bytes))
    }
}

async fn run(
    raft: Raft<TypeConfig>,
    route: Route,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    log_limit: Arc<LogLimit>,
    depth: usize,
) {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(depth));
    while let Some(first) = next_write(&mut rx, &raft, &log_limit).await {
        wait_for_room(&raft, &log_limit).await;
        // Entries are a few hundred bytes each: they go from the queue
        // straight into vectors sized for the whole batch, so none is moved
        // again by a vector growing.
        let room = (rx.len() + 1).min(MAX_ENTRIES);
        let mut entries = Vec::with_capacity(room);
        let mut replies = Vec::with_capacity(room);
        let mut bytes = approximate_size(&first.entry);
        entries.push(first.entry);
        replies.push(first.reply);
        while entries.len() < MAX_ENTRIES && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(pending) => {
                    bytes += approximate_size(&pending.entry);
                    entries.push(pending.entry);
                    replies.push(pending.reply);
                }
                Err(_) => break,
            }
        }
        let proposal = Proposal(Arc::new(entries));
        // The leader proposes one batch at a time, with whatever its followers sent meanwhile:
        // raft writes and syncs each proposal's entry before it takes the next, so batches in
        // flight there would only make more, smaller syncs.
        if depth == 1 || route.is_leader() {
            answer(replies, route.write(proposal).await);
        } else {
            // Closed only when dropped, with this task.
            let Ok(permit) = in_flight.clone().acquire_owned().await else {
                return;
            };
            let flight = route.submit(proposal).await;
            let route = route.clone();
            tokio::spawn(async move {
                answer(replies, route.finish(flight).await);
                drop(permit);
            });
        }
        if log_limit.exceeded() {
            // Ignored by raft while a snapshot is being built; an error here
            // means raft stopped, which the next write reports.
            let _ = raft.trigger().snapshot().await;
        }
    }
}

/// The next queued write, or `None` once nobody can propose any more.
/// While the log is over its byte budget the snapshot asked for after the
/// last proposal may have been ignored (one was being built): an idle
/// proposer asks again every [`SNAPSHOT_RETRY`] until a write comes (and
/// asks itself).
async fn next_write(
    rx: &mut mpsc::UnboundedReceiver<Pending>,
    raft: &Raft<TypeConfig>,
    log_limit: &LogLimit,
) -> Option<Pending> {
    while log_limit.exceeded() {
        tokio::select! {
            pending = rx.recv() => return pending,
            () = tokio::time::sleep(SNAPSHOT_RETRY) => {
                let _ = raft.trigger().snapshot().await;
            }
        }
    }
    rx.recv().await
}

/// Snapshots are built beside the writes; should one take longer than the
/// log allows (a loaded machine, a large state), writes wait for it rather
/// than let the log, and the replay after a crash, grow; but not forever (a
/// snapshot that keeps failing must not stop every write).
async fn wait_for_room(raft: &Raft<TypeConfig>, log_limit: &LogLimit) {
    let waiting = tokio::time::Instant::now();
    while log_limit.unsnapshotted(raft) >= log_limit.max_entries {
        if waiting.elapsed() > LOG_FULL_MAX_WAIT {
            tracing::warn!(
                entries = log_limit.unsnapshotted(raft),
                "no snapshot came to shorten the log; writing on"
            );
            return;
        }
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
        tokio::time::sleep(LOG_FULL_WAIT).await;
    }
}

fn answer(replies: Vec<Reply>, result: Result<(u64, Vec<Outcome>), WriteError>) {
    match result {
        Ok((index, outcomes)) if outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that stopped waiting does not need the answer.
                let _ = reply.send(Ok((index, Applied::from(outcome))));
            }
        }
        Ok((_, outcomes)) => {
            let error = WriteError::Raft(format!(
                "a proposal of {} entries was answered with {} outcomes",
                replies.len(),
                outcomes.len()
            ));
            replies
                .into_iter()
                .for_each(|r| drop(r.send(Err(error.clone()))));
        }
        Err(error) => replies
            .into_iter()
            .for_each(|r| drop(r.send(Err(error.clone())))),
    }
}

/// What an entry adds to a proposal, roughly: its key and value bytes.
fn approximate_size(entry: &Entry) -> usize {
    const OVERHEAD: usize = 64;
    let payload = match &entry.op {
        Op::ExpireDue | Op::SetLimits(_) | Op::SetHistory(_) => 0,
        Op::Meta(changes) => changes
            .iter()
            .map(|c| c.key.len() + c.value.as_ref().map_or(0, |v| v.len()))
            .sum(),
        Op::Request(request) => match &request.command {
            Command::Set { key, value, .. } | Command::VDel { key, value } => {
                key.len() + value.len()
            }
            Command::Get { key }
            | Command::Del { key }
            | Command::DelIfVersion { key, .. }
            | Command::KeyNotifySince { key, .. }
            | Command::KeyNotify { key, .. } => key.len(),
            Command::MGet { keys } => keys.iter().map(|k| k.len()).sum(),
            Command::KeyNotifyPattern { pattern, .. }
            | Command::KeyNotifyPatternSince { pattern, .. } => pattern.len(),
            Command::Scan { pattern, token } => {
                pattern.len() + token.as_ref().map_or(0, |t| t.len())
            }
        },
    };
    payload + OVERHEAD
}
