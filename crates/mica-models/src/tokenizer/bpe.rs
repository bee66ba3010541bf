//! Byte-level BPE (GGUF `tokenizer.ggml.model = "gpt2"`), run by the Hugging Face `tokenizers`
//! crate: the vocabulary and ranked merges from the GGUF file, a pre-tokenizer made of one
//! `Split` per llama.cpp regex (see [`pretokenize`](super::pretokenize)) followed by the GPT-2
//! byte-to-unicode mapping, and no normalizer. Special tokens never reach this code: the
//! caller cuts them out first, exactly as llama.cpp does.
//!
//! HF's merge loop and llama.cpp's (`llm_tokenizer_bpe_session`) are the same algorithm:
//! repeatedly merge the adjacent pair with the lowest merge rank, leftmost first on ties.

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use super::error::{Result, TokenizerError};
use super::pretokenize::PreTokenizer;

/// A ready HF pipeline for the plain-text fragments of a BPE model.
pub(crate) struct BpeEncoder {
    hf: HfTokenizer,
}

impl BpeEncoder {
    /// Builds the pipeline. Merges whose halves or result are not in the vocabulary cannot be
    /// represented by HF's BPE (llama.cpp would apply them, then spell the result out byte by
    /// byte); they are dropped and counted in a warning.
    pub fn new(
        tokens: &[String],
        merges: &[String],
        pre: &PreTokenizer,
        warnings: &mut Vec<String>,
    ) -> Result<BpeEncoder> {
        let vocab = || -> Vocab {
            tokens
                .iter()
                .enumerate()
                .map(|(id, text)| (text.clone(), id as u32))
                .collect()
        };
        let pairs = || -> Result<Vec<(String, String)>> {
            let split = |(index, entry): (usize, &String)| {
                let (left, right) = split_merge(entry).ok_or_else(|| TokenizerError::BadMerge {
                    index,
                    entry: entry.clone(),
                })?;
                Ok((left.to_string(), right.to_string()))
            };
            merges.iter().enumerate().map(split).collect()
        };
        let build = |vocab: Vocab, pairs: Vec<(String, String)>| {
            BPE::builder()
                .vocab_and_merges(vocab, pairs)
                .ignore_merges(pre.ignore_merges)
                .build()
        };
        // HF validates every merge against the vocabulary; only when that fails (rare) are
        // the offending merges filtered out here, so the common case checks them once.
        let model = match build(vocab(), pairs()?) {
            Ok(model) => model,
            Err(_) => {
                let vocab = vocab();
                let mut pairs = pairs()?;
                let total = pairs.len();
                pairs.retain(|(l, r)| {
                    vocab.contains_key(l)
                        && vocab.contains_key(r)
                        && vocab.contains_key(&[l.as_str(), r].concat())
                });
                warnings.push(format!(
                    "{} of {total} BPE merges reference tokens missing from the vocabulary and were ignored",
                    total - pairs.len()
                ));
                build(vocab, pairs)
                    .map_err(|e| TokenizerError::Backend(format!("building BPE model: {e}")))?
            }
        };

        let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
        for re in pre.regexes {
            let split = Split::new(
                SplitPattern::Regex((*re).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| {
                TokenizerError::Backend(format!("pre-tokenizer '{}' regex {re:?}: {e}", pre.name))
            })?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // Bytes to GPT-2's printable alphabet; the regexes above already did the splitting.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));

        let mut hf = HfTokenizer::new(model);
        hf.with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(Sequence::new(steps))));
        Ok(BpeEncoder { hf })
    }

    /// SentencePiece-style BPE from a `tokenizer.json` (LLaMA-2, Gemma): ranked merges over
    /// the characters of the whole fragment (spaces already `▁`; no pre-tokenizer, no byte
    /// mapping), a character the vocabulary lacks spelled as its `<0xNN>` byte tokens
    /// (`byte_fallback`), or `unk` when those are missing too. HF runs it, so the ids are
    /// HF's by construction.
    pub fn new_spm(tokens: &[String], merges: &[String], unk: Option<&str>) -> Result<BpeEncoder> {
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(id, text)| (text.clone(), id as u32))
            .collect();
        let pairs = merges
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let (l, r) = split_merge(entry).ok_or_else(|| TokenizerError::BadMerge {
                    index,
                    entry: entry.clone(),
                })?;
                Ok((l.to_string(), r.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, pairs)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(u) = unk {
            builder = builder.unk_token(u.to_string());
        }
        let model = builder
            .build()
            .map_err(|e| TokenizerError::Backend(format!("building BPE model: {e}")))?;
        Ok(BpeEncoder {
            hf: HfTokenizer::new(model),
        })
    }

    /// Appends the ids of one plain-text fragment.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let encoding = self
            .hf
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Backend(format!("BPE encode: {e}")))?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }
}

/// Splits a GGUF merges entry at its first space after the first byte, as llama.cpp does
/// (`word.find(' ', 1)`), so a left half may itself start with a space.
fn split_merge(entry: &str) -> Option<(&str, &str)> {
    let pos = entry.bytes().skip(1).position(|b| b == b' ')? + 1;
    Some((&entry[..pos], &entry[pos + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_entries_split_after_first_byte() {
        assert_eq!(split_merge("Ġ t"), Some(("Ġ", "t")));
        assert_eq!(split_merge("  a"), Some((" ", "a")));
        assert_eq!(split_merge("ab"), None);
        assert_eq!(split_merge(""), None);
    }
}
