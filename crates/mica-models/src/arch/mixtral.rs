//! Mixtral: the Mistral decoder (GQA, sliding window where configured) whose every MLP is a
//! mixture of `num_local_experts` SwiGLU experts: softmax over the router logits, the top
//! `num_experts_per_tok` renormalized to sum 1, no shared expert ([`crate::blocks::moe`]).
//!
//! From Hugging Face folders (`block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1` gate,
//! `w3` up, `w2` down). GGUF files call it `llama` with `llama.expert_count`: the LLaMA
//! loader hands those to [`super::experts::load_gguf`] (stacked experts, renormalized).
//! Reference: transformers `models/mixtral/modeling_mixtral.py`; Mixtral of Experts (2024).

use super::Source;
use super::decoder::{Parts, build_with, token_embedding};
use super::experts::{self, MoeSpec};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::llama::window_dropped;
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};

pub(super) static FAMILY: Family = Family {
    name: "mixtral",
    gguf_archs: &[],
    hf_classes: &["MixtralForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "llama",
        permute_qk: true,
        stack_experts: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Mixtral: the router `block_sparse_moe.gate`, experts `block_sparse_moe.experts.{e}.w1`
/// (gate), `w3` (up), `w2` (down).
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate_inp.weight", "block_sparse_moe.gate.weight"),
        (
            "ffn_gate_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w1.weight"
        ),
        (
            "ffn_up_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w3.weight"
        ),
        (
            "ffn_down_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w2.weight"
        ),
    ],
};

/// `llama.expert_count` / `expert_used_count` (llama.cpp renormalizes a `llama` file's top-k
/// weights); the sliding window is dropped, as for every `llama` file.
fn gguf_keys(model: &Model, hf: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    experts::gguf_keys(model, keys, true, false)?;
    window_dropped(model, hf, keys)
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let hf = match src {
        Source::Gguf(_) => return super::llama::load_llama(src, arch),
        Source::Hf(hf) => hf,
    };
    let w = hf.weights(arch, &HF_NAMES);
    let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
    let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
    cfg.layer_window = hf.layer_windows(cfg.n_layer, true, None)?;
    let c = &hf.config;
    let n_expert = hf.required("num_local_experts", c.num_local_experts)?;
    let top_k = hf.required("num_experts_per_tok", c.num_experts_per_tok)?;
    if top_k > n_expert {
        return Err(hf.field_err(
            "num_experts_per_tok",
            format!("{top_k} experts per token of {n_expert}"),
        ));
    }
    let spec = MoeSpec {
        n_expert,
        top_k,
        n_ff: cfg.n_ff,
        norm_topk: true,
        shared_ff: None,
        dense_layers: Vec::new(),
        sparse_step: 1,
        stacked: false,
        mlp_beside: false,
    };
    let d = cfg.n_embd;
    build_with(&w, cfg, tok_embd, Parts::default(), None, &|i| {
        spec.layer(&w, i, d)
    })
}
