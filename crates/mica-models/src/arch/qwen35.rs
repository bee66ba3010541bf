//! Qwen3.5 (text): a hybrid decoder whose layers are either Gated DeltaNet linear attention
//! ([`crate::blocks::deltanet`]; a recurrent state per sequence instead of keys and values)
//! or gated full attention, by default every 4th layer (`layer_types`, GGUF
//! `attention.recurrent_layers` or `full_attention_interval`). Besides the token mixer every
//! layer is the usual pre-norm block (RMSNorm → mixer → residual; RMSNorm → SwiGLU MLP →
//! residual), and:
//! - `(1 + w)` RMSNorms (checkpoints store `w`; llama.cpp's converter folds the 1 into the
//!   GGUF), except the DeltaNet's gated output norm, which is plain `x·w`;
//! - attention layers: `q_proj` gives each head's query and an output gate
//!   ([`crate::model::DecoderLayer::q_gate`]), per-head Q/K RMSNorm, NeoX RoPE on the first
//!   `partial_rotary_factor` of each head. The checkpoints' multimodal RoPE (`mrope_section`)
//!   rotates text positions exactly as plain RoPE (all three position components are the
//!   token's position), which is what mica computes; from GGUF, a
//!   `rope.dimension_sections` that would leave a rotated pair to llama.cpp's fourth
//!   component (position 0 for text) is refused.
//! - GGUF files may carry multi-token-prediction layers after the others
//!   (`nextn_predict_layers`, counted in `block_count`); they are not loaded.
//! - the DeltaNet value heads read their key heads grouped in checkpoints and tiled in GGUF
//!   (llama.cpp's converter reorders them; [`DeltaNetConfig::v_tiled`]); `A_log` is stored
//!   as `-exp(A_log)` in GGUF (`ssm_a`).
//!
//! References: transformers `models/qwen3_5/modeling_qwen3_5.py`; llama.cpp
//! `src/models/qwen35.cpp`, `conversion/qwen.py` (`Qwen3_5TextModel`).

use super::Source;
use super::decoder::{gguf_start, token_embedding};
use super::family::{Family, GgufHints, GgufKeys, PLAIN};
use crate::config::{DeltaNetConfig, ModelConfig};
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::{DecoderLayer, DeltaNet, Expert, Ffn, Model};
use crate::names::{DECODER_GLOBAL, NameTable, decoder_layer_names};
use crate::weights::{Linear, Matrix, WeightLoader};
use mica_formats::{GgufFile, MetaArray, MetaValue};
use mica_kernels::ops::RopeStyle;
use std::sync::Arc;

pub(super) static FAMILY: Family = Family {
    name: "qwen35",
    gguf_archs: &["qwen35"],
    hf_classes: &["Qwen3_5ForCausalLM"],
    hf_names: &HF_NAMES,
    load,
    gguf: GgufHints {
        arch: "qwen35",
        norm_plus_one: true,
        keys: gguf_keys,
        ..PLAIN
    },
};

/// The DeltaNet tensors' checkpoint names (`linear_attn.*`) beside the attention ones.
macro_rules! qwen35_layer_names {
    ($($extra:expr),* $(,)?) => {
        decoder_layer_names![
            (
                "post_attention_norm.weight",
                "post_attention_layernorm.weight"
            ),
            ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
            ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
            ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
            ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
            ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
            ("ssm_dt.bias", "linear_attn.dt_bias"),
            ("ssm_a", "linear_attn.A_log"),
            ("ssm_norm.weight", "linear_attn.norm.weight"),
            ("ssm_out.weight", "linear_attn.out_proj.weight"),
            $($extra),*
        ]
    };
}

pub(super) use qwen35_layer_names;

pub(crate) static HF_NAMES: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: qwen35_layer_names![],
};

/// llama.cpp's default when a file lists no recurrent layers: every 4th layer attends.
const DEFAULT_INTERVAL: usize = 4;

/// mica's converter does not write the DeltaNet tensors (their value heads reordered,
/// `A_log` as `-exp(A_log)`), so a Qwen3.5 folder is converted by llama.cpp's
/// `convert_hf_to_gguf.py`.
fn gguf_keys(_: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    Err("mica's converter does not write Gated DeltaNet layers (Qwen3.5's linear_attention \
         layer_types) yet; convert the folder with llama.cpp's convert_hf_to_gguf.py"
        .into())
}

