//! Canonical tensor names and the tables that map them onto Hugging Face checkpoints.
//!
//! mica's canonical names are llama.cpp's GGUF names (`token_embd.weight`,
//! `blk.{i}.attn_q.weight`...), so a GGUF file needs no table. A Hugging Face family gives
//! one [`NameTable`]: global tensors by full name, per-layer tensors by the part after
//! `blk.{i}.`, placed under the checkpoint's layer prefix. A name the table does not list
//! maps to itself, which then fails as a missing tensor naming it.

/// Canonical → checkpoint names for one family.
pub struct NameTable {
    /// `model.layers.{i}.`: the per-layer prefix, `{i}` the layer index.
    pub layer_prefix: &'static str,
    /// Whole-model tensors: (canonical, checkpoint).
    pub global: &'static [(&'static str, &'static str)],
    /// Per-layer tensors: (canonical suffix after `blk.{i}.`, checkpoint suffix).
    pub layer: &'static [(&'static str, &'static str)],
}

impl NameTable {
    /// The checkpoint name of a canonical tensor name.
    pub fn to_file(&self, canonical: &str) -> String {
        if let Some((_, f)) = self.global.iter().find(|(c, _)| *c == canonical) {
            return f.to_string();
        }
        if let Some(rest) = canonical.strip_prefix("blk.")
            && let Some((i, suffix)) = rest.split_once('.')
        {
            let prefix = self.layer_prefix.replace("{i}", i);
            if let Some((_, f)) = self.layer.iter().find(|(c, _)| *c == suffix) {
                return format!("{prefix}{f}");
            }
            // Per-expert names: `{e}` stands for the expert index in both forms.
            for (c, f) in self.layer {
                if let Some((pre, post)) = c.split_once("{e}")
                    && let Some(e) = suffix.strip_prefix(pre).and_then(|r| r.strip_suffix(post))
                    && e.parse::<usize>().is_ok()
                {
                    return format!("{prefix}{}", f.replace("{e}", e));
                }
            }
        }
        canonical.to_string()
    }

    /// The canonical name of a checkpoint tensor (the table read backwards), with its layer
    /// index; `None` when the table does not list it.
    pub fn to_canonical(&self, file: &str) -> Option<(String, Option<usize>)> {
        if let Some((c, _)) = self.global.iter().find(|(_, f)| *f == file) {
            return Some((c.to_string(), None));
        }
        let (pre, post) = self.layer_prefix.split_once("{i}")?;
        let (i, suffix) = file.strip_prefix(pre)?.split_once(post)?;
        let layer: usize = i.parse().ok()?;
        let canonical = |c: &str| Some((format!("blk.{layer}.{c}"), Some(layer)));
        if let Some((c, _)) = self.layer.iter().find(|(_, f)| *f == suffix) {
            return canonical(c);
        }
        // Per-expert names: `{e}` stands for the expert index in both forms.
        for (c, f) in self.layer {
            if let Some((fpre, fpost)) = f.split_once("{e}")
                && let Some(e) = suffix
                    .strip_prefix(fpre)
                    .and_then(|r| r.strip_suffix(fpost))
                && e.parse::<usize>().is_ok()
            {
                return canonical(&c.replace("{e}", e));
            }
        }
        None
    }
}

/// The per-layer names LLaMA-style decoders in transformers share (`LlamaForCausalLM`,
/// `Qwen2ForCausalLM`, `Gemma3ForCausalLM`...), followed by a family's `$extra` pairs.
macro_rules! decoder_layer_names {
    ($($extra:expr),* $(,)?) => {
        &[
            ("attn_norm.weight", "input_layernorm.weight"),
            ("attn_q.weight", "self_attn.q_proj.weight"),
            ("attn_q.bias", "self_attn.q_proj.bias"),
            ("attn_k.weight", "self_attn.k_proj.weight"),
            ("attn_k.bias", "self_attn.k_proj.bias"),
            ("attn_v.weight", "self_attn.v_proj.weight"),
            ("attn_v.bias", "self_attn.v_proj.bias"),
            ("attn_output.weight", "self_attn.o_proj.weight"),
            ("attn_q_norm.weight", "self_attn.q_norm.weight"),
            ("attn_k_norm.weight", "self_attn.k_norm.weight"),
            ("ffn_gate.weight", "mlp.gate_proj.weight"),
            ("ffn_up.weight", "mlp.up_proj.weight"),
            ("ffn_down.weight", "mlp.down_proj.weight"),
            $($extra),*
        ]
    };
}

pub(crate) use decoder_layer_names;

/// The whole-model names LLaMA-style decoders in transformers share.
pub const DECODER_GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_global_and_layer_names() {
        use crate::arch::gemma3::HF_NAMES as GEMMA3_HF;
        use crate::arch::llama::HF_NAMES as LLAMA_HF;
        assert_eq!(
            LLAMA_HF.to_file("token_embd.weight"),
            "model.embed_tokens.weight"
        );
        assert_eq!(
            LLAMA_HF.to_file("blk.12.attn_q.bias"),
            "model.layers.12.self_attn.q_proj.bias"
        );
        assert_eq!(
            LLAMA_HF.to_file("blk.0.ffn_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            GEMMA3_HF.to_file("blk.3.ffn_norm.weight"),
            "model.layers.3.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            LLAMA_HF.to_file("blk.1.unknown.weight"),
            "blk.1.unknown.weight"
        );
    }

    #[test]
    fn maps_checkpoint_names_back() {
        use crate::arch::llama::HF_NAMES as LLAMA_HF;
        use crate::arch::qwen2moe::HF_NAMES as QWEN_MOE_HF;
        let back = |t: &NameTable, n: &str| t.to_canonical(n);
        assert_eq!(
            back(&LLAMA_HF, "model.layers.12.self_attn.q_proj.weight"),
            Some(("blk.12.attn_q.weight".into(), Some(12)))
        );
        assert_eq!(
            back(&LLAMA_HF, "model.embed_tokens.weight"),
            Some(("token_embd.weight".into(), None))
        );
        assert_eq!(
            back(&QWEN_MOE_HF, "model.layers.1.mlp.experts.3.up_proj.weight"),
            Some(("blk.1.ffn_up_exp.3.weight".into(), Some(1)))
        );
        assert_eq!(
            QWEN_MOE_HF.to_file("blk.1.ffn_up_exp.3.weight"),
            "model.layers.1.mlp.experts.3.up_proj.weight"
        );
        assert_eq!(
            back(&QWEN_MOE_HF, "model.layers.1.mlp.experts.x.up_proj.weight"),
            None
        );
        assert_eq!(back(&LLAMA_HF, "model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(back(&LLAMA_HF, "model.layers.1.mystery"), None);
    }
}
