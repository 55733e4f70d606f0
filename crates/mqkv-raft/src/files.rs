//! The data files: where they live, how they are created, and the checks
//! every file passes before anything else reads it.
//!
//! Invariants:
//! - a file appears under its final name only once it is complete: it is
//!   built under a temporary name, closed, renamed, and the directory is
//!   synced, so a crash during creation leaves no half-made store;
//! - an existing file is opened only after redb has verified every page
//!   checksum (a damaged file is refused before anything is written to it)
//!   and its `mqkv_meta` table names this format version and the expected
//!   kind of file;
//! - every error names the file it is about.

use std::fmt::Display;
use std::fs;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use redb::backends::InMemoryBackend;
use redb::{Database, DatabaseError, ReadableDatabase, TableDefinition, TableError};

use crate::OpenError;

/// Version of the on-disk layout of both files (tables, keys and value
/// encodings). Bump it when any of them changes.
pub const FORMAT_VERSION: u64 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("mqkv_meta");
const FORMAT_KEY: &str = "format_version";
const KIND_KEY: &str = "file_kind";

/// redb's page cache of the state file, resident memory while the server
/// runs. The file is read once at startup and then written a snapshot at a
/// time, so caching its pages would only hold a second copy of data the
/// state machine already has in memory.
const STATE_CACHE_BYTES: usize = 4 << 20;

/// The redb files of a store. (The raft log is a directory of segments:
/// see `log_file`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// The latest state machine snapshot.
    State,
}

impl FileKind {
    pub(crate) fn file_name(self) -> &'static str {
        match self {
            FileKind::State => "state.redb",
        }
    }

    fn tag(self) -> &'static [u8] {
        match self {
            FileKind::State => b"state",
        }
    }

    fn cache_bytes(self) -> usize {
        match self {
            FileKind::State => STATE_CACHE_BYTES,
        }
    }
}

/// Where a store keeps its files.
#[derive(Debug, Clone)]
pub(crate) enum Location {
    /// Files in this directory.
    Disk(PathBuf),
    /// redb's in-memory backend: the same code path, nothing survives.
    Memory,
}

impl Location {
    /// The path of a file, for opening it and for error messages.
    pub(crate) fn path(&self, kind: FileKind) -> PathBuf {
        match self {
            Location::Disk(dir) => dir.join(kind.file_name()),
            Location::Memory => Path::new("<memory>").join(kind.file_name()),
        }
    }

    /// The raft log's directory, for opening it and for error messages.
    pub(crate) fn log_path(&self) -> PathBuf {
        match self {
            Location::Disk(dir) => crate::log_file::dir_of(dir),
            Location::Memory => Path::new("<memory>").join(crate::log_file::LOG_DIR),
        }
    }

    /// The directory, for error messages about the files together.
    pub(crate) fn dir(&self) -> PathBuf {
        match self {
            Location::Disk(dir) => dir.clone(),
            Location::Memory => PathBuf::from("<memory>"),
        }
    }
}

/// An open, checked data file.
pub(crate) struct DataFile {
    pub(crate) db: Database,
    pub(crate) path: PathBuf,
}

/// Opens and checks the `kind` file of `location`, or `None` if there is
/// no such file (a memory location never has one).
pub(crate) fn open_existing(
    location: &Location,
    kind: FileKind,
) -> Result<Option<DataFile>, OpenError> {
    let Location::Disk(_) = location else {
        return Ok(None);
    };
    let path = location.path(kind);
    if !path.try_exists().map_err(|e| io_error(&path, e))? {
        return Ok(None);
    }
    let db = open_file(&path, kind)?;
    check_meta(&db, kind, &path)?;
    Ok(Some(DataFile { db, path }))
}

/// Creates the `kind` file of `location` with `init` written into its meta
/// table next to the format version, and opens it.
pub(crate) fn create(
    location: &Location,
    kind: FileKind,
    init: &[(&str, Vec<u8>)],
) -> Result<DataFile, OpenError> {
    let path = location.path(kind);
    let db = match location {
        Location::Memory => {
            let db = builder(kind)
                .create_with_backend(InMemoryBackend::new())
                .map_err(|e| open_error(&path, e))?;
            write_meta(&db, kind, init).map_err(|e| storage_error(&path, e))?;
            db
        }
        Location::Disk(dir) => {
            create_complete(dir, &path, kind, init)?;
            open_file(&path, kind)?
        }
    };
    check_meta(&db, kind, &path)?;
    Ok(DataFile { db, path })
}

/// Opens a raft log file written by earlier versions (`raft-log.redb`, a
/// redb file of format version 1), checked like any data file, for
/// `legacy_log` to convert.
pub(crate) fn open_legacy_log(path: &Path) -> Result<Database, OpenError> {
    let mut builder = Database::builder();
    builder.set_check_integrity_on_open(true);
    let db = match panic::catch_unwind(AssertUnwindSafe(|| builder.open(path))) {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return Err(open_error(path, e)),
        Err(panic) => {
            return Err(corrupt(
                path,
                format!("reading it failed: {}", panic_message(&panic)),
            ))
        }
    };
    let version = read_meta(&db, FORMAT_KEY, path)?
        .and_then(|v| decode_u64(&v))
        .ok_or_else(|| corrupt(path, "it has no format version"))?;
    if version != 1 {
        return Err(OpenError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: version,
            supported: 1,
        });
    }
    if read_meta(&db, KIND_KEY, path)?.as_deref() != Some(b"raft-log".as_slice()) {
        return Err(corrupt(path, "it is not a raft log file"));
    }
    Ok(db)
}

