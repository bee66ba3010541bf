//! DRY, "don't repeat yourself" (p-e-w's sampler, ported to llama.cpp as
//! `llama_sampler_dry` from koboldcpp): a penalty on tokens that would extend a sequence
//! already seen in the history. Computed as llama.cpp computes it, over the last
//! `dry_penalty_last_n` tokens of the history (prompt included; −1: the whole history,
//! which the sequence's context bounds):
//!
//! 1. **Sequence breakers** limit how far back a repeat may reach: walking back from the
//!    end, the first token that starts a breaker sequence (a breaker string as tokens: a
//!    token whose text contains the string, or one ending in a prefix of it followed by the
//!    tokenization of the rest) caps the repeat length at its distance from the end.
//! 2. For every earlier position, the length of the longest suffix of the history that
//!    also ends there (the Z-algorithm over the reversed window, linear time), capped as
//!    above.
//! 3. A repeat of length `n ≥ dry_allowed_length` ending at a position means the token
//!    that followed it there would make the repeat `n + 1` long: that token's logit drops by
//!    `dry_multiplier · dry_base^(n − dry_allowed_length)` (the longest such `n` per token;
//!    the exponent clamped so the power stays finite), unless the token is itself a
//!    one-token breaker.
//!
//! It is a [`LogitsProcessor`] that reads only the history, so under speculative
//! decoding each verified position gets exactly the penalty plain decoding would give it.
//! As in llama.cpp's chain it runs after the repetition penalties and not under mirostat.

use crate::processor::LogitsProcessor;
use crate::sampler::SamplingParams;
use mica_models::tokenizer::{DecodeOptions, Tokenizer};
use std::collections::HashMap;

/// llama.cpp's defaults.
pub const DEFAULT_BASE: f32 = 1.75;
pub const DEFAULT_ALLOWED_LENGTH: u32 = 2;
/// −1: the whole history (llama.cpp: the context size).
pub const DEFAULT_PENALTY_LAST_N: i32 = -1;

/// llama.cpp's default sequence breakers: newline, colon, double quote, asterisk.
pub fn default_breakers() -> Vec<String> {
    ["\n", ":", "\"", "*"].map(String::from).to_vec()
}

/// Longest breaker string used, in bytes (llama.cpp's `MAX_CHAR_LEN`; longer ones are cut
/// at a character boundary at or below it).
pub const MAX_BREAKER_BYTES: usize = 40;
/// Most tokens of a breaker's tail kept (llama.cpp's `MAX_SEQ_LEN`).
pub const MAX_TAIL_TOKENS: usize = 20;

/// llama.cpp's `FLOAT_MAX_LOG`: `ln(f32::MAX)`, rounded as llama.cpp writes it.
const FLOAT_MAX_LOG: f32 = 88.722_84;

/// The DRY penalty of one sequence.
#[derive(Clone, Debug)]
pub struct Dry {
    multiplier: f32,
    base: f32,
    allowed_length: usize,
    /// `None`: the whole history.
    last_n: Option<usize>,
    /// Breaker head token → the tails that follow it (empty: a one-token breaker).
    breakers: HashMap<u32, Vec<Vec<u32>>>,
    /// Scratch: the window reversed, its Z-array, the longest repeat each token extends.
    window: Vec<u32>,
    z: Vec<usize>,
    max_repeat: HashMap<u32, usize>,
}

impl Dry {
    /// Whether `p` turns DRY on (multiplier not 0, base ≥ 1, `penalty_last_n` not 0, no
    /// mirostat), as llama.cpp decides it.
    pub fn enabled(p: &SamplingParams) -> bool {
        p.mirostat.is_none()
            && p.dry_multiplier != 0.0
            && p.dry_base >= 1.0
            && p.dry_penalty_last_n != 0
    }

    /// The DRY penalty of `p` with breakers given as token sequences (head first), or
    /// `None` when `p` leaves DRY off.
    pub fn new(p: &SamplingParams, breakers: &[Vec<u32>]) -> Option<Dry> {
        if !Dry::enabled(p) {
            return None;
        }
        let mut map: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        for b in breakers {
            let Some((&head, tail)) = b.split_first() else {
                continue;
            };
            let tails = map.entry(head).or_default();
            if !tails.iter().any(|t| t == tail) {
                tails.push(tail.to_vec());
            }
        }
        Some(Dry {
            multiplier: p.dry_multiplier,
            base: p.dry_base,
            allowed_length: p.dry_allowed_length as usize,
            last_n: usize::try_from(p.dry_penalty_last_n).ok(),
            breakers: map,
            window: Vec::new(),
            z: Vec::new(),
            max_repeat: HashMap::new(),
        })
    }

