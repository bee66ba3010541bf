//! Many `expf` at once, each bit-identical to the C library's `expf`.
//!
//! llama.cpp's attention for a single query row (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`)
//! calls libm's `expf` once per cached position and query head; mica follows that arithmetic,
//! so at a few thousand cached tokens those calls are a fifth of a decode step. This module
//! computes a whole slice of them in SIMD lanes with the algorithm glibc (2.28 and later) runs
//! on CPUs with FMA and AVX2 (`__expf_fma`, from Arm's optimized-routines):
//!
//! ```text
//! xd = f64(x);  kd = fma(N/ln2, xd, 1.5·2^52)          (N = 32 table entries)
//! r  = fma(N/ln2, xd, -(kd - 1.5·2^52))                 (the reduced argument, |r| ≤ 1/2)
//! s  = f64::from_bits(T[ki mod 32] + (ki << 47))        (ki = kd's bits: 2^(ki/32))
//! y  = fma(fma(C0, r, C1), r·r, fma(C2, r, 1)) · s;     result f32(y)
//! ```
//!
//! Every step is one IEEE double operation, so the lanes give exactly what the scalar code
//! does. Arguments with `|x| ≥ 88` (or infinite, or NaN: overflow and underflow handling) go
//! to libm itself. Since another C library (or an older glibc, or a CPU without FMA, where
//! glibc picks its non-fused variant) computes `expf` differently, the SIMD path is used only
//! after it has agreed with this process's `expf` on a sample of arguments; otherwise
//! [`expf_slice`] calls `expf` for each element.

use std::sync::OnceLock;

/// `2^(i/32)` with `i << 47` subtracted from its bits (glibc's `__exp2f_data.tab`).
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// 32/ln 2.
const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// 1.5·2^52: adding it rounds to an integer, kept in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// The polynomial for `2^(r/32)`, scaled.
const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
/// Arguments whose top bits (exponent and three mantissa bits) exceed this, `|x| ≥ 88`,
/// are left to libm.
const ABSTOP_MAX: u32 = 0x42a;

/// Whether `x` is one the lanes leave to libm.
#[inline(always)]
fn special(x: f32) -> bool {
    (x.to_bits() >> 20) & 0x7ff > ABSTOP_MAX
}

/// The scalar model of one lane: glibc's `__expf_fma` for `|x| < 88`, libm itself beyond.
pub fn expf_ref(x: f32) -> f32 {
    if special(x) {
        return x.exp();
    }
    let xd = x as f64;
    let kd = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(TAB[(ki & 31) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let y = z.mul_add(r * r, C2.mul_add(r, 1.0));
    (y * s) as f32
}

/// `x[i] = expf(x[i])` in place for every element, each exactly as this process's libm
/// `expf` computes it.
pub fn expf_slice(x: &mut [f32]) {
    (pick())(x)
}

/// An in-place implementation of [`expf_slice`].
pub type ExpfFn = fn(&mut [f32]);

fn libm_each(x: &mut [f32]) {
    for v in x {
        *v = v.exp();
    }
}

fn ref_each(x: &mut [f32]) {
    for v in x {
        *v = expf_ref(*v);
    }
}

fn pick() -> ExpfFn {
    static F: OnceLock<ExpfFn> = OnceLock::new();
    *F.get_or_init(|| {
        let candidates = all();
        for (_, f, ok) in candidates.into_iter().rev() {
            if ok && agrees_with_libm(f) {
                return f;
            }
        }
        libm_each
    })
}

/// Whether `f` gives libm's `expf` bits on a spread of arguments (both signs, every binade
/// the lanes handle, the edges of the libm range).
fn agrees_with_libm(f: ExpfFn) -> bool {
    let mut xs: Vec<f32> = Vec::with_capacity(4200);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..4096u32 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // Uniform over the bit patterns below 0x42b00000 (|x| < 88), either sign.
        let bits = ((seed as u32) % 0x42b0_0000) | ((i & 1) << 31);
        xs.push(f32::from_bits(bits));
    }
    xs.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        88.0,
        -88.0,
        87.9,
        -103.0,
        -104.0,
        89.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e-30,
        -1e-30,
    ]);
    let mut got = xs.clone();
    f(&mut got);
    xs.iter()
        .zip(&got)
        .all(|(x, g)| x.exp().to_bits() == g.to_bits())
}

