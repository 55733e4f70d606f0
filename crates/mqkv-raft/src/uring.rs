//! Direct writes of the log submitted through io_uring, their completion
//! awaited on the submitting thread's runtime.
//!
//! A write goes out with `RWF_DSYNC` to a file opened with `O_DIRECT`: it
//! completes once its blocks are on stable storage, with no copy into the
//! page cache, no sync call and no thread of the process to wake for it
//! (on a disk without FUA, the kernel flushes the disk's cache from a worker
//! of its own). The ring's completions are signalled on an eventfd the
//! runtime polls.
//!
//! One write is in flight at a time (raft awaits each append before the
//! next). Its buffer and files are held here, not by the future awaiting it:
//! a future dropped mid-flight leaves them to the ring, which waits for the
//! kernel to be done with them before the next write, and before it goes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

use io_uring::{opcode, squeue, types, IoUring};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::log_file::{DirectWrite, BLOCK};
use crate::sync;

/// Marks the write's completion (the only operation a ring is given).
const WRITE: u64 = 1;

struct State {
    ring: IoUring,
    /// The write submitted and not yet reaped.
    in_flight: Option<DirectWrite>,
    /// A submission failed: its entry may linger in the queue.
    broken: bool,
}

impl State {
    /// The outcome of the write in flight, once its completion came; its
    /// write back.
    fn reap(&mut self) -> Option<(io::Result<()>, DirectWrite)> {
        let completion = self.ring.completion().next()?;
        let write = self.in_flight.take()?;
        Some((outcome(completion.result(), write.bytes().len()), write))
    }

    /// Waits, blocking, for the write of a dropped future to complete.
    fn settle(&mut self) {
        while self.in_flight.is_some() {
            if self.reap().is_some() {
                return;
            }
            if let Err(e) = self.ring.submit_and_wait(1) {
                if e.kind() != io::ErrorKind::Interrupted {
                    // The kernel cannot be asked any more; the buffer must
                    // not be freed while it may still read it.
                    std::mem::forget(self.in_flight.take());
                    return;
                }
            }
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        self.settle();
    }
}

pub(crate) struct Ring {
    state: Mutex<State>,
    ready: AsyncFd<OwnedFd>,
}

impl Ring {
    /// A ring whose completions wake the current runtime; fails where the
    /// system has no io_uring (or refuses it) or outside a runtime.
    pub(crate) fn new() -> io::Result<Ring> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("not on a runtime"));
        }
        let ring = IoUring::new(4)?;
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        ring.submitter().register_eventfd(fd.as_raw_fd())?;
        // SAFETY: the `AsyncFd` owns the descriptor, which stays open and
        // the same for as long as it does.
        let ready = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Ring {
            state: Mutex::new(State {
                ring,
                in_flight: None,
                broken: false,
            }),
            ready,
        })
    }

    /// Writes `write` and waits for it to be durable. The write comes back
    /// with the outcome (to be done another way if the system refused it).
    pub(crate) async fn write(&self, write: DirectWrite) -> (io::Result<()>, Option<DirectWrite>) {
        if let Err(failed) = self.submit(write) {
            return failed;
        }
        loop {
            if let Some((result, write)) = sync::lock(&self.state).reap() {
                return (result, Some(write));
            }
            match self.ready.readable().await {
                Ok(mut guard) => {
                    let mut count = [0u8; 8];
                    // SAFETY: reads at most 8 bytes into `count`. The
                    // count is not needed: the ring is looked at anyway.
                    let _ = unsafe {
                        libc::read(
                            self.ready.get_ref().as_raw_fd(),
                            count.as_mut_ptr().cast(),
                            count.len(),
                        )
                    };
                    guard.clear_ready();
                }
                Err(e) => {
                    // No wake-ups (the runtime is going): wait here.
                    let state = sync::lock(&self.state);
                    if let Err(wait) = state.ring.submit_and_wait(1) {
                        tracing::warn!(error = %wait, runtime = %e, "waiting on the ring failed");
                    }
                }
            }
        }
    }

    /// Submits `write`, or gives it back with the reason it was not (a copy
    /// if the kernel may still have been handed it).
    fn submit(&self, write: DirectWrite) -> Result<(), (io::Result<()>, Option<DirectWrite>)> {
        let mut state = sync::lock(&self.state);
        state.settle();
        if state.broken {
            return Err((
                Err(io::Error::other("the ring failed earlier")),
                Some(write),
            ));
        }
        let Ok(len) = u32::try_from(write.bytes().len()) else {
            return Err((
                Err(io::Error::other("a direct write over 4 GiB")),
                Some(write),
            ));
        };
        let entry = durable_write(&write.direct, write.bytes().as_ptr(), len, write.offset);
        // SAFETY: the buffer and the file stay alive, held by the state,
        // until the write's completion is reaped (or for good).
        if unsafe { state.ring.submission().push(&entry) }.is_err() {
            return Err((Err(io::Error::other("the ring is full")), Some(write)));
        }
        state.in_flight = Some(write);
        loop {
            match state.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // The entry may still be submitted later: keep what it
                    // points at, and use the ring no more.
                    state.broken = true;
                    return Err((Err(e), state.in_flight.clone()));
                }
            }
        }
    }
}

