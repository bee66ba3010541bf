//! Qwen2 / Qwen2.5: the LLaMA decoder ([`super::llama`]) with Q/K/V biases (loaded
//! whenever the checkpoint has them) and RoPE over halves in GGUF too (llama.cpp's `qwen2`
//! graph uses NeoX RoPE, so its converter does not permute Q/K). A sliding window applies
//! only where `use_sliding_window` (or `layer_types`) says so.
//!
//! Reference: transformers `models/qwen2/modeling_qwen2.py`; llama.cpp `src/models/qwen2.cpp`.

use super::Source;
use super::decoder::Parts;
use super::family::{Family, GgufHints, PLAIN};
use super::llama::{HF_NAMES, load, window_dropped};
use crate::error::Result;
use crate::model::Model;
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "qwen2",
    gguf_archs: &["qwen2"],
    hf_classes: &["Qwen2ForCausalLM"],
    hf_names: &HF_NAMES,
    load: load_qwen2,
    gguf: GgufHints {
        arch: "qwen2",
        keys: window_dropped,
        ..PLAIN
    },
};

fn load_qwen2(src: &Source, arch: &str) -> Result<Model> {
    load(src, arch, RopeStyle::Neox, Parts::default())
}
