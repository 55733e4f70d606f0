//! Layout of the state file: the latest snapshot of the state machine.
//!
//! | table | key | value |
//! |---|---|---|
//! | `snapshot` | `"meta"` | postcard of the openraft snapshot meta (last log id, membership) |
//! | `snapshot` | `"data/0000000000"`, `"data/0000000001"`, … | postcard of [`mqkv_store::StateMachine`], in pieces of at most [`CHUNK_BYTES`] |
//!
//! The data is kept in pieces because redb holds a large value whole in
//! memory until its transaction commits (rounded up to a power of two:
//! 256 MB for a 170 MB snapshot), while ordinary pieces are written out
//! as the transaction goes. Files of earlier versions hold the data under
//! one key, `"data"`; it is read as it is and replaced by pieces at the
//! next snapshot.
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
/// The data of files written before it was stored in pieces.
const LEGACY_DATA_KEY: &str = "data";
/// Prefix of the data's pieces; every piece key sorts between this and
/// [`CHUNKS_END`].
const CHUNK_PREFIX: &str = "data/";
const CHUNKS_END: &str = "data0";
/// Largest piece of a snapshot's data. redb gives a large value a page of
/// its own whose size is a power of two, and the page also holds the key
/// and the leaf's header: a piece of exactly 1 MiB took a 2 MiB page, so
/// every snapshot wrote twice its size to disk.
pub(crate) const CHUNK_BYTES: usize = (1 << 20) - 4096;

fn chunk_key(index: usize) -> String {
    format!("{CHUNK_PREFIX}{index:010}")
}

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
    let mut data: Option<Vec<u8>> = None;
    let chunks = table
        .range(CHUNK_PREFIX..CHUNKS_END)
        .map_err(|e| storage(e.into()))?;
    for (index, chunk) in chunks.enumerate() {
        let (key, value) = chunk.map_err(|e| storage(e.into()))?;
        if key.value() != chunk_key(index) {
            return Err(ReadError::Decode(format!(
                "the snapshot's piece {} is missing (found {:?} in its place)",
                index,
                key.value()
            )));
        }
        data.get_or_insert_with(Vec::new)
            .extend_from_slice(value.value());
    }
    let legacy = table.get(LEGACY_DATA_KEY).map_err(|e| storage(e.into()))?;
    let data = match (data, legacy) {
        (Some(_), Some(_)) => {
            return Err(ReadError::Decode(
                "the snapshot has its data both whole and in pieces".into(),
            ))
        }
        (Some(data), None) => Some(data),
        (None, Some(legacy)) => Some(legacy.value().to_vec()),
        (None, None) => None,
    };
    match (meta, data) {
        (None, None) => Ok(None),
        (Some(meta), Some(data)) => {
            let meta: SnapshotMeta = postcard::from_bytes(meta.value()).map_err(|e| {
                ReadError::Decode(format!("the snapshot meta does not decode: {e}"))
            })?;
            Ok(Some((meta, data)))
        }
        _ => Err(ReadError::Decode(
            "the snapshot is incomplete (meta without data or data without meta)".into(),
        )),
    }
}

