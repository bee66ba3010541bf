//! OPT (`OPTForCausalLM`): a pre-norm decoder with LayerNorms (weight and bias), learned
//! absolute positions whose table starts 2 rows in (OPT's offset: position `p` reads row
//! `p + 2`), separate q / k / v / out projections with biases, an ungated ReLU MLP
//! (`fc1`, `fc2`, with biases), a final LayerNorm, and the head tied to the token embedding.
//! Its variants: the post-norm layout of OPT-350m (`do_layer_norm_before: false`: each
//! sub-block's LayerNorm after its residual add, and no final LayerNorm), no final LayerNorm
//! (`_remove_final_layer_norm`), and embeddings narrower than the layers
//! (`word_embed_proj_dim` < `hidden_size`: `project_in` after the lookup, `project_out`
//! before the head, both without bias).
//!
//! Refused with the field named: LayerNorms without weights, projections without biases,
//! activations other than ReLU.
//! llama.cpp has no OPT architecture, so these folders are not written as GGUF either.
//!
//! References: Zhang et al., "OPT: Open Pre-trained Transformer Language Models" (2022);
//! transformers `models/opt/modeling_opt.py`.

use super::Source;
use super::decoder::{Parts, build, hf_only, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{Activation, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::{EmbdProj, Model};
use crate::names::NameTable;
use serde_json::Value;

pub(super) static FAMILY: Family = Family {
    name: "opt",
    gguf_archs: &[],
    hf_classes: &["OPTForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        keys: gguf_keys,
        ..PLAIN
    },
};

/// OPT (`model.decoder.layers.{i}.*`); each layer's `final_layer_norm` is its feed-forward
/// norm, the decoder's own `final_layer_norm` the output norm.
static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.decoder.layers.{i}.",
    global: &[
        ("token_embd.weight", "model.decoder.embed_tokens.weight"),
        ("position_embd.weight", "model.decoder.embed_positions.weight"),
        ("output_norm.weight", "model.decoder.final_layer_norm.weight"),
        ("output_norm.bias", "model.decoder.final_layer_norm.bias"),
        ("output.weight", "lm_head.weight"),
        ("project_in.weight", "model.decoder.project_in.weight"),
        ("project_out.weight", "model.decoder.project_out.weight"),
    ],
    layer: &[
        ("attn_norm.weight", "self_attn_layer_norm.weight"),
        ("attn_norm.bias", "self_attn_layer_norm.bias"),
        ("attn_q.weight", "self_attn.q_proj.weight"),
        ("attn_q.bias", "self_attn.q_proj.bias"),
        ("attn_k.weight", "self_attn.k_proj.weight"),
        ("attn_k.bias", "self_attn.k_proj.bias"),
        ("attn_v.weight", "self_attn.v_proj.weight"),
        ("attn_v.bias", "self_attn.v_proj.bias"),
        ("attn_output.weight", "self_attn.out_proj.weight"),
        ("attn_output.bias", "self_attn.out_proj.bias"),
        ("ffn_norm.weight", "final_layer_norm.weight"),
        ("ffn_norm.bias", "final_layer_norm.bias"),
        ("ffn_up.weight", "fc1.weight"),
        ("ffn_up.bias", "fc1.bias"),
        ("ffn_down.weight", "fc2.weight"),
        ("ffn_down.bias", "fc2.bias"),
    ],
};

/// OPT's rows of learned positions before position 0.
const POS_OFFSET: usize = 2;

fn gguf_keys(_: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    Err("llama.cpp has no OPT architecture, so GGUF cannot describe this model".into())
}

const PARTS: Parts = Parts {
    qk_norm: false,
    post_norms: false,
    fused_qkv: false,
    fused_gate_up: false,
    norm_bias: true,
    plain_mlp: true,
    optional_v: false,
    v_norm: false,
    out_scale: false,
};

/// The layout options of an OPT config.
struct Layout {
    /// `do_layer_norm_before` (false: post-norm, OPT-350m).
    pre_norm: bool,
    /// A final LayerNorm (pre-norm models without `_remove_final_layer_norm`).
    final_norm: bool,
    /// `word_embed_proj_dim` when it differs from `hidden_size`.
    embd_proj: Option<usize>,
}

/// The config's layout, with the options mica does not implement refused naming the field.
fn check_options(hf: &HfFolder) -> Result<Layout> {
    let c = &hf.config_json;
    let flag = |k: &str, default: bool| match c.get(k) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(hf.field_err(k, format!("{other} is not a boolean"))),
    };
    let pre_norm = flag("do_layer_norm_before", true)?;
    // transformers builds the decoder's final LayerNorm only for pre-norm models.
    let final_norm = pre_norm && !flag("_remove_final_layer_norm", false)?;
    for k in ["enable_bias", "layer_norm_elementwise_affine"] {
        if !flag(k, true)? {
            return Err(hf.field_err(k, "false is not supported"));
        }
    }
    let d = hf.config.hidden_size.unwrap_or(0);
    let embd_proj = match c.get("word_embed_proj_dim") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(p) if p as usize == d => None,
            Some(p) if p > 0 => Some(p as usize),
            _ => {
                return Err(hf.field_err(
                    "word_embed_proj_dim",
                    format!("{v} is not a positive integer"),
                ));
            }
        },
    };
    match c.get("activation_function").and_then(Value::as_str) {
        None | Some("relu") => {}
        Some(other) => {
            return Err(hf.field_err(
                "activation_function",
                format!("'{other}' is not supported (relu)"),
            ));
        }
    }
    Ok(Layout {
        pre_norm,
        final_norm,
        embd_proj,
    })
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let hf = hf_only(src, arch)?;
    let layout = check_options(hf)?;
    let w = hf.weights(arch, &HF_NAMES);
    let d = hf.config.hidden_size.unwrap_or(0);
    let tok_embd = token_embedding(&w, layout.embd_proj.unwrap_or(d))?;
    let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
    cfg.post_norm = !layout.pre_norm;
    cfg.final_norm = layout.final_norm;
    cfg.act = Activation::Relu;
    cfg.norm_eps = 1e-5; // OPT's LayerNorms: torch's default epsilon, not in the config
    cfg.rope.n_dims = 0; // positions are learned, not rotary
    cfg.norm = NormKind::Layer;
    let table = w
        .info("position_embd.weight")
        .and_then(|t| t.shape.get(1).copied())
        .unwrap_or(0) as usize;
    if table <= POS_OFFSET {
        return Err(hf.field_err(
            "max_position_embeddings",
            format!("the position table has {table} rows, none past OPT's offset of 2"),
        ));
    }
    let pos_embd = w.matrix_rows(
        "position_embd.weight",
        POS_OFFSET,
        table - POS_OFFSET,
        table,
        cfg.n_embd,
    )?;
    let mut model = build(&w, cfg, tok_embd, PARTS, None)?;
    model.pos_embd = Some(pos_embd);
    if let Some(e) = layout.embd_proj {
        model.embd_proj = Some(EmbdProj {
            input: w.linear("project_in", d, e)?,
            output: w.linear("project_out", e, d)?,
        });
    }
    Ok(model)
}
