//! [`TokenizerSpec`] from a Hugging Face folder's `tokenizer.json` and
//! `tokenizer_config.json`, so a folder tokenizes exactly as its GGUF conversion would.
//!
//! Supported:
//! - byte-level BPE (`model.type = "BPE"` with a `ByteLevel` pre-tokenizer or decoder),
//!   mapped to GGUF's `gpt2` model. The word-splitting regex is recognised and named as
//!   llama.cpp's converter names it (`tokenizer.ggml.pre`): Llama 3's and Qwen2's `Split`
//!   patterns, SmolLM's individual digits, plain GPT-2;
//! - SentencePiece-style BPE (LLaMA-2, Mistral, Gemma: `byte_fallback`, spaces as `▁`, no
//!   byte-level step), mapped to GGUF's `llama` model with ranked merges instead of scores:
//!   the `▁` prefix as the file's `Prepend` normalizer or `Metaspace` pre-tokenizer says
//!   ([`SpacePrefix`]), `<0xNN>` tokens typed BYTE.
//!
//! Added tokens keep their ids; `special` ones become CONTROL tokens, the others
//! USER_DEFINED. Anything else (Unigram, WordPiece, other normalizers) is a clear error
//! naming what was found.

use super::error::{Result, TokenizerError};
use super::spec::{SpacePrefix, TokenizerSpec};
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
    let byte_fallback = model["byte_fallback"].as_bool() == Some(true);
    let spm = match (kind, byte_level, byte_fallback) {
        ("BPE", false, true) => Some(spm_prefix(tok)?),
        ("BPE", true, false) => None,
        _ => {
            return Err(TokenizerError::UnknownModel(format!(
                "tokenizer.json model {kind} (byte-level: {byte_level}, byte fallback: \
                 {byte_fallback}); mica reads byte-level BPE and SentencePiece-style BPE \
                 (byte fallback, no byte-level step)"
            )));
        }
    };
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
    if spm.is_some() {
        for (t, ty) in tokens.iter().zip(types.iter_mut()) {
            if *ty == 1 && is_byte_token(t) {
                *ty = 6;
            }
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
    let unk_id = token_id("unk_token").or_else(|| {
        let unk = model["unk_token"].as_str()?;
        tokens.iter().position(|t| t == unk).map(|i| i as u32)
    });
    if let (Some(_), Some(u)) = (spm, unk_id) {
        types[u as usize] = 2;
    }
    let (add_space_prefix, space_prefix_rule) = spm.unwrap_or_default();
    Ok(TokenizerSpec {
        model: if spm.is_some() { "llama" } else { "gpt2" }.into(),
        pre: spm
            .is_none()
            .then(|| pre_name(&tok["pre_tokenizer"]).into()),
        add_space_prefix: spm.map(|_| add_space_prefix),
        space_prefix_rule,
        bos_id: token_id("bos_token"),
        eos_id: token_id("eos_token"),
        unk_id,
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

/// `<0xNN>`: a byte-fallback token.
fn is_byte_token(t: &str) -> bool {
    t.len() == 6
        && t.starts_with("<0x")
        && t.ends_with('>')
        && t[3..5].bytes().all(|b| b.is_ascii_hexdigit())
}

/// How a SentencePiece-style tokenizer.json turns spaces into `▁`: whether a `▁` is
/// prefixed, and to which fragments. Accepts what transformers writes for LLaMA-2 (legacy:
/// `Prepend("▁")` + `Replace(" ", "▁")` normalizers), LLaMA / Mistral (`Metaspace`
/// pre-tokenizer without splitting) and Gemma (`Replace` normalizer; a `Split` on spaces,
/// which then has none to split on).
fn spm_prefix(tok: &Value) -> Result<(bool, SpacePrefix)> {
    let unsupported = |what: &str, v: &Value| {
        TokenizerError::UnknownModel(format!(
            "SentencePiece-style tokenizer.json: {what} {v} is not supported (Prepend / Replace \
             of \"▁\" normalizers, a non-splitting Metaspace pre-tokenizer are)"
        ))
    };
    let list = |v: &Value, key: &str| -> Vec<Value> {
        match v {
            Value::Null => Vec::new(),
            v if v["type"] == "Sequence" => v[key].as_array().cloned().unwrap_or_default(),
            v => vec![v.clone()],
        }
    };
    let (mut replaced, mut prefix) = (false, (false, SpacePrefix::EveryFragment));
    for n in list(&tok["normalizer"], "normalizers") {
        match n["type"].as_str() {
            Some("Prepend") if n["prepend"] == "▁" => prefix = (true, SpacePrefix::EveryFragment),
            Some("Replace") if n["pattern"]["String"] == " " && n["content"] == "▁" => {
                replaced = true
            }
            _ => return Err(unsupported("normalizer", &n)),
        }
    }
    for p in list(&tok["pre_tokenizer"], "pretokenizers") {
        match p["type"].as_str() {
            Some("Metaspace") if p["replacement"] == "▁" && p["split"] != true => {
                replaced = true;
                // `prepend_scheme` (tokenizers ≥ 0.15), else `add_prefix_space`.
                prefix = match p["prepend_scheme"].as_str() {
                    Some("first") => (true, SpacePrefix::FirstUnlessSpace),
                    Some("never") => (false, SpacePrefix::EveryFragment),
                    Some(_) => (true, SpacePrefix::EveryUnlessSpace),
                    None => (
                        p["add_prefix_space"] != false,
                        SpacePrefix::EveryUnlessSpace,
                    ),
                };
            }
            Some("Split") if replaced && p["pattern"]["String"] == " " => {}
            _ => return Err(unsupported("pre-tokenizer", &p)),
        }
    }
    if !replaced {
        return Err(TokenizerError::UnknownModel(
            "SentencePiece-style tokenizer.json that does not turn spaces into \"▁\"".into(),
        ));
    }
    Ok(prefix)
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
