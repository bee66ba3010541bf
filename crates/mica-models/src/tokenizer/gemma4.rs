//! GGUF `tokenizer.ggml.model = "gemma4"`: Gemma 4's BPE, as llama.cpp runs it
//! (`LLAMA_VOCAB_PRE_TYPE_GEMMA4` in `src/llama-vocab.cpp`).
//!
//! Unlike byte-level BPE, it works on the raw UTF-8 characters: each plain-text fragment has
//! its spaces replaced by `▁`, is cut into runs of newlines and runs of everything else (the
//! merges never span a newline), and each run is merged by rank; a merged symbol missing from
//! the vocabulary is spelled as its `<0xNN>` byte tokens. A run of newlines that is itself a
//! token becomes that token without merging (llama.cpp's fix for Gemma 4's newline tokens,
//! whose merges would otherwise split them differently from the reference tokenizer).
//!
//! The ranked merging and byte fallback are the Hugging Face `tokenizers` BPE built by
//! [`BpeEncoder::new_spm`], which merges exactly as llama.cpp does.

use super::bpe::BpeEncoder;
use super::error::Result;
use super::store::VocabStore;

/// Appends the ids of one plain-text fragment.
pub(crate) fn encode(
    bpe: &BpeEncoder,
    store: &VocabStore,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<()> {
    let escaped = text.replace(' ', "▁");
    let mut rest = escaped.as_str();
    while let Some(first) = rest.chars().next() {
        let newlines = first == '\n';
        let end = rest
            .find(|c: char| (c == '\n') != newlines)
            .unwrap_or(rest.len());
        let (run, tail) = rest.split_at(end);
        match store.id(run) {
            Some(id) if newlines => out.push(id),
            _ => bpe.encode(run, out)?,
        }
        rest = tail;
    }
    Ok(())
}
