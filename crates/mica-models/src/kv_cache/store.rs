//! The storage behind [`super::KvCache`]: one key pool and one value pool per layer, either
//! typed (`f16` or `f32` for both, which the tiled and vector attention paths read as
//! elements) or raw GGUF blocks (any other pair of [`KvType`]s: quantized blocks of 32
//! values, or a float type differing between keys and values), which attention reads
//! through the dot-product kernels of the block format.
//!
//! A row is one position of one layer: `kv_dim` values, i.e. `kv_dim / block` whole blocks
//! for a quantized type. Every head of a row starts on a block boundary (the cache refuses
//! head sizes that are not multiples of the block size), so one head's keys are a
//! contiguous run of whole blocks.

use super::KvType;
use half::f16;
use mica_kernels::DType;
use mica_kernels::attention::KvElem;
use mica_kernels::ops::hadamard;
use mica_kernels::quant;

/// The key and value pools of every layer in one element type:
/// `[n_layer][n_rows * kv_dim of the layer]` each.
pub(crate) struct Pools<T> {
    pub(super) k: Vec<Vec<T>>,
    pub(super) v: Vec<Vec<T>>,
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
            copy_rows(&mut self.k[l], w, s, d, n);
            copy_rows(&mut self.v[l], w, s, d, n);
        }
    }

    fn write(&mut self, layer: usize, row: usize, width: usize, k: &[f32], v: &[f32]) {
        let at = row * width;
        for (dst, src) in self.k[layer][at..at + k.len()].iter_mut().zip(k) {
            *dst = T::from_f32(*src);
        }
        for (dst, src) in self.v[layer][at..at + v.len()].iter_mut().zip(v) {
            *dst = T::from_f32(*src);
        }
    }
}

/// Copies `n` rows of `w` elements from row `s` to row `d`, where the pool holds them.
fn copy_rows<T: Copy>(pool: &mut [T], w: usize, s: usize, d: usize, n: usize) {
    let (s, d, n) = (s * w, d * w, n * w);
    if pool.len() >= s.max(d) + n {
        pool.copy_within(s..s + n, d);
    }
}

/// Keys and values as raw blocks of their [`KvType`]s: `[n_layer][n_rows * row bytes]`.
pub(crate) struct BlockPools {
    pub(super) k_type: DType,
    pub(super) v_type: DType,
    pub(super) k: Vec<Vec<u8>>,
    pub(super) v: Vec<Vec<u8>>,
    /// `[n_layer]` bytes of one key row, one value row.
    pub(super) k_row: Vec<usize>,
    pub(super) v_row: Vec<usize>,
    /// `[n_layer]` the Walsh–Hadamard rotation keys (and queries) and values get before
    /// they are stored: chunk size, 0 for none ([`super::Rotations`]).
    pub(super) rot: super::Rotations,
    /// One rotated row, kept between writes.
    scratch: Vec<f32>,
}

impl BlockPools {
    fn new(
        k_type: DType,
        v_type: DType,
        kv_dims: &[usize],
        rows: usize,
        rot: super::Rotations,
    ) -> Self {
        let bytes = |t: DType| -> Vec<usize> {
            kv_dims
                .iter()
                .map(|&w| t.row_bytes(w).expect("widths checked by KvType::check"))
                .collect()
        };
        let (k_row, v_row) = (bytes(k_type), bytes(v_type));
        BlockPools {
            k_type,
            v_type,
            k: k_row.iter().map(|&b| vec![0u8; rows * b]).collect(),
            v: v_row.iter().map(|&b| vec![0u8; rows * b]).collect(),
            k_row,
            v_row,
            rot,
            scratch: Vec::new(),
        }
    }

    fn grow(&mut self, rows: usize) {
        for l in 0..self.k.len() {
            for (pool, b) in [
                (&mut self.k[l], self.k_row[l]),
                (&mut self.v[l], self.v_row[l]),
            ] {
                if pool.len() < rows * b {
                    pool.resize(rows * b, 0);
                }
            }
        }
    }

    fn copy(&mut self, s: usize, d: usize, n: usize) {
        for l in 0..self.k.len() {
            copy_rows(&mut self.k[l], self.k_row[l], s, d, n);
            copy_rows(&mut self.v[l], self.v_row[l], s, d, n);
        }
    }