/// The implementations by name, for tests: `(name, function, supported here)`. The last
/// supported one that agrees with libm is what [`expf_slice`] uses.
#[doc(hidden)]
pub fn all() -> Vec<(&'static str, ExpfFn, bool)> {
    #[allow(unused_mut)]
    let mut v: Vec<(&'static str, ExpfFn, bool)> = vec![("scalar", ref_each, true)];
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        let avx512 = std::is_x86_feature_detected!("avx512f");
        // SAFETY: called only when the flag says the CPU has the features.
        v.push(("avx2", |x| unsafe { x86::expf_avx2(x) }, avx2));
        v.push(("avx512", |x| unsafe { x86::expf_avx512(x) }, avx512));
    }
    v
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{ABSTOP_MAX, C0, C1, C2, INV_LN2_N, SHIFT, TAB, expf_ref};
    use std::arch::x86_64::*;

    /// Four lanes of the model in f64: the f32 results.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn lanes4(x: __m128) -> __m128 {
        let c = _mm256_set1_pd;
        let xd = _mm256_cvtps_pd(x);
        let kd = _mm256_fmadd_pd(c(INV_LN2_N), xd, c(SHIFT));
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, c(SHIFT));
        let r = _mm256_fmsub_pd(c(INV_LN2_N), xd, kd);
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: every index is below 32, inside TAB.
        let t = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr() as *const i64, idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(c(C0), r, c(C1));
        let y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r), _mm256_fmadd_pd(c(C2), r, c(1.0)));
        _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
    }

    /// Lanes left to libm: a bit per lane of `x` whose top bits exceed [`ABSTOP_MAX`].
    #[inline]
    #[target_feature(enable = "avx2")]
    fn specials8(x: __m256) -> i32 {
        let top = _mm256_and_si256(
            _mm256_srli_epi32::<20>(_mm256_castps_si256(x)),
            _mm256_set1_epi32(0x7ff),
        );
        let big = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(ABSTOP_MAX as i32));
        _mm256_movemask_ps(_mm256_castsi256_ps(big))
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn expf_avx2(x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            let v = unsafe { _mm256_loadu_ps(p.add(i)) };
            let lo = lanes4(_mm256_castps256_ps128(v));
            let hi = lanes4(_mm256_extractf128_ps::<1>(v));
            let mut special = specials8(v);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(p.add(i), _mm256_set_m128(hi, lo)) };
            if special != 0 {
                // The inputs were overwritten in memory; the vector still holds them.
                let mut lanes = [0f32; 8];
                // SAFETY: 8 floats into an 8-float array.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
                while special != 0 {
                    let l = special.trailing_zeros() as usize;
                    x[i + l] = lanes[l].exp();
                    special &= special - 1;
                }
            }
            i += 8;
        }
        for v in &mut x[i..] {
            *v = expf_ref(*v);
        }
    }

    /// Eight lanes of the model in f64 (AVX-512): the f32 results.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn lanes8(x: __m256) -> __m256 {
        let c = _mm512_set1_pd;
        let xd = _mm512_cvtps_pd(x);
        let kd = _mm512_fmadd_pd(c(INV_LN2_N), xd, c(SHIFT));
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, c(SHIFT));
        let r = _mm512_fmsub_pd(c(INV_LN2_N), xd, kd);
        // The table in four registers: two two-register permutes and a blend on bit 4.
        let tab = |k: usize| {
            // SAFETY: TAB has 32 entries; k ≤ 3 reads 8 of them.
            unsafe { _mm512_loadu_si512(TAB.as_ptr().add(8 * k) as *const _) }
        };
        let lo = _mm512_permutex2var_epi64(tab(0), ki, tab(1));
        let hi = _mm512_permutex2var_epi64(tab(2), ki, tab(3));
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(c(C0), r, c(C1));
        let y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), _mm512_fmadd_pd(c(C2), r, c(1.0)));
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf_avx512(x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 <= n.
            let v = unsafe { _mm512_loadu_ps(p.add(i)) };
            let top = _mm512_and_si512(
                _mm512_srli_epi32::<20>(_mm512_castps_si512(v)),
                _mm512_set1_epi32(0x7ff),
            );
            let mut special =
                _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(ABSTOP_MAX as i32)) as u32;
            let lo = lanes8(_mm512_castps512_ps256(v));
            let hi = lanes8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(v),
            )));
            let mut lanes = [0f32; 16];
            if special != 0 {
                // SAFETY: 16 floats into a 16-float array.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
            }
            let out = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castps_pd(_mm512_castps256_ps512(lo)),
                _mm256_castps_pd(hi),
            ));
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(p.add(i), out) };
            while special != 0 {
                let l = special.trailing_zeros() as usize;
                x[i + l] = lanes[l].exp();
                special &= special - 1;
            }
            i += 16;
        }
        for v in &mut x[i..] {
            *v = expf_ref(*v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments covering every binade the lanes handle, both signs, and the special ones.
    fn samples(step: u32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..0x42b0_0000u32)
            .step_by(step as usize)
            .flat_map(|b| [f32::from_bits(b), f32::from_bits(b | 0x8000_0000)])
            .collect();
        v.extend([
            88.0,
            -88.0,
            88.72283,
            88.72284,
            -87.33654,
            -103.27892,
            -103.97208,
            -104.0,
            -150.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
        ]);
        v
    }

    #[test]
    fn the_model_is_libm_expf() {
        // The host's libm: glibc on the machines mica is built and tested on. If this fails
        // on another C library, `expf_slice` still gives libm's bits (it checks before it
        // uses the lanes); only the model's claim is wrong there.
        let bad: Vec<f32> = samples(9973)
            .into_iter()
            .filter(|x| expf_ref(*x).to_bits() != x.exp().to_bits())
            .take(5)
            .collect();
        assert!(bad.is_empty(), "expf_ref differs from libm at {bad:?}");
    }

    #[test]
    fn every_implementation_matches_the_model_bit_for_bit() {
        let xs = samples(997);
        let want: Vec<u32> = xs.iter().map(|x| expf_ref(*x).to_bits()).collect();
        for (name, f, ok) in all() {
            if !ok {
                eprintln!("{name}: not supported by this CPU");
                continue;
            }
            // Every length up to 40 (the tails), and the whole set.
            for len in (0..=40).chain([xs.len()]) {
                let mut got = xs[..len].to_vec();
                f(&mut got);
                for (i, g) in got.iter().enumerate() {
                    assert_eq!(g.to_bits(), want[i], "{name}: expf({:e}) len {len}", xs[i]);
                }
            }
        }
        let mut got = xs.clone();
        expf_slice(&mut got);
        assert!(
            got.iter()
                .zip(&xs)
                .all(|(g, x)| g.to_bits() == x.exp().to_bits())
        );
    }

    #[test]
    fn specials_inside_a_vector_go_to_libm() {
        let mut xs = vec![0.5f32; 37];
        for (i, s) in [
            f32::NEG_INFINITY,
            f32::NAN,
            100.0,
            -100.0,
            -1e9,
            f32::INFINITY,
        ]
        .into_iter()
        .enumerate()
        {
            xs[i * 6 + 1] = s;
        }
        for (name, f, ok) in all() {
            if ok {
                let mut got = xs.clone();
                f(&mut got);
                for (g, x) in got.iter().zip(&xs) {
                    let w = x.exp();
                    assert!(
                        g.to_bits() == w.to_bits(),
                        "{name}: expf({x}) = {g}, libm {w}"
                    );
                }
            }
        }
    }
}
