//! Gemma 4 (text): Gemma 3's decoder (embeddings × `sqrt(n_embd)`, pre-
//! and post-norms around both sub-blocks, per-head query and key RMSNorm, GeGLU with tanh,
//! interleaved sliding-window and global layers, optional final logit soft-capping) with
//! - plain `x·w` RMSNorms (checkpoints store the weight itself, not Gemma 3's `w` of `1 + w`);
//! - a weightless RMSNorm of every value head, and attention scaled by 1;
//! - per-layer head shapes: global layers have wider heads (`global_head_dim`, GGUF
//!   `key_length`) and their own key/value head count (`num_global_key_value_heads`, a
//!   per-layer GGUF `head_count_kv`); sliding ones `head_dim` (`key_length_swa`);
//! - `attention_k_eq_v`: global layers have no value projection, their values are the key
//!   projection's output (taken before `k_norm`, then the weightless norm);
//! - RoPE: sliding layers rotate whole heads at base `rope_theta` of `sliding_attention`
//!   (GGUF `rope.freq_base_swa`, `rope.dimension_count_swa`); global layers use
//!   "proportional" RoPE, the first `partial_rotary_factor × head_dim / 2` pairs at
//!   `base^(-2i / head_dim)` and the rest unrotated (GGUF: `rope_freqs.weight`, divisors 1
//!   and 1e30);
//! - each layer's output scaled by its `layer_scalar` (GGUF `layer_output_scale.weight`).
//!
//! The smaller models add per-layer embedding inputs (`hidden_size_per_layer_input`, GGUF
//! `embedding_length_per_layer_input`; [`crate::blocks::ple`]) and key/value sharing: the
//! last `num_kv_shared_layers` layers compute no keys or values and attend over those of the
//! last unshared layer of their kind ([`crate::ModelConfig::layer_kv_from`]; GGUF
//! `attention.shared_kv_layers`, from which llama.cpp takes the last unshared layer for
//! global layers and the one before it for sliding ones), with double-wide feed-forwards
//! when `use_double_wide_mlp` (GGUF: a per-layer `feed_forward_length`).
//!
//! The MoE models (`enable_moe_block`; GGUF: `expert_count` and a router in the layer) run
//! the layer's dense MLP and the routed experts side by side ([`MoeSpec::mlp_beside`]): the
//! MLP reads the feed-forward norm, the experts (GeGLU, stacked gate-up) their own norm, the
//! router a weightless norm times `router.scale / sqrt(n_embd)`; softmax, top-k renormalized,
//! times the per-expert scale; each branch normed, then summed into the post-feed-forward
//! norm.
//!
//! Folders: `Gemma4ForCausalLM`, and the published checkpoints' `Gemma4ForConditionalGeneration`
//! (the text model's config under `text_config`, its weights under `model.language_model.`;
//! the vision and audio towers are not read, and `mica convert` refuses such a folder).
//! What a folder's config may say that mica does not run is refused naming the field and
//! value (`use_bidirectional_attention: "all"`, `attention_bias: true`, another
//! `hidden_activation`, a `vocab_size_per_layer_input` that disagrees with the table).
//!
//! References: llama.cpp `src/models/gemma4.cpp` and `conversion/gemma.py` (`Gemma4Model`);
//! transformers `models/gemma4/{configuration,modeling}_gemma4.py`.

use super::Source;
use super::decoder::{Parts, build_with, gguf_start, token_embedding};
use super::experts::{self, MoeSpec};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{Activation, ModelConfig, RopeConfig};
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::{Ffn, LayerPle, Model, PerLayerInputs};
use crate::weights::WeightLoader;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use mica_formats::{MetaArray, MetaValue};
use mica_kernels::ops::RopeStyle;
use serde_json::Value;

