//! A Hugging Face folder (config.json, safetensors in F32/F16/BF16, one file or shards,
//! tokenizer.json) presented as the GGUF file llama.cpp's `convert_hf_to_gguf.py` writes
//! from it, so the output of `mica convert DIR` runs in mica and loads in llama.cpp:
//!
//! - **names**: the family's table in `mica_models::names`, read backwards (checkpoint →
//!   GGUF), the layers in numeric order (`blk.2` before `blk.10`, as the converter writes
//!   them; the per-layer quantization rules count layers in file order);
//! - **config**: `config.json` resolved by mica's own loader (`HfFolder::decoder_config`),
//!   written as the `<arch>.*` keys mica's and llama.cpp's GGUF loaders read; Llama-3 RoPE
//!   scaling becomes the `rope_freqs.weight` tensor, linear scaling the `rope.scaling.*` keys;
//! - **LLaMA Q/K**: GGUF LLaMA files rotate adjacent pairs (llama.cpp's `LLM_ARCH_LLAMA`
//!   uses normal RoPE), transformers rotates halves; the converter therefore permutes the
//!   rows of each query and key head so that row `2i + j` of the head is the checkpoint's
//!   row `j·head_dim/2 + i`. Qwen2/Qwen3 GGUF files keep the halves (NeoX RoPE);
//! - **1-D tensors** (norms, biases) are written as F32, as the converter does;
//! - **tokenizer**: `tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`)
//!   through mica's `spec_from_hf`, written as the `tokenizer.ggml.*` keys (tokens, token
//!   types, merges, `pre`, special ids, add-BOS/EOS) and `tokenizer.chat_template`. A folder
//!   without `tokenizer.json` converts with a warning (the file then has no vocabulary).

use anyhow::{Context, Result, bail};
use mica_formats::ggml_types::GgmlType;
use mica_formats::{MetaArray, MetaValue, SafetensorsSet, TensorInfo};
use mica_kernels::DType;
use mica_models::hf::{HfFolder, read_json};
use mica_models::names::NameTable;
use mica_models::tokenizer::TokenizerSpec;
use mica_models::tokenizer::hf_json::spec_from_hf;
use std::borrow::Cow;
use std::path::Path;

/// A transformers architecture mica converts: its GGUF name, name table (the registry's),
/// and whether the converter permutes Q/K for adjacent-pair RoPE.
struct Family {
    hf: &'static str,
    gguf: &'static str,
    names: fn() -> &'static NameTable,
    permute_qk: bool,
}

fn llama_names() -> &'static NameTable {
    mica_models::arch::by_hf("LlamaForCausalLM")
        .expect("LLaMA is registered")
        .hf_names
}

const FAMILIES: &[Family] = &[
    Family {
        hf: "LlamaForCausalLM",
        gguf: "llama",
        names: llama_names,
        permute_qk: true,
    },
    Family {
        hf: "MistralForCausalLM",
        gguf: "llama",
        names: llama_names,
        permute_qk: true,
    },
    Family {
        hf: "Qwen2ForCausalLM",
        gguf: "qwen2",
        names: llama_names,
        permute_qk: false,
    },
    Family {
        hf: "Qwen3ForCausalLM",
        gguf: "qwen3",
        names: llama_names,
        permute_qk: false,
    },
];

/// Where one output tensor's bytes come from.
enum Origin {
    /// A checkpoint tensor; `permute`: the number of heads whose rows are reordered.
    Checkpoint {
        name: String,
        permute: Option<usize>,
        /// Stored rank-1 tensor widened to F32.
        widen: bool,
    },
    /// Computed here (`rope_freqs.weight`), little-endian bytes.
    Computed(Vec<u8>),
}

/// An open folder, as GGUF metadata and tensors.
pub struct HfSource {
    folder: HfFolder,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    origins: Vec<Origin>,
    pub size: u64,
}

