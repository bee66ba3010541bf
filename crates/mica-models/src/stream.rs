//! Layer streaming: running a model whose weights do not fit in memory.
//!
//! The embeddings, norms, output head and the first layers stay resident; the weight bytes
//! of the remaining layers ("streamed" layers) are read from the file (`pread`) into a ring
//! of buffers, one layer per slot, each time a forward pass reaches them, and the file's
//! page-cache copy of what was read is dropped (`posix_fadvise(DONTNEED)`), so that
//! streamed layers neither stay resident nor evict anything else. A streamed layer's
//! matrices point into its slot (layer `j` of the streaming order uses slot `j % slots`)
//! at their offset in the layer's byte group; they are used in the file's layout, never
//! repacked (the kernels' file-layout and packed paths give the same bits).
//!
//! Two modes ([`StreamMode`]): **overlapped** (default), where an IO thread fills the slots
//! in streaming order ahead of the forward pass (3 slots: while layer `j` computes, `j + 1`
//! is ready and `j + 2` is being read), and **sync**, one slot read by the forward pass
//! itself when it reaches the layer.
//!
//! # Synchronisation
//!
//! Slot reads are numbered: ticket `t` is streamed layer `t % m` (of `m`) in slot
//! `(t % m) % slots`. Each slot has a state under one mutex: `Empty → Filling(t) → Ready(t)
//! → Held(t) → Empty`. Only the filler (the IO thread, or the forward pass in sync mode)
//! writes a slot's bytes, and only while it is `Filling`, a state it moves to from `Empty`
//! under the mutex; only the forward pass reads them, and only while it is `Held`, a state
//! it moves to from `Ready(t)` under the mutex. The mutex orders the writes before the
//! reads (and the reads before the next fill). The forward pass takes tickets in order; a
//! pass that ends early (interrupted, or no rows left for the last layer) still takes the
//! rest of its tickets when it ends ([`Pass`]'s drop), so every pass starts at ticket
//! `0 mod m`. Passes over one model are serialised by a second mutex.
//!
//! A streamed matrix's bytes ([`TensorBytes::bytes`] of its slot) check that their layer is
//! the one held in the slot and panic otherwise, so a read outside the layer's turn (a
//! LoRA merge, a repack, a tool reading weights) fails loudly instead of racing the IO
//! thread. What remains on trust: a slice taken during the turn must not be kept past it
//! (the forward pass's products finish before the turn ends).

use crate::error::{ModelError, Result};
use crate::memory::mib;
use crate::model::Model;
use crate::weights::Matrix;
use mica_formats::TensorBytes;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

/// How streamed layers are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamMode {
    /// An IO thread reads ahead of compute into a ring of [`RING_SLOTS`] buffers.
    #[default]
    Overlapped,
    /// The forward pass reads each streamed layer when it reaches it, into one buffer.
    Sync,
}

impl StreamMode {
    /// Buffers of the ring in this mode.
    pub fn slots(self) -> usize {
        match self {
            StreamMode::Overlapped => RING_SLOTS,
            StreamMode::Sync => 1,
        }
    }
}

impl FromStr for StreamMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<StreamMode, String> {
        match s {
            "overlapped" => Ok(StreamMode::Overlapped),
            "sync" => Ok(StreamMode::Sync),
            _ => Err(format!(
                "unknown stream mode {s:?} (expected \"overlapped\" or \"sync\")"
            )),
        }
    }
}

/// Slots of the overlapped ring: the layer computing, the next one ready, one being read.
pub const RING_SLOTS: usize = 3;

/// Reads are page-aligned in the file and in the slots.
const PAGE: usize = 4096;

/// A page-aligned range of the file read into a slot at `slot_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Extent {
    file_off: u64,
    len: usize,
    slot_off: usize,
}

/// The reads of one streamed layer.
struct LayerReads {
    layer: usize,
    extents: Vec<Extent>,
}

