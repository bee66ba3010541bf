//! What quantizing one matrix alone does to the model's output: the mean KL-divergence of
//! the next-token distributions from the unquantized model's, over a few windows of
//! calibration text. A mix uses it to put every tensor's estimated loss on one scale
//! (see [`super::mix`]).

use super::gptq::{self, FactorCache};
use crate::error::{QuantError, Result};
use crate::progress::{Event, Notice};
use mica_engine::Session;
use mica_kernels::DType;
use mica_kernels::matmul::QMatrix;
use mica_kernels::ops::{LogSoftmaxRounding, log_softmax_into};
use mica_kernels::quant::weighted::quantize_row_weighted;
use mica_kernels::quant::{dequantize_row, quantize_row};
use mica_models::LoadedModel;
use mica_models::weights::ActStats;
use std::sync::Arc;

/// Tokens per window, and windows.
pub const CTX: usize = 128;
pub const WINDOWS: usize = 2;
/// Positions of each window that are not scored (too little context to say much).
const SKIP: usize = 8;

/// The source model, the calibration windows, and the unquantized model's predictions on
/// them.
pub struct KlProbe {
    lm: LoadedModel,
    windows: Vec<Vec<u32>>,
    /// Log-softmax of the unquantized model, per window `[CTX - SKIP, n_vocab]`.
    base: Vec<Vec<f32>>,
    threads: usize,
    /// With GPTQ: the calibration inputs' Gram matrices, so that each measurement
    /// quantizes the matrix the way the file will.
    grams: Option<Arc<ActStats>>,
    factors: FactorCache,
}

impl KlProbe {
    /// Takes the source model and scores the first windows of `text` with it; a note goes
    /// to `on_event` when the model is too large to measure in f32.
    pub fn new(
        mut lm: LoadedModel,
        text: &str,
        threads: usize,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<KlProbe> {
        float_base(&mut lm, on_event);
        let tokens = lm.tokenizer.encode(text, true, false)?;
        let n = (tokens.len() / CTX).min(WINDOWS);
        if n == 0 {
            return Err(QuantError::ProbeTextTooShort {
                tokens: tokens.len(),
                needed: CTX,
            });
        }
        let bos = lm.tokenizer.add_bos().then(|| lm.tokenizer.bos()).flatten();
        let windows: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                let mut w = tokens[i * CTX..(i + 1) * CTX].to_vec();
                if let Some(b) = bos {
                    w[0] = b;
                }
                w
            })
            .collect();
        let mut probe = KlProbe {
            lm,
            windows,
            base: Vec::new(),
            threads,
            grams: None,
            factors: Default::default(),
        };
        probe.base = probe.log_probs()?;
        Ok(probe)
    }

    /// Measure with error-compensating quantization (GPTQ) with these Gram matrices.
    pub fn with_gptq(mut self, grams: Arc<ActStats>) -> KlProbe {
        self.grams = Some(grams);
        self.factors = Default::default();
        self
    }

    /// Log-softmax of the scored positions of every window.
    fn log_probs(&self) -> Result<Vec<Vec<f32>>> {
        let n_vocab = self.lm.model.config.n_vocab;
        let mut out = Vec::with_capacity(self.windows.len());
        let mut s = Session::new(&self.lm, CTX, self.threads);
        for w in &self.windows {
            s.reset();
            let mut logits = s.eval(w, true)?;
            logits.drain(..SKIP * n_vocab);
            let mut lp = vec![0f32; logits.len()];
            for (row, out) in logits.chunks(n_vocab).zip(lp.chunks_mut(n_vocab)) {
                log_softmax_into(row, LogSoftmaxRounding::ShiftF32, out);
            }
            out.push(lp);
        }
        Ok(out)
    }

    /// Mean KL-divergence (nats per position) from the unquantized model when the matrices
    /// named `name` alone are quantized to `t` (weighted by `imp` when given); `None` when
    /// the model has no matrix of that name (e.g. experts stored as one 3-D tensor).
    pub fn kl_with(&mut self, name: &str, t: DType, imp: Option<&[f32]>) -> Result<Option<f64>> {
        let saved: Vec<_> = self
            .lm
            .model
            .matrices_named_mut(name)
            .into_iter()
            .map(|m| m.clone())
            .collect();
        let Some(m) = saved.first() else {
            return Ok(None);
        };
        let gram = self.grams.as_ref().and_then(|g| g.gram(name));
        let q = match gram {
            Some((g, n)) if m.cols.is_multiple_of(t.block_size()) => {
                let v = m.view();
                let gptq_err = |cause| QuantError::Gptq {
                    tensor: name.to_string(),
                    cause,
                };
                let f = self.factors.factor(g, n, v.cols).map_err(gptq_err)?;
                Some(
                    gptq::requantize(v.dtype, v.data, v.rows, &f, t, self.threads)
                        .map_err(gptq_err)?,
                )
            }
            _ => requantize(&m.view(), t, imp),
        };
        let Some(q) = q else {
            return Ok(None);
        };
        for m in self.lm.model.matrices_named_mut(name) {
            m.substitute(t, q.clone());
        }
        let probs = self.log_probs();
        for (m, orig) in self
            .lm
            .model
            .matrices_named_mut(name)
            .into_iter()
            .zip(saved)
        {
            *m = orig;
        }
        let probs = probs?;
        let n_vocab = self.lm.model.config.n_vocab;
        let (mut sum, mut n) = (0f64, 0usize);
        for (b, p) in self.base.iter().zip(&probs) {
            for (rb, rp) in b.chunks(n_vocab).zip(p.chunks(n_vocab)) {
                sum += kl(rb, rp);
                n += 1;
            }
        }
        Ok(Some(sum / n.max(1) as f64))
    }
}