impl HfSource {
    pub fn open(dir: &Path) -> Result<HfSource> {
        let folder = HfFolder::open(dir)?;
        let arch = folder.architecture()?.to_string();
        let Some(fam) = FAMILIES.iter().find(|f| f.hf == arch) else {
            bail!(
                "{}: converting {arch} folders is not supported yet ({} are); mica can still \
                 run the folder directly (mica run -m {})",
                dir.display(),
                FAMILIES.iter().map(|f| f.hf).collect::<Vec<_>>().join(", "),
                dir.display()
            );
        };
        let embd_name = (fam.names)().to_file("token_embd.weight");
        let (_, embd) = folder.weights.tensor(&embd_name).with_context(|| {
            format!(
                "{}: the checkpoint has no token embedding '{embd_name}'",
                dir.display()
            )
        })?;
        let n_vocab = embd.shape.get(1).copied().unwrap_or(0) as usize;
        let cfg = folder.decoder_config(fam.gguf, n_vocab)?;

        // mica's HF loader resolves Mistral's window per layer; GGUF `llama` has no key for it.
        let c = &folder.config;
        let window_on = c
            .use_sliding_window
            .unwrap_or(c.model_type.as_deref() == Some("mistral"));
        if let Some(w) = c
            .sliding_window
            .filter(|&w| window_on && w < cfg.n_ctx_train)
        {
            eprintln!(
                "warning: the model attends within a sliding window of {w} tokens; GGUF '{}' \
                 has no key for it (llama.cpp's converter drops it too), so the output attends \
                 to the whole context and differs from the folder beyond {w} tokens",
                fam.gguf
            );
        }
        let mut metadata = config_keys(fam.gguf, &folder, &cfg);
        match tokenizer_spec(dir)? {
            Some(spec) => metadata.extend(tokenizer_keys(&spec)),
            None => eprintln!(
                "warning: {} has no tokenizer.json: the output has no vocabulary (fine for \
                 tests; mica run and llama.cpp need one)",
                dir.display()
            ),
        }

        let (mut tensors, mut origins) = checkpoint_tensors(&folder.weights, fam, &cfg)?;
        if let Some(ff) = &cfg.rope.freq_factors {
            tensors.push(TensorInfo {
                name: "rope_freqs.weight".into(),
                ggml_type: GgmlType(DType::F32.ggml_id()),
                shape: vec![ff.len() as u64],
                offset: 0,
                n_bytes: 4 * ff.len() as u64,
            });
            origins.push(Origin::Computed(
                ff.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
        }
        let size = folder
            .weights
            .files
            .iter()
            .map(|f| f.bytes().len() as u64)
            .sum();
        Ok(HfSource {
            folder,
            metadata,
            tensors,
            origins,
            size,
        })
    }

    /// Tensor `i`'s bytes: mapped as stored, or reordered (Q/K), widened (1-D) or computed.
    pub fn data(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        let info = &self.tensors[i];
        let (name, permute, widen) = match &self.origins[i] {
            Origin::Computed(b) => return Ok(Cow::Borrowed(b)),
            Origin::Checkpoint {
                name,
                permute,
                widen,
            } => (name, *permute, *widen),
        };
        let (file, st) = self
            .folder
            .weights
            .tensor(name)
            .with_context(|| format!("tensor '{name}' vanished from the checkpoint"))?;
        let bytes = file.tensor_data(st);
        if widen {
            let from = st
                .dtype()
                .with_context(|| format!("tensor '{name}': unsupported type"))?;
            let mut f = vec![0f32; st.n_elements() as usize];
            mica_kernels::quant::dequantize_row(from, bytes, &mut f);
            return Ok(Cow::Owned(f.iter().flat_map(|v| v.to_le_bytes()).collect()));
        }
        let Some(n_head) = permute else {
            return Ok(Cow::Borrowed(bytes));
        };
        // Rows of `row_bytes` (a 1-D bias is rows of one element).
        let n_rows = if info.shape.len() == 1 {
            info.shape[0] as usize
        } else {
            info.n_rows() as usize
        };
        let row_bytes = bytes.len() / n_rows.max(1);
        Ok(Cow::Owned(permute_rows(bytes, n_rows, row_bytes, n_head)?))
    }
}

/// llama.cpp's `LlamaModel.permute` on rows: within each of `n_head` heads of `hd` rows,
/// output row `2i + j` is input row `j·hd/2 + i`.
pub fn permute_rows(src: &[u8], n_rows: usize, row_bytes: usize, n_head: usize) -> Result<Vec<u8>> {
    if n_head == 0 || !n_rows.is_multiple_of(n_head) || !(n_rows / n_head).is_multiple_of(2) {
        bail!("cannot split {n_rows} rows into {n_head} heads of an even size");
    }
    let hd = n_rows / n_head;
    let mut out = vec![0u8; src.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let s = h * hd + j * hd / 2 + i;
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&src[s * row_bytes..(s + 1) * row_bytes]);
            }
        }
    }
    Ok(out)
}

