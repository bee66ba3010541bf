//! A decoder-only model's forward pass on a [`Runner`]: the model's weights uploaded once,
//! a key/value cache per layer on the device, and each step's tokens (from any number of
//! sequences, each in its own cache slot) run through every layer with [`crate::ops`].
//!
//! It runs the dense pre-norm families — RMSNorm, rotary positions (per-pair frequency
//! factors, linear scaling, partial rotation, per-layer local RoPE, NoPE layers), grouped
//! query attention with optional query/key/value norms, sliding windows and soft-capping,
//! projection biases, SwiGLU or GeGLU feed-forward, Gemma's post-norms and scales, tied or
//! separate output heads, final soft-capping — and refuses, naming it, any feature it does
//! not run yet (MoE, MLA, DeltaNet, LayerNorm, per-layer embeddings, LoRA, attention sinks,
//! shared KV layers, LongRoPE, streamed layers), and any weight format without kernels.

use crate::ops::{self, AttnShape, DeviceKv, DeviceMatrix, Glu, Rope, Tokens};
use crate::placement::{self, GpuLayers};
use crate::runner::{Runner, download_f32, upload_f32};
use crate::{GpuError, Result};
use mica_kernels::ops::RopeStyle;
use mica_models::config::{Activation, NormKind};
use mica_models::model::{DecoderLayer, Ffn};
use mica_models::weights::Linear;
use mica_models::{Batch, KvCache, LayerOffload, Model, ModelConfig, ModelError};
type ModelResult<T> = mica_models::Result<T>;

/// A device copy of an optional vector.
fn upload_opt<R: Runner>(r: &R, v: &Option<Vec<f32>>) -> Result<Option<R::Buf>> {
    v.as_deref().map(|v| upload_f32(r, v)).transpose()
}

fn unsupported(what: &str) -> GpuError {
    GpuError::UnsupportedModel(what.to_string())
}

/// A projection on the device: its matrix and bias.
struct DevLinear<B> {
    w: DeviceMatrix<B>,
    bias: Option<B>,
}

impl<B: crate::DeviceBuf> DevLinear<B> {
    fn upload<R: Runner<Buf = B>>(r: &R, lin: &Linear, name: &str) -> Result<Self> {
        if !lin.lora.is_empty() {
            return Err(unsupported(&format!("LoRA adapters ({name})")));
        }
        let v = lin.w.view();
        let w = DeviceMatrix::upload(r, v.dtype, v.rows, v.cols, v.data).map_err(|e| match e {
            GpuError::Unsupported(t) => {
                unsupported(&format!("{t} weights ({name}, {})", lin.w.name))
            }
            e => e,
        })?;
        let bias = lin.bias.as_deref().map(|b| upload_f32(r, b)).transpose()?;
        Ok(DevLinear { w, bias })
    }

    /// `y = W x (+ b)` for `n` rows.
    fn apply<R: Runner<Buf = B>>(&self, r: &R, x: &B, n: usize, y: &B) -> Result<()> {
        ops::matvec(r, &self.w, x, n, y)?;
        if let Some(b) = &self.bias {
            ops::bias(r, y, b, n, self.w.rows)?;
        }
        Ok(())
    }
}

struct DevRope<B> {
    n_rot: usize,
    neox: bool,
    base: f32,
    freq_scale: f32,
    attn_factor: f32,
    factors: Option<B>,
}

struct DevLayer<B> {
    attn_norm: B,
    q_norm: Option<B>,
    k_norm: Option<B>,
    v_norm: Option<B>,
    post_attn_norm: Option<B>,
    post_ffn_norm: Option<B>,
    ffn_norm: B,
    wq: DevLinear<B>,
    wk: DevLinear<B>,
    wv: Option<DevLinear<B>>,
    wo: DevLinear<B>,
    gate: DevLinear<B>,
    up: DevLinear<B>,
    down: DevLinear<B>,
    rope: Option<DevRope<B>>,
    kv: DeviceKv<B>,
    out_scale: Option<f32>,
}

/// A model's layers from `first` to the last, and its output head, resident on a device,
/// with paged key/value caches of `n_blocks` blocks per layer (addressed by the host KV
/// cache's block tables). With `first == 0` it holds the whole model, embedding included.
pub struct GpuDecoder<R: Runner> {
    r: R,
    cfg: ModelConfig,
    first: usize,
    /// The token embedding: held for a whole model, or for a head tied to it.
    tok_embd: Option<DeviceMatrix<R::Buf>>,
    /// The output head; `None`: the token embedding (tied).
    output: Option<DevLinear<R::Buf>>,
    output_norm: Option<R::Buf>,
    /// Layers `first..`.
    layers: Vec<DevLayer<R::Buf>>,
    glu: Glu,
    n_blocks: usize,
    /// The layers' step buffers, kept from step to step (allocating and freeing them each
    /// step would cost more than a small model's decode step on a GPU).
    scratch: Option<Scratch<R::Buf>>,
}

