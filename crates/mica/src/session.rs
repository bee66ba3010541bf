//! [`Session`]: one sequence at a time on its own threads and KV cache — generation,
//! streaming, raw logits — reusing the cached prefix when a prompt extends the previous one
//! (a chat's next turn evaluates only the new messages).

use crate::error::Result;
use crate::model::Model;
use mica_engine::{GenerateParams, Generation, Hooks};
use mica_models::LoadedModel;
use std::sync::Arc;

/// Settings of a [`Session`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionOptions {
    /// Positions the session holds (prompt and generated tokens); `None`: the model's
    /// [`default_n_ctx`](Model::default_n_ctx).
    pub n_ctx: Option<usize>,
    /// Compute threads; `None`: the machine's physical cores.
    pub threads: Option<usize>,
}

/// A model with a thread pool, a KV cache and buffers, for one sequence.
pub struct Session {
    inner: mica_engine::Session<Arc<LoadedModel>>,
}

impl Session {
    pub(crate) fn new(model: &Model, opts: SessionOptions) -> Session {
        let n_ctx = opts.n_ctx.unwrap_or_else(|| model.default_n_ctx());
        let threads = opts
            .threads
            .unwrap_or_else(mica_kernels::pool::physical_cores);
        Session {
            inner: mica_engine::Session::new(model.loaded().clone(), n_ctx, threads.max(1)),
        }
    }

    /// Positions the session holds.
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// Generates a continuation of `prompt` (token ids, e.g. from
    /// [`Model::chat_prompt`]).
    pub fn generate(&mut self, prompt: &[u32], params: &GenerateParams) -> Result<Generation> {
        Ok(self.inner.generate(prompt, params, |_| true)?)
    }

    /// [`Session::generate`], handing `on_text` the text as it becomes final (whole UTF-8
    /// characters, never part of a stop string); return `false` from it to stop (the
    /// generation then ends as [`FinishReason::Cancelled`](crate::FinishReason)).
    pub fn stream(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        Ok(self.inner.generate(prompt, params, on_text)?)
    }

    /// [`Session::stream`] with logits processors (run after the logit bias and the
    /// penalties) and a proposer whose drafts are verified several tokens per forward pass.
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        hooks: Hooks<'_>,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        Ok(self.inner.generate_with(prompt, params, hooks, on_text)?)
    }

    /// The logits (`[n_vocab]`) of the token that would follow `tokens`, evaluated from an
    /// empty cache.
    pub fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.inner.reset();
        Ok(self.inner.eval(tokens, false)?)
    }

    /// The logits after every one of `tokens` (`[tokens.len(), n_vocab]`, row-major),
    /// evaluated from an empty cache.
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.inner.reset();
        Ok(self.inner.eval(tokens, true)?)
    }

    /// Forgets the cached prefix.
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    /// The session of the layer beneath (evaluation after the cached prefix, truncation).
    pub fn inner_mut(&mut self) -> &mut mica_engine::Session<Arc<LoadedModel>> {
        &mut self.inner
    }
}
