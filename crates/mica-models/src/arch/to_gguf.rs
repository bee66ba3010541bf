//! A Hugging Face folder laid out as the GGUF file llama.cpp's `convert_hf_to_gguf.py`
//! writes from it, derived from the family's descriptor ([`Family`], [`GgufHints`]) alone:
//!
//! - the folder is loaded by the family's own loader, so the configuration written is the
//!   one mica runs, resolved and validated;
//! - `general.*` keys, then the `{arch}.*` keys every family shares, from the resolved
//!   [`ModelConfig`] (sizes, heads, RoPE base / rotated dimensions / linear scaling, the norm
//!   epsilon under `layer_norm_rms_epsilon` or, for LayerNorm, `layer_norm_epsilon`), then the
//!   family's own ([`GgufHints::keys`], which refuses what llama.cpp's GGUF cannot say);
//! - the checkpoint's tensors under canonical names (the family's table read backwards), the
//!   layers in numeric order (`blk.2` before `blk.10`, as llama.cpp writes them), each
//!   rearranged as the hints say (Q/K permuted, Conv1D transposed, fused qkv regrouped,
//!   experts stacked, 1 added to Gemma norms), 1-D tensors widened to F32;
//! - computed tensors: Llama-3 `rope_freqs.weight`, LongRoPE `rope_factors_{short,long}`.
//!
//! The tokenizer is not part of the layout (the converter adds its keys).

use super::family::{Family, GgufKeys, GgufWarning};
use super::{by_hf, load_hf};
use crate::config::{ModelConfig, NormKind};
use crate::error::{ModelError, Result};
use crate::hf::HfFolder;
use crate::model::Model;
use crate::weights::{reorder_rows, transpose};
use half::f16;
use mica_formats::ggml_types::GgmlType;
use mica_formats::{MetaValue, TensorInfo};
use mica_kernels::DType;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// How a checkpoint tensor's bytes become the GGUF tensor's.
#[derive(Clone, Debug, PartialEq)]
pub enum Rearrange {
    /// As stored.
    None,
    /// The rows of each of `n_head` heads interleaved for adjacent-pair RoPE: row `2i + j`
    /// of a head is the checkpoint's row `j·head_dim/2 + i`.
    PermuteHeads(usize),
    /// `[rows][cols]` (Conv1D's `[in, out]`) → `[cols][rows]`.
    Transpose { rows: usize, cols: usize },
    /// Rows `[n_head][3][head_dim]` → `[3][n_head][head_dim]`.
    RegroupQkv { n_head: usize, head_dim: usize },
    /// One half of a latent-attention `kv_b` (rows `[n_head][nope + v]`, `rank` wide): each
    /// head's `nope` key rows transposed (`[n_head][rank][nope]`), or its `v` value rows.
    KvB {
        value: bool,
        n_head: usize,
        nope: usize,
        v: usize,
        rank: usize,
    },
}

/// Where one GGUF tensor's bytes come from.
#[derive(Clone, Debug)]
pub enum Origin {
    /// One checkpoint tensor.
    Tensor {
        name: String,
        rearrange: Rearrange,
        /// Written as F32 (a 1-D tensor stored narrower, or one that gets `+ 1`).
        widen: bool,
        /// 1 added to every element (Gemma's norms).
        plus_one: bool,
    },
    /// Checkpoint tensors of one type concatenated in order (experts, outermost).
    Stack(Vec<String>),
    /// Little-endian bytes computed from the configuration.
    Computed(Vec<u8>),
}

/// A folder as GGUF: metadata and tensors in writing order, and where each tensor's bytes
/// come from.
pub struct GgufLayout {
    pub family: &'static Family,
    /// The model as the family's loader built it from the folder.
    pub model: Model,
    /// `general.*` and `{arch}.*` keys (no `tokenizer.*`).
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub origins: Vec<Origin>,
    /// What the file will not say that the folder does (a dropped sliding window).
    pub warnings: Vec<GgufWarning>,
}

fn f32_type() -> GgmlType {
    GgmlType(DType::F32.ggml_id())
}

fn computed(name: &str, v: &[f32]) -> (TensorInfo, Origin) {
    let info = TensorInfo {
        name: name.into(),
        ggml_type: f32_type(),
        shape: vec![v.len() as u64],
        offset: 0,
        n_bytes: 4 * v.len() as u64,
    };
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    (info, Origin::Computed(bytes))
}

