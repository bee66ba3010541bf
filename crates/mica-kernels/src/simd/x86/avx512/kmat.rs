//! AVX-512 matrix kernels (see [`crate::simd::mat`]) for the k-quants on every llama.cpp
//! path: the repacked-Q4_K gemv/gemm, the tiled batch path (Q2_K..Q6_K), and `vec_dot` (all
//! but Q3_K, whose llama.cpp lanes fold its offset per element).
//!
//! A weight super-block is unpacked once per row (`kunpack.rs`) into four registers of 64
//! unsigned quants (element order) and four registers of i16 sub-block scales; each token
//! then costs four `vpmaddubsw` (u8 × i8 pair sums, exact in i16) and four `vpdpwssd`
//! (× scale, into i32 lanes). The offset of Q6_K's quants (-32) enters through the
//! activations' group sums (`bsums`), as do Q4_K's mins.
//!
//! The batch paths' float arithmetic is scalar per output (`simd/paths.rs`: one or four FMAs
//! per super-block on the *total* integer sums), so their micro-kernel computes 16 outputs at
//! once (4 rows × 4 tokens, 8 × 2 or 16 × 1): the i32 lanes of the 16 outputs are reduced
//! together by a transposing add tree, and the FMAs run with one output per f32 lane, each
//! lane doing exactly the scalar sequence. Token tiles of 16 or more tokens go to
//! `kgemm.rs` instead (rows interleaved once per tile, one `vpdpbusd` per four elements of
//! sixteen rows, no reduction tree; same integer sums and float steps). `vec_dot` keeps
//! llama.cpp's eight `sumi` lanes per output (`dot.rs`), four rows × up to four tokens per
//! step (each super-block unpacked once for the tokens: a speculative verification pass
//! sends several through this path).
//!
//! Every kernel reads the rows in the file's layout or in Q4_K's packed layout
//! (`kpacked.rs`, sixteen rows per group: one sequential stream for the decode
//! micro-kernel); only where each row's next block lies differs ([`Rows`]).

use std::arch::x86_64::*;

use super::fold;
use super::kgemm::{self, Inter};
use super::kunpack::{KFormat, Unpacked, VecKind};
use crate::DType;
use crate::quant::blocks::QK_K;
use crate::simd::mat::{ActRows, MatOut, WeightRows, prefetch};
use crate::simd::x86::avx2::{finish_q4k, hsum_f32, hsum_i32x4, rd16};

/// Tokens per cache tile (their activations stay in L2 while the rows run over them).
const TOK_TILE: usize = 64;
/// Bytes of a Q8_K block; its f32 scale, quants and group sums.
pub(super) const XB: usize = 292;
pub(super) const XQ: usize = 4;
pub(super) const XBS: usize = 260;

// ---------------------------------------------------------------------------------------------
// Integer sums.

/// `Σ sc·q·a` of one super-block as 16 i32 lanes (lane i: elements 4i..4i+3 of each
/// 64-element register, summed over the four).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn lanes16(u: &Unpacked, x: *const u8) -> __m512i {
    let mut s = _mm512_setzero_si512();
    for k in 0..4 {
        // SAFETY: the caller passes a Q8_K block.
        let a = unsafe { _mm512_loadu_si512(x.add(XQ + 64 * k).cast()) };
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(u.q[k], a), u.sc[k]);
    }
    s
}

/// The eight pair sums `g[2i]·bsum[2i] + g[2i+1]·bsum[2i+1]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn group_lanes(u: &Unpacked, x: *const u8) -> __m256i {
    // SAFETY: the caller passes a Q8_K block.
    let bs = unsafe { _mm256_loadu_si256(x.add(XBS).cast()) };
    _mm256_madd_epi16(u.groups, bs)
}

/// Tree level 1 + 2: four vectors → one whose 128-bit chunk j holds, in lane i, the sum of
/// chunk j of input i.
#[inline]
#[target_feature(enable = "avx512f")]
fn quad(v: [__m512i; 4]) -> __m512i {
    let l1 = |a, b| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let (x, y) = (l1(v[0], v[1]), l1(v[2], v[3]));
    _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
}

/// Adds 128-bit chunks pairwise: `[a0+a1, a2+a3, b0+b1, b2+b3]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn pairs(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i32x4(a, b, 0x88),
        _mm512_shuffle_i32x4(a, b, 0xDD),
    )
}