/// An error of the state file at `path`, as reported.
fn in_file(path: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", path.display())
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
        self.save_with(|pieces| {
            for chunk in data.chunks(CHUNK_BYTES) {
                pieces.put(chunk)?;
            }
            Ok(meta.clone())
        })
    }

    /// Writes a snapshot whose data `write` produces into the file's
    /// transaction piece by piece, so the data is never held whole; `write`
    /// returns the snapshot's meta. Unless the stored snapshot is at least
    /// as new, the transaction commits durably. Returns whether it did.
    pub(crate) fn save_with(
        &self,
        write: impl FnOnce(&mut Pieces<'_>) -> Result<SnapshotMeta, String>,
    ) -> Result<bool, String> {
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| self.closed())?;
        let mut txn = db.begin_write().map_err(|e| in_file(&self.path, e))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|e| in_file(&self.path, e))?;
        {
            let table = txn
                .open_table(SNAPSHOT)
                .map_err(|e| in_file(&self.path, e))?;
            let mut pieces = Pieces {
                table,
                next: 0,
                path: &self.path,
            };
            pieces
                .table
                .remove(LEGACY_DATA_KEY)
                .map_err(|e| in_file(&self.path, e))?;
            pieces.clear()?;
            // On an error the transaction is dropped, not committed: the
            // file keeps the snapshot it had.
            let meta = write(&mut pieces)?;
            let table = &mut pieces.table;
            let stored = table
                .get(META_KEY)
                .map_err(|e| in_file(&self.path, e))?
                .map(|guard| guard.value().to_vec());
            // Unreadable stored meta is simply replaced by good data.
            let stored = stored.and_then(|bytes| postcard::from_bytes::<SnapshotMeta>(&bytes).ok());
            if stored.is_some_and(|stored| stored.last_log_id >= meta.last_log_id) {
                return Ok(false);
            }
            let meta_bytes = postcard::to_stdvec(&meta).map_err(|e| in_file(&self.path, e))?;
            table
                .insert(META_KEY, meta_bytes.as_slice())
                .map_err(|e| in_file(&self.path, e))?;
        }
        txn.commit().map_err(|e| in_file(&self.path, e))?;
        Ok(true)
    }

    /// The stored snapshot.
    pub(crate) fn read(&self) -> Result<Option<StoredSnapshot>, String> {
        let guard = self.db();
        let db = guard.as_ref().ok_or_else(|| self.closed())?;
        read(db).map_err(|e| in_file(&self.path, e))
    }

    /// Closes the file; later saves and reads fail.
    pub(crate) fn close(&self) {
        drop(self.db().take());
    }
}

/// The data pieces of a snapshot being written, in the state file's write
/// transaction.
pub(crate) struct Pieces<'t> {
    table: redb::Table<'t, &'static str, &'static [u8]>,
    /// Number of the next piece.
    next: usize,
    path: &'t Path,
}