    /// The DRY penalty of `p` with its breaker strings as `tokenizer` spells them, or `None`
    /// when `p` leaves DRY off.
    pub fn from_tokenizer(p: &SamplingParams, tokenizer: &Tokenizer) -> Option<Dry> {
        if !Dry::enabled(p) {
            return None;
        }
        Dry::new(p, &breaker_sequences(tokenizer, &p.dry_sequence_breakers))
    }
}

/// The token sequences (head first) that spell each of `breakers` in `tokenizer`'s
/// vocabulary, as llama.cpp's `get_overlapping_token_sequences` finds them: every token
/// whose text contains the string (alone), and every token whose text ends with a proper
/// prefix of the string, followed by the tokenization of the rest (at most
/// [`MAX_TAIL_TOKENS`] tokens). Empty strings are skipped. A rest that is not whole UTF-8
/// characters (a token ending inside a character of the string) is skipped too: mica
/// tokenizes text, not bytes.
pub fn breaker_sequences(tokenizer: &Tokenizer, breakers: &[String]) -> Vec<Vec<u32>> {
    let opts = DecodeOptions {
        skip_special: false,
    };
    let mut out: Vec<Vec<u32>> = Vec::new();
    for b in breakers {
        let mut end = b.len().min(MAX_BREAKER_BYTES);
        while !b.is_char_boundary(end) {
            end -= 1;
        }
        let s = &b.as_bytes()[..end];
        let Some(&first) = s.first() else {
            continue;
        };
        let mut tails: HashMap<usize, Option<Vec<u32>>> = HashMap::new();
        for id in 0..tokenizer.vocab_size() as u32 {
            let Some(word) = tokenizer.token_piece(id, opts) else {
                continue;
            };
            if word.windows(s.len()).any(|w| w == s) {
                out.push(vec![id]);
                continue;
            }
            let mut seen: Vec<usize> = Vec::new();
            for pos in (0..word.len()).filter(|&i| word[i] == first) {
                let n = word.len() - pos;
                if n >= s.len() || word[pos..] != s[..n] || seen.contains(&n) {
                    continue;
                }
                seen.push(n);
                let tail = tails.entry(n).or_insert_with(|| {
                    let rest = std::str::from_utf8(&s[n..]).ok()?;
                    let mut t = tokenizer.encode(rest, false, false).ok()?;
                    t.truncate(MAX_TAIL_TOKENS);
                    Some(t)
                });
                if let Some(t) = tail {
                    let mut seq = Vec::with_capacity(t.len() + 1);
                    seq.push(id);
                    seq.extend_from_slice(t);
                    out.push(seq);
                }
            }
        }
    }
    out
}

