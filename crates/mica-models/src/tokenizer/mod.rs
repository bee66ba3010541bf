//! Text ↔ token ids, built from a GGUF file's `tokenizer.ggml.*` metadata, reproducing
//! llama.cpp's tokenizer (`src/llama-vocab.cpp`) id for id.
//!
//! Encoding has two stages, as in llama.cpp:
//! 1. `special.rs` cuts special tokens (`<|im_start|>`, `<end_of_turn>`...) out of the text.
//!    CONTROL tokens are recognised only when the caller asks (`parse_special`); USER_DEFINED
//!    tokens always are; the longest token wins.
//! 2. Each remaining plain fragment goes through the vocabulary's subword model:
//!    - `gpt2`: byte-level BPE run by the Hugging Face `tokenizers` crate (`bpe.rs`), with the
//!      word-splitting regexes llama.cpp uses for the file's `tokenizer.ggml.pre`
//!      (`pretokenize.rs`);
//!    - `llama`: SentencePiece BPE by token score with `<0xNN>` byte fallback (`spm.rs`); or,
//!      for a SentencePiece-style `tokenizer.json` (ranked merges, no scores), HF's BPE with
//!      byte fallback on the `▁`-escaped fragment (`bpe.rs`), as the `tokenizers` library
//!      runs that file;
//!    - `gemma4`: ranked-merge BPE over raw UTF-8 with spaces as `▁`, split at newlines
//!      (`gemma4.rs`);
//!    - `bert`: WordPiece, BERT's normalization and greedy longest-match (`wordpiece.rs`).
//!
//! BOS/EOS are added when the caller asks for special tokens and the model wants them
//! (`tokenizer.ggml.add_bos_token`, defaulting as llama.cpp does: yes for SentencePiece, no
//! for byte-level BPE except the Llama-3 family; always for Gemma 4). WordPiece always wraps
//! the text in `[CLS]` ... `[SEP]` when asked for special tokens, as llama.cpp does.
//!
//! Load-time vocabulary rules (token attributes, special-token defaults, the end-of-generation
//! set) live in `vocab.rs`. Decoding (`decode.rs`) concatenates per-token byte strings;
//! [`TokenStreamDecoder`] does it incrementally without ever emitting half a UTF-8 character.

mod bpe;
mod decode;
mod error;
mod gemma4;
pub mod hf_json;
mod pretokenize;
mod spec;
mod special;
mod spm;
mod store;
mod vocab;
mod wordpiece;

use std::sync::Arc;

pub use decode::{DecodeOptions, TokenStreamDecoder};
pub use error::{Result, TokenizerError};
pub use spec::{SpacePrefix, TokenType, TokenizerSpec};

use bpe::BpeEncoder;
use special::{Fragment, SpecialMatcher};
use store::VocabStore;
use vocab::attr;

/// The tokenizer families mica implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// GGUF `gpt2`: byte-level BPE with ranked merges.
    Bpe,
    /// GGUF `llama`: SentencePiece BPE with scores and byte fallback.
    Spm,
    /// GGUF `gemma4`: BPE with ranked merges over raw UTF-8, spaces as `▁`, byte fallback.
    Gemma4,
    /// GGUF `bert`: WordPiece (embedding models).
    WordPiece,
}

/// The subword model run on plain-text fragments.
enum Model {
    Bpe(Box<BpeEncoder>),
    Spm {
        scores: Vec<f32>,
        byte_tokens: Box<[Option<u32>; 256]>,
    },
    /// SentencePiece-style vocabulary with ranked merges (a `tokenizer.json`).
    SpmMerges(Box<BpeEncoder>),
    /// Gemma 4's BPE: the same ranked merges, on newline-separated runs.
    Gemma4(Box<BpeEncoder>),
    WordPiece(wordpiece::WordPiece),
}

struct Inner {
    kind: VocabKind,
    pre: Option<String>,
    /// Token texts, their rendered pieces and the text → id index, each stored once.
    vocab: VocabStore,
    attrs: Vec<u8>,
    model: Model,
    specials: SpecialMatcher,
    ids: vocab::SpecialTokens,
    chat_template: Option<String>,
    warnings: Vec<String>,
}