impl Pieces<'_> {
    /// Adds the next piece of the data, of at most [`CHUNK_BYTES`].
    pub(crate) fn put(&mut self, piece: &[u8]) -> Result<(), String> {
        self.table
            .insert(chunk_key(self.next).as_str(), piece)
            .map_err(|e| in_file(self.path, e))?;
        self.next += 1;
        Ok(())
    }

    /// Removes every piece: those put so far, and the stored snapshot's.
    pub(crate) fn clear(&mut self) -> Result<(), String> {
        self.table
            .retain_in(CHUNK_PREFIX..CHUNKS_END, |_, _| false)
            .map_err(|e| in_file(self.path, e))?;
        self.next = 0;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::types::{LogId, Membership};

    /// The meta of a snapshot up to entry `index`.
    pub(crate) fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
            last_membership: Membership::default(),
            snapshot_id: format!("s-{index}"),
        }
    }

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Looks into the snapshot table as stored.
    fn inspect<R>(
        file: &SnapshotFile,
        f: impl FnOnce(&redb::ReadOnlyTable<&str, &[u8]>) -> R,
    ) -> R {
        let guard = file.db();
        let db = guard.as_ref().expect("open");
        let txn = db.begin_read().expect("read");
        f(&txn.open_table(SNAPSHOT).expect("table"))
    }

    /// Changes the snapshot table behind the file's back.
    fn tamper(file: &SnapshotFile, f: impl FnOnce(&mut redb::Table<&str, &[u8]>)) {
        let guard = file.db();
        let db = guard.as_ref().expect("open");
        let txn = db.begin_write().expect("write");
        f(&mut txn.open_table(SNAPSHOT).expect("table"));
        txn.commit().expect("commit");
    }

    fn pieces(file: &SnapshotFile) -> Vec<String> {
        inspect(file, |table| {
            table
                .range(CHUNK_PREFIX..CHUNKS_END)
                .expect("range")
                .map(|entry| entry.expect("entry").0.value().to_owned())
                .collect()
        })
    }

    pub(crate) fn file(dir: &tempfile::TempDir) -> SnapshotFile {
        let path = dir.path().join("state.redb");
        let db = Database::create(&path).expect("create");
        SnapshotFile::new(db, path)
    }

    #[test]
    fn data_larger_than_a_piece_is_stored_in_pieces_and_read_back_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = file(&dir);
        let big = data(2 * CHUNK_BYTES + 12_345, 1);
        assert!(file.save(&meta(10), &big).expect("save"));
        assert_eq!(
            pieces(&file),
            vec![chunk_key(0), chunk_key(1), chunk_key(2)]
        );
        let (stored_meta, stored) = file.read().expect("read").expect("a snapshot");
        assert_eq!(stored_meta, meta(10));
        assert_eq!(stored, big);

        // A smaller, newer snapshot leaves no piece of the older one behind.
        let small = data(100, 2);
        assert!(file.save(&meta(20), &small).expect("save"));
        assert_eq!(pieces(&file), vec![chunk_key(0)]);
        assert_eq!(file.read().expect("read"), Some((meta(20), small)));

        // An older one is not written.
        assert!(!file.save(&meta(15), &big).expect("save"));
        assert_eq!(file.read().expect("read").map(|(m, _)| m), Some(meta(20)));
    }

    #[test]
    fn a_file_of_an_earlier_version_is_read_and_replaced_by_pieces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = file(&dir);
        let old = data(3_000, 3);
        tamper(&file, |table| {
            let meta_bytes = postcard::to_stdvec(&meta(5)).expect("meta");
            table.insert(META_KEY, meta_bytes.as_slice()).expect("meta");
            table.insert(LEGACY_DATA_KEY, old.as_slice()).expect("data");
        });
        assert_eq!(file.read().expect("read"), Some((meta(5), old)));
        let new = data(CHUNK_BYTES + 1, 4);
        assert!(file.save(&meta(6), &new).expect("save"));
        assert_eq!(file.read().expect("read"), Some((meta(6), new)));
        assert!(inspect(&file, |table| table
            .get(LEGACY_DATA_KEY)
            .expect("get")
            .is_none()));
    }

    #[test]
    fn a_snapshot_written_piece_by_piece_can_start_over_and_fail_cleanly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = file(&dir);
        let first = data(2 * CHUNK_BYTES + 7, 6);
        assert!(file.save(&meta(3), &first).expect("save"));

        // Pieces put before a start over are gone; the data is what came after.
        let second = data(CHUNK_BYTES + 1, 7);
        let written = file
            .save_with(|pieces| {
                pieces.put(&data(CHUNK_BYTES, 8))?;
                pieces.put(&data(CHUNK_BYTES, 9))?;
                pieces.put(&data(10, 10))?;
                pieces.clear()?;
                for chunk in second.chunks(CHUNK_BYTES) {
                    pieces.put(chunk)?;
                }
                Ok(meta(4))
            })
            .expect("save");
        assert!(written);
        assert_eq!(pieces(&file), vec![chunk_key(0), chunk_key(1)]);
        assert_eq!(file.read().expect("read"), Some((meta(4), second.clone())));

        // A failure part way keeps the snapshot the file had, whole.
        let error = file
            .save_with(|pieces| {
                pieces.put(&data(CHUNK_BYTES, 11))?;
                Err("serialization failed".to_owned())
            })
            .expect_err("the write fails");
        assert_eq!(error, "serialization failed");
        assert_eq!(file.read().expect("read"), Some((meta(4), second.clone())));

        // An older snapshot is not written, however it was produced.
        let written = file
            .save_with(|pieces| {
                pieces.put(&data(100, 12))?;
                Ok(meta(2))
            })
            .expect("save");
        assert!(!written);
        assert_eq!(file.read().expect("read"), Some((meta(4), second)));
    }

    /// Each piece fits the page redb gives it with little to spare, so a
    /// snapshot takes about its own size in the file, not twice that.
    #[test]
    fn pieces_take_about_their_size_in_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = file(&dir);
        let snapshot = data(16 * CHUNK_BYTES, 13);
        let mut sizes = Vec::new();
        for index in 1..=4 {
            assert!(file.save(&meta(index), &snapshot).expect("save"));
            let size = std::fs::metadata(dir.path().join("state.redb"))
                .expect("metadata")
                .len();
            sizes.push(size as f64 / snapshot.len() as f64);
        }
        // A save writes while the stored snapshot is still there, and redb
        // grows its file by more than it needs: three snapshots' worth here,
        // five when each piece took a page twice its size.
        assert!(
            sizes.iter().all(|s| *s < 3.5),
            "file sizes in snapshots: {sizes:?}"
        );
    }

    #[test]
    fn a_missing_piece_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = file(&dir);
        assert!(file
            .save(&meta(1), &data(3 * CHUNK_BYTES, 5))
            .expect("save"));
        tamper(&file, |table| {
            table.remove(chunk_key(1).as_str()).expect("remove");
        });
        let error = file.read().expect_err("a hole in the data");
        assert!(error.contains("piece 1 is missing"), "{error}");
    }
}
