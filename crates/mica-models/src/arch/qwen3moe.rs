//! Qwen3-MoE: Qwen2-MoE's sparse layers on the Qwen3 decoder — per-head RMSNorm of queries
//! and keys before RoPE, no QKV bias — without a shared expert; the top-k weights are
//! renormalized when `norm_topk_prob` (GGUF `qwen3moe`: always, as llama.cpp does).
//! `decoder_sparse_step` / `mlp_only_layers` keep some layers dense.
//!
//! Reference: transformers `models/qwen3_moe/modeling_qwen3_moe.py`.

use super::Source;
use super::decoder::Parts;
use super::experts;
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::qwen2moe::{HF_NAMES, load_moe};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;

pub(super) static FAMILY: Family = Family {
    name: "qwen3moe",
    gguf_archs: &["qwen3moe"],
    hf_classes: &["Qwen3MoeForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "qwen3moe",
        stack_experts: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// The expert keys; llama.cpp's `qwen3moe` graph always renormalizes the top-k weights.
fn gguf_keys(model: &Model, _: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    experts::gguf_keys(model, keys, true, true)
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let parts = Parts {
        qk_norm: true,
        ..Parts::default()
    };
    load_moe(src, arch, parts, true)
}
