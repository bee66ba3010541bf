//! Plain float element types F32, F16 and BF16 (little-endian in memory): conversion to and
//! from f32 as ggml does it (`GGML_FP32_TO_FP16` rounds to nearest even; BF16 rounds to
//! nearest even and quiets NaNs, `ggml_compute_fp32_to_bf16`; widening is exact), and scalar
//! dot products that accumulate f32 products in one f32 sum, in order.

/// BF16 bits to f32: the 16 bits become the high half of the f32.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to BF16 bits: NaN stays NaN (forced quiet), everything else rounds to nearest even.
/// Subnormals are kept (current ggml; older versions flushed them).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[inline(always)]
fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

#[inline(always)]
fn bf16_at(b: &[u8]) -> f32 {
    bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

#[inline(always)]
fn f32_at(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

pub fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *y = f32_at(b);
    }
}

pub fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = f16_at(b);
    }
}

pub fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *y = bf16_at(b);
    }
}

pub fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

pub fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
    }
}

pub fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

pub fn vec_dot_f32(w: &[u8], x: &[u8]) -> f32 {
    w.chunks_exact(4)
        .zip(x.chunks_exact(4))
        .fold(0.0f32, |s, (a, b)| s + f32_at(a) * f32_at(b))
}

pub fn vec_dot_f16(w: &[u8], x: &[u8]) -> f32 {
    w.chunks_exact(2)
        .zip(x.chunks_exact(2))
        .fold(0.0f32, |s, (a, b)| s + f16_at(a) * f16_at(b))
}

pub fn vec_dot_bf16(w: &[u8], x: &[u8]) -> f32 {
    w.chunks_exact(2)
        .zip(x.chunks_exact(2))
        .fold(0.0f32, |s, (a, b)| s + bf16_at(a) * bf16_at(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
    }
}
