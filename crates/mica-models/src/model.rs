//! A loaded decoder-only transformer and its forward pass over a batch.
//!
//! The model is a description: per-layer weights plus a typed config. The forward pass runs
//! a [`Batch`] of tokens from any number of sequences through every layer at once (one
//! matrix product per projection for the whole batch), writes their keys and values into
//! the [`KvCache`] under their sequence, and returns logits for the tokens that asked.

use crate::batch::Batch;
use crate::blocks::attention::{AttentionPolicy, AttnShape, attention};
pub use crate::blocks::moe::{Expert, Moe};
use crate::config::{Activation, ModelConfig, NormKind, Numerics, RopeConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::weights::{ActCache, Linear, Matrix};
use mica_formats::GgufFile;
use mica_kernels::ThreadPool;
use mica_kernels::ops::{self, rms_norm, rope_angles, rope_apply};
use std::sync::Arc;

/// The weights of one transformer block (pre-norm attention + MLP, with the optional
/// pieces some families add: per-head Q/K norms, post-norms of both sub-blocks, LayerNorm
/// biases).
pub struct DecoderLayer {
    /// `[n_embd]`
    pub attn_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias (GPT-2, GPT-NeoX).
    pub attn_norm_b: Option<Vec<f32>>,
    /// `[head_dim]` RMSNorm of every query head before RoPE (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// `[head_dim]` RMSNorm of every key head before RoPE.
    pub k_norm: Option<Vec<f32>>,
    /// `[n_embd]` RMSNorm of the attention output before the residual add (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    /// `[n_embd]` RMSNorm of the feed-forward output before the residual add (Gemma).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// `[q_dim × n_embd]`, optional bias `[q_dim]`
    pub wq: Linear,
    /// `[kv_dim × n_embd]`
    pub wk: Linear,
    /// `[kv_dim × n_embd]`
    pub wv: Linear,
    /// `[n_embd × q_dim]`
    pub wo: Linear,
    /// `[n_embd]`
    pub ffn_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias.
    pub ffn_norm_b: Option<Vec<f32>>,
    pub ffn: Ffn,
}

/// The feed-forward sub-block of a layer. (One per layer, built once: the size difference
/// between the variants costs nothing.)
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    /// `down(act(gate(x)) * up(x))`, `[n_ff × n_embd]` gate and up, `[n_embd × n_ff]` down.
    Dense(Expert),
    /// Routed experts (and a shared one), see [`Moe`].
    Moe(Moe),
    /// `down(act(up(x)))`, `[n_ff × n_embd]` up, `[n_embd × n_ff]` down (GPT-2, GPT-NeoX).
    Plain { up: Linear, down: Linear },
}

/// A model ready to run.
pub struct Model {
    pub config: ModelConfig,
    /// `[n_vocab × n_embd]`, rows looked up (dequantized) per token.
    pub tok_embd: Matrix,
    /// `[n_ctx_train × n_embd]` learned position embeddings, added to the token's (GPT-2).
    pub pos_embd: Option<Matrix>,
    pub layers: Vec<DecoderLayer>,
    /// `[n_embd]`
    pub output_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias.
    pub output_norm_b: Option<Vec<f32>>,
    /// `[n_vocab × n_embd]`; the token embedding itself when the model ties them.
    pub output: Linear,
    /// The GGUF file, when the model came from one (a Hugging Face folder has none).
    pub file: Option<Arc<GgufFile>>,
}

/// Reusable buffers of the forward pass, grown to the largest batch seen.
#[derive(Default)]
pub struct Workspace {
    /// `[n_tok, n_embd]` residual stream
    x: Vec<f32>,
    /// `[n_tok, n_embd]` normed input of a sub-block
    xn: Vec<f32>,
    /// `[n_tok, q_dim]`
    q: Vec<f32>,
    /// `[n_tok, kv_dim]`
    k: Vec<f32>,
    /// `[n_tok, kv_dim]`
    v: Vec<f32>,
    /// `[n_tok, q_dim]`
    attn: Vec<f32>,
    /// `[n_tok, n_embd]` output of a projection back into the residual stream
    proj: Vec<f32>,
    /// `[n_tok, n_ff]`
    gate: Vec<f32>,
    /// `[n_tok, n_ff]`
    up: Vec<f32>,
    /// `[n_out, n_vocab]`
    logits: Vec<f32>,
    /// `[rope n_dims]` cos/sin pairs of one position
    cos_sin: Vec<f32>,
    /// Batch rows that produce logits.
    out_rows: Vec<usize>,
    /// The attention path to take (llama.cpp's choice by default).
    pub attention: AttentionPolicy,
    acts: ActCache,
}

