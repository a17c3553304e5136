//! A global allocator that counts: the bytes live now, the peak since a case began, the
//! largest single request. A request over `MAX_ALLOCATION` is refused, after the running
//! case is named on stderr (an infallible allocation then aborts the process, and that line
//! is the only one left to say which case it was).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// No single allocation, and no case's peak, may pass this.
pub const MAX_ALLOCATION: usize = 256 << 20;

struct Counting;

/// Bytes allocated now, the most since the case began, the largest single request.
pub(crate) static LIVE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static PEAK: AtomicUsize = AtomicUsize::new(0);
pub(crate) static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The running case, printed if an allocation over the limit is refused (an infallible one
/// then aborts the process, and this line is the only one left to say which case it was).
pub(crate) static CASE: Mutex<String> = Mutex::new(String::new());

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Records a request; refuses one over the limit, after naming the case on stderr.
fn admit(size: usize) -> bool {
    LARGEST.fetch_max(size, Relaxed);
    if size <= MAX_ALLOCATION {
        return true;
    }
    if let Ok(case) = CASE.try_lock() {
        // Writes the bytes as they are: no formatting, so no allocation in the allocator.
        let mut err = std::io::stderr();
        let _ = err.write_all(b"\nallocation over the limit refused in ");
        let _ = err.write_all(case.as_bytes());
        let _ = err.write_all(b"\n");
    }
    false
}

fn grew(n: usize) {
    let live = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(live, Relaxed);
}

// SAFETY: every call is passed to `System` unchanged, or refused with a null pointer (which
// the `GlobalAlloc` contract allows); the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller promised for `layout`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller promised for `layout`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised: `ptr` came from this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admit(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller promised for `ptr`, `layout` and `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size > layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}
