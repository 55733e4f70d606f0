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

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use crate::files::{corrupt, io_error, sync_dir};
use crate::types::{LogId, NodeId, RaftEntry, Vote};
use crate::OpenError;

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

/// Appends `record`'s frame to `out`. With `masked_at`, the offset in the
/// segment of `out`'s first byte, its payload is masked for that place.
fn encode(record: &Record, out: &mut Vec<u8>, masked_at: Option<u64>) -> io::Result<usize> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_LEN]);
    *out = postcard::serialize_with_flavor(record, crate::flavor::VecFlavor(std::mem::take(out)))
        .map_err(io::Error::other)?;
    let payload_len = out.len() - start - FRAME_LEN;
    let len = u32::try_from(payload_len)
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD)
        .ok_or_else(|| io::Error::other(format!("a log record of {payload_len} bytes")))?;
    if let Some(base) = masked_at {
        let payload_at = base + (start + FRAME_LEN) as u64;
        mask(&mut out[start + FRAME_LEN..], payload_at);
    }
    let hash = xxh3_64(&out[start + FRAME_LEN..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&length_check(len).to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&hash.to_le_bytes());
    Ok(payload_len)
}

fn length_check(len: u32) -> u32 {
    // Truncating the hash is the point: four bytes are enough to tell a
    // length from noise.
    xxh3_64(&len.to_le_bytes()) as u32
}

/// Masks (or unmasks: the mask is its own inverse) payload bytes found at
/// `offset` in a segment: each byte is XORed with a pseudo-random stream
/// of its offset. Encoded records are full of zeros (small integers, empty
/// fields, values of zeros); masked, a run of [`UNWRITTEN_RUN`] zero bytes
/// is as unlikely as guessing a 64-bit key. So zeros in a row inside the
/// log can only be space a write never reached, and opening tells a write
/// torn by a power loss (its lost blocks read as zeros) from damage to
/// acknowledged data.
pub(crate) fn mask(bytes: &mut [u8], offset: u64) {
    let lead = ((8 - offset % 8) % 8) as usize;
    let (head, rest) = bytes.split_at_mut(lead.min(bytes.len()));
    mask_bytes(head, offset);
    let at = offset + head.len() as u64;
    let (words, tail) = rest.as_chunks_mut::<8>();
    mask_words(words, at / 8);
    mask_bytes(tail, at + 8 * words.len() as u64);
}

