//! openraft's own conformance tests for log and state machine storage:
//! votes, appends, truncation, purging, membership, snapshots.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

use super::config;
use crate::files::Location;
use crate::log_store::LogStore;
use crate::recover::recover;
use crate::state_machine::StateMachineStore;
use crate::stats::Counters;
use crate::types::{StorageError, TypeConfig};
use crate::NodeOptions;

/// A fresh store on disk (segments of `segment_bytes`), or in memory.
struct FreshStore {
    memory: bool,
    segment_bytes: u64,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temporary directory");
        let location = match self.memory {
            true => Location::Memory,
            false => Location::Disk(dir.path().to_path_buf()),
        };
        let counters = Arc::new(Counters::default());
        let options = NodeOptions {
            log_segment_bytes: self.segment_bytes,
            ..NodeOptions::default()
        };
        let recovered =
            recover(&location, config(), &options, counters).expect("a fresh store opens");
        Ok((dir, recovered.log, StateMachineStore::new(recovered.state)))
    }
}

#[test]
fn storage_passes_the_openraft_suite() {
    Suite::test_all(FreshStore {
        memory: false,
        segment_bytes: NodeOptions::default().log_segment_bytes,
    })
    .expect("openraft storage suite");
}

/// Segments so small that nearly every append starts a new one, so
/// purges delete segments and truncations cross them.
#[test]
fn tiny_segments_pass_the_openraft_suite() {
    Suite::test_all(FreshStore {
        memory: false,
        segment_bytes: 64,
    })
    .expect("openraft storage suite");
}

#[test]
fn memory_storage_passes_the_openraft_suite() {
    Suite::test_all(FreshStore {
        memory: true,
        segment_bytes: NodeOptions::default().log_segment_bytes,
    })
    .expect("openraft storage suite");
}