impl GgufLayout {
    /// The layout of `folder` (its family from `architectures[0]`).
    pub fn from_hf(folder: &HfFolder) -> Result<GgufLayout> {
        let class = folder.architecture()?;
        let family = by_hf(class).ok_or_else(|| ModelError::UnknownArchitecture {
            path: folder.config_path(),
            arch: class.to_string(),
            supported: super::supported().join(", "),
        })?;
        let model = load_hf(folder)?;
        let hints = &family.gguf;
        let mut keys = GgufKeys::new(hints.arch);
        shared_keys(&model.config, &mut keys);
        (hints.keys)(&model, folder, &mut keys).map_err(|reason| ModelError::Unconvertible {
            path: folder.dir.clone(),
            class: class.to_string(),
            gguf: hints.arch.to_string(),
            reason,
        })?;
        let s = |v: &str| MetaValue::String(v.to_string());
        let name = folder
            .config_json
            .get("_model_name_or_path")
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .or_else(|| model.config.name.clone())
            .unwrap_or_default();
        let mut metadata = vec![
            ("general.architecture".to_string(), s(hints.arch)),
            ("general.type".into(), s("model")),
            ("general.name".into(), s(&name)),
        ];
        metadata.extend(keys.entries);

        let (mut tensors, mut origins) = checkpoint_tensors(folder, family, &model.config)?;
        let cfg = &model.config;
        let mut extra = Vec::new();
        if let Some(ff) = cfg.rope.freq_factors.as_ref().filter(|_| !hints.mla_kv_b) {
            let p = folder.rope_params("full_attention");
            let ff = llama3_factors_f32(&p, cfg.head_dim, cfg.rope.freq_base).unwrap_or(ff.clone());
            extra.push(computed("rope_freqs.weight", &ff));
        }
        if let Some(lr) = &cfg.long_rope {
            extra.push(computed("rope_factors_long.weight", &lr.long));
            extra.push(computed("rope_factors_short.weight", &lr.short));
        }
        for (info, origin) in extra {
            tensors.push(info);
            origins.push(origin);
        }
        Ok(GgufLayout {
            family,
            model,
            metadata,
            tensors,
            origins,
            warnings: keys.warnings,
        })
    }

    /// Tensor `i`'s bytes, in its GGUF type and layout.
    pub fn data<'a>(&'a self, folder: &'a HfFolder, i: usize) -> Result<Cow<'a, [u8]>> {
        let stored = |name: &str| -> Result<(&'a [u8], &'a TensorInfo)> {
            let (file, t) = folder.weights.tensor(name).ok_or_else(|| {
                tensor_err(folder, name, "vanished from the checkpoint".to_string())
            })?;
            Ok((file.tensor_data(t), t))
        };
        let (name, rearrange, widen, plus_one) = match &self.origins[i] {
            Origin::Computed(b) => return Ok(Cow::Borrowed(b)),
            Origin::Stack(names) => {
                let mut out = Vec::with_capacity(self.tensors[i].n_bytes as usize);
                for n in names {
                    out.extend_from_slice(stored(n)?.0);
                }
                return Ok(Cow::Owned(out));
            }
            Origin::Tensor {
                name,
                rearrange,
                widen,
                plus_one,
            } => (name, rearrange, *widen, *plus_one),
        };
        let (bytes, t) = stored(name)?;
        let dtype = checkpoint_dtype(folder, t)?;
        let mut bytes = Cow::Borrowed(bytes);
        if widen {
            let mut f = vec![0f32; t.n_elements() as usize];
            mica_kernels::quant::dequantize_row(dtype, &bytes, &mut f);
            if plus_one {
                for x in &mut f {
                    // As llama.cpp's converter adds it: in the checkpoint's precision for
                    // F16 (torch adds in half), in F32 for F32 and for BF16 (widened first).
                    *x = match dtype {
                        DType::F16 => f16::from_f32(*x + 1.0).to_f32(),
                        _ => *x + 1.0,
                    };
                }
            }
            bytes = Cow::Owned(f.iter().flat_map(|v| v.to_le_bytes()).collect());
        }
        let es = if widen { 4 } else { dtype.type_size() };
        Ok(match *rearrange {
            Rearrange::None => bytes,
            Rearrange::PermuteHeads(n_head) => {
                let info = &self.tensors[i];
                let n_rows = match info.shape.as_slice() {
                    [n] => *n as usize,
                    s => s[1..].iter().product::<u64>() as usize,
                };
                if n_head == 0
                    || !n_rows.is_multiple_of(n_head)
                    || !(n_rows / n_head).is_multiple_of(2)
                {
                    return Err(tensor_err(
                        folder,
                        name,
                        format!("cannot split {n_rows} rows into {n_head} heads of an even size"),
                    ));
                }
                Cow::Owned(permute_heads(&bytes, n_rows, n_head))
            }
            Rearrange::Transpose { rows, cols } => Cow::Owned(transpose(&bytes, rows, cols, es)),
            Rearrange::RegroupQkv { n_head, head_dim } => {
                let qd = n_head * head_dim;
                // Row `i` of the result (part c, head h, row j) is row h·3·hd + c·hd + j.
                let from = move |i: usize| {
                    let (c, h, j) = (i / qd, (i % qd) / head_dim, i % head_dim);
                    h * 3 * head_dim + c * head_dim + j
                };
                Cow::Owned(reorder_rows(&bytes, bytes.len() / (3 * qd), from))
            }
            Rearrange::KvB {
                value,
                n_head,
                nope,
                v,
                rank,
            } => {
                let per = nope + v;
                let mut out =
                    Vec::with_capacity(n_head * (if value { v } else { nope }) * rank * es);
                for h in 0..n_head {
                    if value {
                        let start = (h * per + nope) * rank * es;
                        out.extend_from_slice(&bytes[start..start + v * rank * es]);
                    } else {
                        for b in 0..rank {
                            for a in 0..nope {
                                let at = ((h * per + a) * rank + b) * es;
                                out.extend_from_slice(&bytes[at..at + es]);
                            }
                        }
                    }
                }
                Cow::Owned(out)
            }
        })
    }
}

