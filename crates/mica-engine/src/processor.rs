//! Logits processors: what changes a sequence's logits before the sampler draws from them —
//! the seam through which logit bias, the repetition penalties and constraints such as
//! grammars act.
//!
//! A [`SequenceDecoder`](crate::decoder::SequenceDecoder) holds an ordered list of them and
//! runs each on every position it chooses a token for. The trait follows what structured
//! output needs under speculative decoding (as vLLM's structured-output grammars and
//! llguidance's matcher do it): besides rewriting logits, a stateful processor is told each
//! token the sequence takes ([`LogitsProcessor::accept`]) and can take tokens back
//! ([`LogitsProcessor::rollback`]). When several drafted tokens are verified in one step, the
//! decoder runs the processors over every position as if each draft were right, accepting
//! the drafts one by one, then rolls all of them back and accepts the tokens the model
//! actually kept; so a grammar matcher always sees a consistent sequence, and the masks of
//! every position of a step are computed in one pass. A processor that allows nothing more
//! says so ([`LogitsProcessor::is_complete`]) and the sequence ends. Stateless processors
//! (the built-ins here) read `history` and ignore the rest.

use crate::sampler::SamplingParams;
use std::collections::HashMap;

/// Changes the logits of a sequence's next token.
pub trait LogitsProcessor: Send {
    /// Adjusts `logits` (`[n_vocab]`, the model's raw scores after earlier processors) of the
    /// token that follows `history` (prompt, generated tokens, and during a verification the
    /// drafted tokens before this position).
    fn process(&mut self, history: &[u32], logits: &mut [f32]);

    /// `token` is the sequence's next token. Return false to refuse it (it is not allowed
    /// here, e.g. by a grammar), leaving the state unchanged; the decoder then processes no
    /// position after it. The decoder ignores a refusal of a token it chose itself.
    fn accept(&mut self, token: u32) -> bool {
        let _ = token;
        true
    }

    /// Takes back the last `n` accepted tokens (drafted tokens the model did not confirm).
    fn rollback(&mut self, n: usize) {
        let _ = n;
    }

    /// Up to `max` tokens this processor forces to follow the tokens accepted so far (a
    /// grammar's fast-forward tokens: the only continuation it allows, tokenized as the
    /// tokenizer would), offered as a draft for the next step; nothing is accepted. The
    /// default forces nothing.
    fn forced(&mut self, max: usize) -> Vec<u32> {
        let _ = max;
        Vec::new()
    }

    /// The drafted tokens the next step verifies, told before its forward pass runs: a
    /// processor may prepare the positions after them meanwhile (a grammar computes their
    /// masks), so that processing the step's rows waits less. Nothing is accepted.
    fn prefetch(&mut self, draft: &[u32]) {
        let _ = draft;
    }

    /// Greedy choice's shortcut: whether `process`, run on logits whose highest entry
    /// (the first, on a tie) is `token`, would leave `token` the highest — as a grammar
    /// that allows `token` would, since masking only lowers other tokens. When true the
    /// decoder skips `process` at that position. The decoder asks only when it takes the
    /// highest logit and no processor follows this one, so a processor may also take the
    /// call as word that its positions are chosen greedily (a grammar then stops computing
    /// whole masks ahead). The default, false, always processes.
    fn keeps_top(&mut self, token: u32) -> bool {
        let _ = token;
        false
    }

    /// Whether no token may follow the tokens accepted so far (a grammar whose output is
    /// complete): the decoder then ends the sequence after the token just committed, with
    /// [`FinishReason::Constraint`](crate::generate::FinishReason::Constraint), rather than
    /// spend a forward pass on an end-of-generation token.
    fn is_complete(&self) -> bool {
        false
    }
}

/// Adds a bias to the logits of chosen tokens (OpenAI's and llama.cpp's `logit_bias`).
/// Entries of the same token add up.
#[derive(Clone, Debug)]
pub struct LogitBias {
    bias: Vec<(u32, f32)>,
}

impl LogitBias {
    /// The bias of `(token, bias)` pairs (validated by
    /// [`GenerateParams::validate`](crate::generate::GenerateParams::validate)).
    pub fn new(bias: &[(u32, f32)]) -> LogitBias {
        LogitBias {
            bias: bias.to_vec(),
        }
    }
}

impl LogitsProcessor for LogitBias {
    fn process(&mut self, _history: &[u32], logits: &mut [f32]) {
        for &(t, b) in &self.bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
    }
}

/// llama.cpp's repetition penalties over the last `penalty_last_n` tokens of the history:
/// the repeat penalty divides a seen token's positive logit and multiplies a negative one,
/// then the frequency penalty is subtracted once per occurrence and the presence penalty
/// once.
#[derive(Clone, Debug)]
pub struct Penalties {
    repeat: f32,
    presence: f32,
    frequency: f32,
    last_n: usize,
    counts: HashMap<u32, u32>,
}

impl Penalties {
    /// The penalties of `p`, or `None` when they change nothing (repeat 1, presence and
    /// frequency 0), so that greedy decoding keeps its fast path, or when mirostat samples
    /// (llama.cpp's mirostat chain has no penalties).
    pub fn from_params(p: &SamplingParams) -> Option<Penalties> {
        let active = p.mirostat.is_none()
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0);
        active.then(|| Penalties {
            repeat: p.repeat_penalty,
            presence: p.presence_penalty,
            frequency: p.frequency_penalty,
            last_n: p.penalty_last_n,
            counts: HashMap::new(),
        })
    }
}

impl LogitsProcessor for Penalties {
    fn process(&mut self, history: &[u32], logits: &mut [f32]) {
        let recent = &history[history.len().saturating_sub(self.last_n)..];
        if recent.is_empty() {
            return;
        }
        self.counts.clear();
        for &t in recent {
            *self.counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &self.counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l <= 0.0 {
                *l *= self.repeat;
            } else {
                *l /= self.repeat;
            }
            *l -= n as f32 * self.frequency + self.presence;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_adds_per_entry() {
        let mut b = LogitBias::new(&[(1, 2.0), (3, -1.5), (1, 0.5), (99, 4.0)]);
        let mut l = vec![0.0, 1.0, 2.0, 3.0];
        b.process(&[], &mut l);
        assert_eq!(l, vec![0.0, 3.5, 2.0, 1.5]);
    }

    #[test]
    fn penalties_look_at_the_last_n_tokens_only() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            penalty_last_n: 3,
            ..Default::default()
        };
        let mut pen = Penalties::from_params(&p).unwrap();
        let mut l = vec![2.0, -2.0, 1.0];
        // Token 2 is outside the last 3.
        pen.process(&[2, 0, 1, 1], &mut l);
        assert_eq!(
            l,
            vec![2.0 / 2.0 - 0.5 - 0.25, -2.0 * 2.0 - 1.0 - 0.25, 1.0]
        );
        assert!(Penalties::from_params(&SamplingParams::default()).is_none());
    }
}