pub(super) static FAMILY: Family = Family {
    name: "gemma4",
    gguf_archs: &["gemma4"],
    hf_classes: &["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gemma4",
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Gemma 3's names plus the per-layer output scale, the per-layer embeddings and the
/// mixture-of-experts block (router, stacked experts, the norms around both branches).
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: &[
        DECODER_GLOBAL[0],
        DECODER_GLOBAL[1],
        DECODER_GLOBAL[2],
        (
            "per_layer_token_embd.weight",
            "model.embed_tokens_per_layer.weight",
        ),
        (
            "per_layer_model_proj.weight",
            "model.per_layer_model_projection.weight",
        ),
        (
            "per_layer_proj_norm.weight",
            "model.per_layer_projection_norm.weight",
        ),
    ],
    layer: LAYER_NAMES,
};

/// The text model inside `Gemma4ForConditionalGeneration` (the published checkpoints, with
/// vision and audio towers beside it, which mica does not read): the same names under
/// `model.language_model.`, the head tied to the embedding.
static HF_NAMES_WRAPPED: NameTable = NameTable {
    layer_prefix: "model.language_model.layers.{i}.",
    global: &[
        ("token_embd.weight", "model.language_model.embed_tokens.weight"),
        ("output_norm.weight", "model.language_model.norm.weight"),
        DECODER_GLOBAL[2],
        (
            "per_layer_token_embd.weight",
            "model.language_model.embed_tokens_per_layer.weight",
        ),
        (
            "per_layer_model_proj.weight",
            "model.language_model.per_layer_model_projection.weight",
        ),
        (
            "per_layer_proj_norm.weight",
            "model.language_model.per_layer_projection_norm.weight",
        ),
    ],
    layer: LAYER_NAMES,
};

/// The per-layer names of both layouts.
const LAYER_NAMES: &[(&str, &str)] = decoder_layer_names![
        (
            "post_attention_norm.weight",
            "post_attention_layernorm.weight"
        ),
        ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
        ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
        ("layer_output_scale.weight", "layer_scalar"),
        ("inp_gate.weight", "per_layer_input_gate.weight"),
        ("proj.weight", "per_layer_projection.weight"),
        ("post_norm.weight", "post_per_layer_input_norm.weight"),
        ("ffn_gate_inp.weight", "router.proj.weight"),
        ("ffn_gate_inp.scale", "router.scale"),
        ("ffn_down_exps.scale", "router.per_expert_scale"),
        ("ffn_gate_up_exps.weight", "experts.gate_up_proj"),
        ("ffn_down_exps.weight", "experts.down_proj"),
        (
            "pre_ffw_norm_2.weight",
            "pre_feedforward_layernorm_2.weight"
        ),
        (
            "post_ffw_norm_1.weight",
            "post_feedforward_layernorm_1.weight"
        ),
        (
            "post_ffw_norm_2.weight",
            "post_feedforward_layernorm_2.weight"
        ),
];

const PARTS: Parts = Parts {
    qk_norm: true,
    post_norms: true,
    fused_qkv: false,
    fused_gate_up: false,
    norm_bias: false,
    plain_mlp: false,
    optional_v: true,
    v_norm: true,
    out_scale: true,
};

/// The multimodal class of the published checkpoints, whose text model mica runs.
const WRAPPER: &str = "Gemma4ForConditionalGeneration";

/// transformers' defaults: every 6th layer global, global heads of 512.
const DEFAULT_PATTERN: usize = 6;
const DEFAULT_GLOBAL_HEAD_DIM: usize = 512;

/// What differs between sliding and global layers, resolved from either source.
struct Layers {
    /// `[n_layer]` sliding (true) or global.
    is_swa: Vec<bool>,
    window: usize,
    /// Head size and key/value heads of each layer.
    head_dim: Vec<usize>,
    n_head_kv: Vec<usize>,
    /// RoPE of the sliding layers.
    local: RopeConfig,
    final_cap: Option<f32>,
    /// Per-layer embedding width (0: none).
    ple_dim: usize,
    /// `[n_layer]` the earlier layer whose keys and values a layer reuses.
    kv_from: Vec<Option<usize>>,
    /// `[n_layer]` feed-forward widths.
    n_ff: Vec<usize>,
    /// The experts beside every layer's MLP (the MoE models).
    moe: Option<MoeSpec>,
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, mut cfg, tok_embd, layers, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            let layers = gguf_layers(file, arch, &cfg)?;
            // Proportional RoPE of the global layers: `[n_dims / 2]` frequency divisors.
            cfg.rope.freq_factors = w.vector_opt("rope_freqs.weight", cfg.rope.n_dims / 2)?;
            (w, cfg, tok_embd, layers, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            check_hf_options(hf)?;
            let names = match hf.architecture()? {
                WRAPPER => &HF_NAMES_WRAPPED,
                _ => &HF_NAMES,
            };
            let w = hf.weights(arch, names);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            let layers = hf_layers(hf, &mut cfg)?;
            (w, cfg, tok_embd, layers, None)
        }
    };
    cfg.embd_scale = Some((cfg.n_embd as f32).sqrt());
    cfg.act = Activation::GeluTanh;
    // Attention scale 1: queries multiplied by 1, scores unscaled.
    cfg.q_scale = Some(1.0);
    cfg.final_softcap = layers.final_cap;
    cfg.layer_window = layers
        .is_swa
        .iter()
        .map(|&s| s.then_some(layers.window))
        .collect();
    cfg.rope_local = Some(layers.local);
    // `head_dim` / `n_head_kv` name the global layers' shape (GGUF `key_length`).
    if let Some(g) = layers.is_swa.iter().position(|&s| !s) {
        cfg.head_dim = layers.head_dim[g];
        cfg.n_head_kv = layers.n_head_kv[g];
    }
    cfg.layer_head_dim = layers.head_dim;
    cfg.layer_n_head_kv = layers.n_head_kv;
    cfg.layer_kv_from = layers.kv_from;
    cfg.layer_n_ff = layers.n_ff.clone();
    let d = cfg.n_embd;
    // The MoE models' experts, with the layer's MLP as their shared expert.
    let ffn = |i: usize| match &layers.moe {
        Some(spec) => MoeSpec {
            shared_ff: Some(layers.n_ff[i]),
            ..spec.clone()
        }
        .layer(&w, i, d),
        None => Ok(None),
    };
    let mut model = build_with(&w, cfg, tok_embd, PARTS, file, &ffn)?;
    if layers.ple_dim > 0 {
        load_ple(src, &w, &mut model, layers.ple_dim)?;
    }
    Ok(model)
}

