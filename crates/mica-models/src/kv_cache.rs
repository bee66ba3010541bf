//! The key/value cache, addressed by sequence (docs/architecture.md, decision 1), stored in pages.
//!
//! Keys and values live in a pool of fixed-size *blocks* of [`BLOCK_SIZE`] positions, one
//! pool per layer, as f16 (llama.cpp's default cache type) or f32 ([`KvType`], from the
//! model's [`crate::config::Numerics`]): `[n_blocks][BLOCK_SIZE][kv_dim]`, where `kv_dim` is
//! the layer's own key/value width (Gemma 4's layers differ), so one key of one head is a contiguous run of `head_dim` values. Each sequence has a
//! *block table*: position `p` of the sequence lives in block `table[p / BLOCK_SIZE]`, row
//! `p % BLOCK_SIZE` (vLLM's PagedAttention layout; Kwon et al., 2023).
//!
//! Two ways to own the blocks:
//! - [`KvCache::new`]: the cache hands out blocks itself, in order, as sequences grow (what a
//!   single [`crate::Batch`] user such as a generation session wants; tables are then
//!   contiguous runs and attention reads them with no gathering).
//! - [`KvCache::paged`]: an outside block manager (mica-engine's) decides which blocks a
//!   sequence uses and shares blocks between sequences with a common prefix; it installs a
//!   table with [`KvCache::set_table`] before each forward pass and copies blocks for
//!   copy-on-write with [`KvCache::copy_block`]. The forward pass never allocates then, it
//!   only checks that each table covers the positions the batch writes.
//!
//! The forward pass asks for a sequence's length, writes new rows, and reads old ones through
//! [`SeqKv`], a view that resolves positions through the block table.
//!
//! A hybrid model (Qwen3.5's Gated DeltaNet layers, [`crate::config::DeltaNetConfig`]) also
//! keeps a *recurrent state* per sequence beside the pages: each DeltaNet layer's
//! convolution inputs and state matrices, f32, allocated on the sequence's first use. Its
//! layers store no keys or values (width 0 in the pools). The state summarizes every position
//! so far and cannot be cut back: a sequence may continue only where its state ends, or
//! start again from position 0 (which zeroes it); truncating to a shorter non-zero length
//! makes the next forward pass of that sequence an error. What rewinds it is a *checkpoint*
//! ([`checkpoint`]): a copy of a sequence's whole state at a chosen position, taken during a
//! forward pass and restored into any sequence later (prefix caching for hybrid models).

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use half::f16;
use mica_kernels::attention::KvElem;

mod checkpoint;

/// Identifies a sequence in the cache and in a [`crate::Batch`].
pub type SeqId = usize;

/// Positions per block. 16 as in vLLM: small enough that prefix sharing and the last,
/// partly filled block waste little, large enough that one block of one layer is a few
/// contiguous KiB (16 × kv_dim f16). The tiled attention path reads key tiles of 64
/// positions, i.e. exactly four blocks, so a tile never splits a block.
pub const BLOCK_SIZE: usize = 16;
const BLOCK_SHIFT: u32 = BLOCK_SIZE.trailing_zeros();
const _: () = assert!(BLOCK_SIZE.is_power_of_two());

/// The element type keys and values are stored in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvType {
    /// llama.cpp's default: half the memory, and llama.cpp's rounding.
    #[default]
    F16,
    /// Full precision, for float32 checkpoints checked against a float32 reference.
    F32,
}

impl KvType {
    /// Bytes per stored value.
    pub fn size(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
        }
    }
}

