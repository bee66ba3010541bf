//! [`GrammarProcessor`]: the logits processor that keeps one sequence inside a compiled
//! constraint, through the engine's `LogitsProcessor` seam.
//!
//! Per position it masks every token the grammar does not allow to `-inf` (llguidance's
//! token mask), tells the matcher each token the sequence takes (refusing tokens the
//! grammar does not allow, as a drafted token may be), and takes tokens back when drafts
//! are rolled back. Once the grammar allows nothing more ([`LogitsProcessor::is_complete`])
//! the decoder ends the sequence with `FinishReason::Constraint`.
//!
//! **Off the critical path.** Computing a mask walks the whole token trie (tens of
//! microseconds to milliseconds). Right after a token is accepted — while the caller runs
//! the forward pass of that token — the next mask is computed on the processor's own helper
//! thread; `process` then only waits for what is left of it. [`ConstraintStats`] records
//! both times, so the cost that remains on the critical path can be measured.
//!
//! **Greedy choice checks one token.** When the decoder takes the highest logit, it asks
//! first whether the grammar allows that token (`LogitsProcessor::keeps_top`): if so,
//! masking could not change the choice and no mask is computed; only when the grammar
//! refuses it is the whole mask computed (inline). From that first question on, the
//! processor computes no masks ahead. The check is exact — it answers yes only where the
//! mask would allow the token: positions where the grammar forces bytes (whose mask is the
//! canonical tokenization's token, or tokens that begin with the forced bytes) always
//! take the mask, and grammars that turn llguidance's forcing off (a Lark
//! `%llguidance` declaration) never take the check.
//!
//! **Fail closed.** If the matcher fails part-way (a parser limit hit by an adversarial
//! grammar), no token but end-of-generation is allowed from then on, the processor reports
//! itself complete, and [`ConstraintStats::error`] says why: the output stops rather than
//! going on unconstrained.

use llguidance::Matcher;
use mica_engine::LogitsProcessor;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toktrie::SimpleVob;

/// How a [`GrammarProcessor`] computes its masks.
#[derive(Clone, Copy, Debug)]
pub struct ProcessorOptions {
    /// Compute the next mask on a helper thread as soon as a token is accepted (true), or
    /// only when `process` asks for it (false: every mask on the critical path).
    pub background: bool,
    /// When the decoder takes the highest logit, check that token alone and compute a
    /// whole mask only where the grammar refuses it (true), or compute every mask (false).
    pub greedy_check: bool,
}

impl Default for ProcessorOptions {
    fn default() -> Self {
        ProcessorOptions {
            background: true,
            greedy_check: true,
        }
    }
}

/// Counters of one processor's masks, shared with whoever holds a handle
/// ([`GrammarProcessor::stats`]).
#[derive(Debug, Default)]
pub struct ConstraintStats {
    /// Masks computed.
    pub masks: AtomicU64,
    /// Time spent computing masks, wherever they ran (nanoseconds).
    pub mask_ns: AtomicU64,
    /// Longest single mask (nanoseconds).
    pub max_mask_ns: AtomicU64,
    /// Time `process` waited for a mask: the cost left on the critical path (nanoseconds).
    pub wait_ns: AtomicU64,
    /// Masks computed ahead, during the forward pass, for positions after drafted tokens.
    pub ahead: AtomicU64,
    /// Of those, the ones used (their drafted tokens were verified through the grammar).
    pub ahead_used: AtomicU64,
    /// Positions where greedy choice's token was checked alone (module docs; positions
    /// where the grammar forces bytes take the mask and are not counted).
    pub checks: AtomicU64,
    /// Of those, the ones where the grammar allowed it (no mask computed).
    pub checks_kept: AtomicU64,
    error: Mutex<Option<String>>,
}

impl ConstraintStats {
    /// Why the matcher failed part-way, if it did (the output was then cut short).
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Mean time per mask.
    pub fn mean_mask(&self) -> Duration {
        let n = self.masks.load(Relaxed).max(1);
        Duration::from_nanos(self.mask_ns.load(Relaxed) / n)
    }

    /// Mean time `process` waited per mask.
    pub fn mean_wait(&self) -> Duration {
        let n = self.masks.load(Relaxed).max(1);
        Duration::from_nanos(self.wait_ns.load(Relaxed) / n)
    }

