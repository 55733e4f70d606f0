//! [`NodeOptions`]: the tuning of a store.

use std::time::Duration;

use crate::cluster::ClusterOptions;
use crate::runtime::SharedThread;
use crate::types::{NodeId, DEFAULT_NODE_ID};

/// Tuning of a store. The defaults suit a server; tests shrink the
/// snapshot interval to exercise snapshots and purging quickly.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Raft node id of a newly created store. An existing store keeps the
    /// id it was created with.
    pub node_id: NodeId,
    /// Address other nodes reach this one at, recorded in the membership
    /// when the store is created.
    pub advertise_addr: String,
    /// Build a snapshot once this many log entries were applied since the
    /// last one. A log entry carries one write, or several written
    /// concurrently (group commit). Should a snapshot take so long that
    /// twice this many entries follow the newest one, writes wait for it
    /// (up to 5 s).
    pub snapshot_every: u64,
    /// Also build a snapshot once the log written since the last one is
    /// larger than this many bytes and than that snapshot (so a run of big
    /// values cannot make the log outgrow the state it leads to).
    pub snapshot_log_bytes: u64,
    /// Log entries kept behind the latest snapshot (so a follower that lags
    /// a little catches up from the log, not a snapshot).
    pub logs_kept_after_snapshot: u64,
    /// Start a new log segment file once the current one is this long.
    /// Segments are deleted whole once a snapshot covers every entry in
    /// them.
    pub log_segment_bytes: u64,
    /// How long opening waits for a one-member group to elect this node.
    pub ready_timeout: Duration,
    /// A state of at least this many keys is snapshotted piecewise: frozen
    /// at one moment and serialized a piece at a time, writes going on
    /// between the pieces. Serialized whole, a million keys would hold
    /// writes up for a large fraction of a second.
    pub piecewise_snapshot_keys: usize,
    /// Run raft on this thread instead of one of its own (see
    /// [`SharedThread`]); the log's appends are then made durable while the
    /// thread goes on: as direct writes (see `direct_log_writes`), or
    /// synced on a thread of their own.
    pub thread: Option<SharedThread>,
    /// With `thread`, write the log's appends with direct I/O through
    /// io_uring (`O_DIRECT`, `RWF_DSYNC`: durable when done, no page cache
    /// copy, no sync thread), where the system allows it; otherwise, or if
    /// false, through the page cache and an `fdatasync` on a sync thread.
    pub direct_log_writes: bool,
    /// Run as a member of a group of several nodes (see
    /// [`ClusterOptions`]); `None` is a one-member group that talks to
    /// nobody. `node_id` is then the node's id in the group.
    pub cluster: Option<ClusterOptions>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            node_id: DEFAULT_NODE_ID,
            advertise_addr: String::new(),
            snapshot_every: 10_000,
            snapshot_log_bytes: 64 << 20,
            logs_kept_after_snapshot: 1_000,
            log_segment_bytes: 64 << 20,
            ready_timeout: Duration::from_secs(30),
            piecewise_snapshot_keys: 10_000,
            thread: None,
            direct_log_writes: true,
            cluster: None,
        }
    }
}

impl NodeOptions {
    /// The defaults of a memory store (see [`StoreNode::open_memory`]).
    pub fn memory() -> NodeOptions {
        NodeOptions {
            snapshot_every: 1_000,
            logs_kept_after_snapshot: 0,
            ..NodeOptions::default()
        }
    }
}
