//! The global allocator of the sidecar and CLI binaries: mimalloc, asked for alignment only
//! when an allocation needs more than mimalloc gives every block.
//!
//! The `mimalloc` crate's allocator passes every allocation to `mi_malloc_aligned`, and
//! mimalloc 3 (the C library `libmimalloc-sys` builds by default) takes its fast path for
//! an aligned request only when the page's next free block happens to be aligned. When the
//! page's free list is empty, a request whose block size is not a power of two (24, 48, 80
//! bytes …) is over-allocated: a larger block, adjusted, on a page that then frees through
//! mimalloc's slower path for aligned blocks. In the sidecar that cost about 1,650
//! instructions per call at the caller's sidecar and 970 at the target's (`agent-reach-bench
//! instructions`, see BENCHMARKS.md). Every mimalloc block is aligned to at least a word, so
//! a request of word alignment or less (almost every Rust allocation) is a plain
//! `mi_malloc`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block has: its smallest block is one word, and blocks are
/// whole words from a word-aligned start.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the module's documentation).
pub struct Mimalloc;

/// `plain(size)` for a layout of word alignment or less, `aligned(size, align)` above it.
#[inline(always)]
fn by_alignment(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: both are mimalloc's allocation functions, safe to call with any size and
    // (for `aligned`) a power-of-two alignment, which every `Layout` has.
    unsafe {
        if layout.align() <= WORD { plain(layout.size()).cast() } else { aligned(layout.size(), layout.align()).cast() }
    }
}

// SAFETY: each method hands the layout's size (and, when it is more than a word, its
// alignment) to the matching mimalloc function, which returns a block of at least that
// size and alignment, or null on failure; `dealloc` and `realloc` receive only pointers
// mimalloc returned (mimalloc frees aligned and unaligned blocks alike with `mi_free`).
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        by_alignment(layout, mi::mi_malloc, mi::mi_malloc_aligned)
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        by_alignment(layout, mi::mi_zalloc, mi::mi_zalloc_aligned)
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size class a call allocates from, at each alignment a Rust type asks for: the
    /// block is aligned, holds its bytes, is zeroed when asked, and keeps them through a
    /// realloc to another size class.
    #[test]
    fn blocks_are_aligned_and_hold_their_bytes() {
        let a = Mimalloc;
        let sizes = [1usize, 7, 8, 12, 16, 24, 40, 48, 80, 100, 200, 640, 1_000, 4_096, 70_000, 1 << 22];
        for align in [1usize, 2, 4, 8, 16, 32, 64, 128, 4_096] {
            for &size in &sizes {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "alloc size {size} align {align}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let grown = a.realloc(p, layout, size * 3 + 5);
                    assert_eq!(grown as usize % align, 0, "realloc size {size} align {align}");
                    assert!(std::slice::from_raw_parts(grown, size).iter().all(|&b| b == 0xa5));
                    a.dealloc(grown, Layout::from_size_align(size * 3 + 5, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "alloc_zeroed size {size} align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
