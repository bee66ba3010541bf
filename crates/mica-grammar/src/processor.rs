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
}

impl Default for ProcessorOptions {
    fn default() -> Self {
        ProcessorOptions { background: true }
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

type MaskResult = (Matcher, Result<SimpleVob, String>, Duration);

/// The helper thread that computes masks in the background.
struct Worker {
    jobs: Sender<Matcher>,
    results: Receiver<MaskResult>,
}

impl Worker {
    fn spawn() -> Option<Worker> {
        let (jobs, job_rx) = channel::<Matcher>();
        let (res_tx, results) = channel::<MaskResult>();
        std::thread::Builder::new()
            .name("mica-grammar".into())
            .spawn(move || {
                for mut m in job_rx {
                    let t = Instant::now();
                    let mask = m.compute_mask().map_err(|e| e.to_string());
                    if res_tx.send((m, mask, t.elapsed())).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker { jobs, results })
    }
}

/// Where the matcher is.
enum State {
    /// Here, with the mask of the current position if it is known.
    Idle(Box<Matcher>, Option<Result<SimpleVob, String>>),
    /// On the helper thread, computing the mask of the current position.
    Computing,
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
}

impl GrammarProcessor {
    pub(crate) fn new(
        matcher: Matcher,
        first_mask: Option<SimpleVob>,
        opts: ProcessorOptions,
    ) -> GrammarProcessor {
        let eos = matcher
            .tok_env()
            .map(|env| env.tok_trie().eos_tokens().to_vec())
            .unwrap_or_default();
        GrammarProcessor {
            state: State::Idle(Box::new(matcher), first_mask.map(Ok)),
            worker: None,
            opts,
            stats: Arc::new(ConstraintStats::default()),
            eos,
        }
    }

    /// The processor's counters (a shared handle that outlives it).
    pub fn stats(&self) -> Arc<ConstraintStats> {
        self.stats.clone()
    }

    /// Brings the matcher back from the helper thread if it is there, waiting for its mask.
    fn settle(&mut self) {
        if !matches!(self.state, State::Computing) {
            return;
        }
        let t = Instant::now();
        let got = self.worker.as_ref().and_then(|w| w.results.recv().ok());
        self.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        self.state = match got {
            Some((m, mask, took)) => {
                self.stats.record_mask(took);
                State::Idle(Box::new(m), Some(mask))
            }
            None => {
                self.stats.set_error("the mask thread stopped".to_string());
                State::Lost
            }
        };
    }

    /// Starts computing the current position's mask on the helper thread.
    fn start_mask(&mut self) {
        if !self.opts.background {
            return;
        }
        let State::Idle(m, None) = &self.state else {
            return;
        };
        if m.is_stopped() {
            return;
        }
        if self.worker.is_none() {
            self.worker = Worker::spawn();
        }
        let Some(w) = &self.worker else {
            return;
        };
        let State::Idle(m, _) = std::mem::replace(&mut self.state, State::Computing) else {
            return;
        };
        if let Err(e) = w.jobs.send(*m) {
            // The thread is gone: take the matcher back and compute inline from now on.
            self.state = State::Idle(Box::new(e.0), None);
            self.worker = None;
            self.opts.background = false;
        }
    }

    /// The mask of the current position (computed here if the helper did not).
    fn mask(&mut self) -> Option<&SimpleVob> {
        self.settle();
        let State::Idle(m, mask) = &mut self.state else {
            return None;
        };
        if mask.is_none() {
            let t0 = Instant::now();
            let r = m.compute_mask().map_err(|e| e.to_string());
            let took = t0.elapsed();
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
            State::Computing => false,
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
        *mask = None;
        self.start_mask();
        true
    }

    fn rollback(&mut self, n: usize) {
        self.settle();
        if let State::Idle(m, mask) = &mut self.state {
            if let Err(e) = m.rollback(n) {
                self.stats.set_error(e.to_string());
            }
            *mask = None;
        }
    }

    fn is_complete(&self) -> bool {
        match &self.state {
            State::Idle(m, _) => m.is_stopped() || self.matcher_failed(),
            State::Computing => false,
            State::Lost => true,
        }
    }
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