/// The key and value pools of every layer in one element type:
/// `[n_layer][n_rows * kv_dim of the layer]` each.
pub(crate) struct Pools<T> {
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: KvElem> Pools<T> {
    /// Pools of `rows` positions for layers of `kv_dims` widths.
    fn new(kv_dims: &[usize], rows: usize) -> Self {
        Pools {
            k: kv_dims
                .iter()
                .map(|&w| vec![T::default(); rows * w])
                .collect(),
            v: kv_dims
                .iter()
                .map(|&w| vec![T::default(); rows * w])
                .collect(),
        }
    }

    /// Grows every layer's pools to hold `rows` positions.
    fn grow(&mut self, kv_dims: &[usize], rows: usize) {
        for (l, &w) in kv_dims.iter().enumerate() {
            for pool in [&mut self.k[l], &mut self.v[l]] {
                if pool.len() < rows * w {
                    pool.resize(rows * w, T::default());
                }
            }
        }
    }

    /// Copies `n` rows from row `s` to row `d` in every layer.
    fn copy(&mut self, kv_dims: &[usize], s: usize, d: usize, n: usize) {
        for (l, &w) in kv_dims.iter().enumerate() {
            let (s, d, n) = (s * w, d * w, n * w);
            for pool in [&mut self.k[l], &mut self.v[l]] {
                if pool.len() >= s.max(d) + n {
                    pool.copy_within(s..s + n, d);
                }
            }
        }
    }

    fn write(&mut self, layer: usize, at: usize, k: &[f32], v: &[f32]) {
        for (dst, src) in self.k[layer][at..at + k.len()].iter_mut().zip(k) {
            *dst = T::from_f32(*src);
        }
        for (dst, src) in self.v[layer][at..at + v.len()].iter_mut().zip(v) {
            *dst = T::from_f32(*src);
        }
    }
}

/// The cache's storage, in the element type it was made with.
pub(crate) enum Store {
    F16(Pools<f16>),
    F32(Pools<f32>),
}

/// Element types a cache can hold, for code generic over them ([`KvCache::typed_view`]).
pub(crate) trait CacheElem: KvElem {
    fn pools(store: &Store) -> Option<&Pools<Self>>;
}

impl CacheElem for f16 {
    fn pools(store: &Store) -> Option<&Pools<Self>> {
        match store {
            Store::F16(p) => Some(p),
            Store::F32(_) => None,
        }
    }
}

impl CacheElem for f32 {
    fn pools(store: &Store) -> Option<&Pools<Self>> {
        match store {
            Store::F32(p) => Some(p),
            Store::F16(_) => None,
        }
    }
}

#[derive(Default, Clone)]
struct SeqTable {
    /// Positions cached (keys and values written).
    len: usize,
    /// Block ids, one per `BLOCK_SIZE` positions.
    blocks: Vec<u32>,
}

/// The recurrent state of one sequence.
#[derive(Clone, Default)]
struct SeqState {
    /// Positions the state holds (what the sequence must continue from).
    len: usize,
    /// `[n_recurrent_layers][conv_state_len]`; empty until first used.
    conv: Vec<f32>,
    /// `[n_recurrent_layers][ssm_state_len]`
    ssm: Vec<f32>,
}

/// Where each DeltaNet layer's state lives in a [`SeqState`].
struct StateLayout {
    /// `[n_layer]` the layer's slot among the recurrent layers.
    slot: Vec<Option<usize>>,
    n_slots: usize,
    conv_len: usize,
    ssm_len: usize,
}

/// Paged f16 or f32 key/value storage for every layer.
pub struct KvCache {
    /// `[n_layer]` each layer's key/value width.
    kv_dims: Vec<usize>,
    n_ctx: usize,
    /// Keys and values (grown on demand when self-managed).
    store: Store,
    n_blocks: usize,
    seqs: Vec<SeqTable>,
    /// Blocks not yet handed out, when the cache manages its blocks itself (`None` when an
    /// outside manager installs the tables).
    free: Option<Vec<u32>>,
    /// The recurrent state layout (hybrid models only).
    state_layout: Option<StateLayout>,
    /// `[n_seq]` each sequence's recurrent state (hybrid models only).
    states: Vec<SeqState>,
    /// Saved recurrent states ([`KvCache::set_checkpoints`]); each allocated when first
    /// written, `len` 0 while empty.
    checkpoints: Vec<SeqState>,
    /// `[n_seq]` the captures asked of the next forward pass: `(position, checkpoint)`.
    captures: Vec<Vec<(usize, usize)>>,
}

/// The keys and values of one sequence in one layer, read through its block table.
#[derive(Clone, Copy)]
pub struct SeqKv<'a, T = f16> {
    /// `[n_blocks * BLOCK_SIZE][kv_dim]` the layer's key pool
    pub keys: &'a [T],
    /// `[n_blocks * BLOCK_SIZE][kv_dim]` the layer's value pool
    pub values: &'a [T],
    /// Block id of each `BLOCK_SIZE` positions of the sequence.
    pub blocks: &'a [u32],
    pub kv_dim: usize,
}

