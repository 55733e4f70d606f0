//! The raft log on disk: a directory of append-only segment files.
//!
//! ```text
//! raft-log/
//!   LOCK                        held (flock) while a store has the log open
//!   00000000000000000001.seg    oldest segment still needed
//!   00000000000000000002.seg    the segment being appended to
//! ```
//!
//! A segment starts with a 16-byte header (magic, [`LOG_FORMAT`], zero
//! padding) followed by frames. A frame is
//! `[payload length: u32][check of the length: u32][XXH3-64 of the payload: u64][payload]`
//! (little endian), and its payload is one postcard-encoded [`Record`],
//! masked: XORed with a pseudo-random stream of its offset in the segment
//! (see [`mask`]), so that the log never holds a run of zero bytes. The
//! previous format (1) stored payloads unmasked; its segments are still read
//! and appended to, and new segments are started in the current format. The
//! first record of every segment is a [`Record::Start`] with the node id and
//! the vote, committed and purged log ids as they stood when the segment
//! was opened, so older segments can be deleted without losing them.
//!
//! An append is one `write` of its frames and one `fdatasync`: the cheapest
//! durable write a file system offers, where a B-tree commit rewrites
//! several pages. Or, where raft shares a thread with connections, one
//! direct write of whole blocks (see [`Segments::direct_write`] and
//! `uring`): the block the segment's end falls in is written again with the
//! new frames, from a copy kept of it, and zeros pad the last block, as the
//! space allocated ahead holds anyway.
//!
//! Invariants:
//! - a segment appears under its final name only once its header and start
//!   record are synced (it is built under `.partial` and renamed);
//! - only the end of the newest segment can hold damaged frames: those of a
//!   write that was interrupted, never acknowledged. A crash of the process
//!   leaves them incomplete; a power loss can also keep some of the write's
//!   blocks and lose others, which then read as the zeros allocated ahead.
//!   Opening cuts such a tail off at its first damaged frame when nothing
//!   but zeros follows that frame, or (masked segments) when zero bytes in
//!   a row follow it, which only space a write never reached holds.
//!   Anything else that does not check out — a bad header, a frame whose
//!   length or payload fails its check, a record that does not decode, a
//!   log with a hole — is refused as corruption, and nothing is written;
//! - a segment is deleted only once every entry in it is purged, and the
//!   purge that allows it is synced first.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::files::{corrupt, io_error, sync_dir};
use crate::types::{LogId, NodeId, RaftEntry, Vote};
use crate::OpenError;

mod append;
mod frame;
mod replay;

#[cfg(test)]
pub(crate) use frame::mask;
use frame::{all_zero, encode, header};
pub use replay::replay_segment;
use replay::Replay;

/// Name of the log directory inside the data directory.
pub(crate) const LOG_DIR: &str = "raft-log";
/// Version of the segment layout and record encoding.
pub const LOG_FORMAT: u64 = 2;
/// The previous version, still read and appended to: its payloads are
/// stored as encoded, not masked.
const LOG_FORMAT_UNMASKED: u64 = 1;
const MAGIC: &[u8; 8] = b"MQKVLOG\n";
const HEADER_LEN: u64 = 16;
const FRAME_LEN: usize = 16;
/// A frame longer than this is damage, not data.
const MAX_PAYLOAD: u32 = 1 << 30;
const SEGMENT_EXT: &str = "seg";
/// Zeros written ahead of the appends (see [`Segment::allocated`]).
const ALLOCATE_AHEAD: u64 = 4 << 20;
/// A write at least this long that reaches past the allocated space grows
/// the file itself instead of having zeros written ahead of it.
const WRITE_PAST_ALLOCATED: u64 = 256 << 10;
const LOCK_FILE: &str = "LOCK";
/// Zero bytes in a row that only space never written can hold, in a
/// segment whose payloads are masked.
const UNWRITTEN_RUN: usize = 8;

/// Block size of direct writes: their offsets, lengths and buffers are
/// multiples of it (of every logical block size up to 4 KiB).
pub(crate) const BLOCK: u64 = 4096;

/// Whole blocks of a segment to write with direct I/O (see
/// [`Segments::direct_write`]).
#[derive(Clone)]
pub(crate) struct DirectWrite {
    /// The segment opened with `O_DIRECT`.
    pub(crate) direct: Arc<File>,
    /// The segment as opened for the page cache, for a system that refuses
    /// the direct write.
    pub(crate) file: Arc<File>,
    /// Holds the blocks at `skip`, where they are aligned in memory.
    buf: Vec<u8>,
    skip: usize,
    len: usize,
    /// Where in the file the blocks go: a multiple of [`BLOCK`], as is
    /// their length.
    pub(crate) offset: u64,
}