/// Whether `e` says the system does not do direct writes here (the file
/// system, the alignment it wants, or io_uring itself), rather than that
/// the write failed.
pub(crate) fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::EPERM | libc::EFAULT)
    )
}

/// Whether a log in `dir` can be written with direct I/O through io_uring
/// on this system (see [`crate::NodeOptions::direct_log_writes`]): one
/// block written the way the log writes, to a file created and removed
/// again.
pub fn direct_log_writes_work(dir: &Path) -> bool {
    let path = dir.join(format!(".mqkv-direct-probe-{}", std::process::id()));
    let worked = probe(&path);
    let _ = std::fs::remove_file(&path);
    worked.is_ok()
}

fn probe(path: &Path) -> io::Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let block = BLOCK as usize;
    let buf = vec![1u8; 2 * block];
    let skip = buf.as_ptr().align_offset(block);
    let bytes = &buf[skip..skip + block];
    let mut ring = IoUring::new(2)?;
    let entry = durable_write(&file, bytes.as_ptr(), BLOCK as u32, 0);
    // SAFETY: the write only reads `buf`, which outlives the wait below;
    // should the wait fail, the kernel holds the pages it reads from.
    unsafe { ring.submission().push(&entry) }.map_err(|_| io::Error::other("the ring is full"))?;
    ring.submit_and_wait(1)?;
    let done = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("no completion"))?;
    outcome(done.result(), block)
}

/// The entry writing `len` bytes from `bytes` at `offset` of `file`, done
/// once they are durable.
fn durable_write(file: &File, bytes: *const u8, len: u32, offset: u64) -> squeue::Entry {
    opcode::Write::new(types::Fd(file.as_raw_fd()), bytes, len)
        .offset(offset)
        .rw_flags(libc::RWF_DSYNC)
        .build()
        .user_data(WRITE)
}

