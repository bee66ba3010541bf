//! Run-time kernel dispatch by instruction-set tier: one [`Kernels`] table of dot products,
//! activation quantizers and matrix kernels per tier, the best one chosen once at start-up
//! from `is_x86_feature_detected!` (the ggml approach; a stock `cargo build` without
//! `-C target-cpu` still runs the SIMD code).
//!
//! # The tree
//!
//! ```text
//! simd/
//!   mod.rs            the table (Kernels), the tiers (Tier), selection (kernels())
//!   scalar.rs         scalar tier: ggml's reference numerics; every table starts from it
//!   paths.rs          DotPath: which llama.cpp route computes an output, and its float steps
//!   mat.rs            matrix-kernel types (WeightRows, ActRows, MatOut), one-dot-per-output
//!   coverage.rs       which tier fills each (type, slot), read from the built tables
//!   x86/avx2/         AVX2 + FMA + F16C: dot, kquants, quantize, mat, packed, paths, kprefill
//!   x86/avx512/       AVX-512 F/BW/VL + VNNI: dot, mat, lblock, packed, kunpack, kmat, kgemm, kpacked
//!   aarch64/neon.rs   NEON dot products
//! ```
//!
//! Each tier has exactly one `install(&mut Kernels)`, which lists every kernel the tier puts
//! in the table; a tier's table is a copy of its base tier's with that `install` applied:
//! scalar → avx2 → avx512 (overriding the AVX2 tier's hottest kernels, keeping the rest), and
//! scalar → neon on aarch64. Every slot records the tier that filled it, so [`coverage()`]
//! lists from the tables themselves which (type, slot) has a dedicated kernel in each tier and
//! which falls back to a lower tier's (ggml's `arch-fallback.h`, derived instead of written).
//!
//! The slots, per type: the dot product (`vec_dot`, [`Kernels::vec_dot`]); the dot product of
//! each of llama.cpp's batch paths ([`DotPath`], [`Kernels::dot_fn`]; the plain dot where a
//! path does not apply); a matrix kernel per path ([`Kernels::matmul`]; without one, the table
//! computes one `dot_fn` per output); a load-time packed layout with its matrix kernel
//! ([`Kernels::pack`]); and the activation quantizer ([`Kernels::quantize_act`]).
//!
//! # Numerics
//!
//! mica has to reproduce llama.cpp's greedy tokens, and small models are chaotic enough that
//! a handful of differently rounded activations changes them. So the run-time paths follow
//! llama.cpp's x86 build (AVX2/AVX-512 VNNI, GCC with FP contraction) operation by operation:
//! - Activation quantizers Q8_0/Q8_1 are the x86 `quantize_row_q8_0/1` in *every* table
//!   (the scalar one included, [`quantize_q8_0_act`]), byte-identical across tables. Q8_K,
//!   F16 and BF16 are llama.cpp's reference conversions.
//! - Dot products of the SIMD tables keep llama.cpp's float structure: per block the integer
//!   products summed into eight i32 lanes (lane j = elements 4j..4j+3 of each 32), those
//!   lanes scaled into eight f32 accumulators with one FMA per block, the separate min/offset
//!   terms accumulated as llama.cpp does, then its horizontal sum. The AVX2, AVX-512 and NEON
//!   tables give bit-identical results; `tests/llama_exact.rs` pins them to a step-by-step
//!   scalar model of the x86 code.
//! - The scalar table keeps ggml's generic reference dots
//!   ([`quant::vec_dot_ref`](crate::quant::vec_dot_ref)), which
//!   differ from the SIMD ones only in float rounding order (integer sums are exact).
//! - Where llama.cpp computes a product by another route than `ggml_vec_dot_*` (repacked
//!   Q4_K, the tiled k-quant matmul for batches of 8+ tokens), [`Kernels::dot_fn`] gives its
//!   arithmetic for the [`DotPath`] that [`DotPath::for_token`] picks (`paths.rs`); these
//!   are bit-identical in every table, the scalar one included.
//! - One path is mica's own, off by default: [`DotPath::PerBlock`], the legacy formats'
//!   prompt batches with one FMA per block (`paths.rs`, [`set_llama_exact`]); its kernel
//!   (`x86/avx512/lblock.rs`) and the scalar reference agree bit for bit.
//!
//! Matrix kernels ([`Kernels::matmul`], `mat.rs`) compute whole `tokens × rows` tiles per
//! call with the same per-output arithmetic as `dot_fn`: `x86/avx512/mat.rs` (legacy formats,
//! four rows × up to four tokens, also over the load-time packed layout of
//! `x86/avx512/packed.rs`, [`Kernels::pack`]), `x86/avx512/kmat.rs` (k-quants, 16 outputs per
//! micro-kernel on the batch paths, also over Q4_K's packed layout of
//! `x86/avx512/kpacked.rs`), `x86/avx2/mat.rs` and `x86/avx2/paths.rs` (four rows per
//! step), `x86/avx2/packed.rs` (eight packed rows in the lanes) and `x86/avx2/kprefill.rs`
//! (k-quant prefill); the scalar and NEON tables, and any (type, path) without a kernel, run
//! one `dot_fn` per output.
//!
//! Quantized activations lie in -127..=127 for every finite block of normal magnitude, which
//! the sign trick of the 8-bit products relies on; blocks with NaN, infinities or only
//! subnormal values get -128 quants exactly as in llama.cpp (and a NaN, infinite or zero
//! scale).
//!
//! [`quantize_q8_0_act`]: crate::quant::legacy::quantize_q8_0_act

