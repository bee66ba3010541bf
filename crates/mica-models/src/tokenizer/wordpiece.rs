//! GGUF `tokenizer.ggml.model = "bert"`: WordPiece, the tokenizer of BERT-style embedding
//! models, as llama.cpp runs it (`llm_tokenizer_wpm_session` in `src/llama-vocab.cpp`).
//!
//! llama.cpp's converter stores word-initial pieces with a leading `▁` and continuation
//! pieces bare (Hugging Face's `##` prefix removed). Encoding a plain-text fragment:
//! 1. normalize as BERT's normalizer does: canonical decomposition (NFD) and accent marks
//!    dropped when accents are stripped, control characters (and U+0000, U+FFFD) dropped,
//!    lowercased when the vocabulary is uncased;
//! 2. split into words at whitespace, and make every punctuation character, ASCII symbol and
//!    CJK ideograph a word of its own;
//! 3. cover `▁` + word greedily with the longest vocabulary entries from the left; a word that
//!    cannot be covered entirely becomes the unknown token.
//!
//! Character classes come from the Unicode general categories (`unicode-general-category`);
//! the decomposition is the `tokenizers` crate's, as used by Hugging Face's BERT normalizer.

use std::borrow::Cow;

use tokenizers::NormalizedString;
use unicode_general_category::{GeneralCategory as Gc, get_general_category};

use super::store::VocabStore;

/// The normalization options and the longest token, fixed at load.
pub(crate) struct WordPiece {
    /// The longest vocabulary entry, in bytes: no match can be longer.
    max_token_len: usize,
    /// `tokenizer.ggml.normalizer.lowercase` (default true, as in llama.cpp).
    lowercase: bool,
    /// `tokenizer.ggml.normalizer.strip_accents` (defaults to `lowercase`).
    strip_accents: bool,
}

impl WordPiece {
    pub fn new(tokens: &[String], lowercase: Option<bool>, strip_accents: Option<bool>) -> Self {
        let lowercase = lowercase.unwrap_or(true);
        WordPiece {
            max_token_len: tokens.iter().map(String::len).max().unwrap_or(0),
            lowercase,
            strip_accents: strip_accents.unwrap_or(lowercase),
        }
    }

    /// Appends the ids of one plain-text fragment. A word that cannot be covered becomes
    /// `unk` (nothing when the vocabulary has no unknown token).
    pub fn encode(&self, store: &VocabStore, unk: Option<u32>, text: &str, out: &mut Vec<u32>) {
        for word in self.words(text) {
            let word = format!("▁{word}");
            let start = out.len();
            let mut i = 0;
            while i < word.len() {
                let longest = (word.len()).min(i + self.max_token_len);
                let found = (i + 1..=longest)
                    .rev()
                    .filter(|&j| word.is_char_boundary(j))
                    .find_map(|j| Some((store.id(&word[i..j])?, j)));
                match found {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(start);
                        break;
                    }
                }
            }
            if out.len() == start {
                out.extend(unk);
            }
        }
    }

    /// The normalized words of a fragment.
    fn words(&self, text: &str) -> Vec<String> {
        let text = if self.strip_accents {
            let mut normalized = NormalizedString::from(text);
            normalized.nfd();
            Cow::Owned(normalized.get().to_string())
        } else {
            Cow::Borrowed(text)
        };
        let mut words = Vec::new();
        let mut word = String::new();
        for c in text.chars() {
            if c.is_whitespace() {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                continue;
            }
            let category = get_general_category(c);
            if c == '\0' || c == '\u{FFFD}' || is_other(category) {
                continue;
            }
            if self.strip_accents && is_mark(category) {
                continue;
            }
            let alone = is_punctuation(category)
                || (c.is_ascii() && is_symbol(category))
                || is_cjk_ideograph(c);
            if alone && !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            if self.lowercase {
                word.extend(c.to_lowercase());
            } else {
                word.push(c);
            }
            if alone {
                words.push(std::mem::take(&mut word));
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words
    }
}

/// `\p{C}`: control, format, surrogate, private-use and unassigned code points.
fn is_other(c: Gc) -> bool {
    matches!(
        c,
        Gc::Control | Gc::Format | Gc::Surrogate | Gc::PrivateUse | Gc::Unassigned
    )
}

/// `\p{M}`: accents and other combining marks.
fn is_mark(c: Gc) -> bool {
    matches!(c, Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark)
}

/// `\p{P}`.
fn is_punctuation(c: Gc) -> bool {
    matches!(
        c,
        Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::OpenPunctuation
            | Gc::ClosePunctuation
            | Gc::InitialPunctuation
            | Gc::FinalPunctuation
            | Gc::OtherPunctuation
    )
}

/// `\p{S}`.
fn is_symbol(c: Gc) -> bool {
    matches!(
        c,
        Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol
    )
}

/// The CJK ideograph blocks BERT splits into single-character words (the ranges of
/// Hugging Face's BERT pre-tokenizer, which llama.cpp copies).
fn is_cjk_ideograph(c: char) -> bool {
    matches!(
        c as u32,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B920..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}
