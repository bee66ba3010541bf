//! Qwen3-MoE: Qwen2-MoE's sparse layers on the Qwen3 decoder — per-head RMSNorm of queries
//! and keys before RoPE, no QKV bias — without a shared expert; the top-k weights are
//! renormalized when `norm_topk_prob` (GGUF `qwen3moe`: always, as llama.cpp does).
//! `decoder_sparse_step` / `mlp_only_layers` keep some layers dense.
//!
//! Reference: transformers `models/qwen3_moe/modeling_qwen3_moe.py`.

use super::Source;
use super::decoder::Parts;
use super::qwen2moe::load_moe;
use crate::error::Result;
use crate::model::Model;

pub(super) fn load(src: &Source, arch: &str) -> Result<Model> {
    let parts = Parts {
        qk_norm: true,
        ..Parts::default()
    };
    load_moe(src, arch, parts, true)
}