/// Largest model whose block-quantized matrices are expanded to f32 for the probe.
const FLOAT_BASE_LIMIT: usize = 4 << 30;

/// Runs a block-quantized source in f32 (when it fits in [`FLOAT_BASE_LIMIT`]). Products
/// with quantized weights quantize their activations to 8 bits, and any change to one matrix
/// moves every later activation across some rounding boundaries: that alone costs a few
/// thousandths of a nat (SmolLM2 Q4_1 with one matrix requantized to Q8_0: 0.004-0.005, as
/// much as Q8_0 for all of them), a floor as large as the effects measured. In f32 the
/// activations are not rounded and only the measured matrix is.
fn float_base(lm: &mut LoadedModel, on_event: &mut dyn FnMut(Event)) {
    let mut quantized: Vec<&mut mica_models::weights::Matrix> = lm
        .model
        .all_matrices_mut()
        .into_iter()
        .filter(|m| m.dtype.block_size() > 1)
        .collect();
    let bytes: usize = quantized.iter().map(|m| m.rows * m.cols * 4).sum();
    if bytes > FLOAT_BASE_LIMIT {
        on_event(Event::Notice(Notice::ProbeNotExpanded { mib: bytes >> 20 }));
        return;
    }
    for m in quantized.iter_mut() {
        if let Some(f) = requantize(&m.view(), DType::F32, None) {
            m.substitute(DType::F32, f);
        }
    }
}

/// The matrix's rows quantized to `t` (weighted by `imp` when it has one value per column);
/// `None` when `t`'s block does not divide the rows.
fn requantize(v: &QMatrix, t: DType, imp: Option<&[f32]>) -> Option<Vec<u8>> {
    let out_row = t.row_bytes(v.cols)?;
    let in_row = v.data.len() / v.rows;
    let mut q = vec![0u8; out_row * v.rows];
    let mut x = vec![0f32; v.cols];
    for (r, dst) in q.chunks_mut(out_row).enumerate() {
        dequantize_row(v.dtype, &v.data[r * in_row..(r + 1) * in_row], &mut x);
        match imp {
            Some(w) if w.len() == v.cols => quantize_row_weighted(t, &x, w, dst),
            _ => quantize_row(t, &x, dst),
        }
    }
    Some(q)
}

/// KL(p ‖ q) of two rows of log-probabilities.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            if a > -60.0 {
                (a as f64).exp() * (a - b) as f64
            } else {
                0.0
            }
        })
        .sum::<f64>()
        .max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel)
    }

    /// The SmolLM2 test model (scripts/fetch-test-models), as the integration tests find it.
    fn smollm2() -> std::path::PathBuf {
        let dir = std::env::var_os("MICA_TEST_MODELS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| fixture("models"));
        let p = dir.join("smollm2-135m-instruct-q4_1.gguf");
        assert!(
            p.is_file(),
            "test model {} is missing: run scripts/fetch-test-models, or set MICA_TEST_MODELS",
            p.display()
        );
        p
    }

    #[test]
    fn probe_measures_one_matrix_and_puts_it_back() {
        let text = std::fs::read_to_string(fixture("fixtures/text/calibration.txt")).unwrap();
        let lm = LoadedModel::open(smollm2()).unwrap();
        let mut p = KlProbe::new(lm, &text, 2, &mut crate::progress::ignore).unwrap();
        let name = "blk.0.attn_v.weight";
        let q4 = p.kl_with(name, DType::Q4_0, None).unwrap().unwrap();
        let q8 = p.kl_with(name, DType::Q8_0, None).unwrap().unwrap();
        assert!(q4 > 0.0 && q8 > 0.0, "q4 {q4} q8 {q8}");
        assert!(
            q8 < q4 / 4.0,
            "Q8_0 should diverge far less than Q4_0: {q8} vs {q4}"
        );
        // The original matrix is back: the same measurement again, and the base unchanged.
        assert_eq!(p.kl_with(name, DType::Q4_0, None).unwrap(), Some(q4));
        assert_eq!(p.log_probs().unwrap(), p.base);
        // No such matrix, or a block that does not divide its rows (576): not measurable.
        assert_eq!(
            p.kl_with("blk.99.attn_v.weight", DType::Q4_0, None)
                .unwrap(),
            None
        );
        assert_eq!(p.kl_with(name, DType::Q4_K, None).unwrap(), None);
    }

    fn log_softmax(row: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; row.len()];
        log_softmax_into(row, LogSoftmaxRounding::ShiftF32, &mut out);
        out
    }

    #[test]
    fn kl_is_zero_for_equal_rows_and_grows_with_the_difference() {
        let a = log_softmax(&[1.0f32, 2.0, 3.0, -1.0]);
        let total: f32 = a.iter().map(|v| v.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(kl(&a, &a), 0.0);
        let b = log_softmax(&[1.0f32, 2.5, 3.0, -1.0]);
        let c = log_softmax(&[1.0f32, 4.0, 3.0, -1.0]);
        assert!(kl(&a, &b) > 0.0);
        assert!(kl(&a, &c) > kl(&a, &b));
    }
}