/// A model's tokenizer. Cheap to clone (shared, immutable); `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.inner.kind)
            .field("pre", &self.inner.pre)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Reads the tokenizer of an open GGUF file.
    pub fn from_gguf(gguf: &mica_formats::GgufFile) -> Result<Tokenizer> {
        Tokenizer::from_spec(&TokenizerSpec::from_gguf(gguf)?)
    }

    /// Validates a spec and builds the tokenizer. Problems that llama.cpp only logs (a
    /// special-token id out of range, missing pre-tokenizer name...) are collected in
    /// [`warnings`](Tokenizer::warnings) for the caller to show.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Tokenizer> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::MissingVocab);
        }
        let kind = match spec.model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            "gemma4" => VocabKind::Gemma4,
            "bert" => VocabKind::WordPiece,
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
        check_len(
            "tokenizer.ggml.scores",
            spec.scores.as_ref().map(Vec::len),
            n,
        )?;
        check_len(
            "tokenizer.ggml.token_type",
            spec.token_types.as_ref().map(Vec::len),
            n,
        )?;
        let mut warnings = Vec::new();
        let pre = match kind {
            VocabKind::Bpe => {
                let (pre, warning) = pretokenize::resolve(spec.pre.as_deref())?;
                warnings.extend(warning);
                Some(pre)
            }
            VocabKind::Spm | VocabKind::Gemma4 | VocabKind::WordPiece => None,
        };

        // A later duplicate shadows an earlier one, as in HF's vocabulary map.
        let (mut store, duplicates) = VocabStore::new(&spec.tokens)?;
        if duplicates > 0 {
            warnings.push(format!(
                "{duplicates} duplicate token texts in the vocabulary; the highest id wins"
            ));
        }
        let mut attrs = vocab::token_attrs(spec);
        let special_ids =
            vocab::special_tokens(spec, kind, pre.as_ref(), &mut attrs, &store, &mut warnings)?;

        let specials: Vec<(u32, &str, bool)> = (0..n)
            .filter(|&id| attrs[id] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|id| {
                let always = attrs[id] & (attr::CONTROL | attr::UNKNOWN) == 0;
                (id as u32, spec.tokens[id].as_str(), always)
            })
            .collect();
        let specials = SpecialMatcher::new(&specials);
        let model = build_model(spec, kind, pre.as_ref(), &store, &mut warnings)?;
        let alphabet = decode::Gpt2Alphabet::new();
        store.set_pieces(|id, text| vocab::piece_of(kind, text, attrs[id], &alphabet))?;

        Ok(Tokenizer {
            inner: Arc::new(Inner {
                kind,
                pre: pre.map(|p| p.name),
                vocab: store,
                attrs,
                model,
                specials,
                ids: special_ids,
                chat_template: spec.chat_template.clone(),
                warnings,
            }),
        })
    }

    /// Text to ids. `add_special` adds BOS/EOS where the model wants them; `parse_special`
    /// lets CONTROL tokens written in the text (`<|im_start|>`) become those tokens instead
    /// of being spelled out. This is llama.cpp's `llama_tokenize`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let span = tracing::trace_span!(
            "tokenize",
            bytes = text.len(),
            tokens = tracing::field::Empty
        );
        let _span = span.enter();
        let out = self.encode_inner(text, add_special, parse_special)?;
        span.record("tokens", out.len());
        Ok(out)
    }

    fn encode_inner(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let inner = &*self.inner;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && inner.ids.add_bos {
            out.extend(inner.ids.bos);
        }
        // SentencePiece adds a leading space to text that opens the input or follows a
        // special token, when the model says so (`add_space_prefix`), as `space_prefix_rule`
        // refines it.
        let mut prev_special = true;
        let mut first = true;
        for fragment in inner.specials.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(plain) => {
                    let prefix = inner.ids.add_space_prefix
                        && prev_special
                        && match inner.ids.space_prefix_rule {
                            SpacePrefix::EveryFragment => true,
                            SpacePrefix::EveryUnlessSpace => !plain.starts_with(' '),
                            SpacePrefix::FirstUnlessSpace => first && !plain.starts_with(' '),
                        };
                    let escape = |plain: &str| {
                        let mut escaped = String::with_capacity(plain.len() + 3);
                        if prefix {
                            escaped.push('▁');
                        }
                        escaped.extend(plain.chars().map(|c| if c == ' ' { '▁' } else { c }));
                        escaped
                    };
                    match &inner.model {
                        Model::Bpe(bpe) => bpe.encode(plain, &mut out)?,
                        Model::SpmMerges(bpe) => bpe.encode(&escape(plain), &mut out)?,
                        Model::Gemma4(bpe) => gemma4::encode(bpe, &inner.vocab, plain, &mut out)?,
                        Model::WordPiece(wp) => {
                            wp.encode(&inner.vocab, inner.ids.unk, plain, &mut out)
                        }
                        Model::Spm {
                            scores,
                            byte_tokens,
                        } => {
                            let escaped = escape(plain);
                            let vocab = spm::SpmVocab {
                                store: &inner.vocab,
                                scores,
                                byte_tokens,
                                unk: inner.ids.unk,
                            };
                            spm::encode(&vocab, &escaped, &mut out);
                        }
                    }
                    prev_special = false;
                }
            }
            first = false;
        }
        if add_special && inner.ids.add_sep {
            out.extend(inner.ids.sep);
        }
        if add_special && inner.ids.add_eos {
            out.extend(inner.ids.eos);
        }
        Ok(out)
    }

    /// Ids to text, special tokens rendered as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Ids to text. Invalid UTF-8 (a character cut off by the end of `ids`) becomes U+FFFD.
    pub fn decode_with(&self, ids: &[u32], options: DecodeOptions) -> Result<String> {
        let _span = tracing::trace_span!("detokenize", tokens = ids.len()).entered();
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.checked_piece(id, options)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A streaming decoder over this tokenizer (see [`TokenStreamDecoder`]).
    pub fn stream_decoder(&self, options: DecodeOptions) -> TokenStreamDecoder {
        TokenStreamDecoder::new(self.clone(), options)
    }

    /// The bytes token `id` contributes to decoded text (possibly part of a character).
    pub fn token_piece(&self, id: u32, options: DecodeOptions) -> Option<&[u8]> {
        self.checked_piece(id, options).ok()
    }

    fn checked_piece(&self, id: u32, options: DecodeOptions) -> Result<&[u8]> {
        let inner = &*self.inner;
        let piece = inner.vocab.piece(id).ok_or(TokenizerError::IdOutOfRange {
            id,
            vocab_size: inner.vocab.len(),
        })?;
        let hidden = attr::CONTROL | attr::UNKNOWN;
        if options.skip_special && inner.attrs[id as usize] & hidden != 0 {
            return Ok(&[]);
        }
        Ok(piece)
    }

    /// The vocabulary entry of `id` as stored in the file (`Ġthe`, `▁the`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.inner.vocab.text(id)
    }

    /// The id of a vocabulary entry, by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.vocab.id(text)
    }

    /// The type of `id`, after llama.cpp's load-time adjustments (end-of-turn tokens typed
    /// NORMAL in the file are reported as CONTROL).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        let a = *self.inner.attrs.get(id as usize)?;
        Some(if a & attr::USER_DEFINED != 0 {
            TokenType::UserDefined
        } else if a & attr::CONTROL != 0 {
            TokenType::Control
        } else if a & attr::BYTE != 0 {
            TokenType::Byte
        } else if a & attr::UNKNOWN != 0 {
            TokenType::Unknown
        } else if a & attr::UNUSED != 0 {
            TokenType::Unused
        } else if a & attr::NORMAL != 0 {
            TokenType::Normal
        } else {
            TokenType::Undefined
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.vocab.len()
    }
    pub fn kind(&self) -> VocabKind {
        self.inner.kind
    }
    /// The resolved BPE pre-tokenizer name (`None` for the other kinds).
    pub fn pre_tokenizer(&self) -> Option<&str> {
        self.inner.pre.as_deref()
    }
    pub fn bos(&self) -> Option<u32> {
        self.inner.ids.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.inner.ids.eos
    }
    /// End of turn: from the file, or found by text (`<|im_end|>`, `<end_of_turn>`...).
    pub fn eot(&self) -> Option<u32> {
        self.inner.ids.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.inner.ids.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.inner.ids.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.inner.ids.pad
    }
    /// The separator WordPiece appends with special tokens (`[SEP]`).
    pub fn sep(&self) -> Option<u32> {
        self.inner.ids.sep
    }
    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.inner.ids.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.inner.ids.add_eos
    }
    /// Whether generation stops at `id`: EOS, EOT, EOM, FIM pad/repo/separator tokens and
    /// the texts llama.cpp knows as end markers, when present in the vocabulary.
    pub fn is_eog(&self, id: u32) -> bool {
        self.inner.ids.eog.binary_search(&id).is_ok()
    }
    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.inner.ids.eog
    }
    /// The file's `tokenizer.chat_template`, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }
    /// Non-fatal problems found while building, for the caller to report.
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }
}