use std::sync::OnceLock;

use crate::DType;

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod coverage;
pub mod mat;
mod paths;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use coverage::{Cell, Coverage, Row, Slot, TierStatus, coverage};
pub use mat::{ActRows, BlockAux, MatOut, WeightRows};
pub use paths::{
    DotPath, PER_BLOCK_MIN_TOKENS, is_legacy, llama_exact, per_block_enabled, set_llama_exact,
};

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
    /// The kernel of [`DotPath::VecDot`].
    pub mat: MatFn,
    /// The kernels of the batch paths, by [`DotPath::slot`] (`None`: packed weights of this
    /// type never take that path).
    pub paths: [Option<MatFn>; 4],
}

/// An instruction-set tier: one [`Kernels`] table each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// ggml's reference numerics; every machine.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64); extends scalar.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI with the AVX2 set (x86-64); extends avx2.
    Avx512,
    /// NEON (aarch64, part of its baseline); extends scalar.
    Neon,
}

impl Tier {
    /// Every tier, each after the tier it extends.
    pub const ALL: [Tier; 4] = [Tier::Scalar, Tier::Avx2, Tier::Avx512, Tier::Neon];

    /// The tier's name: "scalar", "avx2", "avx512" or "neon".
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::Avx512 => "avx512",
            Tier::Neon => "neon",
        }
    }

    /// The tier whose table this tier's starts from (`None` for scalar).
    pub fn base(self) -> Option<Tier> {
        match self {
            Tier::Scalar => None,
            Tier::Avx2 | Tier::Neon => Some(Tier::Scalar),
            Tier::Avx512 => Some(Tier::Avx2),
        }
    }

    /// Whether this build has the tier's kernels (they exist for one architecture each).
    pub fn built(self) -> bool {
        match self {
            Tier::Scalar => true,
            Tier::Avx2 | Tier::Avx512 => cfg!(target_arch = "x86_64"),
            Tier::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// Whether this CPU can run the tier's kernels (false where the tier is not built).
    pub fn supported(self) -> bool {
        match self {
            Tier::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => x86::avx2::supported(),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => x86::avx2::supported() && x86::avx512::supported(),
            #[cfg(target_arch = "aarch64")]
            Tier::Neon => true,
            #[allow(unreachable_patterns)] // Every tier is built on no architecture.
            _ => false,
        }
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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

/// Index of a path in [`Kernels`]' matrix-kernel table (`VecDot` first).
fn mat_slot(path: DotPath) -> usize {
    path.slot().map_or(0, |p| p + 1)
}

/// The tier that filled each slot of a table (`None`: empty), laid out as the slots.
#[derive(Clone, Default)]
struct Origins {
    dot: [Option<Tier>; N_TYPES],
    quant: [Option<Tier>; N_TYPES],
    paths: [[Option<Tier>; N_TYPES]; 4],
    mats: [[Option<Tier>; N_TYPES]; 5],
    packed: [Option<Tier>; N_TYPES],
}

/// One tier's kernels.
#[derive(Clone)]
pub struct Kernels {
    tier: Tier,
    dot: [VecDotFn; N_TYPES],
    quant: [QuantizeFn; N_TYPES],
    /// Dot products of llama.cpp's other matmul paths ([`DotPath`]), by path slot; `None`
    /// where a path does not apply to a type (its `dot_fn` is the plain `dot`).
    paths: [[Option<VecDotFn>; N_TYPES]; 4],
    /// Matrix kernels by path (`VecDot` first, then the [`DotPath`] slots) and type; `None`
    /// where the table computes the product one `dot_fn` per output.
    mats: [[Option<MatFn>; N_TYPES]; 5],
    /// Load-time repacking of weights and the matrix kernel for the packed layout, by type.
    packed: [Option<Packing>; N_TYPES],
    /// Which tier filled each of the slots above.
    origin: Origins,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels").field("tier", &self.tier).finish()
    }
}

fn no_dot(_: usize, _: &[u8], _: &[u8]) -> f32 {
    panic!("vec_dot: activation-only formats (Q8_1, Q8_K) are never weights")
}

fn no_quant(_: &[f32], _: &mut [u8]) {
    panic!("quantize_act: a type without a quantizer")
}

/// Records that `tier` filled a slot, which it may do once: each kernel is listed once in its
/// tier's `install`.
fn claim(origin: &mut Option<Tier>, tier: Tier) {
    assert_ne!(
        *origin,
        Some(tier),
        "{tier} installs two kernels in one slot"
    );
    *origin = Some(tier);
}

impl Kernels {
    /// A table with no kernels, for the scalar tier to fill.
    fn empty() -> Kernels {
        Kernels {
            tier: Tier::Scalar,
            dot: [no_dot; N_TYPES],
            quant: [no_quant; N_TYPES],
            paths: [[None; N_TYPES]; 4],
            mats: [[None; N_TYPES]; 5],
            packed: [None; N_TYPES],
            origin: Origins::default(),
        }
    }

    /// Builds `tier`'s table: its base tier's table (for scalar an empty one) with the tier's
    /// `install` applied; `None` where this build lacks the tier. It does not look at the CPU,
    /// so the table may hold kernels this CPU cannot run: [`Kernels::get`] publishes one only
    /// after the feature check, and [`coverage()`] only reads where its slots came from.
    fn build(tier: Tier) -> Option<Kernels> {
        let mut k = match tier.base() {
            Some(base) => Kernels::build(base)?,
            None => Kernels::empty(),
        };
        k.tier = tier;
        match tier {
            Tier::Scalar => scalar::install(&mut k),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx2 => x86::avx2::install(&mut k),
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512 => x86::avx512::install(&mut k),
            #[cfg(target_arch = "aarch64")]
            Tier::Neon => aarch64::neon::install(&mut k),
            #[allow(unreachable_patterns)] // Every tier is built on no architecture.
            _ => return None,
        }
        Some(k)
    }

    /// `tier`'s table, if this CPU can run it (built on first use).
    pub fn get(tier: Tier) -> Option<&'static Kernels> {
        static TABLES: [OnceLock<Option<Kernels>>; Tier::ALL.len()] =
            [const { OnceLock::new() }; Tier::ALL.len()];
        TABLES[tier as usize]
            .get_or_init(|| {
                if tier.supported() {
                    Kernels::build(tier)
                } else {
                    None
                }
            })
            .as_ref()
    }

    /// The scalar reference table (every machine).
    pub fn scalar() -> &'static Kernels {
        Kernels::get(Tier::Scalar).expect("every build has the scalar tier")
    }

    /// The AVX2 table, if this CPU has AVX2, FMA and F16C.
    pub fn avx2() -> Option<&'static Kernels> {
        Kernels::get(Tier::Avx2)
    }

    /// The AVX-512 table, if this CPU has AVX-512 F, BW, VL and VNNI (plus the AVX2 set).
    pub fn avx512() -> Option<&'static Kernels> {
        Kernels::get(Tier::Avx512)
    }

    /// The NEON table (every aarch64 CPU: NEON is part of the baseline).
    pub fn neon() -> Option<&'static Kernels> {
        Kernels::get(Tier::Neon)
    }

    /// Every table mica has, by ISA name, with `None` where this CPU lacks the ISA.
    pub fn all() -> Vec<(&'static str, Option<&'static Kernels>)> {
        Tier::ALL
            .iter()
            .map(|&t| (t.name(), Kernels::get(t)))
            .collect()
    }

    /// Name of the instruction set of this table ("scalar", "avx2", "avx512", "neon").
    pub fn isa(&self) -> &'static str {
        self.tier.name()
    }

    /// The tier of this table.
    pub fn tier(&self) -> Tier {
        self.tier
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
            Some(p) => self.paths[p][slot(t)].unwrap_or(self.dot[slot(t)]),
            None => self.dot[slot(t)],
        }
    }

    /// Every output of a matrix product on `path`: `out(t, r) = dot_fn(path, w.dtype)` of
    /// weight row `r` and activation row `t`, bit for bit, for all `r < w.rows`,
    /// `t < x.n` (`x` quantized to `w.dtype.vec_dot_type()`, with its block data). The
    /// caller picks one path for all the tokens ([`DotPath::for_token`]).
    /// Packed weights ([`Kernels::pack`]) go to the packed layout's kernel of `path` (the
    /// legacy formats' paths are `VecDot` and, on AVX-512, `PerBlock`; packed Q4_K has one
    /// per path).
    #[inline]
    pub fn matmul(&self, path: DotPath, w: &WeightRows, x: &ActRows, out: &mut MatOut) {
        let f = if w.packed {
            let p = self.packed[slot(w.dtype)].expect("packed weights of a type with a layout");
            match path.slot() {
                None => Some(p.mat),
                Some(s) => {
                    let f = p.paths[s];
                    assert!(f.is_some(), "packed {} weights on {path:?}", w.dtype);
                    f
                }
            }
        } else {
            self.mats[mat_slot(path)][slot(w.dtype)]
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

    /// Whether this table has a packed layout for `t` ([`Kernels::pack`] returns `Some` for
    /// every non-empty matrix of that type).
    pub fn has_packed(&self, t: DType) -> bool {
        self.packed[slot(t)].is_some()
    }

    /// Rows per group of this table's packed layout for `t` (legacy formats: AVX-512 4,
    /// AVX2 8; Q4_K on AVX-512: 16; 1 where `t` has none).
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
        self.mats[mat_slot(path)][slot(t)].is_some()
    }

    /// Quantizes activations `src` into format `t` (normally a `vec_dot_type()`: Q8_0, Q8_1,
    /// Q8_K, F16, BF16 or F32), byte-identical in every table. Q8_0 and Q8_1 use llama.cpp's
    /// x86 run-time quantizer ([`crate::quant::legacy::quantize_q8_0_act`]); every other type is
    /// [`crate::quant::quantize_row`] (the weight formats use their scalar reference quantizers).
    #[inline]
    pub fn quantize_act(&self, t: DType, src: &[f32], dst: &mut [u8]) {
        assert_eq!(t.row_bytes(src.len()), Some(dst.len()), "quantize_act {t}");
        (self.quant[slot(t)])(src, dst)
    }

    // The setters of the tiers' `install` functions: each records this table's tier as the
    // slot's origin.

    /// Sets the dot product of `t`.
    fn set_dot(&mut self, t: DType, f: VecDotFn) {
        self.dot[slot(t)] = f;
        claim(&mut self.origin.dot[slot(t)], self.tier);
    }

    /// Sets the dot product of `t` on a batch path (not `VecDot`: that is [`Self::set_dot`]).
    fn set_path_dot(&mut self, path: DotPath, t: DType, f: VecDotFn) {
        let p = path.slot().expect("VecDot's kernel is the plain dot");
        self.paths[p][slot(t)] = Some(f);
        claim(&mut self.origin.paths[p][slot(t)], self.tier);
    }

    /// Sets the matrix kernel for `path` and `t`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn set_mat(&mut self, path: DotPath, t: DType, f: MatFn) {
        self.mats[mat_slot(path)][slot(t)] = Some(f);
        claim(&mut self.origin.mats[mat_slot(path)][slot(t)], self.tier);
    }

    /// Sets the packed layout and its matrix kernel for `t`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn set_packed(&mut self, t: DType, p: Packing) {
        self.packed[slot(t)] = Some(p);
        claim(&mut self.origin.packed[slot(t)], self.tier);
    }

    /// Sets the activation quantizer of `t`.
    fn set_quant(&mut self, t: DType, f: QuantizeFn) {
        self.quant[slot(t)] = f;
        claim(&mut self.origin.quant[slot(t)], self.tier);
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
