//! Gemma 2: a pre-norm decoder with
//! - token embeddings scaled by `sqrt(n_embd)`;
//! - `(1 + w)` RMSNorm (checkpoints store `w`; llama.cpp's converter folds the 1 into the
//!   GGUF, so only the safetensors path adds it);
//! - RMSNorm of each sub-block's output before its residual add (four norms per layer, no
//!   per-head Q/K norm);
//! - GeGLU feed-forward (GELU, tanh approximation);
//! - local and global layers alternating, local first: even layers attend within a sliding
//!   window, odd layers to the whole context; one RoPE for both;
//! - queries scaled by `query_pre_attn_scalar^-1/2` before attention (llama.cpp:
//!   `1/sqrt(head_dim)`, or `1/sqrt(n_embd / n_head)` for the 46-layer 27B model);
//! - attention logit soft-capping (`attn_logit_softcapping`, llama.cpp's default 50) and
//!   final logit soft-capping (`final_logit_softcapping`, default 30).
//!
//! Every piece is one mica already runs for Gemma 3; this file only maps the keys.
//!
//! References: Gemma 2 technical report (2024); llama.cpp `src/models/gemma2-iswa.cpp`;
//! transformers `models/gemma2/modeling_gemma2.py`.

use super::Source;
use super::decoder::{Parts, build, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "gemma2",
    gguf_archs: &["gemma2"],
    hf_classes: &["Gemma2ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gemma2",
        norm_plus_one: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Pre- and post-norms around both sub-blocks.
static HF_NAMES: NameTable = NameTable {
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
    qk_norm: false,
    post_norms: true,
    fused_qkv: false,
    fused_gate_up: false,
    norm_bias: false,
    plain_mlp: false,
    optional_v: false,
    v_norm: false,
    out_scale: false,
};

/// Every second layer is global (llama.cpp's `set_swa_pattern(2)`).
const PATTERN: usize = 2;

/// llama.cpp's defaults when a GGUF file has no key: window, attention and final caps.
const GGUF_DEFAULTS: (usize, f32, f32) = (4096, 50.0, 30.0);

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, cfg, tok_embd, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            let key = |k: &str| format!("{arch}.{k}");
            let (win, attn_cap, final_cap) = GGUF_DEFAULTS;
            let window = file
                .get_u64(&key("attention.sliding_window"))
                .map_or(win, |w| w as usize);
            cfg.layer_window = (0..cfg.n_layer)
                .map(|il| (il % PATTERN < PATTERN - 1).then_some(window))
                .collect();
            cfg.q_scale = Some(gguf_q_scale(&cfg));
            cfg.attn_softcap = Some(
                file.get_f32(&key("attn_logit_softcapping"))
                    .unwrap_or(attn_cap),
            );
            cfg.final_softcap = Some(
                file.get_f32(&key("final_logit_softcapping"))
                    .unwrap_or(final_cap),
            );
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &HF_NAMES);
            w.norm_offset = 1.0;
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            let c = &hf.config;
            cfg.layer_window = hf.layer_windows(cfg.n_layer, true, Some(PATTERN))?;
            let qpas = c.query_pre_attn_scalar.unwrap_or(cfg.head_dim as f64);
            cfg.q_scale = Some((1.0 / qpas.sqrt()) as f32);
            let cap = |v: Option<f64>| v.filter(|&c| c > 0.0).map(|c| c as f32);
            cfg.attn_softcap = cap(c.attn_logit_softcapping);
            cfg.final_softcap = cap(c.final_logit_softcapping);
            (w, cfg, tok_embd, None)
        }
    };
    let cfg = ModelConfig {
        embd_scale: Some((cfg.n_embd as f32).sqrt()),
        act: Activation::GeluTanh,
        ..cfg
    };
    build(&w, cfg, tok_embd, PARTS, file)
}

/// The query scale llama.cpp applies to a `gemma2` file.
fn gguf_q_scale(cfg: &ModelConfig) -> f32 {
    if cfg.n_layer == 46 {
        1.0 / ((cfg.n_embd / cfg.n_head) as f32).sqrt()
    } else {
        1.0 / (cfg.head_dim as f32).sqrt()
    }
}

/// The window and both soft-caps; llama.cpp fixes the layer pattern and the query scale,
/// and always soft-caps, so a model that differs cannot be written.
fn gguf_keys(model: &Model, _: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    let cfg = &model.config;
    let window = cfg.layer_window.first().copied().flatten();
    let pattern_ok = window.is_some_and(|w| {
        (0..cfg.n_layer).all(|il| cfg.layer_window[il] == (il % PATTERN == 0).then_some(w))
    });
    if !pattern_ok {
        return Err(format!(
            "llama.cpp's gemma2 alternates local (even) and global (odd) layers with one \
             sliding window; this model's layers are {:?}",
            cfg.layer_window
        ));
    }
    let (got, want) = (cfg.q_scale.unwrap_or(1.0), gguf_q_scale(cfg));
    if (got - want).abs() > 1e-6 * want {
        return Err(format!(
            "the queries are scaled by {got} (query_pre_attn_scalar), and GGUF has no key for \
             it: llama.cpp's gemma2 scales by {want}"
        ));
    }
    let (Some(attn), Some(fin)) = (cfg.attn_softcap, cfg.final_softcap) else {
        return Err(
            "llama.cpp's gemma2 always soft-caps the attention and final logits; this model \
             does not (attn_logit_softcapping / final_logit_softcapping)"
                .into(),
        );
    };
    keys.u32("attention.sliding_window", window.unwrap_or(0));
    keys.f32("attn_logit_softcapping", attn);
    keys.f32("final_logit_softcapping", fin);
    Ok(())
}
