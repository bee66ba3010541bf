//! One sequence's decoding state, shared by the single-stream [`Session`](crate::Session)
//! and the serving engine: the logits processors, the sampler, the incremental
//! detokenizer, the stop strings and the finish rules.
//!
//! A caller that has the model's logits for a sequence asks the decoder to
//! [`choose`](SequenceDecoder::choose) the next token(s), then
//! [`commit`](SequenceDecoder::commit)s them one at a time, streaming each one's text and
//! stopping at the first that finishes the sequence. Per committed token the finish rules
//! run in this order: end-of-generation token ([`FinishReason::Eos`], no text) → decode to
//! text → stop strings ([`FinishReason::Stop`]) → a logits processor that allows nothing
//! more ([`FinishReason::Constraint`]) → `max_tokens` ([`FinishReason::Length`]) → context
//! limit ([`FinishReason::Context`]).
//!
//! **Several tokens per step.** When a step computed the sequence's last token followed by
//! `k` drafted tokens (from a [`Proposer`](crate::proposer::Proposer)), the model's logits
//! at those `k + 1` positions come in together. Position `i` is processed as if the drafts
//! before it were accepted (the processors see them in the history), and its token is
//! chosen by [`Sampler::verify`]: greedy, the target model's own greedy token (so drafts
//! are kept while they equal the model's choices, as vLLM's and llama.cpp's speculative
//! decoding do for greedy sampling); sampled, the rejection-sampling rule, under which the
//! tokens follow the target's distribution exactly — for deterministic guesses it draws
//! each position as plain sampling would, with the same random numbers, so the tokens are
//! plain sampling's for the seed (the sampler's module docs give the rule and why). Drafts
//! are kept while the chosen token equals them; the first that differs (or the one after
//! the last draft) is the model's own next token. So `a` accepted drafts give `a + 1`
//! tokens per step.

use crate::dry::Dry;
use crate::generate::{FinishReason, GenerateParams};
use crate::processor::{LogitBias, LogitsProcessor, Penalties};
use crate::proposer::Draft;
use crate::sampler::{Sampler, argmax};
use mica_models::blocks::attention::TILED_MIN_TOKENS;
use mica_models::tokenizer::{DecodeOptions, TokenStreamDecoder, Tokenizer, TokenizerError};

/// Most drafted tokens one step verifies: the last token and its draft stay under
/// attention's tiled-path threshold, and the step runs the matrix products with one-token
/// paths (`Workspace::alone_paths`), so they get the arithmetic of one-at-a-time decoding
/// (and the same tokens).
pub const MAX_DRAFT: usize = TILED_MIN_TOKENS - 2;

/// What committing one token produced.
#[derive(Debug)]
pub struct Commit {
    /// Text that became final with this token: whole UTF-8 characters, never part of a stop
    /// string (so often empty).
    pub text: String,
    /// Why the sequence ends with this token, if it does.
    pub finish: Option<FinishReason>,
    /// The token has no entry in the tokenizer's vocabulary (an id of a padded output
    /// layer): it counted as empty text.
    pub undecodable: Option<TokenizerError>,
}

/// The decoding state of one sequence.
pub struct SequenceDecoder {
    sampler: Sampler,
    /// Applied in order before the sampler: logit bias, penalties, DRY, then custom ones.
    processors: Vec<Box<dyn LogitsProcessor>>,
    tokenizer: Tokenizer,
    detok: TokenStreamDecoder,
    stops: StopMatcher,
    /// Prompt then committed tokens.
    history: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    /// The history may reach this many tokens; the token that reaches it finishes the
    /// sequence with [`FinishReason::Context`].
    context_limit: usize,
    ignore_eos: bool,
    /// Processed logits of a step (`[rows, n_vocab]`).
    scratch: Vec<f32>,
}