/// Gemma 4 options of a folder that mica does not implement, refused naming the field and
/// its value: bidirectional attention over text (`use_bidirectional_attention: "all"`;
/// `"vision"` makes only image tokens bidirectional, so text stays causal, as llama.cpp runs
/// it), attention biases (`attention_bias`; llama.cpp's gemma4 has none either), and a
/// feed-forward activation other than the tanh GELU (`hidden_activation`; llama.cpp's graph
/// computes the tanh GELU whatever the config says).
fn check_hf_options(hf: &HfFolder) -> Result<()> {
    let c = &hf.config;
    match hf.config_json.get("use_bidirectional_attention") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if v == "vision" => {}
        Some(Value::String(v)) if v == "all" => {
            return Err(hf.field_err(
                "use_bidirectional_attention",
                "\"all\" (every token attends to every other, before and after it) is not \
                 supported: mica's attention is causal (null and \"vision\" are supported; \
                 \"vision\" leaves text causal)",
            ));
        }
        Some(v) => {
            return Err(hf.field_err(
                "use_bidirectional_attention",
                format!("{v} is not one of null, \"vision\", \"all\""),
            ));
        }
    }
    if c.attention_bias == Some(true) {
        return Err(hf.field_err(
            "attention_bias",
            "true is not supported: Gemma 4's attention projections have no biases in mica \
             (nor in llama.cpp)",
        ));
    }
    match c.hidden_activation.as_deref() {
        None | Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") => Ok(()),
        Some(other) => Err(hf.field_err(
            "hidden_activation",
            format!(
                "\"{other}\" is not supported (the tanh GELU is: gelu_pytorch_tanh, gelu_new, \
                 gelu_fast)"
            ),
        )),
    }
}

