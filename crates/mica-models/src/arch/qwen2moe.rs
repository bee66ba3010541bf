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
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "qwen2moe",
    gguf_archs: &["qwen2moe"],
    hf_classes: &["Qwen2MoeForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "qwen2moe",
        stack_experts: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Qwen2-MoE / Qwen3-MoE: one set of matrices per expert (`mlp.experts.{e}.*`), the router
/// (`mlp.gate`), a shared expert and its gate (Qwen2-MoE).
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate_inp.weight", "mlp.gate.weight"),
        (
            "ffn_gate_exp.{e}.weight",
            "mlp.experts.{e}.gate_proj.weight"
        ),
        ("ffn_up_exp.{e}.weight", "mlp.experts.{e}.up_proj.weight"),
        (
            "ffn_down_exp.{e}.weight",
            "mlp.experts.{e}.down_proj.weight"
        ),
        (
            "ffn_gate_shexp.weight",
            "mlp.shared_expert.gate_proj.weight"
        ),
        ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
        (
            "ffn_down_shexp.weight",
            "mlp.shared_expert.down_proj.weight"
        ),
        ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ],
};

/// The expert keys; llama.cpp's `qwen2moe` graph never renormalizes the top-k weights.
fn gguf_keys(model: &Model, _: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    experts::gguf_keys(model, keys, false, true)
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    load_moe(src, arch, Parts::default(), false)
}

/// The Qwen-MoE decoders (Qwen3-MoE adds `parts.qk_norm`); `gguf_norm`: whether llama.cpp
/// renormalizes the top-k weights for this GGUF architecture.
pub(super) fn load_moe(src: &Source, arch: &str, parts: Parts, gguf_norm: bool) -> Result<Model> {
    match src {
        Source::Gguf(file) => experts::load_gguf(file, arch, RopeStyle::Neox, parts, gguf_norm)?
            .ok_or_else(|| experts::no_experts(file, arch)),
        Source::Hf(hf) => {
            let w = hf.weights(arch, &HF_NAMES);
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
