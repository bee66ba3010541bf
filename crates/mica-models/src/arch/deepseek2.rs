//! DeepSeek-V2 / V3: multi-head latent attention ([`crate::blocks::mla`], the cache holding
//! one latent row per token) with YaRN RoPE on the decoupled rope dimensions, and a mixture
//! of experts — routed experts plus always-on shared ones, group-limited routing
//! (`n_group`, `topk_group`), the routed experts' output scale — after
//! `first_k_dense_replace` dense layers. V2 scores experts by softmax (groups ranked by
//! their best expert); V3 by sigmoid, choosing with `e_score_correction_bias` and ranking
//! groups by their best two.
//!
//! From Hugging Face folders (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`: `kv_b_proj`
//! is split per head at load into the absorbed matrices) and from GGUF (`deepseek2`, as
//! llama.cpp's converter writes it: `attn_k_b` / `attn_v_b`, or a legacy `attn_kv_b`; its
//! grouped routing ranks groups by their best two, as llama.cpp does).
//! References: transformers `models/deepseek_v2`, `models/deepseek_v3`; llama.cpp
//! `src/models/deepseek2.cpp`, `src/llama-context.cpp` (YaRN factors).

use super::Source;
use super::decoder::token_embedding;
use super::experts::MoeSpec;
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{
    Activation, GgufKeys as Keys, MlaConfig, ModelConfig, NormKind, Numerics, RopeConfig,
};
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::{DecoderLayer, Expert, Ffn, GroupScore, Mla, Model, Scoring};
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use crate::weights::{Linear, Matrix, WeightLoader};
use mica_kernels::ops::RopeStyle;
use mica_formats::MetaValue;
use serde_json::Value;
use std::sync::Arc;

mod routing;

pub(super) static FAMILY: Family = Family {
    name: "deepseek2",
    gguf_archs: &["deepseek2"],
    hf_classes: &["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "deepseek2",
        stack_experts: true,
        mla_kv_b: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("attn_q_a.weight", "self_attn.q_a_proj.weight"),
        ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
        ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
        ("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"),
        ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
        ("attn_kv_b.weight", "self_attn.kv_b_proj.weight"),
        ("ffn_gate_inp.weight", "mlp.gate.weight"),
        ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),
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
            "mlp.shared_experts.gate_proj.weight"
        ),
        ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
        (
            "ffn_down_shexp.weight",
            "mlp.shared_experts.down_proj.weight"
        ),
    ],
};