/// The per-layer embedding tensors (`dim` values per layer). Their token table needs a row
/// for every token.
fn load_ple(src: &Source, w: &WeightLoader, model: &mut Model, dim: usize) -> Result<()> {
    let (d, n_layer) = (model.config.n_embd, model.config.n_layer);
    let tok = w.matrix_any_rows("per_layer_token_embd.weight", n_layer * dim)?;
    let n_vocab = model.config.n_vocab;
    let short = |field: &str, rows: usize| {
        format!(
            "{rows} rows in the per-layer embedding table ({field}) where the vocabulary has \
             {n_vocab} tokens: every token needs a row"
        )
    };
    match src {
        Source::Hf(hf) => {
            let field = "vocab_size_per_layer_input";
            if let Some(v) = hf.config_json[field].as_u64()
                && v as usize != tok.rows
            {
                return Err(hf.field_err(
                    field,
                    format!(
                        "{v} differs from the {} rows of model.embed_tokens_per_layer",
                        tok.rows
                    ),
                ));
            }
            if tok.rows < n_vocab {
                return Err(hf.field_err(field, short(field, tok.rows)));
            }
        }
        Source::Gguf(file) if tok.rows < n_vocab => {
            return Err(ModelError::Config {
                path: file.path().to_path_buf(),
                key: "per_layer_token_embd.weight".into(),
                msg: short("per_layer_token_embd.weight", tok.rows),
            });
        }
        Source::Gguf(_) => {}
    }
    model.ple = Some(PerLayerInputs {
        tok,
        proj: w.linear("per_layer_model_proj", n_layer * dim, d)?,
        norm: w.norm("per_layer_proj_norm.weight", dim)?,
        dim,
    });
    for (i, layer) in model.layers.iter_mut().enumerate() {
        let p = |s: &str| format!("blk.{i}.{s}");
        layer.ple = Some(LayerPle {
            gate: w.linear(&p("inp_gate"), dim, d)?,
            proj: w.linear(&p("proj"), d, dim)?,
            post_norm: w.norm(&p("post_norm.weight"), d)?,
        });
    }
    Ok(())
}

