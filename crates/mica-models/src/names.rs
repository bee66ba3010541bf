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
}

/// LLaMA-style decoders in transformers (`LlamaForCausalLM`, `MistralForCausalLM`,
/// `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `Gemma3ForCausalLM`...): the shared names.
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

const DECODER_GLOBAL: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// LLaMA, Mistral, Qwen2, Qwen3.
pub static LLAMA_HF: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![("ffn_norm.weight", "post_attention_layernorm.weight")],
};

/// Gemma 3: pre- and post-norms around both sub-blocks.
pub static GEMMA3_HF: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        (
            "post_attention_norm.weight",
            "post_attention_layernorm.weight"
        ),
        ("ffn_norm.weight", "pre_feedforward_layernorm.weight"),
        ("post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
    ],
};

/// Phi-3: fused `qkv_proj` and `gate_up_proj` (split by row ranges at load).
pub static PHI3_HF: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: &[
        ("attn_norm.weight", "input_layernorm.weight"),
        ("attn_qkv.weight", "self_attn.qkv_proj.weight"),
        ("attn_output.weight", "self_attn.o_proj.weight"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_up.weight", "mlp.gate_up_proj.weight"),
        ("ffn_down.weight", "mlp.down_proj.weight"),
    ],
};

/// Qwen2-MoE / Qwen3-MoE: one set of matrices per expert (`mlp.experts.{e}.*`), the router
/// (`mlp.gate`), a shared expert and its gate (Qwen2-MoE).
pub static QWEN_MOE_HF: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate_inp.weight", "mlp.gate.weight"),
        (
            "ffn_gate_exp.{e}.weight",
            "mlp.experts.{e}.gate_proj.weight"
        ),
        ("ffn_up_exp.{e}.weight", "mlp.experts.{e}.up_proj.weight"),
        (
            "ffn_down_exp.{e}.weight",
            "mlp.experts.{e}.down_proj.weight"
        ),
        (
            "ffn_gate_shexp.weight",
            "mlp.shared_expert.gate_proj.weight"
        ),
        ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
        (
            "ffn_down_shexp.weight",
            "mlp.shared_expert.down_proj.weight"
        ),
        ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    ],
};

/// Mixtral: the router `block_sparse_moe.gate`, experts `block_sparse_moe.experts.{e}.w1`
/// (gate), `w3` (up), `w2` (down).
pub static MIXTRAL_HF: NameTable = NameTable {
    layer_prefix: "model.layers.{i}.",
    global: DECODER_GLOBAL,
    layer: decoder_layer_names![
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_gate_inp.weight", "block_sparse_moe.gate.weight"),
        (
            "ffn_gate_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w1.weight"
        ),
        (
            "ffn_up_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w3.weight"
        ),
        (
            "ffn_down_exp.{e}.weight",
            "block_sparse_moe.experts.{e}.w2.weight"
        ),
    ],
};

/// GPT-2 (`transformer.h.{i}.*`): fused `c_attn` (Conv1D, `[in, out]`, transposed at
/// load), learned positions `wpe`, LayerNorms with biases, head tied to `wte`.
pub static GPT2_HF: NameTable = NameTable {
    layer_prefix: "transformer.h.{i}.",
    global: &[
        ("token_embd.weight", "transformer.wte.weight"),
        ("position_embd.weight", "transformer.wpe.weight"),
        ("output_norm.weight", "transformer.ln_f.weight"),
        ("output_norm.bias", "transformer.ln_f.bias"),
        ("output.weight", "lm_head.weight"),
    ],
    layer: &[
        ("attn_norm.weight", "ln_1.weight"),
        ("attn_norm.bias", "ln_1.bias"),
        ("attn_qkv.weight", "attn.c_attn.weight"),
        ("attn_qkv.bias", "attn.c_attn.bias"),
        ("attn_output.weight", "attn.c_proj.weight"),
        ("attn_output.bias", "attn.c_proj.bias"),
        ("ffn_norm.weight", "ln_2.weight"),
        ("ffn_norm.bias", "ln_2.bias"),
        ("ffn_up.weight", "mlp.c_fc.weight"),
        ("ffn_up.bias", "mlp.c_fc.bias"),
        ("ffn_down.weight", "mlp.c_proj.weight"),
        ("ffn_down.bias", "mlp.c_proj.bias"),
    ],
};

/// GPT-NeoX / Pythia (`gpt_neox.layers.{i}.*`): fused `query_key_value` (rows interleaved
/// per head, regrouped at load), LayerNorms with biases, untied `embed_out`.
pub static GPTNEOX_HF: NameTable = NameTable {
    layer_prefix: "gpt_neox.layers.{i}.",
    global: &[
        ("token_embd.weight", "gpt_neox.embed_in.weight"),
        ("output_norm.weight", "gpt_neox.final_layer_norm.weight"),
        ("output_norm.bias", "gpt_neox.final_layer_norm.bias"),
        ("output.weight", "embed_out.weight"),
    ],
    layer: &[
        ("attn_norm.weight", "input_layernorm.weight"),
        ("attn_norm.bias", "input_layernorm.bias"),
        ("attn_qkv.weight", "attention.query_key_value.weight"),
        ("attn_qkv.bias", "attention.query_key_value.bias"),
        ("attn_output.weight", "attention.dense.weight"),
        ("attn_output.bias", "attention.dense.bias"),
        ("ffn_norm.weight", "post_attention_layernorm.weight"),
        ("ffn_norm.bias", "post_attention_layernorm.bias"),
        ("ffn_up.weight", "mlp.dense_h_to_4h.weight"),
        ("ffn_up.bias", "mlp.dense_h_to_4h.bias"),
        ("ffn_down.weight", "mlp.dense_4h_to_h.weight"),
        ("ffn_down.bias", "mlp.dense_4h_to_h.bias"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_global_and_layer_names() {
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
}
