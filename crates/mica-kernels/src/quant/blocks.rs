//! The byte layout of every block format, field for field as ggml's `ggml-common.h` lays
//! them out, so a slice of a GGUF file can be viewed as `&[Block]` without copying.
//!
//! Every struct here has alignment 1: half-precision fields are `[u8; 2]`, the f32 scale of
//! Q8_K is `[u8; 4]` and its i16 sums are `[[u8; 2]; 16]`, all little-endian. That makes
//! [`cast_blocks`] valid for any address an mmap hands us, at no cost on x86 (unaligned loads
//! are as fast as aligned ones). Sizes are checked at compile time against ggml's.
//!
//! Notation used in the layout comments: a "sub-block" is the group of elements sharing one
//! scale; element `i` of a block is the i-th weight in row order.

use std::mem::{align_of, size_of};

use crate::DType;

/// Elements in a legacy block (Q4_0 ... Q8_1).
pub const QK: usize = 32;
/// Elements in a k-quant super-block.
pub const QK_K: usize = 256;

/// Reads a little-endian IEEE half as f32 (exact: every f16 is an f32).
#[inline(always)]
pub fn f16_to_f32(h: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(h)).to_f32()
}

/// Rounds f32 to the nearest half (ties to even), as ggml's `GGML_FP32_TO_FP16`.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// A block type whose bytes may be reinterpreted from any `&[u8]`.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, no padding, and accept every bit
/// pattern (only integer and byte-array fields).
pub unsafe trait Block: Copy + 'static {
    /// The ggml type this block encodes.
    const DTYPE: DType;
}

/// The length of a byte slice is not a whole number of blocks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes is not a whole number of {dtype} blocks ({block_bytes} bytes each)")]
pub struct BlockLenError {
    pub dtype: DType,
    pub len: usize,
    pub block_bytes: usize,
}

/// Views `bytes` as blocks of `B`. Fails when the length is not a multiple of the block size.
/// Any address is fine: every block type has alignment 1.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], BlockLenError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(BlockLenError {
            dtype: B::DTYPE,
            len: bytes.len(),
            block_bytes: size,
        });
    }
    debug_assert_eq!(align_of::<B>(), 1);
    // SAFETY: `B: Block` guarantees alignment 1, no padding and no invalid bit patterns; the
    // length is a whole number of blocks and the lifetime is that of `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) })
}

/// Mutable twin of [`cast_blocks`], for quantizers writing into a byte buffer.
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> Result<&mut [B], BlockLenError> {
    let size = size_of::<B>();
    if !bytes.len().is_multiple_of(size) {
        return Err(BlockLenError {
            dtype: B::DTYPE,
            len: bytes.len(),
            block_bytes: size,
        });
    }
    debug_assert_eq!(align_of::<B>(), 1);
    // SAFETY: as in `cast_blocks`; any bit pattern written through the result is valid.
    Ok(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size)
    })
}

/// Like [`cast_blocks`] for lengths the caller has already validated (panics otherwise).
#[inline]
pub(crate) fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    match cast_blocks(bytes) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

/// Like [`cast_blocks_mut`] for lengths the caller has already validated.
#[inline]
pub(crate) fn blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    match cast_blocks_mut(bytes) {
        Ok(b) => b,
        Err(e) => panic!("{e}"),
    }
}