/// The layer shapes, window and local RoPE a `gemma4` file gives.
fn gguf_layers(file: &mica_formats::GgufFile, arch: &str, cfg: &ModelConfig) -> Result<Layers> {
    let key = |k: &str| format!("{arch}.{k}");
    let err = |k: &str, msg: String| ModelError::Config {
        path: file.path().to_path_buf(),
        key: key(k),
        msg,
    };
    let positive = |k: &str| file.get_u64(&key(k)).filter(|&x| x > 0).map(|x| x as usize);
    // llama.cpp's gemma4 graph always renormalizes the top-k weights.
    let moe = experts::gguf_spec(file, arch, true)?.map(|s| MoeSpec {
        norm_topk: true,
        mlp_beside: true,
        ..s
    });
    let n = cfg.n_layer;
    let is_swa = match file.metadata(&key("attention.sliding_window_pattern")) {
        Some(MetaValue::Array(MetaArray::Bool(b))) if b.len() == n => b.clone(),
        _ => {
            return Err(err(
                "attention.sliding_window_pattern",
                format!("expected {n} booleans (one per layer: sliding or not)"),
            ));
        }
    };
    let hd_swa = positive("attention.key_length_swa")
        .ok_or_else(|| err("attention.key_length_swa", "missing or zero".into()))?;
    if let Some(v) = positive("attention.value_length_swa")
        && v != hd_swa
    {
        return Err(err(
            "attention.value_length_swa",
            format!("{v} differs from the key length {hd_swa}"),
        ));
    }
    let window = positive("attention.sliding_window")
        .ok_or_else(|| err("attention.sliding_window", "missing or zero".into()))?;
    let n_rot_swa = positive("rope.dimension_count_swa").unwrap_or(hd_swa);
    if n_rot_swa > hd_swa || n_rot_swa % 2 != 0 {
        return Err(err(
            "rope.dimension_count_swa",
            format!("{n_rot_swa} must be even and at most the head size {hd_swa}"),
        ));
    }
    let local = RopeConfig {
        n_dims: n_rot_swa,
        freq_base: file.get_f32(&key("rope.freq_base_swa")).unwrap_or(10000.0),
        freq_scale: 1.0,
        freq_factors: None,
        ..cfg.rope.clone()
    };
    // llama.cpp: a shared layer reuses the last unshared layer when global, the one before
    // it when sliding (`n_layer_kv_from_start - (is_swa ? 2 : 1)`).
    let shared = positive("attention.shared_kv_layers").unwrap_or(0);
    let Some(first) = n.checked_sub(shared).filter(|&f| f >= 2 || shared == 0) else {
        return Err(err(
            "attention.shared_kv_layers",
            format!("{shared} of {n} layers leave fewer than 2 to share from"),
        ));
    };
    let kv_from: Vec<Option<usize>> = (0..n)
        .map(|l| (l >= first).then(|| first - if is_swa[l] { 2 } else { 1 }))
        .collect();
    if let Some(l) = (first..n).find(|&l| kv_from[l].is_some_and(|j| is_swa[j] != is_swa[l])) {
        return Err(err(
            "attention.shared_kv_layers",
            format!("layer {l} would reuse keys and values of a layer of the other kind"),
        ));
    }
    Ok(Layers {
        head_dim: is_swa
            .iter()
            .map(|&s| if s { hd_swa } else { cfg.head_dim })
            .collect(),
        n_head_kv: cfg.layer_n_head_kv.clone(),
        is_swa,
        window,
        local,
        final_cap: file
            .get_f32(&key("final_logit_softcapping"))
            .filter(|&c| c > 0.0),
        ple_dim: positive("embedding_length_per_layer_input").unwrap_or(0),
        kv_from,
        n_ff: cfg.layer_n_ff.clone(),
        moe,
    })
}

