//! The forward pass's reusable buffers ([`Workspace`]) and what it returns ([`Output`]).

use crate::blocks::attention::AttentionPolicy;
use crate::blocks::deltanet::DeltaBufs;
use crate::config::ModelConfig;
use crate::kv_cache::SeqId;
use crate::lora::LoraSelection;
use crate::weights::ActCache;
use std::sync::Arc;

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
    /// LoRA adapters of the sequences that run with some ([`LoraSelection`]), set before a
    /// pass: each projection adds each adapter's update to the rows of the sequences that
    /// chose it (adapters attached to the model apply to every row as well).
    pub lora: Vec<(SeqId, Arc<LoraSelection>)>,
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

impl Workspace {
    /// An upper estimate of the bytes the forward pass's buffers reach for `cfg` with
    /// batches of up to `n_tok` tokens, `n_out` of them producing outputs, over contexts of
    /// up to `n_ctx` positions: this workspace's buffers (feed-forward rows in chunks of
    /// [`FFN_CHUNK`](crate::model::FFN_CHUNK)), the quantized activations (at most two
    /// formats, 4 bytes an element to cover float weights), and attention's per-sequence
    /// gathered keys and values (`[n_ctx][kv_dim]` each, f32 at most). `ple_width` is the
    /// per-layer embedding inputs' width (`n_layer · dim`; 0 for models without them).
    /// Latent attention's buffers are counted where the model has it.
    pub fn estimate_bytes(
        cfg: &ModelConfig,
        ple_width: usize,
        n_tok: usize,
        n_out: usize,
        n_ctx: usize,
    ) -> usize {
        let n = n_tok.max(1);
        let d = cfg.n_embd;
        let (qd, kvd) = (cfg.max_q_dim(), cfg.max_kv_dim());
        let ff = (0..cfg.n_layer).map(|l| cfg.n_ff_of(l)).max().unwrap_or(0);
        let rows = n.min(crate::model::FFN_CHUNK);
        // `up` also holds a gated attention's fused query and gate (`[n, 2·q_dim]`).
        let gate_up = rows * ff + (rows * ff).max(n * 2 * qd);
        let delta = cfg.delta_net.as_ref().map_or(0, |c| {
            n * (c.conv_dim() + c.value_dim() + 2 * c.n_v_heads) + c.conv_dim() + c.head_v_dim
        });
        // Latent attention's own buffers (`blocks::mla`): queries, the query's low-rank
        // input, the projected and the cached latent rows, the absorbed queries, the latent
        // outputs, one head's input and output.
        let mla = cfg.mla.as_ref().map_or(0, |m| {
            let h = cfg.n_head;
            let per_head = m.qk_nope.max(m.kv_lora_rank) + m.kv_lora_rank.max(m.v_head_dim);
            n * (h * m.qk_head_dim()
                + m.q_lora_rank.unwrap_or(0)
                + m.latent_dim()
                + 2 * m.half()
                + h * m.latent_dim()
                + h * m.kv_lora_rank
                + per_head)
        });
        let floats = 3 * n * d
            + 2 * n * qd
            + 2 * n * kvd
            + gate_up
            + n_out.max(1) * cfg.n_vocab
            + delta
            + mla
            + n * ple_width;
        let acts = 2 * n * d.max(ff).max(qd) * 4;
        let gather = 2 * n_ctx * kvd * 4;
        4 * floats + acts + gather
    }

    /// Bytes this workspace's f32 buffers hold now (their capacity): what
    /// [`Workspace::estimate_bytes`] bounds, without the quantized activations and
    /// attention's thread-local buffers.
    pub fn buffer_bytes(&self) -> usize {
        let bufs = [
            &self.x,
            &self.xn,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.proj,
            &self.gate,
            &self.up,
            &self.logits,
            &self.cos_sin,
            &self.ple,
        ];
        4 * bufs.iter().map(|b| b.capacity()).sum::<usize>() + self.delta.buffer_bytes()
    }
}

pub(crate) fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}
