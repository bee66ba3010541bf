//! LLaMA family (LLaMA 1-3, SmolLM, TinyLlama, Mistral); its loader also builds Qwen2 /
//! Qwen2.5 ([`super::qwen2`]), Qwen3 ([`super::qwen3`]) and SmolLM3 ([`super::smollm3`]).
//!
//! Pre-norm decoder: RMSNorm → attention (GQA, RoPE) → residual → RMSNorm → SwiGLU MLP →
//! residual; final RMSNorm and an output head that may be tied to the token embedding.
//! Differences between the members are data: Qwen2 has Q/K/V biases (loaded whenever the
//! file has them); Qwen3 normalizes each query and key head before RoPE. GGUF LLaMA weights
//! were permuted by llama.cpp's converter for adjacent-pair RoPE; every other layout (and
//! every transformers checkpoint) rotates halves. Llama-3 RoPE scaling arrives as
//! `rope_freqs.weight` in GGUF, as `rope_scaling` in config.json. Mistral's sliding window
//! applies to every layer when configured. A GGUF file of these architectures with
//! `{arch}.expert_count` (Mixtral) loads as a mixture of experts ([`super::experts`]).

use super::Source;
use super::decoder::{Parts, build, gguf_start, token_embedding};
use super::experts;
use super::family::{Family, GgufHints, GgufKeys, GgufWarning, PLAIN};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "llama",
    gguf_archs: &["llama", "mistral"],
    hf_classes: &["LlamaForCausalLM", "MistralForCausalLM"],
    hf_names: &HF_NAMES,
    load: load_llama,
    gguf: GgufHints {
        arch: "llama",
        permute_qk: true,
        keys: window_dropped,
        ..PLAIN
    },
};

/// LLaMA, Mistral, Qwen2, Qwen3.
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![("ffn_norm.weight", "post_attention_layernorm.weight")],
};

pub(super) fn load_llama(src: &Source, arch: &str) -> Result<Model> {
    load(src, arch, RopeStyle::Normal, Parts::default())
}

/// The GGUF architectures of this loader (`llama`, `qwen2`, `qwen3`) have no sliding
/// window: a model that has one is written without it (as llama.cpp's converter does),
/// with a warning.
pub(super) fn window_dropped(
    model: &Model,
    _: &HfFolder,
    keys: &mut GgufKeys,
) -> std::result::Result<(), String> {
    let cfg = &model.config;
    if let Some(w) = cfg
        .layer_window
        .iter()
        .flatten()
        .copied()
        .filter(|&w| w < cfg.n_ctx_train)
        .min()
    {
        keys.warnings.push(GgufWarning::SlidingWindowDropped {
            window: w,
            arch: keys.arch,
        });
    }
    Ok(())
}

/// `gguf_style`: how the family's GGUF files rotate (transformers checkpoints always rotate
/// halves). Shared by Qwen2 and Qwen3.
pub(super) fn load(src: &Source, arch: &str, gguf_style: RopeStyle, parts: Parts) -> Result<Model> {
    match src {
        Source::Gguf(file) => {
            // Mixtral (and other MoE files of these architectures): stacked experts,
            // renormalized top-k as llama.cpp's LLaMA graph does.
            if let Some(m) = experts::load_gguf(file, arch, gguf_style, parts, true)? {
                return Ok(m);
            }
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, gguf_style)?;
            cfg.rope.freq_factors = w.vector_opt("rope_freqs.weight", cfg.rope.n_dims / 2)?;
            // (llama.cpp runs these GGUF architectures without a sliding window; so does mica.)
            build(&w, cfg, tok_embd, parts, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            let c = &hf.config;
            // Qwen2 configs carry a window that is off unless `use_sliding_window` is set;
            // `layer_types` (transformers ≥ 4.53) says per layer.
            let on = c
                .use_sliding_window
                .unwrap_or(c.model_type.as_deref() == Some("mistral"));
            cfg.layer_window = hf.layer_windows(cfg.n_layer, on, None)?;
            build(&w, cfg, tok_embd, parts, None)
        }
    }
}
