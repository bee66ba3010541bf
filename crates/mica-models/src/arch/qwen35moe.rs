//! Qwen3.5-MoE (text): Qwen3.5's hybrid layers ([`super::qwen35`]: Gated DeltaNet and gated
//! attention) with a mixture of experts in every layer instead of the dense MLP: softmax
//! router, top-k experts per token, always renormalized, plus a shared expert scaled by
//! `sigmoid(x · g)` ([`crate::blocks::moe`], layers from [`super::experts`]).
//!
//! From Hugging Face folders (`mlp.experts.{e}.{gate,up,down}_proj`, as transformers saves
//! them) and from GGUF (`qwen35moe`, experts stacked).
//! References: transformers `models/qwen3_5_moe/modeling_qwen3_5_moe.py`; llama.cpp
//! `src/models/qwen35moe.cpp`.

use super::Source;
use super::experts;
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use super::qwen35::{build, qwen35_layer_names, start};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};

pub(super) static FAMILY: Family = Family {
    name: "qwen35moe",
    gguf_archs: &["qwen35moe"],
    hf_classes: &["Qwen3_5MoeForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "qwen35moe",
        norm_plus_one: true,
        stack_experts: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// Qwen3.5's names plus the router, the experts, the shared expert and its gate.
pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: qwen35_layer_names![
        ("ffn_gate_inp.weight", "mlp.gate.weight"),
        (
            "ffn_gate_exp.{e}.weight",
            "mlp.experts.{e}.gate_proj.weight"
        ),
        ("ffn_up_exp.{e}.weight", "mlp.experts.{e}.up_proj.weight"),
        (
            "ffn_down_exp.{e}.weight",
            "mlp.experts.{e}.down_proj.weight"
        ),
        (
            "ffn_gate_shexp.weight",
            "mlp.shared_expert.gate_proj.weight"
        ),
        ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
        (
            "ffn_down_shexp.weight",
            "mlp.shared_expert.down_proj.weight"
        ),
        ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ],
};

/// As Qwen3.5: mica's converter does not write the DeltaNet layers.
fn gguf_keys(m: &Model, hf: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    (super::qwen35::FAMILY.gguf.keys)(m, hf, keys)
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, cfg, tok_embd, file) = start(src, arch, &HF_NAMES)?;
    let spec = match src {
        // llama.cpp's qwen35moe graph always renormalizes the top-k weights.
        Source::Gguf(f) => experts::gguf_spec(f, arch, true)?.ok_or_else(|| experts::no_experts(f, arch))?,
        Source::Hf(hf) => {
            let mut spec = experts::qwen_hf_spec(hf)?;
            // transformers' router always renormalizes (no `norm_topk_prob`).
            spec.norm_topk = true;
            spec
        }
    };
    let d = cfg.n_embd;
    build(&w, cfg, tok_embd, file, &|i| spec.layer(&w, i, d))
}
