//! Generating text for one sequence: prompt processing in batches, then token-by-token
//! decoding with a sampler, stop conditions (end-of-generation tokens, stop strings, token
//! limit, full context) and streamed UTF-8-safe text.

use crate::error::{EngineError, Result};
use crate::sampler::{Sampler, SamplingParams};
use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::tokenizer::{DecodeOptions, TokenStreamDecoder};
use mica_models::{Batch, KvCache, LoadedModel, SeqId, Workspace};
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
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
        }
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
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Context => "context",
            FinishReason::Cancelled => "cancelled",
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
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }
    pub fn gen_tps(&self) -> f64 {
        self.gen_tokens as f64 / self.gen_time.as_secs_f64().max(1e-9)
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
pub struct Session<'m> {
    pub model: &'m LoadedModel,
    pool: ThreadPool,
    kv: KvCache,
    ws: Workspace,
    seq: SeqId,
    /// Tokens whose keys and values are in the cache, in order.
    cached: Vec<u32>,
    /// Reused per call: the batch being evaluated and the logits it produced.
    batch: Batch,
    logits: Vec<f32>,
}

impl<'m> Session<'m> {
    /// A session with a context of `n_ctx` tokens on `n_threads` threads.
    pub fn new(model: &'m LoadedModel, n_ctx: usize, n_threads: usize) -> Session<'m> {
        Session {
            model,
            pool: ThreadPool::new(n_threads),
            kv: KvCache::new(&model.model.config, n_ctx, 1),
            ws: Workspace::default(),
            seq: 0,
            cached: Vec::new(),
            batch: Batch::new(),
            logits: Vec::new(),
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
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
            let logits =
                self.model
                    .model
                    .forward(&self.pool, &self.batch, &mut self.kv, &mut self.ws)?;
            self.logits.extend_from_slice(logits);
            self.cached.extend_from_slice(chunk);
        }
        Ok(())
    }

    /// Generates a continuation of `prompt`. `on_text` receives text as it becomes final
    /// (whole UTF-8 characters, never part of a stop string); return `false` from it to stop.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        params.sampling.validate().map_err(EngineError::Params)?;
        if prompt.is_empty() {
            return Err(EngineError::Params("the prompt is empty".into()));
        }
        let n_ctx = self.kv.n_ctx();
        if prompt.len() >= n_ctx {
            return Err(EngineError::PromptTooLong {
                tokens: prompt.len(),
                n_ctx,
            });
        }
        let tok = &self.model.tokenizer;

        // Reuse the longest cached prefix; always recompute at least the last prompt token
        // so there are logits to sample from.
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        self.kv.truncate(self.seq, common);
        self.cached.truncate(common);

        let t0 = Instant::now();
        self.eval_into(&prompt[common..], false)?;
        let mut timings = Timings {
            prompt_tokens: prompt.len() - common,
            prompt_time: t0.elapsed(),
            ..Default::default()
        };

        let mut sampler = Sampler::new(params.sampling.clone());
        let mut history: Vec<u32> = prompt.to_vec();
        let mut output_ids = Vec::new();
        let mut decoder = tok.stream_decoder(DecodeOptions { skip_special: true });
        let mut stops = StopMatcher::new(&params.stop);
        let mut text = String::new();
        let t1 = Instant::now();
        let finish = loop {
            if output_ids.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            let next = sampler.sample(&self.logits, &history);
            output_ids.push(next);
            history.push(next);
            if !params.ignore_eos && tok.is_eog(next) {
                break FinishReason::Eos;
            }
            let piece = decoder.push(next)?;
            let (ready, hit) = stops.push(&piece);
            text.push_str(&ready);
            if !ready.is_empty() && !on_text(&ready) {
                break FinishReason::Cancelled;
            }
            if hit {
                break FinishReason::Stop;
            }
            if output_ids.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            if self.kv.seq_len(self.seq) + 1 > n_ctx {
                break FinishReason::Context;
            }
            self.eval_into(&[next], false)?;
        };
        if !matches!(finish, FinishReason::Stop | FinishReason::Cancelled) {
            let tail = stops.flush(&decoder.finish());
            if !tail.is_empty() {
                text.push_str(&tail);
                on_text(&tail);
            }
        }
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

/// Holds back text that might be the start of a stop string.
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub(crate) fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.to_vec(),
            pending: String::new(),
        }
    }

    /// Adds text; returns what is safe to emit and whether a stop string was found (in which
    /// case the returned text ends right before it).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        let stops = self.stops.iter().filter(|s| !s.is_empty());
        if let Some(at) = stops.filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let suffix = &self.pending[i..];
                if suffix.len() <= keep {
                    break;
                }
                if s.starts_with(suffix) {
                    keep = suffix.len();
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Everything still held back, plus `tail`.
    pub(crate) fn flush(&mut self, tail: &str) -> String {
        let mut s = std::mem::take(&mut self.pending);
        s.push_str(tail);
        s
    }
}

/// The decoder type, re-exported for callers that stream tokens themselves.
pub type StreamDecoder = TokenStreamDecoder;

#[cfg(test)]
mod tests {
    use super::{BudgetError, StopMatcher, completion_budget};

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

    #[test]
    fn stop_strings_across_pieces() {
        let stops = vec!["</end>".to_string(), "STOP".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("hello </"), ("hello ".to_string(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.push("d> after"), (String::new(), true));

        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("a</b"), ("a</b".to_string(), false));
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.push("X"), ("STX".to_string(), false));
        assert_eq!(m.push("é ST"), ("é ".to_string(), false));
        assert_eq!(m.flush("!"), "ST!");
    }
}
