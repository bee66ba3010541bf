//! GPT-2: a pre-norm decoder with LayerNorms (weight and bias), learned absolute position
//! embeddings added to the token embeddings (no RoPE), multi-head attention through one
//! fused `c_attn` projection (rows q | k | v, with bias), an ungated GELU MLP (tanh
//! approximation, transformers' `gelu_new`), and an output head tied to the token embedding.
//!
//! transformers stores the projections as `Conv1D` modules, whose weights are `[in, out]`
//! (the transpose of `nn.Linear`'s); they are transposed once at load into a copy held in
//! memory, as llama.cpp's converter transposes them into the GGUF. GGUF files (`gpt2`) are
//! read in place.
//!
//! References: Radford et al., "Language Models are Unsupervised Multitask Learners" (2019);
//! transformers `models/gpt2/modeling_gpt2.py`; llama.cpp `src/models/gpt2.cpp`.

use super::Source;
use super::decoder::{Parts, build, gguf_layer_norm_eps, gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{Activation, ModelConfig, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::NameTable;
use crate::weights::{WeightLoader, transpose};
use mica_kernels::ops::RopeStyle;

pub(super) static FAMILY: Family = Family {
    name: "gpt2",
    gguf_archs: &["gpt2"],
    hf_classes: &["GPT2LMHeadModel"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "gpt2",
        transposed: &[
            "attn_qkv.weight",
            "attn_output.weight",
            "ffn_up.weight",
            "ffn_down.weight",
        ],
        keys: gguf_keys,
        ..PLAIN
    },
};

/// GPT-2 (`transformer.h.{i}.*`): fused `c_attn` (Conv1D, `[in, out]`, transposed at
/// load), learned positions `wpe`, LayerNorms with biases, head tied to `wte`.
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

/// No keys of its own; llama.cpp's `gpt2` graph computes GELU by the tanh approximation
/// (GGUF has no key for another activation).
fn gguf_keys(model: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    match model.config.act {
        Activation::GeluTanh => Ok(()),
        other => Err(format!(
            "the MLP uses {other:?}; llama.cpp's gpt2 computes the tanh GELU (gelu_new)"
        )),
    }
}

/// GPT-2's parts, shared by the families built on its block (StarCoder, CodeGen): fused
/// q|k|v, LayerNorms with biases, an ungated MLP.
pub(super) const PARTS: Parts = Parts {
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
            cfg.act = Activation::GeluTanh;
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.act = hf_activation(hf)?;
            check_hf_options(hf)?;
            transpose_conv1d(&mut w, &cfg)?;
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

/// The MLP activation named by `activation_function` (GPT-2 uses `gelu_new`).
pub(super) fn hf_activation(hf: &HfFolder) -> Result<Activation> {
    match hf.config.hidden_act.as_deref().unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
        "gelu" => Ok(Activation::GeluErf),
        other => Err(hf.field_err(
            "activation_function",
            format!("'{other}' is not supported (gelu_new, gelu_pytorch_tanh, gelu_fast, gelu)"),
        )),
    }
}

/// GPT-2 options that change the attention arithmetic and that mica does not implement.
fn check_hf_options(hf: &HfFolder) -> Result<()> {
    let c = &hf.config;
    if c.scale_attn_by_inverse_layer_idx == Some(true) {
        return Err(hf.field_err("scale_attn_by_inverse_layer_idx", "true is not supported"));
    }
    if c.scale_attn_weights == Some(false) {
        return Err(hf.field_err("scale_attn_weights", "false is not supported"));
    }
    Ok(())
}

/// Every Conv1D weight (`[in, out]`) into `nn.Linear`'s `[out, in]`.
fn transpose_conv1d(w: &mut WeightLoader, cfg: &ModelConfig) -> Result<()> {
    let (d, ff) = (cfg.n_embd as u64, cfg.n_ff as u64);
    for i in 0..cfg.n_layer {
        for (name, n_in, n_out) in [
            ("attn_qkv", d, 3 * d),
            ("attn_output", d, d),
            ("ffn_up", d, ff),
            ("ffn_down", ff, d),
        ] {
            // Stored innermost first as [out, in]; rewritten as [in, out].
            let (rows, cols) = (n_in as usize, n_out as usize);
            w.rewrite(
                &format!("blk.{i}.{name}.weight"),
                &[n_out, n_in],
                vec![n_in, n_out],
                |b, es| transpose(b, rows, cols, es),
            )?;
        }
    }
    Ok(())
}