    /// Quantizes one position's key and value rows into their blocks (rotated first where
    /// the layer rotates them), with the conversion llama.cpp's CPU backend uses when it
    /// stores a row of that type (`from_float`).
    fn write(&mut self, layer: usize, row: usize, k: &[f32], v: &[f32]) {
        let kern = mica_kernels::simd::kernels();
        let (kb, vb) = (self.k_row[layer], self.v_row[layer]);
        let (rk, rv) = (self.rot.k[layer], self.rot.v[layer]);
        for (src, t, pool, b, r) in [
            (k, self.k_type, &mut self.k[layer], kb, rk),
            (v, self.v_type, &mut self.v[layer], vb, rv),
        ] {
            let dst = &mut pool[row * b..][..b];
            if r == 0 {
                store_row(kern, t, src, dst);
            } else {
                self.scratch.clear();
                self.scratch.extend_from_slice(src);
                hadamard::fwht(&mut self.scratch, r);
                store_row(kern, t, &self.scratch, dst);
            }
        }
    }
}

/// Converts one row to type `t` as llama.cpp's CPU backend does when it stores a row
/// (`from_float` of the type: Q8_0's run-time quantizer, IQ4_NL's reference conversion
/// without a scale search, the reference quantizers of the other formats).
fn store_row(kern: &mica_kernels::simd::Kernels, t: DType, src: &[f32], dst: &mut [u8]) {
    match t {
        DType::IQ4_NL => {
            let blocks = quant::cast_blocks_mut(dst).expect("a row of whole IQ4_NL blocks");
            quant::iquants_quantize::quantize_iq4nl_row(src, blocks)
        }
        _ => kern.quantize_act(t, src, dst),
    }
}

/// The cache's storage.
pub(crate) enum Store {
    F16(Pools<f16>),
    F32(Pools<f32>),
    Blocks(BlockPools),
}

impl Store {
    pub(super) fn new(
        k: KvType,
        v: KvType,
        kv_dims: &[usize],
        rows: usize,
        rot: super::Rotations,
    ) -> Store {
        match (k, v) {
            (KvType::F16, KvType::F16) => Store::F16(Pools::new(kv_dims, rows)),
            (KvType::F32, KvType::F32) => Store::F32(Pools::new(kv_dims, rows)),
            _ => Store::Blocks(BlockPools::new(k.dtype(), v.dtype(), kv_dims, rows, rot)),
        }
    }

    /// The key and value types.
    pub(super) fn types(&self) -> (KvType, KvType) {
        match self {
            Store::F16(_) => (KvType::F16, KvType::F16),
            Store::F32(_) => (KvType::F32, KvType::F32),
            Store::Blocks(b) => (
                KvType::from_dtype(b.k_type).expect("made from a KvType"),
                KvType::from_dtype(b.v_type).expect("made from a KvType"),
            ),
        }
    }

    pub(super) fn grow(&mut self, kv_dims: &[usize], rows: usize) {
        match self {
            Store::F16(p) => p.grow(kv_dims, rows),
            Store::F32(p) => p.grow(kv_dims, rows),
            Store::Blocks(b) => b.grow(rows),
        }
    }

    pub(super) fn copy(&mut self, kv_dims: &[usize], s: usize, d: usize, n: usize) {
        match self {
            Store::F16(p) => p.copy(kv_dims, s, d, n),
            Store::F32(p) => p.copy(kv_dims, s, d, n),
            Store::Blocks(b) => b.copy(s, d, n),
        }
    }

    pub(super) fn write(
        &mut self,
        kv_dims: &[usize],
        layer: usize,
        row: usize,
        k: &[f32],
        v: &[f32],
    ) {
        match self {
            Store::F16(p) => p.write(layer, row, kv_dims[layer], k, v),
            Store::F32(p) => p.write(layer, row, kv_dims[layer], k, v),
            Store::Blocks(b) => b.write(layer, row, k, v),
        }
    }
}

/// Element types a cache can hold, for code generic over them ([`super::KvCache::typed_view`]).
pub(crate) trait CacheElem: KvElem {
    fn pools(store: &Store) -> Option<&Pools<Self>>;
}

impl CacheElem for f16 {
    fn pools(store: &Store) -> Option<&Pools<Self>> {
        match store {
            Store::F16(p) => Some(p),
            _ => None,
        }
    }
}

impl CacheElem for f32 {
    fn pools(store: &Store) -> Option<&Pools<Self>> {
        match store {
            Store::F32(p) => Some(p),
            _ => None,
        }
    }
}
