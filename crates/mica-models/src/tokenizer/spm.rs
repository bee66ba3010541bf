//! SentencePiece-style BPE (GGUF `tokenizer.ggml.model = "llama"`): a port of llama.cpp's
//! `llm_tokenizer_spm_session`, itself a port of SentencePiece's BPE encoder.
//!
//! The text (spaces already replaced by `▁`) starts as one symbol per UTF-8 character. Every
//! adjacent pair whose concatenation is a vocabulary entry is a candidate; the candidate whose
//! token has the highest score is merged first (leftmost on ties), and the new neighbours are
//! re-examined, until no candidate is left. Each final symbol is its token, or, when it is a
//! character the vocabulary lacks, one `<0xNN>` byte token per UTF-8 byte.
//!
//! This is done directly instead of through HF's BPE with merges derived from the scores: the
//! result is llama.cpp's by construction (including its tie order), and nothing has to be
//! derived from a 262k-entry vocabulary at load time.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One symbol of the working sequence: a byte range of the text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    /// The token of a merged symbol, known from its merge (so the end need not look it up
    /// again); `None` for a single character, which may have no token.
    id: Option<u32>,
}

/// A merge candidate: symbols `left` and `right`, whose joined text is a token of `score`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Joined length when the candidate was made; a mismatch later means it is stale.
    len: usize,
    /// The token of the joined text.
    id: u32,
}

impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// What the SPM encoder needs from the vocabulary.
pub(crate) struct SpmVocab<'a> {
    /// Token texts and the text → id index.
    pub store: &'a super::store::VocabStore,
    /// Per-token merge priority, indexed by id.
    pub scores: &'a [f32],
    /// The `<0xNN>` token (or failing that the one-byte token) for each byte value.
    pub byte_tokens: &'a [Option<u32>; 256],
    /// Used for a byte that has no token at all (llama.cpp would abort).
    pub unk: Option<u32>,
}

/// Appends the ids of `text`, which must already have its spaces escaped to `▁`.
pub(crate) fn encode(vocab: &SpmVocab<'_>, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, ch) in text.char_indices() {
        let index = symbols.len();
        symbols.push(Symbol {
            start,
            len: ch.len_utf8(),
            prev: index.checked_sub(1),
            next: None,
            id: None,
        });
        if index > 0 {
            symbols[index - 1].next = Some(index);
        }
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add =
        |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
            let (l, r) = (symbols[left], symbols[right]);
            let joined = &text[l.start..r.start + r.len];
            if let Some(id) = vocab.store.id(joined) {
                queue.push(Bigram {
                    score: vocab.scores[id as usize],
                    left,
                    right,
                    len: joined.len(),
                    id,
                });
            }
        };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i - 1, i);
    }

    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        // Skip candidates one of whose symbols has changed since it was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len {
            continue;
        }
        // Merge the right symbol into the left one and unlink it.
        symbols[bigram.left].len += r.len;
        symbols[bigram.left].id = Some(bigram.id);
        symbols[bigram.right].len = 0;
        symbols[bigram.left].next = r.next;
        if let Some(next) = r.next {
            symbols[next].prev = Some(bigram.left);
        }
        if let Some(prev) = symbols[bigram.left].prev {
            try_add(&mut queue, &symbols, prev, bigram.left);
        }
        if let Some(next) = symbols[bigram.left].next {
            try_add(&mut queue, &symbols, bigram.left, next);
        }
    }

    let mut cursor = Some(0);
    while let Some(i) = cursor {
        let sym = symbols[i];
        let piece = &text[sym.start..sym.start + sym.len];
        match sym.id.or_else(|| vocab.store.id(piece)) {
            Some(id) => out.push(id),
            None => out.extend(
                piece
                    .bytes()
                    .filter_map(|b| vocab.byte_tokens[b as usize].or(vocab.unk)),
            ),
        }
        cursor = sym.next;
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::VocabStore;
    use super::*;

    fn toy() -> (VocabStore, Vec<f32>, [Option<u32>; 256]) {
        // ids: 0 a, 1 b, 2 c, 3 ab, 4 bc, 5 abc, 6 <0x78> ('x')
        let tokens = ["a", "b", "c", "ab", "bc", "abc", "<0x78>"].map(String::from);
        let scores = vec![0.0, 0.0, 0.0, -2.0, -1.0, -3.0, 0.0];
        let (store, duplicates) = VocabStore::new(&tokens).unwrap();
        assert_eq!(duplicates, 0);
        let mut bytes = [None; 256];
        bytes[b'x' as usize] = Some(6);
        (store, scores, bytes)
    }

    #[test]
    fn highest_score_merges_first_then_bytes_for_unknown_chars() {
        let (store, scores, bytes) = toy();
        let vocab = SpmVocab {
            store: &store,
            scores: &scores,
            byte_tokens: &bytes,
            unk: None,
        };
        let mut out = Vec::new();
        // "bc" (-1) beats "ab" (-2); then "a"+"bc" = "abc" exists.
        encode(&vocab, "abc", &mut out);
        assert_eq!(out, vec![5]);
        out.clear();
        // "ab" then "c"; 'x' is not a token, so its byte token.
        encode(&vocab, "abx", &mut out);
        assert_eq!(out, vec![3, 6]);
        out.clear();
        encode(&vocab, "", &mut out);
        assert!(out.is_empty());
    }
}
