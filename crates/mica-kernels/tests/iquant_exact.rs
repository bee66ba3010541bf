//! Pins the SIMD dot products of the i-quants, the ternary formats and MXFP4 to llama.cpp's
//! x86 (AVX2) kernels (`ggml-cpu/arch/x86/quants.c`; its AVX-512 build runs the same code
//! for these types), bit for bit: this file restates their float structure as scalar code
//! over the integer values that `quant::iquants` unpacks (checked against gguf-py by the
//! dequantization fixtures), and every SIMD table must match it exactly.
//!
//! The structure, per type:
//! - IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS: per super-block eight i32 lanes, lane
//!   `k` = `Σ sc·q·a` over elements `4k..4k+3` of every 32; `acc = fma(d_w·d_x, lanes,
//!   acc)`; result `mult · hsum_float_8(acc)` (mult 1/8 for iq2, 1/4 for IQ3_XXS).
//! - IQ1_S: those lanes with the grid values; the shift term `Σ ls·sign·bsum` as one
//!   integer per block, `accum1 = fma(d, it, accum1)` in scalar f32; result
//!   `hsum(acc) + 0.125 · accum1`.
//! - IQ1_M: lanes of the grid values and lanes of the shift signs times the activations,
//!   in two accumulators; result `hsum(acc1) + 0.125 · hsum(acc2)`.
//! - TQ1_0, TQ2_0: lanes of the unsigned digits times the activations minus the block sums
//!   `bsum[2k] + bsum[2k+1]`; `acc = fma(lanes, d, acc)` (llama.cpp's mul + add, which GCC
//!   contracts); `hsum(acc)`.
//! - IQ4_NL, MXFP4 (32-element blocks with Q8_0): blocks in pairs into two accumulators,
//!   `hsum(acc1 + acc2)`, an odd last block added by `fma(d, Σ, sum)` in scalar f32.

mod quant_common;

use mica_kernels::DType;
use mica_kernels::quant::blocks::e8m0_to_f32_half;
use mica_kernels::quant::iq_grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use mica_kernels::quant::iquants::{self, Unpacked};
use mica_kernels::quant::{
    Block, BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS,
    BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ8_0, BlockQ8K, BlockTQ1_0, BlockTQ2_0, QK_K,
    cast_blocks, f16_to_f32,
};
use mica_kernels::simd::{DotPath, Kernels};
use quant_common::*;

fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    cast_blocks(bytes).expect("whole blocks")
}

/// `hsum_float_8`: `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
fn hsum8(v: [f32; 8]) -> f32 {
    ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
}

fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: [i32; 8]) {
    for (a, l) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(l as f32, *a);
    }
}

/// Lane k: `Σ f(e) · a[e]` over the elements `e` with `(e % 32) / 4 == k`.
fn lanes(a: &[i8], f: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut out = [0i32; 8];
    for (e, &a) in a.iter().enumerate() {
        out[(e % 32) / 4] += f(e) * a as i32;
    }
    out
}

fn grid_model(u: &[Unpacked], d: &[f32], x: &[BlockQ8K], mult: f32) -> f32 {
    let mut acc = [0f32; 8];
    for ((u, &dw), b) in u.iter().zip(d).zip(x) {
        let l = lanes(&b.qs, |e| u.sc[e / 16] * u.q[e] as i32);
        fma_lanes(&mut acc, dw * b.d(), l);
    }
    mult * hsum8(acc)
}

fn ternary_model(q: &[[i8; QK_K]], d: &[[u8; 2]], x: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 8];
    for ((q, d), b) in q.iter().zip(d).zip(x) {
        let mut l = lanes(&b.qs, |e| q[e] as i32);
        for (k, l) in l.iter_mut().enumerate() {
            *l -= b.bsum(2 * k) as i32 + b.bsum(2 * k + 1) as i32;
        }
        let d = b.d() * f16_to_f32(*d);
        for (a, l) in acc.iter_mut().zip(l) {
            *a = (l as f32).mul_add(d, *a);
        }
    }
    hsum8(acc)
}

