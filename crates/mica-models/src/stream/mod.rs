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

mod pass;
mod plan;
mod ring;

pub(crate) use pass::Pass;
pub use plan::{Costs, LayerCost, StreamPlan, fit, layer_costs, plan};

use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::weights::{Linear, Matrix};
use mica_formats::{GgufFile, TensorBytes};
use ring::{LayerReads, Ring, RingState, SlotBuf, SlotState, SlotView, layout};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

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
    /// The mode's name, as `--stream-mode` takes it.
    pub fn name(self) -> &'static str {
        match self {
            StreamMode::Overlapped => "overlapped",
            StreamMode::Sync => "sync",
        }
    }

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
    /// Per unit (the model's layers, then the output head's chunks): its position in the
    /// streaming order, `None` when resident.
    order: Vec<Option<usize>>,
    /// A streamed output head, in chunks of rows: `(first row, chunk)`, chunk `c` being
    /// unit `n_layers + c`.
    head: Vec<(usize, Linear)>,
    n_layers: usize,
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
        let units = self.ring.reads.iter().map(|r| r.unit);
        units.filter(|&u| u < self.n_layers).collect()
    }

    /// What streams, in words: `layers 3..=23 of 24 and the output head`, `no layer and the
    /// output head`.
    pub fn describe(&self) -> String {
        let layers = self.layers();
        let mut s = match (layers.first(), layers.last()) {
            (Some(a), Some(b)) => format!("layers {a}..={b} of {}", self.n_layers),
            _ => "no layer".into(),
        };
        if self.streams_head() {
            s.push_str(" and the output head");
        }
        s
    }

    /// Whether the output head is streamed too (in chunks of rows).
    pub fn streams_head(&self) -> bool {
        !self.head.is_empty()
    }

    /// The streamed output head's chunks: `(unit, first row, chunk)`; empty when the head
    /// is resident.
    pub(crate) fn head_chunks(&self) -> impl Iterator<Item = (usize, usize, &Linear)> {
        let n = self.n_layers;
        self.head
            .iter()
            .enumerate()
            .map(move |(c, (r0, l))| (n + c, *r0, l))
    }

    pub fn mode(&self) -> StreamMode {
        self.mode
    }

    /// Bytes of the ring's buffers (resident while the model lives).
    pub fn buffer_bytes(&self) -> usize {
        self.ring.bufs.iter().map(SlotBuf::len).sum()
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

/// Drops the page cache's pages of `model`'s file that no process maps (what reading
/// around the tensors loading touched brought in, which a memory cgroup counts as used).
/// A hint: pages still needed are read again on their next use.
pub fn drop_page_cache(model: &Model) {
    if let Some(f) = &model.file
        && let Ok(file) = std::fs::File::open(f.path())
    {
        ring::drop_cached(&file, 0, 0);
    }
}

/// The smallest slot a streamed head's chunks get when no layer is streamed.
const MIN_HEAD_CHUNK: usize = 4 << 20;

/// A matrix of the file's, or an error.
pub(crate) fn from_file(m: &Matrix, file: &Arc<GgufFile>) -> bool {
    !m.is_streamed() && std::ptr::addr_eq(Arc::as_ptr(m.source().0), Arc::as_ptr(file))
}

/// Streams `layers` (increasing) of `model` and, when `head`, its output head (in chunks
/// of rows of about a layer's size) from its file in `mode`: their matrices are pointed
/// into the ring's slots, the file's pages of them released. Call before repacking and
/// before any forward pass; a model streams once.
pub fn start(model: &mut Model, layers: &[usize], head: bool, mode: StreamMode) -> Result<()> {
    if model.stream.is_some() {
        return Err(ModelError::Streaming(
            "the model already streams layers".into(),
        ));
    }
    if layers.is_empty() && !head {
        return Ok(());
    }
    let Some(file) = model.file.clone() else {
        return Err(ModelError::Streaming(
            "layer streaming reads a GGUF or .mica file; this model has none (a Hugging Face \
             folder)"
                .into(),
        ));
    };
    let n_layers = model.layers.len();
    if !layers.windows(2).all(|w| w[0] < w[1]) || layers.last() >= Some(&n_layers) {
        return Err(ModelError::Streaming(format!(
            "layers to stream {layers:?}: not increasing layers of the model's {n_layers}"
        )));
    }
    if head && (!from_file(&model.output.w, &file) || !model.output.lora.is_empty()) {
        return Err(ModelError::Streaming(
            "the output head is not read from the file as stored (or has a LoRA update): it \
             cannot be streamed"
                .into(),
        ));
    }
    let file_len = file.bytes().len();
    // Per unit: its label, the reads, and each streamed matrix's offset in the slot.
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
        reads.push(LayerReads {
            unit: l,
            label: format!("layer {l}"),
            extents,
        });
        offsets.push(offs);
    }
    // The head in chunks of whole rows that fit the layers' slots.
    let mut chunks = Vec::new();
    if head {
        let w = &model.output.w;
        let row = w.n_bytes() / w.rows.max(1);
        let target = slot_len.max(MIN_HEAD_CHUNK).saturating_sub(2 * ring::PAGE);
        let step = (target / row.max(1)).max(1);
        for (c, r0) in (0..w.rows).step_by(step).enumerate() {
            let rows = step.min(w.rows - r0);
            let chunk = Linear::new(
                w.rows_view(r0, rows),
                model
                    .output
                    .bias
                    .as_ref()
                    .map(|b| b[r0..r0 + rows].to_vec()),
            );
            let (_, start, len) = chunk.w.source();
            let (extents, offs, len) = layout(&[(start, len)], file_len);
            slot_len = slot_len.max(len);
            reads.push(LayerReads {
                unit: n_layers + c,
                label: format!("output head rows {r0}..{}", r0 + rows),
                extents,
            });
            offsets.push(offs);
            chunks.push((r0, chunk));
        }
    }
    let slots = mode.slots().min(reads.len());
    let ring = make_ring(file.path(), reads, slot_len, slots)?;
    let view = |j: usize| view(&ring, j);
    let mut order = vec![None; n_layers + chunks.len()];
    for (j, (&l, offs)) in layers.iter().zip(&offsets).enumerate() {
        order[l] = Some(j);
        let v = view(j);
        let mut i = 0;
        for m in model.layer_matrices_mut(l) {
            if from_file(m, &file) {
                let (_, start, len) = m.source();
                file.release(start, len);
                m.set_streamed(v.clone(), offs[i]);
                i += 1;
            }
        }
    }
    for (c, (_, chunk)) in chunks.iter_mut().enumerate() {
        let j = layers.len() + c;
        order[n_layers + c] = Some(j);
        chunk.w.set_streamed(view(j), offsets[j][0]);
    }
    if head {
        // Products read the chunks; the whole matrix is left unreadable (a tied head's
        // embedding lookups read the token embedding's own mapping).
        let (_, start, len) = model.output.w.source();
        if model.output.w.name != model.tok_embd.name {
            file.release(start, len);
        }
        model.output.w.set_streamed(Arc::new(ring::Chunked), 0);
    }
    // Loading read small tensors (norms, biases) between the streamed ones, and each such
    // page fault read the pages around it into the page cache (up to the device's
    // read-ahead, megabytes): give those back too.
    for e in ring.reads.iter().flat_map(|r| &r.extents) {
        ring::drop_cached(&ring.file, e.file_off, e.len);
    }
    model.stream = Some(launch(ring, mode, order, chunks, n_layers)?);
    Ok(())
}