impl Workspace {
    /// Starts collecting importance statistics (mean squared input per column of every
    /// projection) in the following forward passes; see [`crate::weights::ActStats`].
    pub fn collect_act_stats(&mut self) {
        self.acts.stats.get_or_insert_with(Default::default);
    }

    /// The statistics collected so far (collection stops).
    pub fn take_act_stats(&mut self) -> Option<crate::weights::ActStats> {
        self.acts.stats.take()
    }
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

impl Model {
    /// The weight matrices (the output head only when it is not the token embedding).
    fn matrices(&self) -> impl Iterator<Item = &Matrix> {
        let layers = self.layers.iter().flat_map(move |l| {
            let attn = [&l.wq, &l.wk, &l.wv, &l.wo].map(|lin| &lin.w);
            let ffn: Vec<&Matrix> = match &l.ffn {
                Ffn::Dense(e) => expert_matrices(e).to_vec(),
                Ffn::Moe(m) => std::iter::once(&m.router.w)
                    .chain(m.experts.iter().chain(&m.shared).flat_map(expert_matrices))
                    .chain(m.shared_gate.as_ref().map(|g| &g.w))
                    .collect(),
                Ffn::Plain { up, down } => vec![&up.w, &down.w],
            };
            attn.into_iter().chain(ffn)
        });
        let head = (self.output.w.name != self.tok_embd.name).then_some(&self.output.w);
        std::iter::once(&self.tok_embd)
            .chain(&self.pos_embd)
            .chain(layers)
            .chain(head)
    }

    /// Bytes of the weight matrices as stored.
    pub fn weight_bytes(&self) -> usize {
        self.matrices().map(Matrix::n_bytes).sum()
    }

    /// Whether every weight matrix is stored as f32 (a float32 checkpoint).
    pub fn float32_weights(&self) -> bool {
        self.matrices().all(|m| m.dtype == mica_kernels::DType::F32)
    }

    /// Number of weights in the matrices (norms and biases aside).
    pub fn n_params(&self) -> usize {
        self.matrices().map(|m| m.rows * m.cols).sum()
    }

    /// Runs `batch` through the model. Returns the logits of the tokens whose `logits` flag
    /// is set, in batch order: `[n_outputs, n_vocab]`.
    pub fn forward<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32]> {
        self.forward_interruptible(pool, batch, kv, ws, &mut || false)?
            .ok_or_else(|| ModelError::Batch("the forward pass was interrupted".into()))
    }

    /// [`Model::forward`] that asks `stop` before each layer and gives up (`Ok(None)`) when it
    /// says so — for a server abandoning a step in favour of more urgent work. An abandoned
    /// pass has written keys and values of the batch's positions in some layers only: the
    /// caller must treat those positions as not computed (the next pass over them rewrites
    /// every layer).
    pub fn forward_interruptible<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<&'w [f32]>> {
        let cfg = &self.config;
        self.validate(batch, kv)?;
        let n = batch.len();
        let (d, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());

        // Token embeddings: `x[t] = tok_embd[token t]`.
        let x = grow(&mut ws.x, n * d);
        let emb = self.tok_embd.view();
        for (t, &tok) in batch.tokens.iter().enumerate() {
            emb.dequantize_row(tok as usize, &mut x[t * d..(t + 1) * d]);
        }
        if let Some(s) = cfg.embd_scale {
            ops::scale(x, s);
        }
        if let Some(pe) = &self.pos_embd {
            let pe = pe.view();
            let row = grow(&mut ws.proj, d);
            for (t, &p) in batch.pos.iter().enumerate() {
                pe.dequantize_row(p, row);
                ops::add_assign(&mut ws.x[t * d..(t + 1) * d], row);
            }
        }

