//! The f16 vector primitives of attention (ggml's `ggml_vec_dot_f16`, `ggml_vec_mad_f16`,
//! `ggml_vec_scale_f16` as built for AVX-512 without FP16 arithmetic), with a scalar
//! reference and an AVX2+F16C+FMA version picked at run time that agree bit for bit.
//!
//! - `dot`: four accumulators of 16 f32 lanes over steps of 64 elements, one FMA per
//!   element; reduced as `(s0 + s2) + (s1 + s3)`, then 16 -> 8 -> 4 -> 2 -> 1 lanes
//!   (`_mm512_reduce_add_ps`); the last `n % 64` products are added in f64, and the f64
//!   total is rounded to f32.
//! - `mad`: `y = f16(fma(x, v, y))` per element; `scale`: `y = f16(y · v)` (the same with
//!   any vector width).

use half::f16;
use std::sync::OnceLock;

struct Table {
    dot: fn(&[f16], &[f16]) -> f32,
    mad: fn(&mut [f16], &[f16], f32),
    scale: fn(&mut [f16], f32),
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return Table {
                dot: |a, b| unsafe { x86::dot(a, b) },
                mad: |y, x, v| unsafe { x86::mad(y, x, v) },
                scale: |y, v| unsafe { x86::scale(y, v) },
            };
        }
        Table {
            dot: dot_ref,
            mad: mad_ref,
            scale: scale_ref,
        }
    })
}

/// `Σ a[i]·b[i]` with ggml's AVX-512 summation structure (see the module doc).
#[inline]
pub fn dot(a: &[f16], b: &[f16]) -> f32 {
    (table().dot)(a, b)
}

/// `y[i] = f16(f32(y[i]) + f32(x[i]) · v)`, one fused multiply-add then one rounding.
#[inline]
pub fn mad(y: &mut [f16], x: &[f16], v: f32) {
    (table().mad)(y, x, v)
}

/// `y[i] = f16(f32(y[i]) · v)`.
#[inline]
pub fn scale(y: &mut [f16], v: f32) {
    (table().scale)(y, v)
}

/// Elements per step of `dot` (`GGML_F16_STEP`): 4 accumulators of 16 lanes.
const STEP: usize = 64;

/// Scalar model of `dot`: `acc[16 j + l]` is lane l of ggml's `sum[j]`.
pub fn dot_ref(a: &[f16], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let np = n / STEP * STEP;
    let mut acc = [0f32; STEP];
    for (a, b) in a[..np].chunks_exact(STEP).zip(b[..np].chunks_exact(STEP)) {
        for ((s, x), y) in acc.iter_mut().zip(a).zip(b) {
            *s = x.to_f32().mul_add(y.to_f32(), *s);
        }
    }
    let v: [f32; 16] =
        std::array::from_fn(|l| (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]));
    let sum = reduce16(&v) as f64
        + a[np..n]
            .iter()
            .zip(&b[np..n])
            .fold(0f64, |s, (x, y)| s + (x.to_f32() * y.to_f32()) as f64);
    sum as f32
}

/// `_mm512_reduce_add_ps`: halves added lane-wise, 16 -> 8 -> 4 -> 2 -> 1.
fn reduce16(v: &[f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| v[l] + v[l + 8]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[l] + t8[l + 4]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

pub fn mad_ref(y: &mut [f16], x: &[f16], v: f32) {
    for (a, b) in y.iter_mut().zip(x) {
        *a = f16::from_f32(b.to_f32().mul_add(v, a.to_f32()));
    }
}

pub fn scale_ref(y: &mut [f16], v: f32) {
    for a in y.iter_mut() {
        *a = f16::from_f32(a.to_f32() * v);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// Eight f16 at `p` as f32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable values.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    /// ggml's 16-lane accumulators as pairs of 8-lane ones: `acc[2j]` holds lanes 0..8
    /// of `sum[j]`, `acc[2j + 1]` lanes 8..16. Every lane sees the same operations as in
    /// the AVX-512 build, so the result is bit-identical to it (and to `dot_ref`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot(a: &[f16], b: &[f16]) -> f32 {
        let n = a.len().min(b.len());
        let np = n / super::STEP * super::STEP;
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < np {
            for (k, acc) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8k + 8 <= np <= both lengths.
                let (x, y) = unsafe {
                    (
                        load8(a.as_ptr().add(i + 8 * k)),
                        load8(b.as_ptr().add(i + 8 * k)),
                    )
                };
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
            i += super::STEP;
        }
        // (s0 + s2) + (s1 + s3), per half; then the 16 -> 8 step adds the halves.
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let t8 = _mm256_add_ps(lo, hi);
        let t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
        let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
        let t1 = _mm_add_ss(t2, _mm_movehdup_ps(t2));
        let mut sum = _mm_cvtss_f32(t1) as f64;
        for j in np..n {
            sum += (a[j].to_f32() * b[j].to_f32()) as f64;
        }
        sum as f32
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad(y: &mut [f16], x: &[f16], v: f32) {
        let n = y.len().min(x.len());
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                let py = y.as_mut_ptr().add(i).cast::<__m128i>();
                let yy = _mm256_cvtph_ps(_mm_loadu_si128(py));
                let xx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i).cast()));
                let r = _mm256_fmadd_ps(xx, vv, yy);
                _mm_storeu_si128(py, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            }
            i += 8;
        }
        for j in i..n {
            y[j] = f16::from_f32(x[j].to_f32().mul_add(v, y[j].to_f32()));
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale(y: &mut [f16], v: f32) {
        let n = y.len();
        let vv = _mm256_set1_ps(v);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                let py = y.as_mut_ptr().add(i).cast::<__m128i>();
                let r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(py)), vv);
                _mm_storeu_si128(py, _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            }
            i += 8;
        }
        for a in &mut y[i..] {
            *a = f16::from_f32(a.to_f32() * v);
        }
    }
}
