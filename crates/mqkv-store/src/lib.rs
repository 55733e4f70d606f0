//! The mqkv state store as a deterministic state machine.
//!
//! Feed it log [`Entry`]s with [`StateMachine::apply`]; read it with
//! [`StateMachine::get`] and [`StateMachine::scan`]. It does no I/O, reads
//! no clock and uses no randomness: the proposer's wall clock, the
//! request's `__ts`/`__ft` and its de-duplication identity all arrive inside
//! the entry. Applying the same entries to two machines — on two replicas,
//! or after a crash and replay — gives the same answers, the same versions
//! and the same change events.
//!
//! KEYNOTIFY registrations are not here: they belong to the node the
//! observer is connected to. The machine emits [`ChangeEvent`]s and the
//! server turns them into notifications for its local observers.
//!
//! | module | invariant it protects |
//! |---|---|
//! | `machine` | key records, expiry index and byte count always agree |
//! | `validate` | skewed or missing timestamps change nothing |
//! | `set`, `del`, `vdel` | wire-compat 3.1 / 5.4 / 5.5 semantics per verb |
//! | `get`, `scan` | expired keys are never returned; scans are bounded |
//! | `expire` | every expiry produces a DELETE event |
//! | `fencing` | a fenced key never accepts a lower token |
//! | `quota` | `max_keys` / `max_bytes` are never exceeded |
//! | `dedup` | a redelivered write gets its first answer |
//! | `snapshot` | serialize + deserialize gives an equal machine |
//! | `meta` | the cluster table is opaque and outside quotas and events |
//! | `freeze` | a snapshot taken piecewise holds the state of one moment |

mod browse;
#[cfg(test)]
mod cas_tests;
mod config;
mod dedup;
mod del;
mod entry;
mod expire;
mod fencing;
mod freeze;
mod get;
mod history;
mod machine;
mod meta;
mod quota;
mod scan;
mod set;
mod snapshot;
mod validate;
mod vdel;

pub use browse::{RecordPage, RecordView};
pub use config::{StoreConfig, DEFAULT_SCAN_PAGE_SIZE};
pub use dedup::{CAPACITY as DEDUP_CAPACITY, MAX_RETENTION_MS as DEDUP_MAX_RETENTION_MS};
pub use entry::{Applied, ChangeEvent, ChangeKind, DedupId, Entry, Limits, Op, Request};
pub use freeze::{Frozen, FrozenSnapshot, Thawed};
pub use history::{
    Compacted, HistoryLimits, DEFAULT_HISTORY_BYTES, DEFAULT_HISTORY_CHANGES, DEFAULT_HISTORY_MS,
};
pub use machine::StateMachine;
pub use meta::MetaChange;
pub use scan::SCAN_TOKEN_PREFIX;
pub use snapshot::{SnapshotCopy, SNAPSHOT_FORMAT};
pub use validate::validate;
