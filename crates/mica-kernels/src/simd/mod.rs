//! Run-time kernel dispatch: a [`Kernels`] table of dot products and activation quantizers
//! per instruction set, chosen once at start-up from `is_x86_feature_detected!` (the ggml
//! approach; a stock `cargo build` without `-C target-cpu` still runs the SIMD code).
//!
//! Tables, from slowest to fastest:
//! - `scalar`: the reference functions of [`crate::quant`] (ggml's generic numerics), with
//!   the run-time Q8_0/Q8_1 activation quantizers.
//! - `avx2`: AVX2 + FMA + F16C (`avx2.rs`, `avx2_kquants.rs`).
//! - `avx512`: AVX-512 F/BW/VL + VNNI (`avx512.rs`), overriding the hottest AVX2 kernels
//!   and falling back to them for the rest.
//! - `neon` (aarch64): the quantized dot products with the same float structure as the x86
//!   tables (`neon.rs`); matrix kernels run one dot per output there.
//!
//! Numerics: mica has to reproduce llama.cpp's greedy tokens, and small models are chaotic
//! enough that a handful of differently rounded activations changes them. So the run-time
//! paths follow llama.cpp's x86 build (AVX2/AVX-512 VNNI, GCC with FP contraction) operation
//! by operation:
//! - Activation quantizers Q8_0/Q8_1 are the x86 `quantize_row_q8_0/1` in *every* table
//!   (the scalar one included, [`quant::legacy::quantize_q8_0_act`]), byte-identical across
//!   tables. Q8_K, F16 and BF16 are llama.cpp's reference conversions.
//! - Dot products of the SIMD tables keep llama.cpp's float structure: per block the integer
//!   products summed into eight i32 lanes (lane j = elements 4j..4j+3 of each 32), those
//!   lanes scaled into eight f32 accumulators with one FMA per block, the separate min/offset
//!   terms accumulated as llama.cpp does, then its horizontal sum. The AVX2 and AVX-512
//!   tables give bit-identical results; `tests/llama_exact.rs` pins them to a step-by-step
//!   scalar model of the x86 code.
//! - The scalar table keeps ggml's generic reference dots ([`quant::vec_dot_ref`]), which
//!   differ from the SIMD ones only in float rounding order (integer sums are exact).
//! - Where llama.cpp computes a product by another route than `ggml_vec_dot_*` (repacked
//!   Q4_K, the tiled k-quant matmul for batches of 8+ tokens), [`Kernels::dot_fn`] gives its
//!   arithmetic for the [`DotPath`] that [`DotPath::for_token`] picks (`paths.rs`); these
//!   are bit-identical in every table, the scalar one included.
//!
//! Matrix kernels ([`Kernels::matmul`], `mat.rs`) compute whole `tokens × rows` tiles per
//! call with the same per-output arithmetic as `dot_fn`: `avx512_mat.rs` (legacy formats,
//! four rows × up to four tokens, with an optional load-time packed layout,
//! [`Kernels::pack`]), `avx512_kmat.rs` (k-quants, 16 outputs per micro-kernel),
//! `avx2_mat.rs` and `paths.rs` (AVX2, four rows per step); the scalar table, and any
//! (type, path) without a kernel, runs one `dot_fn` per output.
//!
//! Quantized activations lie in -127..=127 for every finite block of normal magnitude, which
//! the sign trick of the 8-bit products relies on; blocks with NaN, infinities or only
//! subnormal values get -128 quants exactly as in llama.cpp (and a NaN, infinite or zero
//! scale). Formats without a SIMD kernel fall back to scalar in each table.

use std::sync::OnceLock;

use crate::DType;
use crate::quant;
use crate::quant::blocks::blocks_mut;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_kprefill;
#[cfg(target_arch = "x86_64")]
mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
mod avx2_mat;
#[cfg(target_arch = "x86_64")]
mod avx2_x8;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_kmat;
#[cfg(target_arch = "x86_64")]
mod avx512_mat;
pub mod mat;
#[cfg(target_arch = "aarch64")]
mod neon;
mod paths;

pub use mat::{ActRows, BlockAux, MatOut, WeightRows};
pub use paths::DotPath;

/// `(n, weight row bytes, activation row bytes) -> dot product`.
pub type VecDotFn = fn(usize, &[u8], &[u8]) -> f32;
/// `(f32 input, quantized output bytes)`.
pub type QuantizeFn = fn(&[f32], &mut [u8]);
/// A matrix kernel: every output of `weight rows × activation rows` (see [`mat`]).
pub type MatFn = fn(&WeightRows, &ActRows, &mut MatOut);
/// `(n, rows, row-major weights) -> packed weights` (see [`Kernels::pack`]).
pub type PackFn = fn(usize, usize, &[u8]) -> Vec<u8>;
/// `(n, packed weights, row, blocks, out)`: the file-layout bytes of blocks `blocks` of one
/// row of packed weights (see [`Kernels::unpack_blocks`]).
pub type UnpackFn = fn(usize, &[u8], usize, std::ops::Range<usize>, &mut [u8]);

