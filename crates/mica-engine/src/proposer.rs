//! The proposer seam for speculative decoding: something that guesses the tokens that will
//! follow a sequence, so that one forward pass can verify several of them (vLLM's
//! `num_lookahead_tokens` and its drafters play this part).
//!
//! The serving engine asks a request's proposer after each step that leaves the request
//! decoding greedily, and schedules the draft with the sequence's last token in the next
//! step, with logits at every position; a [`Session`](crate::Session) does the same in
//! [`Session::generate_with`](crate::Session::generate_with). Which drafted tokens stand is
//! decided by the [`SequenceDecoder`](crate::decoder::SequenceDecoder); the rest are rolled
//! back from the KV cache. A draft never changes the tokens generated, only how many steps
//! they take.

/// Guesses the tokens that follow a sequence. The engine calls it on its own thread between
/// steps, so it should be quick (or batch its work elsewhere).
pub trait Proposer: Send {
    /// Up to `max` tokens guessed to follow `history` (the prompt and the tokens generated
    /// so far, ending with the newest, which the next step computes). Fewer or none is
    /// fine; tokens past `max` are ignored.
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32>;
}
