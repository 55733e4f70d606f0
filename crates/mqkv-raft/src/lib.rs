//! The durable replicated log behind the mqkv state store.
//!
//! A [`StoreNode`] runs one member of an openraft group whose entries are
//! [`mqkv_store::Entry`]s and whose state machine is
//! [`mqkv_store::StateMachine`]. A single server is a one-member group,
//! created and initialised the first time its data directory is opened;
//! later work only adds members and a real transport.
//!
//! ```text
//! write(entry) ─► proposer ─► raft core ─► log store ─► raft-log/*.seg (write + fdatasync)
//!   (queued writes become one proposal)                                 │ flushed
//!    all on the raft thread (its own, or one lent to it)                ▼
//!                                 raft commits ─► state machine apply ─► on_apply hook
//!                                                      │
//!                        every N entries: snapshot ─► state.redb (fsync), then purge the log
//! ```
//!
//! # mqkv-raft: durability and the loss window
//!
//! **An acknowledged write is never lost.** `StoreNode::write` returns only
//! after the entry is written to the log's newest segment file and synced
//! (`fdatasync`) *and* applied to the state machine.
//! `kill -9` or power loss at any moment, followed by a restart, finds every
//! acknowledged entry: the latest snapshot is loaded and every log entry
//! after it is applied again before [`StoreNode::open_disk`] returns.
//!
//! A write that had not returned when the process died may or may not be
//! there after the restart (it is there if its fsync completed), never half
//! of it: every record carries a checksum, and an interrupted write at the
//! end of the log is cut off when the store opens. A client that retries with the
//! same de-duplication identity gets the first answer either way. All of
//! this assumes the disk keeps what `fsync` says it wrote.
//!
//! What is written where:
//!
//! | data | file | when it is durable |
//! |---|---|---|
//! | log entries (every write) | `raft-log/*.seg` | before the write is acknowledged |
//! | raft vote | `raft-log/*.seg` | before raft acts on it |
//! | last purged log id | `raft-log/*.seg` | with the purge |
//! | committed log id | `raft-log/*.seg` | with the next fsync; only shortens replay |
//! | state machine snapshot | `state.redb` | before the log behind it is purged |
//!
//! Group commit: writes that arrive while a log entry is being synced are
//! gathered into the next log entry (a proposal of many store entries), so
//! a lone writer pays one fsync per write and N concurrent writers share far
//! fewer than N ([`StoreStats::log_commits`] counts them).
//!
//! Snapshots: after [`NodeOptions::snapshot_every`] log entries — or sooner,
//! once the log written since the last snapshot outgrows both
//! [`NodeOptions::snapshot_log_bytes`] and the snapshot itself — the whole
//! state machine (keys, versions, fencing tokens, deadlines, HLC, the
//! de-duplication table) is serialized with postcard into `state.redb`, and
//! the log behind it, less [`NodeOptions::logs_kept_after_snapshot`]
//! entries, is purged: segments whose entries are all purged are deleted.
//! The log therefore stays short and a restart is a snapshot load plus a
//! short replay. Memory holds the most recent entries decoded (the state
//! machine applies them right after they are written); older ones are read
//! back from their segment.
//!
//! Files carry a format version ([`FORMAT_VERSION`] for `state.redb`,
//! [`LOG_FORMAT`] for the log segments). A file of another version, a
//! damaged or truncated file (redb verifies every page checksum when it
//! opens a file; every log record carries a checksum, and so does its
//! length) and a directory another process has open are refused with an
//! [`OpenError`] naming the file; nothing is written to the refused file and
//! no file is created next to it. The one damage that is repaired is the one
//! a crash or a power loss leaves: the damaged records of an interrupted
//! write at the very end of the newest log segment, which no acknowledged
//! write can be in (see the log's format in `log_file`).
//!
//! The apply hook is installed only after recovery: entries replayed from
//! the log at startup never reach it.
//!
//! | module | invariant it protects |
//! |---|---|
//! | `files` | only complete, checked files of this format are opened |
//! | `log_file`, `snapshot_file` | the on-disk layout; only a crash's torn tail is repaired, a log with a hole is refused |
//! | `log_store` | nothing is reported durable before its fsync; an appended entry is readable at once |
//! | `proposer` | log order is arrival order; each writer gets its own answer |
//! | `state_machine` | a snapshot never holds part of a log entry; replay skips the hook |
//! | `node` | a handle is given out only after recovery is complete |
//! | `wire` | only holders of the cluster secret exchange frames; every frame is checked |
//! | `link_tls` | with TLS settings, a link is encrypted and both ends hold a certificate of the cluster's CA |
//! | `peer`, `rpc` | every call to another node ends, answered or failed |
//! | `network` | raft reaches other nodes only through the peer links |
//! | `cluster` | requests from other nodes are served only on authenticated links |
//! | `route` | a write or linearizable read waits at most the quorum wait |
//! | `runtime` | raft's tasks never queue behind connections other than those of a thread it is lent |

mod cluster;
mod error;
mod files;
mod flavor;
mod legacy_log;
mod link_tls;
mod log_file;
mod log_store;
mod network;
mod node;
mod options;
mod peer;
mod pipeline;
mod proposer;
mod recover;
mod route;
mod rpc;
mod runtime;
mod snapshot_file;
mod state_machine;
mod stats;
mod status;
mod sync;
mod types;
mod uring;
mod wire;

#[cfg(test)]
mod tests;

pub use cluster::{AppHandler, ClusterOptions, MembershipError, DEFAULT_PIPELINE_DEPTH};
pub use error::{OpenError, ShutdownError, WriteError};
pub use files::FORMAT_VERSION;
pub use link_tls::LinkTls;
#[doc(hidden)]
pub use log_file::replay_segment;
pub use log_file::LOG_FORMAT;
pub use node::StoreNode;
pub use options::NodeOptions;
pub use proposer::PendingWrite;
pub use runtime::SharedThread;
pub use state_machine::{set_after_snapshot, ApplyHook, InstallHook};
pub use stats::{RaftFigures, StoreStats, LOG_WRITE_BUCKETS_US};
pub use status::{ClusterStatus, MemberStatus, NodeReport, Role};
pub use types::{NodeId, DEFAULT_NODE_ID};
pub use uring::direct_log_writes_work;
