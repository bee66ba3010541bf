//! The family descriptor: everything mica knows about one model family, declared once in
//! the family's file under `arch/` and listed in the registry ([`super::REGISTRY`]).
//!
//! A descriptor says which names a family answers to (GGUF `general.architecture`,
//! transformers `architectures`), how its Hugging Face tensors are named ([`NameTable`]),
//! how a model is built from either source (the loader, which also maps GGUF keys or
//! `config.json` onto [`crate::ModelConfig`]), and how a Hugging Face folder of the family
//! is written as the GGUF file llama.cpp's `convert_hf_to_gguf.py` writes from it
//! ([`GgufHints`]). A converter needs nothing else: it loads the folder with the family's
//! loader (which resolves and validates the configuration), writes the shared
//! `{arch}.*` keys from the resolved [`crate::ModelConfig`], asks the family for the keys
//! only it has ([`GgufHints::keys`]), and rearranges tensors as the hints say.

use super::Source;
use crate::error::Result;
use crate::hf::HfFolder;
use crate::model::Model;
use crate::names::NameTable;
use mica_formats::MetaValue;

/// Builds a model from a GGUF file or a Hugging Face folder; the `&str` is the
/// architecture name the source gave (the GGUF key prefix, and [`crate::ModelConfig::arch`]).
pub type Loader = fn(&Source, &str) -> Result<Model>;

/// One model family.
pub struct Family {
    /// Short name, for documentation and messages (`"llama"`, `"gemma2"`).
    pub name: &'static str,
    /// GGUF `general.architecture` values this family loads (none: files of the family are
    /// written under another family's name, as Mixtral's are `llama`).
    pub gguf_archs: &'static [&'static str],
    /// transformers class names (`architectures[0]` of config.json) this family loads.
    pub hf_classes: &'static [&'static str],
    /// Canonical (GGUF) tensor names → the names in the family's Hugging Face checkpoints.
    pub hf_names: &'static NameTable,
    pub load: Loader,
    /// How llama.cpp's converter writes a Hugging Face folder of this family.
    pub gguf: GgufHints,
}

/// Conversion hints: what turns a Hugging Face checkpoint of the family into the GGUF file
/// llama.cpp's converter writes, beyond reading its table backwards. 1-D tensors (norms,
/// biases) are always written as F32, and a Llama-3 `rope_freqs.weight` or Phi-3 LongRoPE
/// `rope_factors_{short,long}.weight` tensor is written whenever the resolved configuration
/// has those factors.
pub struct GgufHints {
    /// `general.architecture` of the written file, and the prefix of its `{arch}.*` keys.
    pub arch: &'static str,
    /// The rows of each query and key head (weight and bias) are permuted so that RoPE over
    /// adjacent pairs (llama.cpp's `llama` graph) equals transformers' rotation of halves:
    /// row `2i + j` of a head is the checkpoint's row `j·head_dim/2 + i`.
    pub permute_qk: bool,
    /// Per-layer canonical names (after `blk.{i}.`) of weights stored as `Conv1D`, `[in, out]`
    /// (GPT-2): transposed into `nn.Linear`'s `[out, in]`.
    pub transposed: &'static [&'static str],
    /// The fused `attn_qkv` holds each head's q, k and v rows together
    /// (`[n_head][3][head_dim]`, GPT-NeoX): regrouped to q | k | v (`[3][n_head][head_dim]`),
    /// weight and bias.
    pub qkv_per_head: bool,
    /// Per-expert matrices (`ffn_{gate,up,down}_exp.{e}.weight`) are stacked into one 3-D
    /// tensor per layer and kind, `ffn_{gate,up,down}_exps.weight`, experts outermost.
    pub stack_experts: bool,
    /// 1 is added to every norm weight (`*norm.weight`): the checkpoint stores `w` of
    /// Gemma's `(1 + w)` RMSNorm, the GGUF file `1 + w`.
    pub norm_plus_one: bool,
    /// Latent attention (DeepSeek): each layer's `attn_kv_b` (`[n_head · (qk_nope + v)] ×
    /// kv_lora_rank`) is written as llama.cpp's absorbed matrices, `attn_k_b` (each head's
    /// key rows transposed, `[n_head][kv_lora_rank][qk_nope]`) and `attn_v_b` (each head's
    /// value rows, `[n_head][v][kv_lora_rank]`); no `rope_freqs.weight` (YaRN is in keys).
    pub mla_kv_b: bool,
    /// The `{arch}.*` keys only this family has, from the loaded model and its folder, and
    /// the checks that GGUF (as llama.cpp reads it) can say what the model does. `Err` says
    /// why the model cannot be written faithfully.
    pub keys: KeysFn,
}

/// See [`GgufHints::keys`].
pub type KeysFn = fn(&Model, &HfFolder, &mut GgufKeys) -> std::result::Result<(), String>;

/// GGUF metadata being written for one architecture: `{arch}.*` keys in order, and warnings
/// about what the file will not say (the converter reports them).
pub struct GgufKeys {
    pub arch: &'static str,
    pub entries: Vec<(String, MetaValue)>,
    pub warnings: Vec<GgufWarning>,
}

/// Something a converted file will not say that the folder does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GgufWarning {
    /// The model attends within a sliding window of `window` tokens, which GGUF `arch` has
    /// no key for (llama.cpp's converter drops it too).
    SlidingWindowDropped { window: usize, arch: &'static str },
}

impl std::fmt::Display for GgufWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GgufWarning::SlidingWindowDropped { window, arch } => write!(
                f,
                "the model attends within a sliding window of {window} tokens; GGUF '{arch}' \
                 has no key for it (llama.cpp's converter drops it too), so the output attends \
                 to the whole context and differs from the folder beyond {window} tokens"
            ),
        }
    }
}

impl GgufKeys {
    pub fn new(arch: &'static str) -> GgufKeys {
        GgufKeys {
            arch,
            entries: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// `{arch}.{key}` = `value`.
    pub fn set(&mut self, key: &str, value: MetaValue) {
        self.entries.push((format!("{}.{key}", self.arch), value));
    }

    /// A `u32` key (llama.cpp's type for counts and lengths).
    pub fn u32(&mut self, key: &str, v: usize) {
        self.set(key, MetaValue::U32(v as u32));
    }

    pub fn f32(&mut self, key: &str, v: f32) {
        self.set(key, MetaValue::F32(v));
    }

    pub fn bool(&mut self, key: &str, v: bool) {
        self.set(key, MetaValue::Bool(v));
    }
}

/// A family with no keys of its own.
pub fn no_keys(_: &Model, _: &HfFolder, _: &mut GgufKeys) -> std::result::Result<(), String> {
    Ok(())
}

/// The hints of a family written as transformers stores it: no rearranged tensors.
pub const PLAIN: GgufHints = GgufHints {
    arch: "",
    permute_qk: false,
    transposed: &[],
    qkv_per_head: false,
    stack_experts: false,
    norm_plus_one: false,
    mla_kv_b: false,
    keys: no_keys,
};