/// Step buffers of the layers, for up to `tokens` tokens, sized for the widest layer (head
/// sizes, KV heads and feed-forward widths may differ from layer to layer).
struct Scratch<B> {
    tokens: usize,
    xn: B,
    proj: B,
    q: B,
    att: B,
    k: B,
    v: B,
    g: B,
    u: B,
}

impl<B: crate::DeviceBuf> Scratch<B> {
    fn new<R: Runner<Buf = B>>(
        r: &R,
        tokens: usize,
        d: usize,
        qd: usize,
        kvd: usize,
        ff: usize,
    ) -> Result<Self> {
        let f = |w: usize| r.alloc(tokens * w * 4);
        Ok(Scratch {
            tokens,
            xn: f(d)?,
            proj: f(d)?,
            q: f(qd)?,
            att: f(qd)?,
            k: f(kvd)?,
            v: f(kvd)?,
            g: f(ff)?,
            u: f(ff)?,
        })
    }
}

/// Fails with the first feature of `model` the decoder does not run.
fn check_supported(model: &Model) -> Result<()> {
    let cfg = &model.config;
    let checks: [(bool, &str); 9] = [
        (cfg.norm != NormKind::Rms, "LayerNorm"),
        (cfg.parallel_residual, "parallel residual blocks"),
        (cfg.post_norm, "post-norm blocks"),
        (cfg.long_rope.is_some(), "LongRoPE"),
        (cfg.has_recurrent_state(), "recurrent (DeltaNet) layers"),
        (model.pos_embd.is_some(), "learned position embeddings"),
        (model.ple.is_some(), "per-layer embeddings"),
        (model.embd_proj.is_some(), "embedding projections"),
        (model.stream.is_some(), "streamed layers"),
    ];
    if let Some((_, what)) = checks.iter().find(|c| c.0) {
        return Err(unsupported(what));
    }
    if !matches!(cfg.act, Activation::Silu | Activation::GeluTanh) {
        return Err(unsupported(&format!("the {:?} activation", cfg.act)));
    }
    for (l, layer) in model.layers.iter().enumerate() {
        let checks: [(bool, &str); 8] = [
            (layer.delta.is_some(), "DeltaNet layers"),
            (layer.mla.is_some(), "multi-head latent attention"),
            (layer.sinks.is_some(), "attention sinks"),
            (layer.q_gate, "gated queries"),
            (layer.ple.is_some(), "per-layer embeddings"),
            (
                layer.wk.is_none() || cfg.layer_kv_from[l].is_some(),
                "layers sharing keys and values",
            ),
            (
                layer.attn_norm_b.is_some() || layer.ffn_norm_b.is_some(),
                "norm biases",
            ),
            (
                !matches!(layer.ffn, Ffn::Dense(_)),
                "feed-forward blocks other than gated dense ones (MoE, plain MLP)",
            ),
        ];
        if let Some((_, what)) = checks.iter().find(|c| c.0) {
            return Err(unsupported(&format!("{what} (layer {l})")));
        }
    }
    Ok(())
}

impl<R: Runner> GpuDecoder<R> {
    /// Uploads all of `model` to the device of `r`, with caches of `n_blocks` blocks.
    pub fn new(r: R, model: &Model, n_blocks: usize) -> Result<Self> {
        Self::layers(r, model, 0, n_blocks)
    }

    /// Uploads the layers `layers` names ([`GpuLayers`]) and the head, after checking with
    /// [`placement::plan`] that they, `n_blocks` KV blocks per layer and steps of up to
    /// `max_tokens` tokens fit the device's free memory.
    pub fn place(
        runner: R,
        model: &Model,
        layers: GpuLayers,
        n_blocks: usize,
        max_tokens: usize,
    ) -> Result<Self> {
        check_supported(model)?;
        let (free, _) = runner.memory()?;
        let p = placement::plan(model, layers, n_blocks, max_tokens, free)?;
        Self::layers(runner, model, p.first, n_blocks)
    }

