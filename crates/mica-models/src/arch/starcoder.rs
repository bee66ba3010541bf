//! StarCoder / GPTBigCode: GPT-2's decoder (LayerNorms with biases, learned absolute
//! positions, fused `c_attn` with bias, an ungated tanh-GELU MLP, head tied to the token
//! embedding) with multi-query attention — one key/value head shared by every query head
//! (`multi_query`, which every StarCoder checkpoint sets and llama.cpp's `starcoder`
//! architecture assumes) — and `nn.Linear` projections (`[out, in]`, read in place: no
//! Conv1D transpose).
//!
//! References: Allal et al., "SantaCoder: don't reach for the stars!" (2023); transformers
//! `models/gpt_bigcode/modeling_gpt_bigcode.py`; llama.cpp `src/models/starcoder.cpp`.

use super::Source;
use super::decoder::{build, gguf_layer_norm_eps, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::gpt2::{PARTS, hf_activation};
use crate::config::{Activation, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::NameTable;
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "starcoder",
    gguf_archs: &["starcoder"],
    hf_classes: &["GPTBigCodeForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "starcoder",
        keys: gguf_keys,
        ..PLAIN
    },
};

/// GPTBigCode (`transformer.h.{i}.*`): GPT-2's names, `nn.Linear` weights.
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "transformer.h.{i}.",
    global: &[
        ("token_embd.weight", "transformer.wte.weight"),
        ("position_embd.weight", "transformer.wpe.weight"),
        ("output_norm.weight", "transformer.ln_f.weight"),
        ("output_norm.bias", "transformer.ln_f.bias"),
        ("output.weight", "lm_head.weight"),
    ],
    layer: &[
        ("attn_norm.weight", "ln_1.weight"),
        ("attn_norm.bias", "ln_1.bias"),
        ("attn_qkv.weight", "attn.c_attn.weight"),
        ("attn_qkv.bias", "attn.c_attn.bias"),
        ("attn_output.weight", "attn.c_proj.weight"),
        ("attn_output.bias", "attn.c_proj.bias"),
        ("ffn_norm.weight", "ln_2.weight"),
        ("ffn_norm.bias", "ln_2.bias"),
        ("ffn_up.weight", "mlp.c_fc.weight"),
        ("ffn_up.bias", "mlp.c_fc.bias"),
        ("ffn_down.weight", "mlp.c_proj.weight"),
        ("ffn_down.bias", "mlp.c_proj.bias"),
    ],
};

/// llama.cpp's `starcoder` graph computes the tanh GELU and one key/value head, and its
/// converter writes a feed-forward width of 4 × `n_embd`.
fn gguf_keys(model: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    let c = &model.config;
    if c.act != Activation::GeluTanh {
        return Err(format!(
            "the MLP uses {:?}; llama.cpp's starcoder computes the tanh GELU",
            c.act
        ));
    }
    if c.n_head_kv != 1 {
        return Err("multi_query is false; llama.cpp's starcoder has one key/value head".into());
    }
    if c.n_ff != 4 * c.n_embd {
        return Err(format!(
            "n_inner is {}; llama.cpp's converter writes 4 × n_embd = {}",
            c.n_ff,
            4 * c.n_embd
        ));
    }
    Ok(())
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, mut cfg, tok_embd, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            cfg.norm_eps = gguf_layer_norm_eps(file, arch);
            cfg.act = Activation::GeluTanh;
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.act = hf_activation(hf)?;
            match hf.config_json.get("multi_query") {
                None | Some(serde_json::Value::Bool(true)) => {
                    cfg.n_head_kv = 1;
                    cfg.layer_n_head_kv = vec![1; cfg.n_layer];
                }
                Some(serde_json::Value::Bool(false)) => {}
                Some(other) => {
                    return Err(hf.field_err("multi_query", format!("{other} is not a boolean")));
                }
            }
            (w, cfg, tok_embd, None)
        }
    };
    cfg.rope.n_dims = 0; // positions are learned, not rotary
    cfg.norm = NormKind::Layer;
    let pos_embd = w.matrix_any_rows("position_embd.weight", cfg.n_embd)?;
    let mut model = build(&w, cfg, tok_embd, PARTS, file)?;
    model.pos_embd = Some(pos_embd);
    Ok(model)
}
