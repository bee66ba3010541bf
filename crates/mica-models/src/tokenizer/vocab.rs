//! The load-time rules llama.cpp applies to a vocabulary (`llama_vocab::impl::load`): token
//! attributes from the GGUF token types, special-token ids with their per-family defaults,
//! the end-of-generation set (partly found by token text), and each token's decoded bytes.

use std::borrow::Cow;
use std::collections::HashSet;

use super::decode::{self, Gpt2Alphabet};
use super::error::{Result, TokenizerError};
use super::pretokenize::PreTokenizer;
use super::store::VocabStore;
use super::{TokenType, TokenizerSpec, VocabKind};

/// Token attributes, as llama.cpp's `llama_token_attr` bit flags: the GGUF token type plus
/// flags llama.cpp adds at load (e.g. CONTROL on end-of-turn tokens typed NORMAL).
pub(crate) mod attr {
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

/// The special tokens of a vocabulary and what encoding adds.
pub(crate) struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// WordPiece's separator, appended after the text with special tokens (`add_sep`).
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    pub add_space_prefix: bool,
    pub space_prefix_rule: super::SpacePrefix,
    /// End-of-generation ids, ascending.
    pub eog: Vec<u32>,
}

/// Attributes of every token from the GGUF types (NORMAL when the file has none).
pub(crate) fn token_attrs(spec: &TokenizerSpec) -> Vec<u8> {
    let n = spec.tokens.len();
    match &spec.token_types {
        None => vec![attr::NORMAL; n],
        Some(types) => types[..n]
            .iter()
            .map(|&t| attr_of(TokenType::from_gguf(t)))
            .collect(),
    }
}

