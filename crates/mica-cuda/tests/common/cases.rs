//! The kernels' test cases, run on any [`Runner`] (the emulator here, a GPU under
//! `scripts/test-gpu`): every op against a scalar reference on random and edge inputs.
//!
//! Tolerances: dequantization and row lookups are bit-exact (the same roundings as ggml's C
//! dequantizers, `quant::dequantize_row`); products within 1e-5 of Σ|w·x| (f32 partial sums
//! against an f64 reference); norms, rotations, activations and attention within 1e-5
//! relative (f64 references; the GPU's expf/tanhf are within 2 ulp), the activations' scaled
//! by the size of their exponent's argument.

use mica_cuda::ops::{self, AttnShape, BLOCK_SIZE, DeviceKv, DeviceMatrix, Glu, Tokens};
use mica_cuda::{GpuError, Runner, download_f32, upload_f32};
use mica_kernels::DType;
use mica_kernels::quant::dequantize_row;

/// splitmix64: deterministic test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn f16_bits(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_bits().to_le_bytes()
}

/// Random weights of `dtype`: random quant bytes with scales set to finite f16 values
/// (block 0 of row 0 gets a zero scale, block 1 the largest f16, block 2 a subnormal).
pub fn weights(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = dtype.row_bytes(cols).unwrap();
    match dtype {
        DType::F32 => {
            return (0..rows * cols)
                .flat_map(|_| rng.f().to_le_bytes())
                .collect();
        }
        DType::F16 => {
            return (0..rows * cols)
                .flat_map(|_| f16_bits(rng.f() * 4.0))
                .collect();
        }
        DType::BF16 => {
            return (0..rows * cols)
                .flat_map(|_| {
                    let b = (rng.f() * 4.0).to_bits() >> 16;
                    (b as u16).to_le_bytes()
                })
                .collect();
        }
        _ => {}
    }
    let mut w = rng.bytes(rows * rb);
    let ts = dtype.type_size();
    // Offsets of the f16 scales in a block.
    let scales: &[usize] = match dtype {
        DType::Q4_0 | DType::Q8_0 => &[0],
        DType::Q4_K => &[0, 2],
        DType::Q6_K => &[208],
        other => panic!("no test weights for {other}"),
    };
    for (b, block) in w.chunks_exact_mut(ts).enumerate() {
        for &o in scales {
            let v = match b {
                0 => 0.0,
                1 => 65504.0,
                2 => 3.0e-6,
                _ => rng.f() * 0.05,
            };
            block[o..o + 2].copy_from_slice(&f16_bits(v));
        }
    }
    w
}

fn dequant_rows(dtype: DType, rows: usize, cols: usize, w: &[u8]) -> Vec<f32> {
    let rb = dtype.row_bytes(cols).unwrap();
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        dequantize_row(
            dtype,
            &w[r * rb..(r + 1) * rb],
            &mut out[r * cols..(r + 1) * cols],
        );
    }
    out
}

/// The formats with kernels, with a row width each (odd multiples of the block where
/// possible) and an odd row count.
pub const SHAPES: &[(DType, usize, usize)] = &[
    (DType::F32, 37, 96),
    (DType::F16, 37, 160),
    (DType::BF16, 37, 64),
    (DType::Q4_0, 67, 288),
    (DType::Q8_0, 67, 96),
    (DType::Q4_K, 45, 768),
    (DType::Q6_K, 45, 512),
];

pub fn matvec<R: Runner>(r: &R) {
    let mut rng = Rng::new(1);
    for &(dtype, rows, cols) in SHAPES {
        let w = weights(dtype, rows, cols, &mut rng);
        let wf = dequant_rows(dtype, rows, cols, &w);
        let dm = DeviceMatrix::upload(r, dtype, rows, cols, &w).unwrap();
        for n in [1usize, 3, 11] {
            let mut x = rng.vec(n * cols, 1.0);
            if n > 1 {
                // A token of zeros and one of large values.
                x[..cols].fill(0.0);
                for v in &mut x[cols..2 * cols] {
                    *v *= 1.0e4;
                }
            }
            let xb = upload_f32(r, &x).unwrap();
            let yb = r.alloc(n * rows * 4).unwrap();
            ops::matvec(r, &dm, &xb, n, &yb).unwrap();
            let y = download_f32(r, &yb).unwrap();
            for t in 0..n {
                for row in 0..rows {
                    let (mut exact, mut bound) = (0f64, 0f64);
                    for c in 0..cols {
                        let p = wf[row * cols + c] as f64 * x[t * cols + c] as f64;
                        exact += p;
                        bound += p.abs();
                    }
                    let got = y[t * rows + row] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-5 * bound,
                        "{dtype} matvec n={n} token {t} row {row}: {got} vs {exact} (Σ|wx| {bound})"
                    );
                }
            }
        }
    }
}

