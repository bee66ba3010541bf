//! How a request that arrives while a step runs gets that step abandoned (the rule is in
//! the `engine` module docs): the engine publishes, per step, the highest lane of the
//! step's prompt work; a submitter of a higher lane flags the step; the forward pass asks
//! before each layer whether the flag is up.

use crate::scheduler::Lane;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// What submitters know of the step running now, so that a more urgent request can have it
/// abandoned.
#[derive(Default)]
pub(crate) struct StepGate {
    /// `step << 9 | ABANDONED? | lane floor`: the running step's number, whether it was
    /// abandoned, and the index of the highest lane of its prompt work (`NO_FLOOR`: not
    /// abandonable, or no step running). The step number makes a stale read harmless: a
    /// compare-and-swap against it cannot abandon a later step.
    word: AtomicU64,
    /// Requests sent per lane (counted before they enter the channel), so that the engine
    /// can tell a step planned without a request already on its way.
    pub(crate) sent: [AtomicU64; 3],
}

const NO_FLOOR: u64 = 0xff;
const ABANDONED: u64 = 1 << 8;

impl StepGate {
    pub(crate) fn new() -> StepGate {
        let g = StepGate::default();
        g.word.store(NO_FLOOR, SeqCst);
        g
    }

    /// Marks step `step` as running with prompt work of `floor` at best.
    pub(crate) fn open(&self, step: u64, floor: Option<Lane>) {
        let f = floor.map_or(NO_FLOOR, |l| l.index() as u64);
        self.word.store(step << 9 | f, SeqCst);
    }

    /// No step running.
    pub(crate) fn close(&self) {
        self.word.store(NO_FLOOR, SeqCst);
    }

    /// Abandons the running step if its prompt work is all of a lower lane than `lane`.
    pub(crate) fn interrupt_for(&self, lane: Lane) {
        let mut w = self.word.load(SeqCst);
        loop {
            let floor = w & 0xff;
            if w & ABANDONED != 0 || floor == NO_FLOOR || lane.index() as u64 >= floor {
                return;
            }
            match self.word.compare_exchange(w, w | ABANDONED, SeqCst, SeqCst) {
                Ok(_) => return,
                Err(now) => w = now,
            }
        }
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.word.load(SeqCst) & ABANDONED != 0
    }
}