/// What a write of `len` bytes whose completion reported `result` did.
fn outcome(result: i32, len: usize) -> io::Result<()> {
    match result {
        n if n < 0 => Err(io::Error::from_raw_os_error(-n)),
        n if n as usize == len => Ok(()),
        n => Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("a direct write of {len} bytes wrote {n}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_file::{self, Record, Segments};
    use crate::types::{LogId, RaftEntry};
    use openraft::{CommittedLeaderId, EntryPayload};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn entry(index: u64) -> Record {
        Record::Entry(RaftEntry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), index),
            payload: EntryPayload::Blank,
        })
    }

    fn stage(segments: &mut Segments, from: u64, n: u64) {
        for index in from..from + n {
            segments.stage(&entry(index)).unwrap();
            segments.staged_entry(index).unwrap();
        }
    }

    fn segment_bytes(dir: &Path) -> Vec<u8> {
        let mut paths: Vec<_> = std::fs::read_dir(log_file::dir_of(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "seg"))
            .collect();
        paths.sort();
        std::fs::read(paths.last().unwrap()).unwrap()
    }

    /// Writes `write` through a ring, or, where this system refuses direct
    /// writes, the same blocks through the page cache. Returns whether it
    /// went through the ring.
    fn write_blocks(ring: Option<&Ring>, write: DirectWrite, rt: &tokio::runtime::Runtime) -> bool {
        if let Some(ring) = ring {
            let (result, _) = rt.block_on(ring.write(write));
            result.unwrap();
            return true;
        }
        use std::os::unix::fs::FileExt;
        write
            .file
            .write_all_at(write.bytes(), write.offset)
            .unwrap();
        false
    }

    /// Direct writes leave a segment byte for byte as writes through the
    /// page cache do: the block the end falls in is written again whole,
    /// from the copy kept of it or, after a write through the page cache,
    /// read back from the file.
    #[test]
    fn direct_writes_leave_the_log_as_page_cache_writes_do() {
        let rt = runtime();
        let (plain_dir, direct_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut plain, _) = log_file::create(plain_dir.path(), 1, 64 << 20).unwrap();
        let (mut direct, _) = log_file::create(direct_dir.path(), 1, 64 << 20).unwrap();
        let works = direct_log_writes_work(direct_dir.path());
        let ring = works.then(|| rt.block_on(async { Ring::new() }).unwrap());
        let mut index = 0;
        let mut through_ring = 0;
        // Writes of 1 to 60 records (about 20 bytes each), one large one
        // over several blocks, and a vote through the page cache between.
        let sizes = (1..=60).chain([900]).chain(1..=20);
        for (i, n) in sizes.enumerate() {
            stage(&mut plain, index, n);
            stage(&mut direct, index, n);
            index += n;
            plain.write(true).unwrap();
            if i == 30 {
                let vote = Record::Vote(openraft::Vote::new(4, 1));
                plain.stage(&vote).unwrap();
                plain.write(true).unwrap();
                direct.stage(&vote).unwrap();
                direct.write(true).unwrap();
                continue;
            }
            // A buffer handed back by an earlier write holds its bytes: every
            // other write gets one full of them, larger than it needs.
            let buffer = match i % 2 {
                0 => vec![0xA5; 64 << 10],
                _ => Vec::new(),
            };
            let write = direct
                .direct_write(buffer)
                .unwrap()
                .expect("a direct write");
            assert_eq!(write.offset % BLOCK, 0);
            assert_eq!(write.bytes().len() as u64 % BLOCK, 0);
            assert_eq!(write.bytes().as_ptr() as usize % BLOCK as usize, 0);
            through_ring += usize::from(write_blocks(ring.as_ref(), write, &rt));
            assert_eq!(direct.written_len(), plain.written_len());
            let (a, b) = (
                segment_bytes(plain_dir.path()),
                segment_bytes(direct_dir.path()),
            );
            let len = plain.written_len() as usize;
            assert_eq!(a[..len], b[..len], "after write {i}");
            assert!(
                b[len..].iter().all(|byte| *byte == 0),
                "zeros after the end"
            );
        }
        assert_eq!(through_ring > 0, works);
        drop((plain, direct, ring));
        let (_, a) = log_file::open(plain_dir.path(), 64 << 20).unwrap().unwrap();
        let (_, b) = log_file::open(direct_dir.path(), 64 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(b.entries.len() as u64, index);
        assert_eq!(a.entries, b.entries);
        assert_eq!(a.vote, b.vote);
    }

    /// An append that would reach past the space allocated ahead (a large
    /// one) is written through the page cache, and the direct write after
    /// it starts from what the file holds.
    #[test]
    fn a_write_past_the_allocated_space_goes_through_the_page_cache() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let (mut segments, _) = log_file::create(dir.path(), 1, 64 << 20).unwrap();
        let ring =
            direct_log_writes_work(dir.path()).then(|| rt.block_on(async { Ring::new() }).unwrap());
        stage(&mut segments, 0, 3);
        let first = segments.direct_write(Vec::new()).unwrap().expect("direct");
        write_blocks(ring.as_ref(), first, &rt);
        // About 20 bytes a record: past the 4 MiB allocated ahead.
        stage(&mut segments, 3, 300_000);
        assert!(segments.direct_write(Vec::new()).unwrap().is_none());
        segments.write(true).unwrap();
        stage(&mut segments, 300_003, 5);
        let last = segments.direct_write(Vec::new()).unwrap().expect("direct");
        write_blocks(ring.as_ref(), last, &rt);
        drop((segments, ring));
        let (_, loaded) = log_file::open(dir.path(), 64 << 20).unwrap().unwrap();
        assert_eq!(loaded.entries.len(), 300_008);
        let last = loaded.entries.last().unwrap().0;
        assert_eq!(last.index, 300_007);
    }

    /// A write whose future is dropped before it completes keeps its buffer
    /// with the ring, which waits for it before the next write.
    #[test]
    fn a_write_abandoned_in_flight_is_waited_for() {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        if !direct_log_writes_work(dir.path()) {
            eprintln!("no direct writes on this system: nothing to abandon");
            return;
        }
        let (mut segments, _) = log_file::create(dir.path(), 1, 64 << 20).unwrap();
        let ring = rt.block_on(async { Ring::new() }).unwrap();
        stage(&mut segments, 0, 50);
        let first = segments.direct_write(Vec::new()).unwrap().expect("direct");
        rt.block_on(async {
            let mut write = std::pin::pin!(ring.write(first));
            // Polled once (submitted), then dropped.
            let polled = futures_poll_once(write.as_mut()).await;
            assert!(polled.is_none() || polled.is_some_and(|(r, _)| r.is_ok()));
        });
        stage(&mut segments, 50, 50);
        let second = segments.direct_write(Vec::new()).unwrap().expect("direct");
        let (result, _) = rt.block_on(ring.write(second));
        result.unwrap();
        drop((segments, ring));
        let (_, loaded) = log_file::open(dir.path(), 64 << 20).unwrap().unwrap();
        assert_eq!(loaded.entries.len(), 100);
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    /// A direct write the system refuses (here: one not aligned to the
    /// blocks `O_DIRECT` wants) is written through the page cache and
    /// synced instead, and appends are no longer written directly.
    #[tokio::test]
    async fn a_refused_direct_write_is_written_through_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        std::fs::write(&path, vec![0u8; 2 * BLOCK as usize]).unwrap();
        let counters = std::sync::Arc::new(crate::stats::Counters::default());
        let log =
            crate::log_store::LogStore::start(None, path.clone(), counters.clone(), true, true);
        let shared = log.shared();
        assert!(shared.writes_directly());
        let write = DirectWrite::unaligned(&path, &[7; 100], 100).unwrap();
        shared.write_direct(write).await.unwrap();
        assert!(!shared.writes_directly(), "direct writes turned off");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[100..200], [7; 100]);
        assert!(bytes[..100].iter().chain(&bytes[200..]).all(|b| *b == 0));
        assert_eq!(crate::stats::Counters::get(&counters.log_direct_writes), 0);
    }

    #[test]
    fn refusals_are_told_from_failures() {
        assert!(refused(&io::Error::from_raw_os_error(libc::EINVAL)));
        assert!(refused(&io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        assert!(!refused(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!refused(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(!refused(&io::Error::other("anything else")));
    }
}
