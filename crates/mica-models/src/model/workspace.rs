//! The forward pass's reusable buffers ([`Workspace`]) and what it returns ([`Output`]).

use crate::blocks::attention::AttentionPolicy;
use crate::blocks::deltanet::DeltaBufs;
use crate::kv_cache::SeqId;
use crate::weights::ActCache;

/// Reusable buffers of the forward pass, grown to the largest batch seen.
#[derive(Default)]
pub struct Workspace {
    /// `[n_tok, n_embd]` residual stream
    pub(super) x: Vec<f32>,
    /// `[n_tok, n_embd]` normed input of a sub-block
    pub(super) xn: Vec<f32>,
    /// `[n_tok, q_dim]`
    pub(super) q: Vec<f32>,
    /// `[n_tok, kv_dim]`
    pub(super) k: Vec<f32>,
    /// `[n_tok, kv_dim]`
    pub(super) v: Vec<f32>,
    /// `[n_tok, q_dim]`
    pub(super) attn: Vec<f32>,
    /// `[n_tok, n_embd]` output of a projection back into the residual stream
    pub(super) proj: Vec<f32>,
    /// Gated DeltaNet buffers.
    pub(super) delta: DeltaBufs,
    /// `[n_tok, n_ff]`
    pub(super) gate: Vec<f32>,
    /// `[n_tok, n_ff]`
    pub(super) up: Vec<f32>,
    /// `[n_out, n_vocab]`
    pub(super) logits: Vec<f32>,
    /// `[rope n_dims]` cos/sin pairs of one position
    pub(super) cos_sin: Vec<f32>,
    /// `[n_tok, n_layer · ple dim]` per-layer embedding inputs
    pub(super) ple: Vec<f32>,
    /// Batch rows that produce logits.
    pub(super) out_rows: Vec<usize>,
    /// The attention path to take (llama.cpp's choice by default).
    pub attention: AttentionPolicy,
    /// Sequences whose tokens take attention's tiled path however few of them the batch
    /// holds (with [`AttentionPolicy::PerSequence`]; see there).
    pub tiled_seqs: Vec<SeqId>,
    /// Tokens per feed-forward chunk; `None` is [`FFN_CHUNK`]. Tests set `usize::MAX` to
    /// run a whole batch at once.
    pub ffn_chunk: Option<usize>,
    /// Give every token the matrix arithmetic of a one-token batch (llama.cpp's kernels
    /// pick their code path, and so their rounding, by batch size): a speculative
    /// verification step — the last token and its drafts, under attention's tiled-path
    /// threshold — then yields exactly the logits of one-at-a-time decoding. Dense layers
    /// only (mixture-of-experts layers keep their batch paths).
    pub alone_paths: bool,
    /// What the forward pass returns for its output rows: logits (the default) or the
    /// final hidden states, for embeddings.
    pub output: Output,
    pub(super) acts: ActCache,
}

/// What [`Model::forward`] returns for the tokens whose `logits` flag is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// `[n_out, n_vocab]` logits.
    #[default]
    Logits,
    /// `[n_out, n_embd]` hidden states after the output norm, the output layer skipped:
    /// what llama.cpp pools into embeddings (its `t_embd`).
    Hidden,
}

impl Workspace {
    /// Starts collecting importance statistics (mean squared input per column of every
    /// projection) in the following forward passes; see [`crate::weights::ActStats`].
    pub fn collect_act_stats(&mut self) {
        self.acts.stats.get_or_insert_with(Default::default);
    }

    /// Like [`Workspace::collect_act_stats`], gathering each input's Gram matrix as well
    /// ([`crate::weights::ActStats::with_grams`]).
    pub fn collect_act_grams(&mut self) {
        self.acts.stats = Some(crate::weights::ActStats::with_grams());
    }

    /// The statistics collected so far (collection stops).
    pub fn take_act_stats(&mut self) -> Option<crate::weights::ActStats> {
        self.acts.stats.take()
    }
}

pub(crate) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}