fn nl_model(q: &[[i8; 32]], d: &[f32], x: &[BlockQ8_0]) -> f32 {
    let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
    let nb = q.len();
    let mut ib = 0;
    while ib + 1 < nb {
        for (acc, i) in [(&mut acc1, ib), (&mut acc2, ib + 1)] {
            let l = lanes(&x[i].qs, |e| q[i][e] as i32);
            fma_lanes(acc, f16_to_f32(x[i].d) * d[i], l);
        }
        ib += 2;
    }
    let mut sum = hsum8(std::array::from_fn(|k| acc1[k] + acc2[k]));
    if ib < nb {
        let s: i32 = q[ib]
            .iter()
            .zip(&x[ib].qs)
            .map(|(&q, &a)| q as i32 * a as i32)
            .sum();
        sum = (f16_to_f32(x[ib].d) * d[ib]).mul_add(s as f32, sum);
    }
    sum
}

fn model(t: DType, w: &[u8], x: &[u8]) -> f32 {
    macro_rules! grid {
        ($b:ty, $unpack:path, $mult:expr) => {{
            let w: &[$b] = blocks(w);
            let u: Vec<Unpacked> = w.iter().map($unpack).collect();
            let d: Vec<f32> = w.iter().map(|b| f16_to_f32(b.d)).collect();
            grid_model(&u, &d, blocks(x), $mult)
        }};
    }
    match t {
        DType::IQ2_XXS => grid!(BlockIQ2XXS, iquants::unpack_iq2xxs, 0.125),
        DType::IQ2_XS => grid!(BlockIQ2XS, iquants::unpack_iq2xs, 0.125),
        DType::IQ2_S => grid!(BlockIQ2S, iquants::unpack_iq2s, 0.125),
        DType::IQ3_XXS => grid!(BlockIQ3XXS, iquants::unpack_iq3xxs, 0.25),
        DType::IQ3_S => grid!(BlockIQ3S, iquants::unpack_iq3s, 1.0),
        DType::IQ4_XS => grid!(BlockIQ4XS, iquants::unpack_iq4xs, 1.0),
        DType::IQ1_S => {
            let (mut acc, mut accum1) = ([0f32; 8], 0f32);
            for (a, b) in blocks::<BlockIQ1S>(w).iter().zip(blocks::<BlockQ8K>(x)) {
                let (u, delta) = iquants::unpack_iq1s(a);
                let d = b.d() * f16_to_f32(a.d);
                fma_lanes(&mut acc, d, lanes(&b.qs, |e| u.sc[e / 16] * u.q[e] as i32));
                let sumi1: i32 = (0..8)
                    .map(|ib| {
                        let bs = b.bsum(2 * ib) as i32 + b.bsum(2 * ib + 1) as i32;
                        bs * delta[ib] * u.sc[2 * ib]
                    })
                    .sum();
                accum1 = d.mul_add(sumi1 as f32, accum1);
            }
            hsum8(acc) + 0.125 * accum1
        }
        DType::IQ1_M => {
            let (mut acc1, mut acc2) = ([0f32; 8], [0f32; 8]);
            for (a, b) in blocks::<BlockIQ1M>(w).iter().zip(blocks::<BlockQ8K>(x)) {
                let (u, delta) = iquants::unpack_iq1m(a);
                let d = b.d() * iquants::iq1m_scale(a);
                fma_lanes(&mut acc1, d, lanes(&b.qs, |e| u.sc[e / 16] * u.q[e] as i32));
                fma_lanes(&mut acc2, d, lanes(&b.qs, |e| u.sc[e / 16] * delta[e / 8]));
            }
            hsum8(acc1) + 0.125 * hsum8(acc2)
        }
        DType::TQ1_0 => {
            let w: &[BlockTQ1_0] = blocks(w);
            let q: Vec<_> = w.iter().map(iquants::unpack_tq1_0).collect();
            let d: Vec<_> = w.iter().map(|b| b.d).collect();
            ternary_model(&q, &d, blocks(x))
        }
        DType::TQ2_0 => {
            let w: &[BlockTQ2_0] = blocks(w);
            let q: Vec<_> = w.iter().map(iquants::unpack_tq2_0).collect();
            let d: Vec<_> = w.iter().map(|b| b.d).collect();
            ternary_model(&q, &d, blocks(x))
        }
        DType::IQ4_NL => {
            let w: &[BlockIQ4NL] = blocks(w);
            let q: Vec<_> = w
                .iter()
                .map(|b| iquants::unpack_nl(&b.qs, &KVALUES_IQ4NL))
                .collect();
            let d: Vec<_> = w.iter().map(|b| f16_to_f32(b.d)).collect();
            nl_model(&q, &d, blocks(x))
        }
        DType::MXFP4 => {
            let w: &[BlockMXFP4] = blocks(w);
            let q: Vec<_> = w
                .iter()
                .map(|b| iquants::unpack_nl(&b.qs, &KVALUES_MXFP4))
                .collect();
            let d: Vec<_> = w.iter().map(|b| e8m0_to_f32_half(b.e)).collect();
            nl_model(&q, &d, blocks(x))
        }
        _ => unreachable!("{t}"),
    }
}