/// The `deepseek2.*` keys llama.cpp's converter writes: the latent and per-head widths
/// (replacing the shared key/value lengths, which are the cache's), leading dense layers,
/// experts, routing and YaRN. A V2 folder ranking expert groups by their best expert
/// (`group_limited_greedy`) is refused: llama.cpp ranks them by their best two.
fn gguf_keys(model: &Model, hf: &HfFolder, keys: &mut GgufKeys) -> std::result::Result<(), String> {
    let m = model.config.mla.as_ref().ok_or("no latent attention")?;
    let c = &hf.config;
    let moe = model.layers.iter().find_map(|l| match &l.ffn {
        Ffn::Moe(m) => Some(m),
        _ => None,
    });
    if let Some(g) = moe.and_then(|m| m.routing.groups.as_ref())
        && g.score == GroupScore::Max
    {
        return Err(format!(
            "the experts are chosen from the best {} of {} groups ranked by their best expert \
             (topk_method group_limited_greedy); llama.cpp's deepseek2 ranks groups by their \
             best two experts",
            g.topk_group, g.n_group
        ));
    }
    let p = hf.rope_params("full_attention");
    if num(&p, "attention_factor").is_some() {
        return Err("rope_parameters.attention_factor: llama.cpp's deepseek2 derives the YaRN \
                    attention factor from mscale_all_dim"
            .into());
    }
    keys.entries.retain(|(k, _)| {
        !k.ends_with(".attention.key_length") && !k.ends_with(".attention.value_length")
    });
    let dense = model
        .layers
        .iter()
        .take_while(|l| !matches!(l.ffn, Ffn::Moe(_)))
        .count();
    keys.u32("leading_dense_block_count", dense);
    if let Some(r) = m.q_lora_rank {
        keys.u32("attention.q_lora_rank", r);
    }
    keys.u32("attention.kv_lora_rank", m.kv_lora_rank);
    keys.u32("attention.key_length", m.latent_dim());
    keys.u32("attention.value_length", m.kv_lora_rank);
    keys.u32("attention.key_length_mla", m.qk_head_dim());
    keys.u32("attention.value_length_mla", m.v_head_dim);
    let ff = c.moe_intermediate_size.unwrap_or(model.config.n_ff);
    keys.u32("expert_feed_forward_length", ff);
    if let Some(moe) = moe {
        keys.u32("expert_count", moe.experts.len());
        keys.u32("expert_used_count", moe.top_k);
    }
    keys.u32("expert_shared_count", c.n_shared_experts.unwrap_or(0));
    if let Some(s) = c.routed_scaling_factor {
        keys.f32("expert_weights_scale", s as f32);
    }
    if c.norm_topk_prob == Some(true) {
        keys.bool("expert_weights_norm", true);
    }
    if let Some(g) = c.n_group {
        keys.u32("expert_group_count", g);
    }
    if let Some(g) = c.topk_group {
        keys.u32("expert_group_used_count", g);
    }
    if let Some(moe) = moe
        && (c.scoring_func.is_some() || hf.architecture().is_ok_and(|a| a.ends_with("V3ForCausalLM")))
    {
        let f = match moe.routing.scoring {
            Scoring::Softmax => 1,
            Scoring::Sigmoid => 2,
        };
        keys.u32("expert_gating_func", f);
    }
    if p["rope_type"].as_str().or(p["type"].as_str()) == Some("yarn") {
        keys.set("rope.scaling.type", MetaValue::String("yarn".into()));
        keys.f32("rope.scaling.factor", num(&p, "factor").unwrap_or(1.0) as f32);
        if let Some(o) = num(&p, "original_max_position_embeddings") {
            keys.u32("rope.scaling.original_context_length", o as usize);
        }
        for (k, name) in [("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")] {
            if let Some(b) = num(&p, k) {
                keys.f32(&format!("rope.scaling.{name}"), b as f32);
            }
        }
    }
    if let Some(a) = num(&p, "mscale_all_dim") {
        // llama.cpp's converter writes 0.1 · mscale_all_dim (its loader divides it back).
        keys.f32("rope.scaling.yarn_log_multiplier", (0.1 * a) as f32);
    }
    Ok(())
}

/// Everything a model of the family is built from, whichever the source.
struct Spec {
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_ff: usize,
    n_ctx_train: usize,
    norm_eps: f32,
    rope: RopeConfig,
    mla: MlaConfig,
    moe: MoeSpec,
    /// Routed experts' scoring, grouping and scale.
    routing: crate::model::Routing,
    /// Width of the shared experts together (`n_shared_experts · moe_intermediate_size`;
    /// 0: none).
    shared_ff: usize,
    /// The checkpoint keeps `kv_b` whole (Hugging Face, legacy GGUF): split at load.
    kv_b_whole: bool,
    name: Option<String>,
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    match src {
        Source::Hf(hf) => {
            let w = hf.weights(arch, &HF_NAMES);
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let spec = hf_spec(hf, arch, tok_embd.rows)?;
            build(&w, arch, spec, tok_embd, None)
        }
        Source::Gguf(file) => {
            let w = WeightLoader::gguf(file, arch);
            let n_embd = file.get_u64(&format!("{arch}.embedding_length")).unwrap_or(0);
            let tok_embd = token_embedding(&w, n_embd as usize)?;
            let k = Keys { gguf: file, arch };
            let mut spec = gguf_spec(&k, tok_embd.rows)?;
            spec.kv_b_whole = w.info("blk.0.attn_k_b.weight").is_none();
            build(&w, arch, spec, tok_embd, Some((*file).clone()))
        }
    }
}