    /// Uploads layers `first..` of `model` and its output head (for
    /// [`LayerOffload`]), with caches of `n_blocks` blocks.
    pub fn layers(runner: R, model: &Model, first: usize, n_blocks: usize) -> Result<Self> {
        let r = &runner;
        check_supported(model)?;
        let cfg = model.config.clone();
        if first > cfg.n_layer {
            return Err(GpuError::Shape(format!(
                "layer {first} of a {}-layer model",
                cfg.n_layer
            )));
        }
        let up_vec = |v: &[f32]| upload_f32(r, v);
        let tied = model.output.w.name == model.tok_embd.name && model.output.bias.is_none();
        let tok_embd = if first == 0 || tied {
            let te = model.tok_embd.view();
            Some(DeviceMatrix::upload(
                r, te.dtype, te.rows, te.cols, te.data,
            )?)
        } else {
            None
        };
        let output = if tied {
            None
        } else {
            Some(DevLinear::upload(r, &model.output, "output")?)
        };
        let output_norm = cfg
            .final_norm
            .then(|| up_vec(&model.output_norm))
            .transpose()?;
        let mut layers = Vec::with_capacity(model.layers.len() - first);
        for (l, layer) in model.layers.iter().enumerate().skip(first) {
            layers.push(Self::upload_layer(r, &cfg, l, layer, n_blocks)?);
        }
        Ok(GpuDecoder {
            r: runner,
            glu: match cfg.act {
                Activation::Silu => Glu::Swiglu,
                _ => Glu::Geglu,
            },
            cfg,
            first,
            tok_embd,
            output,
            output_norm,
            layers,
            n_blocks,
            scratch: None,
        })
    }

    fn upload_layer(
        r: &R,
        cfg: &ModelConfig,
        l: usize,
        layer: &DecoderLayer,
        n_blocks: usize,
    ) -> Result<DevLayer<R::Buf>> {
        let Ffn::Dense(e) = &layer.ffn else {
            unreachable!("checked")
        };
        let lin = |x: &Linear, n: &str| DevLinear::upload(r, x, &format!("{n} of layer {l}"));
        let rope = match cfg.rope_of(l) {
            None => None,
            Some(rc) => Some(DevRope {
                n_rot: rc.n_dims,
                neox: rc.style == RopeStyle::Neox,
                base: rc.freq_base,
                freq_scale: rc.freq_scale,
                attn_factor: rc.attn_factor,
                factors: upload_opt(r, &rc.freq_factors)?,
            }),
        };
        Ok(DevLayer {
            attn_norm: upload_f32(r, &layer.attn_norm)?,
            q_norm: upload_opt(r, &layer.q_norm)?,
            k_norm: upload_opt(r, &layer.k_norm)?,
            v_norm: upload_opt(r, &layer.v_norm)?,
            post_attn_norm: upload_opt(r, &layer.post_attn_norm)?,
            post_ffn_norm: upload_opt(r, &layer.post_ffn_norm)?,
            ffn_norm: upload_f32(r, &layer.ffn_norm)?,
            wq: lin(&layer.wq, "wq")?,
            wk: lin(layer.wk.as_ref().expect("checked"), "wk")?,
            wv: layer.wv.as_ref().map(|v| lin(v, "wv")).transpose()?,
            wo: lin(&layer.wo, "wo")?,
            gate: lin(&e.gate, "ffn_gate")?,
            up: lin(&e.up, "ffn_up")?,
            down: lin(&e.down, "ffn_down")?,
            rope,
            kv: DeviceKv::new(r, n_blocks, cfg.n_head_kv_of(l), cfg.head_dim_of(l))?,
            out_scale: layer.out_scale,
        })
    }

