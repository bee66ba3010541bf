//! CodeGen (`CodeGenForCausalLM`): GPT-J's parallel block — one LayerNorm (`ln_1`) feeds
//! both the attention and the MLP, whose outputs are added to the residual together — with
//! partial rotary embeddings in GPT-J's interleaved style (adjacent pairs of the first
//! `rotary_dim` dimensions of each head, ggml's "normal" RoPE), a bias-free fused `qkv_proj`
//! whose rows CodeGen lays out in 4 blocks of (q | v | k) (regrouped at load into q | k | v),
//! a GELU (tanh) MLP with biases, and an untied head with a bias.
//!
//! llama.cpp has no CodeGen architecture, so these folders are not written as GGUF.
//!
//! References: Nijkamp et al., "CodeGen: An Open Large Language Model for Code with
//! Multi-Turn Program Synthesis" (2023); transformers `models/codegen/modeling_codegen.py`.

use super::Source;
use super::decoder::{build, hf_only, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::gpt2::{PARTS, hf_activation};
use crate::config::{ModelConfig, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::NameTable;
use crate::weights::{WeightLoader, reorder_rows};
use mica_kernels::ops::RopeStyle;
use serde_json::Value;

pub(super) static FAMILY: Family = Family {
    name: "codegen",
    gguf_archs: &[],
    hf_classes: &["CodeGenForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        keys: gguf_keys,
        ..PLAIN
    },
};

/// CodeGen (`transformer.h.{i}.*`): `ln_1` is both sub-blocks' norm.
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "transformer.h.{i}.",
    global: &[
        ("token_embd.weight", "transformer.wte.weight"),
        ("output_norm.weight", "transformer.ln_f.weight"),
        ("output_norm.bias", "transformer.ln_f.bias"),
        ("output.weight", "lm_head.weight"),
        ("output.bias", "lm_head.bias"),
    ],
    layer: &[
        ("attn_norm.weight", "ln_1.weight"),
        ("attn_norm.bias", "ln_1.bias"),
        ("ffn_norm.weight", "ln_1.weight"),
        ("ffn_norm.bias", "ln_1.bias"),
        ("attn_qkv.weight", "attn.qkv_proj.weight"),
        ("attn_output.weight", "attn.out_proj.weight"),
        ("ffn_up.weight", "mlp.fc_in.weight"),
        ("ffn_up.bias", "mlp.fc_in.bias"),
        ("ffn_down.weight", "mlp.fc_out.weight"),
        ("ffn_down.bias", "mlp.fc_out.bias"),
    ],
};

/// CodeGen's model-parallel blocks of the fused projection (`mp_num` in transformers).
const MP_NUM: usize = 4;

fn gguf_keys(_: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    Err("llama.cpp has no CodeGen architecture, so GGUF cannot describe this model".into())
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let hf = hf_only(src, arch)?;
    let mut w = hf.weights(arch, &HF_NAMES);
    let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
    let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
    cfg.act = hf_activation(hf)?;
    cfg.parallel_residual = true;
    cfg.norm = NormKind::Layer;
    if cfg.n_head % MP_NUM != 0 {
        return Err(hf.field_err(
            "n_head",
            format!("{} is not a multiple of CodeGen's {MP_NUM} blocks", cfg.n_head),
        ));
    }
    let rotary = match hf.config_json.get("rotary_dim") {
        None | Some(Value::Null) => cfg.head_dim,
        Some(v) => match v.as_u64() {
            Some(r) if r as usize <= cfg.head_dim && r % 2 == 0 => r as usize,
            _ => {
                return Err(hf.field_err(
                    "rotary_dim",
                    format!("{v} is not an even count up to head_dim {}", cfg.head_dim),
                ));
            }
        },
    };
    cfg.rope.style = RopeStyle::Normal;
    cfg.rope.n_dims = rotary;
    cfg.rope.freq_base = 10000.0;
    regroup_qkv(&mut w, &cfg)?;
    build(&w, cfg, tok_embd, PARTS, None)
}

/// `qkv_proj` rows from CodeGen's `[MP_NUM][q | v | k][d / MP_NUM]` to `[q | k | v][d]`.
fn regroup_qkv(w: &mut WeightLoader, cfg: &ModelConfig) -> Result<()> {
    let d = cfg.n_embd;
    let local = d / MP_NUM;
    // Part c of the result (0 q, 1 k, 2 v) is part [0, 2, 1][c] of each block.
    let from = move |i: usize| {
        let (c, r) = (i / d, i % d);
        let (block, j) = (r / local, r % local);
        block * 3 * local + [0, 2, 1][c] * local + j
    };
    for i in 0..cfg.n_layer {
        let name = format!("blk.{i}.attn_qkv.weight");
        let shape = vec![d as u64, 3 * d as u64];
        w.rewrite(&name, &shape, shape.clone(), |b, es| {
            reorder_rows(b, d * es, from)
        })?;
    }
    Ok(())
}
