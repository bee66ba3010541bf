//! N-gram lookup ("prompt lookup decoding"): the continuation of an earlier occurrence of
//! the sequence's last few tokens is guessed to follow them again. Free to compute, and
//! right remarkably often wherever the output copies its input: code edits, quoting and
//! extraction, reformatting.
//!
//! Design (after llama.cpp's `ngram-simple` and `ngram-cache` speculative modes, and the
//! prompt-lookup decoding of Saxena, 2023; written from their descriptions):
//! - the history (prompt and generated tokens) is indexed incrementally by every n-gram of
//!   `min_ngram..=max_ngram` tokens, each mapped to the positions that followed it;
//! - a draft copies what followed the longest n-gram ending the history (the most recent
//!   occurrence), up to the caller's limit;
//! - **copy tracking**: when the tokens generated since the last draft are what the source
//!   said, the copy simply goes on from there, however common its last n-gram; after a
//!   deviation (a renamed variable, a changed value) the suffix is looked up near where
//!   the copy was, first down to a single token, so the copy resumes at the right place
//!   instead of at the latest occurrence of a common token;
//! - an optional [`NgramCache`] of recent outputs, shared between requests (a server's),
//!   is searched when the history has no match of the longest length; each proposer adds
//!   its sequence's generated tokens to it when dropped.

