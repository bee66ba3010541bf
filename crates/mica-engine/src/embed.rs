//! Embeddings: one vector per input, pooled from the model's final hidden states (after the
//! output norm, the output layer skipped — llama.cpp's `t_embd`).
//!
//! **Pooling** follows the model's GGUF metadata key `<arch>.pooling_type` (llama.cpp's
//! `llama_pooling_type`: 1 mean, 2 CLS, 3 last; 0 "none" and 4 "rank" give no single
//! vector per input and are refused). A decoder LM without the key (llama.cpp then pools
//! nothing and its server refuses OpenAI-style embeddings unless `--pooling` is given)
//! gets [`DEFAULT_POOLING`], last-token pooling: under causal attention the last token is
//! the only one that has seen the whole input, and it is what LLM-derived embedding models
//! (e5-mistral, gte-Qwen2, Qwen3-Embedding) are trained for and declare in their files.
//!
//! **Normalization** is llama.cpp's default for its embedding endpoints
//! (`common_embd_normalize` with 2): divide by the Euclidean norm computed in f64, a zero
//! vector left as is.

use crate::error::EngineError;
use crate::generate::PROMPT_CHUNK;
use mica_kernels::ThreadPool;
use mica_models::{Batch, KvCache, LoadedModel, Output, Workspace};
use std::ops::Deref;

/// How per-token hidden states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average over every token.
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    Cls,
    /// The last token's state.
    Last,
}

/// The pooling of a decoder LM whose file declares none (module docs).
pub const DEFAULT_POOLING: Pooling = Pooling::Last;

impl Pooling {
    /// The name used by the CLI and the APIs (`mean`, `cls`, `last`).
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// Parses [`Pooling::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }
}

/// Why embedding failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("the input is empty (no tokens to embed)")]
    EmptyInput,
    #[error("the input has {tokens} tokens but the embedding context holds {n_ctx}; shorten it")]
    TooLong { tokens: usize, n_ctx: usize },
    #[error("the model declares {key} = {value} ({what}), which gives no single vector per input")]
    UnsupportedPooling {
        key: String,
        value: u64,
        what: &'static str,
    },
    #[error("embedding failed: {0}")]
    Engine(#[from] EngineError),
}

/// The pooling `model` declares (`<arch>.pooling_type` in its GGUF file), `None` when it
/// declares none (then [`DEFAULT_POOLING`] applies).
pub fn declared_pooling(model: &LoadedModel) -> std::result::Result<Option<Pooling>, EmbedError> {
    let m = &model.model;
    let Some(file) = &m.file else {
        return Ok(None);
    };
    let key = format!("{}.pooling_type", m.config.arch);
    let Some(v) = file.get_u64(&key) else {
        return Ok(None);
    };
    let unsupported = |what| EmbedError::UnsupportedPooling {
        key: key.clone(),
        value: v,
        what,
    };
    match v {
        0 => Ok(None),
        1 => Ok(Some(Pooling::Mean)),
        2 => Ok(Some(Pooling::Cls)),
        3 => Ok(Some(Pooling::Last)),
        4 => Err(unsupported("rank: a reranker's score")),
        _ => Err(unsupported("unknown")),
    }
}

/// Divides `v` by its Euclidean norm (f64 sum, as llama.cpp); a zero vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let sum: f64 = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let norm = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for x in v {
        *x = (*x as f64 * norm) as f32;
    }
}

/// Cosine similarity of two vectors (f64).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (na * nb).max(f64::MIN_POSITIVE)
}

/// Runs inputs through a model for their embeddings: its own thread pool, KV cache (cleared
/// between inputs) and buffers. `M` is how it holds the model (a borrow or an `Arc`).
pub struct Embedder<M: Deref<Target = LoadedModel>> {
    model: M,
    pool: ThreadPool,
    kv: KvCache,
    ws: Workspace,
    batch: Batch,
    pooling: Pooling,
}

impl<M: Deref<Target = LoadedModel>> Embedder<M> {
    /// An embedder for inputs of up to `n_ctx` tokens on `n_threads` threads, pooling as
    /// `pooling` says, or as the model declares when `None` ([`declared_pooling`], then
    /// [`DEFAULT_POOLING`]).
    pub fn new(
        model: M,
        n_ctx: usize,
        n_threads: usize,
        pooling: Option<Pooling>,
    ) -> std::result::Result<Self, EmbedError> {
        let pooling = match pooling {
            Some(p) => p,
            None => declared_pooling(&model)?.unwrap_or(DEFAULT_POOLING),
        };
        let mut ws = Workspace::default();
        ws.output = Output::Hidden;
        Ok(Embedder {
            kv: KvCache::new(&model.model.config, n_ctx, 1),
            model,
            pool: ThreadPool::new(n_threads),
            ws,
            batch: Batch::new(),
            pooling,
        })
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Length of the vectors.
    pub fn n_embd(&self) -> usize {
        self.model.model.config.n_embd
    }

    /// The embedding of `tokens` (`[n_embd]`), L2-normalized when `normalize`.
    pub fn embed(
        &mut self,
        tokens: &[u32],
        normalize_it: bool,
    ) -> std::result::Result<Vec<f32>, EmbedError> {
        if tokens.is_empty() {
            return Err(EmbedError::EmptyInput);
        }
        let n_ctx = self.kv.n_ctx();
        if tokens.len() > n_ctx {
            return Err(EmbedError::TooLong {
                tokens: tokens.len(),
                n_ctx,
            });
        }
        let d = self.n_embd();
        let n = tokens.len();
        self.kv.clear(0);
        let mut out = vec![0.0f64; d];
        for (c, chunk) in tokens.chunks(PROMPT_CHUNK).enumerate() {
            let start = c * PROMPT_CHUNK;
            self.batch.clear();
            for (j, &t) in chunk.iter().enumerate() {
                let pos = start + j;
                let wanted = match self.pooling {
                    Pooling::Mean => true,
                    Pooling::Cls => pos == 0,
                    Pooling::Last => pos + 1 == n,
                };
                self.batch.push(t, pos, 0, wanted);
            }
            let hidden = self
                .model
                .model
                .forward(&self.pool, &self.batch, &mut self.kv, &mut self.ws)
                .map_err(EngineError::from)?;
            for row in hidden.chunks_exact(d) {
                for (o, &h) in out.iter_mut().zip(row) {
                    *o += h as f64;
                }
            }
        }
        let scale = match self.pooling {
            Pooling::Mean => 1.0 / n as f64,
            Pooling::Cls | Pooling::Last => 1.0,
        };
        let mut v: Vec<f32> = out.iter().map(|&x| (x * scale) as f32).collect();
        self.kv.clear(0);
        if normalize_it {
            normalize(&mut v);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0; 3];
        normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
    }

    #[test]
    fn cosine_of_parallel_and_orthogonal() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
    }

    #[test]
    fn pooling_names_round_trip() {
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(Pooling::parse(p.as_str()), Some(p));
        }
        assert_eq!(Pooling::parse("max"), None);
    }
}
