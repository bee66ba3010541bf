//! Qwen2-MoE: the Qwen2 decoder (QKV bias, NeoX RoPE) whose sparse layers replace the MLP by
//! a mixture of experts: softmax router, top-k experts per token (renormalized only with
//! `norm_topk_prob`), plus a shared expert scaled by `sigmoid(x · g)`
//! ([`crate::blocks::moe`]). Layers in `mlp_only_layers`, or off the `decoder_sparse_step`
//! grid, stay dense.
//!
//! From Hugging Face folders (`mlp.experts.{e}.{gate,up,down}_proj`); the GGUF `qwen2moe`
//! architecture (experts stacked in 3-D tensors) is not wired yet. Reference: transformers
//! `models/qwen2_moe/modeling_qwen2_moe.py`.

use super::Source;
use super::decoder::{Parts, build_with, token_embedding};
use crate::error::{ModelError, Result};
use crate::model::{Expert, Ffn, Model, Moe};
use crate::names::QWEN2MOE_HF;

pub(super) fn load(src: &Source, arch: &str) -> Result<Model> {
    let Source::Hf(hf) = src else {
        return Err(ModelError::Config {
            path: std::path::PathBuf::from(arch),
            key: "general.architecture".into(),
            msg: "Qwen2-MoE runs from Hugging Face folders only so far".into(),
        });
    };
    let w = hf.weights(arch, &QWEN2MOE_HF);
    let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
    let cfg = hf.decoder_config(arch, tok_embd.rows)?;
    let c = &hf.config;
    let n_exp = hf.required("num_experts", c.num_experts)?;
    let top_k = hf.required("num_experts_per_tok", c.num_experts_per_tok)?;
    let ff = hf.required("moe_intermediate_size", c.moe_intermediate_size)?;
    let shared_ff = c.shared_expert_intermediate_size.filter(|&s| s > 0);
    let step = c.decoder_sparse_step.unwrap_or(1).max(1);
    let dense_layers = c.mlp_only_layers.clone().unwrap_or_default();
    let d = cfg.n_embd;
    let moe = |i: usize| -> Result<Option<Ffn>> {
        if dense_layers.contains(&i) || !(i + 1).is_multiple_of(step) {
            return Ok(None);
        }
        let p = |s: &str| format!("blk.{i}.{s}");
        let experts = (0..n_exp)
            .map(|e| {
                Ok(Expert {
                    gate: w.linear(&p(&format!("ffn_gate_exp.{e}")), ff, d)?,
                    up: w.linear(&p(&format!("ffn_up_exp.{e}")), ff, d)?,
                    down: w.linear(&p(&format!("ffn_down_exp.{e}")), d, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match shared_ff {
            None => None,
            Some(sf) => Some(Expert {
                gate: w.linear(&p("ffn_gate_shexp"), sf, d)?,
                up: w.linear(&p("ffn_up_shexp"), sf, d)?,
                down: w.linear(&p("ffn_down_shexp"), d, sf)?,
            }),
        };
        let shared_gate = match shared {
            Some(_) => Some(w.linear(&p("ffn_gate_inp_shexp"), 1, d)?),
            None => None,
        };
        Ok(Some(Ffn::Moe(Moe {
            router: w.linear(&p("ffn_gate_inp"), n_exp, d)?,
            experts,
            top_k,
            norm_topk: c.norm_topk_prob.unwrap_or(false),
            shared,
            shared_gate,
        })))
    };
    build_with(&w, cfg, tok_embd, Parts::default(), None, &moe)
}