    fn record_mask(&self, took: Duration) {
        let ns = took.as_nanos() as u64;
        self.masks.fetch_add(1, Relaxed);
        self.mask_ns.fetch_add(ns, Relaxed);
        self.max_mask_ns.fetch_max(ns, Relaxed);
    }

    fn set_error(&self, e: String) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(e);
    }
}

type MaskResult = Result<SimpleVob, String>;

/// Work for the helper thread. Each [`Job::Mask`] hands it the matcher and is followed by
/// exactly one [`Job::Ahead`] or [`Job::Return`], after which the thread sends the matcher
/// back with what it computed ([`Done`]).
enum Job {
    /// The matcher, and whether the mask of its current position is wanted (false when the
    /// processor already has it).
    Mask(Box<Matcher>, bool),
    /// Drafted tokens the next step verifies: after the current position's mask, walk
    /// through them computing the mask after each, then roll them back.
    Ahead(Vec<u32>),
    /// Send the matcher back now.
    Return,
}

/// What the helper thread sends back.
struct Done {
    matcher: Box<Matcher>,
    /// The current position's mask, if it was asked for, and its time.
    base: Option<(MaskResult, Duration)>,
    /// The drafted tokens walked through, each with the mask after it and its time (fewer
    /// than the draft when the grammar refused one).
    ahead: Vec<(u32, MaskResult, Duration)>,
    /// Why the walk could not be rolled back (the matcher is then unusable).
    error: Option<String>,
}

/// The helper thread that computes masks in the background.
struct Worker {
    jobs: Sender<Job>,
    /// The grammar's forced tokens at the position of each [`Job::Mask`], sent before its
    /// mask is computed (they take microseconds; the mask much longer).
    forced: Receiver<Vec<u32>>,
    results: Receiver<Done>,
}

