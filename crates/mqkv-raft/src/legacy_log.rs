//! Conversion of the raft log written by earlier versions (one redb file,
//! `raft-log.redb`) into log segments.
//!
//! Invariants:
//! - the old file is read and checked completely (every entry decodes, sits
//!   at its own index and follows the one before) before anything is
//!   written, and is deleted only once the new log directory is complete
//!   and synced under its final name;
//! - a conversion interrupted at any point is either redone from the old
//!   file (no log directory yet) or finished (the directory is there, so
//!   only the old file is left to delete).

use std::fs;
use std::path::Path;

use redb::{Database, ReadableDatabase, TableDefinition, TableError};
use serde::de::DeserializeOwned;

use crate::files::{
    corrupt, decode_u64, io_error, open_legacy_log, read_meta, storage_error, sync_dir,
};
use crate::log_file::{self, Record};
use crate::types::{LogId, RaftEntry, Vote};
use crate::OpenError;

/// Name of the old log file in the data directory.
pub(crate) const LEGACY_FILE: &str = "raft-log.redb";

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const RAFT_STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_state");

/// Converts `raft-log.redb` in `data_dir`, if there is one, into the log
/// directory.
pub(crate) fn convert(data_dir: &Path) -> Result<(), OpenError> {
    let path = data_dir.join(LEGACY_FILE);
    if !path.try_exists().map_err(|e| io_error(&path, e))? {
        return Ok(());
    }
    let log_dir = log_file::dir_of(data_dir);
    if !log_dir.try_exists().map_err(|e| io_error(&log_dir, e))? {
        let db = open_legacy_log(&path)?;
        let (start, entries) = read(&db, &path)?;
        drop(db);
        log_file::create_with(data_dir, start, entries)?;
        tracing::info!(from = %path.display(), to = %log_dir.display(), "converted the raft log to segment files");
    }
    fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
    sync_dir(data_dir).map_err(|e| io_error(data_dir, e))
}

fn decode<T: DeserializeOwned>(bytes: &[u8], path: &Path, what: &str) -> Result<T, OpenError> {
    postcard::from_bytes(bytes).map_err(|e| corrupt(path, format!("{what} does not decode: {e}")))
}

/// The old file's state as a start record, and its entries.
fn read(db: &Database, path: &Path) -> Result<(Record, Vec<Record>), OpenError> {
    let node_id = read_meta(db, "node_id", path)?
        .and_then(|bytes| decode_u64(&bytes))
        .ok_or_else(|| corrupt(path, "it records no node id"))?;
    let txn = db.begin_read().map_err(|e| storage_error(path, e))?;
    let mut vote: Option<Vote> = None;
    let mut committed: Option<LogId> = None;
    let mut last_purged: Option<LogId> = None;
    match txn.open_table(RAFT_STATE) {
        Ok(table) => {
            let get = |key: &str| -> Result<Option<Vec<u8>>, OpenError> {
                let value = table.get(key).map_err(|e| storage_error(path, e))?;
                Ok(value.map(|v| v.value().to_vec()))
            };
            if let Some(bytes) = get("vote")? {
                vote = Some(decode(&bytes, path, "the vote")?);
            }
            if let Some(bytes) = get("committed")? {
                committed = Some(decode(&bytes, path, "the committed log id")?);
            }
            if let Some(bytes) = get("last_purged")? {
                last_purged = Some(decode(&bytes, path, "the last purged log id")?);
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage_error(path, e)),
    }
    let mut entries = Vec::new();
    match txn.open_table(LOG) {
        Ok(table) => {
            let first = last_purged.map_or(0, |id| id.index + 1);
            let rows = table.range(first..).map_err(|e| storage_error(path, e))?;
            for (expected, row) in (first..).zip(rows) {
                let (key, value) = row.map_err(|e| storage_error(path, e))?;
                let index = key.value();
                let entry: RaftEntry = decode(value.value(), path, &format!("log entry {index}"))?;
                if entry.log_id.index != index || index != expected {
                    return Err(corrupt(
                        path,
                        format!("log entry {index} is out of place (expected {expected})"),
                    ));
                }
                entries.push(Record::Entry(entry));
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(storage_error(path, e)),
    }
    let start = Record::Start {
        node_id,
        vote,
        committed,
        last_purged,
    };
    Ok((start, entries))
}
