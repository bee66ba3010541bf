//! SmolLM3: the LLaMA decoder ([`super::llama`]: RMSNorm, GQA, SwiGLU, tied head in the
//! published models) whose NoPE layers skip RoPE: their queries and keys are not rotated,
//! so attention there sees no position but the causal mask.
//!
//! Which layers are NoPE: transformers reads `no_rope_layers` (per layer, 1 = RoPE, 0 =
//! NoPE), or without it makes every `no_rope_layer_interval`-th layer NoPE (default 4: layers
//! 3, 7, 11, …). GGUF has no key for it: llama.cpp's `smollm3` graph fixes the interval at 4
//! (`n_no_rope_layer_step`), so mica reads `smollm3` files the same way, and a folder whose
//! pattern differs cannot be written as one. The flag travels to attention as
//! [`crate::ModelConfig::layer_rope`], read through [`crate::ModelConfig::rope_of`] beside
//! the per-layer sliding window. The optional sliding window (`use_sliding_window` with
//! `layer_types`) is loaded as for LLaMA; llama.cpp's graph has none, so a converted file
//! drops it with a warning.
//!
//! References: transformers `models/smollm3/{configuration,modeling}_smollm3.py`;
//! llama.cpp `src/models/smollm3.cpp` and `conversion/llama.py` (`SmolLM3Model`, a
//! `LlamaModel`: query and key rows permuted for adjacent-pair RoPE).

use super::Source;
use super::decoder::Parts;
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::llama::{HF_NAMES, load as load_llama, window_dropped};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "smollm3",
    gguf_archs: &["smollm3"],
    hf_classes: &["SmolLM3ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "smollm3",
        permute_qk: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// transformers' default `no_rope_layer_interval`, and llama.cpp's fixed
/// `n_no_rope_layer_step`.
const INTERVAL: usize = 4;

fn load(src: &Source, arch: &str) -> Result<Model> {
    // GGUF files are permuted for adjacent-pair RoPE, as llama.cpp's `llama` ones.
    let mut model = load_llama(src, arch, RopeStyle::Normal, Parts::default())?;
    let n_layer = model.config.n_layer;
    match src {
        Source::Gguf(_) => model.config.layer_rope = every_nth_nope(n_layer, INTERVAL),
        Source::Hf(hf) => {
            model.config.layer_rope = hf_layer_rope(hf, n_layer)?;
            // transformers windows a `sliding_attention` layer only when
            // `use_sliding_window` is set.
            if hf.config.use_sliding_window != Some(true) {
                model.config.layer_window = vec![None; n_layer];
            }
        }
    }
    Ok(model)
}

/// `[n_layer]` whether each layer applies RoPE: all but every `n`-th (layer `il` is NoPE
/// when `(il + 1) % n == 0`).
fn every_nth_nope(n_layer: usize, n: usize) -> Vec<bool> {
    (0..n_layer).map(|il| (il + 1) % n != 0).collect()
}

/// `no_rope_layers` when config.json lists it, else every `no_rope_layer_interval`-th layer
/// NoPE.
fn hf_layer_rope(hf: &HfFolder, n_layer: usize) -> Result<Vec<bool>> {
    let c = &hf.config;
    if let Some(flags) = &c.no_rope_layers {
        if flags.len() != n_layer {
            return Err(hf.field_err(
                "no_rope_layers",
                format!("{} entries for {n_layer} layers", flags.len()),
            ));
        }
        return flags
            .iter()
            .map(|v| match (v.as_u64(), v.as_bool()) {
                (Some(1), _) | (_, Some(true)) => Ok(true),
                (Some(0), _) | (_, Some(false)) => Ok(false),
                _ => Err(hf.field_err(
                    "no_rope_layers",
                    format!("expected 1 (RoPE) or 0 (NoPE) per layer, got {v}"),
                )),
            })
            .collect();
    }
    let n = hf.required(
        "no_rope_layer_interval",
        Some(c.no_rope_layer_interval.unwrap_or(INTERVAL)),
    )?;
    Ok(every_nth_nope(n_layer, n))
}

/// A `smollm3` file says nothing of the NoPE layers (llama.cpp makes every 4th one NoPE), so
/// only a model with that pattern can be written; its sliding window, if any, is dropped
/// with a warning (llama.cpp's graph has none).
fn gguf_keys(model: &Model, hf: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    let cfg = &model.config;
    if cfg.layer_rope != every_nth_nope(cfg.n_layer, INTERVAL) {
        let nope: Vec<usize> = (0..cfg.n_layer).filter(|&l| !cfg.layer_rope[l]).collect();
        return Err(format!(
            "llama.cpp's smollm3 skips RoPE on every {INTERVAL}th layer and GGUF has no key to \
             say otherwise; this model's NoPE layers are {nope:?} (no_rope_layers)"
        ));
    }
    window_dropped(model, hf, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fourth_layer_is_nope() {
        assert_eq!(
            every_nth_nope(9, 4),
            [true, true, true, false, true, true, true, false, true]
        );
        assert_eq!(every_nth_nope(3, 1), [false; 3]);
    }
}