    /// Blocks in each layer's cache.
    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Runs one step of the whole model: `tokens[t]` at position `pos[t]` of sequence
    /// `seq[t]`, whose block table is `tables[seq[t]]` (positions before a token's, of its
    /// sequence, already cached). Returns the logits of the tokens whose `logits` flag is
    /// set, in order (`[n_out × n_vocab]`).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos: &[u32],
        seq: &[u32],
        tables: &[&[u32]],
        logits: &[bool],
    ) -> Result<Vec<f32>> {
        let (r, n, d) = (&self.r, tokens.len(), self.cfg.n_embd);
        if self.first != 0 {
            return Err(GpuError::Shape(format!(
                "this decoder holds layers {}.. only, not the embedding",
                self.first
            )));
        }
        if pos.len() != n || logits.len() != n {
            return Err(GpuError::Shape(
                "tokens, positions and logit flags differ in length".into(),
            ));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
            return Err(GpuError::Shape(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.n_vocab
            )));
        }
        let toks = Tokens::new(r, pos, seq, tables)?;
        let x = r.alloc(n * d * 4)?;
        let embd = self.tok_embd.as_ref().expect("held for a whole model");
        ops::get_rows(r, embd, tokens, &x)?;
        if let Some(s) = self.cfg.embd_scale {
            ops::scale(r, &x, n * d, s)?;
        }
        self.layers_on_device(&x, &toks)?;
        let r = &self.r;
        // The head reads the flagged rows only.
        let rows: Vec<usize> = (0..n).filter(|&t| logits[t]).collect();
        let h = r.alloc(rows.len().max(1) * d * 4)?;
        for (i, &t) in rows.iter().enumerate() {
            ops::copy(r, &x, t * d, &h, i * d, d)?;
        }
        let h = match &self.output_norm {
            Some(w) => {
                ops::rms_norm(r, &h, Some(w), &h, rows.len(), d, self.cfg.norm_eps)?;
                h
            }
            None => h,
        };
        let mut out = self.head_rows(&h, rows.len())?;
        if let Some(cap) = self.cfg.final_softcap {
            for x in &mut out {
                *x = cap * (*x / cap).tanh();
            }
        }
        Ok(out)
    }

    /// Runs layers `first..` over the host's residual stream `x` (`[n × n_embd]`, replaced
    /// by the last layer's output) for the tokens at `pos` of `seq` (see
    /// [`GpuDecoder::forward`]).
    pub fn run_layers_host(
        &mut self,
        x: &mut [f32],
        pos: &[u32],
        seq: &[u32],
        tables: &[&[u32]],
    ) -> Result<()> {
        let (r, d) = (&self.r, self.cfg.n_embd);
        if x.len() != pos.len() * d {
            return Err(GpuError::Shape(format!(
                "{} hidden values for {} tokens of {d}",
                x.len(),
                pos.len()
            )));
        }
        let toks = Tokens::new(r, pos, seq, tables)?;
        let buf = upload_f32(r, x)?;
        self.layers_on_device(&buf, &toks)?;
        x.copy_from_slice(&download_f32(&self.r, &buf)?);
        Ok(())
    }

    /// The output head's logits (`[n × n_vocab]`, no final soft-capping) of `n` final-normed
    /// host rows `h`.
    pub fn head_host(&self, h: &[f32], n: usize) -> Result<Vec<f32>> {
        if h.len() != n * self.cfg.n_embd {
            return Err(GpuError::Shape(format!(
                "{} values for {n} rows of {}",
                h.len(),
                self.cfg.n_embd
            )));
        }
        self.head_rows(&upload_f32(&self.r, h)?, n)
    }

    /// Copies block `src` of every layer's cache into block `dst`.
    pub fn copy_block(&self, src: u32, dst: u32) -> Result<()> {
        for layer in &self.layers {
            layer.kv.copy_block(&self.r, src, dst)?;
        }
        Ok(())
    }

    fn head_rows(&self, h: &R::Buf, n: usize) -> Result<Vec<f32>> {
        let r = &self.r;
        if n == 0 {
            return Ok(Vec::new());
        }
        let logits = r.alloc(n * self.cfg.n_vocab * 4)?;
        match (&self.output, &self.tok_embd) {
            (Some(o), _) => o.apply(r, h, n, &logits)?,
            (None, Some(e)) => ops::matvec(r, e, h, n, &logits)?,
            (None, None) => unreachable!("a tied head keeps the embedding"),
        }
        download_f32(r, &logits)
    }

    fn layers_on_device(&mut self, x: &R::Buf, toks: &Tokens<R::Buf>) -> Result<()> {
        let (r, cfg, n) = (&self.r, &self.cfg, toks.n);
        let d = cfg.n_embd;
        let eps = cfg.norm_eps;
        let layers = self.first..cfg.n_layer;
        // Grown (allocated anew) for a step larger than any before, else reused.
        let s = match self.scratch.take() {
            Some(s) if s.tokens >= n => s,
            old => {
                drop(old);
                let qd = layers.clone().map(|l| cfg.q_dim_of(l)).max().unwrap_or(0);
                let kvd = layers.clone().map(|l| cfg.kv_dim_of(l)).max().unwrap_or(0);
                let ff = self.layers.iter().map(|l| l.gate.w.rows).max().unwrap_or(0);
                Scratch::new(r, n, d, qd, kvd, ff)?
            }
        };
        let (xn, proj, q, att, k, v_own, g, u) =
            (&s.xn, &s.proj, &s.q, &s.att, &s.k, &s.v, &s.g, &s.u);
        for (layer, l) in self.layers.iter().zip(layers) {
            let (hd, n_kv) = (cfg.head_dim_of(l), cfg.n_head_kv_of(l));
            let (qd, kvd) = (cfg.n_head * hd, n_kv * hd);
            ops::rms_norm(r, x, Some(&layer.attn_norm), xn, n, d, eps)?;
            layer.wq.apply(r, xn, n, q)?;
            layer.wk.apply(r, xn, n, k)?;
            let v = match &layer.wv {
                Some(wv) => {
                    wv.apply(r, xn, n, v_own)?;
                    &v_own
                }
                None => &k,
            };
            for (w, buf, heads) in [
                (&layer.q_norm, &q, cfg.n_head),
                (&layer.k_norm, &k, n_kv),
                (&layer.v_norm, v, n_kv),
            ] {
                if let Some(w) = w {
                    ops::rms_norm(r, buf, Some(w), buf, n * heads, hd, eps)?;
                }
            }
            if let Some(rp) = &layer.rope {
                for (buf, heads, stride) in [(&q, cfg.n_head, qd), (&k, n_kv, kvd)] {
                    let a = Rope {
                        n_head: heads,
                        head_dim: hd,
                        n_rot: rp.n_rot,
                        tok_stride: stride,
                        neox: rp.neox,
                        theta_base: rp.base,
                        freq_scale: rp.freq_scale,
                        attn_factor: rp.attn_factor,
                        factors: rp.factors.as_ref(),
                    };
                    ops::rope(r, buf, toks, &a)?;
                }
            }
            if let Some(s) = cfg.q_scale {
                ops::scale(r, q, n * qd, s)?;
            }
            ops::kv_write(r, &layer.kv, toks, k, v)?;
            let shape = AttnShape {
                n_head: cfg.n_head,
                scale: match cfg.q_scale {
                    Some(_) => 1.0,
                    None => 1.0 / (hd as f32).sqrt(),
                },
                softcap: cfg.attn_softcap,
                window: cfg.layer_window[l],
            };
            ops::attention(r, &layer.kv, toks, shape, q, att)?;
            layer.wo.apply(r, att, n, proj)?;
            if let Some(w) = &layer.post_attn_norm {
                ops::rms_norm(r, proj, Some(w), proj, n, d, eps)?;
            }
            ops::axpy(r, x, proj, n * d, 1.0)?;
            ops::rms_norm(r, x, Some(&layer.ffn_norm), xn, n, d, eps)?;
            let ff = layer.gate.w.rows;
            layer.gate.apply(r, xn, n, g)?;
            layer.up.apply(r, xn, n, u)?;
            ops::glu(r, g, u, g, n * ff, self.glu)?;
            layer.down.apply(r, g, n, proj)?;
            if let Some(w) = &layer.post_ffn_norm {
                ops::rms_norm(r, proj, Some(w), proj, n, d, eps)?;
            }
            ops::axpy(r, x, proj, n * d, 1.0)?;
            if let Some(s) = layer.out_scale {
                ops::scale(r, x, n * d, s)?;
            }
        }
        self.scratch = Some(s);
        Ok(())
    }
}

fn offload_err(e: GpuError) -> ModelError {
    ModelError::Offload(e.to_string())
}

impl<R: Runner> LayerOffload for GpuDecoder<R> {
    fn first_layer(&self) -> usize {
        self.first
    }

    fn run_layers(&mut self, batch: &Batch, kv: &KvCache, x: &mut [f32]) -> ModelResult<()> {
        let pos: Vec<u32> = batch.pos.iter().map(|&p| p as u32).collect();
        let seq: Vec<u32> = batch.seq.iter().map(|&s| s as u32).collect();
        let n_seq = batch.seq.iter().max().map_or(0, |&s| s + 1);
        let tables: Vec<&[u32]> = (0..n_seq).map(|s| kv.block_table(s)).collect();
        self.run_layers_host(x, &pos, &seq, &tables)
            .map_err(offload_err)
    }

    fn head(&mut self, h: &[f32], n: usize, logits: &mut [f32]) -> ModelResult<bool> {
        let out = self.head_host(h, n).map_err(offload_err)?;
        logits.copy_from_slice(&out);
        Ok(true)
    }

    fn copy_block(&mut self, src: u32, dst: u32) -> ModelResult<()> {
        GpuDecoder::copy_block(self, src, dst).map_err(offload_err)
    }
}