impl<'a, T: Copy> SeqKv<'a, T> {
    /// Row index in the pool of position `p`.
    #[inline(always)]
    pub fn row(&self, p: usize) -> usize {
        ((self.blocks[p >> BLOCK_SHIFT] as usize) << BLOCK_SHIFT) | (p & (BLOCK_SIZE - 1))
    }

    /// Key row (`kv_dim` values, every head) of position `p`.
    #[inline(always)]
    pub fn key_row(&self, p: usize) -> &'a [T] {
        &self.keys[self.row(p) * self.kv_dim..][..self.kv_dim]
    }

    /// Value row (`kv_dim` values) of position `p`.
    #[inline(always)]
    pub fn value_row(&self, p: usize) -> &'a [T] {
        &self.values[self.row(p) * self.kv_dim..][..self.kv_dim]
    }

    /// Keys and values of positions `0..n` as contiguous `[n][kv_dim]` slices, when the
    /// blocks holding them are consecutive in the pool (no copy needed).
    pub fn contiguous(&self, n: usize) -> Option<(&'a [T], &'a [T])> {
        let nb = n.div_ceil(BLOCK_SIZE);
        let first = *self.blocks.first()? as usize;
        let consecutive = self.blocks[..nb]
            .iter()
            .enumerate()
            .all(|(i, &b)| b as usize == first + i);
        consecutive.then(|| {
            let start = first * BLOCK_SIZE * self.kv_dim;
            let len = n * self.kv_dim;
            (
                &self.keys[start..start + len],
                &self.values[start..start + len],
            )
        })
    }

    /// Copies keys and values of positions `0..n` into `k` and `v` (`[n][kv_dim]` each).
    pub fn gather(&self, n: usize, k: &mut Vec<T>, v: &mut Vec<T>) {
        k.clear();
        v.clear();
        let mut p = 0;
        while p < n {
            let run = BLOCK_SIZE.min(n - p);
            let start = self.row(p) * self.kv_dim;
            k.extend_from_slice(&self.keys[start..start + run * self.kv_dim]);
            v.extend_from_slice(&self.values[start..start + run * self.kv_dim]);
            p += run;
        }
    }
}

impl KvCache {
    /// A self-managed cache for up to `n_seq` sequences of up to `n_ctx` positions each,
    /// in the element type of the model's numerics. Storage grows as sequences use it.
    pub fn new(cfg: &ModelConfig, n_ctx: usize, n_seq: usize) -> KvCache {
        let n_seq = n_seq.max(1);
        let n_blocks = n_seq * n_ctx.div_ceil(BLOCK_SIZE);
        let kv_dims = layer_kv_dims(cfg);
        KvCache {
            store: Store::new(cfg.numerics.kv_type(), &kv_dims, 0),
            kv_dims,
            n_ctx,
            n_blocks,
            seqs: vec![SeqTable::default(); n_seq],
            // Handed out lowest id first.
            free: Some((0..n_blocks as u32).rev().collect()),
            state_layout: state_layout(cfg),
            states: vec![SeqState::default(); n_seq],
            checkpoints: Vec::new(),
            captures: vec![Vec::new(); n_seq],
        }
    }

