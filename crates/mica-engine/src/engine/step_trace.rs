//! The `step` trace span of the engine (`--trace`): opened before the step is scheduled,
//! given the batch composition once the plan is known. Counting the composition walks the
//! plan, so it happens only while a trace subscriber listens.

use crate::scheduler::{Lane, Scheduler, StepPlan};
use tracing::field::Empty;

/// A `step` span whose composition fields [`record`] fills in.
pub(super) fn step_span() -> tracing::Span {
    tracing::trace_span!(
        "step",
        sequences = Empty,
        tokens = Empty,
        decodes = Empty,
        prompt_tokens = Empty,
        draft_tokens = Empty,
        interactive = Empty,
        background = Empty,
        bulk = Empty,
        prompt_lane = Empty,
    )
}

/// Records what `plan` computes on `span`: sequences and tokens, how many sequences decode
/// (their last token and any draft) and how many prompt tokens the others bring, drafted
/// tokens, sequences per lane, and the lane of the step's prompt work (priority scheduling).
pub(super) fn record(span: &tracing::Span, plan: &StepPlan, sched: &Scheduler) {
    if span.is_disabled() {
        return;
    }
    let decoding = |s: &&crate::scheduler::Scheduled| s.sample && s.n == 1 + s.draft;
    let mut lanes = [0usize; 3];
    for s in &plan.seqs {
        if let Some(seq) = sched.get(s.id) {
            lanes[seq.lane.index()] += 1;
        }
    }
    span.record("sequences", plan.seqs.len());
    span.record("tokens", plan.n_tokens());
    span.record("decodes", plan.seqs.iter().filter(decoding).count());
    let prompt: usize = plan.seqs.iter().filter(|s| !decoding(s)).map(|s| s.n).sum();
    span.record("prompt_tokens", prompt);
    span.record(
        "draft_tokens",
        plan.seqs.iter().map(|s| s.draft).sum::<usize>(),
    );
    for lane in Lane::ALL {
        span.record(lane.as_str(), lanes[lane.index()]);
    }
    if let Some(l) = plan.prompt_lane {
        span.record("prompt_lane", l.as_str());
    }
}
