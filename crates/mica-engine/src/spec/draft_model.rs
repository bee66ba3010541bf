//! A draft model: a smaller (or truncated, or more coarsely quantized) model with the
//! target's vocabulary guesses the next tokens, one cheap forward pass each.
//!
//! The draft keeps its own KV cache of the sequence. Each request for a draft first brings
//! that cache in step with the history: the longest common prefix of what it has cached and
//! the history is kept (so the drafted tokens the target accepted stay, and the rejected
//! ones are rolled back), the rest of the history is evaluated in one pass, then up to `max`
//! tokens are drafted one pass each — stopping early when the draft model's most likely
//! token falls below [`DraftModelConfig::p_min`] (llama.cpp's `--draft-p-min`: a draft the
//! model itself doubts is rarely accepted).
//!
//! Greedy sequences get the draft model's greedy tokens (point masses). Sampled sequences
//! get tokens drawn from the draft model's distribution under the request's truncation and
//! temperature (top-k, top-p, min-p; no penalties), reported with it, so the decoder's
//! rejection rule keeps the target's distribution; the draws come from the draft's own
//! ChaCha20 stream, seeded from the request's seed but independent of the target's, so a
//! seed gives the same tokens every time. With [`DraftModelConfig::sample`] off, sampled
//! sequences get greedy drafts too (point masses: the tokens are then plain sampling's).
//!
//! The vocabularies are checked when the proposer is made ([`check_vocab`], after
//! llama.cpp's `common_speculative_are_compatible`): same tokenizer kind, sizes within 128
//! tokens (padding), and the same text for every token id both have.

use crate::error::{EngineError, SpecError};
use crate::proposer::{Draft, Proposer};
use crate::sampler::{Sampler, SamplingParams, argmax, draw_probs};
use mica_kernels::ThreadPool;
use mica_models::tokenizer::Tokenizer;
use mica_models::{Batch, KvCache, LoadedModel, Workspace};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::sync::Arc;

/// Most tokens two compatible vocabularies may differ by (llama.cpp's
/// `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`).
pub const MAX_VOCAB_DIFFERENCE: usize = 128;

/// Settings of a [`DraftModelProposer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftModelConfig {
    /// Positions the draft model's cache holds (the target's context).
    pub n_ctx: usize,
    /// Stop drafting at a token the draft model gives less than this probability.
    pub p_min: f32,
    /// Sample drafts for sampled sequences (with their distributions); off: greedy drafts.
    pub sample: bool,
}

impl Default for DraftModelConfig {
    fn default() -> Self {
        DraftModelConfig {
            n_ctx: 4096,
            p_min: 0.75,
            sample: true,
        }
    }
}

/// Checks that token ids mean the same text to both tokenizers.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), SpecError> {
    if target.kind() != draft.kind() {
        return Err(SpecError::VocabKind {
            target: format!("{:?}", target.kind()),
            draft: format!("{:?}", draft.kind()),
        });
    }
    let (nt, nd) = (target.vocab_size(), draft.vocab_size());
    if nt.abs_diff(nd) > MAX_VOCAB_DIFFERENCE {
        return Err(SpecError::VocabSize {
            target: nt,
            draft: nd,
        });
    }
    for id in 0..nt.min(nd) as u32 {
        let (a, b) = (target.token_text(id), draft.token_text(id));
        if a != b {
            return Err(SpecError::Token {
                id,
                target: a.unwrap_or("").to_string(),
                draft: b.unwrap_or("").to_string(),
            });
        }
    }
    Ok(())
}

/// A proposal distribution: `(token, probability)` pairs (see [`Draft::dists`]).
type Dist = Vec<(u32, f32)>;

/// Drafts with a second model (module docs).
pub struct DraftModelProposer {
    model: Arc<LoadedModel>,
    pool: Arc<ThreadPool>,
    kv: KvCache,
    ws: Workspace,
    batch: Batch,
    /// Tokens whose keys and values are in the draft's cache.
    cached: Vec<u32>,
    /// Drafted ids must be below this (the target's logits width).
    n_vocab: usize,
    cfg: DraftModelConfig,
    /// For sampled drafts: the request's chain (without penalties) and the draft's stream.
    sampling: Option<(Sampler, ChaCha20Rng)>,
    /// The last forward pass failed: no more drafts.
    error: Option<EngineError>,
}