    /// A cache of `n_blocks` blocks whose tables an outside block manager installs, for up
    /// to `n_seq` sequences of up to `n_ctx` positions. The storage is allocated now.
    pub fn paged(cfg: &ModelConfig, n_blocks: usize, n_seq: usize, n_ctx: usize) -> KvCache {
        let kv_dims = layer_kv_dims(cfg);
        KvCache {
            store: Store::new(cfg.numerics.kv_type(), &kv_dims, n_blocks * BLOCK_SIZE),
            kv_dims,
            n_ctx,
            n_blocks,
            seqs: vec![SeqTable::default(); n_seq.max(1)],
            free: None,
            state_layout: state_layout(cfg),
            states: vec![SeqState::default(); n_seq.max(1)],
            checkpoints: Vec::new(),
            captures: vec![Vec::new(); n_seq.max(1)],
        }
    }

    /// Bytes one block takes across all layers (keys and values).
    pub fn bytes_per_block(cfg: &ModelConfig) -> usize {
        let width: usize = layer_kv_dims(cfg).iter().sum();
        2 * BLOCK_SIZE * width * cfg.numerics.kv_type().size()
    }

    /// Bytes of recurrent state one sequence takes (0 for an attention-only model).
    pub fn state_bytes_per_seq(cfg: &ModelConfig) -> usize {
        state_layout(cfg).map_or(0, |l| 4 * l.n_slots * (l.conv_len + l.ssm_len))
    }

    /// Whether the cache keeps a recurrent state per sequence (a hybrid model).
    pub fn has_state(&self) -> bool {
        self.state_layout.is_some()
    }

    /// Checks that `seq`'s recurrent state ends at `start`, where its next tokens begin; at
    /// position 0 the state is (allocated and) zeroed. Nothing to do without a state.
    pub(crate) fn begin_state(&mut self, seq: SeqId, start: usize) -> Result<()> {
        if self.state_layout.is_none() {
            return Ok(());
        }
        self.begin_captures(seq, start);
        let Some(l) = &self.state_layout else {
            return Ok(());
        };
        let st = &mut self.states[seq];
        if start == 0 {
            st.conv.clear();
            st.conv.resize(l.n_slots * l.conv_len, 0.0);
            st.ssm.clear();
            st.ssm.resize(l.n_slots * l.ssm_len, 0.0);
            st.len = 0;
            return Ok(());
        }
        if st.len != start || st.ssm.is_empty() {
            return Err(ModelError::Batch(format!(
                "sequence {seq} continues at position {start} but its recurrent state holds {} \
                 positions: the state of a hybrid model cannot be rewound (start again from 0)",
                st.len
            )));
        }
        Ok(())
    }

    /// Copies `src`'s recurrent state into `dst` (several completions forked from one
    /// prompt: the fork shares the prompt's blocks and needs the state they led to).
    pub fn copy_state(&mut self, src: SeqId, dst: SeqId) {
        if self.state_layout.is_some() && src != dst && src < self.states.len() {
            let st = self.states[src].clone();
            if let Some(d) = self.states.get_mut(dst) {
                *d = st;
            }
        }
    }

    /// Records that `seq`'s recurrent state now holds `len` positions (`usize::MAX`: the
    /// state is unusable until the sequence starts again from 0).
    pub(crate) fn end_state(&mut self, seq: SeqId, len: usize) {
        if self.state_layout.is_some() {
            self.states[seq].len = len;
            self.end_captures(seq, len);
        }
    }

    /// The convolution state (`[conv_kernel - 1][conv_dim]`) and the state matrices
    /// (`[n_v_heads][head_v_dim][head_k_dim]`, each transposed) of DeltaNet layer `layer` for `seq`.
    pub(crate) fn state_mut(&mut self, layer: usize, seq: SeqId) -> (&mut [f32], &mut [f32]) {
        let l = self
            .state_layout
            .as_ref()
            .expect("a DeltaNet layer runs only with a hybrid model's cache");
        let slot = l.slot[layer].expect("a DeltaNet layer has a state slot");
        let st = &mut self.states[seq];
        (
            &mut st.conv[slot * l.conv_len..(slot + 1) * l.conv_len],
            &mut st.ssm[slot * l.ssm_len..(slot + 1) * l.ssm_len],
        )
    }

    /// The element type of the keys and values.
    pub fn kv_type(&self) -> KvType {
        match self.store {
            Store::F16(_) => KvType::F16,
            Store::F32(_) => KvType::F32,
        }
    }