impl SequenceDecoder {
    /// A decoder for a continuation of `prompt` under `params` (already validated with
    /// [`GenerateParams::validate`]). `context_limit` is the longest history (prompt and
    /// generated tokens) the caller can hold: the token that makes the history this long
    /// is the last one.
    pub fn new(
        tokenizer: &Tokenizer,
        params: &GenerateParams,
        prompt: &[u32],
        context_limit: usize,
    ) -> SequenceDecoder {
        let mut processors: Vec<Box<dyn LogitsProcessor>> = Vec::new();
        if !params.logit_bias.is_empty() {
            processors.push(Box::new(LogitBias::new(&params.logit_bias)));
        }
        if let Some(p) = Penalties::from_params(&params.sampling) {
            processors.push(Box::new(p));
        }
        if let Some(d) = Dry::from_tokenizer(&params.sampling, tokenizer) {
            processors.push(Box::new(d));
        }
        SequenceDecoder {
            sampler: Sampler::new(params.sampling.clone()),
            processors,
            tokenizer: tokenizer.clone(),
            detok: tokenizer.stream_decoder(DecodeOptions { skip_special: true }),
            stops: StopMatcher::new(&params.stop),
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            max_tokens: params.max_tokens,
            context_limit,
            ignore_eos: params.ignore_eos,
            scratch: Vec::new(),
        }
    }

    /// Adds a processor after those already there.
    pub fn push_processor(&mut self, p: Box<dyn LogitsProcessor>) {
        self.processors.push(p);
    }

    /// Prompt then committed tokens.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// The committed (generated) tokens.
    pub fn generated(&self) -> &[u32] {
        &self.history[self.prompt_len..]
    }

    /// Whether tokens are chosen greedily.
    pub fn is_greedy(&self) -> bool {
        self.sampler.params().is_greedy()
    }

    /// The sampling parameters (for proposers that sample their drafts alike).
    pub fn sampling(&self) -> &crate::sampler::SamplingParams {
        self.sampler.params()
    }

    /// Most drafted tokens worth verifying after the history now: what fits before
    /// `max_tokens` and the context limit (a step of `k` drafts gives at most `k + 1`
    /// tokens), at most [`MAX_DRAFT`].
    pub fn max_draft(&self) -> usize {
        let left = self.max_tokens.saturating_sub(self.generated().len());
        let room = self.context_limit.saturating_sub(self.history.len());
        left.min(room).saturating_sub(1).min(MAX_DRAFT)
    }

    /// Puts the tokens a processor forces next (see [`LogitsProcessor::forced`]: a grammar's
    /// fixed keys and punctuation) in `draft`, unless the draft already begins with them:
    /// they are all but certain to be accepted. At most [`SequenceDecoder::max_draft`].
    pub fn forced_draft(&mut self, draft: &mut Draft) {
        let max = self.max_draft();
        if max == 0 {
            return;
        }
        for p in &mut self.processors {
            let forced = p.forced(max);
            if forced.is_empty() {
                continue;
            }
            if !draft.tokens.starts_with(&forced) {
                *draft = Draft::points(forced);
            }
            return;
        }
    }

    /// Tells the processors the draft the next step verifies, before its forward pass (see
    /// [`LogitsProcessor::prefetch`]).
    pub fn prefetch(&mut self, draft: &[u32]) {
        for p in &mut self.processors {
            p.prefetch(draft);
        }
    }

    /// Chooses the next tokens into `out` from `rows` (`[1 + draft.len(), n_vocab]`): the
    /// model's logits at the sequence's last token and at each drafted token after it. The
    /// result is the drafted tokens accepted (module docs), then the model's own next token
    /// (one token when `draft` is empty). Nothing is committed: pass the tokens to
    /// [`SequenceDecoder::commit`] in order. The drafts are deterministic guesses.
    pub fn choose(&mut self, rows: &[f32], draft: &[u32], out: &mut Vec<u32>) {
        self.choose_with(rows, draft, &[], out);
    }

    /// [`SequenceDecoder::choose`] for a [`Draft`] (whose tokens may come with the
    /// distributions they were sampled from).
    pub fn choose_draft(&mut self, rows: &[f32], draft: &Draft, out: &mut Vec<u32>) {
        self.choose_with(rows, &draft.tokens, &draft.dists, out);
    }