fn load(src: &Source, arch: &str) -> Result<Model> {
    let (w, cfg, tok_embd, file) = start(src, arch, &HF_NAMES)?;
    build(&w, cfg, tok_embd, file, &|_| Ok(None))
}

/// The weight loader, configuration (with its DeltaNet layers) and token embedding of a
/// Qwen3.5 model from either source; shared with Qwen3.5-MoE.
pub(super) fn start(
    src: &Source,
    arch: &str,
    names: &'static NameTable,
) -> Result<(WeightLoader, ModelConfig, Matrix, Option<Arc<GgufFile>>)> {
    match src {
        Source::Gguf(file) => {
            let (w, mut cfg, tok_embd) = gguf_start(file, arch, RopeStyle::Neox)?;
            // llama.cpp's converter counts the multi-token-prediction layers (a draft head,
            // not run in the main pass) in `block_count`: they come last and are not loaded.
            let key = format!("{arch}.nextn_predict_layers");
            let mtp = file.get_u64(&key).unwrap_or(0) as usize;
            if mtp > 0 {
                if mtp >= cfg.n_layer {
                    return Err(ModelError::Config {
                        path: file.path().to_path_buf(),
                        key,
                        msg: format!("{mtp} of the {} layers leave none to run", cfg.n_layer),
                    });
                }
                cfg.keep_layers(cfg.n_layer - mtp);
            }
            cfg.delta_net = Some(gguf_delta(file, arch, &cfg)?);
            check_sections(file, arch, &cfg)?;
            Ok((w, cfg, tok_embd, Some((*file).clone())))
        }
        Source::Hf(hf) => {
            let mut w = hf.weights(arch, names);
            // The (1 + w) norms; the DeltaNet's output norm is read without the offset.
            w.norm_offset = 1.0;
            let tok_embd = token_embedding(&w, hf.config.hidden_size.unwrap_or(0))?;
            let mut cfg = hf.decoder_config(arch, tok_embd.rows)?;
            cfg.delta_net = Some(hf_delta(hf, &cfg)?);
            Ok((w, cfg, tok_embd, None))
        }
    }
}