/// Lane sums of 16 vectors, lane i = Σ lanes of `v[i]`.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(v: &[__m512i; 16]) -> __m512i {
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    pairs(pairs(b[0], b[1]), pairs(b[2], b[3]))
}

/// Two sums of 16 vectors whose chunks 0-1 and 2-3 hold two different quantities:
/// `(Σ chunks 0-1, Σ chunks 2-3)` per input lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16x2(v: &[__m512i; 16]) -> (__m512i, __m512i) {
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    // [first(0-3), second(0-3), first(4-7), second(4-7)] and the same for 8-15.
    let (c0, c1) = (pairs(b[0], b[1]), pairs(b[2], b[3]));
    (
        _mm512_shuffle_i32x4(c0, c1, 0x88),
        _mm512_shuffle_i32x4(c0, c1, 0xDD),
    )
}

// ---------------------------------------------------------------------------------------------
// The batch paths: 16 outputs per micro-kernel, one per f32 lane.

/// The float steps of a batch path, lane-wise (`paths.rs`'s `Acc` for 16 outputs).
pub(super) trait BatchPath {
    /// Whether the path needs the sums per 64 elements (the repacked gemm) or totals.
    const PARTS: bool;
    /// One super-block from totals: `isum`, and `imin` for the formats with mins, as f32.
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales);
    fn result(acc: &[__m512; 2]) -> __m512;
}

/// Per-lane f32 scales of a super-block.
pub(super) struct Scales {
    pub dw: __m512,
    pub dmin: __m512,
    pub dx: __m512,
}

pub(super) struct Tiled;
impl BatchPath for Tiled {
    const PARTS: bool = false;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // SAFETY: AVX-512F is enabled in every caller (inlined into target_feature code).
        unsafe {
            let mut r = _mm512_mul_ps(isum, d.dw);
            if let Some(imin) = imin {
                let sign = _mm512_set1_epi32(i32::MIN);
                let neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(d.dmin), sign));
                r = _mm512_fmadd_ps(neg, imin, r);
            }
            acc[0] = _mm512_fmadd_ps(r, d.dx, acc[0]);
        }
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        acc[0]
    }
}

pub(super) struct Gemv;
impl BatchPath for Gemv {
    const PARTS: bool = false;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // SAFETY: as above.
        unsafe {
            acc[0] = _mm512_fmadd_ps(isum, _mm512_mul_ps(d.dw, d.dx), acc[0]);
            if let Some(imin) = imin {
                acc[1] = _mm512_fmadd_ps(imin, _mm512_mul_ps(d.dmin, d.dx), acc[1]);
            }
        }
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        // SAFETY: as above.
        unsafe { _mm512_sub_ps(acc[0], acc[1]) }
    }
}

pub(super) struct Gemm;
impl BatchPath for Gemm {
    const PARTS: bool = true;
    #[inline(always)]
    fn step(acc: &mut [__m512; 2], isum: __m512, imin: Option<__m512>, d: &Scales) {
        // One of the four 64-element parts, in order.
        Gemv::step(acc, isum, imin, d)
    }
    #[inline(always)]
    fn result(acc: &[__m512; 2]) -> __m512 {
        Gemv::result(acc)
    }
}

/// 16 f16 fields (at `off` of each row's block) to f32, lane i from row `i / per`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn f16_lanes<const R: usize>(
    w: &[*const u8; R],
    off: usize,
    per: usize,
) -> __m512 {
    let mut h = [0u64; 4];
    for (i, w) in w.iter().enumerate() {
        // SAFETY: the caller passes block pointers with the field inside.
        h[i / 4] |= unsafe { rd16(w.add(off)) } << (16 * (i % 4));
    }
    let v = _mm256_setr_epi64x(h[0] as i64, h[1] as i64, h[2] as i64, h[3] as i64);
    let f = _mm512_cvtph_ps(v);
    if per == 1 {
        f
    } else {
        let idx: [i32; 16] = std::array::from_fn(|i| (i / per) as i32);
        // SAFETY: 64 readable bytes.
        _mm512_permutexvar_ps(unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }, f)
    }
}

/// The activation scales of `C` tokens, lane i from token `i % C`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dx_lanes<const C: usize>(x: &[*const u8; C]) -> __m512 {
    // SAFETY: Q8_K blocks start with their f32 scale.
    let d = |c: usize| unsafe { x[c % C].cast::<f32>().read_unaligned() };
    _mm512_broadcast_f32x4(_mm_setr_ps(d(0), d(1), d(2), d(3)))
}

