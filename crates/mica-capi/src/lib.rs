//! The C ABI of mica: `libmica.so` / `libmica.a`, declared by `include/mica.h`, which
//! cbindgen generates from this crate (`tests/header.rs` fails when the checked-in header
//! differs from what these sources declare). docs/c-api.md explains building, linking and
//! the rules below with an example.
//!
//! The rules every function follows:
//! - **Handles** (`mica_model`, `mica_session`, `mica_engine`) are opaque, made by a
//!   `_open` / `_new` / `_start` function and released by its `_free` (NULL is fine).
//! - **Status codes**: fallible functions return a [`MicaStatus`]; on failure
//!   `mica_last_error()` gives the message on the same thread. NULL where a pointer is
//!   required, invalid UTF-8, out-of-range values and panics inside mica are reported this
//!   way, never undefined behaviour or an abort.
//! - **Strings** in are NUL-terminated UTF-8, read during the call only. Strings out are
//!   `malloc`ed by mica and freed by the caller with `mica_string_free()`, except those in a
//!   `mica_completion`, freed with it by `mica_completion_free()`.
//! - **Arrays** out (token ids, logits) go into caller buffers: `*n_out` receives the count
//!   needed, and a buffer too small gives `MICA_STATUS_BUFFER_TOO_SMALL` with nothing
//!   written.
//! - **Threads**: a model and an engine are thread-safe; a session is used by one thread at
//!   a time. Each function's documentation says which.
//!
//! This crate wraps the `mica` facade crate (renamed `facade` here, because this library's
//! own name is `mica` too, so that the shared library is `libmica.so`).

// In the order the header lists them: the basics, then what needs only a model, then
// generation, one sequence and many.
mod error;
mod ffi;

mod model;

mod params;

mod session;

mod engine;

#[cfg(test)]
mod tests;

use std::ffi::c_char;

// The thread-safety the header promises, checked by the compiler: models and engines are
// shared between threads, a session moves between them.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn movable<T: Send>() {}
    shared::<facade::Model>();
    shared::<facade::Engine>();
    movable::<facade::Session>();
};

/// The version of the C ABI this header describes. It changes when a function, struct or
/// enum changes in a way that breaks programs built against an earlier header; compare it
/// with `mica_abi_version()` at run time.
pub const MICA_ABI_VERSION: u32 = 2;

/// mica's version ("0.1.0"), a static string (do not free it).
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// The ABI version of the loaded library: `MICA_ABI_VERSION` of the header it was built
/// with.
///
/// Thread-safe.
#[unsafe(no_mangle)]
pub extern "C" fn mica_abi_version() -> u32 {
    MICA_ABI_VERSION
}

/// The message of the last call that failed on this thread ("" when none has). The string
/// belongs to mica (do not free it) and stays valid until the next failing call on this
/// thread; a successful call leaves it unchanged.
///
/// Thread-safe (each thread has its own).
#[unsafe(no_mangle)]
pub extern "C" fn mica_last_error() -> *const c_char {
    error::last_error()
}

/// Frees a string mica returned (`mica_detokenize()`, `mica_engine_metrics()`). NULL is
/// fine.
///
/// Thread-safe for distinct strings.
///
/// # Safety
/// `s` is NULL or a string from mica not freed before (not one inside a `mica_completion`,
/// and not `mica_version()` or `mica_last_error()`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mica_string_free(s: *mut c_char) {
    // SAFETY: NULL or malloc'ed by mica (ffi::malloc_string), by the contract.
    unsafe { libc::free(s.cast()) };
}
