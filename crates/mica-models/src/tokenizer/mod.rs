//! Text ↔ token ids, built from a GGUF file's `tokenizer.ggml.*` metadata, reproducing
//! llama.cpp's tokenizer (`src/llama-vocab.cpp`) id for id.
//!
//! Encoding has two stages, as in llama.cpp:
//! 1. [`special`] cuts special tokens (`<|im_start|>`, `<end_of_turn>`...) out of the text.
//!    CONTROL tokens are recognised only when the caller asks (`parse_special`); USER_DEFINED
//!    tokens always are; the longest token wins.
//! 2. Each remaining plain fragment goes through the vocabulary's subword model:
//!    - `gpt2`: byte-level BPE run by the Hugging Face `tokenizers` crate ([`bpe`]), with the
//!      word-splitting regexes llama.cpp uses for the file's `tokenizer.ggml.pre`
//!      ([`pretokenize`]);
//!    - `llama`: SentencePiece BPE by token score with `<0xNN>` byte fallback ([`spm`]).
//!
//! BOS/EOS are added when the caller asks for special tokens and the model wants them
//! (`tokenizer.ggml.add_bos_token`, defaulting as llama.cpp does: yes for SentencePiece, no
//! for byte-level BPE except the Llama-3 family).
//!
//! Decoding ([`decode`]) concatenates per-token byte strings; [`TokenStreamDecoder`] does it
//! incrementally without ever emitting half a UTF-8 character.

mod bpe;
mod decode;
mod error;
mod pretokenize;
mod spec;
mod special;
mod spm;

use std::collections::HashSet;
use std::sync::Arc;

pub use decode::{DecodeOptions, TokenStreamDecoder};
pub use error::{Result, TokenizerError};
pub use spec::{TokenType, TokenizerSpec};

use bpe::BpeEncoder;

/// Token text → id. HF's hash map type (aHash), which is much faster to fill than the std
/// SipHash map for a 262k-entry vocabulary.
type TokenMap = tokenizers::models::bpe::Vocab;
use special::{Fragment, SpecialMatcher};

/// The tokenizer families mica implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// GGUF `gpt2`: byte-level BPE with ranked merges.
    Bpe,
    /// GGUF `llama`: SentencePiece BPE with scores and byte fallback.
    Spm,
}

/// Token attributes, as llama.cpp's `llama_token_attr` bit flags: the GGUF token type plus
/// flags llama.cpp adds at load (e.g. CONTROL on end-of-turn tokens typed NORMAL).
mod attr {
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;
}

/// Token texts llama.cpp treats as ending generation whatever the file says
/// (`special_eog_ids` in `llama_vocab::impl::load`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// Candidates for the end-of-turn token when the file names none, in preference order.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Fill-in-the-middle pad / repository / file-separator texts: also end of generation.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// The subword model run on plain-text fragments.
enum Model {
    Bpe(Box<BpeEncoder>),
    Spm {
        scores: Vec<f32>,
        byte_tokens: Box<[Option<u32>; 256]>,
    },
}

struct Inner {
    kind: VocabKind,
    pre: Option<String>,
    tokens: Vec<String>,
    attrs: Vec<u8>,
    /// Each token's bytes when rendered with special tokens shown.
    pieces: Vec<Box<[u8]>>,
    token_to_id: TokenMap,
    model: Model,
    specials: SpecialMatcher,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    eog: Vec<u32>,
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

        let mut attrs: Vec<u8> = match &spec.token_types {
            None => vec![attr::NORMAL; n],
            Some(types) => types[..n]
                .iter()
                .map(|&t| attr_of(TokenType::from_gguf(t)))
                .collect(),
        };
        let mut token_to_id = TokenMap::with_capacity(n);
        let mut duplicates = 0usize;
        for (id, text) in spec.tokens.iter().enumerate() {
            // A later duplicate shadows an earlier one, as in HF's vocabulary map.
            duplicates += token_to_id.insert(text.clone(), id as u32).is_some() as usize;
        }
        if duplicates > 0 {
            warnings.push(format!(
                "{duplicates} duplicate token texts in the vocabulary; the highest id wins"
            ));
        }