/// `0.1 · m · ln(s) + 1` (1 for `s ≤ 1`): YaRN's attention temperature.
fn yarn_mscale(s: f64, m: f64) -> f64 {
    if s <= 1.0 { 1.0 } else { 0.1 * m * s.ln() + 1.0 }
}

/// YaRN as RoPE frequency divisors over `n_dims` rotated dimensions: pair `i` turns at
/// `base^(-2i/n) / f_i`, interpolated (`f_i` = `factor`) below the correction range of
/// `beta_slow` rotations, extrapolated (`f_i` = 1) above that of `beta_fast`, linearly
/// mixed between (transformers `_compute_yarn_parameters`, ggml's `rope_yarn`).
fn yarn_factors(
    n_dims: usize,
    base: f64,
    factor: f64,
    orig_ctx: f64,
    (beta_fast, beta_slow): (f64, f64),
    truncate: bool,
) -> Vec<f32> {
    let d = n_dims as f64;
    let corr = |rot: f64| d * (orig_ctx / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
    let (mut lo, mut hi) = (corr(beta_fast), corr(beta_slow));
    if truncate {
        (lo, hi) = (lo.floor(), hi.ceil());
    }
    let (lo, hi) = (lo.max(0.0), hi.min(d - 1.0));
    let hi = if lo == hi { hi + 0.001 } else { hi };
    (0..n_dims / 2)
        .map(|i| {
            // 1 where the pair is interpolated, 0 where extrapolated.
            let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
            (1.0 / (ramp / factor + (1.0 - ramp))) as f32
        })
        .collect()
}

/// A field of a RoPE parameter object as a number.
fn num(p: &Value, k: &str) -> Option<f64> {
    p.get(k).and_then(Value::as_f64)
}

fn hf_spec(hf: &HfFolder, arch: &str, n_vocab_embd: usize) -> Result<Spec> {
    let c = &hf.config;
    let v3 = arch == "DeepseekV3ForCausalLM";
    let n_embd = hf.required("hidden_size", c.hidden_size)?;
    let n_layer = hf.required("num_hidden_layers", c.num_hidden_layers)?;
    let n_head = hf.required("num_attention_heads", c.num_attention_heads)?;
    let n_vocab = hf.required("vocab_size", c.vocab_size)?;
    if n_vocab != n_vocab_embd {
        return Err(hf.field_err(
            "vocab_size",
            format!("{n_vocab} differs from the token embedding's {n_vocab_embd} rows"),
        ));
    }
    let qk_rope = hf.required("qk_rope_head_dim", c.qk_rope_head_dim)?;
    if qk_rope % 2 != 0 {
        return Err(hf.field_err("qk_rope_head_dim", format!("{qk_rope} is odd")));
    }
    let qk_nope = hf.required("qk_nope_head_dim", c.qk_nope_head_dim)?;
    let qk = (qk_nope + qk_rope) as f64;
    // RoPE: default or YaRN, over the rope dimensions, in adjacent pairs (V3 may say
    // `rope_interleave: false`: halves).
    let p = hf.rope_params("full_attention");
    let base = num(&p, "rope_theta").unwrap_or(10000.0);
    let kind = p["rope_type"].as_str().or(p["type"].as_str()).unwrap_or("default");
    let interleave = hf.config_json["rope_interleave"].as_bool().unwrap_or(true);
    let mut rope = RopeConfig {
        style: if interleave { RopeStyle::Normal } else { RopeStyle::Neox },
        n_dims: qk_rope,
        freq_base: base as f32,
        freq_scale: 1.0,
        freq_factors: None,
        attn_factor: 1.0,
    };
    let (mut kq_scale, mut rope_mscale) = (1.0 / qk.sqrt(), 1.0);
    match kind {
        "default" => {}
        "yarn" => {
            let factor = num(&p, "factor").filter(|&f| f > 0.0).ok_or_else(|| {
                hf.field_err("rope_parameters.factor", "YaRN needs a positive factor")
            })?;
            let orig = num(&p, "original_max_position_embeddings")
                .or(c.original_max_position_embeddings.map(|x| x as f64))
                .ok_or_else(|| {
                    hf.field_err(
                        "rope_parameters.original_max_position_embeddings",
                        "missing (YaRN needs the pre-training context)",
                    )
                })?;
            let betas = (
                num(&p, "beta_fast").unwrap_or(32.0),
                num(&p, "beta_slow").unwrap_or(1.0),
            );
            let truncate = p["truncate"].as_bool().unwrap_or(true);
            rope.freq_factors = Some(yarn_factors(qk_rope, base, factor, orig, betas, truncate));
            let (m, m_all) = (num(&p, "mscale"), num(&p, "mscale_all_dim"));
            rope_mscale = match (num(&p, "attention_factor"), m, m_all) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, a)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            if let Some(a) = m_all.filter(|&a| a != 0.0) {
                kq_scale *= yarn_mscale(factor, a).powi(2);
            }
        }
        other => {
            return Err(hf.field_err(
                "rope_parameters.rope_type",
                format!("'{other}' is not supported for DeepSeek (default and yarn are)"),
            ));
        }
    }
    let mla = MlaConfig {
        q_lora_rank: c.q_lora_rank.filter(|&r| r > 0),
        kv_lora_rank: hf.required("kv_lora_rank", c.kv_lora_rank)?,
        qk_nope,
        qk_rope,
        v_head_dim: hf.required("v_head_dim", c.v_head_dim)?,
        kq_scale: kq_scale as f32,
        rope_mscale: rope_mscale as f32,
    };
    let n_ff = hf.required("intermediate_size", c.intermediate_size)?;
    let n_expert = c.n_routed_experts.or(c.num_experts).unwrap_or(0);
    let dense = match n_expert {
        0 => n_layer,
        _ => c.first_k_dense_replace.unwrap_or(0).min(n_layer),
    };
    let n_ff_exp = match n_expert {
        0 => n_ff,
        _ => hf.required("moe_intermediate_size", c.moe_intermediate_size)?,
    };
    let top_k = match n_expert {
        0 => 1,
        _ => hf.required("num_experts_per_tok", c.num_experts_per_tok)?,
    };
    let routing = routing::hf(hf, v3, n_expert, top_k)?;
    Ok(Spec {
        n_embd,
        n_layer,
        n_head,
        n_ff,
        n_ctx_train: c.max_position_embeddings.unwrap_or(2048),
        norm_eps: c.rms_norm_eps.unwrap_or(1e-6) as f32,
        rope,
        mla,
        moe: MoeSpec {
            n_expert: n_expert.max(1),
            top_k,
            n_ff: n_ff_exp,
            norm_topk: c.norm_topk_prob.unwrap_or(false),
            shared_ff: None,
            dense_layers: (0..dense).collect(),
            sparse_step: 1,
            stacked: false,
            mlp_beside: false,
        },
        routing,
        shared_ff: n_ff_exp * c.n_shared_experts.unwrap_or(0),
        kv_b_whole: true,
        name: hf.dir.file_name().map(|n| n.to_string_lossy().into_owned()),
    })
}