macro_rules! block {
    ($(#[$doc:meta])* $name:ident, $dtype:ident, $size:expr, { $($(#[$fdoc:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name { $($(#[$fdoc])* pub $f: $t),* }
        const _: () = assert!(size_of::<$name>() == $size);
        const _: () = assert!(size_of::<$name>() == DType::$dtype.type_size());
        const _: () = assert!(align_of::<$name>() == 1);
        // SAFETY: repr(C), only u8/i8 arrays (alignment 1, no padding, any bit pattern).
        unsafe impl Block for $name { const DTYPE: DType = DType::$dtype; }
    };
}

block!(
    /// Q4_0: 32 weights `d * (q - 8)`, q in 0..16. Byte `j` of `qs` holds element `j` in its
    /// low nibble and element `j + 16` in its high nibble.
    BlockQ4_0, Q4_0, 18, {
        /// f16 scale.
        d: [u8; 2],
        qs: [u8; QK / 2],
    }
);

block!(
    /// Q4_1: 32 weights `d * q + m`, q in 0..16, nibbles packed as in Q4_0.
    BlockQ4_1, Q4_1, 20, {
        /// f16 scale.
        d: [u8; 2],
        /// f16 offset (the block minimum).
        m: [u8; 2],
        qs: [u8; QK / 2],
    }
);

block!(
    /// Q5_0: 32 weights `d * (q - 16)`, q in 0..32. Low 4 bits packed as Q4_0; bit 4 of
    /// element `i` is bit `i` of the little-endian u32 `qh`.
    BlockQ5_0, Q5_0, 22, {
        /// f16 scale.
        d: [u8; 2],
        qh: [u8; 4],
        qs: [u8; QK / 2],
    }
);

block!(
    /// Q5_1: 32 weights `d * q + m`, q in 0..32, bits laid out as Q5_0.
    BlockQ5_1, Q5_1, 24, {
        /// f16 scale.
        d: [u8; 2],
        /// f16 offset.
        m: [u8; 2],
        qh: [u8; 4],
        qs: [u8; QK / 2],
    }
);

block!(
    /// Q8_0: 32 weights or activations `d * q`, q an i8.
    BlockQ8_0, Q8_0, 34, {
        /// f16 scale.
        d: [u8; 2],
        qs: [i8; QK],
    }
);

block!(
    /// Q8_1 (activations only): Q8_0 plus `s = d * sum(q)` (rounded to f16), the term that
    /// carries the weight offset `m` of Q4_1/Q5_1 through a dot product.
    BlockQ8_1, Q8_1, 36, {
        /// f16 scale.
        d: [u8; 2],
        /// f16 `d * sum(qs)`.
        s: [u8; 2],
        qs: [i8; QK],
    }
);

block!(
    /// Q2_K: 256 weights in 16 sub-blocks of 16, weight `d * sc * q - dmin * m`, q in 0..4.
    /// `scales[k]` holds sub-block k's scale (low nibble) and min (high nibble). Element
    /// `128*h + 32*j + l` (h < 2, j < 4, l < 32) is bits `2j..2j+2` of `qs[32*h + l]` and
    /// belongs to sub-block `8*h + 2*j + l/16`.
    BlockQ2K, Q2_K, 84, {
        scales: [u8; QK_K / 16],
        qs: [u8; QK_K / 4],
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
    }
);

block!(
    /// Q3_K: 256 weights in 16 sub-blocks of 16, weight `d * (sc - 32) * q`, q in -4..4.
    /// Low two bits of q are laid out as Q2_K's; the third bit of element `128*h + 32*j + l`
    /// is bit `4*h + j` of `hmask[l]`, and a *clear* bit subtracts 4. The 16 six-bit scales
    /// are packed in 12 bytes: low nibbles of sub-blocks 0..8 in the low nibbles of bytes
    /// 0..8, of 8..16 in their high nibbles; the top two bits of sub-block k are bits
    /// `2*(k/4)..` of byte `8 + k%4`.
    BlockQ3K, Q3_K, 110, {
        hmask: [u8; QK_K / 8],
        qs: [u8; QK_K / 4],
        scales: [u8; 12],
        /// f16 super-block scale.
        d: [u8; 2],
    }
);

block!(
    /// Q4_K: 256 weights in 8 sub-blocks of 32, weight `d * sc * q - dmin * m`, q in 0..16.
    /// Element `64*k + l` (l < 32) is the low nibble of `qs[32*k + l]` (sub-block 2k),
    /// element `64*k + 32 + l` its high nibble (sub-block 2k+1). Six-bit scales and mins,
    /// 12 bytes: for k < 4, sc = `scales[k] & 63`, m = `scales[k+4] & 63`; for k >= 4,
    /// sc = `scales[k+4] & 15 | (scales[k-4] >> 6) << 4`, m = `scales[k+4] >> 4 | (scales[k] >> 6) << 4`.
    BlockQ4K, Q4_K, 144, {
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
        scales: [u8; 12],
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// Q5_K: Q4_K plus a fifth bit, q in 0..32: bit 4 of element `64*k + l` is bit `2k` of
    /// `qh[l]`, of element `64*k + 32 + l` bit `2k + 1`.
    BlockQ5K, Q5_K, 176, {
        /// f16 super-block scale of the scales.
        d: [u8; 2],
        /// f16 super-block scale of the mins.
        dmin: [u8; 2],
        scales: [u8; 12],
        qh: [u8; QK_K / 8],
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// Q6_K: 256 weights in 16 sub-blocks of 16, weight `d * sc * (q - 32)`, q in 0..64, sc
    /// an i8. For half h < 2 and l < 32, with `L = ql[64h..]`, `H = qh[32h..]`: element
    /// `128h + l` is `L[l] & 15 | (H[l] & 3) << 4`, `+32` is `L[l+32] & 15 | (H[l] >> 2 & 3) << 4`,
    /// `+64` is `L[l] >> 4 | (H[l] >> 4 & 3) << 4`, `+96` is `L[l+32] >> 4 | (H[l] >> 6) << 4`.
    BlockQ6K, Q6_K, 210, {
        ql: [u8; QK_K / 2],
        qh: [u8; QK_K / 4],
        /// i8 sub-block scales.
        scales: [i8; QK_K / 16],
        /// f16 super-block scale.
        d: [u8; 2],
    }
);

block!(
    /// Q8_K (activations only): 256 values `d * q` with an f32 scale and the sum of each
    /// group of 16 quants, which the k-quant dot products use for their min terms.
    BlockQ8K, Q8_K, 292, {
        /// f32 scale, little-endian.
        d: [u8; 4],
        qs: [i8; QK_K],
        /// i16 sums of `qs[16*k..16*k+16]`, little-endian.
        bsums: [[u8; 2]; QK_K / 16],
    }
);

impl BlockQ8K {
    /// The f32 scale.
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    /// Sum of the quants of group `k` (16 values).
    #[inline(always)]
    pub fn bsum(&self, k: usize) -> i16 {
        i16::from_le_bytes(self.bsums[k])
    }
}

/// Unpacks the six-bit (scale, min) pair of sub-block `j` of a Q4_K/Q5_K block.
#[inline(always)]
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Unpacks the 16 six-bit Q3_K scales, already offset by -32 (range -32..32).
#[inline(always)]
pub fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (k, o) in out.iter_mut().enumerate() {
        let low = if k < 8 { s[k] & 0xF } else { s[k - 8] >> 4 };
        let high = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The i-quants, the ternary formats and MXFP4 (ggml-common.h). The grids and value tables
// they index are in `iq_grids`; `iquants.rs` decodes them.

block!(
    /// IQ2_XXS: 256 weights in 8 groups of 32. Group `g` is the two little-endian u32 at
    /// `qs[8g..8g+8]`: bytes 0..4 of the first index four rows of `IQ2XXS_GRID` (8 values
    /// each); the second holds four 7-bit sign indices (bits `7l..7l+7`, into
    /// `KSIGNS_IQ2XS`) and the 4-bit scale `ls` in bits 28..32. Weight
    /// `d · (0.5 + ls) · 0.25 · grid · sign`.
    BlockIQ2XXS, IQ2_XXS, 66, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; QK_K / 4],
    }
);

block!(
    /// IQ2_XS: 256 weights in 32 groups of 8; u16 `qs[l]` (little-endian) is a 9-bit index
    /// into `IQ2XS_GRID` and a 7-bit sign index; `scales[g]` holds the 4-bit scales of the
    /// two 16-element halves of group-of-32 `g` (low nibble first).
    BlockIQ2XS, IQ2_XS, 74, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; QK_K / 4],
        scales: [u8; QK_K / 32],
    }
);