/// The checkpoint's tensors under GGUF names, globals first, then layers in numeric order.
fn checkpoint_tensors(
    st: &SafetensorsSet,
    fam: &Family,
    cfg: &mica_models::ModelConfig,
) -> Result<(Vec<TensorInfo>, Vec<Origin>)> {
    let mut named: Vec<((usize, usize), TensorInfo, Origin)> = Vec::new();
    for (seq, (_, t)) in st.tensors().enumerate() {
        // Buffers some checkpoints carry; the runtime recomputes them.
        if t.name.ends_with("rotary_emb.inv_freq") {
            continue;
        }
        let Some((gguf, layer)) = to_gguf((fam.names)(), &t.name) else {
            bail!(
                "tensor '{}' of the checkpoint has no GGUF name in mica's {} table; \
                 converting it would lose it",
                t.name,
                fam.gguf
            );
        };
        let dtype = t
            .dtype()
            .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16));
        if dtype.is_none() {
            bail!(
                "tensor '{}' has type {}; mica converts F32, F16 and BF16 checkpoints",
                t.name,
                t.ggml_type.name()
            );
        }
        let widen = t.shape.len() == 1 && dtype != Some(DType::F32);
        let permute = if fam.permute_qk {
            if gguf.ends_with(".attn_q.weight") || gguf.ends_with(".attn_q.bias") {
                Some(cfg.n_head)
            } else if gguf.ends_with(".attn_k.weight") || gguf.ends_with(".attn_k.bias") {
                Some(cfg.n_head_kv)
            } else {
                None
            }
        } else {
            None
        };
        let ggml_type = if widen {
            GgmlType(DType::F32.ggml_id())
        } else {
            t.ggml_type
        };
        let n_bytes = ggml_type.n_bytes(&t.shape).unwrap_or(t.n_bytes);
        let info = TensorInfo {
            name: gguf,
            ggml_type,
            shape: t.shape.clone(),
            offset: 0,
            n_bytes,
        };
        // Globals before layers (token_embd first), output ones after; then layer order.
        let group = match (layer, info.name.as_str()) {
            (_, "token_embd.weight") => (0, 0),
            (Some(l), _) => (1, l),
            (None, _) => (2, 0),
        };
        named.push((
            (group.0 * (1 << 20) + group.1, seq),
            info,
            Origin::Checkpoint {
                name: t.name.clone(),
                permute,
                widen,
            },
        ));
    }
    named.sort_by_key(|e| e.0);
    Ok(named.into_iter().map(|(_, i, o)| (i, o)).unzip())
}

/// A checkpoint name's GGUF name (and layer), by the family table read backwards.
fn to_gguf(t: &NameTable, name: &str) -> Option<(String, Option<usize>)> {
    if let Some((c, _)) = t.global.iter().find(|(_, f)| *f == name) {
        return Some((c.to_string(), None));
    }
    let (pre, post) = t.layer_prefix.split_once("{i}")?;
    let rest = name.strip_prefix(pre)?;
    let (i, suffix) = rest.split_once(post)?;
    let layer: usize = i.parse().ok()?;
    let (c, _) = t.layer.iter().find(|(_, f)| *f == suffix)?;
    Some((format!("blk.{layer}.{c}"), Some(layer)))
}

/// `general.*` and `<arch>.*` keys from the resolved config.
fn config_keys(
    arch: &str,
    folder: &HfFolder,
    cfg: &mica_models::ModelConfig,
) -> Vec<(String, MetaValue)> {
    let s = |v: &str| MetaValue::String(v.to_string());
    let u = |v: usize| MetaValue::U32(v as u32);
    let k = |name: &str| format!("{arch}.{name}");
    let name = folder
        .config_json
        .get("_model_name_or_path")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .or_else(|| cfg.name.clone())
        .unwrap_or_default();
    let mut md = vec![
        ("general.architecture".to_string(), s(arch)),
        ("general.type".into(), s("model")),
        ("general.name".into(), s(&name)),
        (k("block_count"), u(cfg.n_layer)),
        (k("context_length"), u(cfg.n_ctx_train)),
        (k("embedding_length"), u(cfg.n_embd)),
        (k("feed_forward_length"), u(cfg.n_ff)),
        (k("attention.head_count"), u(cfg.n_head)),
        (k("attention.head_count_kv"), u(cfg.n_head_kv)),
        (k("rope.freq_base"), MetaValue::F32(cfg.rope.freq_base)),
        (
            k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(cfg.norm_eps),
        ),
        (k("vocab_size"), u(cfg.n_vocab)),
        (k("rope.dimension_count"), u(cfg.rope.n_dims)),
    ];
    if cfg.head_dim * cfg.n_head != cfg.n_embd {
        md.push((k("attention.key_length"), u(cfg.head_dim)));
        md.push((k("attention.value_length"), u(cfg.head_dim)));
    }
    if cfg.rope.freq_scale != 1.0 {
        md.push((k("rope.scaling.type"), s("linear")));
        md.push((
            k("rope.scaling.factor"),
            MetaValue::F32(1.0 / cfg.rope.freq_scale),
        ));
    }
    md
}

