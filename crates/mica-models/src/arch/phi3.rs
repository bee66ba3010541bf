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
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::LongRope;
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "phi3",
    gguf_archs: &["phi3"],
    hf_classes: &["Phi3ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "phi3",
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Phi-3: fused `qkv_proj` and `gate_up_proj` (split by row ranges at load).
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: &[
        ("attn_norm.weight", "input_layernorm.weight"),
        ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
        ("attn_output.weight", "self_attn.o_proj.weight"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_up.weight", "mlp.gate_up_proj.weight"),
        ("ffn_down.weight", "mlp.down_proj.weight"),
    ],
};

/// `phi3.attention.sliding_window` (0: none; one window for every layer, as llama.cpp's
/// graph applies it), and LongRoPE's `rope.scaling.original_context_length` and
/// `rope.scaling.attn_factor` (its factors are tensors). Without LongRoPE, llama.cpp's
/// converter writes config.json's `original_max_position_embeddings` when it has one.
fn gguf_keys(
    model: &Model,
    hf: &HfFolder,
    keys: &mut GgufKeys,
) -> std::result::Result<(), String> {
    let cfg = &model.config;
    let first = cfg.layer_window.first().copied().flatten();
    if cfg.layer_window.iter().any(|&w| w != first) {
        return Err(format!(
            "llama.cpp's phi3 applies one sliding window to every layer; this model's layers \
             have {:?}",
            cfg.layer_window
        ));
    }
    match &cfg.long_rope {
        Some(lr) => {
            keys.u32("rope.scaling.original_context_length", lr.original_ctx);
            keys.f32("rope.scaling.attn_factor", lr.attn_factor);
        }
        None => {
            if let Some(orig) = hf.config.original_max_position_embeddings {
                keys.u32("rope.scaling.original_context_length", orig);
            }
        }
    }
    keys.u32("attention.sliding_window", first.unwrap_or(0));
    Ok(())
}

const PARTS: Parts = Parts {
    qk_norm: false,
    post_norms: false,
    fused_qkv: true,
    fused_gate_up: true,
    norm_bias: false,
    plain_mlp: false,
    optional_v: false,
    v_norm: false,
    out_scale: false,
};

fn load(src: &Source, arch: &str) -> Result<Model> {
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
            let w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.layer_window = hf.layer_windows(cfg.n_layer, true, None)?;
            build(&w, cfg, tok_embd, PARTS, None)
        }
    }
}
