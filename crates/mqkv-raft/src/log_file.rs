//! Layout of the log file: the raft log and the raft metadata.
//!
//! | table | key | value |
//! |---|---|---|
//! | `raft_log` | log index (`u64`) | postcard of the openraft entry |
//! | `raft_state` | `"vote"`, `"committed"`, `"last_purged"` | postcard of the id |
//!
//! Invariant: the stored log is contiguous — its first index follows the
//! last purged one and no index is missing after it. [`load`] refuses a file
//! where that does not hold instead of handing raft a log with a hole.

use std::ops::RangeBounds;
use std::path::Path;

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableError,
    WriteTransaction,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::files::{corrupt, storage_error};
use crate::types::{LogId, RaftEntry, Vote};
use crate::OpenError;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const RAFT_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

/// Meta key of the raft node id, written when the file is created.
pub(crate) const NODE_ID_META: &str = "node_id";

/// What startup needs from the log file. Entries stay on disk: raft reads
/// them from there when it applies or replicates them.
#[derive(Debug, Default)]
pub(crate) struct LoadedLog {
    pub(crate) vote: Option<Vote>,
    pub(crate) committed: Option<LogId>,
    pub(crate) last_purged: Option<LogId>,
    /// Id of the last entry present, if any.
    pub(crate) last_entry: Option<LogId>,
}

impl LoadedLog {
    /// Index of the last entry, or of the last purged one if none is left.
    pub(crate) fn last_index(&self) -> Option<u64> {
        self.last_entry.or(self.last_purged).map(|id| id.index)
    }
}

/// One change to the log file. Changes are written in the order raft asked
/// for them, several to a transaction.
#[derive(Debug)]
pub(crate) enum LogWrite {
    Append(Vec<RaftEntry>),
    Vote(Vote),
    Committed(LogId),
    /// Delete entries from this index on.
    Truncate(u64),
    /// Delete entries up to and including this id.
    Purge(LogId),
}

impl LogWrite {
    /// Whether raft waits for this change to be on disk. A committed log id
    /// is only a hint for a faster restart, so it rides along with the next
    /// durable change instead of costing an fsync of its own.
    pub(crate) fn needs_sync(&self) -> bool {
        !matches!(self, LogWrite::Committed(_))
    }
}

/// Reads the raft metadata and checks every entry of the log file: each
/// must decode, sit at its own index, and follow the one before it.
pub(crate) fn load(db: &Database, path: &Path) -> Result<LoadedLog, OpenError> {
    let txn = db.begin_read().map_err(|e| storage_error(path, e))?;
    let mut loaded = LoadedLog::default();
    match txn.open_table(RAFT_STATE) {
        Ok(table) => {
            let get = |key: &str| -> Result<Option<Vec<u8>>, OpenError> {
                let value = table.get(key).map_err(|e| storage_error(path, e))?;
                Ok(value.map(|v| v.value().to_vec()))
            };
            if let Some(bytes) = get(VOTE)? {
                loaded.vote = Some(decode_at_open(&bytes, path, "the vote")?);
            }
            if let Some(bytes) = get(COMMITTED)? {
                loaded.committed = Some(decode_at_open(&bytes, path, "the committed log id")?);
            }
            if let Some(bytes) = get(LAST_PURGED)? {
                loaded.last_purged = Some(decode_at_open(&bytes, path, "the last purged log id")?);
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage_error(path, e)),
    }
    match txn.open_table(LOG) {
        Ok(table) => {
            let first = loaded.last_purged.map_or(0, |id| id.index + 1);
            let rows = table.range(first..).map_err(|e| storage_error(path, e))?;
            for (expected, row) in (first..).zip(rows) {
                let (key, value) = row.map_err(|e| storage_error(path, e))?;
                let index = key.value();
                let entry: RaftEntry =
                    decode_at_open(value.value(), path, &format!("log entry {index}"))?;
                if entry.log_id.index != index {
                    return Err(corrupt(
                        path,
                        format!("log entry {index} says it is entry {}", entry.log_id.index),
                    ));
                }
                if index != expected {
                    return Err(corrupt(
                        path,
                        format!("the log has a hole: entry {expected} is missing before {index}"),
                    ));
                }
                loaded.last_entry = Some(entry.log_id);
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage_error(path, e)),
    }
    Ok(loaded)
}

/// The entries of `range` on disk, in order.
pub(crate) fn read_entries(
    db: &Database,
    range: impl RangeBounds<u64>,
) -> Result<Vec<RaftEntry>, String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = match txn.open_table(LOG) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.to_string()),
    };
    let rows = table
        .range((range.start_bound().cloned(), range.end_bound().cloned()))
        .map_err(|e| e.to_string())?;
    let mut entries = Vec::new();
    for row in rows {
        let (key, value) = row.map_err(|e| e.to_string())?;
        let entry = postcard::from_bytes(value.value())
            .map_err(|e| format!("log entry {} does not decode: {e}", key.value()))?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Id of the last entry on disk.
pub(crate) fn last_entry_id(db: &Database) -> Result<Option<LogId>, String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = match txn.open_table(LOG) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let Some((key, value)) = table.last().map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let entry: RaftEntry = postcard::from_bytes(value.value())
        .map_err(|e| format!("log entry {} does not decode: {e}", key.value()))?;
    Ok(Some(entry.log_id))
}

/// Number of entries on disk.
pub(crate) fn stored_len(db: &Database) -> Result<u64, String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    match txn.open_table(LOG) {
        Ok(table) => table.len().map_err(|e| e.to_string()),
        Err(TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `changes` into `txn`. Returns the encoded size of the entries
/// appended.
pub(crate) fn write<'a>(
    txn: &WriteTransaction,
    changes: impl IntoIterator<Item = &'a LogWrite>,
) -> Result<u64, String> {
    let mut appended = 0;
    let mut log = txn.open_table(LOG).map_err(|e| e.to_string())?;
    let mut state = txn.open_table(RAFT_STATE).map_err(|e| e.to_string())?;
    for change in changes {
        match change {
            LogWrite::Append(entries) => {
                for entry in entries {
                    let bytes = encode(entry)?;
                    appended += bytes.len() as u64;
                    log.insert(entry.log_id.index, bytes.as_slice())
                        .map_err(|e| e.to_string())?;
                }
            }
            LogWrite::Vote(vote) => {
                state
                    .insert(VOTE, encode(vote)?.as_slice())
                    .map_err(|e| e.to_string())?;
            }
            LogWrite::Committed(id) => {
                state
                    .insert(COMMITTED, encode(id)?.as_slice())
                    .map_err(|e| e.to_string())?;
            }
            LogWrite::Truncate(since) => {
                log.retain_in(*since.., |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
            LogWrite::Purge(upto) => {
                state
                    .insert(LAST_PURGED, encode(upto)?.as_slice())
                    .map_err(|e| e.to_string())?;
                log.retain_in(..=upto.index, |_, _| false)
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(appended)
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    postcard::to_stdvec(value).map_err(|e| e.to_string())
}

fn decode_at_open<T: DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
    what: &str,
) -> Result<T, OpenError> {
    postcard::from_bytes(bytes).map_err(|e| corrupt(path, format!("{what} does not decode: {e}")))
}