        // Per-family defaults, then the file's values (llama.cpp `llama_vocab::impl::load`).
        let (pre, mut add_bos, default_bos, default_eos, default_unk) = match kind {
            VocabKind::Spm => (None, true, Some(1), Some(2), Some(0)),
            VocabKind::Bpe => {
                let (pre, warning) = pretokenize::resolve(spec.pre.as_deref())?;
                warnings.extend(warning);
                let bos = if pre.no_bos { None } else { Some(11) };
                (Some(pre.clone()), pre.add_bos, bos, Some(11), None)
            }
        };
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let mut pick = |key: &str, from_file: Option<u32>, default: Option<u32>| -> Option<u32> {
            match from_file {
                Some(id) if (id as usize) < n => Some(id),
                Some(id) => {
                    warnings.push(format!(
                        "'{key}' = {id} is out of range (vocabulary size {n}); ignored"
                    ));
                    in_range(default)
                }
                None => in_range(default),
            }
        };
        let bos = pick("tokenizer.ggml.bos_token_id", spec.bos_id, default_bos);
        let eos = pick("tokenizer.ggml.eos_token_id", spec.eos_id, default_eos);
        let unk = pick("tokenizer.ggml.unknown_token_id", spec.unk_id, default_unk);
        let pad = pick("tokenizer.ggml.padding_token_id", spec.pad_id, None);
        let eot_file = pick("tokenizer.ggml.eot_token_id", spec.eot_id, None);
        let eom_file = pick("tokenizer.ggml.eom_token_id", spec.eom_id, None);
        let fim_files = [
            pick("tokenizer.ggml.fim_pad_token_id", spec.fim_pad_id, None),
            pick("tokenizer.ggml.fim_rep_token_id", spec.fim_rep_id, None),
            pick("tokenizer.ggml.fim_sep_token_id", spec.fim_sep_id, None),
        ];
        add_bos = spec.add_bos.unwrap_or(add_bos);
        let add_eos = spec.add_eos.unwrap_or(false);
        let add_space_prefix = spec.add_space_prefix.unwrap_or(kind == VocabKind::Spm);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_bos_token",
                id_key: "tokenizer.ggml.bos_token_id",
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                flag: "tokenizer.ggml.add_eos_token",
                id_key: "tokenizer.ggml.eos_token_id",
            });
        }

        // Tokens found by their text become CONTROL, as llama.cpp forces them.
        let mut find_control = |texts: &[&str]| -> Option<u32> {
            let id = texts.iter().find_map(|t| token_to_id.get(*t).copied())?;
            attrs[id as usize] |= attr::CONTROL;
            Some(id)
        };
        let eot = eot_file.or_else(|| find_control(EOT_TEXTS));
        let eom = eom_file.or_else(|| find_control(&["<|eom_id|>"]));
        let fim = [
            fim_files[0].or_else(|| find_control(FIM_PAD_TEXTS)),
            fim_files[1].or_else(|| find_control(FIM_REP_TEXTS)),
            fim_files[2].or_else(|| find_control(FIM_SEP_TEXTS)),
        ];
        let mut eog: HashSet<u32> = fim.iter().flatten().copied().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*text) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        eog.extend([eos, eot, eom].iter().flatten());
        apply_eog_workarounds(&mut eog, &mut attrs, &token_to_id);

        let specials: Vec<(u32, &str, bool)> = (0..n)
            .filter(|&id| attrs[id] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0)
            .map(|id| {
                let always = attrs[id] & (attr::CONTROL | attr::UNKNOWN) == 0;
                (id as u32, spec.tokens[id].as_str(), always)
            })
            .collect();
        let specials = SpecialMatcher::new(&specials);

        let model = match kind {
            VocabKind::Bpe => {
                let merges = spec
                    .merges
                    .as_ref()
                    .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
                let pre = pre.as_ref().expect("BPE always resolves a pre-tokenizer");
                Model::Bpe(Box::new(BpeEncoder::new(
                    &spec.tokens,
                    merges,
                    pre,
                    &mut warnings,
                )?))
            }
            VocabKind::Spm => {
                let mut byte_tokens = Box::new([None; 256]);
                for (b, slot) in byte_tokens.iter_mut().enumerate() {
                    let hex = format!("<0x{b:02X}>");
                    *slot = token_to_id.get(&hex).copied().or_else(|| {
                        let ascii = char::from_u32(b as u32).filter(|_| b < 0x80)?;
                        token_to_id.get(ascii.to_string().as_str()).copied()
                    });
                }
                let scores = spec
                    .scores
                    .as_ref()
                    .map_or_else(|| vec![0.0; n], |s| s[..n].to_vec());
                Model::Spm {
                    scores,
                    byte_tokens,
                }
            }
        };

        let byte_table = decode::Gpt2Alphabet::new();
        let pieces = (0..n)
            .map(|id| piece_of(kind, &spec.tokens[id], attrs[id], &byte_table))
            .collect();
        let mut eog: Vec<u32> = eog.into_iter().collect();
        eog.sort_unstable();

        Ok(Tokenizer {
            inner: Arc::new(Inner {
                kind,
                pre: pre.map(|p| p.name),
                tokens: spec.tokens.clone(),
                attrs,
                pieces,
                token_to_id,
                model,
                specials,
                bos,
                eos,
                eot,
                eom,
                unk,
                pad,
                add_bos,
                add_eos,
                add_space_prefix,
                eog,
                chat_template: spec.chat_template.clone(),
                warnings,
            }),
        })
    }

    /// Text to ids. `add_special` adds BOS/EOS where the model wants them; `parse_special`
    /// lets CONTROL tokens written in the text (`<|im_start|>`) become those tokens instead
    /// of being spelled out. This is llama.cpp's `llama_tokenize`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let inner = &*self.inner;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && inner.add_bos {
            out.extend(inner.bos);
        }
        // SentencePiece adds a leading space to text that opens the input or follows a
        // special token, when the model says so (`add_space_prefix`).
        let mut prev_special = true;
        for fragment in inner.specials.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(plain) => {
                    match &inner.model {
                        Model::Bpe(bpe) => bpe.encode(plain, &mut out)?,
                        Model::Spm {
                            scores,
                            byte_tokens,
                        } => {
                            let mut escaped = String::with_capacity(plain.len() + 3);
                            if inner.add_space_prefix && prev_special {
                                escaped.push('▁');
                            }
                            escaped.extend(plain.chars().map(|c| if c == ' ' { '▁' } else { c }));
                            let vocab = spm::SpmVocab {
                                token_to_id: &inner.token_to_id,
                                scores,
                                byte_tokens,
                                unk: inner.unk,
                            };
                            spm::encode(&vocab, &escaped, &mut out);
                        }
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && inner.add_eos {
            out.extend(inner.eos);
        }
        Ok(out)
    }

    /// Ids to text, special tokens rendered as their text.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Ids to text. Invalid UTF-8 (a character cut off by the end of `ids`) becomes U+FFFD.
    pub fn decode_with(&self, ids: &[u32], options: DecodeOptions) -> Result<String> {
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
        let piece = inner
            .pieces
            .get(id as usize)
            .ok_or(TokenizerError::IdOutOfRange {
                id,
                vocab_size: inner.tokens.len(),
            })?;
        let hidden = attr::CONTROL | attr::UNKNOWN;
        if options.skip_special && inner.attrs[id as usize] & hidden != 0 {
            return Ok(&[]);
        }
        Ok(piece)
    }

    /// The vocabulary entry of `id` as stored in the file (`Ġthe`, `▁the`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.inner.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary entry, by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id.get(text).copied()
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
        self.inner.tokens.len()
    }
    pub fn kind(&self) -> VocabKind {
        self.inner.kind
    }
    /// The resolved BPE pre-tokenizer name (`None` for SentencePiece).
    pub fn pre_tokenizer(&self) -> Option<&str> {
        self.inner.pre.as_deref()
    }
    pub fn bos(&self) -> Option<u32> {
        self.inner.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.inner.eos
    }
    /// End of turn: from the file, or found by text (`<|im_end|>`, `<end_of_turn>`...).
    pub fn eot(&self) -> Option<u32> {
        self.inner.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.inner.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.inner.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.inner.pad
    }
    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.inner.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.inner.add_eos
    }
    /// Whether generation stops at `id`: EOS, EOT, EOM, FIM pad/repo/separator tokens and
    /// the texts llama.cpp knows as end markers, when present in the vocabulary.
    pub fn is_eog(&self, id: u32) -> bool {
        self.inner.eog.binary_search(&id).is_ok()
    }
    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.inner.eog
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

