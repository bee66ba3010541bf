//! Qwen3 (dense): the Qwen2 decoder without Q/K/V biases, with an RMSNorm of each query and
//! key head before RoPE (`q_norm`, `k_norm`).
//!
//! Reference: transformers `models/qwen3/modeling_qwen3.py`; llama.cpp `src/models/qwen3.cpp`.

use super::Source;
use super::decoder::Parts;
use super::family::{Family, GgufHints, PLAIN};
use super::llama::{HF_NAMES, load, window_dropped};
use crate::error::Result;
use crate::model::Model;
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "qwen3",
    gguf_archs: &["qwen3"],
    hf_classes: &["Qwen3ForCausalLM"],
    hf_names: &HF_NAMES,
    load: load_qwen3,
    gguf: GgufHints {
        arch: "qwen3",
        keys: window_dropped,
        ..PLAIN
    },
};

fn load_qwen3(src: &Source, arch: &str) -> Result<Model> {
    let parts = Parts {
        qk_norm: true,
        ..Parts::default()
    };
    load(src, arch, RopeStyle::Neox, parts)
}
