//! GPT-NeoX / Pythia: a pre-norm decoder with LayerNorms (weight and bias), a fused
//! `query_key_value` projection with bias, rotary embeddings over the first `rotary_pct` of
//! each head (NeoX layout: halves), an ungated GELU MLP, a separate (untied) output head
//! `embed_out`, and — where `use_parallel_residual` is set, as in every Pythia model — the
//! parallel residual `x + attn(ln1(x)) + mlp(ln2(x))`.
//!
//! transformers' fused `query_key_value` holds, per head, that head's q, k and v rows
//! (`[n_head][3][head_dim]` rows); mica's fused layout is q | k | v (`[3][n_head][head_dim]`,
//! what llama.cpp's converter writes into GGUF), so the weight and bias are regrouped once
//! at load into a copy held in memory.
//!
//! Pythia's GELU is the exact (`erf`) one; llama.cpp computes the tanh approximation, and so
//! does mica under llama.cpp's numerics (quantized models); float32 checkpoints get `erf`.
//!
//! References: Black et al., "GPT-NeoX-20B" (2022); Biderman et al., "Pythia" (2023);
//! transformers `models/gpt_neox/modeling_gpt_neox.py`; llama.cpp `src/models/gptneox.cpp`.

use super::Source;
use super::decoder::{Parts, build, gguf_layer_norm_eps, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::gpt2::hf_activation;
use crate::config::{Activation, ModelConfig, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::NameTable;
use crate::weights::{WeightLoader, reorder_rows};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "gptneox",
    gguf_archs: &["gptneox"],
    hf_classes: &["GPTNeoXForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gptneox",
        qkv_per_head: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// GPT-NeoX / Pythia (`gpt_neox.layers.{i}.*`): fused `query_key_value` (rows interleaved
/// per head, regrouped at load), LayerNorms with biases, untied `embed_out`.
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "gpt_neox.layers.{i}.",
    global: &[
        ("token_embd.weight", "gpt_neox.embed_in.weight"),
        ("output_norm.weight", "gpt_neox.final_layer_norm.weight"),
        ("output_norm.bias", "gpt_neox.final_layer_norm.bias"),
        ("output.weight", "embed_out.weight"),
    ],
    layer: &[
        ("attn_norm.weight", "input_layernorm.weight"),
        ("attn_norm.bias", "input_layernorm.bias"),
        ("attn_qkv.weight", "attention.query_key_value.weight"),
        ("attn_qkv.bias", "attention.query_key_value.bias"),
        ("attn_output.weight", "attention.dense.weight"),
        ("attn_output.bias", "attention.dense.bias"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_norm.bias", "post_attention_layernorm.bias"),
        ("ffn_up.weight", "mlp.dense_h_to_4h.weight"),
        ("ffn_up.bias", "mlp.dense_h_to_4h.bias"),
        ("ffn_down.weight", "mlp.dense_4h_to_h.weight"),
        ("ffn_down.bias", "mlp.dense_4h_to_h.bias"),
    ],
};

/// `gptneox.use_parallel_residual`. The GGUF path computes the exact (`erf`) GELU, so a
/// model with another activation cannot be written.
fn gguf_keys(model: &Model, _: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    let cfg = &model.config;
    if cfg.act != Activation::GeluErf {
        return Err(format!(
            "the MLP uses {:?}; a gptneox file is run with the exact GELU (hidden_act 'gelu')",
            cfg.act
        ));
    }
    keys.bool("use_parallel_residual", cfg.parallel_residual);
    Ok(())
}

const PARTS: Parts = Parts {
    qk_norm: false,
    post_norms: false,
    fused_qkv: true,
    fused_gate_up: false,
    norm_bias: true,
    plain_mlp: true,
    optional_v: false,
    v_norm: false,
    out_scale: false,
};

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, mut cfg, tok_embd, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            cfg.norm_eps = gguf_layer_norm_eps(file, arch);
            cfg.parallel_residual = file
                .get_bool(&format!("{arch}.use_parallel_residual"))
                .unwrap_or(true);
            cfg.act = Activation::GeluErf;
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.parallel_residual = hf.config.use_parallel_residual.unwrap_or(true);
            cfg.act = hf_activation(hf)?;
            regroup_qkv(&mut w, &cfg)?;
            (w, cfg, tok_embd, None)
        }
    };
    cfg.norm = NormKind::Layer;
    build(&w, cfg, tok_embd, PARTS, file)
}

/// `query_key_value` rows (weight and bias) from per-head `[n_head][3][head_dim]` to
/// `[3][n_head][head_dim]`.
fn regroup_qkv(w: &mut WeightLoader, cfg: &ModelConfig) -> Result<()> {
    let (d, hd) = (cfg.n_embd, cfg.head_dim);
    // Row `i` of the result (part c, head h, row j) is row h·3·hd + c·hd + j of the file.
    let from = move |i: usize| {
        let (c, h, j) = (i / d, (i % d) / hd, i % hd);
        h * 3 * hd + c * hd + j
    };
    let rows = 3 * d as u64;
    for i in 0..cfg.n_layer {
        let name = format!("blk.{i}.attn_qkv.weight");
        let shape = vec![d as u64, rows];
        w.rewrite(&name, &shape, shape.clone(), |b, es| {
            reorder_rows(b, d * es, from)
        })?;
        let bias = format!("blk.{i}.attn_qkv.bias");
        if w.info(&bias).is_some() {
            w.rewrite(&bias, &[rows], vec![rows], |b, es| {
                reorder_rows(b, es, from)
            })?;
        }
    }
    Ok(())
}
