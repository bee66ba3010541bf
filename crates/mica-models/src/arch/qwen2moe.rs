//! Qwen2-MoE: the Qwen2 decoder (QKV bias, NeoX RoPE) whose sparse layers replace the MLP by
//! a mixture of experts: softmax router, top-k experts per token (renormalized only with
//! `norm_topk_prob`), plus a shared expert scaled by `sigmoid(x · g)`
//! ([`crate::blocks::moe`], layers from [`super::experts`]). Layers in `mlp_only_layers`, or
//! off the `decoder_sparse_step` grid, stay dense.
//!
//! From Hugging Face folders (`mlp.experts.{e}.{gate,up,down}_proj`) and from GGUF
//! (`qwen2moe`, experts stacked; llama.cpp never renormalizes for this architecture).
//! Reference: transformers `models/qwen2_moe/modeling_qwen2_moe.py`.

use super::Source;
use super::decoder::{Parts, build_with, token_embedding};
use super::experts;
use crate::error::Result;
use crate::model::Model;
use crate::names::QWEN_MOE_HF;
use mica_kernels::ops::RopeStyle;

pub(super) fn load(src: &Source, arch: &str) -> Result<Model> {
    load_moe(src, arch, Parts::default(), false)
}

/// The Qwen-MoE decoders (Qwen3-MoE adds `parts.qk_norm`); `gguf_norm`: whether llama.cpp
/// renormalizes the top-k weights for this GGUF architecture.
pub(super) fn load_moe(src: &Source, arch: &str, parts: Parts, gguf_norm: bool) -> Result<Model> {
    match src {
        Source::Gguf(file) => experts::load_gguf(file, arch, RopeStyle::Neox, parts, gguf_norm)?
            .ok_or_else(|| experts::no_experts(file, arch)),
        Source::Hf(hf) => {
            let w = hf.weights(arch, &QWEN_MOE_HF);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            let on = hf.config.use_sliding_window.unwrap_or(false);
            cfg.layer_window = hf.layer_windows(cfg.n_layer, on, None)?;
            let spec = experts::qwen_hf_spec(hf)?;
            let d = cfg.n_embd;
            build_with(&w, cfg, tok_embd, parts, None, &|i| spec.layer(&w, i, d))
        }
    }
}