    /// Positions each sequence can hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    /// Blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Bytes of storage one full-length sequence takes.
    pub fn bytes_per_seq(&self) -> usize {
        let width: usize = self.kv_dims.iter().sum();
        2 * self.n_ctx * width * self.kv_type().size()
    }

    /// Positions cached for `seq` (0 for an unknown or unused sequence).
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.seqs.get(seq).map_or(0, |s| s.len)
    }

    /// Forgets positions `len..` of `seq` (keeps the prefix, e.g. a chat history that did
    /// not change). Blocks are kept for reuse.
    pub fn truncate(&mut self, seq: SeqId, len: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.len = s.len.min(len);
        }
    }

    /// Forgets everything cached for `seq`.
    pub fn clear(&mut self, seq: SeqId) {
        self.truncate(seq, 0);
    }

    /// Installs the block table of `seq` (outside manager): `blocks` hold positions
    /// `0..len` already, and room for what the next batch writes.
    pub fn set_table(&mut self, seq: SeqId, blocks: &[u32], len: usize) -> Result<()> {
        if let Some(&bad) = blocks.iter().find(|&&b| b as usize >= self.n_blocks) {
            return Err(ModelError::Batch(format!(
                "block {bad} is outside the pool of {} blocks",
                self.n_blocks
            )));
        }
        if len > blocks.len() * BLOCK_SIZE {
            return Err(ModelError::Batch(format!(
                "{len} cached positions need more than the {} blocks given",
                blocks.len()
            )));
        }
        let n_seq = self.seqs.len();
        let s = self.seqs.get_mut(seq).ok_or_else(|| {
            ModelError::Batch(format!(
                "sequence id {seq} is out of range (the cache holds {n_seq} sequences)"
            ))
        })?;
        s.blocks.clear();
        s.blocks.extend_from_slice(blocks);
        s.len = len;
        Ok(())
    }

    /// Copies block `src` into block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let (s, d) = (src as usize * BLOCK_SIZE, dst as usize * BLOCK_SIZE);
        match &mut self.store {
            Store::F16(p) => p.copy(&self.kv_dims, s, d, BLOCK_SIZE),
            Store::F32(p) => p.copy(&self.kv_dims, s, d, BLOCK_SIZE),
        }
    }

    /// Makes room for `seq` to grow to `new_len` positions.
    pub(crate) fn reserve(&mut self, seq: SeqId, new_len: usize) -> Result<()> {
        if seq >= self.seqs.len() {
            return Err(ModelError::Batch(format!(
                "sequence id {seq} is out of range (the cache holds {} sequences)",
                self.seqs.len()
            )));
        }
        if new_len > self.n_ctx {
            return Err(ModelError::ContextOverflow {
                seq,
                needed: new_len,
                n_ctx: self.n_ctx,
            });
        }
        let need = new_len.div_ceil(BLOCK_SIZE);
        let have = self.seqs[seq].blocks.len();
        if have >= need {
            return Ok(());
        }
        let Some(free) = self.free.as_mut() else {
            return Err(ModelError::Batch(format!(
                "sequence {seq} has blocks for {} positions but the batch needs {new_len}",
                have * BLOCK_SIZE
            )));
        };
        if free.len() < need - have {
            return Err(ModelError::Batch(format!(
                "the KV cache is out of blocks ({} free, {} needed)",
                free.len(),
                need - have
            )));
        }
        let mut top = 0;
        for _ in have..need {
            let b = free.pop().expect("counted above");
            top = top.max(b as usize + 1);
            self.seqs[seq].blocks.push(b);
        }
        let rows = top * BLOCK_SIZE;
        match &mut self.store {
            Store::F16(p) => p.grow(&self.kv_dims, rows),
            Store::F32(p) => p.grow(&self.kv_dims, rows),
        }
        Ok(())
    }

    /// Sets the length of `seq` after a forward pass wrote its new positions.
    pub(crate) fn set_len(&mut self, seq: SeqId, len: usize) {
        if let Some(s) = self.seqs.get_mut(seq) {
            s.len = len;
        }
    }

    /// Writes the key and value rows (the layer's `kv_dim` floats each) of one position, rounding to
    /// the cache's element type.
    pub(crate) fn write(&mut self, layer: usize, seq: SeqId, pos: usize, k: &[f32], v: &[f32]) {
        let blocks = &self.seqs[seq].blocks;
        let row = ((blocks[pos >> BLOCK_SHIFT] as usize) << BLOCK_SHIFT) | (pos & (BLOCK_SIZE - 1));
        let at = row * self.kv_dims[layer];
        match &mut self.store {
            Store::F16(p) => p.write(layer, at, k, v),
            Store::F32(p) => p.write(layer, at, k, v),
        }
    }

    /// The keys and values of `seq` in `layer`, when the cache holds `T` (`None` otherwise).
    pub(crate) fn typed_view<T: CacheElem>(
        &self,
        layer: usize,
        seq: SeqId,
    ) -> Option<SeqKv<'_, T>> {
        let p = T::pools(&self.store)?;
        Some(SeqKv {
            keys: &p.k[layer],
            values: &p.v[layer],
            blocks: &self.seqs[seq].blocks,
            kv_dim: self.kv_dims[layer],
        })
    }
}

