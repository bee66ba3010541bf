//! Error-compensating quantization (GPTQ: Frantar et al., "GPTQ: Accurate Post-Training
//! Quantization for Generative Pre-trained Transformers", 2022), writing ordinary GGUF
//! block types.
//!
//! A projection's output error on inputs `x` is `Σ_x ((W − Ŵ) x)²`, a quadratic form in
//! each row's error with the Hessian `H = Σ x xᵀ` (the Gram matrix of the calibration
//! text's inputs, shared by all rows). Rounding the columns one block at a time, the error
//! already made in a block can be partly cancelled by moving the not-yet-quantized columns:
//! after fixing column `j` with error `e_j`, the optimal change of the later columns is
//! `−e_j / U_jj · U_j,>j`, where `U` is the upper Cholesky factor of `H⁻¹`. Each block's
//! scales are chosen by the type's ordinary (importance-weighted) quantizer on the columns
//! as updated so far, so the file needs no new type and any reader runs it.
//!
//! Rows are independent given `H`, so threads take whole bands of rows. The Hessian is
//! damped by 1% of its mean diagonal (the paper's default); columns no calibration token
//! exercised are zeroed in the Hessian's eyes (quantized as they are).

use super::gptq_grid::{round_element, supported};
use mica_kernels::DType;
use mica_kernels::quant::dequantize_row;
use mica_kernels::quant::weighted::quantize_row_weighted;
use std::sync::Arc;

/// Fraction of the mean diagonal added to the Hessian's diagonal.
const DAMP: f64 = 0.01;

/// What GPTQ refuses.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GptqError {
    #[error("GPTQ: the Gram matrix has the wrong size or no rows")]
    GramShape,
    #[error("GPTQ: the calibration inputs are all zero or not finite")]
    NoInputs,
    #[error("GPTQ: the damped Hessian is not positive definite (column {column})")]
    NotPositiveDefinite { column: usize },
    #[error("GPTQ: {cols} columns are not whole {from} or {to} blocks")]
    NotWholeBlocks { cols: usize, from: DType, to: DType },
    #[error("GPTQ: {cols} columns are not whole {to} blocks")]
    NotWholeTargetBlocks { cols: usize, to: DType },
    #[error("GPTQ: {bytes} bytes are not {rows} rows of {cols} {from}")]
    SourceSize {
        bytes: usize,
        rows: usize,
        cols: usize,
        from: DType,
    },
    #[error("GPTQ: buffer sizes do not match {rows} × {cols}")]
    BufferSize { rows: usize, cols: usize },
}

type Result<T> = std::result::Result<T, GptqError>;

/// `U`, the upper Cholesky factor of `(H/n + damp·I)⁻¹` (`[cols × cols]`, row-major), and
/// the importance the block quantizer weighs by (the Hessian's diagonal: the mean squared
/// input per column, as an importance matrix).
pub struct Factor {
    pub cols: usize,
    pub u: Vec<f32>,
    pub importance: Vec<f32>,
}

impl Factor {
    /// From a Gram matrix summed over `n` input rows.
    pub fn new(gram: &[f32], n: u64, cols: usize) -> Result<Factor> {
        if gram.len() != cols * cols || n == 0 {
            return Err(GptqError::GramShape);
        }
        let inv_n = 1.0 / n as f64;
        // The reversed matrix P·H·P (P the order-reversing permutation): its lower Cholesky
        // factor L gives H = R·Rᵀ with R = P·L·P upper, and then U = R⁻¹ = P·L⁻¹·P is the
        // upper factor with Uᵀ·U = H⁻¹.
        let mut h = vec![0f64; cols * cols];
        for i in 0..cols {
            for j in 0..cols {
                h[(cols - 1 - i) * cols + (cols - 1 - j)] = gram[i * cols + j] as f64 * inv_n;
            }
        }
        let importance: Vec<f32> = (0..cols)
            .map(|i| h[(cols - 1 - i) * (cols + 1)] as f32)
            .collect();
        let mean_diag = importance.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        if !(mean_diag.is_finite() && mean_diag > 0.0) {
            return Err(GptqError::NoInputs);
        }
        let damp = DAMP * mean_diag;
        for i in 0..cols {
            let d = &mut h[i * cols + i];
            if *d <= 0.0 {
                // A column no token exercised: its error costs nothing; unit weight keeps the
                // factorization defined without letting it pull on the others.
                for j in 0..cols {
                    h[i * cols + j] = 0.0;
                    h[j * cols + i] = 0.0;
                }
                h[i * cols + i] = mean_diag;
            }
            h[i * cols + i] += damp;
        }
        cholesky_lower(&mut h, cols)?;
        invert_lower(&mut h, cols);
        let mut u = vec![0f32; cols * cols];
        for i in 0..cols {
            for j in i..cols {
                u[i * cols + j] = h[(cols - 1 - i) * cols + (cols - 1 - j)] as f32;
            }
        }
        Ok(Factor {
            cols,
            u,
            importance,
        })
    }
}

