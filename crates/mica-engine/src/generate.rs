//! Generating text for one sequence: prompt processing in batches, then decoding through a
//! [`SequenceDecoder`] (logits processors, sampler, stop strings, finish rules, streamed
//! UTF-8-safe text), one token per forward pass, or several when a [`Proposer`] drafts
//! tokens to verify.

use crate::decoder::SequenceDecoder;
use crate::error::{EngineError, ParamError, Result};
use crate::processor::LogitsProcessor;
use crate::proposer::{Draft, Proposer};
use crate::sampler::SamplingParams;
use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::tokenizer::TokenStreamDecoder;
use mica_models::{Batch, KvCache, LayerOffload, LoadedModel, SeqId, Workspace};
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prompt tokens per forward pass (llama.cpp's default micro-batch).
pub const PROMPT_CHUNK: usize = 512;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// `(token, bias)`: added to the token's logit before the penalties and the sampler
    /// (a [`LogitBias`](crate::processor::LogitBias) processor).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            logit_bias: Vec::new(),
        }
    }
}

impl GenerateParams {
    /// Checks the sampling parameters and the logit bias (finite values, token ids below
    /// `n_vocab`), naming the parameter at fault.
    pub fn validate(&self, n_vocab: usize) -> std::result::Result<(), ParamError> {
        self.sampling.validate()?;
        for &(token, bias) in &self.logit_bias {
            if token as usize >= n_vocab {
                return Err(ParamError::LogitBiasToken { token, n_vocab });
            }
            if !bias.is_finite() {
                return Err(ParamError::LogitBiasValue { token, bias });
            }
        }
        Ok(())
    }
}

/// Why a request's completion length can't be resolved ([`completion_budget`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("the prompt has {tokens} tokens but the model's context holds {n_ctx}; shorten it")]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("at least 1 token must be generated, got 0")]
    Zero,
}

/// Tokens a completion of a `prompt_len`-token prompt may generate in a context of `n_ctx`:
/// `requested`, or all the room the prompt leaves when nothing was asked for. (A request for
/// more than the room is kept: generation then ends when the context is full.)
pub fn completion_budget(
    prompt_len: usize,
    n_ctx: usize,
    requested: Option<usize>,
) -> std::result::Result<usize, BudgetError> {
    if prompt_len >= n_ctx {
        return Err(BudgetError::PromptTooLong {
            tokens: prompt_len,
            n_ctx,
        });
    }
    match requested {
        Some(0) => Err(BudgetError::Zero),
        Some(n) => Ok(n),
        None => Ok(n_ctx - prompt_len),
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (included in the output ids, not in the text).
    Eos,
    /// A stop string (neither it nor what follows is in the text).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    Context,
    /// The caller asked to stop.
    Cancelled,
    /// A logits processor allows no further token: the output of a grammar constraint is
    /// complete (OpenAI-style APIs report it as `stop`).
    Constraint,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Constraint => "constraint",
        }
    }
}

/// Wall-clock timings of one generation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub gen_tokens: usize,
    pub gen_time: Duration,
    /// Forward passes of the generation (fewer than `gen_tokens` when drafts were accepted).
    pub gen_passes: usize,
    /// Drafted tokens verified (speculative decoding through a proposer).
    pub draft_tokens: usize,
    /// Of those, tokens accepted (each saved a forward pass).
    pub accepted_draft_tokens: usize,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }
    pub fn gen_tps(&self) -> f64 {
        self.gen_tokens as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
    /// Fraction of drafted tokens accepted (0 without drafts).
    pub fn acceptance(&self) -> f64 {
        self.accepted_draft_tokens as f64 / self.draft_tokens.max(1) as f64
    }
}

/// The result of a generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub output_ids: Vec<u32>,
    pub text: String,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// A model with a thread pool, a KV cache and buffers: runs generations for one sequence,
/// reusing the cached prefix of the previous conversation when the new prompt extends it.
///
/// `M` is how the session holds its model: a borrow (`Session<&LoadedModel>`, for a caller
/// that owns the model) or a shared handle (`Session<Arc<LoadedModel>>`, for one that hands
/// the session around on its own, as the `mica` facade and the bindings do).
pub struct Session<M: Deref<Target = LoadedModel> + Clone> {
    pub model: M,
    pool: Arc<ThreadPool>,
    kv: KvCache,
    ws: Workspace,
    seq: SeqId,
    /// Tokens whose keys and values are in the cache, in order.
    cached: Vec<u32>,
    /// Reused per call: the batch being evaluated and the logits it produced.
    batch: Batch,
    logits: Vec<f32>,
    /// The last layers and the head, when they run on a device ([`Session::offload`]).
    offload: Option<Box<dyn LayerOffload + Send>>,
}

impl<M: Deref<Target = LoadedModel> + Clone> Session<M> {
    /// A session with a context of `n_ctx` tokens on `n_threads` threads.
    pub fn new(model: M, n_ctx: usize, n_threads: usize) -> Session<M> {
        Self::with_pool(model, n_ctx, Arc::new(ThreadPool::new(n_threads)))
    }