block!(
    /// IQ2_S: 256 weights; 10-bit indices into `IQ2S_GRID` (low 8 bits in `qs[0..32]`, high
    /// two bits in `qh`, two per index), explicit sign bytes in `qs[32..64]`, 4-bit scales
    /// per 16 elements as IQ2_XS.
    BlockIQ2S, IQ2_S, 82, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; QK_K / 4],
        qh: [u8; QK_K / 32],
        scales: [u8; QK_K / 32],
    }
);

block!(
    /// IQ3_XXS: 256 weights; `qs[0..64]` index `IQ3XXS_GRID` (4 values each), then for each
    /// group of 32 a little-endian u32 of four 7-bit sign indices and the 4-bit scale (bits
    /// 28..32). Weight `d · (0.5 + ls) · 0.5 · grid · sign`.
    BlockIQ3XXS, IQ3_XXS, 98, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; 3 * QK_K / 8],
    }
);

block!(
    /// IQ3_S: 256 weights; 9-bit indices into `IQ3S_GRID` (low 8 bits in `qs`, ninth bit in
    /// `qh`), one sign bit per weight, 4-bit scales per 32 elements. Weight
    /// `d · (1 + 2·ls) · grid · sign`.
    BlockIQ3S, IQ3_S, 110, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; QK_K / 4],
        qh: [u8; QK_K / 32],
        signs: [u8; QK_K / 8],
        scales: [u8; QK_K / 64],
    }
);