/// The ring of `slots` buffers of `slot_len` bytes for `reads` from the file at `path`.
fn make_ring(
    path: &std::path::Path,
    reads: Vec<LayerReads>,
    slot_len: usize,
    slots: usize,
) -> Result<Arc<Ring>> {
    Ok(Arc::new(Ring {
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
        file: ring::open_unbuffered(path).map_err(|e| {
            ModelError::Streaming(format!("opening {} to stream: {e}", path.display()))
        })?,
        reads,
        bytes_read: AtomicU64::new(0),
        wait_ns: AtomicU64::new(0),
    }))
}

/// The bytes of the `j`-th unit of the streaming order: its slot, readable in its turn.
fn view(ring: &Arc<Ring>, j: usize) -> Arc<dyn TensorBytes> {
    let r = &ring.reads[j];
    Arc::new(SlotView {
        ring: ring.clone(),
        slot: j % ring.bufs.len(),
        unit: r.unit,
        label: r.label.clone(),
    })
}

/// The stream over `ring`, its IO thread started in overlapped mode.
fn launch(
    ring: Arc<Ring>,
    mode: StreamMode,
    order: Vec<Option<usize>>,
    head: Vec<(usize, Linear)>,
    n_layers: usize,
) -> Result<LayerStream> {
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
    Ok(LayerStream {
        ring,
        mode,
        order,
        head,
        n_layers,
        cursor: Mutex::new(Cursor {
            next: 0,
            held: None,
        }),
        io,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::{Extent, PAGE};

    /// Many passes over a stream of 7 units (of which 5 streamed) whose bytes are each
    /// unit's number, with random units skipped and passes ended early: every turn sees its
    /// own unit's bytes, in both modes.
    #[test]
    fn every_turn_reads_its_own_units_bytes() {
        let n = 7;
        let streamed = [1, 2, 4, 5, 6];
        let path = std::env::temp_dir().join(format!("mica-stream-test-{}", std::process::id()));
        let bytes: Vec<u8> = (0..n).flat_map(|u| vec![u as u8; 3 * PAGE]).collect();
        std::fs::write(&path, &bytes).unwrap();
        for mode in [StreamMode::Overlapped, StreamMode::Sync] {
            let reads = streamed
                .iter()
                .map(|&u| LayerReads {
                    unit: u,
                    label: format!("unit {u}"),
                    extents: vec![Extent {
                        file_off: (u * 3 * PAGE) as u64,
                        len: 3 * PAGE,
                        slot_off: PAGE,
                    }],
                })
                .collect();
            let slots = mode.slots();
            let ring = make_ring(&path, reads, 4 * PAGE, slots).unwrap();
            let views: Vec<_> = (0..streamed.len()).map(|j| view(&ring, j)).collect();
            let mut order = vec![None; n];
            for (j, &u) in streamed.iter().enumerate() {
                order[u] = Some(j);
            }
            let s = launch(ring, mode, order, Vec::new(), n).unwrap();
            let mut seed = 12345u64;
            let mut rand = move || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 33) as usize
            };
            for _ in 0..300 {
                let mut pass = s.begin_pass();
                let stop = rand() % (n + 3);
                for u in 0..n.min(stop) {
                    if rand() % 4 == 0 {
                        continue;
                    }
                    pass.enter(u).unwrap();
                    if let Some(j) = streamed.iter().position(|&x| x == u) {
                        let b = views[j].bytes();
                        assert!(b[PAGE..4 * PAGE].iter().all(|&x| x == u as u8), "unit {u}");
                    }
                }
            }
            let read = s.stats().bytes_read;
            assert!(read > 0 && read.is_multiple_of((3 * PAGE) as u64));
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn stream_mode_parses() {
        assert_eq!("sync".parse(), Ok(StreamMode::Sync));
        assert_eq!("overlapped".parse(), Ok(StreamMode::Overlapped));
        assert!("fast".parse::<StreamMode>().unwrap_err().contains("fast"));
    }
}
