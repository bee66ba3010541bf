//! Gemma 3 (text): a pre-norm decoder with
//! - token embeddings scaled by `sqrt(n_embd)`;
//! - `(1 + w)` RMSNorm (checkpoints store `w`; llama.cpp's converter folds the 1 into the
//!   GGUF, so only the safetensors path adds it);
//! - RMSNorm of each query and key head before RoPE, and RMSNorm of each sub-block's output
//!   before its residual add (four norms per layer);
//! - GeGLU feed-forward (GELU, tanh approximation);
//! - local layers with a sliding window and their own RoPE base (10 000), every
//!   `pattern`-th layer global (base 1 000 000, scaled where configured);
//! - queries scaled by `query_pre_attn_scalar^-1/2` before attention (llama.cpp: `1/sqrt
//!   (head_dim)`, or `1/sqrt(n_embd / n_head)` for the 27B model);
//! - optional final logit soft-capping. (`attn_logit_softcapping`, a Gemma 2 feature, is
//!   ignored by both references for Gemma 3 — llama.cpp's graph and transformers'
//!   attention — so mica ignores it too.)
//!
//! References: Gemma 3 technical report (2025); llama.cpp `src/models/gemma3.cpp`;
//! transformers `models/gemma3/modeling_gemma3.py`.

use super::Source;
use super::decoder::{Parts, build, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{Activation, ModelConfig, RopeConfig};
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use mica_formats::MetaValue;
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "gemma3",
    gguf_archs: &["gemma3"],
    hf_classes: &["Gemma3ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gemma3",
        norm_plus_one: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Gemma 3: pre- and post-norms around both sub-blocks.
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        (
            "post_attention_norm.weight",
            "post_attention_layernorm.weight"
        ),
        ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
        ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ],
};

const PARTS: Parts = Parts {
    qk_norm: true,
    post_norms: true,
    fused_qkv: false,
    fused_gate_up: false,
    norm_bias: false,
    plain_mlp: false,
    optional_v: false,
    v_norm: false,
    out_scale: false,
};

/// Every `DEFAULT_PATTERN`-th layer is global unless the model says otherwise.
const DEFAULT_PATTERN: usize = 6;

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, cfg, tok_embd, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            let key = |k: &str| format!("{arch}.{k}");
            let window = file
                .get_u64(&key("attention.sliding_window"))
                .filter(|&w| w > 0)
                .map(|w| w as usize);
            let pattern_key = key("attention.sliding_window_pattern");
            let is_local: Vec<bool> = match file.metadata(&pattern_key) {
                Some(MetaValue::Array(a)) => match a {
                    mica_formats::MetaArray::Bool(b) if b.len() == cfg.n_layer => b.clone(),
                    _ => {
                        return Err(ModelError::Config {
                            path: file.path().to_path_buf(),
                            key: pattern_key,
                            msg: format!("expected {} booleans (one per layer)", cfg.n_layer),
                        });
                    }
                },
                Some(v) => pattern(cfg.n_layer, v.as_u64().unwrap_or(0) as usize),
                None => pattern(cfg.n_layer, DEFAULT_PATTERN),
            };
            let local_base = file.get_f32(&key("rope.freq_base_swa")).unwrap_or(10000.0);
            let q_scale = gguf_q_scale(&cfg);
            let final_cap = file
                .get_f32(&key("final_logit_softcapping"))
                .filter(|&c| c > 0.0);
            finish(&mut cfg, window, &is_local, local_base, q_scale, final_cap);
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &HF_NAMES);
            w.norm_offset = 1.0;
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            let c = &hf.config;
            let windows = hf.layer_windows(
                cfg.n_layer,
                true,
                Some(c.sliding_window_pattern.unwrap_or(DEFAULT_PATTERN)),
            )?;
            let is_local: Vec<bool> = windows.iter().map(Option::is_some).collect();
            let local = hf.rope(hf.rope_params("sliding_attention"), cfg.head_dim)?;
            let local_base = match (&c.rope_parameters, c.rope_local_base_freq) {
                (Some(p), _) if p.get("sliding_attention").is_some() => local.freq_base,
                (_, Some(b)) => b as f32,
                _ => 10000.0,
            };
            let qpas = c.query_pre_attn_scalar.unwrap_or(cfg.head_dim as f64);
            let q_scale = (1.0 / qpas.sqrt()) as f32;
            let final_cap = c
                .final_logit_softcapping
                .filter(|&c| c > 0.0)
                .map(|c| c as f32);
            let window = windows.iter().flatten().next().copied();
            finish(&mut cfg, window, &is_local, local_base, q_scale, final_cap);
            (w, cfg, tok_embd, None)
        }
    };
    build(&w, cfg, tok_embd, PARTS, file)
}