const TYPES: [DType; 12] = [
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::MXFP4,
];

#[test]
fn simd_dots_are_llama_cpp_arithmetic_bit_for_bit() {
    let tables: Vec<&Kernels> = Kernels::all()
        .into_iter()
        .filter_map(|(name, k)| k.filter(|_| name != "scalar"))
        .collect();
    if tables.is_empty() {
        println!("no SIMD table on this CPU: nothing to check");
        return;
    }
    let mut r = rng(29);
    for t in TYPES {
        let mut cases = 0;
        for nblocks in [1usize, 2, 3, 8, 17, 33] {
            let n = nblocks * t.block_size();
            for wk in WEIGHT_KINDS {
                for ak in ACT_KINDS {
                    let w = weight_row(t, nblocks, wk, &mut r);
                    let x = activations(n, ak, &mut r);
                    let mut xq = vec![0u8; t.vec_dot_type().row_bytes(n).unwrap()];
                    Kernels::scalar().quantize_act(t.vec_dot_type(), &x, &mut xq);
                    let want = model(t, &w, &xq);
                    for k in &tables {
                        let got = k.vec_dot(t, n, &w, &xq);
                        assert!(
                            got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                            "{} {t} n={n} {wk:?} {ak:?}: simd {got:e}, model {want:e}",
                            k.isa()
                        );
                    }
                    cases += 1;
                }
            }
        }
        println!("{t}: {cases} rows bit-identical to the llama.cpp model");
    }
}

// Pinned to llama.cpp itself: `vec_dot` of its CPU backend (llama-cpp-python's libggml-cpu,
// llama.cpp 0c1e57098, built for AVX-512 VNNI, the ISA of the golden machine) on
// deterministic inputs, printed by `scripts/gen_iquant_llama_dots.py`: per type and input
// amplitude, the FNV-1a hash of the quantized activations and the bits of the result.