        let mut shape = AttnShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            scale: match cfg.q_scale {
                Some(_) => 1.0,
                None => 1.0 / (cfg.head_dim as f32).sqrt(),
            },
            softcap: cfg.attn_softcap,
            window: None,
            policy: ws.attention,
        };
        // Rows still carried through the layers; the last layer keeps only output rows.
        let mut out_rows = std::mem::take(&mut ws.out_rows);
        out_rows.clear();
        out_rows.extend((0..n).filter(|&t| batch.logits[t]));
        let mut rows = n;
        for (l, layer) in self.layers.iter().enumerate() {
            if stop() {
                ws.out_rows = out_rows;
                return Ok(None);
            }
            // Attention sub-block.
            norm_rows(
                cfg,
                &ws.x[..n * d],
                (&layer.attn_norm, layer.attn_norm_b.as_deref()),
                grow(&mut ws.xn, n * d),
            );
            ws.acts.invalidate();
            let xn = &ws.xn[..n * d];
            layer.wq.forward(
                pool,
                ws.acts.get(pool, &layer.wq.w, xn, n),
                grow(&mut ws.q, n * qd),
            );
            layer.wk.forward(
                pool,
                ws.acts.get(pool, &layer.wk.w, xn, n),
                grow(&mut ws.k, n * kvd),
            );
            layer.wv.forward(
                pool,
                ws.acts.get(pool, &layer.wv.w, xn, n),
                grow(&mut ws.v, n * kvd),
            );
            if let Some(w) = &layer.q_norm {
                norm_in_place(&mut ws.q[..n * qd], w, cfg.norm_eps, &mut ws.cos_sin);
            }
            if let Some(w) = &layer.k_norm {
                norm_in_place(&mut ws.k[..n * kvd], w, cfg.norm_eps, &mut ws.cos_sin);
            }
            if cfg.has_rope() {
                self.rope(
                    batch,
                    cfg.rope_of(l),
                    kv.n_ctx(),
                    &mut ws.q[..n * qd],
                    &mut ws.k[..n * kvd],
                    &mut ws.cos_sin,
                );
            }
            if let Some(s) = cfg.q_scale {
                ops::scale(&mut ws.q[..n * qd], s);
            }
            shape.window = cfg.layer_window[l];
            for t in 0..n {
                kv.write(
                    l,
                    batch.seq[t],
                    batch.pos[t],
                    &ws.k[t * kvd..(t + 1) * kvd],
                    &ws.v[t * kvd..(t + 1) * kvd],
                );
            }
            attention(
                pool,
                shape,
                kv,
                l,
                &batch.seq,
                &batch.pos,
                &ws.q[..n * qd],
                grow(&mut ws.attn, n * qd),
            );

            // After the last attention only the rows that produce logits matter.
            if l + 1 == self.layers.len() && out_rows.len() < n {
                for (i, &t) in out_rows.iter().enumerate() {
                    ws.attn.copy_within(t * qd..(t + 1) * qd, i * qd);
                    ws.x.copy_within(t * d..(t + 1) * d, i * d);
                }
                rows = out_rows.len();
                if rows == 0 {
                    break;
                }
            }

            ws.acts.invalidate();
            let attn = &ws.attn[..rows * qd];
            let proj = grow(&mut ws.proj, rows * d);
            layer
                .wo
                .forward(pool, ws.acts.get(pool, &layer.wo.w, attn, rows), proj);
            if let Some(w) = &layer.post_attn_norm {
                norm_in_place(proj, w, cfg.norm_eps, &mut ws.cos_sin);
            }
            // Feed-forward input: the residual stream after attention, or before it (parallel
            // residual: both sub-blocks read the same `x`, their outputs are both added).
            let ffn_norm = (&layer.ffn_norm[..], layer.ffn_norm_b.as_deref());
            if cfg.parallel_residual {
                norm_rows(cfg, &ws.x[..rows * d], ffn_norm, grow(&mut ws.xn, rows * d));
                ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
            } else {
                ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
                norm_rows(cfg, &ws.x[..rows * d], ffn_norm, grow(&mut ws.xn, rows * d));
            }

            // Feed-forward sub-block: down(act(gate(x)) * up(x)), or down(act(up(x))).
            ws.acts.invalidate();
            let xn = &ws.xn[..rows * d];
            let proj = grow(&mut ws.proj, rows * d);
            let dense = match &layer.ffn {
                Ffn::Dense(e) => e,
                Ffn::Plain { up, down } => {
                    let ff = up.out_dim();
                    let h = grow(&mut ws.up, rows * ff);
                    up.forward(pool, ws.acts.get(pool, &up.w, xn, rows), h);
                    activate(cfg, h);
                    ws.acts.invalidate();
                    let h = &ws.up[..rows * ff];
                    let proj = grow(&mut ws.proj, rows * d);
                    down.forward(pool, ws.acts.get(pool, &down.w, h, rows), proj);
                    ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
                    continue;
                }
                Ffn::Moe(moe) => {
                    moe.forward(pool, xn, rows, d, proj);
                    if let Some(w) = &layer.post_ffn_norm {
                        norm_in_place(proj, w, cfg.norm_eps, &mut ws.cos_sin);
                    }
                    ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
                    continue;
                }
            };
            let ff = dense.gate.out_dim();
            let gate = grow(&mut ws.gate, rows * ff);
            dense
                .gate
                .forward(pool, ws.acts.get(pool, &dense.gate.w, xn, rows), gate);
            let up = grow(&mut ws.up, rows * ff);
            dense
                .up
                .forward(pool, ws.acts.get(pool, &dense.up.w, xn, rows), up);
            let (gate, up) = (&mut ws.gate[..rows * ff], &ws.up[..rows * ff]);
            match (cfg.act, cfg.numerics) {
                (Activation::Silu, _) => ops::swiglu(gate, up),
                (_, Numerics::LlamaCpp) => ops::geglu(gate, up),
                (_, Numerics::F32) => ops::geglu_precise(gate, up),
            }
            ws.acts.invalidate();
            let h = &ws.gate[..rows * ff];
            let proj = grow(&mut ws.proj, rows * d);
            dense
                .down
                .forward(pool, ws.acts.get(pool, &dense.down.w, h, rows), proj);
            if let Some(w) = &layer.post_ffn_norm {
                norm_in_place(proj, w, cfg.norm_eps, &mut ws.cos_sin);
            }
            ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
        }

        let n_out = out_rows.len();
        ws.out_rows = out_rows;
        if n_out == 0 {
            return Ok(Some(&ws.logits[..0]));
        }
        norm_rows(
            cfg,
            &ws.x[..n_out * d],
            (&self.output_norm, self.output_norm_b.as_deref()),
            grow(&mut ws.xn, n_out * d),
        );
        ws.acts.invalidate();
        let xn = &ws.xn[..n_out * d];
        let logits = grow(&mut ws.logits, n_out * cfg.n_vocab);
        self.output
            .forward(pool, ws.acts.get(pool, &self.output.w, xn, n_out), logits);
        if let Some(cap) = cfg.final_softcap {
            ops::softcap(logits, cap);
        }
        Ok(Some(&ws.logits[..n_out * cfg.n_vocab]))
    }

    /// Checks token ids and positions, and reserves cache room for every sequence.
    fn validate(&self, batch: &Batch, kv: &mut KvCache) -> Result<()> {
        let n = batch.len();
        if n == 0 {
            return Err(ModelError::Batch("the batch is empty".into()));
        }
        if batch.pos.len() != n || batch.seq.len() != n || batch.logits.len() != n {
            return Err(ModelError::Batch(
                "tokens, positions, sequence ids and logit flags differ in length".into(),
            ));
        }
        if let Some(&bad) = batch
            .tokens
            .iter()
            .find(|&&t| t as usize >= self.config.n_vocab)
        {
            return Err(ModelError::Batch(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.n_vocab
            )));
        }
        if let Some(pe) = &self.pos_embd
            && let Some(&p) = batch.pos.iter().find(|&&p| p >= pe.rows)
        {
            return Err(ModelError::Batch(format!(
                "position {p} is past the {} learned position embeddings of this model",
                pe.rows
            )));
        }
        // Each sequence's tokens must continue its cache: next position = cached length.
        let mut next: Vec<(usize, usize)> = Vec::new();
        for t in 0..n {
            let s = batch.seq[t];
            let slot = match next.iter().position(|e| e.0 == s) {
                Some(i) => i,
                None => {
                    next.push((s, kv.seq_len(s)));
                    next.len() - 1
                }
            };
            if batch.pos[t] != next[slot].1 {
                return Err(ModelError::Batch(format!(
                    "token {t} of sequence {s} is at position {} but the sequence continues at {}",
                    batch.pos[t], next[slot].1
                )));
            }
            next[slot].1 += 1;
        }
        for &(s, end) in &next {
            kv.reserve(s, end)?;
        }
        for &(s, end) in &next {
            kv.set_len(s, end);
        }
        Ok(())
    }

    /// Applies rotary embeddings to every head of `q` (`[n, q_dim]`) and `k` (`[n, kv_dim]`);
    /// `n_ctx` (the cache's tokens per sequence) picks LongRoPE's factors.
    fn rope(
        &self,
        batch: &Batch,
        r: &RopeConfig,
        n_ctx: usize,
        q: &mut [f32],
        k: &mut [f32],
        cos_sin: &mut Vec<f32>,
    ) {
        let cfg = &self.config;
        let cs = grow(cos_sin, r.n_dims);
        let hd = cfg.head_dim;
        let (factors, mscale) = match &cfg.long_rope {
            Some(lr) => {
                let (f, s) = lr.for_ctx(n_ctx);
                (Some(f), s)
            }
            None => (r.freq_factors.as_deref(), 1.0),
        };
        for (t, &p) in batch.pos.iter().enumerate() {
            rope_angles(p as f32, r.n_dims, r.freq_base, r.freq_scale, factors, cs);
            if mscale != 1.0 {
                ops::scale(cs, mscale);
            }
            for head in q[t * cfg.q_dim()..(t + 1) * cfg.q_dim()].chunks_exact_mut(hd) {
                rope_apply(head, r.n_dims, r.style, cs);
            }
            for head in k[t * cfg.kv_dim()..(t + 1) * cfg.kv_dim()].chunks_exact_mut(hd) {
                rope_apply(head, r.n_dims, r.style, cs);
            }
        }
    }
}