/// `R` rows × `C` tokens (`R·C = 16`) over all `nb` super-blocks: the path's result per
/// output, lane `r·C + c`. Row r's block b is at `w[r] + b·step` (see [`Rows`]). With `DEC`,
/// `up[r]` points at row r's blocks already unpacked (unused otherwise).
///
/// With `ahead` (`w` is one whole packed group, one sequential stream), the step's 2304
/// bytes are asked for all at once as it starts, which keeps more misses in flight than the
/// loads alone: measured with `examples/q4k_decode.rs` (AMD EPYC, 1 thread, 256 MiB), the
/// packed stream ran 14.5-15 GiB/s so, 11.1 without hints, and 13-14 with the hint a
/// half, one or two steps ahead (9.7 in the file's layout).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<F: KFormat, P: BatchPath, const R: usize, const C: usize, const DEC: bool>(
    w: [*const u8; R],
    x: [*const u8; C],
    nb: usize,
    up: [*const Unpacked; R],
    step: usize,
    ahead: bool,
) -> __m512 {
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..nb {
        // SAFETY: every pointer stays inside its row (checked by the driver).
        unsafe {
            let wb = w.map(|p| p.add(b * step));
            if ahead {
                // The whole step of the group at once (see `tile`'s doc).
                prefetch(wb[0], step);
            }
            let xb = x.map(|p| p.add(b * XB));
            let d = Scales {
                dw: f16_lanes(&wb, F::D, C),
                dmin: if F::MIN {
                    f16_lanes(&wb, F::DMIN, C)
                } else {
                    _mm512_setzero_ps()
                },
                dx: dx_lanes(&xb),
            };
            if P::PARTS {
                let (part, min) =
                    parts_tile::<F, R, C, DEC>(&wb, &xb, up.map(|p| p.wrapping_add(b)));
                for k in 0..4 {
                    let min = F::MIN.then(|| _mm512_cvtepi32_ps(min[k]));
                    P::step(&mut acc, _mm512_cvtepi32_ps(part[k]), min, &d);
                }
            } else {
                let mut v = [_mm512_setzero_si512(); 16];
                for r in 0..R {
                    let u = if DEC { *up[r].add(b) } else { F::unpack(wb[r]) };
                    for c in 0..C {
                        let s = lanes16(&u, xb[c]);
                        let g = group_lanes(&u, xb[c]);
                        v[r * C + c] = if F::MIN {
                            _mm512_inserti64x4(_mm512_castsi256_si512(fold(s)), g, 1)
                        } else {
                            _mm512_add_epi32(s, _mm512_castsi256_si512(g))
                        };
                    }
                }
                let (isum, imin) = if F::MIN {
                    reduce16x2(&v)
                } else {
                    (reduce16(&v), _mm512_setzero_si512())
                };
                let imin = F::MIN.then(|| _mm512_cvtepi32_ps(imin));
                P::step(&mut acc, _mm512_cvtepi32_ps(isum), imin, &d);
            }
        }
    }
    P::result(&acc)
}

/// Per 64-element part k (lane = output): `(Σ sc·q·a, Σ min·bsum)` of one super-block.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn parts_tile<F: KFormat, const R: usize, const C: usize, const DEC: bool>(
    wb: &[*const u8; R],
    xb: &[*const u8; C],
    ub: [*const Unpacked; R],
) -> ([__m512i; 4], [__m512i; 4]) {
    let mut p = [_mm512_setzero_si512(); 16];
    let mut m = [_mm512_setzero_si512(); 16];
    for r in 0..R {
        // SAFETY: the caller's pointers hold whole blocks (`ub`: unpacked, with `DEC`).
        let u = unsafe { if DEC { *ub[r] } else { F::unpack(wb[r]) } };
        for c in 0..C {
            let mut s = [_mm512_setzero_si512(); 4];
            for (k, s) in s.iter_mut().enumerate() {
                // SAFETY: as above.
                let a = unsafe { _mm512_loadu_si512(xb[c].add(XQ + 64 * k).cast()) };
                *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(u.q[k], a), u.sc[k]);
            }
            // Chunk k: four partial sums of part k.
            p[r * C + c] = pairs(pairs(s[0], s[1]), pairs(s[2], s[3]));
            // Chunk k: [min lane 2k, 0, min lane 2k+1, 0].
            // SAFETY: as above.
            m[r * C + c] = _mm512_cvtepu32_epi64(unsafe { group_lanes(&u, xb[c]) });
        }
    }
    (chunk_sums(&p), chunk_sums(&m))
}