/// The query scale llama.cpp applies to a `gemma3` file: `1/sqrt(head_dim)`, or
/// `1/sqrt(n_embd / n_head)` for the 62-layer (27B) model.
fn gguf_q_scale(cfg: &ModelConfig) -> f32 {
    if cfg.n_layer == 62 {
        1.0 / ((cfg.n_embd / cfg.n_head) as f32).sqrt()
    } else {
        1.0 / (cfg.head_dim as f32).sqrt()
    }
}

/// What a `gemma3` file says beyond the shared keys: the window, the local RoPE base and
/// the final soft-cap. llama.cpp fixes the rest — every 6th layer global, the query scale
/// ([`gguf_q_scale`]) — so a model that differs cannot be written.
fn gguf_keys(model: &Model, _: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    let cfg = &model.config;
    let want = pattern(cfg.n_layer, DEFAULT_PATTERN);
    let is_local: Vec<bool> = cfg.layer_window.iter().map(Option::is_some).collect();
    let window = cfg.layer_window.iter().flatten().next().copied();
    match window {
        Some(w) if is_local == want && cfg.layer_window.iter().flatten().all(|&x| x == w) => {
            keys.u32("attention.sliding_window", w);
        }
        _ => {
            return Err(format!(
                "llama.cpp's gemma3 makes every {DEFAULT_PATTERN}th layer global and the others \
                 local with one sliding window; this model's layers are {:?} (layer_types / \
                 sliding_window)",
                cfg.layer_window
            ));
        }
    }
    if let Some(local) = &cfg.rope_local {
        keys.f32("rope.freq_base_swa", local.freq_base);
    }
    let (got, want) = (cfg.q_scale.unwrap_or(1.0), gguf_q_scale(cfg));
    if (got - want).abs() > 1e-6 * want {
        return Err(format!(
            "the queries are scaled by {got} (query_pre_attn_scalar), and GGUF has no key for \
             it: llama.cpp's gemma3 scales by {want}"
        ));
    }
    if let Some(c) = cfg.final_softcap {
        keys.f32("final_logit_softcapping", c);
    }
    Ok(())
}

/// `[n_layer]` whether each layer is local: all but every `n`-th (llama.cpp's
/// `set_swa_pattern`, transformers' `sliding_window_pattern`); `n = 0` means all local.
fn pattern(n_layer: usize, n: usize) -> Vec<bool> {
    (0..n_layer).map(|il| n == 0 || il % n < n - 1).collect()
}

/// Sets what Gemma 3 adds to the shared decoder config.
fn finish(
    cfg: &mut ModelConfig,
    window: Option<usize>,
    is_local: &[bool],
    local_base: f32,
    q_scale: f32,
    final_cap: Option<f32>,
) {
    cfg.embd_scale = Some((cfg.n_embd as f32).sqrt());
    cfg.act = Activation::GeluTanh;
    cfg.q_scale = Some(q_scale);
    cfg.final_softcap = final_cap;
    if let Some(win) = window {
        cfg.layer_window = is_local.iter().map(|&l| l.then_some(win)).collect();
        cfg.rope_local = Some(RopeConfig {
            freq_base: local_base,
            freq_scale: 1.0,
            freq_factors: None,
            ..cfg.rope.clone()
        });
    }
}
