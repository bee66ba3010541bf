//! Per-layer embeddings (PLE, Gemma 4's smaller models): besides the residual stream, every
//! token carries a small input for each layer, `dim` values per layer, made once from the
//! token and its embedding:
//!
//! `inputs[t] = (RMSNorm(proj(x₀[t]) / sqrt(n_embd)) + tok[token t] · sqrt(dim)) / sqrt(2)`
//!
//! (`x₀` the scaled token embedding, `proj` `[n_layer·dim × n_embd]`, the norm per `dim`
//! slice, `tok` a `[n_vocab × n_layer·dim]` table). After its feed-forward residual add,
//! layer `l` adds `RMSNorm(proj_l(act(gate_l(x)) ⊙ inputs[l]))` to the stream.
//!
//! References: llama.cpp `src/models/gemma4.cpp` (`build_inp_per_layer`,
//! `project_per_layer_inputs`); transformers `Gemma4TextModel.{get,project}_per_layer_inputs`
//! and `Gemma4TextDecoderLayer`.

use crate::weights::{ActCache, Linear, Matrix};
use mica_kernels::ThreadPool;
use mica_kernels::ops::{self, rms_norm};

/// The model-level tensors of the per-layer inputs.
pub struct PerLayerInputs {
    /// `[n_vocab_per_layer × n_layer·dim]` rows looked up per token.
    pub tok: Matrix,
    /// `[n_layer·dim × n_embd]`
    pub proj: Linear,
    /// `[dim]` RMSNorm of each layer's slice of the projection.
    pub norm: Vec<f32>,
    /// Values per layer.
    pub dim: usize,
}

/// A layer's use of its input.
pub struct LayerPle {
    /// `[dim × n_embd]`
    pub gate: Linear,
    /// `[n_embd × dim]`
    pub proj: Linear,
    /// `[n_embd]` RMSNorm of the projection before the residual add.
    pub post_norm: Vec<f32>,
}

impl PerLayerInputs {
    /// `out` (`[n, n_layer·dim]`): the inputs of every layer for the `n` tokens whose scaled
    /// embeddings are `x` (`[n, n_embd]`). `row` is scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        pool: &ThreadPool,
        acts: &mut ActCache,
        x: &[f32],
        tokens: &[u32],
        eps: f32,
        out: &mut [f32],
        row: &mut Vec<f32>,
    ) {
        let n = tokens.len();
        let width = self.proj.out_dim();
        let n_embd = x.len() / n.max(1);
        acts.invalidate();
        self.proj.apply(pool, acts, x, n, out);
        acts.invalidate();
        ops::scale(out, 1.0 / (n_embd as f32).sqrt());
        row.resize(width.max(self.dim), 0.0);
        for slice in out.chunks_exact_mut(self.dim) {
            row[..self.dim].copy_from_slice(slice);
            rms_norm(&row[..self.dim], &self.norm, eps, slice);
        }
        let tok = self.tok.view();
        let tok_scale = (self.dim as f32).sqrt();
        for (t, &id) in tokens.iter().enumerate() {
            tok.dequantize_row(id as usize, &mut row[..width]);
            for (o, &e) in out[t * width..(t + 1) * width]
                .iter_mut()
                .zip(&row[..width])
            {
                *o += e * tok_scale;
            }
        }
        ops::scale(out, std::f32::consts::FRAC_1_SQRT_2);
    }
}

impl LayerPle {
    /// Adds the layer's per-layer-input term to the `rows` rows of `x` (`[rows, n_embd]`).
    /// `inputs` is `[rows, n_layer·dim]`, `l` the layer, `act` the activation in place;
    /// `h` and `proj` are scratch.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        pool: &ThreadPool,
        acts: &mut ActCache,
        (x, rows): (&mut [f32], usize),
        (inputs, l): (&[f32], usize),
        act: &dyn Fn(&mut [f32]),
        eps: f32,
        (h, proj, tmp): (&mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
    ) {
        let dim = self.gate.out_dim();
        let d = self.post_norm.len();
        let width = inputs.len() / rows.max(1);
        acts.invalidate();
        h.resize(rows * dim, 0.0);
        let h = &mut h[..rows * dim];
        self.gate.apply(pool, acts, &x[..rows * d], rows, h);
        act(h);
        for (t, ht) in h.chunks_exact_mut(dim).enumerate() {
            let inp = &inputs[t * width + l * dim..][..dim];
            for (a, &b) in ht.iter_mut().zip(inp) {
                *a *= b;
            }
        }
        acts.invalidate();
        proj.resize(rows * d, 0.0);
        let p = &mut proj[..rows * d];
        self.proj.apply(pool, acts, h, rows, p);
        acts.invalidate();
        tmp.resize(d, 0.0);
        for r in p.chunks_exact_mut(d) {
            tmp.copy_from_slice(r);
            rms_norm(tmp, &self.post_norm, eps, r);
        }
        ops::add_assign(&mut x[..rows * d], p);
    }
}