/// The mask's stream: SplitMix64's output function of the word's number
/// (its offset divided by 8).
#[inline(always)]
fn mask_key(word: u64) -> u64 {
    let mut z = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Masks bytes one by one, the first at `offset` (the ends that are not
/// whole words).
fn mask_bytes(bytes: &mut [u8], offset: u64) {
    for (at, byte) in (offset..).zip(bytes) {
        *byte ^= mask_key(at / 8).to_le_bytes()[(at % 8) as usize];
    }
}

/// Masks whole words, the first of which is word number `first`. Large
/// values make this a per-byte cost of every write and every replay, so
/// the loop is compiled for the widest vector instructions the CPU has
/// (eight streams at once with AVX-512's 64-bit multiply).
fn mask_words(words: &mut [[u8; 8]], first: u64) {
    #[inline(always)]
    fn each(words: &mut [[u8; 8]], first: u64) {
        for (n, word) in (first..).zip(words.iter_mut()) {
            *word = (u64::from_le_bytes(*word) ^ mask_key(n)).to_le_bytes();
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512dq")]
        fn avx512(words: &mut [[u8; 8]], first: u64) {
            each(words, first);
        }
        #[target_feature(enable = "avx2")]
        fn avx2(words: &mut [[u8; 8]], first: u64) {
            each(words, first);
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            // SAFETY: the CPU has just been found to support AVX-512 F and DQ.
            return unsafe { avx512(words, first) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has just been found to support AVX2.
            return unsafe { avx2(words, first) };
        }
    }
    each(words, first);
}

/// Whether `bytes`, up to their last non-zero byte, hold
/// [`UNWRITTEN_RUN`] zero bytes in a row.
fn holds_unwritten_run(bytes: &[u8]) -> bool {
    let end = bytes.iter().rposition(|b| *b != 0).unwrap_or(0);
    bytes[..end]
        .split(|b| *b != 0)
        .any(|zeros| zeros.len() >= UNWRITTEN_RUN)
}

fn header() -> [u8; HEADER_LEN as usize] {
    let mut header = [0; HEADER_LEN as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&LOG_FORMAT.to_le_bytes());
    header
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

/// Replays one segment given as bytes, as opening a store does, and
/// returns the length of its valid part (what opening keeps of the newest
/// segment). For fuzzing the segment decoder; not part of the API.
#[doc(hidden)]
pub fn replay_segment(bytes: &[u8], newest: bool) -> Result<u64, String> {
    let path = Path::new("segment");
    let mut replay = Replay::default();
    let (valid, _, _) = replay
        .segment(1, bytes, newest, path)
        .map_err(|e| e.to_string())?;
    replay.finish(path).map_err(|e| e.to_string())?;
    Ok(valid)
}

fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// Allocates space ahead of a write of `len` bytes ending at `end` when it
/// would reach past the space allocated, unless it is large (see
/// [`WRITE_PAST_ALLOCATED`]); says whether it did.
fn allocate_for(segment: &mut Segment, end: u64, len: usize) -> io::Result<bool> {
    if end <= segment.allocated || len as u64 >= WRITE_PAST_ALLOCATED {
        return Ok(false);
    }
    allocate(segment, end + ALLOCATE_AHEAD)?;
    Ok(true)
}

/// Writes zeros from the end of `segment`'s allocated space up to `to`, and
/// syncs them, so later appends into that space change no metadata.
fn allocate(segment: &mut Segment, to: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = segment.allocated.max(segment.len);
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        segment.file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    segment.file.sync_all()?;
    segment.allocated = to;
    Ok(())
}

/// Drops the (clean) cached pages of `len` bytes of `file` from `from` on;
/// an advice the kernel may not take, so nothing is reported.
fn drop_cached(file: &File, from: u64, len: u64) {
    let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
        return;
    };
    // SAFETY: takes no pointers; the descriptor is open for the call.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), from, len, libc::POSIX_FADV_DONTNEED) };
}

/// Replays records in order, checking them as it goes.
#[derive(Default)]
struct Replay {
    node_id: Option<NodeId>,
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, (LogId, Location)>,
}

impl Replay {
    /// Replays one segment; returns the length of its valid part, the
    /// highest entry index in it and whether its payloads are masked.
    fn segment(
        &mut self,
        seq: u64,
        bytes: &[u8],
        newest: bool,
        path: &Path,
    ) -> Result<(u64, Option<u64>, bool), OpenError> {
        if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC {
            return Err(corrupt(path, "it is not an mqkv log segment (bad header)"));
        }
        let format = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        let masked = format == LOG_FORMAT;
        if !masked && format != LOG_FORMAT_UNMASKED {
            return Err(OpenError::UnsupportedFormat {
                path: path.to_path_buf(),
                found: format,
                supported: LOG_FORMAT,
            });
        }
        let mut offset = HEADER_LEN as usize;
        let mut last_index = None;
        let mut first = true;
        let mut unmasked = Vec::new();
        while offset < bytes.len() {
            let rest = &bytes[offset..];
            // Space allocated ahead of the writes: the end of the log.
            if !first && all_zero(rest) {
                return Ok((offset as u64, last_index, masked));
            }
            // An interrupted write leaves its frames incomplete, or complete
            // but with bytes that never reached the disk, and nothing after
            // them but unwritten (zero) space. Only the newest segment is
            // written to, so only it can end that way. A power loss can also
            // keep some blocks of the write and lose others, in any order:
            // then what follows the damage holds the lost blocks' zeros,
            // which masked data never does.
            let torn = |what: &str, after: usize| -> Result<(u64, Option<u64>, bool), OpenError> {
                let unwritten = all_zero(rest.get(after..).unwrap_or_default())
                    || (masked && holds_unwritten_run(rest));
                if newest && !first && unwritten {
                    Ok((offset as u64, last_index, masked))
                } else {
                    Err(corrupt(
                        path,
                        format!("{what} at byte {offset}, before the end of the log"),
                    ))
                }
            };
            if rest.len() < FRAME_LEN {
                return torn("an incomplete frame header", rest.len());
            }
            let len = u32::from_le_bytes(rest[..4].try_into().unwrap_or_default());
            let check = u32::from_le_bytes(rest[4..8].try_into().unwrap_or_default());
            if check != length_check(len) || len > MAX_PAYLOAD {
                return torn("a damaged frame header", FRAME_LEN);
            }
            let end = FRAME_LEN + len as usize;
            if rest.len() < end {
                return torn("an incomplete frame", rest.len());
            }
            let hash = u64::from_le_bytes(rest[8..16].try_into().unwrap_or_default());
            let mut payload = &rest[FRAME_LEN..end];
            if xxh3_64(payload) != hash {
                return torn("a record failing its checksum", end);
            }
            if masked {
                unmasked.clear();
                unmasked.extend_from_slice(payload);
                mask(&mut unmasked, (offset + FRAME_LEN) as u64);
                payload = &unmasked;
            }
            let record: Record = postcard::from_bytes(payload).map_err(|e| {
                corrupt(
                    path,
                    format!("the record at byte {offset} does not decode: {e}"),
                )
            })?;
            let location = Location {
                segment: seq,
                offset: (offset + FRAME_LEN) as u64,
                len,
            };
            if first != matches!(record, Record::Start { .. }) {
                return Err(corrupt(
                    path,
                    "a segment must begin with exactly one start record",
                ));
            }
            first = false;
            if let Some(index) = self.record(record, location, path)? {
                last_index = Some(index);
            }
            offset += end;
        }
        if first {
            return Err(corrupt(path, "the segment has no start record"));
        }
        Ok((bytes.len() as u64, last_index, masked))
    }

    /// Applies one record; returns the index of an entry record.
    fn record(
        &mut self,
        record: Record,
        location: Location,
        path: &Path,
    ) -> Result<Option<u64>, OpenError> {
        match record {
            Record::Start {
                node_id,
                vote,
                committed,
                last_purged,
            } => {
                if *self.node_id.get_or_insert(node_id) != node_id {
                    return Err(corrupt(
                        path,
                        format!("it belongs to node {node_id}, not {:?}", self.node_id),
                    ));
                }
                // A start record holds the state as of its segment's
                // creation: never older than what earlier segments wrote.
                if vote.is_some() {
                    self.vote = vote;
                }
                self.committed = self.committed.max(committed);
                self.purge(last_purged);
            }
            Record::Entry(entry) => {
                let id = entry.log_id;
                if self.entries.range(id.index..).next().is_some() {
                    return Err(corrupt(
                        path,
                        format!("entry {} is written twice without a truncation", id.index),
                    ));
                }
                if self.last_purged.is_none_or(|p| id.index > p.index) {
                    self.entries.insert(id.index, (id, location));
                }
                return Ok(Some(id.index));
            }
            Record::Vote(vote) => self.vote = Some(vote),
            Record::Committed(id) => self.committed = Some(id),
            Record::Truncate(since) => drop(self.entries.split_off(&since)),
            Record::Purge(upto) => self.purge(Some(upto)),
        }
        Ok(None)
    }

    fn purge(&mut self, upto: Option<LogId>) {
        if upto > self.last_purged {
            self.last_purged = upto;
        }
        if let Some(upto) = self.last_purged {
            self.entries = self.entries.split_off(&(upto.index + 1));
        }
    }

    fn finish(self, dir: &Path) -> Result<Loaded, OpenError> {
        let node_id = self
            .node_id
            .ok_or_else(|| corrupt(dir, "no segment names its node"))?;
        let first = self.last_purged.map_or(0, |id| id.index + 1);
        let mut entries = Vec::with_capacity(self.entries.len());
        for (expected, (index, (id, location))) in (first..).zip(self.entries) {
            if index != expected {
                return Err(corrupt(
                    dir,
                    format!("the log has a hole: entry {expected} is missing before {index}"),
                ));
            }
            entries.push((id, location));
        }
        Ok(Loaded {
            node_id,
            vote: self.vote,
            committed: self.committed,
            last_purged: self.last_purged,
            entries,
        })
    }
}

impl Segments {
    /// Stages `record`; returns its location (valid once written) and the
    /// payload size.
    pub(crate) fn stage(&mut self, record: &Record) -> io::Result<Location> {
        let current = self.current()?;
        let offset = current.len + self.staged.len() as u64 + FRAME_LEN as u64;
        let segment = current.seq;
        // The staged bytes go at the segment's end.
        let masked_at = current.masked.then_some(current.len);
        let len = encode(record, &mut self.staged, masked_at)?;
        Ok(Location {
            segment,
            offset,
            len: len as u32,
        })
    }

    /// Notes that the staged entry records reach `index`.
    pub(crate) fn staged_entry(&mut self, index: u64) -> io::Result<()> {
        let current = self.current_mut()?;
        current.last_index = current.last_index.max(Some(index));
        Ok(())
    }

    /// Whether the current segment is full, so the next append should
    /// [`Self::roll`] first.
    pub(crate) fn full(&self) -> bool {
        self.segments
            .last()
            .is_none_or(|segment| segment.len >= self.segment_bytes)
    }

    /// Starts a new segment, its start record carrying `start`'s state.
    /// Nothing may be staged.
    pub(crate) fn roll(
        &mut self,
        vote: Option<Vote>,
        committed: Option<LogId>,
        last_purged: Option<LogId>,
    ) -> io::Result<()> {
        debug_assert!(self.staged.is_empty());
        // The full segment gives back the space allocated ahead.
        if let Some(full) = self.segments.last_mut() {
            full.file.set_len(full.len)?;
            full.file.sync_all()?;
            full.allocated = full.len;
        }
        let seq = self.segments.last().map_or(1, |s| s.seq + 1);
        let start = Record::Start {
            node_id: self.node_id,
            vote,
            committed,
            last_purged,
        };
        let segment = create_segment(&self.dir, seq, &start, &[])?;
        self.segments.push(segment);
        Ok(())
    }

    /// Writes what is staged; with `sync`, also makes it durable.
    pub(crate) fn write(&mut self, sync: bool) -> io::Result<()> {
        let staged = std::mem::take(&mut self.staged);
        let current = self.current_mut()?;
        if !staged.is_empty() {
            let end = current.len + staged.len() as u64;
            // Zeros written ahead of a large write would double what goes to
            // disk, while the size change it makes instead costs its sync
            // little next to its own data.
            allocate_for(current, end, staged.len())?;
            // A write that fails part way leaves bytes past `len`; the next
            // one writes over them.
            current.file.write_all_at(&staged, current.len)?;
            current.tail = None;
            current.len = end;
            current.allocated = current.allocated.max(end);
        }
        if sync {
            current.file.sync_data()?;
        }
        let mut staged = staged;
        staged.clear();
        self.staged = staged;
        Ok(())
    }

    /// Takes what is staged as a direct write: whole blocks from the one
    /// the segment's end falls in (its bytes before the end, kept from the
    /// write before, are written again unchanged), padded with zeros, built
    /// in `buf`. The segment's length counts the staged bytes from here on:
    /// the caller makes the write durable (or fails the log) before
    /// acknowledging them. `None` if nothing is staged, or if the write
    /// would reach past the space allocated ahead: it is then written
    /// through the page cache, for the caller to sync as usual.
    pub(crate) fn direct_write(&mut self, mut buf: Vec<u8>) -> io::Result<Option<DirectWrite>> {
        if self.staged.is_empty() || self.direct_refused {
            self.write(false)?;
            return Ok(None);
        }
        let staged = std::mem::take(&mut self.staged);
        let current = self.current_mut()?;
        let end = current.len + staged.len() as u64;
        if allocate_for(current, end, staged.len())? {
            // A direct write over cached pages cannot be done without
            // waiting, and io_uring hands it to a worker thread: the zeros
            // just written leave the page cache.
            let from = current.len & !(BLOCK - 1);
            drop_cached(&current.file, from, current.allocated - from);
        }
        let start = current.len & !(BLOCK - 1);
        let padded = end.next_multiple_of(BLOCK);
        let direct = match &current.direct {
            _ if padded > current.allocated => None,
            Some(file) => Some(file.clone()),
            None => {
                let opened = OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&current.path);
                match opened {
                    Ok(file) => {
                        let file = Arc::new(file);
                        current.direct = Some(file.clone());
                        Some(file)
                    }
                    Err(e) if crate::uring::refused(&e) => {
                        tracing::info!(error = %e, "no direct I/O: the log writes through the page cache");
                        self.direct_refused = true;
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let Some(direct) = direct else {
            self.staged = staged;
            self.write(false)?;
            return Ok(None);
        };
        let current = self.current_mut()?;
        let head_len = (current.len - start) as usize;
        let len = (padded - start) as usize;
        // The buffer of an earlier write is written over, not cleared: only
        // the block's end, past the new frames, needs zeros.
        if buf.len() < len + BLOCK as usize {
            buf.resize(len + BLOCK as usize, 0);
        }
        let skip = buf.as_ptr().align_offset(BLOCK as usize);
        let block = &mut buf[skip..skip + len];
        match current.tail.take() {
            Some((at, head)) if at == start && head.len() == head_len => {
                block[..head_len].copy_from_slice(&head);
            }
            _ => {
                // Read through the page cache, which it then leaves: a
                // cached block would hand the write to a worker thread.
                current.file.read_exact_at(&mut block[..head_len], start)?;
                drop_cached(&current.file, start, BLOCK);
            }
        }
        block[head_len..head_len + staged.len()].copy_from_slice(&staged);
        block[head_len + staged.len()..].fill(0);
        let tail_start = end & !(BLOCK - 1);
        let kept = (tail_start - start) as usize..(end - start) as usize;
        current.tail = Some((tail_start, block[kept].to_vec()));
        current.len = end;
        let write = DirectWrite {
            direct,
            file: current.file.clone(),
            buf,
            skip,
            len,
            offset: start,
        };
        let mut staged = staged;
        staged.clear();
        self.staged = staged;
        Ok(Some(write))
    }

    /// Bytes of valid log in the newest segment.
    #[cfg(test)]
    pub(crate) fn written_len(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.len)
    }

    /// Reads the record at `location`.
    pub(crate) fn read(&self, location: Location) -> io::Result<Record> {
        let segment = self
            .segments
            .iter()
            .find(|s| s.seq == location.segment)
            .ok_or_else(|| io::Error::other(format!("log segment {} is gone", location.segment)))?;
        let mut payload = vec![0; location.len as usize];
        segment.file.read_exact_at(&mut payload, location.offset)?;
        if segment.masked {
            mask(&mut payload, location.offset);
        }
        postcard::from_bytes(&payload).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} at byte {}: {e}",
                    segment.path.display(),
                    location.offset
                ),
            )
        })
    }

    /// Deletes segments whose every entry is at or below `upto` (never the
    /// current one).
    pub(crate) fn delete_purged(&mut self, upto: u64) -> io::Result<()> {
        let keep_from = self
            .segments
            .iter()
            .position(|s| s.last_index.is_some_and(|last| last > upto))
            .unwrap_or(self.segments.len())
            .min(self.segments.len().saturating_sub(1));
        if keep_from == 0 {
            return Ok(());
        }
        for segment in self.segments.drain(..keep_from) {
            fs::remove_file(&segment.path)?;
        }
        sync_dir(&self.dir)
    }

    fn current(&self) -> io::Result<&Segment> {
        self.segments
            .last()
            .ok_or_else(|| io::Error::other("the log has no segment"))
    }

    /// The newest segment's file.
    pub(crate) fn current_file(&mut self) -> io::Result<Arc<File>> {
        Ok(self.current_mut()?.file.clone())
    }

    fn current_mut(&mut self) -> io::Result<&mut Segment> {
        self.segments
            .last_mut()
            .ok_or_else(|| io::Error::other("the log has no segment"))
    }
}
