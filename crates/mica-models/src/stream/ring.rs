//! The ring of slots streamed layers are read into, and the protocol that shares them
//! between the filler and the forward pass (see the module docs of [`super`]).

use crate::error::{ModelError, Result};
use crate::memory::mib;
use mica_formats::TensorBytes;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// Reads are page-aligned in the file and in the slots.
pub(super) const PAGE: usize = 4096;

/// A page-aligned range of the file read into a slot at `slot_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Extent {
    pub(super) file_off: u64,
    pub(super) len: usize,
    pub(super) slot_off: usize,
}

/// The reads of one streamed layer.
pub(super) struct LayerReads {
    /// A layer, or `n_layers + c` for the output head's chunk `c`.
    pub(super) unit: usize,
    /// What it is, for messages.
    pub(super) label: String,
    pub(super) extents: Vec<Extent>,
}

/// Groups the byte ranges `(start, len)` of a layer's matrices into page-aligned extents
/// laid out one after another in a slot (ranges whose pages touch share an extent; each
/// byte keeps its offset within its page). Returns the extents, the slot offset of each
/// range (in input order), and the slot bytes needed.
pub(super) fn layout(
    ranges: &[(usize, usize)],
    file_len: usize,
) -> (Vec<Extent>, Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_by_key(|&i| ranges[i].0);
    let mut extents: Vec<Extent> = Vec::new();
    let mut offsets = vec![0; ranges.len()];
    let mut used = 0;
    for i in order {
        let (start, len) = ranges[i];
        let lo = start / PAGE * PAGE;
        let hi = (start + len).next_multiple_of(PAGE).min(file_len);
        match extents.last_mut() {
            Some(e) if lo as u64 <= e.file_off + e.len as u64 => {
                let end = (e.file_off as usize + e.len).max(hi);
                used += end - (e.file_off as usize + e.len);
                e.len = end - e.file_off as usize;
            }
            _ => {
                extents.push(Extent {
                    file_off: lo as u64,
                    len: hi - lo,
                    slot_off: used,
                });
                used = (used + hi - lo).next_multiple_of(PAGE);
            }
        }
        let e = extents.last().expect("pushed above");
        offsets[i] = e.slot_off + (start - e.file_off as usize);
    }
    (extents, offsets, used.next_multiple_of(PAGE))
}

/// One ring buffer: anonymous pages (page-aligned; untouched pages are not resident),
/// written and read through a raw pointer under the slot protocol of the module docs.
pub(super) struct SlotBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Owns the pages `ptr` points to; never accessed otherwise.
    _map: memmap2::MmapMut,
}

