//! gpt-oss (OpenAI's open-weight mixture of experts): a pre-norm decoder with
//! - biases on the query, key, value and output projections;
//! - attention sinks, a learned logit per query head in every softmax's denominator
//!   ([`crate::blocks::sinks`]);
//! - sliding-window (even) and full (odd) attention layers alternating;
//! - YaRN RoPE on halves (NeoX style);
//! - in every layer a mixture of experts: the router (with a bias) picks the `top_k` largest
//!   logits and softmaxes them among themselves; each expert is a clamped SwiGLU
//!   (`(clamp(up, ±7) + 1) · g · sigmoid(1.702 g)`, `g = min(gate, 7)`) with biases on its
//!   gate, up and down projections. No shared expert.
//!
//! From Hugging Face folders (`GptOssForCausalLM`, experts stored as `[n_expert, in, out]`
//! with gate and up interleaved in `gate_up_proj`: rearranged once at load) in float
//! precision (the published MXFP4 `*_blocks` / `*_scales` checkpoints are not read yet), and
//! from GGUF `gpt-oss` as llama.cpp's converter writes it (experts stacked, gate and up
//! apart; MXFP4 experts read as they are).
//!
//! References: transformers `models/gpt_oss/modeling_gpt_oss.py`; llama.cpp
//! `src/models/openai-moe.cpp` and its converter's `conversion/gpt_oss.py`.

use super::Source;
use super::decoder::{Parts, build_with, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::blocks::ffn::{SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT};
use crate::config::{Activation, ModelConfig};
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::{Expert, Ffn, Model, Moe};
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use crate::weights::{Linear, WeightLoader, reorder_rows, transpose};
use mica_formats::{MetaArray, MetaValue};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "gptoss",
    gguf_archs: &["gpt-oss"],
    hf_classes: &["GptOssForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gpt-oss",
        keys: gguf_keys,
        ..PLAIN
    },
};

/// The checkpoint's names. The stacked experts keep their (rearranged) stacks under
/// `ffn_gate_up_exps` / `ffn_down_exps`.
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("attn_output.bias", "self_attn.o_proj.bias"),
        ("attn_sinks.weight", "self_attn.sinks"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate_inp.weight", "mlp.router.weight"),
        ("ffn_gate_inp.bias", "mlp.router.bias"),
        ("ffn_gate_up_exps.weight", "mlp.experts.gate_up_proj"),
        ("ffn_gate_up_exps.bias", "mlp.experts.gate_up_proj_bias"),
        ("ffn_down_exps.weight", "mlp.experts.down_proj"),
        ("ffn_down_exps.bias", "mlp.experts.down_proj_bias"),
    ],
};

/// mica does not write gpt-oss GGUF files yet (llama.cpp's converter does).
fn gguf_keys(_: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    Err("writing gpt-oss as GGUF is not supported yet; llama.cpp's convert_hf_to_gguf.py \
         writes it"
        .into())
}

/// The experts' hyper-parameters.
struct Spec {
    n_expert: usize,
    top_k: usize,
    n_ff: usize,
    /// Gate and up in one stack, each expert's gate rows then its up rows (the rearranged
    /// Hugging Face checkpoint); otherwise `ffn_gate_exps` and `ffn_up_exps` (GGUF).
    fused: bool,
}

impl Spec {
    fn check(self, err: impl Fn(String) -> ModelError) -> Result<Spec> {
        if self.n_expert == 0 || self.top_k == 0 || self.top_k > self.n_expert || self.n_ff == 0 {
            return Err(err(format!(
                "{} experts per token of {} ({} wide)",
                self.top_k, self.n_expert, self.n_ff
            )));
        }
        Ok(self)
    }