/// For 16 inputs whose chunk k holds four partial sums of quantity k: per k, the vector of
/// the 16 totals (lane = input).
#[inline]
#[target_feature(enable = "avx512f")]
fn chunk_sums(v: &[__m512i; 16]) -> [__m512i; 4] {
    // b[j] chunk k = quantity k of inputs 4j..4j+4.
    let b: [__m512i; 4] =
        std::array::from_fn(|j| quad([v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]]));
    // 4 × 4 transpose of chunks.
    let t0 = _mm512_shuffle_i32x4(b[0], b[1], 0x44); // b0c0 b0c1 b1c0 b1c1
    let t1 = _mm512_shuffle_i32x4(b[0], b[1], 0xEE); // b0c2 b0c3 b1c2 b1c3
    let t2 = _mm512_shuffle_i32x4(b[2], b[3], 0x44);
    let t3 = _mm512_shuffle_i32x4(b[2], b[3], 0xEE);
    [
        _mm512_shuffle_i32x4(t0, t2, 0x88),
        _mm512_shuffle_i32x4(t0, t2, 0xDD),
        _mm512_shuffle_i32x4(t1, t3, 0x88),
        _mm512_shuffle_i32x4(t1, t3, 0xDD),
    ]
}

/// Runs one micro-kernel and stores its valid outputs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_tile<F: KFormat, P: BatchPath, const R: usize, const C: usize>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
    r0: usize,
    t0: usize,
    unpacked: Option<(&[Unpacked], usize)>,
) {
    let nb = w.n / QK_K;
    let nr = (w.rows - r0).min(R);
    let nt = (x.n - t0).min(C);
    let rows = Rows::<F>::new(w);
    // Missing rows and tokens repeat the last.
    let wp = std::array::from_fn(|i| rows.at(r0 + i.min(nr - 1)));
    // SAFETY: tokens t0..t0+nt exist.
    let xp =
        std::array::from_fn(|c| unsafe { x.data.as_ptr().add((t0 + c.min(nt - 1)) * nb * XB) });
    // SAFETY: as above; `unpacked` holds blocks 0..nb of rows `base..` (all of ours).
    let v = unsafe {
        match unpacked {
            Some((buf, base)) => {
                let up = std::array::from_fn(|i| {
                    let r = r0 + i.min(nr - 1) - base;
                    assert!((r + 1) * nb <= buf.len(), "unpacked rows");
                    buf.as_ptr().add(r * nb)
                });
                tile::<F, P, R, C, true>(wp, xp, nb, up, rows.step, false)
            }
            None => tile::<F, P, R, C, false>(
                wp,
                xp,
                nb,
                [std::ptr::null(); R],
                rows.step,
                w.packed && R == w.group,
            ),
        }
    };
    let mut lanes = [0f32; 16];
    // SAFETY: 16 writable floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
    for r in 0..nr {
        for c in 0..nt {
            out.set(t0 + c, r0 + r, lanes[r * C + c]);
        }
    }
}

