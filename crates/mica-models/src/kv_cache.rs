//! The key/value cache, addressed by sequence (docs/architecture.md, decision 1), stored in pages.
//!
//! Keys and values live in a pool of fixed-size *blocks* of [`BLOCK_SIZE`] positions, one
//! pool per layer: `[n_blocks][BLOCK_SIZE][kv_dim]`, where `kv_dim` is the layer's own
//! key/value width (Gemma 4's layers differ), so one key of one head is a contiguous run of
//! `head_dim` values. Keys and values each have a [`KvType`] ([`ModelConfig::cache_types`]):
//! f16 (llama.cpp's default), f32 (float32 checkpoints), or one of llama.cpp's other cache
//! types (`--cache-type-k/-v`: bf16 and the quantized q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl,
//! stored as their GGUF blocks; a head is then a run of whole blocks). Each sequence has a
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
use mica_kernels::DType;

mod checkpoint;
mod store;

pub(crate) use store::CacheElem;
use store::Store;

/// Identifies a sequence in the cache and in a [`crate::Batch`].
pub type SeqId = usize;

/// Positions per block. 16 as in vLLM: small enough that prefix sharing and the last,
/// partly filled block waste little, large enough that one block of one layer is a few
/// contiguous KiB (16 × kv_dim f16). The tiled attention path reads key tiles of 64
/// positions, i.e. exactly four blocks, so a tile never splits a block.
pub const BLOCK_SIZE: usize = 16;
const BLOCK_SHIFT: u32 = BLOCK_SIZE.trailing_zeros();
const _: () = assert!(BLOCK_SIZE.is_power_of_two());

/// The type keys or values are stored in: llama.cpp's cache types (`-ctk`/`-ctv`), with its
/// names and block formats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum KvType {
    /// llama.cpp's default: half the memory, and llama.cpp's rounding.
    #[default]
    F16,
    /// Full precision, for float32 checkpoints checked against a float32 reference.
    F32,
    BF16,
    /// 8-bit blocks of 32 values with an f16 scale (8.5 bits per value).
    Q8_0,
    /// 4-bit blocks of 32 values with an f16 scale (4.5 bits per value).
    Q4_0,
    /// 4-bit blocks with a scale and a minimum (5 bits per value).
    Q4_1,
    /// 5-bit blocks with a scale (5.5 bits per value).
    Q5_0,
    /// 5-bit blocks with a scale and a minimum (6 bits per value).
    Q5_1,
    /// 4-bit blocks on a non-linear grid (4.5 bits per value).
    IQ4_NL,
}

impl KvType {
    /// Every type, in llama.cpp's order of `--cache-type-k`'s list.
    pub const ALL: [KvType; 9] = [
        KvType::F32,
        KvType::F16,
        KvType::BF16,
        KvType::Q8_0,
        KvType::Q4_0,
        KvType::Q4_1,
        KvType::IQ4_NL,
        KvType::Q5_0,
        KvType::Q5_1,
    ];