    /// Layer `i`'s mixture of experts.
    fn layer(&self, w: &WeightLoader, i: usize, d: usize) -> Result<Ffn> {
        let p = |s: &str| format!("blk.{i}.{s}");
        let (n, ff) = (self.n_expert, self.n_ff);
        // `[n_expert][rows]` biases as f32.
        let bias = |name: &str, rows: usize| w.array(&p(name), &[rows as u64, n as u64]);
        let (gate_b, up_b) = if self.fused {
            // `[n_expert][2 · ff]`, gate and up interleaved (as the checkpoint keeps them).
            let gu = bias("ffn_gate_up_exps.bias", 2 * ff)?;
            let g = gu.iter().step_by(2).copied().collect::<Vec<_>>();
            let u = gu.iter().skip(1).step_by(2).copied().collect::<Vec<_>>();
            (g, u)
        } else {
            (bias("ffn_gate_exps.bias", ff)?, bias("ffn_up_exps.bias", ff)?)
        };
        let down_b = bias("ffn_down_exps.bias", d)?;
        let rows = |name: &str, first: usize, r: usize, total: usize, cols: usize| {
            w.matrix_rows(&p(name), first, r, total, cols)
        };
        let experts = (0..n)
            .map(|e| {
                let (gate, up) = if self.fused {
                    let name = "ffn_gate_up_exps.weight";
                    (
                        rows(name, 2 * e * ff, ff, 2 * n * ff, d)?,
                        rows(name, (2 * e + 1) * ff, ff, 2 * n * ff, d)?,
                    )
                } else {
                    (
                        rows("ffn_gate_exps.weight", e * ff, ff, n * ff, d)?,
                        rows("ffn_up_exps.weight", e * ff, ff, n * ff, d)?,
                    )
                };
                let slice = |b: &[f32], r: usize| Some(b[e * r..(e + 1) * r].to_vec());
                Ok(Expert {
                    gate: Linear::new(gate, slice(&gate_b, ff)),
                    up: Linear::new(up, slice(&up_b, ff)),
                    down: Linear::new(
                        rows("ffn_down_exps.weight", e * d, d, n * d, ff)?,
                        slice(&down_b, d),
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Ffn::Moe(Moe {
            router: w.linear(&p("ffn_gate_inp"), n, d)?,
            experts,
            top_k: self.top_k,
            norm_topk: false,
            topk_softmax: true,
            shared: None,
            shared_gate: None,
            expert_scale: None,
            norms: None,
            routing: Default::default(),
        }))
    }
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, mut cfg, tok_embd, spec, file) = match src {
        Source::Gguf(file) => {
            let (mut w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            let key = |k: &str| format!("{arch}.{k}");
            let err = |k: &str, msg: String| ModelError::Config {
                path: file.path().to_path_buf(),
                key: key(k),
                msg,
            };
            let get = |k: &str| file.get_u64(&key(k)).map(|v| v as usize);
            let n_ff = get("expert_feed_forward_length").or(get("feed_forward_length"));
            let spec = Spec {
                n_expert: get("expert_count").unwrap_or(0),
                top_k: get("expert_used_count").unwrap_or(0),
                n_ff: n_ff.unwrap_or(0),
                fused: false,
            }
            .check(|m| err("expert_used_count", m))?;
            let window = get("attention.sliding_window").filter(|&w| w > 0);
            let pattern_key = key("attention.sliding_window_pattern");
            // llama.cpp: every other layer sliding (the even ones) unless the file says.
            let sliding: Vec<bool> = match file.metadata(&pattern_key) {
                None => every(cfg.n_layer, 2),
                Some(MetaValue::Array(MetaArray::Bool(b))) if b.len() == cfg.n_layer => b.clone(),
                Some(v) => match v.as_u64() {
                    Some(n) => every(cfg.n_layer, n as usize),
                    None => {
                        let msg = format!("expected {} booleans or a period", cfg.n_layer);
                        return Err(err("attention.sliding_window_pattern", msg));
                    }
                },
            };
            cfg.layer_window = sliding.iter().map(|&s| window.filter(|_| s)).collect();
            // The feed-forward norm is written as `post_attention_norm`.
            for i in 0..cfg.n_layer {
                let p = |s: &str| format!("blk.{i}.{s}");
                w.alias(&p("ffn_norm.weight"), &p("post_attention_norm.weight"));
            }
            (w, cfg, tok_embd, spec, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.layer_window = hf.layer_windows(cfg.n_layer, true, Some(2))?;
            for (field, want) in [
                ("swiglu_limit", SWIGLU_OAI_LIMIT),
                ("swiglu_alpha", SWIGLU_OAI_ALPHA),
            ] {
                match hf.config_json[field].as_f64() {
                    Some(v) if (v as f32 - want).abs() > 1e-6 => {
                        let msg = format!("{v} is not supported ({want} is, as in llama.cpp)");
                        return Err(hf.field_err(field, msg));
                    }
                    _ => {}
                }
            }
            let c = &hf.config;
            let spec = Spec {
                n_expert: hf.required("num_local_experts", c.num_local_experts)?,
                top_k: hf.required("num_experts_per_tok", c.num_experts_per_tok)?,
                n_ff: cfg.n_ff,
                fused: true,
            }
            .check(|m| hf.field_err("num_experts_per_tok", m))?;
            rearrange_experts(&mut w, &cfg, &spec)?;
            (w, cfg, tok_embd, spec, None)
        }
    };
    cfg.act = Activation::SwigluOai;
    let d = cfg.n_embd;
    let n_head = cfg.n_head;
    let parts = Parts::default();
    let mut model = build_with(&w, cfg, tok_embd, parts, file, &|i| {
        spec.layer(&w, i, d).map(Some)
    })?;
    for (i, l) in model.layers.iter_mut().enumerate() {
        l.sinks = Some(w.vector(&format!("blk.{i}.attn_sinks.weight"), n_head)?);
    }
    Ok(model)
}

/// `[n_layer]` whether each layer is sliding: all but every `n`-th (llama.cpp's
/// `set_swa_pattern`); `n = 0`: all.
fn every(n_layer: usize, n: usize) -> Vec<bool> {
    (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
}

/// The checkpoint's experts as the kernels read them: `gate_up_proj` (`[n_expert][d][2·ff]`,
/// `x @ W`, gate and up columns interleaved) becomes per expert its `ff` gate rows then its
/// `ff` up rows (`[n_expert][2·ff][d]`); `down_proj` (`[n_expert][ff][d]`) is transposed to
/// `[n_expert][d][ff]`.
fn rearrange_experts(w: &mut WeightLoader, cfg: &ModelConfig, spec: &Spec) -> Result<()> {
    let (n, ff, d) = (spec.n_expert as u64, spec.n_ff as u64, cfg.n_embd as u64);
    for i in 0..cfg.n_layer {
        let name = format!("blk.{i}.ffn_gate_up_exps.weight");
        w.rewrite(&name, &[2 * ff, d, n], vec![d, 2 * ff, n], |b, es| {
            let per = (2 * ff * d) as usize * es;
            let mut out = Vec::with_capacity(b.len());
            for e in b.chunks_exact(per) {
                let t = transpose(e, d as usize, 2 * ff as usize, es);
                let row = d as usize * es;
                let half = ff as usize;
                out.extend(reorder_rows(&t, row, |r| {
                    if r < half { 2 * r } else { 2 * (r - half) + 1 }
                }));
            }
            out
        })?;
        let name = format!("blk.{i}.ffn_down_exps.weight");
        w.rewrite(&name, &[d, ff, n], vec![ff, d, n], |b, es| {
            let per = (ff * d) as usize * es;
            b.chunks_exact(per)
                .flat_map(|e| transpose(e, ff as usize, d as usize, es))
                .collect()
        })?;
    }
    Ok(())
}
