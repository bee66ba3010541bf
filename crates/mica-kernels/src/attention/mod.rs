//! Tiled causal attention for long batches (prompt processing), with the arithmetic of
//! llama.cpp's CPU `ggml_compute_forward_flash_attn_ext_tiled` (used there for batches of 64
//! or more query rows), so that mica's prefill matches llama.cpp's bit for bit.
//!
//! One call handles a *query tile*: up to [`Q_TILE`] query rows of one head that attend to
//! the same key/value head of one sequence. Keys and values are walked in tiles of
//! [`KV_TILE`] cached positions; each key tile is converted to f32 once and reused by every
//! query row, which is what makes the prefill compute-bound. Per query row and key tile:
//!
//! ```text
//! s[j]   = fma-chain over d of k[j][d]·q[d]  (from 0, d ascending), then s[j] *= scale
//!          (positions after the row's own are masked to -inf)
//! M'     = max(M, max_j s[j]);  if M' > M: acc *= e^(M - M'), S *= e^(M - M')
//! p[j]   = expf16(s[j] - M')   (ggml's vectorized expf, 16 lanes)
//! S      = f32(f64(S) + Σ_16-lane-groups f64(reduce_add16(p)))
//! acc[d] = fma-chain over j of v[j][d]·p[j]   (j ascending)
//! ```
//! and at the end `out = acc · (1/S)`. Rows whose whole key tile is masked skip it.
//!
//! The cache may hold f16 (llama.cpp's default, converted per tile) or f32 elements
//! ([`KvElem`]); the arithmetic after the conversion is the same.

use crate::ops::silu::expf_lane;
use half::f16;
use std::sync::OnceLock;

/// Query rows per tile (llama.cpp's `GGML_FA_TILE_Q`).
pub const Q_TILE: usize = 64;
/// Cached positions per key/value tile (llama.cpp's `GGML_FA_TILE_KV`).
pub const KV_TILE: usize = 64;

/// An element type a KV cache stores: f16 (llama.cpp's default) or f32 (for float32
/// checkpoints, where f16 rounding would be the largest error against the reference).
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// `dst[i] = src[i].to_f32()`, vectorized where the CPU can.
    fn slice_to_f32(src: &[Self], dst: &mut [f32]);
    /// The tile kernel for this element type, picked once for this CPU.
    fn tile_fn() -> TileFn<Self>;
}

impl KvElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline]
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst)
    }
    fn tile_fn() -> TileFn<Self> {
        static F: OnceLock<TileFn<f16>> = OnceLock::new();
        *F.get_or_init(pick_tile_fn::<f16>)
    }
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn slice_to_f32(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn tile_fn() -> TileFn<Self> {
        static F: OnceLock<TileFn<f32>> = OnceLock::new();
        *F.get_or_init(pick_tile_fn::<f32>)
    }
}

/// The keys and values of one KV head of one sequence, as the cache stores them: rows of
/// `stride` values, the head's `head_dim` values starting at `offset`.
#[derive(Clone, Copy)]
pub struct KvHead<'a, T = f16> {
    pub keys: &'a [T],
    pub values: &'a [T],
    pub stride: usize,
    pub offset: usize,
    pub head_dim: usize,
}

impl<T> KvHead<'_, T> {
    fn key(&self, j: usize) -> &[T] {
        &self.keys[j * self.stride + self.offset..][..self.head_dim]
    }
    fn value(&self, j: usize) -> &[T] {
        &self.values[j * self.stride + self.offset..][..self.head_dim]
    }
}

/// How raw scores `q·k` become softmax inputs, and which cached positions a query sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreMod {
    /// Multiplies `q·k` (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Attention logit soft-capping: `s = cap · tanh(s / cap)` (Gemma 2; optional in
    /// Gemma 3). ggml folds `1/cap` into the scale, then applies `cap · tanhf(s)`.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position `p` sees positions `j` with `p - j < window`
    /// (llama.cpp's `LLAMA_SWA_TYPE_STANDARD`, transformers' sliding-window mask).
    pub window: Option<usize>,
}

