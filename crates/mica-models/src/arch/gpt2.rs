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
use crate::config::{Activation, ModelConfig, NormKind};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::GPT2_HF;
use crate::weights::{WeightLoader, transpose};
use mica_kernels::ops::RopeStyle;

const PARTS: Parts = Parts {
    qk_norm: false,
    post_norms: false,
    fused_qkv: true,
    fused_gate_up: false,
    norm_bias: true,
    plain_mlp: true,
};

pub(super) fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, mut cfg, tok_embd, file) = match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            cfg.norm_eps = gguf_layer_norm_eps(file, arch);
            cfg.act = Activation::GeluTanh;
            (w, cfg, tok_embd, Some((*file).clone()))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, &GPT2_HF);
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