/// The factors of the last few Gram matrices used, keyed by the matrix's address: tensors
/// that read the same input (Q/K/V, gate/up) share one Gram matrix, so they share one
/// factorization. Keys are addresses, so a cache must not outlive the statistics its Gram
/// matrices live in (one conversion).
#[derive(Default)]
pub struct FactorCache {
    recent: Vec<(usize, u64, Arc<Factor>)>,
}

impl FactorCache {
    /// Factors kept: the shared ones are used back to back.
    const KEEP: usize = 2;

    /// [`Factor::new`] of `(gram, n)`, or the factor computed for it last time.
    pub fn factor(&mut self, gram: &[f32], n: u64, cols: usize) -> Result<Arc<Factor>> {
        let key = gram.as_ptr() as usize;
        if let Some(i) = self
            .recent
            .iter()
            .position(|(k, m, f)| *k == key && *m == n && f.cols == cols)
        {
            let e = self.recent.remove(i);
            let f = e.2.clone();
            self.recent.push(e);
            return Ok(f);
        }
        let f = Arc::new(Factor::new(gram, n, cols)?);
        if self.recent.len() == Self::KEEP {
            self.recent.remove(0);
        }
        self.recent.push((key, n, f.clone()));
        Ok(f)
    }
}

/// In-place lower Cholesky factor of the symmetric positive-definite `a` (`[n × n]`); the
/// upper triangle is left as it was.
fn cholesky_lower(a: &mut [f64], n: usize) -> Result<()> {
    for i in 0..n {
        for j in 0..=i {
            let dot: f64 = a[i * n..i * n + j]
                .iter()
                .zip(&a[j * n..j * n + j])
                .map(|(x, y)| x * y)
                .sum();
            let s = a[i * n + j] - dot;
            if i == j {
                if !(s > 0.0 && s.is_finite()) {
                    return Err(GptqError::NotPositiveDefinite { column: i });
                }
                a[i * n + i] = s.sqrt();
            } else {
                a[i * n + j] = s / a[j * n + j];
            }
        }
    }
    Ok(())
}

/// In place: the inverse of the lower-triangular `l` (`[n × n]`; its upper triangle is
/// ignored and comes back zero).
fn invert_lower(l: &mut [f64], n: usize) {
    // Row i of X = L⁻¹: X[i][..] = (e_i − Σ_{k<i} L[i][k] · X[k][..]) / L[i][i], where row k
    // of X is zero beyond column k.
    let mut x = vec![0f64; n * n];
    let mut acc = vec![0f64; n];
    for i in 0..n {
        acc[..=i].fill(0.0);
        acc[i] = 1.0;
        for k in 0..i {
            let lik = l[i * n + k];
            for (a, &xv) in acc[..=k].iter_mut().zip(&x[k * n..k * n + k + 1]) {
                *a -= lik * xv;
            }
        }
        let d = l[i * n + i];
        for (xv, &a) in x[i * n..i * n + i + 1].iter_mut().zip(&acc[..=i]) {
            *xv = a / d;
        }
    }
    l.copy_from_slice(&x);
}

/// Quantizes `src` (`rows` rows of `from`, `f.cols` elements each) to `to` with error
/// compensation: dequantized to f32 (`rows × cols` floats in memory), then [`quantize`].
pub fn requantize(
    from: DType,
    src: &[u8],
    rows: usize,
    f: &Factor,
    to: DType,
    threads: usize,
) -> Result<Vec<u8>> {
    let cols = f.cols;
    let (Some(in_row), Some(out_row)) = (from.row_bytes(cols), to.row_bytes(cols)) else {
        return Err(GptqError::NotWholeBlocks { cols, from, to });
    };
    if src.len() != rows * in_row {
        return Err(GptqError::SourceSize {
            bytes: src.len(),
            rows,
            cols,
            from,
        });
    }
    let mut w = vec![0f32; rows * cols];
    for (wr, sr) in w.chunks_mut(cols).zip(src.chunks(in_row)) {
        dequantize_row(from, sr, wr);
    }
    let mut out = vec![0u8; rows * out_row];
    quantize(&mut w, rows, f, to, &mut out, threads)?;
    Ok(out)
}

