//! The weights of one decoder layer ([`DecoderLayer`], its feed-forward [`Ffn`]) and the
//! walks over their matrices.

use super::{DeltaNet, Expert, LayerPle, Mla, Moe};
use crate::weights::{Linear, Matrix};

/// The weights of one transformer block (pre-norm attention + MLP, with the optional
/// pieces some families add: per-head Q/K norms, post-norms of both sub-blocks, LayerNorm
/// biases).
pub struct DecoderLayer {
    /// `[n_embd]`
    pub attn_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias (GPT-2, GPT-NeoX).
    pub attn_norm_b: Option<Vec<f32>>,
    /// `[head_dim]` RMSNorm of every query head before RoPE (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// `[head_dim]` RMSNorm of every key head before RoPE.
    pub k_norm: Option<Vec<f32>>,
    /// `[n_embd]` RMSNorm of the attention output before the residual add (Gemma).
    pub post_attn_norm: Option<Vec<f32>>,
    /// `[n_embd]` RMSNorm of the feed-forward output before the residual add (Gemma).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// `[q_dim × n_embd]`, optional bias `[q_dim]` (`[2 · q_dim × n_embd]` with `q_gate`);
    /// in a Gated DeltaNet layer (`delta`), its input projection, q | k | v
    /// (`[conv_dim × n_embd]`).
    pub wq: Linear,
    /// The query projection gives each head's query followed by as many gate values
    /// (`[n_head][2][head_dim]` rows); the attention output is multiplied by
    /// `sigmoid(gate)` before the output projection (Qwen3.5's gated attention).
    pub q_gate: bool,
    /// A Gated DeltaNet layer: this replaces attention (the layer has no `wk` / `wv`, stores
    /// no keys or values, and keeps a recurrent state in the cache); `wq` and `wo` are its
    /// input and output projections.
    pub delta: Option<DeltaNet>,
    /// A latent-attention layer (DeepSeek-V2's MLA): `wq` is its query projection (`q_b`
    /// after the low-rank `q_a`, or direct), `wo` its output; it has no `wk` / `wv` and caches
    /// one latent row per token ([`crate::config::MlaConfig`]).
    pub mla: Option<Mla>,
    /// `[kv_dim × n_embd]`; `None` in a layer that attends over an earlier layer's keys
    /// and values ([`crate::ModelConfig::layer_kv_from`]) and computes none.
    pub wk: Option<Linear>,
    /// `[kv_dim × n_embd]`; `None`: the values are the key projection's output, taken
    /// before `k_norm` (Gemma 4's global layers, `attention_k_eq_v`).
    pub wv: Option<Linear>,
    /// `[head_dim]` all ones: RMSNorm of every value head with no weight (Gemma 4).
    pub v_norm: Option<Vec<f32>>,
    /// Multiplies the residual stream after the layer (Gemma 4's `layer_scalar`).
    pub out_scale: Option<f32>,
    /// The layer's per-layer-embedding term (Gemma 4's smaller models), added after the
    /// feed-forward residual, before `out_scale`.
    pub ple: Option<LayerPle>,
    /// `[n_head]` attention sinks: a learned logit per query head in the softmax's
    /// denominator (gpt-oss; [`crate::blocks::sinks`]).
    pub sinks: Option<Vec<f32>>,
    /// `[n_embd × q_dim]` (`[n_embd × value_dim]` in a Gated DeltaNet layer)
    pub wo: Linear,
    /// `[n_embd]`
    pub ffn_norm: Vec<f32>,
    /// `[n_embd]` LayerNorm bias.
    pub ffn_norm_b: Option<Vec<f32>>,
    pub ffn: Ffn,
}

/// The feed-forward sub-block of a layer. (One per layer, built once: the size difference
/// between the variants costs nothing.)
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    /// `down(act(gate(x)) * up(x))`, `[n_ff × n_embd]` gate and up, `[n_embd × n_ff]` down.
    Dense(Expert),
    /// Routed experts (and a shared one), see [`Moe`].
    Moe(Moe),
    /// `down(act(up(x)))`, `[n_ff × n_embd]` up, `[n_embd × n_ff]` down (GPT-2, GPT-NeoX).
    Plain { up: Linear, down: Linear },
}

/// The weight matrices of one layer, mutably.
pub(super) fn layer_matrices_mut(l: &mut DecoderLayer) -> impl Iterator<Item = &mut Matrix> {
    let delta = l
        .delta
        .iter_mut()
        .flat_map(|d| [&mut d.z, &mut d.beta, &mut d.alpha]);
    let attn = [
        Some(&mut l.wq),
        l.wk.as_mut(),
        l.wv.as_mut(),
        Some(&mut l.wo),
    ]
    .into_iter()
    .flatten()
    .chain(delta)
    .chain(l.mla.iter_mut().flat_map(Mla::linears_mut))
    .map(|lin| &mut lin.w);
    let ffn: Vec<&mut Matrix> = match &mut l.ffn {
        Ffn::Dense(e) => vec![&mut e.gate.w, &mut e.up.w, &mut e.down.w],
        Ffn::Moe(m) => std::iter::once(&mut m.router.w)
            .chain(
                m.experts
                    .iter_mut()
                    .chain(&mut m.shared)
                    .flat_map(|e| [&mut e.gate.w, &mut e.up.w, &mut e.down.w]),
            )
            .chain(m.shared_gate.as_mut().map(|g| &mut g.w))
            .collect(),
        Ffn::Plain { up, down } => vec![&mut up.w, &mut down.w],
    };
    let ple = l
        .ple
        .iter_mut()
        .flat_map(|p| [&mut p.gate.w, &mut p.proj.w]);
    attn.into_iter().chain(ffn).chain(ple)
}

/// The three matrices of an expert.
pub(super) fn expert_matrices(e: &Expert) -> [&Matrix; 3] {
    [&e.gate.w, &e.up.w, &e.down.w]
}

/// The projections of one layer that run through [`Linear::apply`] (not experts).
pub(super) fn layer_linears(l: &DecoderLayer) -> Vec<&Linear> {
    let delta = l.delta.iter().flat_map(|d| [&d.z, &d.beta, &d.alpha]);
    let ffn: Vec<&Linear> = match &l.ffn {
        Ffn::Dense(e) => vec![&e.gate, &e.up, &e.down],
        Ffn::Plain { up, down } => vec![up, down],
        Ffn::Moe(_) => Vec::new(),
    };
    let ple = l.ple.iter().flat_map(|p| [&p.gate, &p.proj]);
    [Some(&l.wq), l.wk.as_ref(), l.wv.as_ref(), Some(&l.wo)]
        .into_iter()
        .flatten()
        .chain(delta)
        .chain(ffn)
        .chain(ple)
        .collect()
}