    /// The GGUF block format.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::F32 => DType::F32,
            KvType::BF16 => DType::BF16,
            KvType::Q8_0 => DType::Q8_0,
            KvType::Q4_0 => DType::Q4_0,
            KvType::Q4_1 => DType::Q4_1,
            KvType::Q5_0 => DType::Q5_0,
            KvType::Q5_1 => DType::Q5_1,
            KvType::IQ4_NL => DType::IQ4_NL,
        }
    }

    /// The cache type of a block format, if it is one.
    pub fn from_dtype(t: DType) -> Option<KvType> {
        KvType::ALL.into_iter().find(|k| k.dtype() == t)
    }

    /// llama.cpp's name (`f16`, `q8_0`, `iq4_nl`, ...).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::BF16 => "bf16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
            KvType::Q4_1 => "q4_1",
            KvType::Q5_0 => "q5_0",
            KvType::Q5_1 => "q5_1",
            KvType::IQ4_NL => "iq4_nl",
        }
    }

    /// Parses llama.cpp's name, case-insensitively.
    pub fn from_name(name: &str) -> Result<KvType> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
                ModelError::CacheType(format!(
                    "unknown cache type '{name}' (one of: {})",
                    names.join(", ")
                ))
            })
    }

    /// Values per block (1 for the float types).
    pub fn block_size(self) -> usize {
        self.dtype().block_size()
    }

    /// Bytes `n` values take (`n` a multiple of [`KvType::block_size`]).
    pub fn bytes(self, n: usize) -> usize {
        self.dtype()
            .row_bytes(n)
            .unwrap_or_else(|| panic!("{n} values are not whole {} blocks", self.name()))
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The types of the keys and of the values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CacheTypes {
    pub k: KvType,
    pub v: KvType,
}

impl CacheTypes {
    /// Keys and values of one type.
    pub fn both(t: KvType) -> CacheTypes {
        CacheTypes { k: t, v: t }
    }

    /// Checks that `cfg`'s attention layers can store these types: every head size a
    /// multiple of the block size (a head is then a run of whole blocks), as llama.cpp
    /// requires.
    pub fn check(self, cfg: &ModelConfig) -> Result<()> {
        // A latent row is split across the two pools and read back whole as floats.
        let float = |t: KvType| matches!(t, KvType::F16 | KvType::F32);
        if cfg.mla.is_some() && (self.k != self.v || !float(self.k)) {
            return Err(ModelError::CacheType(format!(
                "{self}: a latent-attention (MLA) cache stores one latent row per token in f16 \
                 or f32, the same type for keys and values"
            )));
        }
        for (side, t) in [("keys", self.k), ("values", self.v)] {
            let bs = t.block_size();
            let bad = (0..cfg.n_layer)
                .filter(|&l| !cfg.is_recurrent(l))
                .map(|l| cfg.head_dim_of(l))
                .find(|hd| !hd.is_multiple_of(bs));
            if let Some(hd) = bad {
                return Err(ModelError::CacheType(format!(
                    "{t} stores {side} in blocks of {bs} values, but this model's heads have \
                     {hd} (use a type whose blocks divide the head size, e.g. f16)"
                )));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for CacheTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "k {} / v {}", self.k, self.v)
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

/// The keys and values of one sequence in one layer as raw blocks of their types, read
/// through its block table.
#[derive(Clone, Copy)]
pub(crate) struct BlockKv<'a> {
    keys: &'a [u8],
    values: &'a [u8],
    blocks: &'a [u32],
    /// Bytes of one key row, one value row.
    k_row: usize,
    v_row: usize,
    pub k_type: DType,
    pub v_type: DType,
    /// Walsh–Hadamard chunk of the keys (and so the queries) and of the values, 0 for none
    /// ([`Rotations`]).
    pub rot_k: usize,
    pub rot_v: usize,
}

impl<'a> BlockKv<'a> {
    #[inline(always)]
    fn row(&self, p: usize) -> usize {
        ((self.blocks[p >> BLOCK_SHIFT] as usize) << BLOCK_SHIFT) | (p & (BLOCK_SIZE - 1))
    }

    /// Key row (every head's blocks) of position `p`.
    #[inline(always)]
    pub fn key_row(&self, p: usize) -> &'a [u8] {
        &self.keys[self.row(p) * self.k_row..][..self.k_row]
    }

    /// Value row of position `p`.
    #[inline(always)]
    pub fn value_row(&self, p: usize) -> &'a [u8] {
        &self.values[self.row(p) * self.v_row..][..self.v_row]
    }
}

impl KvCache {
    /// A self-managed cache for up to `n_seq` sequences of up to `n_ctx` positions each,
    /// in the element type of the model's numerics. Storage grows as sequences use it.
    pub fn new(cfg: &ModelConfig, n_ctx: usize, n_seq: usize) -> KvCache {
        Self::new_offloaded(cfg, n_ctx, n_seq, cfg.n_layer)
    }

    /// [`KvCache::new`] holding keys and values for layers `..first` only: the later ones
    /// run offloaded ([`crate::offload`]), which keeps theirs at the rows of these tables.
    pub fn new_offloaded(cfg: &ModelConfig, n_ctx: usize, n_seq: usize, first: usize) -> KvCache {
        let n_seq = n_seq.max(1);
        let n_blocks = n_seq * n_ctx.div_ceil(BLOCK_SIZE);
        let kv_dims = host_kv_dims(cfg, first);
        KvCache {
            store: Store::new(
                cfg.cache_types().k,
                cfg.cache_types().v,
                &kv_dims,
                0,
                Rotations::of(cfg),
            ),
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
        Self::paged_offloaded(cfg, n_blocks, n_seq, n_ctx, cfg.n_layer)
    }

    /// [`KvCache::paged`] holding keys and values for layers `..first` only (see
    /// [`KvCache::new_offloaded`]).
    pub fn paged_offloaded(
        cfg: &ModelConfig,
        n_blocks: usize,
        n_seq: usize,
        n_ctx: usize,
        first: usize,
    ) -> KvCache {
        let kv_dims = host_kv_dims(cfg, first);
        KvCache {
            store: Store::new(
                cfg.cache_types().k,
                cfg.cache_types().v,
                &kv_dims,
                n_blocks * BLOCK_SIZE,
                Rotations::of(cfg),
            ),
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

    /// Bytes one block takes across all layers (keys and values, in the cache types of
    /// [`ModelConfig::cache_types`]).
    pub fn bytes_per_block(cfg: &ModelConfig) -> usize {
        BLOCK_SIZE * row_bytes(&layer_kv_dims(cfg), cfg.cache_types())
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

    /// The type of the keys (see [`KvCache::cache_types`] for both).
    pub fn kv_type(&self) -> KvType {
        self.store.types().0
    }

    /// The types of the keys and of the values.
    pub fn cache_types(&self) -> CacheTypes {
        let (k, v) = self.store.types();
        CacheTypes { k, v }
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
        self.n_ctx * row_bytes(&self.kv_dims, self.cache_types())
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

    /// The block table of `seq`: block `i` holds its positions `i * BLOCK_SIZE..` (empty for
    /// an unknown sequence).
    pub fn block_table(&self, seq: SeqId) -> &[u32] {
        self.seqs.get(seq).map_or(&[], |s| &s.blocks[..])
    }

    /// Whether layer `l` has keys and values here (not a layer sharing another's, a
    /// recurrent one or an offloaded one).
    pub fn holds_layer(&self, l: usize) -> bool {
        self.kv_dims.get(l).is_some_and(|&d| d > 0)
    }

    /// Copies block `src` into block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let (s, d) = (src as usize * BLOCK_SIZE, dst as usize * BLOCK_SIZE);
        self.store.copy(&self.kv_dims, s, d, BLOCK_SIZE);
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
        self.store.grow(&self.kv_dims, rows);
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
        self.store.write(&self.kv_dims, layer, row, k, v);
    }

    /// The keys and values of `seq` in `layer` as raw blocks, when the cache stores blocks
    /// (types other than f16/f16 and f32/f32; `None` otherwise).
    pub(crate) fn block_view(&self, layer: usize, seq: SeqId) -> Option<BlockKv<'_>> {
        let Store::Blocks(b) = &self.store else {
            return None;
        };
        Some(BlockKv {
            keys: &b.k[layer],
            values: &b.v[layer],
            blocks: &self.seqs[seq].blocks,
            k_row: b.k_row[layer],
            v_row: b.v_row[layer],
            k_type: b.k_type,
            v_type: b.v_type,
            rot_k: b.rot.k[layer],
            rot_v: b.rot.v[layer],
        })
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

/// Per layer, the Walsh–Hadamard rotation (chunk size; 0 for none) llama.cpp applies before
/// storing keys and values of a quantized type (`attn_rot_k`/`attn_rot_v` of
/// `llama_kv_cache`), so that a head's outlier channels are spread before rounding. Keys
/// (with the queries) rotate when their type is quantized and every layer of the layer's
/// cache has the same head size, a multiple of 64, in chunks of the largest power of two
/// dividing it; values likewise, in chunks of 64. The attention output is rotated back.
/// llama.cpp keeps sliding-window and global layers in separate caches when a model has
/// both, and decides for each separately; so does this.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rotations {
    pub k: Vec<usize>,
    pub v: Vec<usize>,
}

impl Rotations {
    pub(crate) fn of(cfg: &ModelConfig) -> Rotations {
        let t = cfg.cache_types();
        let kv_dims = layer_kv_dims(cfg);
        let stores = |l: usize| kv_dims[l] > 0;
        let swa = |l: usize| cfg.layer_window[l].is_some();
        let per_layer = |quantized: bool, chunk: fn(usize) -> usize| -> Vec<usize> {
            (0..cfg.n_layer)
                .map(|l| {
                    if !quantized || !stores(l) {
                        return 0;
                    }
                    let mut group = (0..cfg.n_layer).filter(|&j| stores(j) && swa(j) == swa(l));
                    let hd = cfg.head_dim_of(l);
                    let uniform = group.all(|j| cfg.head_dim_of(j) == hd);
                    if uniform && hd.is_multiple_of(64) {
                        chunk(hd)
                    } else {
                        0
                    }
                })
                .collect()
        };
        Rotations {
            k: per_layer(t.k.dtype().is_quantized(), |hd| {
                1 << hd.trailing_zeros().min(usize::BITS - 1)
            }),
            v: per_layer(t.v.dtype().is_quantized(), |_| 64),
        }
    }
}

/// Bytes of one position across the layers of `kv_dims` widths: its key and value rows.
fn row_bytes(kv_dims: &[usize], t: CacheTypes) -> usize {
    kv_dims.iter().map(|&w| t.k.bytes(w) + t.v.bytes(w)).sum()
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

/// [`layer_kv_dims`] with layers `first..` holding nothing.
fn host_kv_dims(cfg: &ModelConfig, first: usize) -> Vec<usize> {
    let mut dims = layer_kv_dims(cfg);
    for d in dims.iter_mut().skip(first) {
        *d = 0;
    }
    dims
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
