//! Cutting special tokens out of text before the subword model sees it, with llama.cpp's
//! semantics (`tokenizer_st_partition`).
//!
//! llama.cpp takes the special tokens (types CONTROL, USER_DEFINED and UNKNOWN) longest
//! first; for each one it scans every remaining plain-text fragment left to right and cuts
//! out each occurrence. CONTROL and UNKNOWN tokens take part only when the caller asks to
//! parse special tokens; USER_DEFINED ones always do. This module gives the same result with
//! one pass over the text: a byte trie finds every occurrence of every special token, then
//! the occurrences are accepted in llama.cpp's order (token length descending, then id), each
//! one only if it does not overlap an occurrence already accepted — which is exactly "it lies
//! inside a fragment that is still plain text".
//!
//! Not reproduced: the LSTRIP/RSTRIP attributes llama.cpp sets by model name for a few
//! models (Phi-3, Jina), which eat whitespace next to special tokens.

/// A piece of the input: plain text for the subword model, or a token already decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A trie node: children sorted by byte, and the special token ending here, if any.
#[derive(Default)]
struct Node {
    children: Vec<(u8, u32)>,
    token: Option<u32>,
}

/// Finds special tokens in text.
pub(crate) struct SpecialMatcher {
    nodes: Vec<Node>,
    /// Acceptance priority of each special token, by id: lower is taken first.
    rank: std::collections::HashMap<u32, (u32, bool)>,
}

impl SpecialMatcher {
    /// `specials`: (id, text, always) for every special token; `always` is true for the
    /// user-defined ones, which are matched even without `parse_special`. Empty texts are
    /// ignored (they would match everywhere).
    pub fn new(specials: &[(u32, &str, bool)]) -> SpecialMatcher {
        let mut order: Vec<&(u32, &str, bool)> =
            specials.iter().filter(|(_, t, _)| !t.is_empty()).collect();
        order.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let rank = order
            .iter()
            .enumerate()
            .map(|(r, &&(id, _, always))| (id, (r as u32, always)))
            .collect();
        let mut nodes = vec![Node::default()];
        for &&(id, text, _) in &order {
            let mut at = 0usize;
            for &b in text.as_bytes() {
                at = match nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => nodes[at].children[i].1 as usize,
                    Err(i) => {
                        let child = nodes.len() as u32;
                        nodes.push(Node::default());
                        nodes[at].children.insert(i, (b, child));
                        child as usize
                    }
                };
            }
            // Duplicate texts cannot happen (the vocabulary map is unique); keep the first.
            nodes[at].token.get_or_insert(id);
        }
        SpecialMatcher { nodes, rank }
    }

    /// Splits `text` into plain fragments and special tokens, in order.
    pub fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        // Every occurrence (rank, start, end, id) of an eligible special token.
        let bytes = text.as_bytes();
        let mut found: Vec<(u32, usize, usize, u32)> = Vec::new();
        for (start, _) in text.char_indices() {
            let mut at = 0usize;
            for (offset, &b) in bytes[start..].iter().enumerate() {
                match self.nodes[at].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => at = self.nodes[at].children[i].1 as usize,
                    Err(_) => break,
                }
                if let Some(id) = self.nodes[at].token {
                    let (rank, always) = self.rank[&id];
                    if always || parse_special {
                        found.push((rank, start, start + offset + 1, id));
                    }
                }
            }
        }
        if found.is_empty() {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        }

        // Accept in llama.cpp's order; `taken` stays sorted by start and non-overlapping.
        found.sort_unstable();
        let mut taken: Vec<(usize, usize, u32)> = Vec::new();
        for (_, start, end, id) in found {
            let i = taken.partition_point(|&(s, _, _)| s < start);
            let clashes_left = i > 0 && taken[i - 1].1 > start;
            let clashes_right = i < taken.len() && taken[i].0 < end;
            if !clashes_left && !clashes_right {
                taken.insert(i, (start, end, id));
            }
        }

        let mut out = Vec::with_capacity(2 * taken.len() + 1);
        let mut pos = 0;
        for (start, end, id) in taken {
            if start > pos {
                out.push(Fragment::Text(&text[pos..start]));
            }
            out.push(Fragment::Token(id));
            pos = end;
        }
        if pos < text.len() {
            out.push(Fragment::Text(&text[pos..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Fragment::{Text, Token};
    use super::*;

    fn matcher() -> SpecialMatcher {
        SpecialMatcher::new(&[
            (10, "<s>", false),
            (11, "<|im_start|>", false),
            (12, "\n\n", true),
            (13, "ab", false),
            (14, "abc", false),
            (15, "", true),
        ])
    }

    #[test]
    fn control_tokens_only_when_parsing_special() {
        let m = matcher();
        assert_eq!(
            m.partition("<|im_start|>user\n\nhi<s>", true),
            vec![Token(11), Text("user"), Token(12), Text("hi"), Token(10)]
        );
        assert_eq!(
            m.partition("<|im_start|>user\n\nhi<s>", false),
            vec![Text("<|im_start|>user"), Token(12), Text("hi<s>")]
        );
        assert_eq!(m.partition("", true), vec![]);
    }

    #[test]
    fn longest_token_wins_and_occurrences_do_not_overlap() {
        let m = matcher();
        // "abc" (longer) is taken before "ab" wherever both could start.
        assert_eq!(
            m.partition("xabcab", true),
            vec![Text("x"), Token(14), Token(13)]
        );
        // Three newlines: one "\n\n" then a plain "\n".
        assert_eq!(m.partition("\n\n\n", false), vec![Token(12), Text("\n")]);
    }
}
