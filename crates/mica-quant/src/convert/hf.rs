//! A Hugging Face folder (config.json, safetensors in F32/F16/BF16, one file or shards,
//! tokenizer.json) presented as the GGUF file llama.cpp's `convert_hf_to_gguf.py` writes
//! from it, so the converted output runs in mica and loads in llama.cpp:
//!
//! - **model**: every family of the registry converts; its descriptor's conversion hints
//!   say how (`mica_models::arch::to_gguf::GgufLayout`: the folder loaded by the family's
//!   loader, the `<arch>.*` keys from the resolved config and the family, tensor names from
//!   its table read backwards, Q/K permuted for adjacent-pair RoPE, Conv1D transposed, fused
//!   qkv regrouped, experts stacked, Gemma norms `+ 1`, 1-D tensors as F32, Llama-3 and
//!   LongRoPE factors as tensors). What llama.cpp's GGUF cannot say is an error naming why;
//!   what it drops (a LLaMA sliding window) is a notice;
//! - **tokenizer**: `tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`)
//!   through mica's `spec_from_hf`, written as the `tokenizer.ggml.*` keys (tokens, token
//!   types, merges, `pre`, special ids, add-BOS/EOS) and `tokenizer.chat_template`. A folder
//!   without `tokenizer.json` converts with a notice (the file then has no vocabulary).

use crate::error::Result;
use crate::progress::{Event, Notice};
use mica_formats::{MetaArray, MetaValue, TensorInfo};
use mica_models::arch::GgufWarning;
use mica_models::arch::to_gguf::GgufLayout;
use mica_models::hf::{HfFolder, read_json};
use mica_models::tokenizer::TokenizerSpec;
use mica_models::tokenizer::hf_json::spec_from_hf;
use std::borrow::Cow;
use std::path::Path;

/// An open folder, as GGUF metadata and tensors.
pub struct HfSource {
    folder: HfFolder,
    layout: GgufLayout,
    pub metadata: Vec<(String, MetaValue)>,
    pub size: u64,
}

impl HfSource {
    /// Opens the folder `dir`; its warnings go to `on_event`.
    pub fn open(dir: &Path, on_event: &mut dyn FnMut(Event)) -> Result<HfSource> {
        let folder = HfFolder::open(dir)?;
        let layout = GgufLayout::from_hf(&folder)?;
        for w in &layout.warnings {
            match w {
                GgufWarning::SlidingWindowDropped { window, arch } => {
                    on_event(Event::Notice(Notice::SlidingWindowDropped {
                        window: *window,
                        arch: arch.to_string(),
                    }))
                }
            }
        }
        let mut metadata = layout.metadata.clone();
        match tokenizer_spec(dir)? {
            Some(spec) => metadata.extend(tokenizer_keys(&spec)),
            None => on_event(Event::Notice(Notice::NoTokenizer { dir: dir.into() })),
        }
        let size = folder
            .weights
            .files
            .iter()
            .map(|f| f.bytes().len() as u64)
            .sum();
        Ok(HfSource {
            folder,
            layout,
            metadata,
            size,
        })
    }

    /// Every tensor, GGUF names and shapes (innermost first).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.layout.tensors
    }

    /// Tensor `i`'s bytes in its GGUF type and layout.
    pub fn data(&self, i: usize) -> Result<Cow<'_, [u8]>> {
        Ok(self.layout.data(&self.folder, i)?)
    }
}

fn tokenizer_spec(dir: &Path) -> Result<Option<TokenizerSpec>> {
    let Some(tok) = read_json(&dir.join("tokenizer.json"))? else {
        return Ok(None);
    };
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let jinja = std::fs::read_to_string(dir.join("chat_template.jinja")).ok();
    let spec = spec_from_hf(&tok, config.as_ref(), jinja).map_err(|cause| {
        mica_models::ModelError::Tokenizer {
            path: dir.join("tokenizer.json"),
            cause,
        }
    })?;
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