    /// A session computing on `pool`, which it may share (with a draft model's proposer,
    /// say: the two never run at once).
    pub fn with_pool(model: M, n_ctx: usize, pool: Arc<ThreadPool>) -> Session<M> {
        Session {
            kv: KvCache::new(&model.model.config, n_ctx, 1),
            model,
            pool,
            ws: Workspace::default(),
            seq: 0,
            cached: Vec::new(),
            batch: Batch::new(),
            logits: Vec::new(),
            offload: None,
        }
    }

    /// Runs layers `offload.first_layer()..` and the output head through `offload` (a GPU,
    /// `mica_models::offload`) from now on; the cache is emptied and keeps the host layers'
    /// keys and values only. The offload's caches must hold the session's context
    /// (`n_ctx / BLOCK_SIZE` blocks, rounded up).
    pub fn offload(&mut self, offload: Box<dyn LayerOffload + Send>) {
        let cfg = &self.model.model.config;
        self.kv = KvCache::new_offloaded(cfg, self.kv.n_ctx(), 1, offload.first_layer());
        self.cached.clear();
        self.offload = Some(offload);
    }

    /// Ends the session, handing back its offload (if any) for a later session of the same
    /// model: the device keeps its weights, not the cached keys and values' meaning (a new
    /// session starts with an empty cache).
    pub fn into_offload(self) -> Option<Box<dyn LayerOffload + Send>> {
        self.offload
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// The session's thread pool, to share.
    pub fn shared_pool(&self) -> Arc<ThreadPool> {
        self.pool.clone()
    }

    /// Chooses attention's numeric path (see [`AttentionPolicy`]).
    pub fn set_attention_policy(&mut self, policy: AttentionPolicy) {
        self.ws.attention = policy;
    }

    /// Forgets the cache.
    pub fn reset(&mut self) {
        self.kv.clear(self.seq);
        self.cached.clear();
    }

    /// Runs `tokens` through the model after what is cached, in chunks, and returns the
    /// logits of every token when `all_logits`, else of the last one (`[n, n_vocab]`).
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        self.eval_into(tokens, all_logits)?;
        Ok(std::mem::take(&mut self.logits))
    }

    /// As [`Session::eval`], leaving the logits in `self.logits` (reused between calls, so
    /// decoding allocates nothing per token).
    fn eval_into(&mut self, tokens: &[u32], all_logits: bool) -> Result<()> {
        self.logits.clear();
        let n_chunks = tokens.len().div_ceil(PROMPT_CHUNK);
        for (i, chunk) in tokens.chunks(PROMPT_CHUNK).enumerate() {
            let start = self.kv.seq_len(self.seq);
            let want_last = all_logits || i + 1 == n_chunks;
            self.batch.clear();
            for (j, &t) in chunk.iter().enumerate() {
                let logits = all_logits || (want_last && j + 1 == chunk.len());
                self.batch.push(t, start + j, self.seq, logits);
            }
            // A session's step: one sequence, one lane (engine steps: `engine/step_trace.rs`).
            let _step = tracing::trace_span!("step", sequences = 1, tokens = chunk.len()).entered();
            let (model, kv, ws) = (&self.model.model, &mut self.kv, &mut self.ws);
            let logits = match self.offload.as_deref_mut() {
                Some(o) => model
                    .forward_offloaded(&self.pool, &self.batch, kv, ws, &mut || false, o)?
                    .expect("a pass that is never stopped"),
                None => model.forward(&self.pool, &self.batch, kv, ws)?,
            };
            self.logits.extend_from_slice(logits);
            self.cached.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// Forgets cached positions `len..` (e.g. drafted tokens the model did not confirm
    /// after an [`eval`](Session::eval) with logits at every position).
    pub fn truncate(&mut self, len: usize) {
        self.kv.truncate(self.seq, len);
        self.cached.truncate(len);
    }

    /// The tokens whose keys and values are cached, in order.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Generates a continuation of `prompt`. `on_text` receives text as it becomes final
    /// (whole UTF-8 characters, never part of a stop string); return `false` from it to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        self.generate_with(prompt, params, Hooks::default(), on_text)
    }

    /// [`Session::generate`] with extra logits processors (after the logit bias and the
    /// penalties) and a proposer whose drafts are verified several tokens per forward pass
    /// (greedy: the same tokens as without it; sampled: the same distribution, see
    /// [`crate::sampler`]).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        hooks: Hooks<'_>,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        params.validate(self.model.model.config.n_vocab)?;
        if prompt.is_empty() {
            return Err(ParamError::EmptyPrompt.into());
        }
        if self.kv.has_state() && hooks.proposer.is_some() {
            return Err(ParamError::DraftsOnRecurrentModel.into());
        }
        let n_ctx = self.kv.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(EngineError::PromptTooLong {
                tokens: prompt.len(),
                n_ctx,
            });
        }