impl Store {
    fn new(t: KvType, kv_dims: &[usize], rows: usize) -> Store {
        match t {
            KvType::F16 => Store::F16(Pools::new(kv_dims, rows)),
            KvType::F32 => Store::F32(Pools::new(kv_dims, rows)),
        }
    }
}

/// `[n_layer]` the key/value width of each layer (0 for a layer that reuses an earlier
/// layer's keys and values, or a DeltaNet layer: it stores none).
fn layer_kv_dims(cfg: &ModelConfig) -> Vec<usize> {
    (0..cfg.n_layer)
        .map(|l| match cfg.layer_kv_from[l] {
            _ if cfg.is_recurrent(l) => 0,
            Some(_) => 0,
            None => cfg.kv_dim_of(l),
        })
        .collect()
}

/// The slots of a hybrid model's recurrent layers; `None` without any.
fn state_layout(cfg: &ModelConfig) -> Option<StateLayout> {
    let d = cfg
        .delta_net
        .as_ref()
        .filter(|_| cfg.has_recurrent_state())?;
    let mut n_slots = 0;
    let slot = (0..cfg.n_layer)
        .map(|l| {
            cfg.is_recurrent(l).then(|| {
                n_slots += 1;
                n_slots - 1
            })
        })
        .collect();
    Some(StateLayout {
        slot,
        n_slots,
        conv_len: d.conv_state_len(),
        ssm_len: d.ssm_state_len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_resolve_through_the_table_and_gather_matches() {
        let keys: Vec<f16> = (0..4 * BLOCK_SIZE * 2)
            .map(|i| f16::from_f32(i as f32))
            .collect();
        let values = keys.clone();
        let blocks = [2u32, 0, 3];
        let kv = SeqKv {
            keys: &keys,
            values: &values,
            blocks: &blocks,
            kv_dim: 2,
        };
        assert_eq!(kv.row(0), 2 * BLOCK_SIZE);
        assert_eq!(kv.row(BLOCK_SIZE + 1), 1);
        assert_eq!(kv.row(2 * BLOCK_SIZE + 5), 3 * BLOCK_SIZE + 5);
        assert!(kv.contiguous(40).is_none());
        let (mut k, mut v) = (Vec::new(), Vec::new());
        kv.gather(40, &mut k, &mut v);
        assert_eq!(k.len(), 80);
        for p in 0..40 {
            assert_eq!(&k[p * 2..p * 2 + 2], kv.key_row(p));
        }
        let run = [1u32, 2];
        let kv = SeqKv { blocks: &run, ..kv };
        let (ck, _) = kv.contiguous(20).unwrap();
        assert_eq!(ck[0], f16::from_f32((BLOCK_SIZE * 2) as f32));
        assert_eq!(ck.len(), 40);
    }
}