impl LogitsProcessor for Dry {
    fn process(&mut self, history: &[u32], logits: &mut [f32]) {
        let n = self.last_n.map_or(history.len(), |k| k.min(history.len()));
        if n <= self.allowed_length {
            return;
        }
        // s[j]: the j-th token from the end.
        self.window.clear();
        self.window
            .extend(history[history.len() - n..].iter().rev());
        let s = &self.window;

        // 1. The most recent breaker caps the repeat length.
        let mut rep_limit = n;
        for i in 0..n {
            let Some(tails) = self.breakers.get(&s[i]) else {
                continue;
            };
            let longest = tails
                .iter()
                .filter(|t| t.len() <= i && t.iter().enumerate().all(|(o, &x)| x == s[i - o - 1]))
                .map(Vec::len)
                .max();
            if let Some(len) = longest {
                rep_limit = i - len;
                break;
            }
        }
        if rep_limit < self.allowed_length {
            return;
        }

        // 2. z[k]: how many tokens the suffix ending k tokens before the end shares with the
        // suffix at the end (the Z-array of the reversed window).
        self.z.clear();
        self.z.resize(n, 0);
        let (mut l, mut r) = (0usize, 0usize);
        for k in 1..n {
            let mut len = if k < r { (r - k).min(self.z[k - l]) } else { 0 };
            while k + len < n && s[len] == s[k + len] {
                len += 1;
            }
            self.z[k] = len;
            if k + len > r {
                (l, r) = (k, k + len);
            }
        }

        // 3. The token after each repeat would extend it.
        self.max_repeat.clear();
        for k in 1..n {
            let len = self.z[k].min(rep_limit);
            if len >= self.allowed_length {
                let e = self.max_repeat.entry(s[k - 1]).or_insert(len);
                *e = (*e).max(len);
            }
        }

        // 4. The penalties.
        let max_exponent = if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as i64
        } else {
            0
        };
        for (&t, &len) in &self.max_repeat {
            let one_token_breaker = self
                .breakers
                .get(&t)
                .is_some_and(|tails| tails.iter().any(Vec::is_empty));
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if one_token_breaker {
                continue;
            }
            let mut exp = len as i64 - self.allowed_length as i64;
            if max_exponent > 0 && exp > max_exponent {
                exp = max_exponent;
            }
            let penalty = (self.multiplier as f64 * (self.base as f64).powf(exp as f64)) as f32;
            *l -= penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(allowed: u32, last_n: i32) -> SamplingParams {
        SamplingParams {
            dry_multiplier: 0.8,
            dry_base: 1.75,
            dry_allowed_length: allowed,
            dry_penalty_last_n: last_n,
            ..Default::default()
        }
    }

    fn run(p: &SamplingParams, breakers: &[Vec<u32>], history: &[u32]) -> Vec<f32> {
        let mut d = Dry::new(p, breakers).unwrap();
        let mut l = vec![0.0f32; 5];
        d.process(history, &mut l);
        l
    }

    /// llama.cpp's own example: a b c c b c y a b c (a 0, b 1, c 2, y 3). The suffix
    /// "a b c" also ends at the first c (then followed by c: a repeat of 3), "b c" ends at
    /// the third c (followed by y: 2), "c" at the second c (followed by b: 1).
    const HISTORY: [u32; 10] = [0, 1, 2, 2, 1, 2, 3, 0, 1, 2];

    #[test]
    fn penalizes_the_tokens_that_extend_repeats() {
        // allowed 2: c extends a repeat of 3: 0.8 · 1.75^(3−2) = 1.4; y one of 2:
        // 0.8 · 1.75^0 = 0.8; b's repeat of 1 is under the allowed length.
        let l = run(&params(2, -1), &[], &HISTORY);
        assert_eq!(l, vec![0.0, 0.0, -(0.8f64 * 1.75) as f32, -0.8, 0.0]);
        // allowed 1: b too (0.8 · 1.75^0), c 0.8 · 1.75^2 = 2.45, y 0.8 · 1.75.
        let l = run(&params(1, -1), &[], &HISTORY);
        let pen = |e: f64| -(0.8 * 1.75f64.powf(e)) as f32;
        assert_eq!(l, vec![0.0, pen(0.0), pen(2.0), pen(1.0), 0.0]);
        // The last 4 tokens (y a b c) hold no repeat.
        assert_eq!(run(&params(2, 4), &[], &HISTORY), vec![0.0; 5]);
        // Too short a history for the allowed length.
        assert_eq!(run(&params(2, -1), &[], &[1, 1]), vec![0.0; 5]);
    }

    #[test]
    fn breakers_cap_repeats_and_are_not_penalized() {
        // y a one-token breaker, 3 tokens from the end: repeats are capped at 3 (no
        // change for c) and y itself is spared.
        let l = run(&params(1, -1), &[vec![3]], &HISTORY);
        let pen = |e: f64| -(0.8 * 1.75f64.powf(e)) as f32;
        assert_eq!(l, vec![0.0, pen(0.0), pen(2.0), 0.0, 0.0]);
        // "b c" a two-token breaker ending the history: the cap is 1 − 1 = 0, under the
        // allowed length: no penalty at all.
        assert_eq!(run(&params(1, -1), &[vec![1, 2]], &HISTORY), vec![0.0; 5]);
        // "a b" as a breaker, ending 1 token before the end: repeats are capped at 1, so
        // c, y and b each extend a repeat of 1.
        let l = run(&params(1, -1), &[vec![0, 1]], &HISTORY);
        assert_eq!(l, vec![0.0, pen(0.0), pen(0.0), pen(0.0), 0.0]);
    }

    #[test]
    fn off_unless_multiplier_base_and_last_n_say_on() {
        let mut p = params(2, -1);
        assert!(Dry::new(&p, &[]).is_some());
        p.dry_penalty_last_n = 0;
        assert!(Dry::new(&p, &[]).is_none());
        p = params(2, -1);
        p.dry_multiplier = 0.0;
        assert!(Dry::new(&p, &[]).is_none());
        p = params(2, -1);
        p.dry_base = 0.9;
        assert!(Dry::new(&p, &[]).is_none());
        p = params(2, -1);
        p.mirostat = Some(crate::Mirostat::V2 { tau: 5.0, eta: 0.1 });
        assert!(Dry::new(&p, &[]).is_none());
    }

    #[test]
    fn huge_exponents_are_clamped() {
        // 60 tokens 1: the longest repeat is 59 (exponent 59 with allowed length 0);
        // base 10 clamps it to int(88.72284 / ln 10) = 38.
        let mut p = params(0, -1);
        p.dry_base = 10.0;
        p.dry_multiplier = 1.0;
        let h = vec![1u32; 60];
        let l = run(&p, &[], &h);
        assert_eq!(l[1], -(10f64.powf(38.0) as f32));
    }
}