/// A batch path's matrix kernel: rows in blocks of 16, tokens in tiles of [`TOK_TILE`] and
/// micro-kernel groups of 4 (4 rows each), 2 (8 rows) or 1 (16 rows).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn batch<F: KFormat, P: BatchPath>(
    w: &WeightRows,
    x: &ActRows,
    out: &mut MatOut,
) {
    check::<F>(w, x);
    let nb = w.n / QK_K;
    // Tiles of at least DECODE_MIN_TOKENS tokens unpack each block of their 16 rows once
    // into `buf` (`[16][nb]`) for all their micro-kernels.
    let mut buf: Vec<Unpacked> = Vec::new();
    let mut inter: Vec<Inter> = Vec::new();
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        if t1 - t0 >= kgemm::MIN_TOKENS {
            // SAFETY: the sizes are checked above.
            unsafe { kgemm::tile::<F, P>(w, x, out, (t0, t1), &mut inter) };
            continue;
        }
        let decode = t1 - t0 >= DECODE_MIN_TOKENS;
        for r0 in (0..w.rows).step_by(16) {
            let r1 = (r0 + 16).min(w.rows);
            let mut t = t0;
            // SAFETY (all calls): r < w.rows, t < x.n; `buf` holds rows r0..r1.
            unsafe {
                if decode {
                    buf.clear();
                    let rows = Rows::<F>::new(w);
                    for r in r0..r1 {
                        let row = rows.at(r);
                        buf.extend((0..nb).map(|b| F::unpack(row.add(b * rows.step))));
                    }
                }
                let u = decode.then_some((buf.as_slice(), r0));
                while t1 - t >= 3 {
                    for r in (r0..r1).step_by(4) {
                        run_tile::<F, P, 4, 4>(w, x, out, r, t, u);
                    }
                    t += 4.min(t1 - t);
                }
                if t1 - t == 2 {
                    for r in (r0..r1).step_by(8) {
                        run_tile::<F, P, 8, 2>(w, x, out, r, t, u);
                    }
                } else if t1 - t == 1 {
                    run_tile::<F, P, 16, 1>(w, x, out, r0, t, u);
                }
            }
        }
    }
}

/// Token tiles from this size on unpack their rows once (fewer tokens do not repay the
/// stores).
const DECODE_MIN_TOKENS: usize = 8;

/// Checks the sizes every kernel here relies on.
fn check<F: KFormat>(w: &WeightRows, x: &ActRows) {
    let nb = w.n / QK_K;
    assert!(nb * QK_K == w.n && w.rows > 0 && x.dtype == DType::Q8_K);
    let need = if w.packed {
        assert_eq!(w.stride, w.group * nb * F::BYTES, "packed group bytes");
        w.rows.div_ceil(w.group) * w.stride
    } else {
        (w.rows - 1) * w.stride + nb * F::BYTES
    };
    assert!(w.data.len() >= need, "weight rows");
    assert!(x.data.len() == x.n * nb * XB, "activation rows");
}

/// Where the kernels find each row's super-blocks: in the file's layout, row r's blocks
/// follow each other from `r · stride`; packed (`kpacked.rs`), block b of row r is the
/// `r % group`-th block of its group's b-th step of `group` blocks.
pub(super) struct Rows<'a, F> {
    w: &'a WeightRows<'a>,
    /// Bytes from one block of a row to its next.
    pub step: usize,
    _f: std::marker::PhantomData<F>,
}

impl<'a, F: KFormat> Rows<'a, F> {
    pub(super) fn new(w: &'a WeightRows<'a>) -> Self {
        let step = if w.packed {
            w.group * F::BYTES
        } else {
            F::BYTES
        };
        Rows {
            w,
            step,
            _f: std::marker::PhantomData,
        }
    }

    /// Row `r`'s first block (`r < w.rows`, inside the data by [`check`]).
    #[inline(always)]
    pub(super) fn at(&self, r: usize) -> *const u8 {
        let w = self.w;
        let off = if w.packed {
            r / w.group * w.stride + r % w.group * F::BYTES
        } else {
            r * w.stride
        };
        debug_assert!(r < w.rows && off < w.data.len());
        w.data.as_ptr().wrapping_add(off)
    }
}

// ---------------------------------------------------------------------------------------------
// vec_dot: llama.cpp's eight `sumi` lanes per output, four rows × up to four tokens per step.

/// Tokens per `vec_dot` micro-kernel: each super-block of its four rows is unpacked once for
/// all of them (a verification pass runs several tokens through this path).
const VEC_TOKENS: usize = 4;

