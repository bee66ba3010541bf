//! Mixture-of-experts layers for the decoder builder ([`crate::blocks::moe`] runs them):
//! which layers are sparse, and each sparse layer's router, routed experts and optional
//! shared expert with its sigmoid gate.
//!
//! Two layouts: Hugging Face checkpoints keep one tensor set per expert (canonical names
//! `blk.{i}.ffn_{gate,up,down}_exp.{e}.weight`, mapped by the family's name table); GGUF
//! files (llama.cpp) stack them into 3-D tensors `blk.{i}.ffn_{gate,up,down}_exps.weight`,
//! experts outermost (`[n_embd, n_ff, n_expert]` for gate / up, `[n_ff, n_embd, n_expert]`
//! for down, innermost first), and each expert here is a zero-copy view of its slice.
//! Shared experts are `ffn_{gate,up,down}_shexp`, their gate `ffn_gate_inp_shexp`.
//! Gate and up may be one stacked tensor, `ffn_gate_up_exps` (`[n_embd, 2 · n_ff, n_expert]`,
//! each expert's gate rows then its up rows: llama.cpp's converter writes Gemma 4 so, and
//! Gemma 4 checkpoints store `experts.gate_up_proj` in that layout); `ffn_down_exps.scale`
//! (`[n_expert]`), where present, scales each expert's output.
//!
//! Gemma 4 ([`MoeSpec::mlp_beside`]) runs the layer's dense MLP beside the experts as their
//! shared expert, with its own norms around both branches ([`crate::model::BranchNorms`]).

use super::decoder::{Parts, build_with, gguf_start};
use super::family::GgufKeys;
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::{BranchNorms, Expert, Ffn, Model, Moe};
use crate::weights::{Linear, WeightLoader};
use mica_formats::GgufFile;
use mica_kernels::ops::RopeStyle;
use std::sync::Arc;

/// The mixture-of-experts hyper-parameters of a model.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    pub n_expert: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Width of each routed expert.
    pub n_ff: usize,
    /// Renormalize the top-k probabilities.
    pub norm_topk: bool,
    /// Width of the shared expert, where there is one.
    pub shared_ff: Option<usize>,
    /// Layers that keep the dense MLP (`mlp_only_layers`).
    pub dense_layers: Vec<usize>,
    /// Every `sparse_step`-th layer is sparse (`decoder_sparse_step`; 1: all).
    pub sparse_step: usize,
    /// Experts stacked in 3-D tensors (GGUF) rather than one set per expert.
    pub stacked: bool,
    /// Gemma 4: the layer's dense MLP (`ffn_gate` / `ffn_up` / `ffn_down`, `shared_ff` wide)
    /// is the shared expert, ungated, and the layer has [`BranchNorms`]
    /// (`pre_ffw_norm_2`, `ffn_gate_inp.scale`, `post_ffw_norm_1`, `post_ffw_norm_2`).
    pub mlp_beside: bool,
}

