//! Crossing the boundary safely: C arguments to Rust values (NULL pointers and invalid UTF-8
//! become errors, never undefined behaviour), and results to memory C owns.
//!
//! Strings and arrays that mica hands out are allocated with the C library's `malloc`, so
//! that freeing them needs no size (`mica_string_free`, `mica_completion_free` call `free`)
//! and a string may hold NUL bytes (its length is reported beside it).

use crate::error::{Failure, MicaStatus, Result};
use std::ffi::{CStr, c_char};

/// The UTF-8 string at `p` (NUL-terminated); `what` names the argument in the error.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: not NULL, and NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| {
        Failure::new(
            MicaStatus::InvalidUtf8,
            format!("{what} is not valid UTF-8 (at byte {})", e.valid_up_to()),
        )
    })
}

/// [`str_arg`], with NULL meaning "not given".
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn opt_str_arg<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: forwarded contract.
        unsafe { str_arg(p, what) }.map(Some)
    }
}

/// The `n` elements at `p`; `p` may be NULL when `n` is 0.
///
/// # Safety
/// `p` is NULL or points to `n` initialized elements that outlive `'a`.
pub(crate) unsafe fn slice_arg<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(what));
    }
    if n.checked_mul(size_of::<T>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(Failure::invalid(format!(
            "{what}: {n} elements is too many"
        )));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!("{what} is not aligned")));
    }
    // SAFETY: not NULL, aligned, within isize::MAX bytes; `n` initialized elements by the
    // caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The object behind a handle.
///
/// # Safety
/// `p` is NULL or a live handle that outlives `'a`.
pub(crate) unsafe fn handle<'a, T>(p: *const T, what: &str) -> Result<&'a T> {
    // SAFETY: NULL is checked; otherwise a live handle by the caller's contract.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::null(what))
}

/// The object behind a handle, for a call that changes it.
///
/// # Safety
/// `p` is NULL or a live handle, not used by any other thread during `'a`.
pub(crate) unsafe fn handle_mut<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    // SAFETY: NULL is checked; otherwise live and unshared by the caller's contract.
    unsafe { p.as_mut() }.ok_or_else(|| Failure::null(what))
}

/// Checks that an output pointer is not NULL (it is written later with `ptr::write`, never
/// read, so it may point to uninitialized memory).
pub(crate) fn out_arg<T>(p: *mut T, what: &str) -> Result<()> {
    if p.is_null() {
        Err(Failure::null(what))
    } else {
        Ok(())
    }
}

/// `bytes` copied into `malloc`ed memory with a NUL after them.
pub(crate) fn malloc_string(bytes: &[u8]) -> Result<*mut c_char> {
    // SAFETY: malloc of a non-zero size; the result is checked for NULL before use.
    let p = unsafe { libc::malloc(bytes.len() + 1) }.cast::<u8>();
    if p.is_null() {
        return Err(oom(bytes.len() + 1));
    }
    // SAFETY: `p` holds `len + 1` bytes and does not overlap `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        p.add(bytes.len()).write(0);
    }
    Ok(p.cast())
}

/// `items` copied into `malloc`ed memory; NULL when `items` is empty.
pub(crate) fn malloc_array<T: Copy>(items: &[T]) -> Result<*mut T> {
    if items.is_empty() {
        return Ok(std::ptr::null_mut());
    }
    let bytes = size_of_val(items);
    // SAFETY: malloc of a non-zero size; the result is checked for NULL before use.
    let p = unsafe { libc::malloc(bytes) }.cast::<T>();
    if p.is_null() {
        return Err(oom(bytes));
    }
    // SAFETY: malloc's memory is aligned for any fundamental type and holds `items`.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), p, items.len()) };
    Ok(p)
}

fn oom(bytes: usize) -> Failure {
    Failure::new(
        MicaStatus::OutOfMemory,
        format!("cannot allocate {bytes} bytes for a result"),
    )
}

/// Copies `data` into the caller's buffer `out` of `capacity` elements, writing the length
/// to `*n_out` first, whether it fits or not.
///
/// # Safety
/// `n_out` was checked by [`out_arg`]; `out` is NULL or holds `capacity` elements.
pub(crate) unsafe fn write_buffer<T: Copy>(
    data: &[T],
    out: *mut T,
    capacity: usize,
    n_out: *mut usize,
    what: &str,
) -> Result<()> {
    // SAFETY: checked not NULL by the caller.
    unsafe { n_out.write(data.len()) };
    if data.len() > capacity {
        return Err(too_small(what, data.len(), capacity));
    }
    if data.is_empty() {
        return Ok(());
    }
    if out.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: `out` holds `capacity >= data.len()` elements by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), out, data.len()) };
    Ok(())
}

pub(crate) fn too_small(what: &str, needed: usize, capacity: usize) -> Failure {
    Failure::new(
        MicaStatus::BufferTooSmall,
        format!("{what} holds {capacity} elements but {needed} are needed"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_invalid_utf8_are_errors() {
        let e = unsafe { str_arg(std::ptr::null(), "text") }.unwrap_err();
        assert_eq!(e.status, MicaStatus::NullArgument);
        let bad = b"ab\xff\0";
        let e = unsafe { str_arg(bad.as_ptr().cast(), "text") }.unwrap_err();
        assert_eq!(e.status, MicaStatus::InvalidUtf8);
        assert_eq!(e.message, "text is not valid UTF-8 (at byte 2)");
        assert_eq!(unsafe { opt_str_arg(std::ptr::null(), "x") }.unwrap(), None);
        let e = unsafe { slice_arg::<u32>(std::ptr::null(), 3, "tokens") }.unwrap_err();
        assert_eq!(e.status, MicaStatus::NullArgument);
        assert!(unsafe { slice_arg::<u32>(std::ptr::null(), 0, "tokens") }.is_ok());
    }

    #[test]
    fn strings_keep_their_nul_bytes_and_end_with_one() {
        let p = malloc_string(b"a\0b").unwrap();
        let got = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), 4) }.to_vec();
        assert_eq!(got, b"a\0b\0");
        unsafe { libc::free(p.cast()) };
        assert!(malloc_array::<u32>(&[]).unwrap().is_null());
    }

    #[test]
    fn a_small_buffer_reports_the_size_needed() {
        let mut n = 0usize;
        let mut buf = [0u32; 2];
        let e =
            unsafe { write_buffer(&[1u32, 2, 3], buf.as_mut_ptr(), 2, &mut n, "out") }.unwrap_err();
        assert_eq!((e.status, n), (MicaStatus::BufferTooSmall, 3));
        assert_eq!(buf, [0, 0], "nothing is written when it does not fit");
        unsafe { write_buffer(&[1u32, 2], buf.as_mut_ptr(), 2, &mut n, "out") }.unwrap();
        assert_eq!((buf, n), ([1, 2], 2));
    }
}
