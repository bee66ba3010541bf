//! Row-parallel loops for a forward pass's per-token steps (norms, RoPE, SwiGLU) over prompt
//! batches: the rows split into one contiguous range per thread of the pool, each row computed
//! exactly as the serial loop computes it. Batches under [`PAR_MIN_ROWS`] rows (decoding,
//! speculative verification) stay on the calling thread.

use std::ops::Range;

use mica_kernels::ThreadPool;
use mica_kernels::pool::split_range;

/// Rows from which the per-token steps are split across the pool.
pub(crate) const PAR_MIN_ROWS: usize = 16;

/// A mutable slice that the threads of one [`for_ranges`] call write in disjoint ranges.
#[derive(Clone, Copy)]
pub(crate) struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: each thread takes a disjoint range ([`Shared::range`]'s contract).
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    pub(crate) fn new(s: &mut [T]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// Elements `r` of the slice.
    ///
    /// # Safety
    /// No other thread may access `r` while the returned slice lives, and the slice `self`
    /// was made from must outlive it.
    pub(crate) unsafe fn range<'a>(self, r: Range<usize>) -> &'a mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "range {r:?} of {}",
            self.len
        );
        // SAFETY: in bounds (checked), exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

/// Calls `f` with contiguous ranges covering `0..n` (boundaries on multiples of `align`), one
/// per thread of `pool` when `rows >= PAR_MIN_ROWS`, else `f(0..n)` on this thread.
pub(crate) fn for_ranges(
    pool: &ThreadPool,
    rows: usize,
    n: usize,
    align: usize,
    f: impl Fn(Range<usize>) + Sync,
) {
    if rows < PAR_MIN_ROWS || pool.n_threads() == 1 {
        return f(0..n);
    }
    pool.run(|i, nt| {
        let r = split_range(n, i, nt, align);
        if !r.is_empty() {
            f(r)
        }
    });
}