fn tokenizer_spec(dir: &Path) -> Result<Option<TokenizerSpec>> {
    let Some(tok) = read_json(&dir.join("tokenizer.json"))? else {
        return Ok(None);
    };
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
    let spec = spec_from_hf(&tok, config.as_ref(), jinja)
        .with_context(|| format!("{}", dir.join("tokenizer.json").display()))?;
    Ok(Some(spec))
}

/// The `tokenizer.*` keys of a spec, as llama.cpp's converter names them.
pub fn tokenizer_keys(spec: &TokenizerSpec) -> Vec<(String, MetaValue)> {
    let s = |v: &str| MetaValue::String(v.to_string());
    let mut md = vec![("tokenizer.ggml.model".to_string(), s(&spec.model))];
    if let Some(p) = &spec.pre {
        md.push(("tokenizer.ggml.pre".into(), s(p)));
    }
    md.push((
        "tokenizer.ggml.tokens".into(),
        MetaValue::Array(MetaArray::String(spec.tokens.clone())),
    ));
    if let Some(sc) = &spec.scores {
        md.push((
            "tokenizer.ggml.scores".into(),
            MetaValue::Array(MetaArray::F32(sc.clone())),
        ));
    }
    if let Some(tt) = &spec.token_types {
        md.push((
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(MetaArray::I32(tt.clone())),
        ));
    }
    if let Some(m) = &spec.merges {
        md.push((
            "tokenizer.ggml.merges".into(),
            MetaValue::Array(MetaArray::String(m.clone())),
        ));
    }
    let ids = [
        ("bos", spec.bos_id),
        ("eos", spec.eos_id),
        ("eot", spec.eot_id),
        ("eom", spec.eom_id),
        ("unknown", spec.unk_id),
        ("padding", spec.pad_id),
        ("fim_pad", spec.fim_pad_id),
        ("fim_rep", spec.fim_rep_id),
        ("fim_sep", spec.fim_sep_id),
    ];
    for (k, v) in ids {
        if let Some(id) = v {
            md.push((format!("tokenizer.ggml.{k}_token_id"), MetaValue::U32(id)));
        }
    }
    let flags = [
        ("add_bos_token", spec.add_bos),
        ("add_eos_token", spec.add_eos),
        ("add_space_prefix", spec.add_space_prefix),
    ];
    for (k, v) in flags {
        if let Some(b) = v {
            md.push((format!("tokenizer.ggml.{k}"), MetaValue::Bool(b)));
        }
    }
    if let Some(t) = &spec.chat_template {
        md.push(("tokenizer.chat_template".into(), s(t)));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_interleaves_the_halves_of_each_head() {
        // 2 heads of 4 rows, one byte per row: head rows [a0 a1 b0 b1] → [a0 b0 a1 b1].
        let src: Vec<u8> = (0..8).collect();
        let out = permute_rows(&src, 8, 1, 2).unwrap();
        assert_eq!(out, vec![0, 2, 1, 3, 4, 6, 5, 7]);
        assert!(permute_rows(&src, 8, 1, 3).is_err());
    }

    #[test]
    fn names_map_backwards() {
        let llama = llama_names();
        assert_eq!(
            to_gguf(llama, "model.layers.12.self_attn.q_proj.weight"),
            Some(("blk.12.attn_q.weight".into(), Some(12)))
        );
        assert_eq!(
            to_gguf(llama, "model.embed_tokens.weight"),
            Some(("token_embd.weight".into(), None))
        );
        assert_eq!(to_gguf(llama, "model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(to_gguf(llama, "model.layers.1.mystery"), None);
    }
}
