//! A loaded decoder-only transformer and its forward pass over a batch.
//!
//! The model is a description: per-layer weights plus a typed config. The forward pass runs
//! a [`Batch`] of tokens from any number of sequences through every layer at once (one
//! matrix product per projection for the whole batch), writes their keys and values into
//! the [`KvCache`] under their sequence, and returns logits for the tokens that asked.

use crate::batch::Batch;
use crate::blocks::attention::{AttnShape, attention};
pub use crate::blocks::deltanet::DeltaNet;
pub use crate::blocks::ffn::FFN_CHUNK;
use crate::blocks::ffn::{Dense, activate, dense_ffn, ffn_chunks, glu};
pub use crate::blocks::mla::{Mla, MlaInput};
pub use crate::blocks::moe::{
    BranchNorms, Expert, GroupScore, Groups, Moe, MoeInput, Routing, Scoring,
};
pub use crate::blocks::ple::{LayerPle, PerLayerInputs};
use crate::config::{ModelConfig, NormKind, RopeConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::{KvCache, SeqId};
use crate::offload::LayerOffload;
use crate::stream::LayerStream;
use crate::weights::{Linear, Matrix};

mod layer;
mod matrices;
mod workspace;

pub use layer::{DecoderLayer, Ffn};
use mica_formats::GgufFile;
use mica_kernels::ThreadPool;
use mica_kernels::ops::{self, rms_norm, rope_angles, rope_apply};
use std::sync::Arc;
pub(crate) use workspace::grow;
pub use workspace::{Output, Workspace};

/// A model ready to run.
pub struct Model {
    pub config: ModelConfig,
    /// `[n_vocab × n_embd]`, rows looked up (dequantized) per token.
    pub tok_embd: Matrix,
    /// `[n_ctx_train × n_embd]` learned position embeddings, added to the token's (GPT-2).
    pub pos_embd: Option<Matrix>,
    /// Per-layer embedding inputs (Gemma 4's smaller models; each layer's [`LayerPle`]).
    pub ple: Option<PerLayerInputs>,
    pub layers: Vec<DecoderLayer>,
    /// `[n_embd]`; empty when the model has no final norm (`config.final_norm` false).
    pub output_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias.
    pub output_norm_b: Option<Vec<f32>>,
    /// Embeddings narrower than the layers: projected in after the token lookup and out
    /// before the head (OPT-350m's `project_in` / `project_out`).
    pub embd_proj: Option<EmbdProj>,
    /// `[n_vocab × n_embd]` (`× embedding width` with `embd_proj`); the token embedding
    /// itself when the model ties them.
    pub output: Linear,
    /// The GGUF file, when the model came from one (a Hugging Face folder has none).
    pub file: Option<Arc<GgufFile>>,
    /// Layers streamed from the file ([`crate::stream::start`]); `None`: all resident.
    pub stream: Option<LayerStream>,
    /// The first layer whose weights were dropped from this process because they run on
    /// another device ([`Model::evict_offloaded`]); `None`: every layer is here.
    pub evicted_from: Option<usize>,
}

/// The projections between a token embedding of `e` values and layers of `n_embd`.
pub struct EmbdProj {
    /// `[n_embd × e]`, applied to each looked-up embedding before positions are added.
    pub input: Linear,
    /// `[e × n_embd]`, applied to the final hidden state before the head.
    pub output: Linear,
}

impl Model {
    /// Runs `batch` through the model. Returns the logits of the tokens whose `logits` flag
    /// is set, in batch order: `[n_outputs, n_vocab]` (or their hidden states,
    /// `[n_outputs, n_embd]`, when the workspace asks for [`Output::Hidden`]).
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
        self.forward_inner(pool, batch, kv, ws, stop, None)
    }

    /// [`Model::forward_interruptible`] with layers `offload.first_layer()..` and the output
    /// head run by `offload` ([`crate::offload`]); `kv` holds the host layers' keys and
    /// values and every sequence's block table.
    pub fn forward_offloaded<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
        stop: &mut dyn FnMut() -> bool,
        offload: &mut dyn LayerOffload,
    ) -> Result<Option<&'w [f32]>> {
        let first = offload.first_layer();
        if first > self.layers.len() {
            return Err(ModelError::Offload(format!(
                "it starts at layer {first} of a {}-layer model",
                self.layers.len()
            )));
        }
        if let Some(l) = (first..self.layers.len()).find(|&l| kv.holds_layer(l)) {
            return Err(ModelError::Offload(format!(
                "the KV cache holds layer {l}, which runs offloaded (make it with \
                 KvCache::new_offloaded or paged_offloaded)"
            )));
        }
        self.forward_inner(pool, batch, kv, ws, stop, Some(offload))
    }

    fn forward_inner<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
        stop: &mut dyn FnMut() -> bool,
        mut offload: Option<&mut dyn LayerOffload>,
    ) -> Result<Option<&'w [f32]>> {
        if let Some(e) = self.evicted_from
            && offload.as_ref().is_none_or(|o| o.first_layer() > e)
        {
            return Err(ModelError::Offload(format!(
                "layers {e}.. of this model run on another device (their weights are not held \
                 here): this pass cannot run them"
            )));
        }
        let cfg = &self.config;
        let ends = self.validate(batch, kv)?;
        let n = batch.len();
        let d = cfg.n_embd;
        let _span = tracing::trace_span!("forward", tokens = n).entered();

        // Token embeddings: `x[t] = tok_embd[token t]` (projected to the layers' width
        // when the embedding is narrower).
        ws.acts.alone = ws.alone_paths;
        ws.acts.lora.set(&ws.lora, &batch.seq);
        if offload.is_some() && !ws.acts.lora.is_empty() {
            // The offloaded layers would run without the adapters' updates.
            return Err(ModelError::Offload(
                "LoRA adapters chosen per request do not run on offloaded layers".into(),
            ));
        }
        ws.acts.invalidate();
        let e = self.tok_embd.cols;
        let x = match &self.embd_proj {
            Some(_) => grow(&mut ws.proj, n * e),
            None => grow(&mut ws.x, n * d),
        };
        // A head tied to the embedding may hold the packed copy (and the file's pages be
        // released): look the rows up there.
        let emb = if self.output.w.name == self.tok_embd.name && !self.output.w.is_streamed() {
            self.output.w.view()
        } else {
            self.tok_embd.view()
        };
        for (t, &tok) in batch.tokens.iter().enumerate() {
            emb.dequantize_row(tok as usize, &mut x[t * e..(t + 1) * e]);
        }
        if let Some(s) = cfg.embd_scale {
            ops::scale(x, s);
        }
        if let Some(p) = &self.embd_proj {
            let raw = &ws.proj[..n * e];
            p.input
                .apply(pool, &mut ws.acts, raw, n, grow(&mut ws.x, n * d));
        }
        if let Some(pe) = &self.pos_embd {
            let pe = pe.view();
            let row = grow(&mut ws.proj, d);
            for (t, &p) in batch.pos.iter().enumerate() {
                pe.dequantize_row(p, row);
                ops::add_assign(&mut ws.x[t * d..(t + 1) * d], row);
            }
        }

        let ple_width = self.ple.as_ref().map_or(0, |p| p.proj.out_dim());
        if let Some(p) = &self.ple {
            let out = grow(&mut ws.ple, n * ple_width);
            let x = &ws.x[..n * d];
            p.compute(
                pool,
                &mut ws.acts,
                x,
                &batch.tokens,
                cfg.norm_eps,
                out,
                &mut ws.proj,
            );
        }
        // Rows still carried through the layers; the last layer keeps only output rows.
        let mut out_rows = std::mem::take(&mut ws.out_rows);
        out_rows.clear();
        out_rows.extend((0..n).filter(|&t| batch.logits[t]));
        let mut rows = n;
        // A hybrid model's recurrent state cannot be rolled back: its pass may be given up
        // only before the first layer.
        let recurrent = cfg.has_recurrent_state();
        // Streamed layers are read into their slots as the pass reaches them; the pass's end
        // (its drop, early returns included) ends the last turn.
        let mut pass = self.stream.as_ref().map(LayerStream::begin_pass);
        for (l, layer) in self.layers.iter().enumerate() {
            if (l == 0 || !recurrent) && stop() {
                ws.out_rows = out_rows;
                return Ok(None);
            }
            if let Some(o) = offload.as_deref_mut().filter(|o| o.first_layer() == l) {
                let _span = tracing::trace_span!("offloaded_layers", first = l).entered();
                o.run_layers(batch, kv, &mut ws.x[..n * d])?;
                // Only the rows that produce logits go on.
                for (i, &t) in out_rows.iter().enumerate() {
                    ws.x.copy_within(t * d..(t + 1) * d, i * d);
                }
                break;
            }
            if let Some(p) = &mut pass {
                p.enter(l)?;
            }
            let _layer = tracing::trace_span!("layer", l).entered();
            // Token mixing, in the layer's shape: attention, or a Gated DeltaNet layer.
            let mixing = tracing::trace_span!("attention").entered();
            let (qd, hd) = (cfg.q_dim_of(l), cfg.head_dim_of(l));
            let attn_norm = (&layer.attn_norm[..], layer.attn_norm_b.as_deref());
            if cfg.post_norm {
                grow(&mut ws.xn, n * d).copy_from_slice(&ws.x[..n * d]);
            } else {
                norm_rows(
                    cfg,
                    pool,
                    &ws.x[..n * d],
                    attn_norm,
                    grow(&mut ws.xn, n * d),
                );
            }
            ws.acts.invalidate();
            let xn = &ws.xn[..n * d];
            let width = if let (Some(dn), Some(c)) = (&layer.delta, &cfg.delta_net) {
                let vd = c.value_dim();
                dn.forward(
                    c,
                    pool,
                    &mut ws.acts,
                    &layer.wq,
                    (xn, n),
                    (&batch.seq, &batch.pos),
                    (kv, l),
                    (cfg.norm_eps, cfg.numerics),
                    &mut ws.delta,
                    grow(&mut ws.attn, n * vd),
                );
                vd
            } else if let (Some(m), Some(c)) = (&layer.mla, &cfg.mla) {
                let width = m.n_head() * c.v_head_dim;
                let input = MlaInput {
                    xn,
                    seq: &batch.seq,
                    pos: &batch.pos,
                    rope: &cfg.rope,
                    eps: cfg.norm_eps,
                };
                let out = grow(&mut ws.attn, n * width);
                m.forward(c, &layer.wq, pool, &input, kv, l, out);
                width
            } else {
                // A layer reusing an earlier layer's keys and values computes none.
                let kvd = if layer.wk.is_some() {
                    cfg.kv_dim_of(l)
                } else {
                    0
                };
                let kv_layer = cfg.layer_kv_from[l].unwrap_or(l);
                let shape = AttnShape {
                    n_head: cfg.n_head,
                    n_head_kv: cfg.n_head_kv_of(l),
                    head_dim: hd,
                    scale: match cfg.q_scale {
                        Some(_) => 1.0,
                        None => 1.0 / (hd as f32).sqrt(),
                    },
                    softcap: cfg.attn_softcap,
                    window: cfg.layer_window[l],
                    policy: ws.attention,
                };
                if layer.q_gate {
                    // Each head's query then its gate: split into `q` and `gate`.
                    let raw = grow(&mut ws.up, n * 2 * qd);
                    layer.wq.apply(pool, &mut ws.acts, xn, n, raw);
                    let (q, gate) = (grow(&mut ws.q, n * qd), grow(&mut ws.gate, n * qd));
                    for ((src, q), g) in raw
                        .chunks_exact(2 * hd)
                        .zip(q.chunks_exact_mut(hd))
                        .zip(gate.chunks_exact_mut(hd))
                    {
                        q.copy_from_slice(&src[..hd]);
                        g.copy_from_slice(&src[hd..]);
                    }
                } else {
                    layer
                        .wq
                        .apply(pool, &mut ws.acts, xn, n, grow(&mut ws.q, n * qd));
                }
                if let Some(wk) = &layer.wk {
                    wk.apply(pool, &mut ws.acts, xn, n, grow(&mut ws.k, n * kvd));
                }
                match &layer.wv {
                    Some(wv) => wv.apply(pool, &mut ws.acts, xn, n, grow(&mut ws.v, n * kvd)),
                    None => grow(&mut ws.v, n * kvd).copy_from_slice(&ws.k[..n * kvd]),
                }
                if let Some(w) = &layer.q_norm {
                    norm_in_place(&mut ws.q[..n * qd], w, cfg.norm_eps, &mut ws.cos_sin);
                }
                if let Some(w) = &layer.k_norm {
                    norm_in_place(&mut ws.k[..n * kvd], w, cfg.norm_eps, &mut ws.cos_sin);
                }
                if let Some(w) = &layer.v_norm {
                    norm_in_place(&mut ws.v[..n * kvd], w, cfg.norm_eps, &mut ws.cos_sin);
                }
                if let Some(r) = cfg.rope_of(l) {
                    self.rope(
                        pool,
                        batch,
                        r,
                        (hd, qd, kvd),
                        kv.n_ctx(),
                        &mut ws.q[..n * qd],
                        &mut ws.k[..n * kvd],
                    );
                }
                if let Some(s) = cfg.q_scale {
                    ops::scale(&mut ws.q[..n * qd], s);
                }
                for t in (0..n).filter(|_| kvd > 0) {
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
                    kv_layer,
                    &batch.seq,
                    &batch.pos,
                    &ws.tiled_seqs,
                    &ws.q[..n * qd],
                    grow(&mut ws.attn, n * qd),
                );
                if let Some(sinks) = &layer.sinks {
                    let at = (kv_layer, &batch.seq[..], &batch.pos[..]);
                    crate::blocks::sinks::apply(pool, shape, kv, at, &ws.q[..n * qd], sinks, {
                        &mut ws.attn[..n * qd]
                    })?;
                }
                if layer.q_gate {
                    for (a, g) in ws.attn[..n * qd].iter_mut().zip(&ws.gate[..n * qd]) {
                        *a *= 1.0 / (1.0 + (-g).exp());
                    }
                }
                qd
            };

            // After the last attention only the rows that produce logits matter.
            if l + 1 == self.layers.len() && out_rows.len() < n {
                for (i, &t) in out_rows.iter().enumerate() {
                    ws.attn.copy_within(t * width..(t + 1) * width, i * width);
                    ws.x.copy_within(t * d..(t + 1) * d, i * d);
                    let w = ple_width;
                    ws.ple.copy_within(t * w..(t + 1) * w, i * w);
                }
                rows = out_rows.len();
                ws.acts.lora.keep_rows(&out_rows);
                if rows == 0 {
                    break;
                }
            }

            ws.acts.invalidate();
            let attn = &ws.attn[..rows * width];
            let proj = grow(&mut ws.proj, rows * d);
            layer.wo.apply(pool, &mut ws.acts, attn, rows, proj);
            if let Some(w) = &layer.post_attn_norm {
                norm_in_place(proj, w, cfg.norm_eps, &mut ws.cos_sin);
            }
            // Feed-forward input: the residual stream after attention, or before it (parallel
            // residual: both sub-blocks read the same `x`, their outputs are both added).
            let ffn_norm = (&layer.ffn_norm[..], layer.ffn_norm_b.as_deref());
            if cfg.parallel_residual {
                norm_rows(
                    cfg,
                    pool,
                    &ws.x[..rows * d],
                    ffn_norm,
                    grow(&mut ws.xn, rows * d),
                );
                ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
            } else if cfg.post_norm {
                // `x = norm(x + attn)`, which is also the feed-forward block's input.
                ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
                let attn_norm = (&layer.attn_norm[..], layer.attn_norm_b.as_deref());
                norm_rows(
                    cfg,
                    pool,
                    &ws.x[..rows * d],
                    attn_norm,
                    grow(&mut ws.xn, rows * d),
                );
                ws.x[..rows * d].copy_from_slice(&ws.xn[..rows * d]);
            } else {
                ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
                norm_rows(
                    cfg,
                    pool,
                    &ws.x[..rows * d],
                    ffn_norm,
                    grow(&mut ws.xn, rows * d),
                );
            }

            drop(mixing);
            // Feed-forward sub-block: down(act(gate(x)) * up(x)), or down(act(up(x))), or
            // the experts; dense ones in token chunks (see `ffn_chunks`).
            let _ffn = tracing::trace_span!("feed_forward").entered();
            ws.acts.invalidate();
            let xn = &ws.xn[..rows * d];
            let proj = grow(&mut ws.proj, rows * d);
            let dense = match &layer.ffn {
                Ffn::Moe(moe) => {
                    let input = MoeInput {
                        x: &ws.x[..rows * d],
                        xn,
                        n: rows,
                        glu: &|g, u| glu(cfg, g, u),
                        eps: cfg.norm_eps,
                    };
                    moe.forward(pool, &input, d, proj);
                    None
                }
                Ffn::Dense(e) => Some(Dense::Gated(e)),
                Ffn::Plain { up, down } => Some(Dense::Plain { up, down }),
            };
            if let Some(dense) = dense {
                for r in ffn_chunks(rows, ws.ffn_chunk.unwrap_or(FFN_CHUNK)) {
                    let (x, out) = (
                        &xn[r.start * d..r.end * d],
                        &mut proj[r.start * d..r.end * d],
                    );
                    let bufs = (&mut ws.gate, &mut ws.up);
                    ws.acts.lora.offset = r.start;
                    dense_ffn(cfg, pool, dense, x, bufs, &mut ws.acts, out);
                }
                ws.acts.lora.offset = 0;
            }
            if let Some(w) = &layer.post_ffn_norm {
                norm_in_place(proj, w, cfg.norm_eps, &mut ws.cos_sin);
            }
            ops::add_assign(&mut ws.x[..rows * d], &ws.proj[..rows * d]);
            if cfg.post_norm {
                norm_rows(
                    cfg,
                    pool,
                    &ws.x[..rows * d],
                    ffn_norm,
                    grow(&mut ws.xn, rows * d),
                );
                ws.x[..rows * d].copy_from_slice(&ws.xn[..rows * d]);
            }
            if let Some(p) = &layer.ple {
                p.forward(
                    pool,
                    &mut ws.acts,
                    (&mut ws.x, rows),
                    (&ws.ple[..rows * ple_width], l),
                    &|h| activate(cfg, h),
                    cfg.norm_eps,
                    (&mut ws.gate, &mut ws.proj, &mut ws.cos_sin),
                );
            }
            if let Some(s) = layer.out_scale {
                ops::scale(&mut ws.x[..rows * d], s);
            }
        }

        // Every layer has run: the recurrent states now hold the batch's positions.
        for &(s, end) in &ends {
            kv.end_state(s, end);
        }
        let n_out = out_rows.len();
        ws.out_rows = out_rows;
        if n_out == 0 {
            return Ok(Some(&ws.logits[..0]));
        }
        if cfg.final_norm {
            norm_rows(
                cfg,
                pool,
                &ws.x[..n_out * d],
                (&self.output_norm, self.output_norm_b.as_deref()),
                grow(&mut ws.xn, n_out * d),
            );
        } else {
            grow(&mut ws.xn, n_out * d).copy_from_slice(&ws.x[..n_out * d]);
        }
        if ws.output == Output::Hidden {
            return Ok(Some(&ws.xn[..n_out * d]));
        }
        ws.acts.invalidate();
        let mut xn = &ws.xn[..n_out * d];
        if let Some(p) = &self.embd_proj {
            let e = p.output.w.rows;
            let out = grow(&mut ws.proj, n_out * e);
            p.output.apply(pool, &mut ws.acts, xn, n_out, out);
            ws.acts.invalidate();
            xn = &ws.proj[..n_out * e];
        }
        let logits = grow(&mut ws.logits, n_out * cfg.n_vocab);
        let on_device = match offload {
            Some(o) => o.head(xn, n_out, logits)?,
            None => false,
        };
        match pass.as_mut().filter(|p| p.streams_head() && !on_device) {
            Some(p) => p.head_logits(
                pool,
                &mut ws.acts,
                xn,
                n_out,
                cfg.n_vocab,
                &mut ws.gate,
                logits,
            )?,
            None if !on_device => self.output.apply(pool, &mut ws.acts, xn, n_out, logits),
            None => {}
        }
        drop(pass);
        if let Some(cap) = cfg.final_softcap {
            ops::softcap(logits, cap);
        }
        Ok(Some(&ws.logits[..n_out * cfg.n_vocab]))
    }

    /// Checks token ids and positions, reserves cache room for every sequence, and (hybrid
    /// models) checks that each sequence's recurrent state ends where its tokens begin,
    /// zeroing it for a sequence starting at 0. Returns each sequence with its new length.
    fn validate(&self, batch: &Batch, kv: &mut KvCache) -> Result<Vec<(SeqId, usize)>> {
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
        if let Some(p) = &self.ple
            && let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= p.tok.rows)
        {
            return Err(ModelError::Batch(format!(
                "token id {bad} is outside the {} rows of the per-layer embedding",
                p.tok.rows
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
        for &(s, _) in &next {
            kv.begin_state(s, kv.seq_len(s))?;
        }
        for &(s, end) in &next {
            kv.set_len(s, end);
        }
        Ok(next)
    }

    /// Applies rotary embeddings to every head (of `head_dim` values) of `q` (`[n, q_dim]`)
    /// and `k` (`[n, kv_dim]`), the widths of the layer; `n_ctx` (the cache's tokens per
    /// sequence) picks LongRoPE's factors.
    fn rope(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        r: &RopeConfig,
        (hd, q_dim, kv_dim): (usize, usize, usize),
        n_ctx: usize,
        q: &mut [f32],
        k: &mut [f32],
    ) {
        let cfg = &self.config;
        let (factors, mscale) = match &cfg.long_rope {
            Some(lr) => {
                let (f, s) = lr.for_ctx(n_ctx);
                (Some(f), s)
            }
            None => (r.freq_factors.as_deref(), r.attn_factor),
        };
        let n = batch.pos.len();
        let (qs, ks) = (crate::par::Shared::new(q), crate::par::Shared::new(k));
        // Tokens split across the pool for prompt batches; each token's rotation is the
        // serial loop's.
        crate::par::for_ranges(pool, n, n, 1, |toks| {
            let mut cs = vec![0f32; r.n_dims];
            // SAFETY: each range of tokens is one thread's.
            let (q, k) = unsafe {
                (
                    qs.range(toks.start * q_dim..toks.end * q_dim),
                    ks.range(toks.start * kv_dim..toks.end * kv_dim),
                )
            };
            for (i, &p) in batch.pos[toks.clone()].iter().enumerate() {
                rope_angles(
                    p as f32,
                    r.n_dims,
                    r.freq_base,
                    r.freq_scale,
                    factors,
                    &mut cs,
                );
                if mscale != 1.0 {
                    ops::scale(&mut cs, mscale);
                }
                for head in q[i * q_dim..(i + 1) * q_dim].chunks_exact_mut(hd) {
                    rope_apply(head, r.n_dims, r.style, &cs);
                }
                for head in k[i * kv_dim..(i + 1) * kv_dim].chunks_exact_mut(hd) {
                    rope_apply(head, r.n_dims, r.style, &cs);
                }
            }
        });
    }
}

/// Normalizes each row of `x` with weight and optional bias `(w, b)` into `out`, by the
/// model's norm (RMSNorm or LayerNorm); prompt batches' rows split across `pool`.
fn norm_rows(
    cfg: &ModelConfig,
    pool: &ThreadPool,
    x: &[f32],
    (w, b): (&[f32], Option<&[f32]>),
    out: &mut [f32],
) {
    let d = w.len();
    let n = x.len() / d;
    let o = crate::par::Shared::new(&mut out[..n * d]);
    crate::par::for_ranges(pool, n, n, 1, |rows| {
        // SAFETY: each range of rows is one thread's.
        let out = unsafe { o.range(rows.start * d..rows.end * d) };
        for (xr, or) in x[rows.start * d..rows.end * d]
            .chunks_exact(d)
            .zip(out.chunks_exact_mut(d))
        {
            match cfg.norm {
                NormKind::Rms => rms_norm(xr, w, cfg.norm_eps, or),
                NormKind::Layer => ops::layer_norm(xr, w, b, cfg.norm_eps, or),
            }
        }
    });
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