// SAFETY: the buffer is plain memory owned by the ring; who may touch its bytes when is the
// slot protocol's business (module docs), enforced by the ring's mutex.
unsafe impl Send for SlotBuf {}
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    pub(super) fn new(len: usize) -> Result<SlotBuf> {
        let len = len.max(PAGE);
        let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| {
            ModelError::Streaming(format!("cannot map a ring buffer of {}: {e}", mib(len)))
        })?;
        let ptr = NonNull::new(map.as_mut_ptr()).expect("a mapping is not null");
        Ok(SlotBuf {
            ptr,
            len,
            _map: map,
        })
    }

    /// Bytes of the buffer.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The bytes, to read.
    ///
    /// # Safety
    /// Nobody may write them while the slice lives: the slot is `Held` by the caller.
    unsafe fn slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` mapped, initialised (zeroed or read) bytes that live
        // as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// Nobody else may read or write them while the slice lives: the slot is `Filling` and
    /// the caller is its filler.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self) -> &mut [u8] {
        // SAFETY: as `slice`, and the caller has exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Empty,
    Filling(u64),
    Ready(u64),
    Held(u64),
}

pub(super) struct RingState {
    pub(super) slots: Vec<SlotState>,
    /// A read failed: every later acquire reports it.
    pub(super) error: Option<String>,
    pub(super) shutdown: bool,
}

/// The ring of slots, the file they are read from and what goes where.
pub(super) struct Ring {
    pub(super) bufs: Vec<SlotBuf>,
    /// Per slot: 1 + the unit whose bytes may be read now (it is `Held`), 0 when none.
    pub(super) readable: Vec<AtomicUsize>,
    pub(super) state: Mutex<RingState>,
    pub(super) cv: Condvar,
    pub(super) file: File,
    pub(super) reads: Vec<LayerReads>,
    pub(super) bytes_read: AtomicU64,
    /// Nanoseconds the forward pass waited for a slot (overlapped) or read (sync).
    pub(super) wait_ns: AtomicU64,
}

impl Ring {
    pub(super) fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn slot_of(&self, t: u64) -> usize {
        (t % self.reads.len() as u64) as usize % self.bufs.len()
    }

    /// Reads ticket `t`'s layer into its slot, which the caller moved to `Filling(t)`.
    pub(super) fn fill(&self, t: u64) -> std::io::Result<()> {
        let s = self.slot_of(t);
        let reads = &self.reads[(t % self.reads.len() as u64) as usize];
        // SAFETY: the slot is `Filling(t)` and the caller is its filler (module docs).
        let buf = unsafe { self.bufs[s].slice_mut() };
        for e in &reads.extents {
            self.file
                .read_exact_at(&mut buf[e.slot_off..e.slot_off + e.len], e.file_off)?;
            drop_cached(&self.file, e.file_off, e.len);
            self.bytes_read.fetch_add(e.len as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Moves slot `s` from `Empty` to `Filling(t)`, waiting for it to empty; false on shutdown.
    pub(super) fn begin_fill(&self, t: u64) -> bool {
        let s = self.slot_of(t);
        let mut st = self.lock();
        while !st.shutdown && st.slots[s] != SlotState::Empty {
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        if st.shutdown {
            return false;
        }
        st.slots[s] = SlotState::Filling(t);
        true
    }

    /// Ends the fill of ticket `t`: `Ready(t)`, or the error recorded.
    pub(super) fn end_fill(&self, t: u64, r: std::io::Result<()>) {
        let s = self.slot_of(t);
        let mut st = self.lock();
        match r {
            Ok(()) => st.slots[s] = SlotState::Ready(t),
            Err(e) => {
                let what = &self.reads[(t % self.reads.len() as u64) as usize].label;
                st.error = Some(format!("reading {what}: {e}"));
                st.slots[s] = SlotState::Empty;
            }
        }
        self.cv.notify_all();
    }

    /// Waits for ticket `t` to be `Ready` and holds it.
    pub(super) fn acquire(&self, t: u64) -> Result<()> {
        let s = self.slot_of(t);
        let mut st = self.lock();
        loop {
            if let Some(e) = &st.error {
                return Err(ModelError::Streaming(e.clone()));
            }
            if st.slots[s] == SlotState::Ready(t) {
                break;
            }
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.slots[s] = SlotState::Held(t);
        let unit = self.reads[(t % self.reads.len() as u64) as usize].unit;
        self.readable[s].store(unit + 1, Ordering::Release);
        Ok(())
    }

    /// Ends the turn of ticket `t`: its slot may be refilled.
    pub(super) fn release(&self, t: u64) {
        let s = self.slot_of(t);
        self.readable[s].store(0, Ordering::Release);
        let mut st = self.lock();
        debug_assert_eq!(st.slots[s], SlotState::Held(t));
        st.slots[s] = SlotState::Empty;
        self.cv.notify_all();
    }

    /// The IO thread: fills tickets 0, 1, 2... in order until shutdown or an error.
    pub(super) fn run_io(&self) {
        for t in 0.. {
            if !self.begin_fill(t) {
                return;
            }
            let r = self.fill(t);
            let failed = r.is_err();
            self.end_fill(t, r);
            if failed {
                return;
            }
        }
    }
}

/// Opens `path` to stream from: reads are whole extents, so the kernel's read-ahead (which
/// would cache pages past each extent, up to the device's read-ahead size) is turned off.
pub(super) fn open_unbuffered(path: &std::path::Path) -> std::io::Result<File> {
    let file = File::open(path)?;
    // SAFETY: a plain syscall on an open descriptor; failure only leaves read-ahead on.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
    }
    Ok(file)
}

/// Drops the page cache's copy of a range just read (the slot holds the bytes now).
pub(super) fn drop_cached(file: &File, off: u64, len: usize) {
    // SAFETY: a plain syscall on an open descriptor; failure only leaves pages cached.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        );
    }
}

/// A streamed layer's view of its slot: what its matrices' bytes are.
pub(super) struct SlotView {
    pub(super) ring: Arc<Ring>,
    pub(super) slot: usize,
    pub(super) unit: usize,
    pub(super) label: String,
}

impl TensorBytes for SlotView {
    fn bytes(&self) -> &[u8] {
        let held = self.ring.readable[self.slot].load(Ordering::Acquire);
        assert_eq!(
            held,
            self.unit + 1,
            "the streamed weights of {} were read outside their turn of a forward pass",
            self.label
        );
        // SAFETY: `readable[slot]` names this layer only while the forward pass holds the
        // slot (`Held`), during which nothing writes it (module docs).
        unsafe { self.ring.bufs[self.slot].slice() }
    }
}

/// The bytes of a head streamed in chunks: only the chunks are read ([`super::start`]).
pub(super) struct Chunked;

impl TensorBytes for Chunked {
    fn bytes(&self) -> &[u8] {
        panic!("the output head is streamed in chunks: its whole matrix cannot be read")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_groups_ranges_by_page_and_keeps_page_offsets() {
        // Two ranges on neighbouring pages, one far away, given out of order.
        let ranges = [
            (3 * PAGE + 100, 200),
            (100 * PAGE + 5, 10),
            (3 * PAGE + 300, PAGE),
        ];
        let (ext, offs, len) = layout(&ranges, 1 << 30);
        assert_eq!(
            ext,
            [
                Extent {
                    file_off: 3 * PAGE as u64,
                    len: 2 * PAGE,
                    slot_off: 0
                },
                Extent {
                    file_off: 100 * PAGE as u64,
                    len: PAGE,
                    slot_off: 2 * PAGE
                },
            ]
        );
        assert_eq!(offs, [100, 2 * PAGE + 5, 300]);
        assert_eq!(len, 3 * PAGE);
        // Clamped to the file's end.
        let (ext, _, _) = layout(&[(PAGE, 10)], PAGE + 10);
        assert_eq!(ext[0].len, 10);
    }
}