impl DirectWrite {
    /// The blocks to write.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.skip..self.skip + self.len]
    }

    /// The buffer, for the next write.
    pub(crate) fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// `bytes` for `offset` of the file at `path`, whatever their alignment.
    #[cfg(test)]
    pub(crate) fn unaligned(path: &Path, bytes: &[u8], offset: u64) -> io::Result<DirectWrite> {
        use std::os::unix::fs::OpenOptionsExt;
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(DirectWrite {
            direct: Arc::new(direct),
            file: Arc::new(file),
            buf: bytes.to_vec(),
            skip: 0,
            len: bytes.len(),
            offset,
        })
    }
}

/// One change to the log, as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Record {
    /// First record of a segment.
    Start {
        node_id: NodeId,
        vote: Option<Vote>,
        committed: Option<LogId>,
        last_purged: Option<LogId>,
    },
    Entry(RaftEntry),
    Vote(Vote),
    /// A hint: replay may stop applying at the last committed entry sooner.
    Committed(LogId),
    /// Entries from this index on are gone.
    Truncate(u64),
    /// Entries up to and including this id are gone.
    Purge(LogId),
}

/// Where an entry's record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    segment: u64,
    /// Offset of the frame's payload.
    offset: u64,
    len: u32,
}

impl Location {
    /// Size of the entry's record.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }
}

/// What opening the log found.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) node_id: NodeId,
    pub(crate) vote: Option<Vote>,
    pub(crate) committed: Option<LogId>,
    pub(crate) last_purged: Option<LogId>,
    /// The entries, contiguous, from the one after the last purged.
    pub(crate) entries: Vec<(LogId, Location)>,
}

impl Loaded {
    /// Index of the last entry, or of the last purged one if none is left.
    pub(crate) fn last_index(&self) -> Option<u64> {
        self.entries
            .last()
            .map(|(id, _)| id.index)
            .or(self.last_purged.map(|id| id.index))
    }

    pub(crate) fn is_new(&self) -> bool {
        self.vote.is_none() && self.entries.is_empty() && self.last_purged.is_none()
    }
}

struct Segment {
    seq: u64,
    path: PathBuf,
    file: Arc<File>,
    len: u64,
    /// Bytes of the file written (with zeros) ahead of `len`: appending
    /// into them changes no file metadata, so each sync is a data flush
    /// only. A large append past them grows the file instead (see
    /// [`WRITE_PAST_ALLOCATED`]).
    allocated: u64,
    /// Highest entry index written to this segment.
    last_index: Option<u64>,
    /// Whether its payloads are masked (format 2 on).
    masked: bool,
    /// The file opened for direct writes, once used.
    direct: Option<Arc<File>>,
    /// The bytes of the block `len` falls in, up to `len`, and where that block starts.
    tail: Option<(u64, Vec<u8>)>,
}

/// The open log directory. Methods block on file I/O; they run on the raft
/// thread, which has nothing else to do while a write is being synced.
pub(crate) struct Segments {
    dir: PathBuf,
    node_id: NodeId,
    /// Oldest first; the last one is appended to.
    segments: Vec<Segment>,
    /// Frames encoded but not yet written.
    staged: Vec<u8>,
    /// A new segment is started once the current one is this long.
    segment_bytes: u64,
    /// The file system refused to open a segment for direct I/O: appends
    /// go through the page cache.
    direct_refused: bool,
    /// Held for as long as the log is open.
    _lock: File,
}

pub(crate) fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join(LOG_DIR)
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}.{SEGMENT_EXT}")
}

