//! The process's allocator: mimalloc, asked for plain blocks whenever they are aligned enough.
//!
//! mimalloc's aligned entry points (`mi_malloc_aligned`, which the `mimalloc` crate calls for
//! every allocation) take a fast path only while the size class's current page has a free
//! block at hand. When it has none, they over-allocate a larger block and mark its page as
//! holding interior pointers, instead of refilling the page as `mi_malloc` does; the page then
//! stays without free blocks, so every later allocation of that size takes the slow path too,
//! and every free of such a block has to find the block's start first.
//!
//! Every mimalloc block of 16 bytes or more starts on a 16-byte boundary (`MI_MAX_ALIGN_SIZE`),
//! and smaller requests are rounded up to blocks of two words. A layout whose alignment is at
//! most 16 and at most its size is therefore served by `mi_malloc` (the rule Rust's own `System`
//! allocator applies to `malloc`); any other goes to the aligned entry points.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of at least this many bytes has (`MI_MAX_ALIGN_SIZE`).
const MIN_ALIGN: usize = 16;

/// Whether a block of `size` bytes from `mi_malloc` is aligned to `align`.
fn plain_block_fits(size: usize, align: usize) -> bool {
    align <= MIN_ALIGN && align <= size
}

/// mimalloc behind the standard allocator interface.
pub struct MiMalloc;

/// A block for `layout` from `plain` when a plain block is aligned enough, else from `aligned`
/// (the same kind of block, zeroed or not).
///
/// # Safety
/// `plain` and `aligned` must be mimalloc's allocation functions.
#[inline]
unsafe fn block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: mimalloc's allocation functions accept any size and a power-of-two alignment.
    unsafe {
        if plain_block_fits(layout.size(), layout.align()) {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

// SAFETY: every block comes from mimalloc, aligned as the layout asks (see the module notes),
// and is given back to mimalloc; `mi_free` takes blocks from either kind of entry point.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the two are mimalloc's allocation functions.
        unsafe { block(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the two are mimalloc's zeroing allocation functions.
        unsafe { block(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator; the new block is aligned as `layout` asks.
        unsafe {
            if plain_block_fits(new_size, layout.align()) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set (to
/// anything: mimalloc itself reads its value).
///
/// mimalloc asks for huge pages on its arenas (`madvise`, which the kernel's default `madvise`
/// mode honours). The kernel's `khugepaged` then fills every 2 MiB range that holds any page in
/// use into a whole huge page, a few ranges every 10 s. After a flood, whose freed memory leaves
/// many such ranges sparsely used, resident memory went on rising for minutes with no traffic:
/// by about 12 MiB every 10 s, from 86 to over 240 MiB (`scripts/abuse.py`). Without huge pages
/// a flood's memory is given back page by page and stays given back, and the server starts at
/// 14 MiB instead of 24.
pub fn without_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        disable_transparent_huge_pages();
    }
}

fn disable_transparent_huge_pages() {
    // SAFETY: `PR_SET_THP_DISABLE` takes integers only and changes nothing but this process's
    // use of huge pages.
    let done = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if done != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "transparent huge pages could not be turned off"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transparent_huge_pages_are_turned_off() {
        disable_transparent_huge_pages();
        // SAFETY: `PR_GET_THP_DISABLE` takes integers only and reads a flag.
        let off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(off, 1);
    }

    /// Blocks of every size and alignment around the boundaries come back aligned as asked,
    /// keep their bytes when grown and shrunk, and zeroed blocks are zero.
    #[test]
    fn blocks_are_aligned_as_asked_and_keep_their_bytes() {
        let a = MiMalloc;
        let mut held = Vec::new();
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in (1..=80).chain([96, 100, 127, 128, 129, 1000, 1024, 5000, 70_000]) {
                let Ok(layout) = Layout::from_size_align(size, align) else {
                    continue;
                };
                // SAFETY: the layout has a non-zero size; each block is freed below.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size}, align {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let grown = a.realloc(p, layout, size * 3);
                    assert!(!grown.is_null());
                    assert_eq!(grown as usize % align, 0, "grown {size}, align {align}");
                    assert!(std::slice::from_raw_parts(grown, size)
                        .iter()
                        .all(|&b| b == 0xA5));
                    let grown_layout = Layout::from_size_align_unchecked(size * 3, align);
                    let shrunk = a.realloc(grown, grown_layout, size.div_ceil(2));
                    assert_eq!(shrunk as usize % align, 0, "shrunk {size}, align {align}");
                    assert!(std::slice::from_raw_parts(shrunk, size.div_ceil(2))
                        .iter()
                        .all(|&b| b == 0xA5));
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed {size}, align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    // Kept for a while, so pages fill up and later blocks come from fresh ones.
                    held.push((
                        shrunk,
                        Layout::from_size_align_unchecked(size.div_ceil(2), align),
                    ));
                    held.push((z, layout));
                }
            }
        }
        for (p, layout) in held {
            // SAFETY: each block came from `a` with this layout.
            unsafe { a.dealloc(p, layout) }
        }
    }

    /// Many blocks of one size, freed and taken again: pages run out of free blocks and are
    /// refilled, and every block is still aligned as asked.
    #[test]
    fn blocks_stay_aligned_as_pages_run_out_and_refill() {
        let a = MiMalloc;
        for (size, align) in [
            (24usize, 8usize),
            (48, 16),
            (40, 8),
            (16, 16),
            (8, 8),
            (200, 8),
        ] {
            let layout = Layout::from_size_align(size, align).expect("a valid layout");
            let mut held = Vec::new();
            for round in 0..3 {
                for _ in 0..20_000 {
                    // SAFETY: the layout has a non-zero size; each block is freed below.
                    let p = unsafe { a.alloc(layout) };
                    assert!(!p.is_null());
                    assert_eq!(
                        p as usize % align,
                        0,
                        "size {size}, align {align}, round {round}"
                    );
                    held.push(p);
                }
                // Every other block freed, so the next round takes freed blocks and new ones.
                let mut kept = Vec::new();
                for (i, p) in held.drain(..).enumerate() {
                    if i % 2 == 0 {
                        // SAFETY: `p` came from `a` with this layout.
                        unsafe { a.dealloc(p, layout) }
                    } else {
                        kept.push(p);
                    }
                }
                held = kept;
            }
            for p in held {
                // SAFETY: `p` came from `a` with this layout.
                unsafe { a.dealloc(p, layout) }
            }
        }
    }
}
