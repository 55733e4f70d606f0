//! Layout of the state file: the latest snapshot of the state machine.
//!
//! | table | key | value |
//! |---|---|---|
//! | `snapshot` | `"meta"` | postcard of the openraft snapshot meta (last log id, membership) |
//! | `snapshot` | `"data"` | postcard of [`mqkv_store::StateMachine`] |
//!
//! The meta table also holds the [`mqkv_store::StoreConfig`] the store was
//! created with, so entries are replayed under the same limits they were
//! first applied under.
//!
//! Invariants: meta and data are written in one durable transaction, so
//! they always belong together; a snapshot never replaces a newer one.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableError};

use crate::files::{corrupt, storage_error};
use crate::sync;
use crate::types::SnapshotMeta;
use crate::OpenError;

const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
const META_KEY: &str = "meta";
const DATA_KEY: &str = "data";

/// Meta key of the store configuration, written when the file is created.
pub(crate) const STORE_CONFIG_META: &str = "store_config";

/// A snapshot as stored: its meta and the serialized state machine.
pub(crate) type StoredSnapshot = (SnapshotMeta, Vec<u8>);

/// Reads the stored snapshot, if any, at startup.
pub(crate) fn load(db: &Database, path: &Path) -> Result<Option<StoredSnapshot>, OpenError> {
    read(db).map_err(|e| match e {
        ReadError::Storage(e) => storage_error(path, e),
        ReadError::Decode(reason) => corrupt(path, reason),
    })
}

enum ReadError {
    Storage(redb::Error),
    Decode(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Storage(e) => e.fmt(f),
            ReadError::Decode(reason) => f.write_str(reason),
        }
    }
}

fn read(db: &Database) -> Result<Option<StoredSnapshot>, ReadError> {
    let storage = |e: redb::Error| ReadError::Storage(e);
    let txn = db.begin_read().map_err(|e| storage(e.into()))?;
    let table = match txn.open_table(SNAPSHOT) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(storage(e.into())),
    };
    let meta = table.get(META_KEY).map_err(|e| storage(e.into()))?;
    let data = table.get(DATA_KEY).map_err(|e| storage(e.into()))?;
    match (meta, data) {
        (None, None) => Ok(None),
        (Some(meta), Some(data)) => {
            let meta: SnapshotMeta = postcard::from_bytes(meta.value()).map_err(|e| {
                ReadError::Decode(format!("the snapshot meta does not decode: {e}"))
            })?;
            Ok(Some((meta, data.value().to_vec())))
        }
        _ => Err(ReadError::Decode(
            "the snapshot is incomplete (meta without data or data without meta)".into(),
        )),
    }
}

/// The state file while the store runs.
pub(crate) struct SnapshotFile {
    db: Mutex<Option<Database>>,
    path: PathBuf,
}

impl SnapshotFile {
    pub(crate) fn new(db: Database, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            db: Mutex::new(Some(db)),
            path,
        }
    }

    fn db(&self) -> MutexGuard<'_, Option<Database>> {
        sync::lock(&self.db)
    }

    fn closed(&self) -> String {
        format!("{} is closed", self.path.display())
    }

    /// Writes a snapshot durably, unless the stored one is at least as new.
    /// Returns whether it was written.
    pub(crate) fn save(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<bool, String> {
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| self.closed())?;
        let in_file = |e: &dyn std::fmt::Display| format!("{}: {e}", self.path.display());
        let mut txn = db.begin_write().map_err(|e| in_file(&e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| in_file(&e))?;
        {
            let mut table = txn.open_table(SNAPSHOT).map_err(|e| in_file(&e))?;
            let stored = table
                .get(META_KEY)
                .map_err(|e| in_file(&e))?
                .map(|guard| guard.value().to_vec());
            // Unreadable stored meta is simply replaced by good data.
            let stored = stored.and_then(|bytes| postcard::from_bytes::<SnapshotMeta>(&bytes).ok());
            if stored.is_some_and(|stored| stored.last_log_id >= meta.last_log_id) {
                return Ok(false);
            }
            let meta_bytes = postcard::to_stdvec(meta).map_err(|e| in_file(&e))?;
            table
                .insert(META_KEY, meta_bytes.as_slice())
                .map_err(|e| in_file(&e))?;
            table.insert(DATA_KEY, data).map_err(|e| in_file(&e))?;
        }
        txn.commit().map_err(|e| in_file(&e))?;
        Ok(true)
    }

    /// The stored snapshot.
    pub(crate) fn read(&self) -> Result<Option<StoredSnapshot>, String> {
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| self.closed())?;
        read(db).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    /// Closes the file; later saves and reads fail.
    pub(crate) fn close(&self) {
        drop(self.db().take());
    }
}
