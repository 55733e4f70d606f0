//! Appending to the log: staging records, writing and syncing them (or one direct write of
//! whole blocks), space allocated ahead, records read back, purged segments deleted.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;

use crate::files::sync_dir;
use crate::types::{LogId, Vote};

use super::frame::{encode, mask};
use super::{
    create_segment, DirectWrite, Location, Record, Segment, Segments, ALLOCATE_AHEAD, BLOCK,
    FRAME_LEN, WRITE_PAST_ALLOCATED,
};

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