    /// [`SequenceDecoder::choose`] with the proposal distributions of the drafted tokens
    /// (see [`Draft::dists`]; empty for deterministic guesses).
    pub fn choose_with(
        &mut self,
        rows: &[f32],
        draft: &[u32],
        dists: &[Vec<(u32, f32)>],
        out: &mut Vec<u32>,
    ) {
        out.clear();
        assert!(
            !rows.is_empty() && rows.len().is_multiple_of(draft.len() + 1),
            "one logits row per drafted token and one more"
        );
        let n_vocab = rows.len() / (draft.len() + 1);
        let n_rows = if self.processors.is_empty() {
            draft.len() + 1
        } else {
            self.process_rows(rows, draft, n_vocab)
        };
        for i in 0..n_rows {
            let row = i * n_vocab..(i + 1) * n_vocab;
            let logits = if self.processors.is_empty() {
                &rows[row]
            } else {
                &self.scratch[row]
            };
            let t = match draft.get(i) {
                Some(&d) => self
                    .sampler
                    .verify(logits, d, dists.get(i).map(Vec::as_slice)),
                None => self.sampler.sample_processed(logits),
            };
            out.push(t);
            if i + 1 == n_rows || t != draft[i] {
                break;
            }
        }
    }

    /// Runs the processors over the first rows of `rows` into `self.scratch`, position `i`
    /// seeing the history plus `draft[..i]`: each draft is accepted before the next row is
    /// processed, and all are rolled back at the end. Returns how many rows were processed
    /// (fewer than `draft.len() + 1` when a processor refused a draft: the rows after it
    /// cannot be chosen from).
    fn process_rows(&mut self, rows: &[f32], draft: &[u32], n_vocab: usize) -> usize {
        self.scratch.clear();
        self.scratch.extend_from_slice(rows);
        let base = self.history.len();
        let mut n_rows = draft.len() + 1;
        // Greedy choice takes the highest logit: the last processor may say it keeps it
        // (`LogitsProcessor::keeps_top`) and skip its work.
        let takes_top = self.sampler.params().takes_top();
        let last = self.processors.len() - 1;
        for i in 0..=draft.len() {
            let row = &mut self.scratch[i * n_vocab..(i + 1) * n_vocab];
            for (j, p) in self.processors.iter_mut().enumerate() {
                if takes_top && j == last && p.keeps_top(argmax(row)) {
                    continue;
                }
                p.process(&self.history, row);
            }
            if i == draft.len() {
                break;
            }
            if !accept_all(&mut self.processors, draft[i]) {
                n_rows = i + 1;
                break;
            }
            self.history.push(draft[i]);
        }
        let tentative = self.history.len() - base;
        if tentative > 0 {
            for p in &mut self.processors {
                p.rollback(tentative);
            }
            self.history.truncate(base);
        }
        n_rows
    }

    /// Appends `token` to the sequence and applies the finish rules (module docs).
    pub fn commit(&mut self, token: u32) -> Commit {
        self.history.push(token);
        for p in &mut self.processors {
            p.accept(token);
        }
        let mut out = Commit {
            text: String::new(),
            finish: None,
            undecodable: None,
        };
        if !self.ignore_eos && self.tokenizer.is_eog(token) {
            out.finish = Some(FinishReason::Eos);
            return out;
        }
        let piece = self.detok.push(token).unwrap_or_else(|e| {
            out.undecodable = Some(e);
            String::new()
        });
        let (ready, hit) = self.stops.push(&piece);
        out.text = ready;
        out.finish = if hit {
            Some(FinishReason::Stop)
        } else if self.processors.iter().any(|p| p.is_complete()) {
            Some(FinishReason::Constraint)
        } else if self.generated().len() >= self.max_tokens {
            Some(FinishReason::Length)
        } else if self.history.len() >= self.context_limit {
            Some(FinishReason::Context)
        } else {
            None
        };
        out
    }

    /// Text still held back when the sequence ends for `finish` (an unfinished stop-string
    /// prefix, an incomplete character); nothing after a stop string or a cancellation.
    pub fn tail(&mut self, finish: FinishReason) -> String {
        match finish {
            FinishReason::Stop | FinishReason::Cancelled => String::new(),
            _ => self.stops.flush(&self.detok.finish()),
        }
    }
}

/// Offers `token` to every processor; if one refuses, those before it take it back.
fn accept_all(processors: &mut [Box<dyn LogitsProcessor>], token: u32) -> bool {
    for i in 0..processors.len() {
        if !processors[i].accept(token) {
            for p in &mut processors[..i] {
                p.rollback(1);
            }
            return false;
        }
    }
    true
}