fn check_len(key: &'static str, len: Option<usize>, vocab: usize) -> Result<()> {
    match len {
        Some(len) if len < vocab => Err(TokenizerError::LengthMismatch { key, len, vocab }),
        _ => Ok(()),
    }
}

/// The subword model for the plain-text fragments.
fn build_model(
    spec: &TokenizerSpec,
    kind: VocabKind,
    pre: Option<&pretokenize::PreTokenizer>,
    store: &VocabStore,
    warnings: &mut Vec<String>,
) -> Result<Model> {
    if kind == VocabKind::WordPiece {
        return Ok(Model::WordPiece(wordpiece::WordPiece::new(
            &spec.tokens,
            spec.normalizer_lowercase,
            spec.normalizer_strip_accents,
        )));
    }
    if kind == VocabKind::Gemma4 {
        let merges = spec
            .merges
            .as_ref()
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
        // No unknown token: a byte without its `<0xNN>` token is dropped, as in llama.cpp.
        let bpe = BpeEncoder::new_spm(&spec.tokens, merges, None)?;
        return Ok(Model::Gemma4(Box::new(bpe)));
    }
    if let Some(pre) = pre {
        let merges = spec
            .merges
            .as_ref()
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
        let bpe = BpeEncoder::new(&spec.tokens, merges, pre, warnings)?;
        return Ok(Model::Bpe(Box::new(bpe)));
    }
    // Ranked merges and no scores: a SentencePiece-style tokenizer.json.
    if let (None, Some(merges)) = (&spec.scores, &spec.merges) {
        let unk = spec
            .unk_id
            .and_then(|u| spec.tokens.get(u as usize))
            .map(String::as_str);
        let bpe = BpeEncoder::new_spm(&spec.tokens, merges, unk)?;
        return Ok(Model::SpmMerges(Box::new(bpe)));
    }
    // The `<0xNN>` token of each byte, or failing that the one-character token (ASCII).
    let mut byte_tokens = Box::new([None; 256]);
    for (b, slot) in byte_tokens.iter_mut().enumerate() {
        *slot = store.id(&format!("<0x{b:02X}>")).or_else(|| {
            let ascii = char::from_u32(b as u32).filter(|_| b < 0x80)?;
            store.id(ascii.encode_utf8(&mut [0; 4]))
        });
    }
    let n = spec.tokens.len();
    let scores = spec
        .scores
        .as_ref()
        .map_or_else(|| vec![0.0; n], |s| s[..n].to_vec());
    Ok(Model::Spm {
        scores,
        byte_tokens,
    })
}

#[cfg(test)]
mod tests {
    /// The tokenizer is shared between the engine's threads and the server's tasks.
    #[test]
    fn tokenizer_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Tokenizer>();
        assert_send_sync::<super::TokenStreamDecoder>();
    }
}