/// Quantizes `w` (`[rows × cols]`, row-major; overwritten with the updated weights) to `to`
/// with error compensation, into `out` (`rows` rows of `to`). Threads take bands of rows.
pub fn quantize(
    w: &mut [f32],
    rows: usize,
    f: &Factor,
    to: DType,
    out: &mut [u8],
    threads: usize,
) -> Result<()> {
    let cols = f.cols;
    let block = to.block_size();
    let (Some(row_bytes), Some(block_bytes)) = (to.row_bytes(cols), to.row_bytes(block)) else {
        return Err(GptqError::NotWholeTargetBlocks { cols, to });
    };
    if w.len() != rows * cols || out.len() != rows * row_bytes {
        return Err(GptqError::BufferSize { rows, cols });
    }
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (wb, ob) in w
            .chunks_mut(per * cols)
            .zip(out.chunks_mut(per * row_bytes))
        {
            s.spawn(move || band(wb, ob, f, to, (block, block_bytes, row_bytes)));
        }
    });
    Ok(())
}

/// GPTQ over one band of rows (`w.len() / cols` of them).
fn band(
    w: &mut [f32],
    out: &mut [u8],
    f: &Factor,
    to: DType,
    (block, block_bytes, row_bytes): (usize, usize, usize),
) {
    let cols = f.cols;
    let rows = w.len() / cols;
    let u = &f.u;
    // Per group: the scaled errors `[rows × block]` and the dequantized block of one row.
    let mut err = vec![0f32; rows * block];
    let mut q = vec![0f32; block];
    let elementwise = supported(to);
    for c0 in (0..cols).step_by(block) {
        let c1 = c0 + block;
        let imp = &f.importance[c0..c1];
        for r in 0..rows {
            let wr = &mut w[r * cols..(r + 1) * cols];
            let ob = &mut out[r * row_bytes + (c0 / block) * block_bytes..][..block_bytes];
            quantize_row_weighted(to, &wr[c0..c1], imp, ob);
            if !elementwise {
                dequantize_row(to, ob, &mut q);
            }
            let er = &mut err[r * block..(r + 1) * block];
            // Within the block: each column's error moves the block's later columns. With
            // the scales fixed, each column is rounded after the moves so far; for types
            // without a per-element rounding the block's codes stay as quantized, and the
            // moves compensate that fixed choice.
            for j in c0..c1 {
                let qj = round_element(to, ob, j - c0, wr[j]).unwrap_or(q[j - c0]);
                let e = (wr[j] - qj) / u[j * cols + j];
                er[j - c0] = e;
                let uj = &u[j * cols..(j + 1) * cols];
                for k in j + 1..c1 {
                    wr[k] -= e * uj[k];
                }
            }
        }
        // The later columns at once: W[:, c1..] −= E · U[c0..c1, c1..].
        if c1 < cols {
            // SAFETY: E is `[rows × block]` row-major; U's rows c0..c1 from column c1 are
            // `[block × (cols − c1)]` with row stride `cols`; W's columns c1.. are
            // `[rows × (cols − c1)]` with row stride `cols`: all inside their slices.
            unsafe {
                matrixmultiply::sgemm(
                    rows,
                    block,
                    cols - c1,
                    -1.0,
                    err.as_ptr(),
                    block as isize,
                    1,
                    u.as_ptr().add(c0 * cols + c1),
                    cols as isize,
                    1,
                    1.0,
                    w.as_mut_ptr().add(c1),
                    cols as isize,
                    1,
                );
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::convert) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// Inputs with correlated columns (what makes compensation pay) and their Gram matrix.
    fn inputs(n: usize, cols: usize, seed: &mut u64) -> (Vec<f32>, Vec<f32>) {
        let base: Vec<f32> = (0..n * 4).map(|_| lcg(seed)).collect();
        let mix: Vec<f32> = (0..4 * cols).map(|_| lcg(seed)).collect();
        let mut x = vec![0f32; n * cols];
        for t in 0..n {
            for c in 0..cols {
                let mut v = 0.1 * lcg(seed);
                for k in 0..4 {
                    v += base[t * 4 + k] * mix[k * cols + c];
                }
                x[t * cols + c] = v;
            }
        }
        let mut g = vec![0f32; cols * cols];
        for t in 0..n {
            for i in 0..cols {
                for j in 0..cols {
                    g[i * cols + j] += x[t * cols + i] * x[t * cols + j];
                }
            }
        }
        (x, g)
    }

    fn output_error(w: &[f32], wq: &[f32], x: &[f32], rows: usize, cols: usize) -> f64 {
        let mut e = 0f64;
        for t in 0..x.len() / cols {
            for r in 0..rows {
                let mut d = 0f64;
                for c in 0..cols {
                    d += ((w[r * cols + c] - wq[r * cols + c]) * x[t * cols + c]) as f64;
                }
                e += d * d;
            }
        }
        e
    }

    #[test]
    fn factor_is_the_upper_cholesky_of_the_inverse() {
        let mut seed = 7;
        let cols = 40;
        let (_, g) = inputs(200, cols, &mut seed);
        let f = Factor::new(&g, 200, cols).unwrap();
        // (Uᵀ U) · (H/n + damp) = I.
        let mean_diag: f64 = (0..cols)
            .map(|i| g[i * cols + i] as f64 / 200.0)
            .sum::<f64>()
            / cols as f64;
        for i in 0..cols {
            for j in 0..cols {
                let mut s = 0f64;
                for k in 0..cols {
                    let mut hinv = 0f64;
                    for m in 0..=i.min(k) {
                        hinv += f.u[m * cols + i] as f64 * f.u[m * cols + k] as f64;
                    }
                    let mut h = g[k * cols + j] as f64 / 200.0;
                    if k == j {
                        h += DAMP * mean_diag;
                    }
                    s += hinv * h;
                }
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((s - want).abs() < 2e-3, "({i},{j}): {s}");
            }
            for j in 0..i {
                assert_eq!(f.u[i * cols + j], 0.0);
            }
        }
    }

    #[test]
    fn compensation_lowers_the_output_error_for_every_type() {
        let mut seed = 11;
        let (rows, cols, n) = (24, 512, 600);
        let (x, g) = inputs(n, cols, &mut seed);
        let w: Vec<f32> = (0..rows * cols).map(|_| lcg(&mut seed)).collect();
        let f = Factor::new(&g, n as u64, cols).unwrap();
        let writable = |t: &DType| t.is_quantized() && mica_kernels::quant::can_quantize(*t);
        for to in DType::WEIGHT_TYPES.into_iter().filter(writable) {
            let rb = to.row_bytes(cols).unwrap();
            // Plain: the importance-weighted quantizer row by row.
            let mut plain = vec![0u8; rows * rb];
            let mut wq_plain = vec![0f32; rows * cols];
            for r in 0..rows {
                let ob = &mut plain[r * rb..(r + 1) * rb];
                quantize_row_weighted(to, &w[r * cols..(r + 1) * cols], &f.importance, ob);
                dequantize_row(to, ob, &mut wq_plain[r * cols..(r + 1) * cols]);
            }
            let mut work = w.clone();
            let mut packed = vec![0u8; rows * rb];
            quantize(&mut work, rows, &f, to, &mut packed, 2).unwrap();
            let mut wq = vec![0f32; rows * cols];
            for r in 0..rows {
                dequantize_row(
                    to,
                    &packed[r * rb..(r + 1) * rb],
                    &mut wq[r * cols..(r + 1) * cols],
                );
            }
            let (e_plain, e_gptq) = (
                output_error(&w, &wq_plain, &x, rows, cols),
                output_error(&w, &wq, &x, rows, cols),
            );
            println!("{to}: output error {e_plain:.4e} rounded, {e_gptq:.4e} GPTQ");
            assert!(
                e_gptq < 0.8 * e_plain,
                "{to}: GPTQ output error {e_gptq:.4e} against {e_plain:.4e} unweighted"
            );
        }
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let g = vec![0f32; 64 * 64];
        assert!(Factor::new(&g, 10, 64).is_err(), "all-zero inputs");
        let mut seed = 3;
        let (_, g) = inputs(100, 48, &mut seed);
        let f = Factor::new(&g, 100, 48).unwrap();
        let mut w = vec![0f32; 2 * 48];
        let mut out = vec![0u8; 2 * 48];
        let err = quantize(&mut w, 2, &f, DType::Q4_K, &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("not whole"), "{err}");
    }
}