/// `(weight type, amplitude index, FNV-1a 64 of the quantized activations, f32 bits)`.
const LLAMA_CPP: [(DType, u32, u64, u32); 36] = [
    (DType::IQ2_XXS, 0, 0xc6af4c5828a5da5f, 0x4117fd34), // 9.49932
    (DType::IQ2_XXS, 1, 0xcf4c0e466411f211, 0x44633fb4), // 908.995
    (DType::IQ2_XXS, 2, 0x1ab7c0bcceb725b4, 0xbb3d10e0), // -0.00288492
    (DType::IQ2_XS, 0, 0x3834872716ff087a, 0x40cd9862),  // 6.42485
    (DType::IQ2_XS, 1, 0x818473edc3e84be1, 0xc249a668),  // -50.4125
    (DType::IQ2_XS, 2, 0xa105cfb88b8acd68, 0x3e036042),  // 0.128297
    (DType::IQ2_S, 0, 0x8d62962c7322c72d, 0x41b6ea8c),   // 22.8645
    (DType::IQ2_S, 1, 0x8057b4ee5a5cae4b, 0xc3d0d776),   // -417.683
    (DType::IQ2_S, 2, 0x36f468be3dd8c666, 0xbeee53f2),   // -0.465484
    (DType::IQ3_XXS, 0, 0xae52a2f794a763f3, 0x411fd1ac), // 9.98869
    (DType::IQ3_XXS, 1, 0x7d49aa81dcc3d856, 0xc4a2b201), // -1301.56
    (DType::IQ3_XXS, 2, 0xf882e3f81c6a2e51, 0x3e0f3454), // 0.139848
    (DType::IQ3_S, 0, 0xbdc88ec0b4ef58ea, 0xc0317590),   // -2.7728
    (DType::IQ3_S, 1, 0x1cb74e633ec5ec1b, 0xc4db33af),   // -1753.62
    (DType::IQ3_S, 2, 0x781f20095cfa7d82, 0x3f864bba),   // 1.04919
    (DType::IQ1_S, 0, 0x9c076609681bd35c, 0xc0c9e783),   // -6.30951
    (DType::IQ1_S, 1, 0x12935def825bb7b0, 0xc393e6c0),   // -295.803
    (DType::IQ1_S, 2, 0xf0db5b17b8e15e6c, 0xbc8b917f),   // -0.0170372
    (DType::IQ1_M, 0, 0x2b1b7c6827ba0ba1, 0x40cf4171),   // 6.47674
    (DType::IQ1_M, 1, 0xfe862dda9cac2b8b, 0x411e4964),   // 9.89292
    (DType::IQ1_M, 2, 0xfb881b2275ddb713, 0x3b4923e4),   // 0.00306916
    (DType::IQ4_NL, 0, 0xd6699edd17598b2b, 0x4292866a),  // 73.2625
    (DType::IQ4_NL, 1, 0xcac1b2b1eeb3c1e4, 0x448be167),  // 1119.04
    (DType::IQ4_NL, 2, 0x40c37362185b8b25, 0x3f2f9985),  // 0.685936
    (DType::IQ4_XS, 0, 0xb9f503490432d468, 0xc3d05131),  // -416.634
    (DType::IQ4_XS, 1, 0x36811c70b1820c83, 0xc64f91b4),  // -13284.4
    (DType::IQ4_XS, 2, 0x90fd0db2016e89e9, 0xbf755040),  // -0.958256
    (DType::TQ1_0, 0, 0x13d221d8a591afe6, 0xbe83ea40),   // -0.257647
    (DType::TQ1_0, 1, 0x034d24a21287b922, 0x410c6330),   // 8.77422
    (DType::TQ1_0, 2, 0xbafcad0da111efb2, 0x3aae1754),   // 0.00132821
    (DType::TQ2_0, 0, 0x8cf8831dbc743784, 0x3f65d9fc),   // 0.897857
    (DType::TQ2_0, 1, 0xfc7659c81364f424, 0x408ea010),   // 4.45704
    (DType::TQ2_0, 2, 0x55da67fab7f65500, 0x3bdfbd2d),   // 0.00682797
    (DType::MXFP4, 0, 0xb75633a0f69e14f5, 0x44561688),   // 856.352
    (DType::MXFP4, 1, 0xafa0cbc91972e011, 0x4848988c),   // 205410
    (DType::MXFP4, 2, 0xe5227faf797347bd, 0x41f1b2df),   // 30.2123
];

