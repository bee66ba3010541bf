//! The pre-norm decoder every family here is an instance of, built from canonical tensor
//! names: token embedding → layers (RMSNorm → attention → [post-norm] → residual; RMSNorm →
//! gated MLP → [post-norm] → residual) → final RMSNorm → output head (tied to the embedding
//! when the file has no `output.weight`). Which optional pieces a family has is [`Parts`]:
//! GPT-2 and GPT-NeoX are the same skeleton with LayerNorms (biased) and an ungated MLP.

use super::Source;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::{DecoderLayer, Expert, Ffn, Model};
use crate::weights::{Linear, Matrix, WeightLoader};
use mica_formats::GgufFile;
use mica_kernels::ops::RopeStyle;
use std::sync::Arc;

/// The optional pieces of a layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Parts {
    /// Per-head RMSNorm of queries and keys before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of each sub-block's output before its residual add (`post_attention_norm`,
    /// `post_ffw_norm`).
    pub post_norms: bool,
    /// Q, K and V stored as one matrix (`attn_qkv`, rows q | k | v; Phi-3). Without it a
    /// layer whose file has `attn_qkv` (llama.cpp's `--fuse-qkv`) is read fused all the same.
    pub fused_qkv: bool,
    /// Gate and up stored as one matrix (`ffn_up` of `2 × n_ff` rows, gate first; Phi-3).
    pub fused_gate_up: bool,
    /// LayerNorms with biases (`attn_norm.bias`, `ffn_norm.bias`, `output_norm.bias`).
    pub norm_bias: bool,
    /// An ungated MLP, `ffn_down(act(ffn_up(x)))` (GPT-2, GPT-NeoX).
    pub plain_mlp: bool,
    /// A layer without `attn_v` takes its values from the key projection (Gemma 4's
    /// `attention_k_eq_v`); otherwise `attn_v` is required.
    pub optional_v: bool,
    /// A weightless RMSNorm of every value head (Gemma 4).
    pub v_norm: bool,
    /// `layer_output_scale.weight` (one float), when present, scales each layer's output
    /// (Gemma 4).
    pub out_scale: bool,
}

/// The LayerNorm epsilon of a GGUF file (`{arch}.attention.layer_norm_epsilon`, llama.cpp's
/// default 1e-5 when absent).
pub fn gguf_layer_norm_eps(file: &GgufFile, arch: &str) -> f32 {
    file.get_f32(&format!("{arch}.attention.layer_norm_epsilon"))
        .unwrap_or(1e-5)
}

/// The token embedding (`[n_vocab × n_embd]`); its row count is the vocabulary.
pub fn token_embedding(w: &WeightLoader, n_embd: usize) -> Result<Matrix> {
    w.matrix_any_rows("token_embd.weight", n_embd.max(1))
}

/// The start every family's GGUF path shares: the weight loader, the token embedding (its
/// row count is the vocabulary) and the config from the `{arch}.*` keys.
pub fn gguf_start(
    file: &Arc<GgufFile>,
    arch: &str,
    rope: RopeStyle,
) -> Result<(WeightLoader, ModelConfig, Matrix)> {
    let w = WeightLoader::gguf(file, arch);
    let n_embd = file
        .get_u64(&format!("{arch}.embedding_length"))
        .unwrap_or(0);
    let tok_embd = token_embedding(&w, n_embd as usize)?;
    let cfg = ModelConfig::from_gguf(file, arch, rope, tok_embd.rows)?;
    Ok((w, cfg, tok_embd))
}

/// Loads every layer and the head, and assembles the model.
pub fn build(
    w: &WeightLoader,
    cfg: ModelConfig,
    tok_embd: Matrix,
    parts: Parts,
    file: Option<Arc<GgufFile>>,
) -> Result<Model> {
    build_with(w, cfg, tok_embd, parts, file, &|_| Ok(None))
}

