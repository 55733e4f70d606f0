//! Store configuration.
//!
//! Invariant: a configuration is part of the replicated state. Every replica
//! must apply entries under the same configuration, or the same log would
//! give different answers (a quota refusal on one node, success on another),
//! so it travels inside snapshots and is not read from anywhere at apply time.

use serde::{Deserialize, Serialize};

/// Limits and identity of one state store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// Node id stamped on every version (the third HLC field). Must be the
    /// same on every replica of a cluster and stable across restarts: the
    /// Rust SDK tests assert that successive versions of a key share it.
    /// A `:` would make versions unparsable and is replaced by `-`.
    pub node_id: String,
    /// Maximum number of keys, or unlimited.
    pub max_keys: Option<u64>,
    /// Maximum of the sum of key and value lengths over all keys, or unlimited.
    pub max_bytes: Option<u64>,
    /// Matching keys returned per SCAN page (at least 1 is used).
    pub scan_page_size: usize,
}

/// The SCAN tests of the official client allow at most 64 pages for 100
/// matches, so anything above ~2 works; 100 keeps pages small on the wire.
pub const DEFAULT_SCAN_PAGE_SIZE: usize = 100;

impl StoreConfig {
    /// Unlimited store with the default page size.
    pub fn new(node_id: impl Into<String>) -> Self {
        StoreConfig {
            node_id: node_id.into(),
            max_keys: None,
            max_bytes: None,
            scan_page_size: DEFAULT_SCAN_PAGE_SIZE,
        }
    }
}