        // Reuse the longest cached prefix; always recompute at least the last prompt token
        // so there are logits to sample from.
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        // A recurrent state cannot be cut back: a hybrid model reuses its cache only when
        // all of it is a prefix of the prompt (a follow-up turn), else starts afresh.
        let common = match self.kv.has_state() && common < self.cached.len() {
            true => 0,
            false => common,
        };
        self.truncate(common);

        let t0 = Instant::now();
        self.eval_into(&prompt[common..], false)?;
        let mut timings = Timings {
            prompt_tokens: prompt.len() - common,
            prompt_time: t0.elapsed(),
            ..Default::default()
        };

        // The last output token is never evaluated, so the history may reach n_ctx + 1.
        // A handle of our own (a copied borrow or a cloned `Arc`), so the decoder's borrow
        // of the tokenizer does not hold `self`.
        let model = self.model.clone();
        let mut dec = SequenceDecoder::new(&model.tokenizer, params, prompt, n_ctx + 1);
        for p in hooks.processors {
            dec.push_processor(p);
        }
        // Mirostat's truncation adapts after every token, which the verification rule
        // (`Sampler::verify`) does not model: mirostat runs without drafts.
        let mut proposer = hooks
            .proposer
            .filter(|_| params.sampling.mirostat.is_none());
        let mut text = String::new();
        // Each pass: `self.logits` holds a row per token of `[newest token, draft...]`, and
        // the cache every position up to the last of them.
        let (mut draft, mut chosen, mut step) = (Draft::default(), Vec::new(), Vec::new());
        let t1 = Instant::now();
        let finish = 'decode: loop {
            if params.max_tokens == 0 {
                break FinishReason::Length;
            }
            dec.choose_draft(&self.logits, &draft, &mut chosen);
            if !draft.is_empty() {
                timings.draft_tokens += draft.len();
                timings.accepted_draft_tokens += chosen.len() - 1;
            }
            for &token in &chosen {
                let c = dec.commit(token);
                if let Some(e) = c.undecodable {
                    return Err(e.into());
                }
                if !c.text.is_empty() {
                    text.push_str(&c.text);
                    if !on_text(&c.text) {
                        break 'decode FinishReason::Cancelled;
                    }
                }
                if let Some(f) = c.finish {
                    break 'decode f;
                }
            }
            // Keep the cache of the drafted tokens the model agreed with; the newest token
            // goes into the next pass with a new draft.
            let history = dec.history();
            let newest = history[history.len() - 1];
            self.truncate(history.len() - 1);
            draft.clear();
            if let Some(p) = proposer.as_deref_mut() {
                let max = dec.max_draft();
                if max > 0 {
                    draft = p.draft(history, max, dec.sampling());
                    draft.truncate(max);
                    dec.forced_draft(&mut draft);
                }
            }
            dec.prefetch(&draft.tokens);
            step.clear();
            step.push(newest);
            step.extend_from_slice(&draft.tokens);
            // A draft's step gets one-at-a-time decoding's arithmetic (and so its tokens).
            self.ws.alone_paths = !draft.is_empty();
            let evaluated = self.eval_into(&step, !draft.is_empty());
            self.ws.alone_paths = false;
            evaluated?;
            timings.gen_passes += 1;
        };
        if !draft.is_empty() {
            // The last pass ended the generation part-way through its draft: drop the cache
            // of the tokens after the newest one, as a one-token pass leaves it.
            self.truncate(dec.history().len() - 1);
        }
        let tail = dec.tail(finish);
        if !tail.is_empty() {
            text.push_str(&tail);
            on_text(&tail);
        }
        let output_ids = dec.generated().to_vec();
        timings.gen_tokens = output_ids.len();
        timings.gen_time = t1.elapsed();
        Ok(Generation {
            output_ids,
            text,
            finish,
            timings,
        })
    }
}

/// Extensions of one [`Session::generate_with`] call.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Run in order after the built-in processors (logit bias, penalties).
    pub processors: Vec<Box<dyn LogitsProcessor>>,
    /// Drafts tokens to verify several per forward pass.
    pub proposer: Option<&'a mut dyn Proposer>,
}

/// The decoder type, re-exported for callers that stream tokens themselves.
pub type StreamDecoder = TokenStreamDecoder;

#[cfg(test)]
mod tests {
    use super::{BudgetError, completion_budget};

    #[test]
    fn completion_budget_is_the_request_or_the_room_left() {
        assert_eq!(completion_budget(10, 100, Some(5)), Ok(5));
        assert_eq!(completion_budget(10, 100, Some(500)), Ok(500));
        assert_eq!(completion_budget(10, 100, None), Ok(90));
        assert_eq!(completion_budget(99, 100, None), Ok(1));
        assert_eq!(completion_budget(10, 100, Some(0)), Err(BudgetError::Zero));
        assert_eq!(
            completion_budget(100, 100, Some(1)),
            Err(BudgetError::PromptTooLong {
                tokens: 100,
                n_ctx: 100
            })
        );
    }
}