/// The generator's xorshift32.
struct XorShift(u32);
impl XorShift {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
    fn unif(&mut self) -> f32 {
        (self.next() >> 8) as f32 * (1.0 / 8388608.0) - 1.0
    }
    fn scale16(&mut self) -> u16 {
        (0x1c00 + self.next() % 0x1000) as u16
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

#[test]
fn dots_equal_llama_cpp_outputs() {
    const N: usize = 1024;
    let tables: Vec<&Kernels> = Kernels::all().into_iter().filter_map(|(_, k)| k).collect();
    for (i, &(t, rep, want_hash, want_bits)) in LLAMA_CPP.iter().enumerate() {
        let ti = TYPES.iter().position(|&q| q == t).unwrap() as u32;
        assert_eq!(ti as usize, i / 3, "table order");
        let mut rng = XorShift(0x9e3779b9 ^ (ti * 977 + rep * 131 + 1));
        let wb = t.row_bytes(N).unwrap();
        let mut w: Vec<u8> = (0..wb).map(|_| rng.next() as u8).collect();
        for blk in w.chunks_exact_mut(t.type_size()) {
            match t {
                DType::MXFP4 => blk[0] = (120 + rng.next() % 16) as u8,
                DType::IQ1_M => {
                    let h = rng.scale16();
                    for i in 0..4 {
                        let b = &mut blk[49 + 2 * i];
                        *b = (*b & 0x0F) | (((h >> (4 * i)) & 0xF) << 4) as u8;
                    }
                }
                _ => {
                    let off = match t {
                        DType::TQ1_0 => 52,
                        DType::TQ2_0 => 64,
                        _ => 0,
                    };
                    blk[off..off + 2].copy_from_slice(&rng.scale16().to_le_bytes());
                }
            }
        }
        let amp = [1.0f32, 37.0, 0.01][rep as usize];
        let x: Vec<f32> = (0..N).map(|_| rng.unif() * amp).collect();
        let vt = t.vec_dot_type();
        for k in &tables {
            let mut xq = vec![0u8; vt.row_bytes(N).unwrap()];
            k.quantize_act(vt, &x, &mut xq);
            assert_eq!(fnv1a(&xq), want_hash, "{} {t} #{rep}: activations", k.isa());
            if k.isa() != "scalar" {
                let got = k.vec_dot(t, N, &w, &xq);
                assert_eq!(
                    got.to_bits(),
                    want_bits,
                    "{} {t} #{rep}: {got:e} vs llama.cpp {:e}",
                    k.isa(),
                    f32::from_bits(want_bits)
                );
            }
        }
    }
}

/// IQ4_NL matrices with a multiple of 8 rows are repacked by llama.cpp and multiplied by
/// `ggml_gemv/gemm_iq4_nl_8x8_q8_0`: per output one FMA per block of the block's integer
/// sum. Every table's `RepackGemv` dot must be that, bit for bit.
#[test]
fn repacked_iq4_nl_is_llama_cpp_arithmetic_bit_for_bit() {
    let t = DType::IQ4_NL;
    assert_eq!(DotPath::for_token(t, 576, 1, 0), DotPath::RepackGemv);
    assert_eq!(DotPath::for_token(t, 576, 9, 8), DotPath::RepackGemv);
    assert_eq!(DotPath::for_token(t, 100, 9, 0), DotPath::VecDot);
    let mut r = rng(30);
    for nblocks in [1usize, 2, 3, 17, 33] {
        let n = nblocks * 32;
        for wk in WEIGHT_KINDS {
            for ak in ACT_KINDS {
                let w = weight_row(t, nblocks, wk, &mut r);
                let x = activations(n, ak, &mut r);
                let mut xq = vec![0u8; DType::Q8_0.row_bytes(n).unwrap()];
                Kernels::scalar().quantize_act(DType::Q8_0, &x, &mut xq);
                let mut want = 0f32;
                for (a, b) in blocks::<BlockIQ4NL>(&w)
                    .iter()
                    .zip(blocks::<BlockQ8_0>(&xq))
                {
                    let q = iquants::unpack_nl(&a.qs, &KVALUES_IQ4NL);
                    let s: i32 = q
                        .iter()
                        .zip(&b.qs)
                        .map(|(&q, &v)| q as i32 * v as i32)
                        .sum();
                    want = (s as f32).mul_add(f16_to_f32(a.d) * f16_to_f32(b.d), want);
                }
                for (_, k) in Kernels::all() {
                    let Some(k) = k else { continue };
                    let got = k.dot_fn(DotPath::RepackGemv, t)(n, &w, &xq);
                    assert!(
                        got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan(),
                        "{} n={n} {wk:?} {ak:?}: {got:e} vs {want:e}",
                        k.isa()
                    );
                }
            }
        }
    }
}