impl Worker {
    fn spawn() -> Option<Worker> {
        let (jobs, job_rx) = channel::<Job>();
        let (res_tx, results) = channel::<Done>();
        let (ff_tx, forced) = channel::<Vec<u32>>();
        std::thread::Builder::new()
            .name("mica-grammar".into())
            .spawn(move || {
                while let Ok(job) = job_rx.recv() {
                    let Job::Mask(mut m, want_base) = job else {
                        continue;
                    };
                    let ff = if m.is_stopped() {
                        Vec::new()
                    } else {
                        m.compute_ff_tokens()
                    };
                    if ff_tx.send(ff).is_err() {
                        break;
                    }
                    let base = want_base.then(|| timed(&mut m));
                    let draft = match job_rx.recv() {
                        Ok(Job::Ahead(d)) => d,
                        Ok(_) => Vec::new(),
                        Err(_) => break,
                    };
                    let (ahead, error) = walk(&mut m, base.as_ref().map(|b| &b.0), &draft);
                    let done = Done {
                        matcher: m,
                        base,
                        ahead,
                        error,
                    };
                    if res_tx.send(done).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker {
            jobs,
            forced,
            results,
        })
    }
}

/// The mask of the matcher's current position, and how long it took. A matcher whose
/// grammar is complete allows only end-of-generation (asking llguidance for the mask of a
/// stopped parser would put it in its error state for good: a drafted token that completes
/// the grammar is followed by a row the verification processes).
fn timed(m: &mut Matcher) -> (MaskResult, Duration) {
    let t = Instant::now();
    let mask = m.compute_mask_or_eos().map_err(|e| e.to_string());
    (mask, t.elapsed())
}

/// Consumes the drafted tokens one by one while the grammar allows them (`first`: the
/// current position's mask, when known), computing the mask after each, then rolls them
/// back, leaving the matcher where it was.
fn walk(
    m: &mut Matcher,
    first: Option<&MaskResult>,
    draft: &[u32],
) -> (Vec<(u32, MaskResult, Duration)>, Option<String>) {
    let mut ahead: Vec<(u32, MaskResult, Duration)> = Vec::new();
    for &t in draft {
        let prev = ahead.last().map(|a| &a.1).or(first);
        let allowed = match prev {
            Some(Ok(v)) => v.is_allowed(t),
            Some(Err(_)) => false,
            None => true,
        };
        if !allowed || m.is_stopped() || !matches!(m.try_consume_tokens(&[t]), Ok(1)) {
            break;
        }
        let (mask, took) = timed(m);
        ahead.push((t, mask, took));
    }
    let error = match ahead.len() {
        0 => None,
        n => m.rollback(n).err().map(|e| e.to_string()),
    };
    (ahead, error)
}

/// Masks computed ahead for the drafted tokens of the step being verified: valid while the
/// matcher follows `tokens` from the position where they start.
struct Ahead {
    tokens: Vec<u32>,
    /// `masks[i]`: the mask after `tokens[..i]` (one more than `tokens`).
    masks: Vec<MaskResult>,
    /// How many of `tokens` the matcher has consumed.
    pos: usize,
}

/// Where the matcher is.
enum State {
    /// Here, with the mask of the current position if it is known.
    Idle(Box<Matcher>, Option<MaskResult>),
    /// On the helper thread, computing the mask of the current position (and, once told the
    /// step's draft, the masks along it).
    Computing { ahead_sent: bool },
    /// Gone (a failed hand-over to the helper thread); only EOS is allowed.
    Lost,
}

/// Constrains one sequence to a compiled grammar (module docs).
pub struct GrammarProcessor {
    state: State,
    worker: Option<Worker>,
    opts: ProcessorOptions,
    stats: Arc<ConstraintStats>,
    /// End-of-generation ids: what stays allowed when the matcher has failed.
    eos: Vec<u32>,
    /// The masks along the draft being verified, once the helper thread has sent them.
    ahead: Option<Ahead>,
    /// The current position's mask, known before the matcher went to the helper thread
    /// for the masks along a draft only.
    known_base: Option<MaskResult>,
    /// Whether the helper thread's forced tokens for the job it holds are still to be
    /// received.
    forced_pending: bool,
    /// The trie's vocabulary size (ids at or past it are never allowed).
    n_vocab: usize,
    /// Whether greedy choice's token may be checked alone (the options allow it and the
    /// grammar keeps llguidance's forcing on), and whether it has been (positions are
    /// then chosen greedily: no masks are computed ahead).
    check_allowed: bool,
    checking: bool,
}

impl GrammarProcessor {
    pub(crate) fn new(
        matcher: Matcher,
        first_mask: Option<SimpleVob>,
        opts: ProcessorOptions,
        forcing: bool,
    ) -> GrammarProcessor {
        let env = matcher.tok_env().ok();
        let eos = env
            .as_ref()
            .map(|env| env.tok_trie().eos_tokens().to_vec())
            .unwrap_or_default();
        let n_vocab = env.map_or(0, |env| env.tok_trie().vocab_size());
        GrammarProcessor {
            state: State::Idle(Box::new(matcher), first_mask.map(Ok)),
            worker: None,
            opts,
            stats: Arc::new(ConstraintStats::default()),
            eos,
            ahead: None,
            known_base: None,
            forced_pending: false,
            n_vocab,
            check_allowed: opts.greedy_check && forcing,
            checking: false,
        }
    }

    /// The processor's counters (a shared handle that outlives it).
    pub fn stats(&self) -> Arc<ConstraintStats> {
        self.stats.clone()
    }

    /// Brings the matcher back from the helper thread if it is there, waiting for its
    /// masks.
    fn settle(&mut self) {
        let State::Computing { ahead_sent } = self.state else {
            return;
        };
        let t = Instant::now();
        let pending = std::mem::take(&mut self.forced_pending);
        let got = self.worker.as_ref().and_then(|w| {
            if pending {
                w.forced.recv().ok()?;
            }
            if !ahead_sent {
                w.jobs.send(Job::Return).ok()?;
            }
            w.results.recv().ok()
        });
        self.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        let known = self.known_base.take();
        let Some(done) = got else {
            self.stats.set_error("the mask thread stopped".to_string());
            self.state = State::Lost;
            return;
        };
        if let Some(e) = done.error {
            self.stats.set_error(e);
            self.state = State::Lost;
            return;
        }
        let base = match done.base {
            Some((mask, took)) => {
                self.stats.record_mask(took);
                Some(mask)
            }
            None => known,
        };
        if let Some(base) = &base
            && !done.ahead.is_empty()
        {
            let mut ahead = Ahead {
                tokens: Vec::with_capacity(done.ahead.len()),
                masks: Vec::with_capacity(done.ahead.len() + 1),
                pos: 0,
            };
            ahead.masks.push(base.clone());
            for (t, mask, took) in done.ahead {
                self.stats.record_mask(took);
                self.stats.ahead.fetch_add(1, Relaxed);
                ahead.tokens.push(t);
                ahead.masks.push(mask);
            }
            self.ahead = Some(ahead);
        }
        self.state = State::Idle(done.matcher, base);
    }

    /// Hands the matcher to the helper thread: to compute the current position's mask
    /// (`want_base`), then, if `draft` is given, the masks along it. Returns false (the
    /// matcher stays here) when there is no helper thread.
    fn hand_over(&mut self, want_base: bool, draft: Option<Vec<u32>>) -> bool {
        if !self.opts.background {
            return false;
        }
        if self.worker.is_none() {
            self.worker = Worker::spawn();
        }
        let Some(w) = &self.worker else {
            return false;
        };
        let State::Idle(m, _) = std::mem::replace(
            &mut self.state,
            State::Computing {
                ahead_sent: draft.is_some(),
            },
        ) else {
            return false;
        };
        if let Err(e) = w.jobs.send(Job::Mask(m, want_base)) {
            // The thread is gone: take the matcher back and compute inline from now on.
            if let Job::Mask(m, _) = e.0 {
                self.state = State::Idle(m, self.known_base.take());
            } else {
                self.state = State::Lost;
            }
            self.worker = None;
            self.opts.background = false;
            return false;
        }
        self.forced_pending = true;
        if let Some(d) = draft {
            // A failed send is found by `settle` (the thread is gone).
            let _ = w.jobs.send(Job::Ahead(d));
        }
        true
    }

    /// Starts computing the current position's mask on the helper thread.
    fn start_mask(&mut self) {
        match &self.state {
            State::Idle(m, None) if !m.is_stopped() => {
                self.hand_over(true, None);
            }
            _ => {}
        }
    }

    /// The mask of the current position (computed here if the helper did not).
    fn mask(&mut self) -> Option<&SimpleVob> {
        self.settle();
        let State::Idle(m, mask) = &mut self.state else {
            return None;
        };
        if mask.is_none() {
            let (r, took) = timed(m);
            self.stats.record_mask(took);
            self.stats
                .wait_ns
                .fetch_add(took.as_nanos() as u64, Relaxed);
            *mask = Some(r);
        }
        match mask.as_ref() {
            Some(Ok(v)) => Some(v),
            Some(Err(e)) => {
                self.stats.set_error(e.clone());
                None
            }
            None => None,
        }
    }

    fn matcher_failed(&self) -> bool {
        match &self.state {
            State::Idle(m, mask) => m.is_error() || matches!(mask, Some(Err(_))),
            State::Computing { .. } => false,
            State::Lost => true,
        }
    }
}

impl LogitsProcessor for GrammarProcessor {
    fn process(&mut self, _history: &[u32], logits: &mut [f32]) {
        let eos = std::mem::take(&mut self.eos);
        match self.mask() {
            Some(mask) if !mask.is_zero() => apply_mask(mask, logits),
            _ => {
                // Failed or empty: end the output (fail closed).
                for (i, l) in logits.iter_mut().enumerate() {
                    if !eos.contains(&(i as u32)) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        self.eos = eos;
    }

    fn accept(&mut self, token: u32) -> bool {
        self.settle();
        let State::Idle(m, mask) = &mut self.state else {
            return false;
        };
        if let Some(Ok(v)) = mask
            && !v.is_allowed(token)
        {
            return false;
        }
        match m.try_consume_tokens(&[token]) {
            Ok(1) => {}
            Ok(_) => return false,
            Err(e) => {
                self.stats.set_error(e.to_string());
                return false;
            }
        }
        // Along the draft whose masks were computed ahead: the next mask is known.
        if let Some(a) = &mut self.ahead
            && a.tokens.get(a.pos) == Some(&token)
        {
            a.pos += 1;
            *mask = Some(a.masks[a.pos].clone());
            self.stats.ahead_used.fetch_add(1, Relaxed);
            return true;
        }
        self.ahead = None;
        *mask = None;
        if !self.checking {
            self.start_mask();
        }
        true
    }

    fn rollback(&mut self, n: usize) {
        self.settle();
        if let State::Idle(m, mask) = &mut self.state {
            if let Err(e) = m.rollback(n) {
                self.stats.set_error(e.to_string());
                self.ahead = None;
            }
            *mask = match &mut self.ahead {
                Some(a) if a.pos >= n => {
                    a.pos -= n;
                    Some(a.masks[a.pos].clone())
                }
                _ => {
                    self.ahead = None;
                    None
                }
            };
        }
    }

    fn forced(&mut self, max: usize) -> Vec<u32> {
        let mut ff = match &mut self.state {
            State::Computing { .. } if self.forced_pending => {
                self.forced_pending = false;
                let t = Instant::now();
                let ff = self.worker.as_ref().and_then(|w| w.forced.recv().ok());
                self.stats
                    .wait_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
                ff.unwrap_or_default()
            }
            State::Idle(m, _) if !m.is_stopped() => m.compute_ff_tokens(),
            _ => Vec::new(),
        };
        ff.truncate(max);
        ff
    }

    fn prefetch(&mut self, draft: &[u32]) {
        if draft.is_empty() || !self.opts.background || self.checking {
            return;
        }
        self.ahead = None;
        match &mut self.state {
            State::Computing { ahead_sent } => {
                if !*ahead_sent && let Some(w) = &self.worker {
                    *ahead_sent = true;
                    // A failed send is found by `settle` (the thread is gone).
                    let _ = w.jobs.send(Job::Ahead(draft.to_vec()));
                }
            }
            State::Idle(m, mask) if !m.is_stopped() => {
                let known = mask.take();
                let want_base = known.is_none();
                self.known_base = known;
                self.hand_over(want_base, Some(draft.to_vec()));
            }
            _ => {}
        }
    }

    fn keeps_top(&mut self, token: u32) -> bool {
        if !self.check_allowed {
            return false;
        }
        self.checking = true;
        self.settle();
        let State::Idle(m, mask) = &mut self.state else {
            return false;
        };
        if let Some(known) = mask {
            return matches!(known, Ok(v) if v.is_allowed(token));
        }
        let t = Instant::now();
        let kept = if (token as usize) < self.n_vocab && unforced(m) {
            self.stats.checks.fetch_add(1, Relaxed);
            matches!(m.validate_tokens(&[token]), Ok(1))
        } else {
            false
        };
        if kept {
            self.stats.checks_kept.fetch_add(1, Relaxed);
        }
        self.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        kept
    }

    fn is_complete(&self) -> bool {
        match &self.state {
            State::Idle(m, _) => m.is_stopped() || self.matcher_failed(),
            State::Computing { .. } => false,
            State::Lost => true,
        }
    }
}

/// Whether the matcher's current position is one where its mask is every token whose bytes
/// the parser accepts (plus end-of-generation where the grammar may end) — what
/// `validate_tokens` checks for one token. Where the grammar forces bytes it is not (the
/// mask is the forced bytes' canonical first token, or the tokens that begin with the bytes
/// left over), so those positions take the mask. (With forcing on, which the caller
/// ensures, computing forced tokens and bytes changes nothing the mask would not.)
fn unforced(m: &mut Matcher) -> bool {
    !m.is_stopped()
        && !m.is_error()
        && m.compute_ff_tokens().is_empty()
        && m.compute_ff_bytes().is_empty()
}

/// Sets the logits of the tokens `mask` does not allow to `-inf` (ids past the mask, too).
fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX {
            continue;
        }
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_mask_keeps_only_allowed_tokens() {
        let mut m = SimpleVob::alloc(70);
        for t in [0, 31, 32, 69] {
            m.allow_token(t);
        }
        let mut logits = vec![1.0f32; 72];
        apply_mask(&m, &mut logits);
        let kept: Vec<usize> = (0..72).filter(|&i| logits[i] == 1.0).collect();
        assert_eq!(kept, vec![0, 31, 32, 69]);
        assert!(logits[70].is_infinite() && logits[71].is_infinite());
    }
}
