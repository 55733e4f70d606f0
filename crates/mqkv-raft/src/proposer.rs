//! Group commit: concurrent writes share one raft log entry and one fsync.
//!
//! openraft 0.9 appends one log entry per `client_write` and waits for that
//! append to be flushed before it looks at the next request, so batching
//! below raft cannot help: N concurrent writes would cost N fsyncs. Batching
//! happens here instead. Writes queue up; one task takes everything queued
//! (up to a size budget) and proposes it as a single [`Proposal`]. While a
//! proposal is being synced the next one fills up, so a lone writer pays one
//! fsync per write and N concurrent writers share a few.
//!
//! Invariants:
//! - entries are proposed in the order `propose` was called, and a proposal
//!   applies its entries in that order, so log order is arrival order;
//! - every caller gets exactly the outcome of its own entry, or the error
//!   of the proposal that carried it;
//! - at most [`IN_FLIGHT`] proposals are inside raft at once: one being
//!   flushed and one queued right behind it, so the disk never idles while
//!   writes wait.
//!
//! The proposer also watches the log's size: raft's snapshot policy counts
//! entries, and a run of large values could grow the log far beyond what
//! that count suggests, so a snapshot is also requested once the log
//! written since the last one outgrows the snapshot itself (or a floor).

use std::sync::{Arc, Mutex};

use mqkv_protocol::Command;
use mqkv_store::{Applied, Entry, Op};
use openraft::error::ClientWriteError;
use openraft::Raft;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::stats::Counters;
use crate::sync;
use crate::types::{Outcome, Proposal, TypeConfig};
use crate::WriteError;

/// Most entries in one proposal.
const MAX_ENTRIES: usize = 1024;
/// Rough byte budget of one proposal; a single larger entry still goes
/// alone.
const MAX_BYTES: usize = 4 << 20;
/// Proposals inside raft at once.
const IN_FLIGHT: usize = 2;

type Reply = oneshot::Sender<Result<Applied, WriteError>>;

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
    /// the size of that snapshot.
    pub(crate) fn start(
        raft: Raft<TypeConfig>,
        counters: Arc<Counters>,
        snapshot_log_bytes: u64,
    ) -> Proposer {
        let (tx, rx) = mpsc::unbounded_channel();
        let log_limit = LogLimit {
            counters,
            floor: snapshot_log_bytes,
        };
        let task = tokio::spawn(run(raft, rx, Arc::new(log_limit)));
        Proposer {
            tx,
            task: Mutex::new(Some(task)),
        }
    }

    /// Proposes `entry` and waits for its outcome.
    pub(crate) async fn propose(&self, entry: Entry) -> Result<Applied, WriteError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send(Pending { entry, reply })
            .map_err(|_| WriteError::Stopped)?;
        outcome.await.unwrap_or(Err(WriteError::Stopped))
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

struct LogLimit {
    counters: Arc<Counters>,
    floor: u64,
}

impl LogLimit {
    fn exceeded(&self) -> bool {
        let since = Counters::get(&self.counters.log_bytes_since_snapshot);
        since > self.floor.max(Counters::get(&self.counters.snapshot_bytes))
    }
}

async fn run(
    raft: Raft<TypeConfig>,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    log_limit: Arc<LogLimit>,
) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        // Waiting for a free slot first lets writes pile up meanwhile.
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut bytes = approximate_size(&first.entry);
        let mut batch = vec![first];
        while batch.len() < MAX_ENTRIES && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(pending) => {
                    bytes += approximate_size(&pending.entry);
                    batch.push(pending);
                }
                Err(_) => break,
            }
        }
        let (entries, replies): (Vec<Entry>, Vec<Reply>) =
            batch.into_iter().map(|p| (p.entry, p.reply)).unzip();
        match raft.client_write_ff(Proposal(entries)).await {
            Ok(response) => {
                let raft = raft.clone();
                let log_limit = log_limit.clone();
                tokio::spawn(async move {
                    let result = match response.await {
                        Ok(Ok(written)) => Ok(written.data),
                        Ok(Err(ClientWriteError::ForwardToLeader(forward))) => {
                            Err(WriteError::NotLeader {
                                leader: forward.leader_id,
                            })
                        }
                        Ok(Err(other)) => Err(WriteError::Raft(other.to_string())),
                        // Raft dropped the request: it stopped.
                        Err(_) => Err(WriteError::Stopped),
                    };
                    drop(slot);
                    answer(replies, result);
                    if log_limit.exceeded() {
                        // Ignored by raft while a snapshot is being built;
                        // an error here means raft stopped, which the next
                        // write reports.
                        let _ = raft.trigger().snapshot().await;
                    }
                });
            }
            Err(fatal) => answer(replies, Err(crate::node::fatal_error(fatal))),
        }
    }
}

fn answer(replies: Vec<Reply>, result: Result<Vec<Outcome>, WriteError>) {
    match result {
        Ok(outcomes) if outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that stopped waiting does not need the answer.
                let _ = reply.send(Ok(Applied::from(outcome)));
            }
        }
        Ok(outcomes) => {
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
        Op::ExpireDue | Op::SetLimits(_) => 0,
        Op::Request(request) => match &request.command {
            Command::Set { key, value, .. } | Command::VDel { key, value } => {
                key.len() + value.len()
            }
            Command::Get { key } | Command::Del { key } | Command::KeyNotify { key, .. } => {
                key.len()
            }
            Command::Scan { pattern, token } => {
                pattern.len() + token.as_ref().map_or(0, |t| t.len())
            }
        },
    };
    payload + OVERHEAD
}