/// The layer shapes, window and RoPE of a Gemma 4 folder (and the global layers' RoPE,
/// set in `cfg`).
fn hf_layers(hf: &HfFolder, cfg: &mut ModelConfig) -> Result<Layers> {
    let c = &hf.config;
    let n = cfg.n_layer;
    let moe = match c.enable_moe_block {
        Some(true) => Some(hf_moe(hf)?),
        _ => None,
    };
    let window = c
        .sliding_window
        .filter(|&w| w > 0)
        .ok_or_else(|| hf.field_err("sliding_window", "missing or zero"))?;
    let mut is_swa: Vec<bool> = hf
        .layer_windows(n, true, Some(DEFAULT_PATTERN))?
        .iter()
        .map(Option::is_some)
        .collect();
    // transformers makes the last layer global whatever `layer_types` says.
    if let Some(last) = is_swa.last_mut() {
        *last = false;
    }
    let k_eq_v = c.attention_k_eq_v.unwrap_or(false);
    let (mut head_dim, mut n_head_kv) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (l, &swa) in is_swa.iter().enumerate() {
        let over = c
            .per_layer_config
            .as_ref()
            .and_then(|p| p.get(l.to_string()))
            .filter(|v| v.is_object());
        let field = |name: &str| -> Result<Option<usize>> {
            match over.map(|o| &o[name]) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|&x| x > 0)
                    .map(|x| Some(x as usize))
                    .ok_or_else(|| {
                        hf.field_err(
                            &format!("per_layer_config.{l}.{name}"),
                            format!("must be a positive integer, got {v}"),
                        )
                    }),
            }
        };
        // Without `per_layer_config`, transformers' constructor defaults for global layers.
        let (hd_default, kv_default) = match (swa, c.per_layer_config.is_some()) {
            (false, false) => (
                c.global_head_dim.unwrap_or(DEFAULT_GLOBAL_HEAD_DIM),
                c.num_global_key_value_heads
                    .filter(|_| k_eq_v)
                    .unwrap_or(cfg.n_head_kv),
            ),
            _ => (cfg.head_dim, cfg.n_head_kv),
        };
        let hd = field("head_dim")?.unwrap_or(hd_default);
        let kv = field("num_key_value_heads")?.unwrap_or(kv_default);
        if !cfg.n_head.is_multiple_of(kv) {
            return Err(hf.field_err(
                &format!("per_layer_config.{l}.num_key_value_heads"),
                format!("{kv} does not divide the {} query heads", cfg.n_head),
            ));
        }
        head_dim.push(hd);
        n_head_kv.push(kv);
    }
    // transformers: from `num_hidden_layers - num_kv_shared_layers` on, a layer reuses the
    // keys and values of the last earlier unshared layer of its type, and is double-wide
    // when `use_double_wide_mlp`.
    let first = n - c.num_kv_shared_layers.unwrap_or(0).min(n);
    let mut kv_from = vec![None; n];
    for l in first..n {
        let src = (0..first).rev().find(|&j| is_swa[j] == is_swa[l]);
        kv_from[l] = Some(src.ok_or_else(|| {
            hf.field_err(
                "num_kv_shared_layers",
                format!("layer {l} shares keys and values but no unshared layer has its type"),
            )
        })?);
    }
    let wide = c.use_double_wide_mlp == Some(true);
    let n_ff = (0..n)
        .map(|l| cfg.n_ff * if wide && l >= first { 2 } else { 1 })
        .collect();
    let global_hd = is_swa
        .iter()
        .position(|&s| !s)
        .map_or(cfg.head_dim, |g| head_dim[g]);
    cfg.rope = hf.rope(hf.rope_params("full_attention"), global_hd)?;
    let local = hf.rope(hf.rope_params("sliding_attention"), cfg.head_dim)?;
    Ok(Layers {
        is_swa,
        window,
        head_dim,
        n_head_kv,
        local,
        final_cap: c
            .final_logit_softcapping
            .filter(|&c| c > 0.0)
            .map(|c| c as f32),
        ple_dim: c.hidden_size_per_layer_input.unwrap_or(0),
        kv_from,
        n_ff,
        moe,
    })
}

/// The experts of a Gemma 4 MoE folder: `num_experts`, `top_k_experts`,
/// `moe_intermediate_size`; every layer sparse, the top-k weights renormalized.
fn hf_moe(hf: &HfFolder) -> Result<MoeSpec> {
    let c = &hf.config;
    let n_expert = hf.required("num_experts", c.num_experts)?;
    let top_k = hf.config_json["top_k_experts"]
        .as_u64()
        .map(|k| k as usize)
        .filter(|&k| k > 0);
    let top_k = hf.required("top_k_experts", top_k)?;
    if top_k > n_expert {
        return Err(hf.field_err(
            "top_k_experts",
            format!("{top_k} experts per token of {n_expert}"),
        ));
    }
    Ok(MoeSpec {
        n_expert,
        top_k,
        n_ff: hf.required("moe_intermediate_size", c.moe_intermediate_size)?,
        norm_topk: true,
        shared_ff: None,
        dense_layers: Vec::new(),
        sparse_step: 1,
        stacked: true,
        mlp_beside: true,
    })
}