impl DraftModelProposer {
    /// A proposer running `draft` for `target` on `pool` (which it may share with the
    /// target: the two never compute at once). Fails when the vocabularies differ, or when
    /// the draft keeps a recurrent state (which cannot be rolled back).
    pub fn new(
        draft: Arc<LoadedModel>,
        target: &LoadedModel,
        pool: Arc<ThreadPool>,
        cfg: DraftModelConfig,
    ) -> Result<DraftModelProposer, SpecError> {
        check_vocab(&target.tokenizer, &draft.tokenizer)?;
        if draft.model.config.has_recurrent_state() {
            return Err(SpecError::RecurrentDraft);
        }
        Ok(DraftModelProposer {
            kv: KvCache::new(&draft.model.config, cfg.n_ctx.max(2), 1),
            model: draft,
            pool,
            ws: Workspace::default(),
            batch: Batch::new(),
            cached: Vec::new(),
            n_vocab: target.model.config.n_vocab,
            cfg,
            sampling: None,
            error: None,
        })
    }

    /// Why drafting stopped, if a forward pass of the draft model failed.
    pub fn error(&self) -> Option<&EngineError> {
        self.error.as_ref()
    }

    /// Evaluates `tokens` after the cache; the logits of the last one.
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        for (i, chunk) in tokens.chunks(crate::generate::PROMPT_CHUNK).enumerate() {
            let start = self.kv.seq_len(0);
            let last = (i + 1) * crate::generate::PROMPT_CHUNK >= tokens.len();
            self.batch.clear();
            for (j, &t) in chunk.iter().enumerate() {
                self.batch
                    .push(t, start + j, 0, last && j + 1 == chunk.len());
            }
            let out =
                self.model
                    .model
                    .forward(&self.pool, &self.batch, &mut self.kv, &mut self.ws)?;
            if last {
                logits = out.to_vec();
            }
            self.cached.extend_from_slice(chunk);
        }
        Ok(logits)
    }

    /// The next drafted token from `logits` and its proposal distribution (`None`: a
    /// greedy guess), or `None` when the draft model doubts it (below `p_min`).
    fn pick(&mut self, logits: &[f32]) -> Option<(u32, Option<Dist>)> {
        let Some((sampler, rng)) = &mut self.sampling else {
            let t = argmax(logits);
            let top = logits[t as usize];
            let sum: f64 = logits.iter().map(|&l| ((l - top) as f64).exp()).sum();
            return (1.0 / sum >= self.cfg.p_min as f64).then_some((t, None));
        };
        let q: Vec<(u32, f32)> = sampler
            .distribution(logits)
            .into_iter()
            .filter(|c| (c.0 as usize) < self.n_vocab)
            .map(|(t, p)| (t, p as f32))
            .collect();
        let top = q.first()?.1;
        if top < self.cfg.p_min {
            return None;
        }
        let w: Vec<(u32, f64)> = q.iter().map(|&(t, p)| (t, p as f64)).collect();
        let total: f64 = w.iter().map(|c| c.1).sum();
        let u: f64 = rng.random();
        Some((draw_probs(&w, u * total), Some(q)))
    }

    fn run(&mut self, history: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        let room = self.kv.n_ctx().saturating_sub(history.len());
        let max = max.min(room);
        if max == 0 || history.is_empty() {
            return Ok(());
        }
        let common = self
            .cached
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count()
            .min(history.len() - 1);
        self.kv.truncate(0, common);
        self.cached.truncate(common);
        let mut logits = self.eval(&history[common..])?;
        for i in 0..max {
            let Some((t, q)) = self.pick(&logits) else {
                break;
            };
            if t as usize >= self.n_vocab {
                break;
            }
            out.tokens.push(t);
            if let Some(q) = q {
                out.dists.push(q);
            }
            if i + 1 < max {
                logits = self.eval(&[t])?;
            }
        }
        Ok(())
    }
}

/// A seed for the draft's own stream, independent of the target's streams of `seed`.
fn draft_seed(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03
}

impl Proposer for DraftModelProposer {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.draft(history, max, &SamplingParams::greedy()).tokens
    }

    fn draft(&mut self, history: &[u32], max: usize, sampling: &SamplingParams) -> Draft {
        let mut out = Draft::default();
        if self.error.is_some() {
            return out;
        }
        if self.cfg.sample && !sampling.is_greedy() {
            let fresh = self
                .sampling
                .as_ref()
                .is_none_or(|(s, _)| s.params().seed != draft_seed(sampling.seed));
            if fresh {
                let params = SamplingParams {
                    repeat_penalty: 1.0,
                    presence_penalty: 0.0,
                    frequency_penalty: 0.0,
                    seed: draft_seed(sampling.seed),
                    ..sampling.clone()
                };
                let rng = ChaCha20Rng::seed_from_u64(params.seed);
                self.sampling = Some((Sampler::new(params), rng));
            }
        } else {
            self.sampling = None;
        }
        if let Err(e) = self.run(history, max, &mut out) {
            // The cache may be part-way through a pass: start from scratch next time.
            self.kv.truncate(0, 0);
            self.cached.clear();
            self.error = Some(e);
            out.clear();
        }
        out
    }
}