impl ScoreMod {
    /// Plain causal attention with this scale.
    pub fn scaled(scale: f32) -> ScoreMod {
        ScoreMod {
            scale,
            softcap: None,
            window: None,
        }
    }

    /// The first cached position a query at `pos` sees.
    #[inline]
    pub fn first_visible(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// The softmax input of a raw dot product `qk`.
    #[inline]
    pub fn apply(&self, qk: f32) -> f32 {
        match self.softcap {
            None => qk * self.scale,
            Some(cap) => cap * (qk * (self.scale / cap)).tanh(),
        }
    }
}

/// Reusable buffers of [`attend_tile`] (one per thread).
#[derive(Default)]
// The register-blocked kernel's buffers (`krow`, `pk`, `pv`) serve only the x86 tiers.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct TileScratch {
    /// `[head_dim][KV_TILE]` the key tile, transposed, in f32
    kt: Vec<f32>,
    /// `[KV_TILE][head_dim]` the value tile in f32
    vt: Vec<f32>,
    /// `[head_dim]` one key row in f32
    krow: Vec<f32>,
    /// Which keys and values `pk`/`pv` hold (addresses, offset, stride, head size), and how
    /// many of their rows are converted: the register-blocked kernel converts each row once
    /// per [`TileScratch::begin_batch`] and reuses it for every query tile and every query
    /// head of the group.
    prep: Option<(usize, usize, usize, usize, usize)>,
    prep_rows: usize,
    /// `[tiles][head_dim][KV_TILE]` the keys in f32, transposed tile by tile
    pk: Vec<f32>,
    /// `[tiles · KV_TILE][head_dim]` the values in f32
    pv: Vec<f32>,
    /// `[rows][head_dim]` accumulators
    acc: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

impl TileScratch {
    /// Row `r`'s running maximum raised to include `tile_max`, its accumulator and sum
    /// rescaled by `e^(M - M')` when it grows; returns the new maximum.
    #[inline(always)]
    fn raise_max(&mut self, r: usize, hd: usize, tile_max: f32) -> f32 {
        let m_old = self.m[r];
        let m_new = m_old.max(tile_max);
        if m_new > m_old {
            let ms = (m_old - m_new).exp();
            for a in self.acc[r * hd..(r + 1) * hd].iter_mut() {
                *a *= ms;
            }
            self.sum[r] *= ms;
        }
        self.m[r] = m_new;
        m_new
    }

    /// Empty accumulators, running maxima and sums for `rows` rows of `hd`.
    fn start_rows(&mut self, rows: usize, hd: usize) {
        self.acc.clear();
        self.acc.resize(rows * hd, 0.0);
        self.m.clear();
        self.m.resize(rows, f32::NEG_INFINITY);
        self.sum.clear();
        self.sum.resize(rows, 0.0);
    }

    /// `out[r] = acc[r] / sum[r]` for every row (0 for a row that saw nothing).
    fn finish_rows(&self, hd: usize, out: &mut [f32]) {
        for (r, &sum) in self.sum.iter().enumerate() {
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, &a) in out[r * hd..(r + 1) * hd]
                .iter_mut()
                .zip(&self.acc[r * hd..(r + 1) * hd])
            {
                *o = a * inv;
            }
        }
    }

    /// Forgets the prepared (converted) keys and values: call whenever the cache's contents
    /// may have changed since the last [`attend_tile_batch`] with this scratch.
    pub fn begin_batch(&mut self) {
        self.prep = None;
        self.prep_rows = 0;
    }

