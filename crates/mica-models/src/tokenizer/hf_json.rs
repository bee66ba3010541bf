//! [`TokenizerSpec`] from a Hugging Face folder's `tokenizer.json` and
//! `tokenizer_config.json`, so a folder tokenizes exactly as its GGUF conversion would.
//!
//! Supported: byte-level BPE (`model.type = "BPE"` with a `ByteLevel` pre-tokenizer or
//! decoder), mapped to GGUF's `gpt2` model. The word-splitting regex is recognised and named
//! as llama.cpp's converter names it (`tokenizer.ggml.pre`): Llama 3's and Qwen2's `Split`
//! patterns, SmolLM's individual digits, plain GPT-2. Added tokens keep their ids; `special`
//! ones become CONTROL tokens, the others USER_DEFINED. Anything else (SentencePiece-style
//! BPE with byte fallback, Unigram, WordPiece) is a clear error naming what was found.

use super::error::{Result, TokenizerError};
use super::spec::TokenizerSpec;
use serde_json::Value;

/// Builds the spec. `config` is `tokenizer_config.json` (BOS/EOS names, `add_bos_token`,
/// the chat template) and `chat_template` a separate `chat_template.jinja`, when present.
pub fn spec_from_hf(
    tok: &Value,
    config: Option<&Value>,
    chat_template: Option<String>,
) -> Result<TokenizerSpec> {
    let model = &tok["model"];
    let kind = model["type"].as_str().unwrap_or("BPE");
    let byte_level =
        mentions(&tok["pre_tokenizer"], "ByteLevel") || mentions(&tok["decoder"], "ByteLevel");
    if kind != "BPE" || !byte_level || model["byte_fallback"].as_bool() == Some(true) {
        return Err(TokenizerError::UnknownModel(format!(
            "tokenizer.json model {kind} (byte-level: {byte_level}); mica reads byte-level BPE \
             tokenizer.json files (use the GGUF for SentencePiece-style vocabularies)"
        )));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or(TokenizerError::MissingVocab)?;
    let added = tok["added_tokens"].as_array().cloned().unwrap_or_default();
    let id_of = |v: &Value| v.as_u64().map(|x| x as usize);
    let n = vocab
        .values()
        .filter_map(id_of)
        .chain(added.iter().filter_map(|a| id_of(&a["id"])))
        .max()
        .map_or(0, |m| m + 1);
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (text, id) in vocab {
        if let Some(i) = id_of(id) {
            tokens[i] = text.clone();
        }
    }
    for a in &added {
        if let (Some(i), Some(text)) = (id_of(&a["id"]), a["content"].as_str()) {
            tokens[i] = text.to_string();
            types[i] = if a["special"].as_bool() == Some(true) {
                3
            } else {
                4
            };
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        if t.is_empty() {
            return Err(TokenizerError::BadKey {
                key: "tokenizer.json model.vocab",
                msg: format!("no token has id {i} (ids must be contiguous)"),
            });
        }
    }
    let merges = model["merges"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|e| match e {
                    Value::String(s) => Some(s.clone()),
                    Value::Array(p) => {
                        Some(format!("{} {}", p.first()?.as_str()?, p.get(1)?.as_str()?))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let token_id = |name: &str| -> Option<u32> {
        let text = match config?.get(name)? {
            Value::String(s) => s.clone(),
            v => v["content"].as_str()?.to_string(),
        };
        tokens.iter().position(|t| *t == text).map(|i| i as u32)
    };
    let template = chat_template.or_else(|| {
        match config?.get("chat_template")? {
            Value::String(s) => Some(s.clone()),
            // A list of named templates: the default one.
            Value::Array(list) => list
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_string),
            _ => None,
        }
    });
    Ok(TokenizerSpec {
        model: "gpt2".into(),
        pre: Some(pre_name(&tok["pre_tokenizer"]).into()),
        bos_id: token_id("bos_token"),
        eos_id: token_id("eos_token"),
        unk_id: token_id("unk_token"),
        pad_id: token_id("pad_token"),
        add_bos: config.and_then(|c| c["add_bos_token"].as_bool()),
        add_eos: config.and_then(|c| c["add_eos_token"].as_bool()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        chat_template: template,
        ..TokenizerSpec::default()
    })
}

/// Whether a pre-tokenizer / decoder tree contains a component of type `ty`.
fn mentions(v: &Value, ty: &str) -> bool {
    match v {
        Value::Object(o) => {
            o.get("type").and_then(Value::as_str) == Some(ty) || o.values().any(|x| mentions(x, ty))
        }
        Value::Array(a) => a.iter().any(|x| mentions(x, ty)),
        _ => false,
    }
}

/// The `Split` regexes of a pre-tokenizer tree.
fn split_patterns(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if o.get("type").and_then(Value::as_str) == Some("Split")
                && let Some(p) = o.get("pattern").and_then(|p| p["Regex"].as_str())
            {
                out.push(p.to_string());
            }
            o.values().for_each(|x| split_patterns(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| split_patterns(x, out)),
        _ => {}
    }
}

/// llama.cpp's name for a pre-tokenizer, as its converter would choose it.
fn pre_name(pre: &Value) -> &'static str {
    let mut pats = Vec::new();
    split_patterns(pre, &mut pats);
    let has = |needle: &str| pats.iter().any(|p| p.contains(needle));
    if has(r"\p{N}{1,3}") {
        "llama-bpe"
    } else if has(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|") {
        "qwen2"
    } else if mentions(pre, "Digits") {
        "smollm"
    } else {
        "gpt-2"
    }
}