/// Creates a segment with its start record and `records`, complete and
/// synced, under its final name.
fn create_segment(dir: &Path, seq: u64, start: &Record, records: &[Record]) -> io::Result<Segment> {
    let path = dir.join(segment_name(seq));
    let partial = path.with_extension("seg.partial");
    let mut bytes = header().to_vec();
    encode(start, &mut bytes, Some(0))?;
    let mut last_index = None;
    for record in records {
        encode(record, &mut bytes, Some(0))?;
        if let Record::Entry(entry) = record {
            last_index = Some(entry.log_id.index);
        }
    }
    {
        let mut file = File::create(&partial)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    fs::rename(&partial, &path)?;
    sync_dir(dir)?;
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let len = bytes.len() as u64;
    Ok(Segment {
        seq,
        path,
        file: Arc::new(file),
        len,
        allocated: len,
        last_index,
        masked: true,
        direct: None,
        tail: None,
    })
}

/// Creates the log directory of a new store, complete and synced, and opens
/// it.
pub(crate) fn create(
    data_dir: &Path,
    node_id: NodeId,
    segment_bytes: u64,
) -> Result<(Segments, Loaded), OpenError> {
    let start = Record::Start {
        node_id,
        vote: None,
        committed: None,
        last_purged: None,
    };
    create_with(data_dir, start, Vec::new())?;
    let dir = dir_of(data_dir);
    open(data_dir, segment_bytes)?.ok_or_else(|| {
        io_error(
            &dir,
            io::Error::new(io::ErrorKind::NotFound, "vanished after creation"),
        )
    })
}

/// Creates the log directory holding `start` and then `records` in one
/// segment, complete and synced under its final name.
pub(crate) fn create_with(
    data_dir: &Path,
    start: Record,
    records: Vec<Record>,
) -> Result<(), OpenError> {
    let dir = dir_of(data_dir);
    let partial = data_dir.join(format!("{LOG_DIR}.partial"));
    // Only an interrupted creation leaves this name behind; it never held
    // acknowledged data.
    match fs::remove_dir_all(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error(&partial, e)),
    }
    fs::create_dir(&partial).map_err(|e| io_error(&partial, e))?;
    create_segment(&partial, 1, &start, &records).map_err(|e| io_error(&partial, e))?;
    fs::rename(&partial, &dir).map_err(|e| io_error(&dir, e))?;
    sync_dir(data_dir).map_err(|e| io_error(data_dir, e))
}

/// Opens and replays the log directory of `data_dir`, or `None` if there
/// is none. An interrupted write at the end of the newest segment is cut
/// off; anything else damaged is refused before a byte is written.
pub(crate) fn open(
    data_dir: &Path,
    segment_bytes: u64,
) -> Result<Option<(Segments, Loaded)>, OpenError> {
    let dir = dir_of(data_dir);
    if !dir.try_exists().map_err(|e| io_error(&dir, e))? {
        return Ok(None);
    }
    let lock = lock(&dir)?;
    let mut seqs = Vec::new();
    let mut partials = Vec::new();
    for item in fs::read_dir(&dir).map_err(|e| io_error(&dir, e))? {
        let item = item.map_err(|e| io_error(&dir, e))?;
        let name = item.file_name();
        let name = name.to_string_lossy();
        if name == LOCK_FILE {
            continue;
        }
        if name.ends_with(".partial") {
            partials.push(item.path());
            continue;
        }
        let seq = name
            .strip_suffix(&format!(".{SEGMENT_EXT}"))
            .and_then(|stem| stem.parse::<u64>().ok())
            .ok_or_else(|| corrupt(&item.path(), "it is not a log segment"))?;
        seqs.push(seq);
    }
    seqs.sort_unstable();
    if seqs.is_empty() {
        return Err(corrupt(&dir, "it holds no log segment"));
    }
    let mut replay = Replay::default();
    let mut segments = Vec::new();
    let mut cut = None;
    for (i, &seq) in seqs.iter().enumerate() {
        let newest = i + 1 == seqs.len();
        let path = dir.join(segment_name(seq));
        let bytes = fs::read(&path).map_err(|e| io_error(&path, e))?;
        let (valid_len, last_index, masked) = replay.segment(seq, &bytes, newest, &path)?;
        if newest && !all_zero(&bytes[valid_len as usize..]) {
            cut = Some((path.clone(), valid_len, bytes.len() as u64));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        segments.push(Segment {
            seq,
            path,
            file: Arc::new(file),
            len: valid_len,
            allocated: bytes.len() as u64,
            last_index,
            masked,
            direct: None,
            tail: None,
        });
    }
    let loaded = replay.finish(&dir)?;
    // Everything checked out: only now is anything changed on disk.
    for partial in partials {
        fs::remove_file(&partial).map_err(|e| io_error(&partial, e))?;
    }
    if let Some((path, valid, found)) = cut {
        tracing::warn!(
            segment = %path.display(),
            kept = valid,
            dropped = found - valid,
            "the log ends in an interrupted write; cutting it off"
        );
        let newest = segments
            .last_mut()
            .ok_or_else(|| corrupt(&dir, "it holds no log segment"))?;
        newest
            .file
            .set_len(valid)
            .and_then(|()| newest.file.sync_all())
            .map_err(|e| io_error(&path, e))?;
        newest.allocated = valid;
    }
    let node_id = loaded.node_id;
    Ok(Some((
        Segments {
            dir,
            node_id,
            segments,
            staged: Vec::new(),
            segment_bytes,
            direct_refused: false,
            _lock: lock,
        },
        loaded,
    )))
}

fn lock(dir: &Path) -> Result<File, OpenError> {
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(OpenError::InUse {
            path: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(io_error(&path, e)),
    }
}
