//! LLaMA family (LLaMA 1-3, SmolLM, TinyLlama, Mistral) and Qwen2 / Qwen2.5.
//!
//! Pre-norm decoder: RMSNorm → attention (GQA, RoPE) → residual → RMSNorm → SwiGLU MLP →
//! residual; final RMSNorm and an output head that may be tied to the token embedding.
//! Differences between the members are data: Qwen2 has Q/K/V biases (loaded whenever the
//! file has them) and rotates NeoX-style; GGUF LLaMA weights were permuted by the converter
//! for adjacent-pair RoPE. Llama-3 RoPE scaling arrives as `rope_freqs.weight`.

use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::{DecoderLayer, Model};
use crate::weights::{Linear, WeightLoader};
use mica_formats::GgufFile;
use mica_kernels::ops::RopeStyle;
use std::sync::Arc;

pub(super) fn load_llama(file: Arc<GgufFile>, arch: &str) -> Result<Model> {
    load(file, arch, RopeStyle::Normal)
}

pub(super) fn load_qwen2(file: Arc<GgufFile>, arch: &str) -> Result<Model> {
    load(file, arch, RopeStyle::Neox)
}

fn load(file: Arc<GgufFile>, arch: &str, style: RopeStyle) -> Result<Model> {
    let w = WeightLoader {
        file: file.clone(),
        arch: arch.to_string(),
    };
    let n_embd_key = format!("{arch}.embedding_length");
    let n_embd = file.get_u64(&n_embd_key).unwrap_or(0) as usize;
    let tok_embd = w.matrix_any_rows("token_embd.weight", n_embd.max(1))?;
    let mut cfg = ModelConfig::from_gguf(&file, arch, style, tok_embd.rows)?;
    cfg.rope.freq_factors = w.vector_opt("rope_freqs.weight", cfg.rope.n_dims / 2)?;

    let (d, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let layers = (0..cfg.n_layer)
        .map(|i| {
            let p = |s: &str| format!("blk.{i}.{s}");
            Ok(DecoderLayer {
                attn_norm: w.vector(&p("attn_norm.weight"), d)?,
                wq: w.linear(&p("attn_q"), qd, d)?,
                wk: w.linear(&p("attn_k"), kvd, d)?,
                wv: w.linear(&p("attn_v"), kvd, d)?,
                wo: w.linear(&p("attn_output"), d, qd)?,
                ffn_norm: w.vector(&p("ffn_norm.weight"), d)?,
                gate: w.linear(&p("ffn_gate"), ff, d)?,
                up: w.linear(&p("ffn_up"), ff, d)?,
                down: w.linear(&p("ffn_down"), d, ff)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let output_norm = w.vector("output_norm.weight", d)?;
    let output = match w.info("output.weight") {
        Some(_) => w.linear("output", cfg.n_vocab, d)?,
        None => Linear {
            w: tok_embd.clone(),
            bias: None,
        },
    };
    Ok(Model {
        config: cfg,
        tok_embd,
        layers,
        output_norm,
        output,
        file,
    })
}