    /// Makes sure rows `0..n_kv` of `kv` are converted into `pk`/`pv`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn prepare<T: KvElem>(&mut self, kv: &KvHead<T>, n_kv: usize) {
        let hd = kv.head_dim;
        let id = (
            kv.keys.as_ptr() as usize,
            kv.values.as_ptr() as usize,
            kv.offset,
            kv.stride,
            hd,
        );
        if self.prep != Some(id) {
            self.prep = Some(id);
            self.prep_rows = 0;
        }
        let tiles = n_kv.div_ceil(KV_TILE);
        if self.pk.len() < tiles * KV_TILE * hd {
            self.pk.resize(tiles * KV_TILE * hd, 0.0);
            self.pv.resize(tiles * KV_TILE * hd, 0.0);
        }
        self.krow.resize(hd, 0.0);
        for j in self.prep_rows..n_kv {
            let (t0, tk) = (j / KV_TILE * KV_TILE * hd, j % KV_TILE);
            T::slice_to_f32(kv.key(j), &mut self.krow[..hd]);
            for (d, &k) in self.krow[..hd].iter().enumerate() {
                self.pk[t0 + d * KV_TILE + tk] = k;
            }
            T::slice_to_f32(kv.value(j), &mut self.pv[j * hd..(j + 1) * hd]);
        }
        self.prep_rows = self.prep_rows.max(n_kv);
    }
}

mod blocked;
#[cfg(any(target_arch = "x86_64", test))]
use blocked::tile_fast;

/// A tile kernel over a cache of element type `T`.
pub type TileFn<T> = fn(&KvHead<T>, &[f32], &[usize], &ScoreMod, &mut TileScratch, &mut [f32]);

fn pick_tile_fn<T: KvElem>() -> TileFn<T> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return |kv, q, pos, scale, s, out| unsafe { tile_avx512(kv, q, pos, scale, s, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return |kv, q, pos, scale, s, out| unsafe { tile_avx2(kv, q, pos, scale, s, out) };
    }
    tile_generic::<T>
}

/// Attention of `pos.len()` query rows (`q` is `[rows][head_dim]`, row `r` at cache position
/// `pos[r]`, which must be `< kv` rows available) of one head into `out` (`[rows][head_dim]`).
pub fn attend_tile(
    kv: &KvHead,
    q: &[f32],
    pos: &[usize],
    scale: f32,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    attend_tile_mod(kv, q, pos, &ScoreMod::scaled(scale), scratch, out)
}

/// [`attend_tile`] with soft-capping and a sliding window ([`ScoreMod`]).
pub fn attend_tile_mod<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    scratch.begin_batch();
    attend_tile_batch(kv, q, pos, sm, scratch, out)
}

/// [`attend_tile_mod`] reusing the keys and values `scratch` converted since its last
/// [`TileScratch::begin_batch`]: the caller promises the cache rows it passes have not
/// changed since then (one call of a layer's prompt attention), and calls `begin_batch`
/// before the next such call.
pub fn attend_tile_batch<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    debug_assert!(pos.len() <= Q_TILE);
    debug_assert_eq!(q.len(), pos.len() * kv.head_dim);
    debug_assert_eq!(out.len(), q.len());
    T::tile_fn()(kv, q, pos, sm, scratch, out)
}

