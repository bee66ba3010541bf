//! The proposer seam for speculative decoding: something that guesses the tokens that will
//! follow a sequence, so that one forward pass can verify several of them (vLLM's
//! `num_lookahead_tokens` and its drafters play this part).
//!
//! The serving engine asks a request's proposer after each step that leaves the request
//! decoding, and schedules the draft with the sequence's last token in the next step, with
//! logits at every position; a [`Session`](crate::Session) does the same in
//! [`Session::generate_with`](crate::Session::generate_with). Which drafted tokens stand is
//! decided by the [`SequenceDecoder`](crate::decoder::SequenceDecoder) (greedy agreement, or
//! the rejection-sampling rule for sampled sequences, see its module docs); the rest are
//! rolled back from the KV cache. A draft never changes what is generated: greedy tokens are
//! those of plain decoding, and sampled tokens follow the target's distribution exactly.
//!
//! The proposers shipped with the engine (n-gram lookup, a draft model, and the adaptive
//! wrapper that sizes drafts by their recent acceptance and the cost of a step) are in
//! [`crate::spec`].

use crate::sampler::SamplingParams;

/// Drafted tokens and, optionally, the distributions they were drawn from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// Empty when every token is a deterministic guess (a point mass: `q = 1` at the
    /// token). Otherwise one entry per token: the proposal distribution `q` it was sampled
    /// from, as `(token, probability)` pairs (tokens absent have probability 0; the drafted
    /// token must be present with a positive probability). The decoder's rejection rule
    /// needs `q` to keep the output distribution exactly the target's.
    pub dists: Vec<Vec<(u32, f32)>>,
}

impl Draft {
    /// Deterministic guesses (point masses).
    pub fn points(tokens: Vec<u32>) -> Draft {
        Draft {
            tokens,
            dists: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Keeps the first `n` tokens (and their distributions).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.dists.truncate(n);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.dists.clear();
    }
}

/// What the step that just ran held, told to a proposer before it is asked for the next
/// draft (so it can judge whether drafting pays: a step full of other sequences is no
/// longer bound by memory bandwidth, and extra tokens cost nearly their full price).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLoad {
    /// Tokens the step computed, all sequences together (this one's included).
    pub tokens: usize,
    /// Sequences that chose tokens from the step (this one included).
    pub sequences: usize,
}

/// Guesses the tokens that follow a sequence. The engine calls it on its own thread between
/// steps, so it should be quick (or batch its work elsewhere).
pub trait Proposer: Send {
    /// Up to `max` tokens guessed to follow `history` (the prompt and the tokens generated
    /// so far, ending with the newest, which the next step computes). Fewer or none is
    /// fine; tokens past `max` are ignored.
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32>;

    /// The draft for a sequence sampled with `sampling` (greedy or not). A proposer that
    /// samples its guesses reports the distributions it drew them from
    /// ([`Draft::dists`]); the default drafts [`Proposer::propose`]'s deterministic
    /// guesses.
    fn draft(&mut self, history: &[u32], max: usize, sampling: &SamplingParams) -> Draft {
        let _ = sampling;
        Draft::points(self.propose(history, max))
    }

    /// The load of the step that just ran, told before [`Proposer::draft`] when the caller
    /// knows it (the serving engine does; a single-sequence session runs steps of its own
    /// tokens only). The default ignores it.
    fn step_load(&mut self, load: StepLoad) {
        let _ = load;
    }
}
