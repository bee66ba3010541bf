//! What a model will take in memory once it runs, estimated before its weights are read.
//!
//! A front end opens the model without preparing it ([`crate::LoadOptions::READ_ONLY`]: the
//! header parsed, the tokenizer built, the weights only mapped) and asks [`MemoryEstimate`]
//! what running it will need, so that a model that cannot fit is refused before anything
//! is read. The parts follow where the bytes live:
//!
//! - **weights** ([`WeightFootprint`]): the matrices products read in the file's layout
//!   (mapped pages, resident once the first forward pass has touched them), the copies
//!   [`Model::repack`] makes in this CPU's packed layouts (the file's pages of those are
//!   given back as each matrix is packed, so they count once), and embedding tables that
//!   are only looked up a row per token (listed, not counted: a row's page is read when a
//!   token on it is first seen);
//! - **KV cache**: [`KvCache::bytes_per_block`] per block, for every position of every
//!   sequence ([`KvSizing::Context`]) or for a pool the engine sized ([`KvSizing::Pool`]);
//! - **recurrent state** of a hybrid model: [`KvCache::state_bytes_per_seq`] per state;
//! - **compute**: the forward pass's buffers ([`Workspace::estimate_bytes`]);
//! - **runtime**: the process before the weights are read (executable, libraries,
//!   tokenizer, the parsed header), which the caller measures (its resident set right
//!   after opening) and passes in.
//!
//! The KV cache and buffers are allocated zeroed and become resident as they are written:
//! the estimate is what a run at full context needs, and
//! [`MemoryEstimate::expected_resident`] what should be resident after fewer positions.

use crate::kv_cache::{BLOCK_SIZE, KvCache};
use crate::model::{Model, Workspace};
use crate::stream::LayerStream;
use std::fmt;

/// A model's weight matrices by how they occupy memory ([`Model::weight_footprint`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightFootprint {
    /// Matrices products read in the file's layout (through the memory map, or held in
    /// memory for tensors rearranged at load): resident once the first forward pass has
    /// read them.
    pub mapped: usize,
    /// Copies in this CPU's packed layouts ([`Model::repack`]), in anonymous memory; the
    /// file's pages of those matrices are given back as each is packed.
    pub repacked: usize,
    /// Embedding tables only looked up a row per token (the token embedding, position and
    /// per-layer embeddings): a page becomes resident when a token on it is first read, so
    /// they take a fraction of their size that grows with the vocabulary a run uses.
    pub on_demand: usize,
    /// Matrices of streamed layers ([`crate::stream`]): read from the file each pass, not
    /// resident (not counted).
    pub streamed: usize,
    /// The streaming ring's buffers: resident.
    pub stream_buffers: usize,
}

impl Model {
    /// The weight matrices' bytes by how they will stay in memory once the model is
    /// prepared with `repack` ([`Model::repack`]); see [`WeightFootprint`].
    pub fn weight_footprint(&self, repack: bool) -> WeightFootprint {
        let lookups = [Some(&self.tok_embd), self.pos_embd.as_ref()]
            .into_iter()
            .chain([self.ple.as_ref().map(|p| &p.tok)])
            .flatten()
            .collect::<Vec<_>>();
        // `matrices` lists a tied head once, as the token embedding; products read it
        // through `output`, which repacking copies.
        let tied_head = (self.output.w.name == self.tok_embd.name).then_some(&self.output.w);
        let mut f = WeightFootprint {
            stream_buffers: self.stream.as_ref().map_or(0, LayerStream::buffer_bytes),
            ..WeightFootprint::default()
        };
        for m in self.matrices().chain(tied_head) {
            if m.is_streamed() {
                f.streamed += m.n_bytes();
                continue;
            }
            if lookups.iter().any(|l| std::ptr::eq(*l, m)) {
                f.on_demand += m.n_bytes();
                continue;
            }
            match m.repacked_len().filter(|_| repack || m.is_repacked()) {
                Some(n) => f.repacked += n,
                None => f.mapped += m.n_bytes(),
            }
        }
        f
    }
}

/// How the KV cache is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSizing {
    /// Room for `n_ctx` positions of each of `n_seq` sequences (one recurrent state each).
    Context { n_ctx: usize, n_seq: usize },
    /// A pool of `blocks` blocks and `states` recurrent states (running sequences plus
    /// checkpoints), as an engine's memory plan sizes them.
    Pool { blocks: usize, states: usize },
}

