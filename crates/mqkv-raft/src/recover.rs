//! Recovery: the store's files opened and checked against each other, the log read back and
//! the state rebuilt from the snapshot, before raft starts.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use mqkv_store::{StateMachine, StoreConfig};

use crate::files::{self, corrupt, io_error, read_meta, FileKind, Location};
use crate::log_store::LogStore;
use crate::options::NodeOptions;
use crate::snapshot_file::{self, SnapshotFile, StoredSnapshot, STORE_CONFIG_META};
use crate::state_machine::{AppliedState, Keep, StateShared};
use crate::stats::Counters;
use crate::types::{LogId, Membership, NodeId};
use crate::OpenError;
use crate::{legacy_log, log_file};

/// Files opened and checked, state rebuilt from the snapshot: what raft
/// starts from.
pub(crate) struct Recovered {
    pub(crate) log: LogStore,
    pub(crate) state: Arc<StateShared>,
    pub(crate) node_id: NodeId,
    pub(crate) last_index: Option<u64>,
    pub(crate) log_path: PathBuf,
}

pub(crate) fn recover(
    location: &Location,
    config: StoreConfig,
    options: &NodeOptions,
    counters: Arc<Counters>,
) -> Result<Recovered, OpenError> {
    if let Location::Disk(dir) = location {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    }
    // Existing files are checked before anything is created, so a refused
    // directory gains no new file.
    let log = match location {
        Location::Disk(dir) => {
            legacy_log::convert(dir)?;
            log_file::open(dir, options.log_segment_bytes)?
        }
        Location::Memory => None,
    };
    let state_file = files::open_existing(location, FileKind::State)?;
    let snapshot = match &state_file {
        Some(file) => snapshot_file::load(&file.db, &file.path)?,
        None => None,
    };
    let (last_purged, log_is_new) = match &log {
        Some((_, loaded)) => (loaded.last_purged, loaded.is_new()),
        None => (None, true),
    };
    check_consistency(location, last_purged, log_is_new, snapshot.as_ref())?;
    let log = match (location, log) {
        (_, Some(log)) => Some(log),
        (Location::Disk(dir), None) => Some(log_file::create(
            dir,
            options.node_id,
            options.log_segment_bytes,
        )?),
        (Location::Memory, None) => None,
    };
    let state_file = match state_file {
        Some(file) => file,
        None => {
            let config_bytes = postcard::to_stdvec(&config).map_err(OpenError::start)?;
            files::create(
                location,
                FileKind::State,
                &[(STORE_CONFIG_META, config_bytes)],
            )?
        }
    };
    let node_id = match &log {
        Some((_, loaded)) => loaded.node_id,
        None => options.node_id,
    };
    if options.cluster.is_some() && node_id != options.node_id {
        // A node answering to another id would vote and hold log entries
        // under a name the group gave to someone else.
        return Err(OpenError::Inconsistent {
            dir: location.dir(),
            reason: format!(
                "it belongs to node {node_id}, but this node was started as node {}",
                options.node_id
            ),
        });
    }
    let stored_config = read_meta(&state_file.db, STORE_CONFIG_META, &state_file.path)?
        .ok_or_else(|| corrupt(&state_file.path, "it records no store configuration"))?;
    let stored_config: StoreConfig = postcard::from_bytes(&stored_config).map_err(|e| {
        corrupt(
            &state_file.path,
            format!("its store configuration does not decode: {e}"),
        )
    })?;
    if stored_config.node_id != config.node_id {
        // Versions must keep their node id for the life of the store.
        tracing::warn!(
            store = %state_file.path.display(),
            stored = %stored_config.node_id,
            given = %config.node_id,
            "the store keeps the node id it was created with"
        );
    }
    // Entries are replayed under the configuration they were first applied
    // under; new limits take effect through an `Op::SetLimits` entry that the
    // caller proposes after recovery.

    let state = match &snapshot {
        Some((meta, data)) => AppliedState {
            machine: postcard::from_bytes(data).map_err(|e| {
                corrupt(
                    &state_file.path,
                    format!("the snapshot does not decode: {e}"),
                )
            })?,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        },
        None => AppliedState {
            machine: StateMachine::new(stored_config),
            last_applied: None,
            membership: Membership::default(),
        },
    };
    let last_index = log.as_ref().and_then(|(_, loaded)| loaded.last_index());
    let log_path = location.log_path();
    let log = LogStore::start(
        log,
        log_path.clone(),
        counters.clone(),
        options.thread.is_some(),
        options.direct_log_writes,
    );
    let shared = StateShared::new(
        state,
        SnapshotFile::new(state_file.db, state_file.path),
        snapshot,
        counters,
        match location {
            Location::Disk(_) => Keep::Data,
            Location::Memory => Keep::MetaOnly,
        },
        options.piecewise_snapshot_keys,
    );
    Ok(Recovered {
        log,
        state: Arc::new(shared),
        node_id,
        last_index,
        log_path,
    })
}

/// The log and the snapshot must describe one history: entries the log
/// purged must be inside the snapshot, and a snapshot needs the log (with
/// its vote) it was taken from.
fn check_consistency(
    location: &Location,
    last_purged: Option<LogId>,
    log_is_new: bool,
    snapshot: Option<&StoredSnapshot>,
) -> Result<(), OpenError> {
    let log_path = location.log_path();
    let state_path = location.path(FileKind::State);
    let snapshot_end = snapshot.and_then(|(meta, _)| meta.last_log_id);
    let inconsistent = |reason: String| OpenError::Inconsistent {
        dir: location.dir(),
        reason,
    };
    if let Some(purged) = last_purged {
        if snapshot_end < Some(purged) {
            let covered = match snapshot_end {
                Some(end) => format!("its snapshot ends at entry {}", end.index),
                None => "it holds no snapshot".to_string(),
            };
            return Err(inconsistent(format!(
                "{} is purged up to entry {}, but {} {covered}: entries in between are lost",
                log_path.display(),
                purged.index,
                state_path.display(),
            )));
        }
    }
    if let (true, Some(end)) = (log_is_new, snapshot_end) {
        return Err(inconsistent(format!(
            "{} holds a snapshot up to entry {}, but {} is empty: the log file was lost or replaced",
            state_path.display(),
            end.index,
            log_path.display(),
        )));
    }
    Ok(())
}