/// [`build`], where `ffn(layer)` may supply a layer's feed-forward block (mixture of
/// experts); `None` loads the dense gated MLP.
pub fn build_with(
    w: &WeightLoader,
    cfg: ModelConfig,
    tok_embd: Matrix,
    parts: Parts,
    file: Option<Arc<GgufFile>>,
    ffn: &dyn Fn(usize) -> Result<Option<Ffn>>,
) -> Result<Model> {
    let d = cfg.n_embd;
    let opt = |on: bool, name: String, n: usize| -> Result<Option<Vec<f32>>> {
        if on {
            w.norm(&name, n).map(Some)
        } else {
            Ok(None)
        }
    };
    let bias = |on: bool, name: String, n: usize| -> Result<Option<Vec<f32>>> {
        if on {
            w.vector(&name, n).map(Some)
        } else {
            Ok(None)
        }
    };
    // A fused matrix's rows as separate projections (views of the same bytes), with the
    // matching part of its bias when it has one.
    let split = |name: String, first: usize, rows: usize, total: usize| -> Result<Linear> {
        let b = match name.strip_suffix(".weight") {
            Some(prefix) => w.vector_opt(&format!("{prefix}.bias"), total)?,
            None => None,
        };
        Ok(Linear::new(
            w.matrix_rows(&name, first, rows, total, d)?,
            b.map(|b| b[first..first + rows].to_vec()),
        ))
    };
    let layers = (0..cfg.n_layer)
        .map(|i| {
            let p = |s: &str| format!("blk.{i}.{s}");
            let (qd, kvd, hd) = (cfg.q_dim_of(i), cfg.kv_dim_of(i), cfg.head_dim_of(i));
            let ff = cfg.n_ff_of(i);
            // A layer reusing an earlier layer's keys and values has no K/V weights.
            let has_kv = cfg.layer_kv_from[i].is_none();
            // Fused when the family always is, or when the file fuses this layer (llama.cpp's
            // `convert_hf_to_gguf.py --fuse-qkv` writes `attn_qkv` for layers with all three).
            let fused = parts.fused_qkv || (has_kv && w.info(&p("attn_qkv.weight")).is_some());
            let (wq, wk, wv) = if fused {
                let (name, total) = (p("attn_qkv.weight"), qd + 2 * kvd);
                (
                    split(name.clone(), 0, qd, total)?,
                    Some(split(name.clone(), qd, kvd, total)?),
                    Some(split(name, qd + kvd, kvd, total)?),
                )
            } else {
                let v = if !has_kv || parts.optional_v && w.info(&p("attn_v.weight")).is_none() {
                    None
                } else {
                    Some(w.linear(&p("attn_v"), kvd, d)?)
                };
                let k = match has_kv {
                    true => Some(w.linear(&p("attn_k"), kvd, d)?),
                    false => None,
                };
                (w.linear(&p("attn_q"), qd, d)?, k, v)
            };
            let ffn = match ffn(i)? {
                Some(f) => f,
                None if parts.plain_mlp => Ffn::Plain {
                    up: w.linear(&p("ffn_up"), ff, d)?,
                    down: w.linear(&p("ffn_down"), d, ff)?,
                },
                None => {
                    let down = w.linear(&p("ffn_down"), d, ff)?;
                    let (gate, up) = if parts.fused_gate_up {
                        let name = p("ffn_up.weight");
                        let first = split(name.clone(), 0, ff, 2 * ff)?;
                        (first, split(name, ff, ff, 2 * ff)?)
                    } else {
                        (
                            w.linear(&p("ffn_gate"), ff, d)?,
                            w.linear(&p("ffn_up"), ff, d)?,
                        )
                    };
                    Ffn::Dense(Expert { gate, up, down })
                }
            };
            Ok(DecoderLayer {
                attn_norm: w.norm(&p("attn_norm.weight"), d)?,
                attn_norm_b: bias(parts.norm_bias, p("attn_norm.bias"), d)?,
                q_norm: opt(parts.qk_norm, p("attn_q_norm.weight"), hd)?,
                k_norm: opt(parts.qk_norm && has_kv, p("attn_k_norm.weight"), hd)?,
                wq,
                q_gate: false,
                delta: None,
                mla: None,
                wk,
                wv,
                v_norm: (parts.v_norm && has_kv).then(|| vec![1.0; hd]),
                out_scale: match parts.out_scale {
                    true => w
                        .vector_opt(&p("layer_output_scale.weight"), 1)?
                        .map(|s| s[0]),
                    false => None,
                },
                ple: None,
                sinks: None,
                wo: w.linear(&p("attn_output"), d, qd)?,
                post_attn_norm: opt(parts.post_norms, p("post_attention_norm.weight"), d)?,
                ffn_norm: w.norm(&p("ffn_norm.weight"), d)?,
                ffn_norm_b: bias(parts.norm_bias, p("ffn_norm.bias"), d)?,
                ffn,
                post_ffn_norm: opt(parts.post_norms, p("post_ffw_norm.weight"), d)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let final_norm = cfg.final_norm;
    let output_norm = match final_norm {
        true => w.norm("output_norm.weight", d)?,
        false => Vec::new(),
    };
    // The head reads the token embedding's width (narrower than the layers' with an
    // embedding projection, which the family attaches).
    let output = match w.info("output.weight") {
        Some(_) => w.linear("output", cfg.n_vocab, tok_embd.cols)?,
        None => Linear::new(tok_embd.clone(), None),
    };
    let output_norm_b = bias(parts.norm_bias && final_norm, "output_norm.bias".into(), d)?;
    Ok(Model {
        config: cfg,
        tok_embd,
        pos_embd: None,
        ple: None,
        layers,
        output_norm,
        output_norm_b,
        embd_proj: None,
        output,
        file,
        stream: None,
        evicted_from: None,
    })
}

/// The Hugging Face folder of a family llama.cpp has no architecture for (OPT, CodeGen):
/// no GGUF file names such a family, so a GGUF source is an unknown architecture.
pub fn hf_only<'a>(src: &'a Source, arch: &str) -> Result<&'a HfFolder> {
    match src {
        Source::Hf(hf) => Ok(hf),
        Source::Gguf(file) => Err(crate::error::ModelError::UnknownArchitecture {
            path: file.path().to_path_buf(),
            arch: arch.to_string(),
            supported: "this family runs from Hugging Face folders only".into(),
        }),
    }
}