impl MoeSpec {
    /// The feed-forward block of layer `i` when it is sparse; `None` keeps the dense MLP.
    /// In a GGUF file a layer is sparse when it has a router (`ffn_gate_inp`).
    pub fn layer(&self, w: &WeightLoader, i: usize, d: usize) -> Result<Option<Ffn>> {
        let p = |s: &str| format!("blk.{i}.{s}");
        let sparse = if self.stacked {
            w.info(&p("ffn_gate_inp.weight")).is_some()
        } else {
            !self.dense_layers.contains(&i) && (i + 1).is_multiple_of(self.sparse_step.max(1))
        };
        if !sparse {
            return Ok(None);
        }
        let (n, ff) = (self.n_expert, self.n_ff);
        // Gate and up in one stack: each expert's `2 · ff` rows, gate first.
        let fused = self.stacked
            && w.info(&p("ffn_gate_exps.weight")).is_none()
            && w.info(&p("ffn_gate_up_exps.weight")).is_some();
        // One expert's matrix: a slice of the stack, or its own tensor.
        let one = |kind: &str, e: usize, rows: usize, cols: usize| -> Result<Linear> {
            let w = if fused && kind != "down" {
                let first = e * 2 * rows + if kind == "up" { rows } else { 0 };
                w.matrix_rows(
                    &p("ffn_gate_up_exps.weight"),
                    first,
                    rows,
                    n * 2 * rows,
                    cols,
                )?
            } else if self.stacked {
                w.matrix_rows(
                    &p(&format!("ffn_{kind}_exps.weight")),
                    e * rows,
                    rows,
                    n * rows,
                    cols,
                )?
            } else {
                w.matrix(&p(&format!("ffn_{kind}_exp.{e}.weight")), rows, cols)?
            };
            Ok(Linear::new(w, None))
        };
        let experts = (0..n)
            .map(|e| {
                Ok(Expert {
                    gate: one("gate", e, ff, d)?,
                    up: one("up", e, ff, d)?,
                    down: one("down", e, d, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // GGUF files say whether there is a shared expert by having its tensors.
        let sx = if self.mlp_beside { "" } else { "_shexp" };
        let shared_ff = self.shared_ff.filter(|_| {
            self.mlp_beside || !self.stacked || w.info(&p("ffn_up_shexp.weight")).is_some()
        });
        let shared = match shared_ff {
            None => None,
            Some(sf) => Some(Expert {
                gate: w.linear(&p(&format!("ffn_gate{sx}")), sf, d)?,
                up: w.linear(&p(&format!("ffn_up{sx}")), sf, d)?,
                down: w.linear(&p(&format!("ffn_down{sx}")), d, sf)?,
            }),
        };
        // `[n_embd]` or `[n_embd, 1]`: one row either way. Required in Hugging Face Qwen-MoE
        // checkpoints; optional in GGUF (llama.cpp's ungated shared experts).
        let gate_name = p("ffn_gate_inp_shexp.weight");
        let shared_gate = match &shared {
            Some(_) if self.mlp_beside => None,
            Some(_) if self.stacked && w.info(&gate_name).is_none() => None,
            Some(_) => Some(Linear::new(w.matrix_rows(&gate_name, 0, 1, 1, d)?, None)),
            None => None,
        };
        Ok(Some(Ffn::Moe(Moe {
            router: w.linear(&p("ffn_gate_inp"), n, d)?,
            experts,
            top_k: self.top_k,
            norm_topk: self.norm_topk,
            topk_softmax: false,
            shared,
            shared_gate,
            expert_scale: match w.info(&p("ffn_down_exps.scale")) {
                Some(_) => Some(w.vector(&p("ffn_down_exps.scale"), n)?),
                None => None,
            },
            norms: match self.mlp_beside {
                true => Some(BranchNorms {
                    experts_in: w.norm(&p("pre_ffw_norm_2.weight"), d)?,
                    router_in: w.vector(&p("ffn_gate_inp.scale"), d)?,
                    shared_out: w.norm(&p("post_ffw_norm_1.weight"), d)?,
                    experts_out: w.norm(&p("post_ffw_norm_2.weight"), d)?,
                }),
                false => None,
            },
            routing: Default::default(),
        })))
    }

    /// Validates the counts (an error names `field` of `path`).
    fn check(self, err: impl Fn(&str, String) -> ModelError) -> Result<MoeSpec> {
        if self.top_k == 0 || self.top_k > self.n_expert {
            return Err(err(
                "expert_used_count",
                format!("{} experts per token of {}", self.top_k, self.n_expert),
            ));
        }
        Ok(self)
    }
}

/// The spec of a GGUF file (`{arch}.expert_count`, `expert_used_count`,
/// `expert_feed_forward_length` — else `feed_forward_length` —,
/// `expert_shared_feed_forward_length`, `expert_weights_norm`), or `None` when it has no
/// experts. `norm_default`: whether llama.cpp renormalizes for this architecture.
pub fn gguf_spec(file: &GgufFile, arch: &str, norm_default: bool) -> Result<Option<MoeSpec>> {
    let key = |k: &str| format!("{arch}.{k}");
    let err = |k: &str, msg: String| ModelError::Config {
        path: file.path().to_path_buf(),
        key: key(k),
        msg,
    };
    let get = |k: &str| file.get_u64(&key(k)).map(|v| v as usize).filter(|&v| v > 0);
    let Some(n_expert) = get("expert_count") else {
        return Ok(None);
    };
    if let Some(s) = file.get_f32(&key("expert_weights_scale"))
        && s != 1.0
    {
        return Err(err(
            "expert_weights_scale",
            format!("{s} is not supported (1 is)"),
        ));
    }
    if let Some(g) = file.get_u64(&key("expert_gating_func"))
        && g != 1
    {
        return Err(err(
            "expert_gating_func",
            format!("{g} is not supported (1, softmax, is)"),
        ));
    }
    MoeSpec {
        n_expert,
        top_k: get("expert_used_count")
            .ok_or_else(|| err("expert_used_count", "missing or 0".into()))?,
        n_ff: get("expert_feed_forward_length")
            .or(get("feed_forward_length"))
            .ok_or_else(|| err("expert_feed_forward_length", "missing".into()))?,
        norm_topk: file
            .get_bool(&key("expert_weights_norm"))
            .unwrap_or(norm_default),
        shared_ff: get("expert_shared_feed_forward_length").or(get("feed_forward_length")),
        dense_layers: Vec::new(),
        sparse_step: 1,
        stacked: true,
        mlp_beside: false,
    }
    .check(err)
    .map(Some)
}

/// Qwen2-MoE / Qwen3-MoE `config.json`: `num_experts` (or `num_local_experts`),
/// `num_experts_per_tok`,
/// `moe_intermediate_size`, `shared_expert_intermediate_size` (Qwen2-MoE), `norm_topk_prob`,
/// `decoder_sparse_step`, `mlp_only_layers`.
pub fn qwen_hf_spec(hf: &HfFolder) -> Result<MoeSpec> {
    let c = &hf.config;
    MoeSpec {
        // transformers 5 writes Mixtral's name.
        n_expert: hf.required("num_experts", c.num_experts.or(c.num_local_experts))?,
        top_k: hf.required("num_experts_per_tok", c.num_experts_per_tok)?,
        n_ff: hf.required("moe_intermediate_size", c.moe_intermediate_size)?,
        norm_topk: c.norm_topk_prob.unwrap_or(false),
        shared_ff: c.shared_expert_intermediate_size.filter(|&s| s > 0),
        dense_layers: c.mlp_only_layers.clone().unwrap_or_default(),
        sparse_step: c.decoder_sparse_step.unwrap_or(1).max(1),
        stacked: false,
        mlp_beside: false,
    }
    .check(|_, msg| hf.field_err("num_experts_per_tok", msg))
}

/// A GGUF mixture-of-experts decoder: the shared hyper-parameters, the GGUF spec, stacked
/// experts. `None` when the file has no `{arch}.expert_count`.
pub fn load_gguf(
    file: &Arc<GgufFile>,
    arch: &str,
    style: RopeStyle,
    parts: Parts,
    norm_default: bool,
) -> Result<Option<Model>> {
    let Some(spec) = gguf_spec(file, arch, norm_default)? else {
        return Ok(None);
    };
    let (w, mut cfg, tok_embd) = gguf_start(file, arch, style)?;
    cfg.rope.freq_factors = w.vector_opt("rope_freqs.weight", cfg.rope.n_dims / 2)?;
    let d = cfg.n_embd;
    let ffn = |i| spec.layer(&w, i, d);
    build_with(&w, cfg, tok_embd, parts, Some(file.clone()), &ffn).map(Some)
}

/// The error for a mixture-of-experts architecture whose GGUF file has no experts.
pub fn no_experts(file: &GgufFile, arch: &str) -> ModelError {
    ModelError::Config {
        path: file.path().to_path_buf(),
        key: format!("{arch}.expert_count"),
        msg: "missing (required by this mixture-of-experts architecture)".into(),
    }
}

/// The expert keys of a GGUF file for a loaded mixture-of-experts model:
/// `expert_count`, `expert_used_count`, and with `ff_keys` (Qwen-MoE)
/// `expert_feed_forward_length` and `expert_shared_feed_forward_length`. llama.cpp's graphs
/// make every layer sparse and renormalize the top-k weights or not by architecture
/// (`renormalizes`), so a model that differs cannot be written.
pub fn gguf_keys(
    model: &Model,
    keys: &mut GgufKeys,
    renormalizes: bool,
    ff_keys: bool,
) -> std::result::Result<(), String> {
    let moe: Vec<Option<&Moe>> = model
        .layers
        .iter()
        .map(|l| match &l.ffn {
            Ffn::Moe(m) => Some(m),
            _ => None,
        })
        .collect();
    let dense: Vec<usize> = (0..moe.len()).filter(|&i| moe[i].is_none()).collect();
    let Some(Some(first)) = moe.iter().find(|m| m.is_some()) else {
        return Err("the model has no sparse layer".into());
    };
    if !dense.is_empty() {
        return Err(format!(
            "layers {dense:?} are dense (mlp_only_layers / decoder_sparse_step); llama.cpp's \
             {} graph makes every layer a mixture of experts",
            keys.arch
        ));
    }
    if first.norm_topk != renormalizes {
        return Err(format!(
            "the top-k expert weights are {}renormalized (norm_topk_prob); llama.cpp's {} \
             graph {}",
            if first.norm_topk { "" } else { "not " },
            keys.arch,
            if renormalizes {
                "always renormalizes them"
            } else {
                "never does"
            }
        ));
    }
    keys.u32("expert_count", first.experts.len());
    keys.u32("expert_used_count", first.top_k);
    if ff_keys {
        keys.u32("expert_feed_forward_length", first.experts[0].up.out_dim());
        if let Some(s) = &first.shared {
            keys.u32("expert_shared_feed_forward_length", s.up.out_dim());
        }
    }
    Ok(())
}
