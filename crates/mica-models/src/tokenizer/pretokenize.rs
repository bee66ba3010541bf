//! Pre-tokenizer regexes for byte-level BPE vocabularies, keyed by GGUF `tokenizer.ggml.pre`.
//!
//! A BPE vocabulary only reproduces its training-time ids if the text is cut into words exactly
//! as it was during training. llama.cpp (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`) keeps one
//! list of regexes per pre-tokenizer name; each regex in turn splits every piece produced by
//! the previous one, keeping both the matches and the text between them (Hugging Face's
//! `Split` with `Isolated` behaviour). The lists below are llama.cpp's, with one change: the
//! GPT-2 regex gains the trailing `|\s+` alternative that llama.cpp's hand-written GPT-2
//! splitter (`unicode_regex_split_custom_gpt2`) implements but its regex text omits.
//!
//! Unknown names are an error rather than a silent fallback: a wrong split gives plausible
//! but different ids, which is worse than refusing to load.

use super::error::{Result, TokenizerError};

/// GPT-2's word regex (with the trailing `\s+` llama.cpp's custom splitter applies).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3 (tiktoken cl100k-style), with the case-insensitive contractions spelled out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2: Llama 3's regex with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2's regex with combining marks (`\p{M}`) kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek LLM's letters: an explicit list of cased-letter ranges (from its tokenizer.json).
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
/// DeepSeek LLM's punctuation: ASCII and full-width punctuation, quotes and CJK symbols.
const DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟\x{3000}-。]+";
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const CJK: &str = r"[一-龥ࠀ-一가-퟿]+";
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// How a BPE vocabulary splits text into words, and the defaults that come with its name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PreTokenizer {
    /// The name it was resolved from (`"default"` when the file gave none).
    pub name: String,
    /// Applied in order, each refining the pieces of the previous one.
    pub regexes: &'static [&'static str],
    /// A word that is itself in the vocabulary becomes that token without merging (tiktoken
    /// vocabularies, whose merges cannot always rebuild every token).
    pub ignore_merges: bool,
    /// Default for `add_bos` when the file does not say.
    pub add_bos: bool,
    /// Whether the BOS token should be ignored entirely (ChatGLM).
    pub no_bos: bool,
}

/// Resolves a `tokenizer.ggml.pre` name. A missing name means llama.cpp's `default` list,
/// reported through the returned warning.
pub(crate) fn resolve(pre: Option<&str>) -> Result<(PreTokenizer, Option<String>)> {
    let Some(name) = pre.filter(|p| !p.is_empty()) else {
        let warning = "GGUF has no 'tokenizer.ggml.pre'; using the 'default' BPE pre-tokenizer \
                       (generation quality may suffer; consider reconverting the model)";
        return Ok((lookup("default")?, Some(warning.to_string())));
    };
    Ok((lookup(name)?, None))
}

fn lookup(name: &str) -> Result<PreTokenizer> {
    let (regexes, ignore_merges, add_bos): (&'static [&'static str], bool, bool) = match name {
        "default" => (
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => (&[LLAMA3], true, true),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => (&[LLAMA3], false, false),
        "deepseek-coder" => (
            &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
            false,
            false,
        ),
        "deepseek-llm" => (
            &[
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                DEEPSEEK_LLM_PUNCT,
                r"\s+$",
                CJK,
                r"\p{N}+",
            ],
            false,
            false,
        ),
        "deepseek-v3" | "hunyuan-dense" => (
            &[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS],
            false,
            false,
        ),
        "falcon" => (
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            (&[r"\p{N}", GPT2], false, false)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling"
        | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => (&[GPT2], false, false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" | "megrez" | "grok-2" => {
            (&[QWEN2], false, false)
        }
        "qwen35" => (&[QWEN35], false, false),
        "poro-chat" | "bloom" | "gpt3-finnish" => (&[BLOOM], false, false),
        "viking" => (&[BLOOM, r"\p{N}"], false, false),
        "tekken" => (&[TEKKEN], true, true),
        "chameleon" => (
            &[
                r"<sentinel:[0-9]+>",
                r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                r"([\t\n]|    |  )",
                r"\p{N}",
                r"[\p{P}!-/:-@\[-`{-~]",
                GPT2,
            ],
            false,
            true,
        ),
        "gpt-4o" | "llama4" => (&[GPT4O], false, false),
        "seed-coder" => (&[SEED_CODER], false, false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (&[BAILINGMOE], false, false),
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    };
    Ok(PreTokenizer {
        name: name.to_string(),
        regexes,
        ignore_merges,
        add_bos,
        no_bos: matches!(name, "chatglm-bpe" | "glm4"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every regex of every supported name compiles with the engine the BPE path uses.
    #[test]
    fn all_regexes_compile() {
        let names = [
            "default",
            "llama3",
            "dbrx",
            "deepseek-coder",
            "deepseek-llm",
            "deepseek-v3",
            "falcon",
            "smollm",
            "gpt-2",
            "qwen2",
            "qwen35",
            "bloom",
            "viking",
            "tekken",
            "chameleon",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
        ];
        for name in names {
            let pre = lookup(name).unwrap();
            for re in pre.regexes {
                tokenizers::utils::SysRegex::new(re)
                    .unwrap_or_else(|e| panic!("{name}: regex {re:?} does not compile: {e}"));
            }
        }
    }

    #[test]
    fn unknown_and_missing_names() {
        let err = resolve(Some("no-such-pre")).unwrap_err();
        assert!(err.to_string().contains("'no-such-pre'"), "{err}");
        let (pre, warning) = resolve(None).unwrap();
        assert_eq!(pre.name, "default");
        assert!(warning.unwrap().contains("tokenizer.ggml.pre"));
    }
}
