//! [`TokenizerSpec`]: everything the GGUF `tokenizer.ggml.*` keys say about a vocabulary, as
//! plain owned data. The tokenizer is built from this, never from the file directly, so tests
//! can hand-write tiny vocabularies and other sources (a `tokenizer.json`) can fill it later.

use mica_formats::{GgufFile, MetaArray, MetaValue};

use super::error::{Result, TokenizerError};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    /// Markup such as `<|im_start|>`: parsed from text only when asked (`parse_special`).
    Control,
    /// Added by the model author: always parsed from text, rendered verbatim.
    UserDefined,
    Unused,
    /// `<0xNN>` byte-fallback tokens.
    Byte,
}

impl TokenType {
    /// The type of a GGUF `token_type` value; values outside 0..=6 are `Undefined`, as in
    /// llama.cpp.
    pub fn from_gguf(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Which text fragments SentencePiece's space prefix (`add_space_prefix`) goes before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpacePrefix {
    /// Text that opens the input or follows a special token (llama.cpp; HF's `Prepend`
    /// normalizer of LLaMA-2's legacy tokenizer.json).
    #[default]
    EveryFragment,
    /// The same, unless the text already starts with a space (HF's Metaspace "always").
    EveryUnlessSpace,
    /// Only text opening the input, unless it starts with a space (HF's Metaspace "first").
    FirstUnlessSpace,
}

/// The tokenizer description of a model: the `tokenizer.ggml.*` GGUF keys, unvalidated.
/// [`Tokenizer::from_spec`](super::Tokenizer::from_spec) checks it.
#[derive(Clone, Debug, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE), `"llama"` (SentencePiece),
    /// `"gemma4"` (Gemma 4's BPE) or `"bert"` (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: which pre-tokenizer regexes a BPE vocabulary was trained with.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`, see [`TokenType::from_gguf`].
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` entries, highest priority first. A `llama`
    /// vocabulary with merges and no scores (from a `tokenizer.json`) merges by rank.
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End of turn (`<|eot_id|>`, `<|im_end|>`...), when the file names it.
    pub eot_id: Option<u32>,
    /// End of message (`<|eom_id|>`), when the file names it.
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// Separator (`[SEP]`), which WordPiece encoding appends with special tokens
    /// (`tokenizer.ggml.seperator_token_id`, spelled as in llama.cpp).
    pub sep_id: Option<u32>,
    /// Fill-in-the-middle pad / repository / file-separator tokens: llama.cpp ends generation
    /// on them.
    pub fim_pad_id: Option<u32>,
    pub fim_rep_id: Option<u32>,
    pub fim_sep_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; when absent the per-model default applies.
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece only; default true).
    pub normalizer_lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece only; default: as lowercase).
    pub normalizer_strip_accents: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece only).
    pub add_space_prefix: Option<bool>,
    /// Which fragments get the space prefix (no GGUF key: llama.cpp's rule).
    pub space_prefix_rule: SpacePrefix,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

const TOKENS: &str = "tokenizer.ggml.tokens";
const MERGES: &str = "tokenizer.ggml.merges";

impl TokenizerSpec {
    /// Reads the `tokenizer.*` keys of an open GGUF file. Only types are checked here; the
    /// contents are validated when the tokenizer is built.
    pub fn from_gguf(gguf: &GgufFile) -> Result<TokenizerSpec> {
        let copy = |key: &'static str| -> Result<Option<Vec<String>>> {
            match gguf.get_array(key) {
                None => Ok(None),
                Some(MetaArray::String(v)) => Ok(Some(v.clone())),
                Some(a) => Err(not_strings(key, a)),
            }
        };
        Self::read(gguf, copy(TOKENS), copy(MERGES))
    }

    /// [`from_gguf`](Self::from_gguf), moving the vocabulary and merges out of the file
    /// instead of copying them: they are the bulk of the metadata (262k tokens are ~16 MB
    /// parsed), and a loader has no use for them once the tokenizer is built. Both keys are
    /// gone from `gguf` afterwards, whatever the result.
    pub fn take_from_gguf(gguf: &mut GgufFile) -> Result<TokenizerSpec> {
        let mut take = |key: &'static str| -> Result<Option<Vec<String>>> {
            match gguf.take_metadata(key) {
                Some(MetaValue::Array(MetaArray::String(v))) => Ok(Some(v)),
                Some(MetaValue::Array(a)) => Err(not_strings(key, &a)),
                // Not an array: missing, as `GgufFile::get_array` sees it.
                _ => Ok(None),
            }
        };
        let (tokens, merges) = (take(TOKENS), take(MERGES));
        Self::read(gguf, tokens, merges)
    }

    /// Everything but the two string arrays, which the caller has fetched (its errors are
    /// reported in key order).
    fn read(
        gguf: &GgufFile,
        tokens: Result<Option<Vec<String>>>,
        merges: Result<Option<Vec<String>>>,
    ) -> Result<TokenizerSpec> {
        let str_key =
            |key: &'static str| -> Result<Option<String>> {
                match gguf.metadata(key) {
                    None => Ok(None),
                    Some(v) => v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| {
                        TokenizerError::BadKey {
                            key,
                            msg: format!("expected a string, found {}", v.type_name()),
                        }
                    }),
                }
            };
        let id_key = |key: &'static str| -> Result<Option<u32>> {
            match gguf.metadata(key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(id) => Ok(u32::try_from(id).ok()),
                    // llama.cpp writes -1 for "no such token" in some converters.
                    None if v.as_i64().is_some() => Ok(None),
                    None => Err(TokenizerError::BadKey {
                        key,
                        msg: format!("expected an integer, found {}", v.type_name()),
                    }),
                },
            }
        };
        let bool_key = |key: &'static str| -> Result<Option<bool>> {
            match gguf.metadata(key) {
                None => Ok(None),
                Some(v) => v.as_bool().map(Some).ok_or_else(|| TokenizerError::BadKey {
                    key,
                    msg: format!("expected a bool, found {}", v.type_name()),
                }),
            }
        };
        let model = str_key("tokenizer.ggml.model")?
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        let tokens = tokens?.ok_or(TokenizerError::MissingVocab)?;
        let scores = match gguf.get_array("tokenizer.ggml.scores") {
            None => None,
            Some(MetaArray::F32(v)) => Some(v.clone()),
            // Some converters write integer scores; llama.cpp accepts i32.
            Some(a) => Some(
                a.to_i64s()
                    .ok_or_else(|| TokenizerError::BadKey {
                        key: "tokenizer.ggml.scores",
                        msg: format!("expected f32 or i32 elements, found {}", a.elem_type_name()),
                    })?
                    .into_iter()
                    .map(|v| v as f32)
                    .collect(),
            ),
        };
        let token_types = match gguf.get_array("tokenizer.ggml.token_type") {
            None => None,
            Some(a) => Some(
                a.to_i64s()
                    .ok_or_else(|| TokenizerError::BadKey {
                        key: "tokenizer.ggml.token_type",
                        msg: format!("expected integer elements, found {}", a.elem_type_name()),
                    })?
                    .into_iter()
                    .map(|v| i32::try_from(v).unwrap_or(0))
                    .collect(),
            ),
        };

        Ok(TokenizerSpec {
            model,
            pre: str_key("tokenizer.ggml.pre")?,
            tokens,
            scores,
            token_types,
            merges: merges?,
            bos_id: id_key("tokenizer.ggml.bos_token_id")?,
            eos_id: id_key("tokenizer.ggml.eos_token_id")?,
            eot_id: id_key("tokenizer.ggml.eot_token_id")?,
            eom_id: id_key("tokenizer.ggml.eom_token_id")?,
            unk_id: id_key("tokenizer.ggml.unknown_token_id")?,
            pad_id: id_key("tokenizer.ggml.padding_token_id")?,
            sep_id: id_key("tokenizer.ggml.seperator_token_id")?,
            fim_pad_id: id_key("tokenizer.ggml.fim_pad_token_id")?,
            fim_rep_id: id_key("tokenizer.ggml.fim_rep_token_id")?,
            fim_sep_id: id_key("tokenizer.ggml.fim_sep_token_id")?,
            add_bos: bool_key("tokenizer.ggml.add_bos_token")?,
            add_eos: bool_key("tokenizer.ggml.add_eos_token")?,
            normalizer_lowercase: bool_key("tokenizer.ggml.normalizer.lowercase")?,
            normalizer_strip_accents: bool_key("tokenizer.ggml.normalizer.strip_accents")?,
            add_space_prefix: bool_key("tokenizer.ggml.add_space_prefix")?,
            space_prefix_rule: SpacePrefix::default(),
            chat_template: str_key("tokenizer.chat_template")?,
        })
    }
}

fn not_strings(key: &'static str, a: &MetaArray) -> TokenizerError {
    TokenizerError::BadKey {
        key,
        msg: format!("expected an array of strings, found {}", a.elem_type_name()),
    }
}
