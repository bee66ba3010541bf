//! Speculative decoding for sessions and engines: proposers guess the next tokens, one
//! forward pass verifies several, and the output is what plain decoding gives (greedy: the
//! same tokens; sampled: the same distribution). See [`mica_engine::spec`] for how each
//! proposer works.
//!
//! ```no_run
//! use mica::spec::SpecConfig;
//! use mica::{GenerateParams, Hooks, Model, SamplingParams, SessionOptions};
//! let model = Model::open("model.gguf")?;
//! let mut session = model.session(SessionOptions::default());
//! // N-gram lookup with the adaptive draft length the CLI uses, at most 16 tokens a draft.
//! let mut proposer = session.proposer(&SpecConfig::ngram(16))?.expect("speculation on");
//! let hooks = Hooks { proposer: Some(proposer.as_mut()), ..Default::default() };
//! let params = GenerateParams { sampling: SamplingParams::greedy(), ..Default::default() };
//! let prompt = model.tokenize("Repeat after me: the quick brown fox")?;
//! let out = session.generate_with(&prompt, &params, hooks, |_| true)?;
//! println!("{} of {} drafted tokens accepted",
//!     out.timings.accepted_draft_tokens, out.timings.draft_tokens);
//! # Ok::<(), mica::Error>(())
//! ```

pub use mica_engine::spec::{
    Adaptive, AdaptiveConfig, DraftModelConfig, DraftModelProposer, NgramCache, NgramConfig,
    NgramProposer, SpecConfig, SpecMethod, check_vocab,
};
pub use mica_engine::{Draft, SpecError, StepLoad};

use crate::error::Result;
use crate::model::Model;

/// A [`SpecMethod::Draft`] running `draft` (checked against `target`'s vocabulary), drafts
/// sized adaptively up to `max_draft` tokens.
pub fn draft_model(
    target: &Model,
    draft: &Model,
    n_ctx: usize,
    max_draft: usize,
) -> Result<SpecConfig> {
    check_vocab(&target.loaded().tokenizer, &draft.loaded().tokenizer)
        .map_err(mica_engine::EngineError::from)?;
    Ok(SpecConfig {
        method: SpecMethod::Draft {
            model: draft.loaded().clone(),
            config: DraftModelConfig {
                n_ctx,
                ..DraftModelConfig::default()
            },
        },
        adaptive: AdaptiveConfig {
            max_draft,
            ..AdaptiveConfig::default()
        },
    })
}