/// Groups the byte ranges `(start, len)` of a layer's matrices into page-aligned extents
/// laid out one after another in a slot (ranges whose pages touch share an extent; each
/// byte keeps its offset within its page). Returns the extents, the slot offset of each
/// range (in input order), and the slot bytes needed.
fn layout(ranges: &[(usize, usize)], file_len: usize) -> (Vec<Extent>, Vec<usize>, usize) {
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

/// One ring buffer: page-aligned heap memory, written and read through raw pointers under
/// the slot protocol of the module docs.
struct SlotBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain memory owned by the ring; who may touch its bytes when is the
// slot protocol's business (module docs), enforced by the ring's mutex.
unsafe impl Send for SlotBuf {}
unsafe impl Sync for SlotBuf {}

impl SlotBuf {
    fn new(len: usize) -> Result<SlotBuf> {
        let layout = Layout::from_size_align(len.max(PAGE), PAGE)
            .map_err(|e| ModelError::Streaming(format!("ring buffer of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(|| {
            ModelError::Streaming(format!("cannot allocate a ring buffer of {}", mib(len)))
        })?;
        Ok(SlotBuf { ptr, layout })
    }

    /// The bytes, to read.
    ///
    /// # Safety
    /// Nobody may write them while the slice lives: the slot is `Held` by the caller.
    unsafe fn slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to `layout.size()` initialised (zeroed or read) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The bytes, to write.
    ///
    /// # Safety
    /// Nobody else may read or write them while the slice lives: the slot is `Filling` and
    /// the caller is its filler.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self) -> &mut [u8] {
        // SAFETY: as `slice`, and the caller has exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for SlotBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Empty,
    Filling(u64),
    Ready(u64),
    Held(u64),
}

struct RingState {
    slots: Vec<SlotState>,
    /// A read failed: every later acquire reports it.
    error: Option<String>,
    shutdown: bool,
}

/// The ring of slots, the file they are read from and what goes where.
struct Ring {
    bufs: Vec<SlotBuf>,
    /// Per slot: 1 + the layer whose bytes may be read now (it is `Held`), 0 when none.
    readable: Vec<AtomicUsize>,
    state: Mutex<RingState>,
    cv: Condvar,
    file: File,
    reads: Vec<LayerReads>,
    bytes_read: AtomicU64,
    /// Nanoseconds the forward pass waited for a slot (overlapped) or read (sync).
    wait_ns: AtomicU64,
}

impl Ring {
    fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot_of(&self, t: u64) -> usize {
        (t % self.reads.len() as u64) as usize % self.bufs.len()
    }

    /// Reads ticket `t`'s layer into its slot, which the caller moved to `Filling(t)`.
    fn fill(&self, t: u64) -> std::io::Result<()> {
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
    fn begin_fill(&self, t: u64) -> bool {
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
    fn end_fill(&self, t: u64, r: std::io::Result<()>) {
        let s = self.slot_of(t);
        let mut st = self.lock();
        match r {
            Ok(()) => st.slots[s] = SlotState::Ready(t),
            Err(e) => {
                let layer = self.reads[(t % self.reads.len() as u64) as usize].layer;
                st.error = Some(format!("reading layer {layer}: {e}"));
                st.slots[s] = SlotState::Empty;
            }
        }
        self.cv.notify_all();
    }

    /// Waits for ticket `t` to be `Ready` and holds it.
    fn acquire(&self, t: u64) -> Result<()> {
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
        let layer = self.reads[(t % self.reads.len() as u64) as usize].layer;
        self.readable[s].store(layer + 1, Ordering::Release);
        Ok(())
    }

    /// Ends the turn of ticket `t`: its slot may be refilled.
    fn release(&self, t: u64) {
        let s = self.slot_of(t);
        self.readable[s].store(0, Ordering::Release);
        let mut st = self.lock();
        debug_assert_eq!(st.slots[s], SlotState::Held(t));
        st.slots[s] = SlotState::Empty;
        self.cv.notify_all();
    }

    /// The IO thread: fills tickets 0, 1, 2... in order until shutdown or an error.
    fn run_io(&self) {
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

/// Drops the page cache's copy of a range just read (the slot holds the bytes now).
fn drop_cached(file: &File, off: u64, len: usize) {
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
struct SlotView {
    ring: Arc<Ring>,
    slot: usize,
    layer: usize,
}

impl TensorBytes for SlotView {
    fn bytes(&self) -> &[u8] {
        let held = self.ring.readable[self.slot].load(Ordering::Acquire);
        assert_eq!(
            held,
            self.layer + 1,
            "the streamed weights of layer {} were read outside the layer's turn of a forward \
             pass",
            self.layer
        );
        // SAFETY: `readable[slot]` names this layer only while the forward pass holds the
        // slot (`Held`), during which nothing writes it (module docs).
        unsafe { self.ring.bufs[self.slot].slice() }
    }
}

/// Where the forward pass is in the streaming order.
struct Cursor {
    /// The next ticket to take.
    next: u64,
    /// The ticket held now, if any.
    held: Option<u64>,
}

/// The streamed layers of a model, their ring and (overlapped) IO thread.
pub struct LayerStream {
    ring: Arc<Ring>,
    mode: StreamMode,
    /// Per layer of the model: its position in the streaming order, `None` when resident.
    order: Vec<Option<usize>>,
    cursor: Mutex<Cursor>,
    io: Option<JoinHandle<()>>,
}

/// What [`LayerStream::stats`] reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Bytes read from the file so far.
    pub bytes_read: u64,
    /// Time the forward passes spent waiting for (overlapped) or reading (sync) layers.
    pub wait_ns: u64,
}

impl LayerStream {
    /// The layers streamed, in order.
    pub fn layers(&self) -> Vec<usize> {
        self.ring.reads.iter().map(|r| r.layer).collect()
    }

    pub fn mode(&self) -> StreamMode {
        self.mode
    }

    /// Bytes of the ring's buffers (resident while the model lives).
    pub fn buffer_bytes(&self) -> usize {
        self.ring.bufs.iter().map(|b| b.layout.size()).sum()
    }

    /// Bytes one forward pass reads from the file.
    pub fn bytes_per_pass(&self) -> usize {
        let reads = self.ring.reads.iter().flat_map(|r| &r.extents);
        reads.map(|e| e.len).sum()
    }

    pub fn stats(&self) -> StreamStats {
        StreamStats {
            bytes_read: self.ring.bytes_read.load(Ordering::Relaxed),
            wait_ns: self.ring.wait_ns.load(Ordering::Relaxed),
        }
    }

    /// Starts a forward pass (waiting for any other pass over the model to end).
    pub(crate) fn begin_pass(&self) -> Pass<'_> {
        let cursor = self.cursor.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert!(cursor.held.is_none());
        debug_assert_eq!(cursor.next % self.ring.reads.len() as u64, 0);
        Pass {
            stream: self,
            cursor,
        }
    }
}

impl Drop for LayerStream {
    fn drop(&mut self) {
        self.ring.lock().shutdown = true;
        self.ring.cv.notify_all();
        if let Some(h) = self.io.take() {
            let _ = h.join();
        }
    }
}

/// One forward pass's walk through the layers ([`LayerStream::begin_pass`]).
pub(crate) struct Pass<'a> {
    stream: &'a LayerStream,
    cursor: MutexGuard<'a, Cursor>,
}

impl Pass<'_> {
    /// Ends the previous layer's turn and, when `layer` is streamed, begins its turn: its
    /// bytes are in its slot when this returns. Layers must come in increasing order;
    /// streamed layers skipped are taken and given back (overlapped) or skipped (sync).
    pub(crate) fn enter(&mut self, layer: usize) -> Result<()> {
        self.leave();
        let Some(j) = self.stream.order.get(layer).copied().flatten() else {
            return Ok(());
        };
        let m = self.stream.ring.reads.len() as u64;
        let j = j as u64;
        assert!(
            self.cursor.next % m <= j,
            "layer {layer} entered after a later streamed layer"
        );
        while self.cursor.next % m < j {
            self.skip()?;
        }
        let t = self.cursor.next;
        self.take(t)?;
        self.cursor.held = Some(t);
        self.cursor.next += 1;
        Ok(())
    }

    /// Ends the current layer's turn, if any.
    pub(crate) fn leave(&mut self) {
        if let Some(t) = self.cursor.held.take() {
            self.stream.ring.release(t);
        }
    }

    /// Takes ticket `t`: waits for the IO thread, or reads it (sync).
    fn take(&mut self, t: u64) -> Result<()> {
        let ring = &self.stream.ring;
        let t0 = Instant::now();
        let r = match self.stream.mode {
            StreamMode::Overlapped => ring.acquire(t),
            StreamMode::Sync => {
                if !ring.begin_fill(t) {
                    return Err(ModelError::Streaming("the stream was shut down".into()));
                }
                let r = ring.fill(t);
                ring.end_fill(t, r);
                ring.acquire(t)
            }
        };
        let ns = t0.elapsed().as_nanos() as u64;
        ring.wait_ns.fetch_add(ns, Ordering::Relaxed);
        r
    }

    /// Passes over the next streamed layer without computing it.
    fn skip(&mut self) -> Result<()> {
        let t = self.cursor.next;
        if self.stream.mode == StreamMode::Overlapped {
            // The IO thread reads every ticket in order: take it to let it go on.
            self.take(t)?;
            self.stream.ring.release(t);
        }
        self.cursor.next += 1;
        Ok(())
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.leave();
        let m = self.stream.ring.reads.len() as u64;
        while !self.cursor.next.is_multiple_of(m) {
            if self.skip().is_err() {
                // The stream failed: every later pass reports it.
                self.cursor.next = self.cursor.next.next_multiple_of(m);
            }
        }
    }
}

/// What one layer costs in memory resident or streamed ([`layer_costs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCost {
    /// Resident, as the model would hold it (repacked copies where they are made).
    pub resident: usize,
    /// What stays resident when it is streamed (matrices not read from the file: those
    /// rearranged at load).
    pub kept: usize,
    /// Bytes of its slot when streamed.
    pub slot: usize,
}

/// Each layer's [`LayerCost`], for weights repacked or not.
pub fn layer_costs(model: &mut Model, repack: bool) -> Vec<LayerCost> {
    let file = model.file.clone();
    let file_len = file.as_ref().map_or(0, |f| f.bytes().len());
    (0..model.layers.len())
        .map(|l| {
            let mut c = LayerCost::default();
            let mut ranges = Vec::new();
            for m in model.layer_matrices_mut(l) {
                let m: &Matrix = m;
                let held = match m.repacked_len().filter(|_| repack || m.is_repacked()) {
                    Some(n) => n,
                    None => m.n_bytes(),
                };
                c.resident += held;
                match file.as_ref().filter(|f| from_file(m, f)) {
                    Some(_) => ranges.push((m.source().1, m.source().2)),
                    None => c.kept += held,
                }
            }
            c.slot = layout(&ranges, file_len).2;
            c
        })
        .collect()
}

fn from_file(m: &Matrix, file: &Arc<mica_formats::GgufFile>) -> bool {
    !m.is_streamed() && std::ptr::addr_eq(Arc::as_ptr(m.source().0), Arc::as_ptr(file))
}

/// Which layers to stream so that the model fits in `budget` bytes ([`plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamPlan {
    /// The layers streamed (the last ones); empty when everything fits.
    pub streamed: Vec<usize>,
    /// Bytes the plan keeps resident: `fixed`, resident layers, ring buffers.
    pub resident: usize,
    /// Bytes of the ring's buffers.
    pub ring: usize,
}

/// Keeps as many whole layers resident as `budget` allows, streaming the rest through
/// `slots` buffers, when the model would need `total` bytes fully resident and its layers
/// cost `costs`. An error with the numbers when even streaming every layer does not fit.
pub fn plan(total: usize, costs: &[LayerCost], slots: usize, budget: usize) -> Result<StreamPlan> {
    let n = costs.len();
    let fixed = total.saturating_sub(costs.iter().map(|c| c.resident).sum());
    let cost = |k: usize| -> (usize, usize) {
        let streamed = &costs[k..];
        let ring = slots.min(streamed.len()) * streamed.iter().map(|c| c.slot).max().unwrap_or(0);
        let kept: usize = costs[..k].iter().map(|c| c.resident).sum::<usize>()
            + streamed.iter().map(|c| c.kept).sum::<usize>();
        (fixed + kept + ring, ring)
    };
    for k in (0..=n).rev() {
        let (need, ring) = cost(k);
        if need <= budget {
            return Ok(StreamPlan {
                streamed: (k..n).collect(),
                resident: need,
                ring,
            });
        }
    }
    let (need, ring) = cost(0);
    Err(ModelError::Streaming(format!(
        "a memory budget of {} is too small even with every layer streamed: the parts that \
         stay resident (embeddings, output head, norms, KV cache, buffers, runtime) take {} \
         and the ring of {slots} layer buffer(s) {}, {} in all",
        mib(budget),
        mib(need - ring),
        mib(ring),
        mib(need)
    )))
}

/// Streams `layers` (increasing) of `model` from its file in `mode`: their matrices are
/// pointed into the ring's slots, the file's pages of them released. Call before repacking
/// and before any forward pass; layers already streamed cannot be streamed again.
pub fn start(model: &mut Model, layers: &[usize], mode: StreamMode) -> Result<()> {
    if model.stream.is_some() {
        return Err(ModelError::Streaming(
            "the model already streams layers".into(),
        ));
    }
    if layers.is_empty() {
        return Ok(());
    }
    let Some(file) = model.file.clone() else {
        return Err(ModelError::Streaming(
            "layer streaming reads a GGUF or .mica file; this model has none (a Hugging Face \
             folder)"
                .into(),
        ));
    };
    if !layers.windows(2).all(|w| w[0] < w[1]) || layers.last() >= Some(&model.layers.len()) {
        return Err(ModelError::Streaming(format!(
            "layers to stream {layers:?}: not increasing layers of the model's {}",
            model.layers.len()
        )));
    }
    let file_len = file.bytes().len();
    let mut reads = Vec::new();
    let mut offsets = Vec::new();
    let mut slot_len = 0;
    for &l in layers {
        let mut ranges = Vec::new();
        for m in model.layer_matrices_mut(l) {
            if m.is_repacked() {
                return Err(ModelError::Streaming(format!(
                    "{} is repacked: stream layers before repacking",
                    m.name
                )));
            }
            if from_file(m, &file) {
                ranges.push((m.source().1, m.source().2));
            }
        }
        let (extents, offs, len) = layout(&ranges, file_len);
        slot_len = slot_len.max(len);
        reads.push(LayerReads { layer: l, extents });
        offsets.push(offs);
    }
    let slots = mode.slots().min(layers.len());
    let ring = Arc::new(Ring {
        bufs: (0..slots)
            .map(|_| SlotBuf::new(slot_len))
            .collect::<Result<_>>()?,
        readable: (0..slots).map(|_| AtomicUsize::new(0)).collect(),
        state: Mutex::new(RingState {
            slots: vec![SlotState::Empty; slots],
            error: None,
            shutdown: false,
        }),
        cv: Condvar::new(),
        file: File::open(file.path()).map_err(|e| {
            ModelError::Streaming(format!("opening {} to stream: {e}", file.path().display()))
        })?,
        reads,
        bytes_read: AtomicU64::new(0),
        wait_ns: AtomicU64::new(0),
    });
    let mut order = vec![None; model.layers.len()];
    for (j, (&l, offs)) in layers.iter().zip(&offsets).enumerate() {
        order[l] = Some(j);
        let view: Arc<dyn TensorBytes> = Arc::new(SlotView {
            ring: ring.clone(),
            slot: j % slots,
            layer: l,
        });
        let mut i = 0;
        for m in model.layer_matrices_mut(l) {
            if from_file(m, &file) {
                let (_, start, len) = m.source();
                file.release(start, len);
                m.set_streamed(view.clone(), offs[i]);
                i += 1;
            }
        }
    }
    let io = match mode {
        StreamMode::Sync => None,
        StreamMode::Overlapped => {
            let ring = ring.clone();
            let h = std::thread::Builder::new()
                .name("mica-stream-io".into())
                .spawn(move || ring.run_io())
                .map_err(|e| ModelError::Streaming(format!("starting the IO thread: {e}")))?;
            Some(h)
        }
    };
    model.stream = Some(LayerStream {
        ring,
        mode,
        order,
        cursor: Mutex::new(Cursor {
            next: 0,
            held: None,
        }),
        io,
    });
    Ok(())
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

    #[test]
    fn plan_keeps_as_many_layers_as_fit() {
        const M: usize = 1 << 20;
        let c = LayerCost {
            resident: 100 * M,
            kept: 0,
            slot: 100 * M,
        };
        // Ten layers; fully resident 1600 MiB, 600 of them outside the layers.
        let costs = [c; 10];
        assert!(
            plan(1600 * M, &costs, 3, 1600 * M)
                .unwrap()
                .streamed
                .is_empty()
        );
        // Streaming k ≥ 3 layers saves k − 3 layers (a ring of three slots).
        let p = plan(1600 * M, &costs, 3, 1599 * M).unwrap();
        assert_eq!(
            (p.streamed, p.resident, p.ring),
            ((6..10).collect::<Vec<_>>(), 1500 * M, 300 * M)
        );
        let p = plan(1600 * M, &costs, 3, 1450 * M).unwrap();
        assert_eq!(p.streamed, (5..10).collect::<Vec<_>>());
        let p = plan(1600 * M, &costs, 3, 900 * M).unwrap();
        assert_eq!((p.streamed.len(), p.resident), (10, 900 * M));
        // One slot (sync): every layer streamed takes 600 + 100.
        let p = plan(1600 * M, &costs, 1, 700 * M).unwrap();
        assert_eq!((p.streamed.len(), p.ring), (10, 100 * M));
        // Layers not read from the file stay resident when streamed.
        let mut kept = costs;
        kept[9].kept = 40 * M;
        assert_eq!(
            plan(1600 * M, &kept, 1, 740 * M).unwrap().streamed.len(),
            10
        );
        assert!(plan(1600 * M, &kept, 1, 739 * M).is_err());
        let e = plan(1600 * M, &costs, 3, 899 * M).unwrap_err().to_string();
        assert!(
            e.contains("899.0 MiB is too small")
                && e.contains("take 600.0 MiB")
                && e.contains("ring of 3 layer buffer(s) 300.0 MiB, 900.0 MiB in all"),
            "{e}"
        );
    }

    #[test]
    fn stream_mode_parses() {
        assert_eq!("sync".parse(), Ok(StreamMode::Sync));
        assert_eq!("overlapped".parse(), Ok(StreamMode::Overlapped));
        assert!("fast".parse::<StreamMode>().unwrap_err().contains("fast"));
    }
}
