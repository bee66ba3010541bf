//! Speculative decoding's proposers: what guesses the next tokens so that one forward pass
//! of the target model verifies several (the seam is [`Proposer`](crate::proposer::Proposer);
//! verification and the rejection-sampling rule are in the
//! [`SequenceDecoder`](crate::decoder::SequenceDecoder) and the [`Sampler`](crate::sampler)).
//!
//! Decoding is bound by memory bandwidth: a step streams every weight once, however many
//! tokens it computes, so a step verifying `k` drafted tokens costs little more than a
//! one-token step, and each accepted draft saves a whole step.
//! - [`NgramProposer`]: copies what followed earlier occurrences of the last tokens in the
//!   prompt and the output (and, shared through an [`NgramCache`], in other requests'
//!   outputs) — free, and right wherever the output repeats its input;
//! - [`DraftModelProposer`]: a smaller model with the same vocabulary (checked by
//!   [`check_vocab`]), run greedily (or sampling, for sampled requests) for a few tokens;
//! - [`Adaptive`]: wraps either and sizes each draft by the recent acceptance rate and the
//!   measured cost of a drafted token, drafting nothing where it does not pay (low
//!   acceptance, or a step crowded with other sequences).
//!
//! [`SpecConfig`] is what front ends resolve their flags into; [`SpecConfig::proposer`]
//! builds the proposer of one sequence.

mod adaptive;
mod draft_model;
mod ngram;

pub use adaptive::{Adaptive, AdaptiveConfig};
pub use draft_model::{DraftModelConfig, DraftModelProposer, MAX_VOCAB_DIFFERENCE, check_vocab};
pub use ngram::{NgramCache, NgramConfig, NgramProposer};

use crate::error::SpecError;
use crate::proposer::Proposer;
use mica_kernels::ThreadPool;
use mica_models::LoadedModel;
use std::sync::Arc;

/// Which proposer drafts tokens.
#[derive(Clone, Default)]
pub enum SpecMethod {
    /// No speculation.
    #[default]
    Off,
    /// N-gram lookup in the history (and in `cache`, when shared).
    Ngram {
        config: NgramConfig,
        cache: Option<Arc<NgramCache>>,
    },
    /// A draft model with the target's vocabulary.
    Draft {
        model: Arc<LoadedModel>,
        config: DraftModelConfig,
    },
}

impl std::fmt::Debug for SpecMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecMethod::Off => f.write_str("Off"),
            SpecMethod::Ngram { config, cache } => f
                .debug_struct("Ngram")
                .field("config", config)
                .field("cache", &cache.as_ref().map(|c| c.len()))
                .finish(),
            SpecMethod::Draft { config, .. } => f
                .debug_struct("Draft")
                .field("config", config)
                .finish_non_exhaustive(),
        }
    }
}

/// Speculative decoding for the sequences of a session or an engine: the method and the
/// adaptive draft length.
#[derive(Clone, Debug, Default)]
pub struct SpecConfig {
    pub method: SpecMethod,
    pub adaptive: AdaptiveConfig,
}

impl SpecConfig {
    /// N-gram lookup with default settings, drafts of at most `max_draft` tokens.
    pub fn ngram(max_draft: usize) -> SpecConfig {
        SpecConfig {
            method: SpecMethod::Ngram {
                config: NgramConfig::default(),
                cache: None,
            },
            adaptive: AdaptiveConfig {
                max_draft,
                ..AdaptiveConfig::default()
            },
        }
    }

    pub fn is_off(&self) -> bool {
        matches!(self.method, SpecMethod::Off)
    }

    /// The adaptive proposer of one sequence of `target`, computing on `pool` (a draft
    /// model's); `None` when speculation is off. Fails when a draft model's vocabulary is
    /// not the target's.
    pub fn proposer(
        &self,
        target: &LoadedModel,
        pool: &Arc<ThreadPool>,
    ) -> Result<Option<Box<dyn Proposer>>, SpecError> {
        Ok(match &self.method {
            SpecMethod::Off => None,
            SpecMethod::Ngram { config, cache } => {
                let p = match cache {
                    Some(c) => NgramProposer::with_cache(*config, c.clone()),
                    None => NgramProposer::new(*config),
                };
                Some(Box::new(Adaptive::new(p, self.adaptive)))
            }
            SpecMethod::Draft { model, config } => {
                let p = DraftModelProposer::new(model.clone(), target, pool.clone(), *config)?;
                Some(Box::new(Adaptive::new(p, self.adaptive)))
            }
        })
    }
}
