//! The durable replicated log behind the mqkv state store.
//!
//! A [`StoreNode`] runs one member of an openraft group whose entries are
//! [`mqkv_store::Entry`]s and whose state machine is
//! [`mqkv_store::StateMachine`]. A single server is a one-member group,
//! created and initialised the first time its data directory is opened;
//! later work only adds members and a real transport.
//!
//! ```text
//! write(entry) ─► proposer ─► raft core ─► log store ─► writer thread ─► raft-log.redb (fsync)
//!   (queued writes become one proposal)                                       │ flushed
//!                                                                              ▼
//!                                 raft commits ─► state machine apply ─► on_apply hook
//!                                                      │
//!                        every N entries: snapshot ─► state.redb (fsync), then purge the log
//! ```
//!
//! # mqkv-raft: durability and the loss window
//!
//! **An acknowledged write is never lost.** `StoreNode::write` returns only
//! after the entry is in a redb transaction of the log file committed with
//! `Durability::Immediate` (an fsync) *and* applied to the state machine.
//! `kill -9` or power loss at any moment, followed by a restart, finds every
//! acknowledged entry: the latest snapshot is loaded and every log entry
//! after it is applied again before [`StoreNode::open_disk`] returns.
//!
//! A write that had not returned when the process died may or may not be
//! there after the restart (it is there if its fsync completed), never half
//! of it: each redb commit is all-or-nothing. A client that retries with the
//! same de-duplication identity gets the first answer either way. All of
//! this assumes the disk keeps what `fsync` says it wrote.
//!
//! What is written where:
//!
//! | data | file | when it is durable |
//! |---|---|---|
//! | log entries (every write) | `raft-log.redb` | before the write is acknowledged |
//! | raft vote | `raft-log.redb` | before raft acts on it |
//! | last purged log id | `raft-log.redb` | with the purge |
//! | committed log id | `raft-log.redb` | with the next fsync; only shortens replay |
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
//! entries, is purged. The log therefore stays short and a restart is a
//! snapshot load plus a short replay. Log entries are read back from the
//! file; memory holds only the entries still being written.
//!
//! Files carry a format version ([`FORMAT_VERSION`]). A file of another
//! version, a damaged or truncated file (redb verifies every page checksum
//! when it opens a file) and a file another process has open are refused
//! with an [`OpenError`] naming the file; nothing is written to the refused
//! file and no file is created next to it.
//!
//! The apply hook is installed only after recovery: entries replayed from
//! the log at startup never reach it.
//!
//! | module | invariant it protects |
//! |---|---|
//! | `files` | only complete, checked files of this format are opened |
//! | `log_file`, `snapshot_file` | the on-disk layout; a log with a hole is refused |
//! | `log_writer` | nothing is reported durable before its fsync |
//! | `log_store` | an appended entry is readable at once and found exactly once |
//! | `proposer` | log order is arrival order; each writer gets its own answer |
//! | `state_machine` | a snapshot never holds part of a log entry; replay skips the hook |
//! | `node` | a handle is given out only after recovery is complete |
//! | `network` | the only place that will talk to other nodes |
//! | `runtime` | raft's tasks never queue behind client connections |

mod error;
mod files;
mod log_file;
mod log_store;
mod log_writer;
mod network;
mod node;
mod proposer;
mod runtime;
mod snapshot_file;
mod state_machine;
mod stats;
mod sync;
mod types;

#[cfg(test)]
mod tests;

pub use error::{OpenError, ShutdownError, WriteError};
pub use files::FORMAT_VERSION;
pub use node::{NodeOptions, StoreNode};
pub use state_machine::ApplyHook;
pub use stats::StoreStats;
pub use types::{NodeId, DEFAULT_NODE_ID};