fn builder(kind: FileKind) -> redb::Builder {
    let mut builder = Database::builder();
    builder
        .set_cache_size(kind.cache_bytes())
        .set_check_integrity_on_open(true);
    builder
}

fn create_complete(
    dir: &Path,
    path: &Path,
    kind: FileKind,
    init: &[(&str, Vec<u8>)],
) -> Result<(), OpenError> {
    let partial = path.with_extension("redb.partial");
    // Only an interrupted creation leaves this name behind; it never held
    // acknowledged data.
    match fs::remove_file(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&partial, e)),
    }
    let db = builder(kind)
        .create(&partial)
        .map_err(|e| open_error(&partial, e))?;
    write_meta(&db, kind, init).map_err(|e| storage_error(&partial, e))?;
    db.close().map_err(|e| open_error(&partial, e))?;
    fs::rename(&partial, path).map_err(|e| io_error(path, e))?;
    sync_dir(dir).map_err(|e| io_error(dir, e))
}

/// Makes the entries of `dir` (files created, renamed or removed) durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

fn open_file(path: &Path, kind: FileKind) -> Result<Database, OpenError> {
    let builder = builder(kind);
    // The integrity check verifies checksums before trusting a page, but a
    // damaged file must never take the process down: a panic while reading
    // it is reported like any other damage.
    match panic::catch_unwind(AssertUnwindSafe(|| builder.open(path))) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(open_error(path, e)),
        Err(panic) => Err(OpenError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("reading it failed: {}", panic_message(&panic)),
        }),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "unknown panic".to_string()
    }
}

fn write_meta(db: &Database, kind: FileKind, init: &[(&str, Vec<u8>)]) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(FORMAT_KEY, FORMAT_VERSION.to_le_bytes().as_slice())?;
        meta.insert(KIND_KEY, kind.tag())?;
        for (key, value) in init {
            meta.insert(*key, value.as_slice())?;
        }
    }
    txn.commit()?;
    Ok(())
}

fn check_meta(db: &Database, kind: FileKind, path: &Path) -> Result<(), OpenError> {
    let corrupt = |reason: String| OpenError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let version = read_meta(db, FORMAT_KEY, path)?
        .ok_or_else(|| corrupt("it has no format version".into()))?;
    let version =
        decode_u64(&version).ok_or_else(|| corrupt("its format version is not a number".into()))?;
    if version != FORMAT_VERSION {
        return Err(OpenError::UnsupportedFormat {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let tag = read_meta(db, KIND_KEY, path)?.unwrap_or_default();
    if tag != kind.tag() {
        return Err(corrupt(format!(
            "it is not a {} file (it says {:?})",
            kind.file_name(),
            String::from_utf8_lossy(&tag)
        )));
    }
    Ok(())
}

/// One value of a file's meta table.
pub(crate) fn read_meta(
    db: &Database,
    key: &str,
    path: &Path,
) -> Result<Option<Vec<u8>>, OpenError> {
    let txn = db.begin_read().map_err(|e| storage_error(path, e))?;
    let table = match txn.open_table(META) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => {
            return Err(OpenError::Corrupt {
                path: path.to_path_buf(),
                reason: "it is not an mqkv data file (no mqkv_meta table)".into(),
            })
        }
        Err(e) => return Err(storage_error(path, e)),
    };
    let value = table.get(key).map_err(|e| storage_error(path, e))?;
    Ok(value.map(|guard| guard.value().to_vec()))
}

pub(crate) fn decode_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

pub(crate) fn io_error(path: &Path, source: io::Error) -> OpenError {
    OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn open_error(path: &Path, error: DatabaseError) -> OpenError {
    match error {
        DatabaseError::DatabaseAlreadyOpen | DatabaseError::LockProtocolMismatch => {
            OpenError::InUse {
                path: path.to_path_buf(),
            }
        }
        DatabaseError::UpgradeRequired(version) => OpenError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("it uses redb file format {version}, which this build cannot read"),
        },
        other => storage_error(path, other),
    }
}

/// Maps an error met while reading a file at open time: operating system
/// failures stay I/O errors, anything about the content is corruption.
pub(crate) fn storage_error(path: &Path, error: impl Into<redb::Error>) -> OpenError {
    match error.into() {
        redb::Error::Io(e)
            if !matches!(
                e.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) =>
        {
            io_error(path, e)
        }
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => OpenError::InUse {
            path: path.to_path_buf(),
        },
        other => corrupt(path, other),
    }
}

pub(crate) fn corrupt(path: &Path, reason: impl Display) -> OpenError {
    OpenError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Direct access to the meta table, for tests that fake other versions.

    use super::*;

    pub(crate) fn set_format_version(path: &Path, version: u64) {
        let db = Database::open(path).expect("open for test");
        let txn = db.begin_write().expect("begin");
        {
            let mut meta = txn.open_table(META).expect("meta table");
            meta.insert(FORMAT_KEY, version.to_le_bytes().as_slice())
                .expect("insert");
        }
        txn.commit().expect("commit");
    }
}