/// The same computation without dispatch (the reference the SIMD build is tested against).
pub fn attend_tile_ref(
    kv: &KvHead,
    q: &[f32],
    pos: &[usize],
    scale: f32,
    scratch: &mut TileScratch,
    out: &mut [f32],
) {
    tile_generic::<f16>(kv, q, pos, &ScoreMod::scaled(scale), scratch, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    s: &mut TileScratch,
    out: &mut [f32],
) {
    tile_fast::<T, false>(kv, q, pos, sm, s, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn tile_avx512<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    s: &mut TileScratch,
    out: &mut [f32],
) {
    tile_fast::<T, true>(kv, q, pos, sm, s, out)
}

fn tile_generic<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    s: &mut TileScratch,
    out: &mut [f32],
) {
    tile_body(kv, q, pos, sm, s, out)
}

/// `_mm512_reduce_add_ps`'s order: halves added lane-wise, 16 → 8 → 4 → 2 → 1.
#[inline(always)]
fn reduce16(v: &[f32]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| v[l] + v[l + 8]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[l] + t8[l + 4]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// Written as plain loops over fixed-width lanes; compiled with FMA enabled the inner loops
/// vectorize, and `mul_add` is a single fused operation either way (as in ggml).
#[inline(always)]
fn tile_body<T: KvElem>(
    kv: &KvHead<T>,
    q: &[f32],
    pos: &[usize],
    sm: &ScoreMod,
    s: &mut TileScratch,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let rows = pos.len();
    let n_kv = pos.iter().copied().max().map_or(0, |p| p + 1);
    s.kt.resize(hd * KV_TILE, 0.0);
    s.vt.resize(KV_TILE * hd, 0.0);
    s.start_rows(rows, hd);

    let mut ic = 0;
    while ic < n_kv {
        let tile = KV_TILE.min(n_kv - ic);
        // Convert the key tile (transposed) and the value tile to f32 once for all rows.
        for tk in 0..tile {
            let k = kv.key(ic + tk);
            for d in 0..hd {
                s.kt[d * KV_TILE + tk] = k[d].to_f32();
            }
            let v = kv.value(ic + tk);
            for d in 0..hd {
                s.vt[tk * hd + d] = v[d].to_f32();
            }
        }
        for r in 0..rows {
            // Cached positions this row may see in the tile: `lo..visible` (tile-relative).
            let visible = (pos[r] + 1).saturating_sub(ic).min(tile);
            let lo = sm.first_visible(pos[r]).saturating_sub(ic).min(tile);
            if visible <= lo {
                continue;
            }
            let qr = &q[r * hd..(r + 1) * hd];
            let mut sc = [0f32; KV_TILE];
            for (d, &qd) in qr.iter().enumerate() {
                let kd = &s.kt[d * KV_TILE..(d + 1) * KV_TILE];
                for (a, &k) in sc.iter_mut().zip(kd) {
                    *a = k.mul_add(qd, *a);
                }
            }
            softmax_step(s, sm, r, hd, &mut sc, lo..visible);
            let acc = &mut s.acc[r * hd..(r + 1) * hd];
            // Masked and padded positions have weight exactly 0 and leave `acc` unchanged.
            for tk in lo..visible {
                let p = sc[tk];
                let v = &s.vt[tk * hd..(tk + 1) * hd];
                for (a, &vv) in acc.iter_mut().zip(v) {
                    *a = vv.mul_add(p, *a);
                }
            }
        }
        ic += tile;
    }
    s.finish_rows(hd, out);
}

/// One row's step of the online softmax for a key tile (its raw scores `sc`, visible
/// positions `vis`): the scaling, masking, running max and sum, leaving `sc`
/// the weights of the values (accumulated by the caller).
#[inline(always)]
fn softmax_step(
    s: &mut TileScratch,
    sm: &ScoreMod,
    r: usize,
    hd: usize,
    sc: &mut [f32; KV_TILE],
    vis: std::ops::Range<usize>,
) {
    if sm.softcap.is_none() {
        for a in sc.iter_mut() {
            *a *= sm.scale;
        }
    } else {
        for a in sc.iter_mut() {
            *a = sm.apply(*a);
        }
    }
    for a in &mut sc[vis.end..] {
        *a = f32::NEG_INFINITY;
    }
    for a in &mut sc[..vis.start] {
        *a = f32::NEG_INFINITY;
    }
    let tile_max = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m_new = s.raise_max(r, hd, tile_max);
    let mut total = 0f64;
    for group in sc.chunks_exact_mut(16) {
        for a in group.iter_mut() {
            *a = expf_lane(*a - m_new);
        }
        total += reduce16(group) as f64;
    }
    s.sum[r] = (s.sum[r] as f64 + total) as f32;
}

/// [`softmax_step`] in zmm registers, for scores without soft-capping: the same operations
/// on every element (the scaling, masking, `expf_lane` as `ops::silu`'s `expf16`, each
/// group's `reduce16` in its own order, the f64 sum), bit for bit. The tile's maximum is taken
/// by a `vmaxps` tree where no score is NaN (the maximum of non-NaN values is exact whatever
/// the order; a zero's sign does not change what follows) and by `softmax_step`'s fold
/// otherwise.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn softmax_step_avx512(
    s: &mut TileScratch,
    scale: f32,
    r: usize,
    hd: usize,
    sc: &mut [f32; KV_TILE],
    vis: std::ops::Range<usize>,
) {
    use crate::ops::silu::x86::expf16;
    use std::arch::x86_64::*;
    const G: usize = KV_TILE / 16;
    // Lanes `vis` of the tile: bit `l` of group `g` is position 16g + l.
    let visible = |g: usize| -> u16 {
        let (lo, hi) = (
            vis.start.clamp(16 * g, 16 * g + 16),
            vis.end.clamp(16 * g, 16 * g + 16),
        );
        let bits = |k: usize| if k >= 16 { u32::MAX } else { (1u32 << k) - 1 };
        (bits(hi - 16 * g) & !bits(lo - 16 * g)) as u16
    };
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let v: [__m512; G] = std::array::from_fn(|g| {
        // SAFETY: 16 floats at 16·g of a KV_TILE array.
        let x = unsafe { _mm512_loadu_ps(sc.as_ptr().add(16 * g)) };
        _mm512_mask_blend_ps(visible(g), ninf, _mm512_mul_ps(x, _mm512_set1_ps(scale)))
    });
    let nan = v
        .iter()
        .any(|&x| _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0);
    let tile_max = if nan {
        let mut lanes = [0f32; KV_TILE];
        for (g, &x) in v.iter().enumerate() {
            // SAFETY: 16 floats at 16·g.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * g), x) };
        }
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    } else {
        let m = _mm512_max_ps(_mm512_max_ps(v[0], v[1]), _mm512_max_ps(v[2], v[3]));
        _mm512_reduce_max_ps(m)
    };
    let m_new = s.raise_max(r, hd, tile_max);
    let mut total = 0f64;
    let mn = _mm512_set1_ps(m_new);
    for (g, &x) in v.iter().enumerate() {
        let p = expf16(_mm512_sub_ps(x, mn));
        // SAFETY: 16 floats at 16·g of a KV_TILE array.
        unsafe { _mm512_storeu_ps(sc.as_mut_ptr().add(16 * g), p) };
        // `reduce16`: halves lane-wise, 16 -> 8 -> 4, then (t0 + t2) + (t1 + t3).
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1));
        let t8 = _mm256_add_ps(_mm512_castps512_ps256(p), hi);
        let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
        let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        let sum = _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
        total += sum as f64;
    }
    s.sum[r] = (s.sum[r] as f64 + total) as f32;
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};

    /// Straightforward f64 causal softmax attention, for checking the tile kernel.
    fn naive(kv: &KvHead, q: &[f32], p: usize, scale: f32) -> Vec<f64> {
        let hd = kv.head_dim;
        let scores: Vec<f64> = (0..=p)
            .map(|j| {
                let k = kv.key(j);
                (0..hd).map(|d| q[d] as f64 * k[d].to_f64()).sum::<f64>() * scale as f64
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let z: f64 = w.iter().sum();
        (0..hd)
            .map(|d| (0..=p).map(|j| w[j] * kv.value(j)[d].to_f64()).sum::<f64>() / z)
            .collect()
    }

    #[test]
    fn tile_kernel_is_attention_and_simd_matches_reference_bitwise() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (hd, n_kv_heads) = (64, 2);
        let stride = hd * n_kv_heads;
        let n = 150;
        let keys: Vec<f16> = (0..n * stride)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        let values: Vec<f16> = (0..n * stride)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        let kv = KvHead {
            keys: &keys,
            values: &values,
            stride,
            offset: hd,
            head_dim: hd,
        };
        // A tile of rows at scattered positions, crossing several key tiles.
        let pos: Vec<usize> = vec![0, 1, 63, 64, 65, 100, 127, 128, 149];
        let q: Vec<f32> = (0..pos.len() * hd)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let (mut s1, mut s2) = (TileScratch::default(), TileScratch::default());
        let mut o1 = vec![0f32; q.len()];
        let mut o2 = vec![0f32; q.len()];
        attend_tile(&kv, &q, &pos, 0.125, &mut s1, &mut o1);
        attend_tile_ref(&kv, &q, &pos, 0.125, &mut s2, &mut o2);
        assert_eq!(o1, o2, "dispatch vs reference");
        for (r, &p) in pos.iter().enumerate() {
            let want = naive(&kv, &q[r * hd..(r + 1) * hd], p, 0.125);
            for d in 0..hd {
                let got = o1[r * hd + d] as f64;
                assert!(
                    (got - want[d]).abs() < 1e-5,
                    "row {r} d {d}: {got} vs {}",
                    want[d]
                );
            }
        }
        // Sliding window and soft-capping: the window is the naive attention over the last
        // `w` positions; capping changes the result (and SIMD still equals the reference).
        let sm = ScoreMod {
            scale: 0.125,
            softcap: None,
            window: Some(20),
        };
        let mut ow = vec![0f32; q.len()];
        attend_tile_mod(&kv, &q, &pos, &sm, &mut s1, &mut ow);
        for (r, &p) in pos.iter().enumerate() {
            let lo = sm.first_visible(p);
            let mut sub = keys[lo * stride..].to_vec();
            sub.truncate((p + 1 - lo) * stride);
            let mut subv = values[lo * stride..].to_vec();
            subv.truncate((p + 1 - lo) * stride);
            let shifted = KvHead {
                keys: &sub,
                values: &subv,
                ..kv
            };
            let want = naive(&shifted, &q[r * hd..(r + 1) * hd], p - lo, 0.125);
            for d in 0..hd {
                assert!(
                    (ow[r * hd + d] as f64 - want[d]).abs() < 1e-5,
                    "window row {r}"
                );
            }
        }
        let capped = ScoreMod {
            softcap: Some(0.5),
            ..sm
        };
        let mut oc = vec![0f32; q.len()];
        attend_tile_mod(&kv, &q, &pos, &capped, &mut s2, &mut oc);
        assert_ne!(ow, oc, "soft-capping changes the scores");
        let mut o4 = vec![0f32; q.len()];
        tile_generic(&kv, &q, &pos, &capped, &mut s1, &mut o4);
        assert_eq!(oc, o4, "dispatch vs reference with window and cap");

        // A row's result does not depend on which other rows share its tile.
        let mut o3 = vec![0f32; hd];
        attend_tile(&kv, &q[5 * hd..6 * hd], &pos[5..6], 0.125, &mut s1, &mut o3);
        assert_eq!(&o3[..], &o1[5 * hd..6 * hd]);
    }

    /// The register-blocked kernel equals the plain one bit for bit: head sizes taking each
    /// value-chunk width (128, 32, 1), odd row counts (a row without a partner), rows with
    /// nothing visible in a tile (sliding window), and soft-capping.
    #[test]
    fn dispatched_tile_equals_plain_tile_on_nan_and_infinite_scores() {
        // Keys with NaN and infinities make scores NaN and ±inf: the vectorized softmax step
        // falls back to the fold for the maximum and gives the plain kernel's values (NaN
        // where it has NaN).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(10);
        let hd = 64;
        let n = 130;
        let mut keys: Vec<f16> = (0..n * hd)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        let values: Vec<f16> = (0..n * hd)
            .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
            .collect();
        keys[5 * hd + 3] = f16::NAN;
        keys[70 * hd] = f16::INFINITY;
        keys[100 * hd + 1] = f16::NEG_INFINITY;
        let kv = KvHead {
            keys: &keys,
            values: &values,
            stride: hd,
            offset: 0,
            head_dim: hd,
        };
        let pos: Vec<usize> = vec![2, 4, 5, 6, 69, 70, 71, 99, 100, 129];
        let q: Vec<f32> = (0..pos.len() * hd)
            .map(|_| rng.random_range(-2.0..2.0))
            .collect();
        let sm = ScoreMod::scaled(0.125);
        let (mut want, mut got) = (vec![0f32; q.len()], vec![1f32; q.len()]);
        let mut sc = TileScratch::default();
        tile_generic(&kv, &q, &pos, &sm, &mut sc, &mut want);
        attend_tile_mod(&kv, &q, &pos, &sm, &mut sc, &mut got);
        assert!(want.iter().any(|x| x.is_nan()) && want.iter().any(|x| x.is_finite()));
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                "{i}: {a} vs {b}"
            );
        }
    }

    #[test]
    fn register_blocked_tile_equals_plain_tile_bitwise() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        for hd in [40, 64, 96, 256] {
            let stride = hd;
            let n = 140;
            let keys: Vec<f16> = (0..n * stride)
                .map(|_| f16::from_f32(rng.random_range(-1.5..1.5)))
                .collect();
            let values: Vec<f16> = (0..n * stride)
                .map(|_| f16::from_f32(rng.random_range(-1.0..1.0)))
                .collect();
            let kv = KvHead {
                keys: &keys,
                values: &values,
                stride,
                offset: 0,
                head_dim: hd,
            };
            for pos in [
                vec![0usize],
                vec![3, 4, 5],
                (60..75).collect::<Vec<_>>(),
                vec![0, 70, 71, 139, 2],
            ] {
                let q: Vec<f32> = (0..pos.len() * hd)
                    .map(|_| rng.random_range(-2.0..2.0))
                    .collect();
                for (window, softcap) in [(None, None), (Some(9), None), (Some(30), Some(0.7))] {
                    let sm = ScoreMod {
                        scale: 1.0 / (hd as f32).sqrt(),
                        softcap,
                        window,
                    };
                    let mut want = vec![0f32; q.len()];
                    let mut got = vec![1f32; q.len()];
                    let mut sc = TileScratch::default();
                    tile_generic(&kv, &q, &pos, &sm, &mut sc, &mut want);
                    // On x86 the build without AVX512 runs AVX2 + FMA code: its entry point.
                    #[cfg(target_arch = "x86_64")]
                    {
                        let ok =
                            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
                        assert!(ok, "this test needs AVX2 and FMA on x86");
                        // SAFETY: checked just above.
                        unsafe { tile_avx2(&kv, &q, &pos, &sm, &mut sc, &mut got) };
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    tile_fast::<f16, false>(&kv, &q, &pos, &sm, &mut sc, &mut got);
                    let same = want
                        .iter()
                        .zip(&got)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "hd {hd} pos {pos:?} window {window:?} cap {softcap:?}"
                    );
                    attend_tile_mod(&kv, &q, &pos, &sm, &mut sc, &mut got);
                    assert_eq!(want, got, "dispatched, hd {hd}");
                    // One batch, rows in two calls (the second needs more converted rows
                    // than the first): the reused conversions give the same rows.
                    sc.begin_batch();
                    let half = pos.len() / 2;
                    for (lo, hi) in [(0, half), (half, pos.len())] {
                        let mut part = vec![0f32; (hi - lo) * hd];
                        let qp = &q[lo * hd..hi * hd];
                        attend_tile_batch(&kv, qp, &pos[lo..hi], &sm, &mut sc, &mut part);
                        assert_eq!(part, want[lo * hd..hi * hd], "batched, hd {hd}");
                    }
                }
            }
        }
    }
}