/// A type's load-time packed layout: how to pack and unpack it, and its matrix kernel.
#[derive(Clone, Copy)]
pub(crate) struct Packing {
    /// Rows per group.
    pub group: usize,
    pub pack: PackFn,
    pub unpack: UnpackFn,
    pub mat: MatFn,
}

const N_TYPES: usize = DType::ALL.len();

/// Position of a type in [`DType::ALL`], the index of the tables.
const fn slot(t: DType) -> usize {
    let mut i = 0;
    while i < N_TYPES {
        if DType::ALL[i] as u8 == t as u8 {
            return i;
        }
        i += 1;
    }
    panic!("type missing from DType::ALL")
}

/// One instruction set's kernels.
#[derive(Clone)]
pub struct Kernels {
    isa: &'static str,
    dot: [VecDotFn; N_TYPES],
    quant: [QuantizeFn; N_TYPES],
    /// Dot products of llama.cpp's other matmul paths ([`DotPath`]), by path slot; the
    /// plain `dot` where a path does not apply to a type.
    paths: [[VecDotFn; N_TYPES]; 3],
    /// Matrix kernels by path (`VecDot` first, then the [`DotPath`] slots) and type; `None`
    /// where the table computes the product one `dot_fn` per output.
    mats: [[Option<MatFn>; N_TYPES]; 4],
    /// Load-time repacking of weights and the matrix kernel for the packed layout, by type.
    packed: [Option<Packing>; N_TYPES],
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("isa", &self.isa).finish()
    }
}

fn no_dot(_: usize, _: &[u8], _: &[u8]) -> f32 {
    panic!("vec_dot: activation-only formats (Q8_1, Q8_K) are never weights")
}

macro_rules! scalar_dot {
    ($t:ident) => {
        |n, w, x| quant::vec_dot_ref(DType::$t, n, w, x)
    };
}
macro_rules! scalar_quant {
    ($t:ident) => {
        |src, dst| quant::quantize_row(DType::$t, src, dst)
    };
}