/// Four rows × `C` tokens: llama.cpp's `vec_dot` per output ([`VecKind`]); result `[c][r]`.
/// Each output's float steps are those of a one-token call, in the same order: only the
/// unpacking of a row's super-block is shared by the tokens.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_rows<F: KFormat, const C: usize>(
    w: [*const u8; 4],
    step: usize,
    x: [*const u8; C],
    nb: usize,
) -> [[f32; 4]; C] {
    let kind = F::VEC.expect("a vec_dot kind");
    let mut acc = [[_mm256_setzero_ps(); 4]; C];
    let mut acc_m = [[_mm_setzero_ps(); 4]; C];
    let mut summs = [[0f32; 4]; C];
    let f16 = |p: *const u8| {
        // SAFETY: the caller passes a readable f16 field.
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(unsafe { rd16(p) } as i32)))
    };
    for b in 0..nb {
        // SAFETY: every pointer stays inside its row or token (checked by the driver).
        unsafe {
            let xb = x.map(|p| p.add(b * XB));
            let dx = xb.map(|p| p.cast::<f32>().read_unaligned());
            for r in 0..4 {
                let wb = w[r].add(b * step);
                let u = F::unpack(wb);
                let dw = f16(wb.add(F::D));
                for c in 0..C {
                    let d = dx[c] * dw;
                    let s = fold(lanes16(&u, xb[c]));
                    let g = group_lanes(&u, xb[c]);
                    // -d_x·dmin, as llama.cpp forms it.
                    let dmin = || -dx[c] * f16(wb.add(F::DMIN));
                    let acc = &mut acc[c][r];
                    let sumi = match kind {
                        VecKind::Q2 => {
                            let m = _mm256_cvtepi32_ps(g);
                            *acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin()), m, *acc);
                            s
                        }
                        VecKind::Q4 => {
                            let lo = _mm256_castsi256_si128(g);
                            let mins = _mm_hadd_epi32(lo, _mm256_extracti128_si256(g, 1));
                            let m = _mm_cvtepi32_ps(mins);
                            let am = &mut acc_m[c][r];
                            *am = _mm_fmadd_ps(_mm_set1_ps(dmin()), m, *am);
                            s
                        }
                        VecKind::Q5 => {
                            let t = _mm_add_epi32(
                                _mm256_castsi256_si128(g),
                                _mm256_extracti128_si256(g, 1),
                            );
                            let t = hsum_i32x4(t);
                            summs[c][r] = dmin().mul_add(t as f32, summs[c][r]);
                            s
                        }
                        VecKind::Q6 => _mm256_add_epi32(s, g),
                    };
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), *acc);
                }
            }
        }
    }
    std::array::from_fn(|c| {
        std::array::from_fn(|r| match kind {
            VecKind::Q4 => finish_q4k(acc[c][r], acc_m[c][r]),
            VecKind::Q5 => hsum_f32(acc[c][r]) + summs[c][r],
            VecKind::Q2 | VecKind::Q6 => hsum_f32(acc[c][r]),
        })
    })
}

/// Runs [`vec_dot_rows`] for `C` tokens from `t` and stores the `nr` valid rows from `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_tokens<F: KFormat, const C: usize>(
    wp: [*const u8; 4],
    step: usize,
    x: &ActRows,
    t: usize,
    out: &mut MatOut,
    r0: usize,
    nr: usize,
    nb: usize,
) {
    // SAFETY: tokens t..t+C exist (the driver checks).
    let xp = std::array::from_fn(|c| unsafe { x.data.as_ptr().add((t + c) * nb * XB) });
    // SAFETY: as above; the rows are checked by the driver.
    let res = unsafe { vec_dot_rows::<F, C>(wp, step, xp, nb) };
    for (c, res) in res.iter().enumerate() {
        for (i, &v) in res[..nr].iter().enumerate() {
            out.set(t + c, r0 + i, v);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn vec_dot<F: KFormat>(w: &WeightRows, x: &ActRows, out: &mut MatOut) {
    check::<F>(w, x);
    let nb = w.n / QK_K;
    let rows = Rows::<F>::new(w);
    for t0 in (0..x.n).step_by(TOK_TILE) {
        let t1 = (t0 + TOK_TILE).min(x.n);
        for r0 in (0..w.rows).step_by(4) {
            let nr = (w.rows - r0).min(4);
            let wp = std::array::from_fn(|i| rows.at(r0 + i.min(nr - 1)));
            let mut t = t0;
            // SAFETY (all calls): rows r0..r0+nr and tokens t..t+C < t1 <= x.n exist.
            unsafe {
                while t + VEC_TOKENS <= t1 {
                    vec_dot_tokens::<F, VEC_TOKENS>(wp, rows.step, x, t, out, r0, nr, nb);
                    t += VEC_TOKENS;
                }
                match t1 - t {
                    3 => vec_dot_tokens::<F, 3>(wp, rows.step, x, t, out, r0, nr, nb),
                    2 => vec_dot_tokens::<F, 2>(wp, rows.step, x, t, out, r0, nr, nb),
                    1 => vec_dot_tokens::<F, 1>(wp, rows.step, x, t, out, r0, nr, nb),
                    _ => {}
                }
            }
        }
    }
}