/// What the estimate is for.
#[derive(Clone, Copy, Debug)]
pub struct EstimateParams {
    /// The weights will be repacked ([`crate::LoadOptions::repack`]).
    pub repack: bool,
    pub kv: KvSizing,
    /// Positions one sequence may reach (sizes attention's gathered keys and values).
    pub n_ctx: usize,
    /// Most tokens in one forward pass (a prompt chunk, or a serving step's budget).
    pub batch_tokens: usize,
    /// Most tokens of one pass that produce logits.
    pub n_outputs: usize,
    /// Bytes resident in the process before the weights are read (see the module docs).
    pub runtime: usize,
}

/// A model's memory needs, by part ([`crate::memory`]). Displays in MiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    pub weights: WeightFootprint,
    /// Every block of the cache, keys and values.
    pub kv_cache: usize,
    /// Recurrent states of a hybrid model (0 for attention-only models).
    pub recurrent_state: usize,
    /// The forward pass's buffers.
    pub compute: usize,
    /// The process before the weights are read, as measured by the caller.
    pub runtime: usize,
}

impl MemoryEstimate {
    /// The estimate for `model` opened but not yet prepared (a model already repacked
    /// counts its packed copies whatever `params.repack` says).
    pub fn new(model: &Model, params: &EstimateParams) -> MemoryEstimate {
        let cfg = &model.config;
        let (blocks, states) = match params.kv {
            KvSizing::Context { n_ctx, n_seq } => {
                (n_seq.max(1) * n_ctx.div_ceil(BLOCK_SIZE), n_seq.max(1))
            }
            KvSizing::Pool { blocks, states } => (blocks, states),
        };
        MemoryEstimate {
            weights: model.weight_footprint(params.repack),
            kv_cache: blocks * KvCache::bytes_per_block(cfg),
            recurrent_state: states * KvCache::state_bytes_per_seq(cfg),
            compute: compute_bytes(model, params.batch_tokens, params.n_outputs, params.n_ctx),
            runtime: params.runtime,
        }
    }

    /// Bytes of weights counted: mapped, repacked and the streaming ring's buffers
    /// (embedding tables read on demand and streamed layers are not).
    pub fn weight_bytes(&self) -> usize {
        self.weights.mapped + self.weights.repacked + self.weights.stream_buffers
    }

    /// Everything counted: weights, KV cache, recurrent state, compute and runtime.
    pub fn total(&self) -> usize {
        self.weight_bytes() + self.kv_cache + self.recurrent_state + self.compute + self.runtime
    }

    /// What should be resident once the weights have been read, `kv_in_use` bytes of the
    /// KV cache written (the rest of the cache is allocated but untouched) and the forward
    /// pass's buffers grown to `compute_in_use` bytes ([`compute_bytes`] of the batches run
    /// so far; 0 before any).
    pub fn expected_resident(&self, kv_in_use: usize, compute_in_use: usize) -> usize {
        self.weight_bytes()
            + kv_in_use.min(self.kv_cache)
            + self.recurrent_state
            + compute_in_use.min(self.compute)
            + self.runtime
    }
}

/// Bytes of the forward pass's buffers for batches of up to `n_tok` tokens, `n_out` of
/// them producing outputs, over up to `n_ctx` positions ([`Workspace::estimate_bytes`]).
pub fn compute_bytes(model: &Model, n_tok: usize, n_out: usize, n_ctx: usize) -> usize {
    let ple_width = model.ple.as_ref().map_or(0, |p| p.proj.out_dim());
    Workspace::estimate_bytes(&model.config, ple_width, n_tok, n_out, n_ctx)
}

/// Bytes of KV cache that `positions` positions of one sequence occupy (whole blocks).
pub fn kv_bytes_for_positions(model: &Model, positions: usize) -> usize {
    positions.div_ceil(BLOCK_SIZE) * KvCache::bytes_per_block(&model.config)
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streamed = match self.weights.streamed {
            0 => String::new(),
            s => format!(
                ", ring {} for {} of streamed layers",
                mib(self.weights.stream_buffers),
                mib(s)
            ),
        };
        write!(
            f,
            "weights {} (mapped {}, repacked {}{streamed}) + KV cache {} + recurrent state {} + \
             compute {} + runtime {} = {}",
            mib(self.weight_bytes()),
            mib(self.weights.mapped),
            mib(self.weights.repacked),
            mib(self.kv_cache),
            mib(self.recurrent_state),
            mib(self.compute),
            mib(self.runtime),
            mib(self.total()),
        )?;
        if self.weights.on_demand > 0 {
            write!(
                f,
                " (not counted: embedding tables read a row per token, {})",
                mib(self.weights.on_demand)
            )?;
        }
        Ok(())
    }
}