fn gguf_spec(k: &Keys, n_vocab_embd: usize) -> Result<Spec> {
    let arch = k.arch;
    let key = |s: &str| format!("{arch}.{s}");
    let n_embd = k.usize("embedding_length")?;
    let n_layer = k.usize("block_count")?;
    let n_head = k.usize("attention.head_count")?;
    let n_vocab = k.usize_opt("vocab_size")?.unwrap_or(n_vocab_embd);
    if n_vocab != n_vocab_embd {
        return Err(k.err(
            &key("vocab_size"),
            format!("{n_vocab} differs from the token embedding's {n_vocab_embd} rows"),
        ));
    }
    let qk_rope = k.usize("rope.dimension_count")?;
    // llama.cpp's converter: `key_length_mla` / `value_length_mla` per head (older files:
    // `key_length` / `value_length`, before the latent widths took those keys).
    let qk = match k.usize_opt("attention.key_length_mla")? {
        Some(x) => x,
        None => k.usize("attention.key_length")?,
    };
    let v_head_dim = match k.usize_opt("attention.value_length_mla")? {
        Some(x) => x,
        None => k.usize("attention.value_length")?,
    };
    if qk <= qk_rope || qk_rope % 2 != 0 {
        return Err(k.err(
            &key("rope.dimension_count"),
            format!("{qk_rope} rope dimensions of heads of {qk} (must be even and fewer)"),
        ));
    }
    let base = k.f32_opt("rope.freq_base")?.unwrap_or(10000.0) as f64;
    let mut rope = RopeConfig {
        style: RopeStyle::Normal,
        n_dims: qk_rope,
        freq_base: base as f32,
        freq_scale: 1.0,
        freq_factors: None,
        attn_factor: 1.0,
    };
    let (mut kq_scale, mut rope_mscale) = (1.0 / (qk as f64).sqrt(), 1.0);
    match k.str_opt("rope.scaling.type").unwrap_or("none") {
        "none" => {}
        "yarn" => {
            let factor = k
                .f32_opt("rope.scaling.factor")?
                .filter(|&f| f > 0.0)
                .ok_or_else(|| k.err(&key("rope.scaling.factor"), "YaRN needs a positive factor"))?
                as f64;
            let orig = k.usize("rope.scaling.original_context_length")? as f64;
            let betas = (
                k.f32_opt("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0) as f64,
                k.f32_opt("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0) as f64,
            );
            if let Some(a) = k.f32_opt("rope.scaling.yarn_attn_factor")?
                && a != 1.0
            {
                return Err(k.err(
                    &key("rope.scaling.yarn_attn_factor"),
                    format!("{a} is not supported (1 is)"),
                ));
            }
            rope.freq_factors = Some(yarn_factors(qk_rope, base, factor, orig, betas, true));
            // As llama.cpp reads DeepSeek-V2: with `yarn_log_multiplier` (0.1 ·
            // mscale_all_dim) the cos/sin stay unscaled and the scores take mscale²;
            // without it both take YaRN's default temperature.
            let m = match k.f32_opt("rope.scaling.yarn_log_multiplier")? {
                Some(l) if l != 0.0 => yarn_mscale(factor, l as f64 / 0.1),
                _ => {
                    rope_mscale = yarn_mscale(factor, 1.0);
                    rope_mscale
                }
            };
            kq_scale *= m * m;
        }
        other => {
            return Err(k.err(
                &key("rope.scaling.type"),
                format!("'{other}' is not supported for deepseek2 (none and yarn are)"),
            ));
        }
    }
    let mla = MlaConfig {
        q_lora_rank: k.usize_opt("attention.q_lora_rank")?,
        kv_lora_rank: k.usize("attention.kv_lora_rank")?,
        qk_nope: qk - qk_rope,
        qk_rope,
        v_head_dim,
        kq_scale: kq_scale as f32,
        rope_mscale: rope_mscale as f32,
    };
    let n_ff = k.usize("feed_forward_length")?;
    let n_expert = k.usize_opt("expert_count")?.unwrap_or(0);
    let n_ff_exp = k.usize_opt("expert_feed_forward_length")?.unwrap_or(n_ff);
    let top_k = match n_expert {
        0 => 1,
        _ => k.usize("expert_used_count")?,
    };
    let routing = routing::gguf(k, n_expert, top_k)?;
    let shared = k.gguf.get_u64(&key("expert_shared_count")).unwrap_or(0) as usize;
    Ok(Spec {
        n_embd,
        n_layer,
        n_head,
        n_ff,
        n_ctx_train: k.usize_opt("context_length")?.unwrap_or(2048),
        norm_eps: k
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-6),
        rope,
        mla,
        moe: MoeSpec {
            n_expert: n_expert.max(1),
            top_k,
            n_ff: n_ff_exp,
            norm_topk: k.gguf.get_bool(&key("expert_weights_norm")).unwrap_or(false),
            shared_ff: None,
            dense_layers: Vec::new(),
            sparse_step: 1,
            stacked: true,
            mlp_beside: false,
        },
        routing,
        shared_ff: n_ff_exp * shared,
        kv_b_whole: false,
        name: k.gguf.get_str("general.name").map(str::to_string),
    })
}

/// The model's configuration: attention layers of one "head" holding half a latent row in
/// each of the key and value pools.
fn model_config(arch: &str, s: &Spec, n_vocab: usize) -> ModelConfig {
    let (n, half) = (s.n_layer, s.mla.half());
    ModelConfig {
        arch: arch.to_string(),
        name: s.name.clone(),
        n_vocab,
        n_embd: s.n_embd,
        n_layer: n,
        n_head: s.n_head,
        n_head_kv: 1,
        head_dim: half,
        layer_head_dim: vec![half; n],
        layer_n_head_kv: vec![1; n],
        layer_kv_from: vec![None; n],
        n_ff: s.n_ff,
        layer_n_ff: vec![s.n_ff; n],
        n_ctx_train: s.n_ctx_train,
        norm_eps: s.norm_eps,
        rope: s.rope.clone(),
        rope_local: None,
        long_rope: None,
        layer_window: vec![None; n],
        layer_rope: vec![true; n],
        embd_scale: None,
        q_scale: None,
        attn_softcap: None,
        final_softcap: None,
        act: Activation::Silu,
        norm: NormKind::Rms,
        parallel_residual: false,
        post_norm: false,
        final_norm: true,
        numerics: Numerics::LlamaCpp,
        kv_override: None,
        delta_net: None,
        mla: Some(s.mla.clone()),
    }
}

/// Each head's absorbed matrices from a whole `kv_b` (`[n_head · (qk_nope + v) × rank]`):
/// `W_UK_hᵀ` (`[rank × qk_nope]`, transposed into an owned f32 matrix) and `W_UV_h` (a
/// view of the checkpoint's rows).
fn split_kv_b(w: &WeightLoader, i: usize, c: &MlaConfig, h: usize) -> Result<(Vec<Linear>, Vec<Linear>)> {
    let name = format!("blk.{i}.attn_kv_b.weight");
    let (r, nope, vd) = (c.kv_lora_rank, c.qk_nope, c.v_head_dim);
    let per = nope + vd;
    let kv_b = w.array(&name, &[r as u64, (h * per) as u64])?;
    let mut k_b = Vec::with_capacity(h);
    let mut v_b = Vec::with_capacity(h);
    for hh in 0..h {
        let mut t = vec![0f32; r * nope];
        for a in 0..nope {
            for b in 0..r {
                t[b * nope + a] = kv_b[(hh * per + a) * r + b];
            }
        }
        let m = Matrix::owned_f32(&format!("blk.{i}.attn_k_b.{hh}"), r, nope, &t);
        k_b.push(Linear::new(m, None));
        let v = w.matrix_rows(&name, hh * per + nope, vd, h * per, r)?;
        v_b.push(Linear::new(v, None));
    }
    Ok((k_b, v_b))
}

fn build(
    w: &WeightLoader,
    arch: &str,
    s: Spec,
    tok_embd: Matrix,
    file: Option<Arc<mica_formats::GgufFile>>,
) -> Result<Model> {
    let cfg = model_config(arch, &s, tok_embd.rows);
    let (d, h, c) = (s.n_embd, s.n_head, &s.mla);
    let (r, qk, vd) = (c.kv_lora_rank, c.qk_head_dim(), c.v_head_dim);
    let layers = (0..s.n_layer)
        .map(|i| {
            let p = |x: &str| format!("blk.{i}.{x}");
            let (q_a, wq) = match c.q_lora_rank {
                Some(qr) => (
                    Some((w.linear(&p("attn_q_a"), qr, d)?, w.norm(&p("attn_q_a_norm.weight"), qr)?)),
                    w.linear(&p("attn_q_b"), h * qk, qr)?,
                ),
                None => (None, w.linear(&p("attn_q"), h * qk, d)?),
            };
            let (k_b, v_b) = if s.kv_b_whole {
                split_kv_b(w, i, c, h)?
            } else {
                let one = |n: &str, e: usize, rows: usize, cols: usize| -> Result<Linear> {
                    Ok(Linear::new(
                        w.matrix_rows(&p(n), e * rows, rows, h * rows, cols)?,
                        None,
                    ))
                };
                (
                    (0..h).map(|e| one("attn_k_b.weight", e, r, c.qk_nope)).collect::<Result<_>>()?,
                    (0..h).map(|e| one("attn_v_b.weight", e, vd, r)).collect::<Result<_>>()?,
                )
            };
            let mla = Mla {
                q_a,
                kv_a: w.linear(&p("attn_kv_a_mqa"), c.latent_dim(), d)?,
                kv_a_norm: w.norm(&p("attn_kv_a_norm.weight"), r)?,
                k_b,
                v_b,
            };
            let ffn = match s.moe.layer(w, i, d)? {
                Some(Ffn::Moe(mut m)) => {
                    m.routing = s.routing.clone();
                    // DeepSeek-V3's `e_score_correction_bias`, per layer.
                    m.routing.choice_bias = w.vector_opt(&p("exp_probs_b.bias"), m.experts.len())?;
                    if s.shared_ff > 0 {
                        let sf = s.shared_ff;
                        m.shared = Some(Expert {
                            gate: w.linear(&p("ffn_gate_shexp"), sf, d)?,
                            up: w.linear(&p("ffn_up_shexp"), sf, d)?,
                            down: w.linear(&p("ffn_down_shexp"), d, sf)?,
                        });
                    }
                    Ffn::Moe(m)
                }
                _ => Ffn::Dense(Expert {
                    gate: w.linear(&p("ffn_gate"), s.n_ff, d)?,
                    up: w.linear(&p("ffn_up"), s.n_ff, d)?,
                    down: w.linear(&p("ffn_down"), d, s.n_ff)?,
                }),
            };
            Ok(DecoderLayer {
                attn_norm: w.norm(&p("attn_norm.weight"), d)?,
                attn_norm_b: None,
                q_norm: None,
                k_norm: None,
                post_attn_norm: None,
                post_ffn_norm: None,
                wq,
                q_gate: false,
                sinks: None,
                delta: None,
                mla: Some(mla),
                wk: None,
                wv: None,
                v_norm: None,
                out_scale: None,
                ple: None,
                wo: w.linear(&p("attn_output"), d, h * vd)?,
                ffn_norm: w.norm(&p("ffn_norm.weight"), d)?,
                ffn_norm_b: None,
                ffn,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let output = match w.info("output.weight") {
        Some(_) => w.linear("output", cfg.n_vocab, d)?,
        None => Linear::new(tok_embd.clone(), None),
    };
    Ok(Model {
        output_norm: w.norm("output_norm.weight", d)?,
        config: cfg,
        tok_embd,
        pos_embd: None,
        ple: None,
        layers,
        output_norm_b: None,
        embd_proj: None,
        output,
        file,
        stream: None,
        evicted_from: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN's divisors: 1 (extrapolated) for the fast pairs, `factor` for the slow ones, a
    /// ramp between; transformers' values for the fixture's configuration.
    #[test]
    fn yarn_divisors_ramp_from_extrapolation_to_interpolation() {
        let f = yarn_factors(16, 10000.0, 4.0, 16.0, (32.0, 1.0), true);
        assert_eq!(f.len(), 8);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[7], 4.0);
        assert!(f.windows(2).all(|p| p[0] <= p[1]), "{f:?}");
        assert_eq!(yarn_mscale(1.0, 0.707), 1.0);
        assert!((yarn_mscale(4.0, 0.707) - (0.0707 * 4f64.ln() + 1.0)).abs() < 1e-12);
    }
}