/// Normalizes each row of `x` with weight and optional bias `(w, b)` into `out`, by the
/// model's norm (RMSNorm or LayerNorm).
fn norm_rows(cfg: &ModelConfig, x: &[f32], (w, b): (&[f32], Option<&[f32]>), out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        match cfg.norm {
            NormKind::Rms => rms_norm(xr, w, cfg.norm_eps, or),
            NormKind::Layer => ops::layer_norm(xr, w, b, cfg.norm_eps, or),
        }
    }
}

/// The plain (ungated) MLP activation in place, with the model's numerics.
fn activate(cfg: &ModelConfig, h: &mut [f32]) {
    match (cfg.act, cfg.numerics) {
        (Activation::Silu, _) => ops::silu_in_place(h),
        // llama.cpp computes every GELU with its f16 table of the tanh approximation.
        (_, Numerics::LlamaCpp) => ops::gelu(h),
        (Activation::GeluTanh, Numerics::F32) => ops::gelu_precise(h),
        (Activation::GeluErf, Numerics::F32) => ops::gelu_erf(h),
    }
}

/// RMS-normalizes each `w.len()`-wide row of `x` in place (`tmp` holds one row).
fn norm_in_place(x: &mut [f32], w: &[f32], eps: f32, tmp: &mut Vec<f32>) {
    let d = w.len();
    let t = grow(tmp, d);
    for row in x.chunks_exact_mut(d) {
        t.copy_from_slice(row);
        rms_norm(t, w, eps, row);
    }
}

/// The three matrices of an expert.
fn expert_matrices(e: &Expert) -> [&Matrix; 3] {
    [&e.gate.w, &e.up.w, &e.down.w]
}