impl Kernels {
    /// The scalar reference table (every machine).
    pub fn scalar() -> &'static Kernels {
        static T: OnceLock<Kernels> = OnceLock::new();
        T.get_or_init(|| {
            let mut k = Kernels {
                isa: "scalar",
                dot: [no_dot; N_TYPES],
                quant: [scalar_quant!(F32); N_TYPES],
                paths: [[no_dot; N_TYPES]; 3],
                mats: [[None; N_TYPES]; 4],
                packed: [None; N_TYPES],
            };
            let dots: [(DType, VecDotFn); 13] = [
                (DType::F32, scalar_dot!(F32)),
                (DType::F16, scalar_dot!(F16)),
                (DType::BF16, scalar_dot!(BF16)),
                (DType::Q4_0, scalar_dot!(Q4_0)),
                (DType::Q4_1, scalar_dot!(Q4_1)),
                (DType::Q5_0, scalar_dot!(Q5_0)),
                (DType::Q5_1, scalar_dot!(Q5_1)),
                (DType::Q8_0, scalar_dot!(Q8_0)),
                (DType::Q2_K, scalar_dot!(Q2_K)),
                (DType::Q3_K, scalar_dot!(Q3_K)),
                (DType::Q4_K, scalar_dot!(Q4_K)),
                (DType::Q5_K, scalar_dot!(Q5_K)),
                (DType::Q6_K, scalar_dot!(Q6_K)),
            ];
            for (t, f) in dots {
                k.dot[slot(t)] = f;
            }
            k.paths = [k.dot; 3];
            paths::install_scalar(&mut k);
            let quants: [(DType, QuantizeFn); 15] = [
                (DType::F32, scalar_quant!(F32)),
                (DType::F16, scalar_quant!(F16)),
                (DType::BF16, scalar_quant!(BF16)),
                (DType::Q4_0, scalar_quant!(Q4_0)),
                (DType::Q4_1, scalar_quant!(Q4_1)),
                (DType::Q5_0, scalar_quant!(Q5_0)),
                (DType::Q5_1, scalar_quant!(Q5_1)),
                (DType::Q8_0, |src, dst| {
                    quant::legacy::quantize_q8_0_act(src, blocks_mut(dst))
                }),
                (DType::Q8_1, |src, dst| {
                    quant::legacy::quantize_q8_1_act(src, blocks_mut(dst))
                }),
                (DType::Q2_K, scalar_quant!(Q2_K)),
                (DType::Q3_K, scalar_quant!(Q3_K)),
                (DType::Q4_K, scalar_quant!(Q4_K)),
                (DType::Q5_K, scalar_quant!(Q5_K)),
                (DType::Q6_K, scalar_quant!(Q6_K)),
                (DType::Q8_K, scalar_quant!(Q8_K)),
            ];
            for (t, f) in quants {
                k.quant[slot(t)] = f;
            }
            k
        })
    }

    /// The AVX2 table, if this CPU has AVX2, FMA and F16C.
    pub fn avx2() -> Option<&'static Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            static T: OnceLock<Option<Kernels>> = OnceLock::new();
            T.get_or_init(|| {
                avx2::supported().then(|| {
                    let mut k = Kernels::scalar().clone();
                    k.isa = "avx2";
                    avx2::install(&mut k);
                    avx2_kquants::install(&mut k);
                    paths::avx2::install(&mut k);
                    avx2_mat::install(&mut k);
                    k
                })
            })
            .as_ref()
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }

    /// The AVX-512 table, if this CPU has AVX-512 F, BW, VL and VNNI (plus the AVX2 set).
    pub fn avx512() -> Option<&'static Kernels> {
        #[cfg(target_arch = "x86_64")]
        {
            static T: OnceLock<Option<Kernels>> = OnceLock::new();
            T.get_or_init(|| {
                let base = Kernels::avx2()?;
                avx512::supported().then(|| {
                    let mut k = base.clone();
                    k.isa = "avx512";
                    avx512::install(&mut k);
                    avx512_mat::install(&mut k);
                    avx512_kmat::install(&mut k);
                    k
                })
            })
            .as_ref()
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    }

    /// The NEON table (every aarch64 CPU: NEON is part of the baseline).
    pub fn neon() -> Option<&'static Kernels> {
        #[cfg(target_arch = "aarch64")]
        {
            static T: OnceLock<Kernels> = OnceLock::new();
            Some(T.get_or_init(|| {
                let mut k = Kernels::scalar().clone();
                k.isa = "neon";
                neon::install(&mut k);
                k
            }))
        }
        #[cfg(not(target_arch = "aarch64"))]
        None
    }

    /// Every table mica has, by ISA name, with `None` where this CPU lacks the ISA.
    pub fn all() -> Vec<(&'static str, Option<&'static Kernels>)> {
        vec![
            ("scalar", Some(Kernels::scalar())),
            ("avx2", Kernels::avx2()),
            ("avx512", Kernels::avx512()),
            ("neon", Kernels::neon()),
        ]
    }

    /// Name of the instruction set of this table ("scalar", "avx2", "avx512", "neon").
    pub fn isa(&self) -> &'static str {
        self.isa
    }

    /// Dot product of `n` elements: `w` a row of weight type `t`, `x` the activations
    /// quantized to `t.vec_dot_type()` (with [`Kernels::quantize_act`]). Panics for the
    /// activation-only types Q8_1/Q8_K and, in debug builds, on length mismatches.
    #[inline]
    pub fn vec_dot(&self, t: DType, n: usize, w: &[u8], x: &[u8]) -> f32 {
        debug_assert_eq!(t.row_bytes(n), Some(w.len()), "{t} weights");
        debug_assert_eq!(
            t.vec_dot_type().row_bytes(n),
            Some(x.len()),
            "{t} activations"
        );
        (self.dot[slot(t)])(n, w, x)
    }

    /// The dot product llama.cpp computes for `path` on weight type `t` (the plain
    /// [`Kernels::vec_dot`] kernel where the path does not apply to `t`). Same arguments
    /// and contract as `vec_dot`; pick the path with [`DotPath::for_token`].
    #[inline]
    pub fn dot_fn(&self, path: DotPath, t: DType) -> VecDotFn {
        match path.slot() {
            Some(p) => self.paths[p][slot(t)],
            None => self.dot[slot(t)],
        }
    }

    /// Every output of a matrix product on `path`: `out(t, r) = dot_fn(path, w.dtype)` of
    /// weight row `r` and activation row `t`, bit for bit, for all `r < w.rows`,
    /// `t < x.n` (`x` quantized to `w.dtype.vec_dot_type()`, with its block data). The
    /// caller picks one path for all the tokens ([`DotPath::for_token`]).
    /// Packed weights ([`Kernels::pack`]) go to the packed kernel (their types' only path is
    /// `VecDot`).
    #[inline]
    pub fn matmul(&self, path: DotPath, w: &WeightRows, x: &ActRows, out: &mut MatOut) {
        let f = if w.packed {
            assert_eq!(path, DotPath::VecDot, "packed weights");
            self.packed[slot(w.dtype)].map(|p| p.mat)
        } else {
            self.mats[path.slot().map_or(0, |p| p + 1)][slot(w.dtype)]
        };
        mat::run(self, f, path, w, x, out)
    }

    /// Load-time repacking: `rows` rows of `n` elements of type `t` (`data`, row-major as in
    /// the file) rearranged for this table's packed kernel (groups of
    /// [`Kernels::pack_group`] rows interleaved), or `None` where the table has none for
    /// `t`. Products with the packed copy ([`WeightRows::packed`]) are bit-identical to
    /// products with `data`; the copy takes `rows` rounded up to a group's bytes.
    pub fn pack(&self, t: DType, n: usize, rows: usize, data: &[u8]) -> Option<Vec<u8>> {
        if rows == 0 {
            return None;
        }
        self.packed[slot(t)].map(|p| (p.pack)(n, rows, data))
    }

    /// Rows per group of this table's packed layout for `t` (AVX-512: 4, AVX2: 8; 1 where
    /// `t` has none).
    pub fn pack_group(&self, t: DType) -> usize {
        self.packed[slot(t)].map_or(1, |p| p.group)
    }

    /// Blocks `blocks` of row `row` of `n`-element rows packed by [`Kernels::pack`] (`data`),
    /// written to `out` in the file's layout (`blocks.len()` blocks): the bytes the row had
    /// before packing. Panics where `t` has no packed layout in this table.
    pub fn unpack_blocks(
        &self,
        t: DType,
        n: usize,
        data: &[u8],
        row: usize,
        blocks: std::ops::Range<usize>,
        out: &mut [u8],
    ) {
        let p = self.packed[slot(t)].unwrap_or_else(|| panic!("{t} has no packed layout"));
        assert_eq!(out.len(), blocks.len() * t.type_size(), "unpacked blocks");
        (p.unpack)(n, data, row, blocks, out)
    }

    /// Whether this table has a dedicated matrix kernel for `path` and `t` (otherwise
    /// [`Kernels::matmul`] runs one `dot_fn` per output).
    pub fn has_matmul(&self, path: DotPath, t: DType) -> bool {
        self.mats[path.slot().map_or(0, |p| p + 1)][slot(t)].is_some()
    }

    /// Quantizes activations `src` into format `t` (normally a `vec_dot_type()`: Q8_0, Q8_1,
    /// Q8_K, F16, BF16 or F32), byte-identical in every table. Q8_0 and Q8_1 use llama.cpp's
    /// x86 run-time quantizer ([`quant::legacy::quantize_q8_0_act`]); every other type is
    /// [`quant::quantize_row`] (the weight formats use their scalar reference quantizers).
    #[inline]
    pub fn quantize_act(&self, t: DType, src: &[f32], dst: &mut [u8]) {
        assert_eq!(t.row_bytes(src.len()), Some(dst.len()), "quantize_act {t}");
        (self.quant[slot(t)])(src, dst)
    }

    /// Replaces the dot product of `t` (used by the ISA modules).
    #[allow(dead_code)]
    fn set_dot(&mut self, t: DType, f: VecDotFn) {
        self.dot[slot(t)] = f;
    }

    /// Replaces the dot product of `t` on a batch path (used by the ISA modules).
    fn set_path_dot(&mut self, path: DotPath, t: DType, f: VecDotFn) {
        if let Some(p) = path.slot() {
            self.paths[p][slot(t)] = f;
        }
    }

    /// Installs a matrix kernel for `path` and `t` (used by the ISA modules).
    #[allow(dead_code)]
    fn set_mat(&mut self, path: DotPath, t: DType, f: MatFn) {
        self.mats[path.slot().map_or(0, |p| p + 1)][slot(t)] = Some(f);
    }

    /// Installs a packing function and its matrix kernel for `t` (used by the ISA modules).
    #[allow(dead_code)]
    fn set_packed(&mut self, t: DType, p: Packing) {
        self.packed[slot(t)] = Some(p);
    }

    /// Replaces the quantizer of `t` (used by the ISA modules).
    #[allow(dead_code)]
    fn set_quant(&mut self, t: DType, f: QuantizeFn) {
        self.quant[slot(t)] = f;
    }
}

/// The fastest table this CPU supports, detected once.
pub fn kernels() -> &'static Kernels {
    static BEST: OnceLock<&'static Kernels> = OnceLock::new();
    BEST.get_or_init(|| {
        Kernels::avx512()
            .or_else(Kernels::avx2)
            .or_else(Kernels::neon)
            .unwrap_or_else(Kernels::scalar)
    })
}