block!(
    /// IQ1_S: 256 weights in 8 groups of 32; 11-bit indices into `IQ1S_GRID` (values -1, 0,
    /// 1: low 8 bits in `qs`, 3 high bits in the little-endian u16 `qh[g]`), whose bits
    /// 12..15 hold the 3-bit scale and bit 15 the sign of the shift `±IQ1S_DELTA`. Weight
    /// `d · (2·ls + 1) · (grid ± 0.125)`.
    BlockIQ1S, IQ1_S, 50, {
        /// f16 super-block scale.
        d: [u8; 2],
        qs: [u8; QK_K / 8],
        qh: [u8; QK_K / 16],
    }
);

block!(
    /// IQ1_M: IQ1_S's grid with 3-bit scales per 16 elements and a shift sign per 8; the f16
    /// super-block scale is spread over the top nibbles of the four u16 of `scales`.
    BlockIQ1M, IQ1_M, 56, {
        qs: [u8; QK_K / 8],
        qh: [u8; QK_K / 16],
        scales: [u8; QK_K / 32],
    }
);

block!(
    /// IQ4_NL: 32 weights `d · KVALUES_IQ4NL[q]`, nibbles packed as Q4_0.
    BlockIQ4NL, IQ4_NL, 18, {
        /// f16 scale.
        d: [u8; 2],
        qs: [u8; QK / 2],
    }
);

block!(
    /// IQ4_XS: 256 weights in 8 sub-blocks of 32, `d · (ls - 32) · KVALUES_IQ4NL[q]`; the
    /// 6-bit `ls` of sub-block `j` is nibble `j % 2` of `scales_l[j / 2]` plus bits `2j..2j+2`
    /// of the little-endian u16 `scales_h` on top; nibbles packed as Q4_0 per sub-block.
    BlockIQ4XS, IQ4_XS, 136, {
        /// f16 super-block scale.
        d: [u8; 2],
        scales_h: [u8; 2],
        scales_l: [u8; QK_K / 64],
        qs: [u8; QK_K / 2],
    }
);

block!(
    /// TQ1_0: 256 ternary weights `d · (t - 1)`, t in 0..3, five per byte of `qs` and four
    /// per byte of `qh` in base 3 as a fixed-point fraction (digit `l` of byte `q` is
    /// `((q · 3^l) mod 256) · 3 >> 8`).
    BlockTQ1_0, TQ1_0, 54, {
        qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
        qh: [u8; QK_K / 64],
        /// f16 scale.
        d: [u8; 2],
    }
);

block!(
    /// TQ2_0: 256 ternary weights `d · (t - 1)`, t in 0..3 (3 is read as 2), two bits each:
    /// element `128h + 32l + m` is bits `2l..2l+2` of `qs[32h + m]`.
    BlockTQ2_0, TQ2_0, 66, {
        qs: [u8; QK_K / 4],
        /// f16 scale.
        d: [u8; 2],
    }
);

block!(
    /// MXFP4: 32 weights `2^(e-128) · KVALUES_MXFP4[q]` (E2M1 values, doubled, with a halved
    /// E8M0 scale), nibbles packed as Q4_0.
    BlockMXFP4, MXFP4, 17, {
        /// E8M0 shared exponent.
        e: u8,
        qs: [u8; QK / 2],
    }
);

/// ggml's `GGML_E8M0_TO_FP32_HALF`: `2^(e - 128)` as f32 (subnormal for e < 2; e = 255 too
/// is the power of two, as in ggml, not NaN).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}
