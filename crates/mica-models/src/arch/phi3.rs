//! Phi-3 (mini / medium, 4k and 128k context): a LLaMA-style pre-norm decoder whose Q, K, V
//! projections are one fused `qkv` matrix and whose gate and up projections are one fused
//! `gate_up` matrix (gate first), both split at load into row views of the same bytes.
//! NeoX-style RoPE, optionally over part of each head (`partial_rotary_factor`); a sliding
//! window on every layer where configured.
//!
//! LongRoPE / "su" scaling (the 128k models): per-pair short and long frequency factors and
//! an attention factor, from `rope_scaling` (HF) or the `rope_factors_{short,long}.weight`
//! tensors with `rope.scaling.{original_context_length,attn_factor}` (GGUF); which factors
//! apply is decided by the cache size ([`crate::config::LongRope`]).
//!
//! References: Phi-3 technical report (2024); llama.cpp `src/models/phi3.cpp`; transformers
//! `models/phi3/modeling_phi3.py`.

use super::Source;
use super::decoder::{Parts, build, gguf_start, token_embedding};
use crate::config::LongRope;
use crate::error::Result;
use crate::model::Model;
use crate::names::PHI3_HF;
use mica_kernels::ops::RopeStyle;

const PARTS: Parts = Parts {
    qk_norm: false,
    post_norms: false,
    fused_qkv: true,
    fused_gate_up: true,
    norm_bias: false,
    plain_mlp: false,
};

pub(super) fn load(src: &Source, arch: &str) -> Result<Model> {
    match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            if let Some(win) = file.get_u64(&format!("{arch}.attention.sliding_window")) {
                cfg.layer_window = vec![Some(win as usize).filter(|&w| w > 0); cfg.n_layer];
            }
            if w.info("rope_factors_long.weight").is_some() {
                let half = cfg.rope.n_dims / 2;
                let key = |k: &str| format!("{arch}.rope.scaling.{k}");
                cfg.long_rope = Some(LongRope {
                    short: w.vector("rope_factors_short.weight", half)?,
                    long: w.vector("rope_factors_long.weight", half)?,
                    original_ctx: file
                        .get_u64(&key("original_context_length"))
                        .map_or(cfg.n_ctx_train, |v| v as usize),
                    attn_factor: file.get_f32(&key("attn_factor")).unwrap_or(1.0),
                });
            }
            build(&w, cfg, tok_embd, PARTS, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let w = hf.weights(arch, &PHI3_HF);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.layer_window = hf.layer_windows(cfg.n_layer, true, None)?;
            build(&w, cfg, tok_embd, PARTS, None)
        }
    }
}
