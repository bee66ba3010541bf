//! Embeddings through the facade: [`Model::embed`] for a one-off batch of texts and
//! [`Model::embedder`] to keep the threads and buffers across calls (as the server and the
//! Python binding do). Pooling and normalization are the engine's ([`mica_engine::embed`]).

use crate::error::Result;
use crate::model::Model;
use mica_engine::{Embedder, Pooling};
use mica_models::LoadedModel;
use std::sync::Arc;

/// Settings of an embedding run.
#[derive(Clone, Copy, Debug)]
pub struct EmbedOptions {
    /// Pooling; `None`: the model's declared pooling, else last-token
    /// ([`mica_engine::DEFAULT_POOLING`]).
    pub pooling: Option<Pooling>,
    /// Divide each vector by its Euclidean norm (llama.cpp's and OpenAI's default).
    pub normalize: bool,
    /// Longest input in tokens; `None`: the model's [`default_n_ctx`](Model::default_n_ctx).
    pub n_ctx: Option<usize>,
    /// Compute threads; `None`: the machine's physical cores.
    pub threads: Option<usize>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            pooling: None,
            normalize: true,
            n_ctx: None,
            threads: None,
        }
    }
}

impl Model {
    /// An embedder holding this model, its threads and buffers.
    pub fn embedder(&self, opts: &EmbedOptions) -> Result<Embedder<Arc<LoadedModel>>> {
        let n_ctx = opts.n_ctx.unwrap_or_else(|| self.default_n_ctx());
        let threads = opts
            .threads
            .unwrap_or_else(mica_kernels::pool::physical_cores)
            .max(1);
        Ok(Embedder::new(
            self.loaded().clone(),
            n_ctx,
            threads,
            opts.pooling,
        )?)
    }

    /// The embedding of each text (tokenized as a prompt: BOS where the model wants it),
    /// in order, each `[n_embd]`.
    pub fn embed<S: AsRef<str>>(&self, texts: &[S], opts: &EmbedOptions) -> Result<Vec<Vec<f32>>> {
        let mut e = self.embedder(opts)?;
        texts
            .iter()
            .map(|t| {
                let tokens = self.tokenize(t.as_ref())?;
                Ok(e.embed(&tokens, opts.normalize)?)
            })
            .collect()
    }
}