use crate::proposer::Proposer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Settings of an [`NgramProposer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest n-gram matched anywhere in the history.
    pub min_ngram: usize,
    /// Longest n-gram matched (the longest match wins).
    pub max_ngram: usize,
    /// After a deviation from the copied text, how far past the expected position a match
    /// of a single token is looked for.
    pub window: usize,
}

impl Default for NgramConfig {
    fn default() -> Self {
        NgramConfig {
            min_ngram: 2,
            max_ngram: 4,
            window: 24,
        }
    }
}

/// Positions that followed each n-gram of a token sequence, for n in `min..=max`.
#[derive(Default)]
struct Index {
    /// `[max - min + 1]`: n-gram hash → end positions (ascending) of its occurrences, i.e.
    /// the positions of the tokens that followed.
    maps: Vec<HashMap<u64, Vec<u32>>>,
    /// Positions `..indexed` have their n-grams ending there recorded.
    indexed: usize,
}

/// FNV-style hash of a short token run.
fn hash(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ t as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Index {
    fn new(min: usize, max: usize) -> Index {
        Index {
            maps: (min..=max).map(|_| HashMap::new()).collect(),
            indexed: 0,
        }
    }

    fn clear(&mut self) {
        self.maps.iter_mut().for_each(HashMap::clear);
        self.indexed = 0;
    }

    /// Records the n-grams followed by a token in `tokens[..len]` not yet recorded: the one
    /// ending at `e` (exclusive) for every `e < len`.
    fn extend(&mut self, tokens: &[u32], min: usize) {
        let len = tokens.len();
        for e in self.indexed.max(1)..len {
            for (i, map) in self.maps.iter_mut().enumerate() {
                let n = min + i;
                if n > e {
                    break;
                }
                map.entry(hash(&tokens[e - n..e]))
                    .or_default()
                    .push(e as u32);
            }
        }
        self.indexed = self.indexed.max(len);
    }

    /// End positions of the occurrences of `gram` in `tokens` (checked token by token
    /// against hash collisions), ascending.
    fn find<'a>(
        &'a self,
        tokens: &'a [u32],
        gram: &'a [u32],
        min: usize,
    ) -> impl Iterator<Item = usize> + 'a {
        let n = gram.len();
        self.maps
            .get(n.wrapping_sub(min))
            .and_then(|m| m.get(&hash(gram)))
            .into_iter()
            .flatten()
            .map(|&e| e as usize)
            .filter(move |&e| e >= n && &tokens[e - n..e] == gram)
    }
}

/// Guesses the continuation of a sequence from earlier occurrences of its last tokens (see
/// the module docs).
pub struct NgramProposer {
    cfg: NgramConfig,
    /// The history indexed so far.
    tokens: Vec<u32>,
    index: Index,
    /// The last draft's source: the history length then, and the position in `tokens` its
    /// copy started at.
    copy: Option<(usize, usize)>,
    cache: Option<Arc<NgramCache>>,
    /// The history length at the first call (the prompt and one token), so that only
    /// generated tokens go to the cache.
    first_len: Option<usize>,
}

impl NgramProposer {
    /// A proposer looking up the history only.
    pub fn new(cfg: NgramConfig) -> NgramProposer {
        let cfg = NgramConfig {
            min_ngram: cfg.min_ngram.max(1),
            max_ngram: cfg.max_ngram.max(cfg.min_ngram.max(1)),
            window: cfg.window,
        };
        NgramProposer {
            index: Index::new(1, cfg.max_ngram),
            cfg,
            tokens: Vec::new(),
            copy: None,
            cache: None,
            first_len: None,
        }
    }

    /// A proposer that also looks in `cache` (recent outputs of other sequences) and adds
    /// its own generated tokens to it when dropped.
    pub fn with_cache(cfg: NgramConfig, cache: Arc<NgramCache>) -> NgramProposer {
        let mut p = Self::new(cfg);
        p.cache = Some(cache);
        p
    }

    /// Brings the index up to `history`: extends it when `history` continues what was
    /// indexed, else starts over.
    fn sync(&mut self, history: &[u32]) {
        let common = self
            .tokens
            .iter()
            .zip(history)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.tokens.len() {
            self.give_to_cache();
            self.tokens.clear();
            self.index.clear();
            self.copy = None;
            self.first_len = None;
        }
        self.tokens.extend_from_slice(&history[self.tokens.len()..]);
        self.first_len.get_or_insert(history.len());
        self.index.extend(&self.tokens, 1);
    }

    /// Where in `tokens` the copy of the last draft stands now, if every token generated
    /// since is what the source said.
    fn continued_copy(&self) -> Option<usize> {
        let (then, src) = self.copy?;
        let now = self.tokens.len();
        let generated = now.checked_sub(then)?;
        let end = src + generated;
        (end < now && self.tokens[then..now] == self.tokens[src..end]).then_some(end)
    }

    /// The source position to copy from after a deviation or without a copy: the end of
    /// an earlier occurrence of the longest suffix — of any length down to one token near
    /// where the copy would be, of at least `min_ngram` tokens anywhere (the latest).
    fn lookup(&self) -> Option<usize> {
        let len = self.tokens.len();
        let expected = self
            .copy
            .map(|(then, src)| src + (len - then))
            .filter(|&x| x < len + 4 * self.cfg.window);
        for n in (1..=self.cfg.max_ngram.min(len - 1)).rev() {
            let gram = &self.tokens[len - n..];
            let found = || self.index.find(&self.tokens, gram, 1).filter(|&e| e < len);
            if let Some(x) = expected {
                let near = x.saturating_sub(self.cfg.window / 4)..=x + self.cfg.window;
                let best = found()
                    .filter(|e| near.contains(e))
                    .min_by_key(|&e| e.abs_diff(x));
                if best.is_some() {
                    return best;
                }
            }
            if n >= self.cfg.min_ngram
                && let Some(e) = found().last()
            {
                return Some(e);
            }
        }
        None
    }

    /// Adds the generated tokens to the shared cache (once per sequence).
    fn give_to_cache(&mut self) {
        if let (Some(cache), Some(first)) = (&self.cache, self.first_len) {
            // The first call's history ends with the first generated token.
            let start = first.saturating_sub(1).min(self.tokens.len());
            cache.add(&self.tokens[start..]);
        }
    }
}

impl Proposer for NgramProposer {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        if history.is_empty() || max == 0 {
            return Vec::new();
        }
        self.sync(history);
        let len = self.tokens.len();
        match self.continued_copy().or_else(|| self.lookup()) {
            Some(src) => {
                self.copy = Some((len, src));
                self.tokens[src..len.min(src + max)].to_vec()
            }
            None => {
                // The copy's position is kept: the model may come back to the source.
                let max_n = self.cfg.max_ngram.min(len);
                let tail = &self.tokens[len - max_n..];
                self.cache
                    .as_ref()
                    .map_or_else(Vec::new, |c| c.lookup(tail, self.cfg.min_ngram.max(3), max))
            }
        }
    }
}

impl Drop for NgramProposer {
    fn drop(&mut self) {
        self.give_to_cache();
    }
}

/// Recent outputs of many sequences, shared by their n-gram proposers (a server's cache
/// of what it generated lately: answers often repeat across requests — boilerplate code,
/// formats, names).
pub struct NgramCache {
    inner: Mutex<CacheInner>,
    capacity: usize,
    max_ngram: usize,
}

struct CacheInner {
    /// Outputs one after another, each followed by a separator (`u32::MAX`).
    tokens: Vec<u32>,
    index: Index,
}

/// Separates outputs in the cache (never a token id).
const SEP: u32 = u32::MAX;

impl NgramCache {
    /// A cache of at most `capacity` tokens (the oldest half is dropped when full),
    /// indexed by n-grams of up to `max_ngram` tokens.
    pub fn new(capacity: usize, max_ngram: usize) -> NgramCache {
        NgramCache {
            inner: Mutex::new(CacheInner {
                tokens: Vec::new(),
                index: Index::new(1, max_ngram.max(1)),
            }),
            capacity: capacity.max(16),
            max_ngram: max_ngram.max(1),
        }
    }

    /// Adds one output.
    pub fn add(&self, output: &[u32]) {
        if output.len() < 2 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let output = &output[output.len().saturating_sub(self.capacity / 2)..];
        if g.tokens.len() + output.len() + 1 > self.capacity {
            let keep = g.tokens.len() / 2;
            let drop = g.tokens.len() - keep;
            g.tokens.drain(..drop);
            g.index.clear();
        }
        g.tokens.extend_from_slice(output);
        g.tokens.push(SEP);
        let CacheInner { tokens, index } = &mut *g;
        index.extend(tokens, 1);
    }

    /// Tokens in the cache.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |g| g.tokens.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Up to `max` tokens that followed the most recent occurrence of the longest suffix
    /// of `tail` (at least `min` tokens long), stopping at the end of that output.
    pub fn lookup(&self, tail: &[u32], min: usize, max: usize) -> Vec<u32> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let top = self.max_ngram.min(tail.len());
        for n in (min.max(1)..=top).rev() {
            let gram = &tail[tail.len() - n..];
            if let Some(e) = g.index.find(&g.tokens, gram, 1).last() {
                return g.tokens[e..]
                    .iter()
                    .take(max)
                    .take_while(|&&t| t != SEP)
                    .copied()
                    .collect();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NgramConfig {
        NgramConfig::default()
    }

    #[test]
    fn copies_what_followed_the_longest_match() {
        let mut p = NgramProposer::new(cfg());
        // "1 2 3 4 5 6 | 9 2 3" → the 2-gram "2 3" was followed by "4 5 6 9 2 3".
        let h = [1, 2, 3, 4, 5, 6, 9, 2, 3];
        assert_eq!(p.propose(&h, 3), vec![4, 5, 6]);
        // A longer match beats a more recent shorter one: "7 8 2 3" vs "2 3".
        let h = [7, 8, 2, 3, 10, 11, 2, 3, 12, 7, 8, 2, 3];
        let mut p = NgramProposer::new(cfg());
        assert_eq!(p.propose(&h, 2), vec![10, 11]);
        // No match of min_ngram tokens: nothing (a lone repeated token is not enough).
        let mut p = NgramProposer::new(cfg());
        assert_eq!(p.propose(&[5, 1, 6, 2, 7, 1], 4), Vec::<u32>::new());
    }

    #[test]
    fn a_copy_goes_on_and_resumes_after_a_deviation() {
        // Source: 0..40 then a copy of it in progress with 20 replaced by 99 (a rename).
        let src: Vec<u32> = (100..140).collect();
        let mut h = src.clone();
        h.extend_from_slice(&src[..5]);
        let mut p = NgramProposer::new(cfg());
        assert_eq!(p.propose(&h, 4), src[5..9].to_vec());
        // All four accepted and the model's own next token agrees: the copy continues.
        h.extend_from_slice(&src[5..10]);
        assert_eq!(p.propose(&h, 4), src[10..14].to_vec());
        // The model deviates: "99 98" instead of src[10], src[11].
        h.extend_from_slice(&[99, 98]);
        assert_eq!(p.propose(&h, 4), Vec::<u32>::new(), "no n-gram of 99 98");
        // Back on the source: src[12] alone is found near where the copy was.
        h.push(src[12]);
        assert_eq!(p.propose(&h, 3), src[13..16].to_vec());
    }

    #[test]
    fn local_single_token_match_beats_a_later_one() {
        // Token 7 occurs early (at 3) and late (at 30); a copy near the start deviates and
        // comes back on 7: the copy resumes after the early 7, not the late one.
        let mut src: Vec<u32> = (100..130).collect();
        src[3] = 7;
        src[25] = 7;
        let mut h = src.clone();
        h.extend_from_slice(&src[..2]);
        let mut p = NgramProposer::new(cfg());
        assert_eq!(p.propose(&h, 1), vec![src[2]]);
        h.extend_from_slice(&[55, 7]); // src[2] replaced by 55, then src[3] = 7
        assert_eq!(p.propose(&h, 3), src[4..7].to_vec());
    }

    #[test]
    fn a_new_history_starts_over_and_outputs_feed_the_cache() {
        let cache = Arc::new(NgramCache::new(1024, 4));
        {
            let mut p = NgramProposer::with_cache(cfg(), cache.clone());
            // Prompt 1 2 3, generated 50 51 52 53 54.
            p.propose(&[1, 2, 3, 50], 4);
            p.propose(&[1, 2, 3, 50, 51, 52, 53, 54], 4);
        }
        assert_eq!(cache.len(), 6, "the 5 generated tokens and a separator");
        let mut q = NgramProposer::with_cache(cfg(), cache.clone());
        // Another request producing 50 51 52: the cache knows what followed.
        assert_eq!(q.propose(&[9, 9, 8, 50, 51, 52], 4), vec![53, 54]);
        // The same proposer on an unrelated history starts over.
        assert_eq!(q.propose(&[4, 5, 6, 4, 5], 2), vec![6, 4]);
    }
}