fn attr_of(t: TokenType) -> u8 {
    match t {
        TokenType::Undefined => 0,
        TokenType::Normal => attr::NORMAL,
        TokenType::Unknown => attr::UNKNOWN,
        TokenType::Control => attr::CONTROL,
        TokenType::UserDefined => attr::USER_DEFINED,
        TokenType::Unused => attr::UNUSED,
        TokenType::Byte => attr::BYTE,
    }
}

/// llama.cpp's special cases for the end-of-generation set: gpt-oss's `<|end|>` separates
/// messages rather than ending generation when `<|return|>`/`<|call|>` exist, and the
/// gpt-oss channel markers are always-rendered user-defined tokens.
fn apply_eog_workarounds(eog: &mut HashSet<u32>, attrs: &mut [u8], token_to_id: &TokenMap) {
    let eog_has =
        |eog: &HashSet<u32>, t: &str| token_to_id.get(t).is_some_and(|id| eog.contains(id));
    let gpt_oss = (eog_has(eog, "<|return|>") && eog_has(eog, "<|call|>"))
        || (eog_has(eog, "<|calls|>") && eog_has(eog, "<|flush|>"));
    if let Some(&end) = token_to_id.get("<|end|>")
        && gpt_oss
        && eog.remove(&end)
    {
        attrs[end as usize] = attr::USER_DEFINED;
    }
    // Gemma 4 and PaddleOCR use `</s>` as ordinary text when `<|tool_response>` exists.
    if let Some(&s) = token_to_id.get("</s>")
        && eog_has(eog, "<|tool_response>")
        && eog.remove(&s)
    {
        attrs[s as usize] = attr::NORMAL;
    }
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(text) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
}

/// A token's bytes when special tokens are shown (llama.cpp `token_to_piece`, special=true).
fn piece_of(kind: VocabKind, text: &str, a: u8, byte_table: &decode::Gpt2Alphabet) -> Box<[u8]> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().into();
    }
    if a & attr::NORMAL != 0 {
        return match kind {
            VocabKind::Spm => text.replace('▁', " ").into_bytes().into(),
            VocabKind::Bpe => decode::byte_level_piece(text, byte_table).into(),
        };
    }
    if a & attr::BYTE != 0
        && let Some(b) = decode::parse_byte_token(text)
    {
        return Box::new([b]);
    }
    // UNUSED, UNDEFINED (and malformed byte tokens) render as nothing, as in llama.cpp.
    Box::new([])
}