/// What a `gemma4` file says beyond the shared keys (which carry the global layers' head
/// size and the per-layer key/value heads): the layer pattern and window, the sliding layers'
/// head size and RoPE, the final soft-cap, the per-layer embedding width and shared layers,
/// and the experts of the MoE models. (`rope_freqs.weight`, the global layers' proportional
/// RoPE, is written from the resolved frequency factors.)
fn gguf_keys(model: &Model, hf: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    if hf.architecture().ok() == Some(WRAPPER) {
        return Err(format!(
            "mica convert does not write the text model of a {WRAPPER} folder yet (mica runs \
             the folder itself; llama.cpp's convert_hf_to_gguf.py converts it, the vision and \
             audio towers into a separate mmproj file)"
        ));
    }
    let cfg = &model.config;
    if let Some(Ffn::Moe(m)) = model.layers.first().map(|l| &l.ffn) {
        // llama.cpp's gemma4 graph renormalizes the top-k weights; the converter writes the
        // experts' width but not the shared expert's (the layer's MLP, `feed_forward_length`).
        experts::gguf_keys(model, keys, true, false)?;
        keys.u32("expert_feed_forward_length", m.experts[0].up.out_dim());
    }
    let is_swa: Vec<bool> = cfg.layer_window.iter().map(Option::is_some).collect();
    let window = cfg.layer_window.iter().flatten().next().copied();
    let swa = is_swa.iter().position(|&s| s);
    keys.f32(
        "rope.freq_base_swa",
        cfg.rope_local.as_ref().map_or(10000.0, |r| r.freq_base),
    );
    if let Some(c) = cfg.final_softcap {
        keys.f32("final_logit_softcapping", c);
    }
    if let Some(w) = window {
        keys.u32("attention.sliding_window", w);
    }
    // llama.cpp derives each shared layer's source from the count alone.
    let shared = cfg.layer_kv_from.iter().filter(|s| s.is_some()).count();
    let first = cfg.n_layer - shared;
    let want: Vec<Option<usize>> = (0..cfg.n_layer)
        .map(|l| (l >= first).then(|| first.wrapping_sub(if is_swa[l] { 2 } else { 1 })))
        .collect();
    if cfg.layer_kv_from != want {
        return Err(format!(
            "llama.cpp's gemma4 makes the last {shared} layers reuse layer {} (global) and {} \
             (sliding); this model's layers reuse {:?} (num_kv_shared_layers, layer_types)",
            first.wrapping_sub(1),
            first.wrapping_sub(2),
            cfg.layer_kv_from
        ));
    }
    keys.u32("attention.shared_kv_layers", shared);
    keys.u32(
        "embedding_length_per_layer_input",
        model.ple.as_ref().map_or(0, |p| p.dim),
    );
    keys.set(
        "attention.sliding_window_pattern",
        MetaValue::Array(MetaArray::Bool(is_swa.clone())),
    );
    let hd_swa = swa.map_or(cfg.head_dim, |l| cfg.layer_head_dim[l]);
    // GGUF has one head size per kind of layer and one window.
    let uniform = (0..cfg.n_layer).all(|l| {
        let want = if is_swa[l] { hd_swa } else { cfg.head_dim };
        cfg.layer_head_dim[l] == want && cfg.layer_window[l].is_none_or(|w| Some(w) == window)
    });
    if !uniform {
        return Err(format!(
            "GGUF gemma4 has one head size for sliding layers, one for global ones and one \
             window; this model's head sizes are {:?} and windows {:?} (per_layer_config)",
            cfg.layer_head_dim, cfg.layer_window
        ));
    }
    keys.u32("attention.key_length_swa", hd_swa);
    keys.u32("attention.value_length_swa", hd_swa);
    keys.u32(
        "rope.dimension_count_swa",
        cfg.rope_local.as_ref().map_or(hd_swa, |r| r.n_dims),
    );
    Ok(())
}