/// The DeltaNet shape and layers from the `{arch}.ssm.*` keys.
fn gguf_delta(file: &GgufFile, arch: &str, cfg: &ModelConfig) -> Result<DeltaNetConfig> {
    let key = |k: &str| format!("{arch}.{k}");
    let err = |k: &str, msg: String| ModelError::Config {
        path: file.path().to_path_buf(),
        key: key(k),
        msg,
    };
    let req = |k: &str| {
        file.get_u64(&key(k))
            .filter(|&x| x > 0)
            .map(|x| x as usize)
            .ok_or_else(|| err(k, "missing or zero (required by this architecture)".into()))
    };
    let n = cfg.n_layer;
    let layers = match file.metadata(&key("attention.recurrent_layers")) {
        Some(MetaValue::Array(MetaArray::Bool(b))) if b.len() >= n => b[..n].to_vec(),
        Some(v) => {
            return Err(err(
                "attention.recurrent_layers",
                format!("expected {n} booleans, got {v}"),
            ));
        }
        None => {
            let every = file
                .get_u64(&key("full_attention_interval"))
                .map_or(DEFAULT_INTERVAL, |x| x as usize)
                .max(1);
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let n_v = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    let c = DeltaNetConfig {
        layers,
        conv_kernel: req("ssm.conv_kernel")?,
        n_k_heads: req("ssm.group_count")?,
        n_v_heads: n_v,
        head_k_dim: req("ssm.state_size")?,
        head_v_dim: inner / n_v,
        v_tiled: true,
        l2_eps: cfg.norm_eps,
    };
    if !inner.is_multiple_of(n_v) || !c.n_v_heads.is_multiple_of(c.n_k_heads) {
        return Err(err(
            "ssm.inner_size",
            format!(
                "{inner} values over {n_v} value heads and {} key heads do not divide evenly",
                c.n_k_heads
            ),
        ));
    }
    Ok(c)
}

/// llama.cpp's interleaved multimodal RoPE gives rotated pair `i` the position of section
/// `i % 3` while `i < 3 · sections[i % 3]`, else the fourth component, 0 for text: refused,
/// since transformers rotates every pair by the token's position.
fn check_sections(file: &GgufFile, arch: &str, cfg: &ModelConfig) -> Result<()> {
    let key = format!("{arch}.rope.dimension_sections");
    let Some(MetaValue::Array(a)) = file.metadata(&key) else {
        return Ok(());
    };
    let s: Vec<usize> = match a {
        MetaArray::I32(v) => v.iter().map(|&x| x.max(0) as usize).collect(),
        MetaArray::U32(v) => v.iter().map(|&x| x as usize).collect(),
        _ => Vec::new(),
    };
    let total: usize = s.iter().sum();
    if s.len() < 3 || total == 0 {
        return Ok(());
    }
    let text = |i: usize| {
        let sector = i % total;
        sector < 3 * s[sector % 3]
    };
    match (0..cfg.rope.n_dims / 2).find(|&i| !text(i)) {
        None => Ok(()),
        Some(i) => Err(ModelError::Config {
            path: file.path().to_path_buf(),
            key,
            msg: format!(
                "{s:?} leave rotated pair {i} to the fourth position component (0 for text), \
                 which transformers rotates by the token's position"
            ),
        }),
    }
}

/// The DeltaNet shape and layers from `config.json` (`linear_*`, `layer_types`).
fn hf_delta(hf: &HfFolder, cfg: &ModelConfig) -> Result<DeltaNetConfig> {
    let j = &hf.config_json;
    let field = |k: &str| hf.required(k, j[k].as_u64().map(|x| x as usize));
    let n = cfg.n_layer;
    let layers = match &hf.config.layer_types {
        Some(t) if t.len() != n => {
            return Err(hf.field_err(
                "layer_types",
                format!("{} entries for {n} layers", t.len()),
            ));
        }
        Some(t) => t
            .iter()
            .map(|x| match x.as_str() {
                "linear_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(hf.field_err(
                    "layer_types",
                    format!("unknown layer type '{other}' (linear_attention, full_attention)"),
                )),
            })
            .collect::<Result<Vec<_>>>()?,
        None => {
            let every = j["full_attention_interval"]
                .as_u64()
                .map_or(DEFAULT_INTERVAL, |x| x as usize)
                .max(1);
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let c = DeltaNetConfig {
        layers,
        conv_kernel: field("linear_conv_kernel_dim")?,
        n_k_heads: field("linear_num_key_heads")?,
        n_v_heads: field("linear_num_value_heads")?,
        head_k_dim: field("linear_key_head_dim")?,
        head_v_dim: field("linear_value_head_dim")?,
        v_tiled: false,
        // transformers' `l2norm` epsilon.
        l2_eps: 1e-6,
    };
    if !c.n_v_heads.is_multiple_of(c.n_k_heads) {
        return Err(hf.field_err(
            "linear_num_value_heads",
            format!(
                "{} is not a multiple of linear_num_key_heads {}",
                c.n_v_heads, c.n_k_heads
            ),
        ));
    }
    Ok(c)
}

/// `[rows][cols]` → `[cols][rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols * rows)
        .map(|i| v[(i % rows) * cols + i / rows])
        .collect()
}

/// A layer's token mixer as loaded.
struct Mixer {
    wq: Linear,
    wo: Linear,
    delta: Option<DeltaNet>,
    wk: Option<Linear>,
    wv: Option<Linear>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

/// Loads every layer (DeltaNet or gated attention, as the configuration says) and the head;
/// `ffn(layer)` may supply a layer's feed-forward block (Qwen3.5-MoE's experts), `None`
/// loads the dense SwiGLU MLP.
pub(super) fn build(
    w: &WeightLoader,
    cfg: ModelConfig,
    tok_embd: Matrix,
    file: Option<Arc<GgufFile>>,
    ffn: &dyn Fn(usize) -> Result<Option<Ffn>>,
) -> Result<Model> {
    let d = cfg.n_embd;
    let checkpoint = file.is_none();
    let layers = (0..cfg.n_layer)
        .map(|i| {
            let p = |s: &str| format!("blk.{i}.{s}");
            let ffn = match ffn(i)? {
                Some(f) => f,
                None => {
                    let ff = cfg.n_ff_of(i);
                    Ffn::Dense(Expert {
                        gate: w.linear(&p("ffn_gate"), ff, d)?,
                        up: w.linear(&p("ffn_up"), ff, d)?,
                        down: w.linear(&p("ffn_down"), d, ff)?,
                    })
                }
            };
            // The token mixer: a DeltaNet layer's projections and recurrence weights, or
            // gated attention's.
            let mixer = match &cfg.delta_net {
                Some(c) if c.layers[i] => {
                    let (cd, vd, nv) = (c.conv_dim(), c.value_dim(), c.n_v_heads);
                    let mut a = w.vector(&p("ssm_a"), nv)?;
                    if checkpoint {
                        // The checkpoint stores A_log; GGUF -exp(A_log).
                        a.iter_mut().for_each(|x| *x = -x.exp());
                    }
                    let conv_shape = [c.conv_kernel as u64, cd as u64];
                    let delta = DeltaNet {
                        z: w.linear(&p("attn_gate"), vd, d)?,
                        beta: w.linear(&p("ssm_beta"), nv, d)?,
                        alpha: w.linear(&p("ssm_alpha"), nv, d)?,
                        conv: transpose(
                            &w.array(&p("ssm_conv1d.weight"), &conv_shape)?,
                            cd,
                            c.conv_kernel,
                        ),
                        dt_bias: w.vector(&p("ssm_dt.bias"), nv)?,
                        a,
                        norm: w.vector(&p("ssm_norm.weight"), c.head_v_dim)?,
                    };
                    Mixer {
                        wq: w.linear(&p("attn_qkv"), cd, d)?,
                        wo: w.linear(&p("ssm_out"), d, vd)?,
                        delta: Some(delta),
                        wk: None,
                        wv: None,
                        q_norm: None,
                        k_norm: None,
                    }
                }
                _ => {
                    let (qd, kvd, hd) = (cfg.q_dim_of(i), cfg.kv_dim_of(i), cfg.head_dim_of(i));
                    Mixer {
                        wq: w.linear(&p("attn_q"), 2 * qd, d)?,
                        wo: w.linear(&p("attn_output"), d, qd)?,
                        delta: None,
                        wk: Some(w.linear(&p("attn_k"), kvd, d)?),
                        wv: Some(w.linear(&p("attn_v"), kvd, d)?),
                        q_norm: Some(w.norm(&p("attn_q_norm.weight"), hd)?),
                        k_norm: Some(w.norm(&p("attn_k_norm.weight"), hd)?),
                    }
                }
            };
            let layer = DecoderLayer {
                attn_norm: w.norm(&p("attn_norm.weight"), d)?,
                attn_norm_b: None,
                q_norm: mixer.q_norm,
                k_norm: mixer.k_norm,
                post_attn_norm: None,
                post_ffn_norm: None,
                q_gate: mixer.delta.is_none(),
                wq: mixer.wq,
                delta: mixer.delta,
                mla: None,
                wk: mixer.wk,
                wv: mixer.wv,
                v_norm: None,
                out_scale: None,
                ple: None,
                sinks: None,
                wo: mixer.wo,
                ffn_norm: w.norm(&p("post_attention_norm.weight"), d)?,
                ffn_norm_b: None,
                ffn,
            };
            Ok(layer)
        })
        .collect::<Result<Vec<_>>>()?;
    let output_norm = w.norm("output_norm.weight", d)?;
    let output = match w.info("output.weight") {
        Some(_) => w.linear("output", cfg.n_vocab, d)?,
        None => Linear::new(tok_embd.clone(), None),
    };
    Ok(Model {
        config: cfg,
        tok_embd,
        pos_embd: None,
        ple: None,
        layers,
        output_norm,
        output_norm_b: None,
        embd_proj: None,
        output,
        file,
        stream: None,
        evicted_from: None,
    })
}