pub fn get_rows<R: Runner>(r: &R) {
    let mut rng = Rng::new(2);
    for &(dtype, rows, cols) in SHAPES {
        let w = weights(dtype, rows, cols, &mut rng);
        let wf = dequant_rows(dtype, rows, cols, &w);
        let dm = DeviceMatrix::upload(r, dtype, rows, cols, &w).unwrap();
        let ids = [0u32, rows as u32 - 1, 5, 5, 2];
        let yb = r.alloc(ids.len() * cols * 4).unwrap();
        ops::get_rows(r, &dm, &ids, &yb).unwrap();
        let y = download_f32(r, &yb).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let want = &wf[id as usize * cols..(id as usize + 1) * cols];
            let got = &y[t * cols..(t + 1) * cols];
            for (c, (g, e)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{dtype} row {id} value {c}: {g} vs {e}"
                );
            }
        }
        let err = ops::get_rows(r, &dm, &[rows as u32], &yb).unwrap_err();
        assert!(matches!(err, GpuError::Shape(_)), "{err}");
    }
}

pub fn rms_norm<R: Runner>(r: &R) {
    let mut rng = Rng::new(3);
    for cols in [7usize, 896, 2048] {
        let rows = 3;
        let mut x = rng.vec(rows * cols, 3.0);
        x[..cols].fill(0.0);
        let w = rng.vec(cols, 2.0);
        let (xb, wb) = (upload_f32(r, &x).unwrap(), upload_f32(r, &w).unwrap());
        for weighted in [true, false] {
            let yb = r.alloc(rows * cols * 4).unwrap();
            let wopt = weighted.then_some(&wb);
            ops::rms_norm(r, &xb, wopt, &yb, rows, cols, 1e-6).unwrap();
            let y = download_f32(r, &yb).unwrap();
            for row in 0..rows {
                let xs = &x[row * cols..(row + 1) * cols];
                let ms = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
                let s = 1.0 / (ms + 1e-6f32 as f64).sqrt();
                for c in 0..cols {
                    let wv = if weighted { w[c] as f64 } else { 1.0 };
                    let want = xs[c] as f64 * s * wv;
                    let got = y[row * cols + c] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs() + 1e-30,
                        "rms_norm {cols} row {row} [{c}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

pub fn rope<R: Runner>(r: &R) {
    let mut rng = Rng::new(4);
    let (n_head, hd) = (3usize, 64usize);
    let stride = n_head * hd + 32;
    let pos = [0u32, 17, 4095];
    let toks = Tokens::positions(r, &pos).unwrap();
    let factors: Vec<f32> = (0..32).map(|i| 1.0 + i as f32 * 0.37).collect();
    let fb = upload_f32(r, &factors).unwrap();
    for (n_rot, neox, base, fs, mscale, with_factors) in [
        (64usize, false, 10000.0f32, 1.0f32, 1.0f32, false),
        (64, true, 1.0e6, 1.0, 1.0, true),
        (32, true, 10000.0, 0.25, 1.0, false),
        (32, false, 500000.0, 1.0, 1.2, true),
    ] {
        let x = rng.vec(pos.len() * stride, 2.0);
        let xb = upload_f32(r, &x).unwrap();
        let args = ops::Rope {
            n_head,
            head_dim: hd,
            n_rot,
            tok_stride: stride,
            neox,
            theta_base: base,
            freq_scale: fs,
            attn_factor: mscale,
            factors: with_factors.then_some(&fb),
        };
        ops::rope(r, &xb, &toks, &args).unwrap();
        let y = download_f32(r, &xb).unwrap();
        let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for (t, &p) in pos.iter().enumerate() {
            for h in 0..n_head {
                let o = t * stride + h * hd;
                for i in 0..n_rot / 2 {
                    let mut theta =
                        p as f64 * fs as f64 * (base as f64).powf(-2.0 * i as f64 / n_rot as f64);
                    if with_factors {
                        theta /= factors[i] as f64;
                    }
                    let (c, s) = (theta.cos() * mscale as f64, theta.sin() * mscale as f64);
                    let (a, b) = if neox {
                        (i, i + n_rot / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (x[o + a] as f64, x[o + b] as f64);
                    want[o + a] = x0 * c - x1 * s;
                    want[o + b] = x0 * s + x1 * c;
                }
            }
        }
        for (i, (g, w)) in y.iter().zip(&want).enumerate() {
            assert!(
                (*g as f64 - w).abs() <= 1e-5 * 2.0,
                "rope n_rot={n_rot} neox={neox} value {i}: {g} vs {w}"
            );
            // Values not rotated (past n_rot, and the rows' tails) are untouched.
            let (t, off) = (i / stride, i % stride);
            if off >= n_head * hd || off % hd >= n_rot {
                assert_eq!(
                    g.to_bits(),
                    x[i].to_bits(),
                    "value {i} of token {t} changed"
                );
            }
        }
    }
    let bad = Tokens::new(r, &[1], &[0, 1], &[&[0]]);
    assert!(bad.is_err());
}

pub fn glu<R: Runner>(r: &R) {
    let mut rng = Rng::new(5);
    let mut g = rng.vec(1000, 8.0);
    g.extend([0.0, -0.0, 88.0, -88.0, -200.0, 30.0, 1e-20]);
    let u = rng.vec(g.len(), 3.0);
    let n = g.len();
    let (gb, ub) = (upload_f32(r, &g).unwrap(), upload_f32(r, &u).unwrap());
    for kind in [Glu::Swiglu, Glu::Geglu] {
        let yb = r.alloc(n * 4).unwrap();
        ops::glu(r, &gb, &ub, &yb, n, kind).unwrap();
        let y = download_f32(r, &yb).unwrap();
        for i in 0..n {
            let x = g[i] as f64;
            // The exponent's argument: an f32 rounding of it moves exp(arg) by |arg|·2^-24
            // relative, so the tolerance grows with it.
            let arg = match kind {
                Glu::Swiglu => -x,
                Glu::Geglu => -2.0 * 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x),
            };
            // SiLU: x·sigmoid(x); GELU (tanh form): 0.5·x·(1 + tanh(z)) = x·sigmoid(2z).
            let a = x / (1.0 + arg.exp());
            let want = a * u[i] as f64;
            let got = y[i] as f64;
            let tol = 1e-5 * (1.0 + arg.abs().min(100.0));
            assert!(
                (got - want).abs() <= tol * want.abs() + 1e-30,
                "{kind:?}({x}) · {}: {got} vs {want}",
                u[i]
            );
        }
    }
}

pub fn axpy_and_scale<R: Runner>(r: &R) {
    let mut rng = Rng::new(6);
    let n = 777;
    let (x, y) = (rng.vec(n, 5.0), rng.vec(n, 5.0));
    let xb = upload_f32(r, &x).unwrap();
    for s in [1.0f32, 0.5] {
        let yb = upload_f32(r, &y).unwrap();
        ops::axpy(r, &yb, &xb, n, s).unwrap();
        let got = download_f32(r, &yb).unwrap();
        for i in 0..n {
            // Products by 1 and 0.5 are exact: one rounding, fused or not.
            assert_eq!(
                got[i].to_bits(),
                (y[i] + x[i] * s).to_bits(),
                "axpy s={s} [{i}]"
            );
        }
    }
    let yb = upload_f32(r, &y).unwrap();
    ops::scale(r, &yb, n, 3.7).unwrap();
    let got = download_f32(r, &yb).unwrap();
    for i in 0..n {
        assert_eq!(got[i].to_bits(), (y[i] * 3.7).to_bits(), "scale [{i}]");
    }
    assert!(ops::axpy(r, &yb, &xb, n + 1, 1.0).is_err());
    // Bias rows: 7 rows of 111.
    let b = rng.vec(111, 2.0);
    let bb = upload_f32(r, &b).unwrap();
    let yb = upload_f32(r, &y).unwrap();
    ops::bias(r, &yb, &bb, 7, 111).unwrap();
    let got = download_f32(r, &yb).unwrap();
    for i in 0..n {
        let want = y[i] + b[i % 111];
        assert_eq!(got[i].to_bits(), want.to_bits(), "bias [{i}]");
    }
    assert!(ops::bias(r, &yb, &bb, 8, 111).is_err());
}

/// Attention of a few tokens of two sequences over keys and values written by `kv_write`
/// into a paged cache whose blocks are out of order, for heads of 16 to 256 values, grouped
/// queries, soft-capping and a sliding window; a block copied with `copy_block` reads the
/// same.
pub fn attention<R: Runner>(r: &R) {
    let mut rng = Rng::new(7);
    let (n_head, n_kv, n_blocks) = (4usize, 2usize, 6usize);
    // Sequence 0's positions 0..32 in blocks 4 then 1, sequence 1's in block 3.
    let t0: &[u32] = &[4, 1];
    let t1: &[u32] = &[3];
    let tables = [t0, t1];
    let row_of = |s: u32, p: usize| {
        tables[s as usize][p / BLOCK_SIZE] as usize * BLOCK_SIZE + p % BLOCK_SIZE
    };
    for hd in [16usize, 64, 80, 256] {
        let kv = DeviceKv::new(r, n_blocks, n_kv, hd).unwrap();
        let row = n_kv * hd;
        // Sequence 0 fills positions 0..=20, sequence 1 positions 0..=5, in one write.
        let (mut pos, mut seq) = (Vec::new(), Vec::new());
        for p in 0..=20u32 {
            pos.push(p);
            seq.push(0u32);
        }
        for p in 0..=5u32 {
            pos.push(p);
            seq.push(1);
        }
        let k = rng.vec(pos.len() * row, 1.0);
        let v = rng.vec(pos.len() * row, 1.0);
        let toks = Tokens::new(r, &pos, &seq, &tables).unwrap();
        let (kb, vb) = (upload_f32(r, &k).unwrap(), upload_f32(r, &v).unwrap());
        ops::kv_write(r, &kv, &toks, &kb, &vb).unwrap();
        let (kc, vc) = (
            download_f32(r, &kv.k).unwrap(),
            download_f32(r, &kv.v).unwrap(),
        );
        for (t, (&p, &s)) in pos.iter().zip(&seq).enumerate() {
            let at = row_of(s, p as usize) * row;
            assert_eq!(
                &kc[at..at + row],
                &k[t * row..(t + 1) * row],
                "key of token {t}"
            );
            assert_eq!(
                &vc[at..at + row],
                &v[t * row..(t + 1) * row],
                "value of token {t}"
            );
        }
        // Each query: (sequence, position it sees up to).
        let queries = [(0u32, 20u32), (1, 5), (0, 3), (1, 0)];
        let qpos: Vec<u32> = queries.iter().map(|q| q.1).collect();
        let qseq: Vec<u32> = queries.iter().map(|q| q.0).collect();
        let qt = Tokens::new(r, &qpos, &qseq, &tables).unwrap();
        let q = rng.vec(queries.len() * n_head * hd, 1.0);
        let qb = upload_f32(r, &q).unwrap();
        for (softcap, window) in [(None, None), (Some(0.5f32), None), (None, Some(4usize))] {
            let shape = AttnShape {
                n_head,
                scale: 1.0 / (hd as f32).sqrt(),
                softcap,
                window,
            };
            let ob = r.alloc(q.len() * 4).unwrap();
            ops::attention(r, &kv, &qt, shape, &qb, &ob).unwrap();
            let out = download_f32(r, &ob).unwrap();
            for (t, &(s, p)) in queries.iter().enumerate() {
                for h in 0..n_head {
                    let kvh = h / (n_head / n_kv);
                    let qv = &q[(t * n_head + h) * hd..][..hd];
                    let lo = window.map_or(0, |w| (p as usize + 1).saturating_sub(w));
                    let key = |j: usize| {
                        // Position j of sequence s: the j-th written token of it.
                        let tok = seq
                            .iter()
                            .zip(&pos)
                            .position(|(&a, &b)| a == s && b as usize == j);
                        tok.unwrap() * row + kvh * hd
                    };
                    let scores: Vec<f64> = (lo..=p as usize)
                        .map(|j| {
                            let kj = &k[key(j)..][..hd];
                            let d: f64 =
                                qv.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
                            let d = d * shape.scale as f64;
                            match softcap {
                                Some(c) => c as f64 * (d / c as f64).tanh(),
                                None => d,
                            }
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (lo..=p as usize)
                            .zip(&e)
                            .map(|(j, w)| w * v[key(j) + d] as f64)
                            .sum::<f64>()
                            / z;
                        let got = out[(t * n_head + h) * hd + d] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5,
                            "attention hd={hd} softcap={softcap:?} window={window:?} query {t} head {h} [{d}]: {got} vs {want}"
                        );
                    }
                }
            }
            // Sequence 0's first block copied to block 0 and read through a table naming
            // it: the same output, bit for bit.
            if softcap.is_none() && window.is_none() {
                kv.copy_block(r, 4, 0).unwrap();
                let moved: &[u32] = &[0, 1];
                let mt = Tokens::new(r, &qpos, &qseq, &[moved, t1]).unwrap();
                let ob2 = r.alloc(q.len() * 4).unwrap();
                ops::attention(r, &kv, &mt, shape, &qb, &ob2).unwrap();
                let again = download_f32(r, &ob2).unwrap();
                assert!(
                    out.iter()
                        .zip(&again)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "attention through a copied block differs (hd={hd})"
                );
            }
        }
        // Refusals: a position past its table's blocks, a sequence without a table, a block
        // past the pool, tokens without tables, uneven head groups, a block copy past the
        // pool.
        let one = r.alloc(n_head * hd * 4).unwrap();
        let shape = AttnShape {
            n_head,
            scale: 1.0,
            softcap: None,
            window: None,
        };
        let err = Tokens::new(r, &[16], &[1], &tables).err().unwrap();
        assert!(err.to_string().contains("past the 16 positions"), "{err}");
        assert!(Tokens::new(r, &[0], &[2], &tables).is_err());
        let far: &[u32] = &[6];
        let ft = Tokens::new(r, &[0], &[0], &[far]).unwrap();
        let err = ops::attention(r, &kv, &ft, shape, &one, &one).unwrap_err();
        assert!(
            err.to_string().contains("block 6 of a 6-block cache"),
            "{err}"
        );
        assert!(ops::kv_write(r, &kv, &ft, &one, &one).is_err());
        let bare = Tokens::positions(r, &[0]).unwrap();
        let err = ops::attention(r, &kv, &bare, shape, &one, &one).unwrap_err();
        assert!(err.to_string().contains("without block tables"), "{err}");
        let odd = AttnShape { n_head: 3, ..shape };
        let t = Tokens::new(r, &[0], &[0], &tables).unwrap();
        assert!(ops::attention(r, &kv, &t, odd, &one, &one).is_err());
        assert!(kv.copy_block(r, 0, 6).is_err());
    }
    let bad = DeviceKv::new(r, 1, 1, 288).unwrap();
    let first: &[u32] = &[0];
    let t0 = Tokens::new(r, &[0], &[0], &[first]).unwrap();
    let one = r.alloc(288 * 4).unwrap();
    let shape = AttnShape {
        n_head: 1,
        scale: 1.0,
        softcap: None,
        window: None,
    };
    let err = ops::attention(r, &bad, &t0, shape, &one, &one).unwrap_err();
    assert!(err.to_string().contains("not 288"), "{err}");
}

/// `copy` moves a range bit for bit, and refuses ranges past a buffer or overlapping.
pub fn copy<R: Runner>(r: &R) {
    let mut rng = Rng::new(8);
    let x = rng.vec(1000, 5.0);
    let xb = upload_f32(r, &x).unwrap();
    let yb = upload_f32(r, &vec![7.0; 600]).unwrap();
    ops::copy(r, &xb, 313, &yb, 11, 577).unwrap();
    let y = download_f32(r, &yb).unwrap();
    for (i, &g) in y.iter().enumerate() {
        let want = if (11..588).contains(&i) {
            x[i - 11 + 313]
        } else {
            7.0
        };
        assert_eq!(g.to_bits(), want.to_bits(), "copy [{i}]");
    }
    assert!(ops::copy(r, &xb, 500, &yb, 0, 501).is_err());
    assert!(ops::copy(r, &xb, 0, &yb, 100, 501).is_err());
    assert!(ops::copy(r, &xb, 0, &xb, 10, 20).is_err());
    ops::copy(r, &xb, 0, &xb, 20, 20).unwrap();
}

/// Uploads that do not describe their matrix, and formats without kernels, are refused.
pub fn refusals<R: Runner>(r: &R) {
    let w = vec![0u8; 18 * 3];
    assert!(DeviceMatrix::upload(r, DType::Q4_0, 1, 96, &w).is_ok());
    let err = DeviceMatrix::upload(r, DType::Q4_0, 2, 96, &w).unwrap_err();
    assert!(err.to_string().contains("take 108 bytes, not 54"), "{err}");
    let err = DeviceMatrix::upload(r, DType::Q5_K, 1, 256, &[0; 176]).unwrap_err();
    assert!(matches!(err, GpuError::Unsupported(DType::Q5_K)), "{err}");
    let err = DeviceMatrix::upload(r, DType::F32, 1, 7, &[0; 28]).unwrap_err();
    assert!(err.to_string().contains("32-value blocks"), "{err}");
    let m = DeviceMatrix::upload(r, DType::Q4_0, 1, 96, &w).unwrap();
    let small = r.alloc(95 * 4).unwrap();
    let y = r.alloc(4).unwrap();
    let err = ops::matvec(r, &m, &small, 1, &y).unwrap_err();
    assert!(err.to_string().contains("matvec input"), "{err}");
}