/// Holds back text that might be the start of a stop string.
struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.to_vec(),
            pending: String::new(),
        }
    }

    /// Adds text; returns what is safe to emit and whether a stop string was found (in which
    /// case the returned text ends right before it).
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.pending.push_str(piece);
        let stops = self.stops.iter().filter(|s| !s.is_empty());
        if let Some(at) = stops.filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in self.pending.char_indices() {
                let suffix = &self.pending[i..];
                if suffix.len() <= keep {
                    break;
                }
                if s.starts_with(suffix) {
                    keep = suffix.len();
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Everything still held back, plus `tail`.
    fn flush(&mut self, tail: &str) -> String {
        let mut s = std::mem::take(&mut self.pending);
        s.push_str(tail);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_across_pieces() {
        let stops = vec!["</end>".to_string(), "STOP".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("hello </"), ("hello ".to_string(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.push("d> after"), (String::new(), true));

        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("a</b"), ("a</b".to_string(), false));
        assert_eq!(m.push("ST"), (String::new(), false));
        assert_eq!(m.push("X"), ("STX".to_string(), false));
        assert_eq!(m.push("é ST"), ("é ".to_string(), false));
        assert_eq!(m.flush("!"), "ST!");
    }

    use crate::sampler::SamplingParams;
    use mica_models::tokenizer::TokenizerSpec;
    use std::sync::{Arc, Mutex};

    /// Byte-level BPE vocabulary: 0 `<|end|>` (end of generation), then "a" "b" "c" " "
    /// "x" "y".
    fn tokenizer() -> Tokenizer {
        let tokens = ["<|end|>", "a", "b", "c", "Ġ", "x", "y"];
        let mut types = vec![1; tokens.len()];
        types[0] = 3;
        Tokenizer::from_spec(&TokenizerSpec {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_types: Some(types),
            merges: Some(Vec::new()),
            eos_id: Some(0),
            ..TokenizerSpec::default()
        })
        .unwrap()
    }

    fn params(max_tokens: usize, stop: &[&str]) -> GenerateParams {
        GenerateParams {
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Logits rows whose argmaxes are `tops` (7 tokens each).
    fn rows(tops: &[u32]) -> Vec<f32> {
        let mut r = vec![0.0; tops.len() * 7];
        for (i, &t) in tops.iter().enumerate() {
            r[i * 7 + t as usize] = 1.0;
        }
        r
    }

    #[test]
    fn finish_rules_apply_in_order() {
        let tok = tokenizer();
        let mut d = SequenceDecoder::new(&tok, &params(10, &["bc"]), &[1], 100);
        let c = d.commit(1);
        assert_eq!((c.text.as_str(), c.finish), ("a", None));
        let c = d.commit(2);
        assert_eq!((c.text.as_str(), c.finish), ("", None), "may start 'bc'");
        let c = d.commit(3);
        assert_eq!((c.text.as_str(), c.finish), ("", Some(FinishReason::Stop)));
        assert_eq!(d.tail(FinishReason::Stop), "");
        assert_eq!(d.generated(), &[1, 2, 3]);

        let mut d = SequenceDecoder::new(&tok, &params(10, &[]), &[1], 100);
        assert_eq!(d.commit(0).finish, Some(FinishReason::Eos));
        let mut p = params(10, &[]);
        p.ignore_eos = true;
        let mut d = SequenceDecoder::new(&tok, &p, &[1], 100);
        assert_eq!(d.commit(0).finish, None);

        // Length before context when both are reached; held-back text in the tail.
        let mut d = SequenceDecoder::new(&tok, &params(2, &["bc"]), &[1], 3);
        assert_eq!(d.commit(5).finish, None);
        let c = d.commit(2);
        assert_eq!(
            (c.text.as_str(), c.finish),
            ("", Some(FinishReason::Length))
        );
        assert_eq!(d.tail(FinishReason::Length), "b");
        let mut d = SequenceDecoder::new(&tok, &params(5, &[]), &[1], 3);
        assert_eq!(d.commit(5).finish, None);
        assert_eq!(d.commit(6).finish, Some(FinishReason::Context));
        assert_eq!(d.tail(FinishReason::Context), "");
    }

    #[test]
    fn greedy_verification_keeps_the_agreeing_prefix_and_one_more() {
        let tok = tokenizer();
        let mut d = SequenceDecoder::new(&tok, &params(100, &[]), &[1], 200);
        let mut out = Vec::new();
        let r = rows(&[1, 2, 3, 5]);
        d.choose(&r, &[1, 2, 4], &mut out);
        assert_eq!(
            out,
            vec![1, 2, 3],
            "the third draft is wrong: the model's token"
        );
        d.choose(&r, &[1, 2, 3], &mut out);
        assert_eq!(out, vec![1, 2, 3, 5], "all right: the model's next one too");
        d.choose(&r, &[6, 2, 3], &mut out);
        assert_eq!(out, vec![1]);
        d.choose(&r[..7], &[], &mut out);
        assert_eq!(out, vec![1]);
        assert!(d.generated().is_empty(), "choosing commits nothing");
        assert_eq!(d.max_draft(), MAX_DRAFT);
        let d = SequenceDecoder::new(&tok, &params(50, &[]), &[1], 5);
        assert_eq!(
            d.max_draft(),
            3,
            "4 more tokens fit the context: 3 drafts and one"
        );
        let d = SequenceDecoder::new(&tok, &params(2, &[]), &[1], 100);
        assert_eq!(d.max_draft(), 1);
    }

    /// A deterministic stand-in for a model: logits over the 7 tokens from the last two.
    fn toy_logits(history: &[u32]) -> Vec<f32> {
        let (a, b) = (history[history.len() - 2], history[history.len() - 1]);
        (0..7u32)
            .map(|t| ((a * 7 + b * 3 + t * 5) % 11) as f32 * 0.4)
            .collect()
    }

    /// Sampled sequences verify deterministic drafts (right, wrong, partly right) and give
    /// exactly the tokens plain sampling gives for the seed, in fewer steps when drafts are
    /// right.
    #[test]
    fn sampled_drafts_give_plain_sampling_s_tokens() {
        let tok = tokenizer();
        let mut p = params(200, &[]);
        p.ignore_eos = true;
        p.sampling = SamplingParams {
            temperature: 0.9,
            seed: 3,
            top_k: 5,
            top_p: 0.95,
            min_p: 0.02,
            repeat_penalty: 1.2,
            ..Default::default()
        };
        let n = 60;
        let mut plain = SequenceDecoder::new(&tok, &p, &[1, 2], 1000);
        let mut out = Vec::new();
        while plain.generated().len() < n {
            plain.choose(&toy_logits(plain.history()), &[], &mut out);
            plain.commit(out[0]);
        }
        let want = plain.generated().to_vec();
        for right in [0usize, 2, 4] {
            let mut d = SequenceDecoder::new(&tok, &p, &[1, 2], 1000);
            assert!(d.max_draft() > 0);
            let mut steps = 0;
            while d.generated().len() < n {
                let done = d.generated().len();
                // 4 guesses: the first `right` from the known answer, the rest wrong.
                let draft: Vec<u32> = (0..4)
                    .map(|i| match want.get(done + i) {
                        Some(&t) if i < right => t,
                        Some(&t) => (t + 1) % 7,
                        None => 0,
                    })
                    .collect();
                let mut h = d.history().to_vec();
                let mut rows = toy_logits(&h);
                for &t in &draft {
                    h.push(t);
                    rows.extend(toy_logits(&h));
                }
                d.choose(&rows, &draft, &mut out);
                for &t in &out {
                    d.commit(t);
                }
                steps += 1;
            }
            assert_eq!(&d.generated()[..n], &want[..], "right {right}");
            if right > 0 {
                assert!(steps <= n.div_ceil(right + 1) + 1, "right {right}: {steps}");
            }
        }
    }

    /// Records what it is told; refuses `refuse`.
    struct Recorder {
        log: Arc<Mutex<Vec<String>>>,
        refuse: Option<u32>,
    }

    impl LogitsProcessor for Recorder {
        fn process(&mut self, history: &[u32], _logits: &mut [f32]) {
            self.log.lock().unwrap().push(format!("p{}", history.len()));
        }
        fn accept(&mut self, token: u32) -> bool {
            let ok = self.refuse != Some(token);
            let e = if ok { "a" } else { "x" };
            self.log.lock().unwrap().push(format!("{e}{token}"));
            ok
        }
        fn rollback(&mut self, n: usize) {
            self.log.lock().unwrap().push(format!("r{n}"));
        }
    }

    #[test]
    fn processors_see_drafts_then_roll_them_back() {
        let tok = tokenizer();
        let logs = [
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
        ];
        let mut d = SequenceDecoder::new(&tok, &params(50, &[]), &[1], 100);
        d.push_processor(Box::new(Recorder {
            log: logs[0].clone(),
            refuse: None,
        }));
        let mut out = Vec::new();
        d.choose(&rows(&[1, 2, 3]), &[1, 5], &mut out);
        assert_eq!(out, vec![1, 2]);
        for &t in &out {
            d.commit(t);
        }
        let log = logs[0].lock().unwrap().clone();
        assert_eq!(log, ["p1", "a1", "p2", "a5", "p3", "r2", "a1", "a2"]);

        // A processor refusing a draft: no row after it is processed or chosen from.
        let mut d = SequenceDecoder::new(&tok, &params(50, &[]), &[1], 100);
        logs[0].lock().unwrap().clear();
        for (log, refuse) in logs.iter().zip([None, Some(5)]) {
            d.push_processor(Box::new(Recorder {
                log: log.clone(),
                refuse,
            }));
        }
        d.choose(&rows(&[1, 5, 3, 4]), &[1, 5, 3], &mut out);
        assert_eq!(out, vec![1, 5], "row 1 is the last one processed");
        assert_eq!(
            logs[0].lock().unwrap().clone(),
            ["p1", "a1", "p2", "a5", "r1", "r1"]
        );
        assert_eq!(
            logs[1].lock().unwrap().clone(),
            ["p1", "a1", "p2", "x5", "r1"]
        );
    }

    /// Masks tokens other than `allow`; says it keeps the top token when that is `allow`.
    struct OnlyAllows {
        allow: u32,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl LogitsProcessor for OnlyAllows {
        fn process(&mut self, history: &[u32], logits: &mut [f32]) {
            self.log.lock().unwrap().push(format!("p{}", history.len()));
            for (i, l) in logits.iter_mut().enumerate() {
                if i as u32 != self.allow {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        fn keeps_top(&mut self, token: u32) -> bool {
            self.log.lock().unwrap().push(format!("k{token}"));
            token == self.allow
        }
    }

    /// Greedy choice asks the last processor whether it keeps the top token and skips
    /// `process` when it does; sampled choice, or a processor that is not last, always
    /// processes.
    #[test]
    fn greedy_choice_asks_the_last_processor_about_its_top_token() {
        let tok = tokenizer();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut d = SequenceDecoder::new(&tok, &params(50, &[]), &[1], 100);
        d.push_processor(Box::new(OnlyAllows {
            allow: 2,
            log: log.clone(),
        }));
        let mut out = Vec::new();
        d.choose(&rows(&[2]), &[], &mut out);
        assert_eq!(out, vec![2]);
        d.choose(&rows(&[3]), &[], &mut out);
        assert_eq!(out, vec![2], "the refused top token is masked");
        assert_eq!(log.lock().unwrap().clone(), ["k2", "k3", "p1"]);

        let sampled = GenerateParams {
            sampling: SamplingParams {
                temperature: 0.8,
                seed: 1,
                ..Default::default()
            },
            ..params(50, &[])
        };
        for (p, second) in [(sampled, false), (params(50, &[]), true)] {
            log.lock().unwrap().clear();
            let mut d = SequenceDecoder::new(&tok, &p, &[1], 100);
            d.push_processor(Box::new(OnlyAllows {
                allow: 2,
                log: log.clone(),
            }));
            if second {
                d.push_processor(Box::new(LogitBias::new(&[])));
            }
            d.choose(&rows(&[2]), &[], &mut out);
            assert_eq!(out, vec![2]);
            assert_eq!(log.lock().unwrap().clone(), ["p1"]);
        }
    }
}
