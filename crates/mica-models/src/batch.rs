//! A batch of tokens for one forward pass: each token with its position and sequence, and
//! whether its logits are wanted (as `llama_batch`). Tokens of one sequence must continue
//! that sequence's cache in order; tokens of several sequences may be mixed.

use crate::kv_cache::SeqId;

#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    pub pos: Vec<usize>,
    pub seq: Vec<SeqId>,
    /// Whether to return logits for this token.
    pub logits: Vec<bool>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// The tokens of one sequence from position `start`, with logits for the last token only
    /// (or for all of them with `all_logits`).
    pub fn for_sequence(tokens: &[u32], start: usize, seq: SeqId, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            pos: (start..start + n).collect(),
            seq: vec![seq; n],
            logits: (0..n).map(|i| all_logits || i + 1 == n).collect(),
        }
    }

    pub fn push(&mut self, token: u32, pos: usize, seq: SeqId, logits: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.logits.push(logits);
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
        self.pos.clear();
        self.seq.clear();
        self.logits.clear();
    }

    /// Number of tokens that produce logits.
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }
}
