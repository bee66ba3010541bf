//! The model's vocabulary as llguidance sees it: a token trie of every token id's bytes,
//! built from mica's tokenizer, and the tokenizer environment llguidance asks to tokenize
//! grammar literals.
//!
//! Token bytes are what the token adds to decoded text (`Tokenizer::token_piece`). Control
//! and unknown tokens (`<|im_end|>`, `<unk>`: rendered as nothing in generated text) are
//! marked special as llguidance expects — their text after a `0xFF` byte — so no grammar
//! literal can match them as text, while a Lark grammar may still name them (`<|im_end|>`).
//! User-defined tokens (Qwen's `<tool_call>`) are plain text: a grammar literal
//! `"<tool_call>"` then allows the single token the model was trained to emit. Ids past the
//! tokenizer's vocabulary (a padded output layer) have no bytes and are never allowed. The
//! end-of-generation ids (EOS, end of turn...) are the trie's EOS set.

use crate::error::{GrammarError, Result};
use mica_models::tokenizer::{DecodeOptions, TokenType, Tokenizer};
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// llguidance's tokenizer environment over mica's tokenizer.
pub struct Vocabulary {
    tokenizer: Tokenizer,
    trie: TokTrie,
}

impl Vocabulary {
    /// Indexes `tokenizer`'s vocabulary for a model whose logits have `n_vocab` entries.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize) -> Result<Vocabulary> {
        let n_tok = tokenizer.vocab_size();
        if n_tok > n_vocab {
            return Err(GrammarError::Vocabulary(format!(
                "the tokenizer has {n_tok} tokens but the logits only {n_vocab}"
            )));
        }
        let eog = tokenizer.eog_ids();
        let eos = tokenizer
            .eos()
            .or(tokenizer.eot())
            .or_else(|| eog.first().copied())
            .ok_or_else(|| {
                GrammarError::Vocabulary(
                    "the vocabulary has no end-of-generation token, so a constraint could never end"
                        .into(),
                )
            })?;
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| token_bytes(tokenizer, id))
            .collect();
        let info = TokRxInfo {
            vocab_size: n_vocab as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos(),
            tok_pad: tokenizer.pad(),
            tok_unk: tokenizer.unk(),
            tok_end_of_turn: tokenizer.eot(),
        };
        let mut eos_ids: Vec<TokenId> = eog.to_vec();
        if !eos_ids.contains(&eos) {
            eos_ids.push(eos);
        }
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos_ids);
        Ok(Vocabulary {
            tokenizer: tokenizer.clone(),
            trie,
        })
    }

    /// The environment llguidance's parser factory takes.
    pub fn into_env(self) -> TokEnv {
        Arc::new(self)
    }
}

/// The bytes of token `id` in the trie (see the module docs).
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let Some(piece) = tokenizer.token_piece(id, DecodeOptions::default()) else {
        return Vec::new();
    };
    match tokenizer.token_type(id) {
        Some(TokenType::Control | TokenType::Unknown) => {
            let text = tokenizer.token_text(id).unwrap_or_default();
            let mut b = Vec::with_capacity(text.len() + 1);
            b.push(TokTrie::SPECIAL_TOKEN_MARKER);
            b.extend_from_slice(text.as_bytes());
            b
        }
        _ => piece.to_vec(),
    }
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text as the model's tokenizer splits it (special tokens written in the text are not
    /// parsed); bytes that are not UTF-8 fall back to the trie's greedy split.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode(text, false, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