/// Resolves the special tokens: llama.cpp's per-family default ids, replaced by the file's
/// when in range (out-of-range ids are warnings), then the end-of-generation set. Tokens that
/// end generation or turns are made CONTROL in `attrs`, as llama.cpp forces them.
pub(crate) fn special_tokens(
    spec: &TokenizerSpec,
    kind: VocabKind,
    pre: Option<&PreTokenizer>,
    attrs: &mut [u8],
    store: &VocabStore,
    warnings: &mut Vec<String>,
) -> Result<SpecialTokens> {
    let n = spec.tokens.len();
    let (default_add_bos, default_bos, default_eos, default_unk) = match (kind, pre) {
        (VocabKind::Spm, _) => (true, Some(1), Some(2), Some(0)),
        // GPT-NeoX's id 11, llama.cpp's historical default for BPE files that name none.
        (VocabKind::Bpe, Some(p)) => (p.add_bos, (!p.no_bos).then_some(11), Some(11), None),
        (VocabKind::Bpe, None) => (false, Some(11), Some(11), None),
        (VocabKind::Gemma4, _) => (true, None, None, None),
        // BERT's [CLS] and [UNK].
        (VocabKind::WordPiece, _) => (true, Some(101), None, Some(100)),
    };
    let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    let mut pick = |key: &str, from_file: Option<u32>, default: Option<u32>| match from_file {
        Some(id) if (id as usize) < n => Some(id),
        Some(id) => {
            warnings.push(format!(
                "'{key}' = {id} is out of range (vocabulary size {n}); ignored"
            ));
            in_range(default)
        }
        None => in_range(default),
    };
    let bos = pick("tokenizer.ggml.bos_token_id", spec.bos_id, default_bos);
    let eos = pick("tokenizer.ggml.eos_token_id", spec.eos_id, default_eos);
    let unk = pick("tokenizer.ggml.unknown_token_id", spec.unk_id, default_unk);
    let pad = pick("tokenizer.ggml.padding_token_id", spec.pad_id, None);
    let wordpiece = kind == VocabKind::WordPiece;
    // BERT's [SEP].
    let sep = pick(
        "tokenizer.ggml.seperator_token_id",
        spec.sep_id,
        wordpiece.then_some(102),
    );
    let eot = pick("tokenizer.ggml.eot_token_id", spec.eot_id, None);
    let eom = pick("tokenizer.ggml.eom_token_id", spec.eom_id, None);
    let fim = [
        pick("tokenizer.ggml.fim_pad_token_id", spec.fim_pad_id, None),
        pick("tokenizer.ggml.fim_rep_token_id", spec.fim_rep_id, None),
        pick("tokenizer.ggml.fim_sep_token_id", spec.fim_sep_id, None),
    ];
    let mut add_bos = spec.add_bos.unwrap_or(default_add_bos);
    if kind == VocabKind::Gemma4 && !add_bos {
        // llama.cpp overrides the flag for Gemma 4, whose converted files may say false.
        warnings
            .push("'tokenizer.ggml.add_bos_token' is false; Gemma 4 needs BOS: using true".into());
        add_bos = true;
    }
    // WordPiece encoding adds [CLS] ... [SEP] with special tokens, whatever the flags say.
    let add_bos = add_bos || wordpiece;
    if wordpiece && sep.is_none() {
        return Err(TokenizerError::MissingSpecialToken {
            flag: "tokenizer.ggml.model = bert",
            id_key: "tokenizer.ggml.seperator_token_id",
        });
    }
    let add_eos = spec.add_eos.unwrap_or(false);
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

    // Tokens found by their text become CONTROL.
    let mut find_control = |texts: &[&str]| -> Option<u32> {
        let id = texts.iter().find_map(|t| store.id(t))?;
        attrs[id as usize] |= attr::CONTROL;
        Some(id)
    };
    let eot = eot.or_else(|| find_control(EOT_TEXTS));
    let eom = eom.or_else(|| find_control(&["<|eom_id|>"]));
    let fim = [
        fim[0].or_else(|| find_control(FIM_PAD_TEXTS)),
        fim[1].or_else(|| find_control(FIM_REP_TEXTS)),
        fim[2].or_else(|| find_control(FIM_SEP_TEXTS)),
    ];
    let mut eog: HashSet<u32> = fim.iter().flatten().copied().collect();
    for text in EOG_TEXTS {
        if let Some(id) = store.id(text) {
            eog.insert(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    eog.extend([eos, eot, eom].iter().flatten());
    apply_eog_workarounds(&mut eog, attrs, store);
    let mut eog: Vec<u32> = eog.into_iter().collect();
    eog.sort_unstable();

    Ok(SpecialTokens {
        bos,
        eos,
        eot,
        eom,
        unk,
        pad,
        sep,
        add_bos,
        add_eos,
        add_sep: wordpiece,
        add_space_prefix: spec.add_space_prefix.unwrap_or(kind == VocabKind::Spm),
        space_prefix_rule: spec.space_prefix_rule,
        eog,
    })
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
fn apply_eog_workarounds(eog: &mut HashSet<u32>, attrs: &mut [u8], store: &VocabStore) {
    let eog_has = |eog: &HashSet<u32>, t: &str| store.id(t).is_some_and(|id| eog.contains(&id));
    let gpt_oss = (eog_has(eog, "<|return|>") && eog_has(eog, "<|call|>"))
        || (eog_has(eog, "<|calls|>") && eog_has(eog, "<|flush|>"));
    if let Some(end) = store.id("<|end|>")
        && gpt_oss
        && eog.remove(&end)
    {
        attrs[end as usize] = attr::USER_DEFINED;
    }
    // Gemma 4 and PaddleOCR use `</s>` as ordinary text when `<|tool_response>` exists.
    if let Some(s) = store.id("</s>")
        && eog_has(eog, "<|tool_response>")
        && eog.remove(&s)
    {
        attrs[s as usize] = attr::NORMAL;
    }
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = store.id(text) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
}

/// A token's bytes when special tokens are shown (llama.cpp `token_to_piece`, special=true).
pub(crate) fn piece_of<'t>(
    kind: VocabKind,
    text: &'t str,
    a: u8,
    byte_table: &Gpt2Alphabet,
) -> Cow<'t, [u8]> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return Cow::Borrowed(text.as_bytes());
    }
    if a & attr::NORMAL != 0 {
        return match kind {
            // SentencePiece-style vocabularies spell spaces as `▁`.
            VocabKind::Bpe => Cow::Owned(decode::byte_level_piece(text, byte_table)),
            _ if !text.contains('▁') => Cow::Borrowed(text.as_bytes()),
            _ => Cow::Owned(text.replace('▁', " ").into_bytes()),
        };
    }
    if a & attr::BYTE != 0
        && let Some(b) = decode::parse_byte_token(text)
    {
        return Cow::Owned(vec![b]);
    }
    // UNUSED, UNDEFINED (and malformed byte tokens) render as nothing, as in llama.cpp.
    Cow::Borrowed(&[])
}