/// llama.cpp's `LlamaModel.permute` on rows: within each of `n_head` heads of `hd` rows,
/// output row `2i + j` is input row `j·hd/2 + i`.
pub fn permute_heads(src: &[u8], n_rows: usize, n_head: usize) -> Vec<u8> {
    let hd = n_rows / n_head;
    reorder_rows(src, src.len() / n_rows, |r| {
        let (h, k) = (r / hd, r % hd);
        h * hd + (k % 2) * hd / 2 + k / 2
    })
}

/// Llama 3.1's frequency divisors as llama.cpp's converter computes them for
/// `rope_freqs.weight`: in float32 tensor arithmetic (each step rounded to f32), which can
/// differ in the last bit from the double-precision values mica runs a folder with.
/// `None` when the parameters are not `llama3` ones.
fn llama3_factors_f32(p: &serde_json::Value, dim: usize, base: f32) -> Option<Vec<f32>> {
    let kind = p["rope_type"].as_str().or(p["type"].as_str())?;
    if kind != "llama3" {
        return None;
    }
    let f = |k: &str, d: f64| p[k].as_f64().unwrap_or(d) as f32;
    let (factor, low, high) = (
        f("factor", 8.0),
        f("low_freq_factor", 1.0),
        f("high_freq_factor", 4.0),
    );
    let old = f("original_max_position_embeddings", 8192.0);
    let (low_wl, high_wl) = (old / low, old / high);
    let two_pi = std::f32::consts::TAU;
    Some(
        (0..dim / 2)
            .map(|i| {
                let freq = 1.0 / base.powf((2 * i) as f32 / dim as f32);
                let wl = two_pi / freq;
                if wl < high_wl {
                    1.0
                } else if wl > low_wl {
                    factor
                } else {
                    let smooth = (old / wl - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect(),
    )
}

/// The `{arch}.*` keys every family shares, from the resolved configuration.
fn shared_keys(cfg: &ModelConfig, keys: &mut GgufKeys) {
    keys.u32("block_count", cfg.n_layer);
    keys.u32("context_length", cfg.n_ctx_train);
    keys.u32("embedding_length", cfg.n_embd);
    if cfg.layer_n_ff.iter().all(|&f| f == cfg.n_ff) {
        keys.u32("feed_forward_length", cfg.n_ff);
    } else {
        let per_layer = cfg.layer_n_ff.iter().map(|&f| f as i32).collect();
        keys.set(
            "feed_forward_length",
            MetaValue::Array(mica_formats::MetaArray::I32(per_layer)),
        );
    }
    keys.u32("attention.head_count", cfg.n_head);
    if cfg.layer_n_head_kv.iter().all(|&h| h == cfg.n_head_kv) {
        keys.u32("attention.head_count_kv", cfg.n_head_kv);
    } else {
        // Per layer, as llama.cpp's converter writes a list (Gemma 4).
        let per_layer = cfg.layer_n_head_kv.iter().map(|&h| h as i32).collect();
        keys.set(
            "attention.head_count_kv",
            MetaValue::Array(mica_formats::MetaArray::I32(per_layer)),
        );
    }
    if cfg.has_rope() {
        keys.f32("rope.freq_base", cfg.rope.freq_base);
        keys.u32("rope.dimension_count", cfg.rope.n_dims);
        if cfg.rope.freq_scale != 1.0 {
            keys.set("rope.scaling.type", MetaValue::String("linear".into()));
            keys.f32("rope.scaling.factor", 1.0 / cfg.rope.freq_scale);
        }
    }
    let eps = match cfg.norm {
        NormKind::Rms => "attention.layer_norm_rms_epsilon",
        NormKind::Layer => "attention.layer_norm_epsilon",
    };
    keys.f32(eps, cfg.norm_eps);
    keys.u32("vocab_size", cfg.n_vocab);
    keys.u32("attention.key_length", cfg.head_dim);
    keys.u32("attention.value_length", cfg.head_dim);
}

fn tensor_err(folder: &HfFolder, tensor: &str, msg: String) -> ModelError {
    ModelError::CheckpointTensor {
        path: folder.dir.clone(),
        tensor: tensor.to_string(),
        msg,
    }
}

/// F32, F16 or BF16.
fn checkpoint_dtype(folder: &HfFolder, t: &TensorInfo) -> Result<DType> {
    t.dtype()
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
        .ok_or_else(|| {
            tensor_err(
                folder,
                &t.name,
                format!(
                    "type {}: mica converts F32, F16 and BF16 checkpoints",
                    t.ggml_type.name()
                ),
            )
        })
}

/// Sort key of a GGUF tensor: the token embedding first, then layers in order, then the
/// rest; within those, checkpoint order.
type SortKey = (usize, usize, usize);

/// The checkpoint's tensors under GGUF names, in writing order.
fn checkpoint_tensors(
    folder: &HfFolder,
    family: &Family,
    cfg: &ModelConfig,
) -> Result<(Vec<TensorInfo>, Vec<Origin>)> {
    let hints = &family.gguf;
    let mut out: Vec<(SortKey, TensorInfo, Origin)> = Vec::new();
    // (layer, kind) → expert index → (checkpoint tensor, sort key).
    let mut experts: BTreeMap<(usize, String), BTreeMap<usize, (TensorInfo, SortKey)>> =
        BTreeMap::new();
    for (seq, (_, t)) in folder.weights.tensors().enumerate() {
        // Buffers some checkpoints carry; the runtime recomputes them.
        if t.name.ends_with("rotary_emb.inv_freq") {
            continue;
        }
        let Some((gguf, layer)) = family.hf_names.to_canonical(&t.name) else {
            return Err(tensor_err(
                folder,
                &t.name,
                format!(
                    "has no GGUF name in mica's {} table; converting it would lose it",
                    family.name
                ),
            ));
        };
        let dtype = checkpoint_dtype(folder, t)?;
        let key = match (layer, gguf.as_str()) {
            (_, "token_embd.weight") => (0, 0, seq),
            (Some(l), _) => (1, l, seq),
            (None, _) => (2, 0, seq),
        };
        let suffix = gguf.split_once('.').map_or("", |(_, s)| s);
        let suffix = match layer {
            Some(_) => suffix.split_once('.').map_or("", |(_, s)| s),
            None => gguf.as_str(),
        };
        // Per-expert matrices: `ffn_{kind}_exp.{e}.weight`.
        if let (Some(l), Some(rest)) = (layer, suffix.strip_prefix("ffn_"))
            && let Some((kind, e)) = rest.split_once("_exp.")
            && let Some(e) = e.strip_suffix(".weight").and_then(|e| e.parse().ok())
        {
            if !hints.stack_experts {
                return Err(tensor_err(
                    folder,
                    &t.name,
                    "per-expert tensor of a family whose GGUF does not stack experts".into(),
                ));
            }
            experts
                .entry((l, kind.to_string()))
                .or_default()
                .insert(e, (t.clone(), key));
            continue;
        }
        if let (Some(l), true, Some(m)) = (layer, hints.mla_kv_b, &cfg.mla)
            && suffix == "attn_kv_b.weight"
        {
            let (n_head, nope, v, rank) = (cfg.n_head, m.qk_nope, m.v_head_dim, m.kv_lora_rank);
            if t.shape != [rank as u64, (n_head * (nope + v)) as u64] {
                return Err(tensor_err(
                    folder,
                    &t.name,
                    format!(
                        "shape {:?}, not {rank} × {} heads of {}",
                        t.shape,
                        n_head,
                        nope + v
                    ),
                ));
            }
            for (value, shape) in [
                (false, vec![nope as u64, rank as u64, n_head as u64]),
                (true, vec![rank as u64, v as u64, n_head as u64]),
            ] {
                let part = if value { "attn_v_b" } else { "attn_k_b" };
                let info = TensorInfo {
                    name: format!("blk.{l}.{part}.weight"),
                    ggml_type: t.ggml_type,
                    n_bytes: t.ggml_type.n_bytes(&shape).unwrap_or(0),
                    shape,
                    offset: 0,
                };
                let rearrange = Rearrange::KvB {
                    value,
                    n_head,
                    nope,
                    v,
                    rank,
                };
                let origin = Origin::Tensor {
                    name: t.name.clone(),
                    rearrange,
                    widen: false,
                    plus_one: false,
                };
                out.push((key, info, origin));
            }
            continue;
        }
        let rearrange = if hints.permute_qk && matches!(suffix, "attn_q.weight" | "attn_q.bias") {
            Rearrange::PermuteHeads(cfg.n_head)
        } else if hints.permute_qk && matches!(suffix, "attn_k.weight" | "attn_k.bias") {
            Rearrange::PermuteHeads(cfg.n_head_kv)
        } else if hints.transposed.contains(&suffix) && t.shape.len() == 2 {
            Rearrange::Transpose {
                rows: t.shape[1] as usize,
                cols: t.shape[0] as usize,
            }
        } else if hints.qkv_per_head && matches!(suffix, "attn_qkv.weight" | "attn_qkv.bias") {
            Rearrange::RegroupQkv {
                n_head: cfg.n_head,
                head_dim: cfg.head_dim,
            }
        } else {
            Rearrange::None
        };
        let plus_one = hints.norm_plus_one && gguf.ends_with("norm.weight");
        // llama.cpp writes tensors of one row (after squeezing) as F32.
        let one_row = t.shape.iter().filter(|&&d| d > 1).count() <= 1;
        let widen = (one_row && dtype != DType::F32) || plus_one;
        let mut shape = t.shape.clone();
        if matches!(rearrange, Rearrange::Transpose { .. }) {
            shape.reverse();
        }
        let ggml_type = if widen { f32_type() } else { t.ggml_type };
        let n_bytes = ggml_type.n_bytes(&shape).unwrap_or(t.n_bytes);
        let info = TensorInfo {
            name: gguf,
            ggml_type,
            shape,
            offset: 0,
            n_bytes,
        };
        let origin = Origin::Tensor {
            name: t.name.clone(),
            rearrange,
            widen,
            plus_one,
        };
        out.push((key, info, origin));
    }
    for ((layer, kind), set) in experts {
        let name = format!("blk.{layer}.ffn_{kind}_exps.weight");
        let (first, key) = set.values().next().cloned().expect("a set has an expert");
        if set.keys().copied().ne(0..set.len())
            || set
                .values()
                .any(|(t, _)| t.shape != first.shape || t.ggml_type != first.ggml_type)
        {
            return Err(tensor_err(
                folder,
                &first.name,
                format!("the experts of '{name}' are not numbered 0.. with one shape and type"),
            ));
        }
        let mut shape = first.shape.clone();
        shape.push(set.len() as u64);
        let info = TensorInfo {
            name,
            ggml_type: first.ggml_type,
            n_bytes: first.n_bytes * set.len() as u64,
            shape,
            offset: 0,
        };
        let names = set.into_values().map(|(t, _)| t.name).collect();
        out.push((key, info, Origin::Stack(names)));
    }
    out.sort_by_key(|e| e.0);
    Ok(out.into_iter().map(|(_, i, o)| (i, o)).unzip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, one byte per row: head rows [a0 a1 b0 b1] → [a0 b0 a1 b1].
        let src: Vec<u8> = (0..8).collect();
        assert_eq!(permute_heads(&src, 8, 2), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        // Rows of two bytes move whole.
        let src: Vec<u8> = (0..8).collect();
        assert_eq!(permute_heads(&src, 4, 1), vec![0, 1, 4, 5, 2, 3, 6, 7]);
    }
}
