//! Errors of opening, writing and shutting down a store.
//!
//! Invariant: every error about a data file names that file, so an operator
//! knows which file to look at without reading code.

use std::io;
use std::path::PathBuf;

use crate::types::NodeId;

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process (or another store in this process) has the file open.
    #[error("{path} is in use by another process (or another store in this process)")]
    InUse { path: PathBuf },

    /// The file was written by a build with another on-disk format.
    #[error(
        "{path} has on-disk format version {found}, this build reads version {supported}; \
         refusing to open it"
    )]
    UnsupportedFormat {
        path: PathBuf,
        found: u64,
        supported: u64,
    },

    /// The file is damaged, truncated, or not an mqkv data file. Nothing was
    /// written to it.
    #[error("{path} is corrupt or truncated: {reason}")]
    Corrupt { path: PathBuf, reason: String },

    /// The files of the data directory do not belong together.
    #[error("data directory {dir} is inconsistent: {reason}")]
    Inconsistent { dir: PathBuf, reason: String },

    /// An operating system error on a file or directory.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The raft node could not be started or did not become ready.
    #[error("cannot start the replicated log: {0}")]
    Start(String),
}

impl OpenError {
    /// [`OpenError::Start`] with `why`.
    pub(crate) fn start(why: impl std::fmt::Display) -> OpenError {
        OpenError::Start(why.to_string())
    }
}

/// Why a write was not acknowledged. The entry may or may not have been
/// applied (it may still be applied later); retrying with the same
/// de-duplication identity gives the first answer if it was.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// This node is not the leader of the group.
    #[error("this node is not the leader{}", leader_hint(.leader))]
    NotLeader { leader: Option<NodeId> },

    /// The store was shut down, or stopped after a storage failure.
    #[error("the store is shut down")]
    Stopped,

    /// Reading or writing the data files failed; the store stops.
    #[error("storage failure: {0}")]
    Storage(String),

    /// Anything else the log reported.
    #[error("replicated log error: {0}")]
    Raft(String),

    /// No leader that can reach a quorum answered in time (a node cut off
    /// from most of its group, or an election under way). The write may
    /// still be applied later.
    #[error("the state store is unavailable: {0}")]
    Unavailable(String),
}

fn leader_hint(leader: &Option<NodeId>) -> String {
    match leader {
        Some(id) => format!(" (the leader is node {id})"),
        None => String::new(),
    }
}

/// Why a shutdown did not finish cleanly. The data files are still
/// consistent: every acknowledged write is in them.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    /// The raft task ended abnormally.
    #[error("the raft task did not stop cleanly: {0}")]
    Raft(String),

    /// The final flush of the log file failed.
    #[error("closing {path}: {reason}")]
    Close { path: PathBuf, reason: String },
}
