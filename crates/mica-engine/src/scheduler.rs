//! The step scheduler: which sequences get how many tokens in the next forward pass.
//!
//! Modelled on vLLM v1: there is no prefill or decode mode, only each sequence's *tokens
//! known* (prompt + generated) against its *tokens computed* (keys and values in the cache).
//! Each step [`Scheduler::schedule`] hands out a token budget:
//! 1. every running sequence with one token left (decoding) gets it, in priority order —
//!    decoding never waits behind a long prompt;
//! 2. the rest of the budget goes to prompts (running ones part-way through, then waiting
//!    ones, admitted in priority order while there is a free slot and KV room), in chunks.
//!    Under priority scheduling a step takes prompts of one (effective) lane only: when an
//!    interactive prompt is in the step, bulk prompts wait for the next step, which keeps
//!    that step short and the interactive time-to-first-token close to an idle server's.
//!    For the same reason background and bulk prompts are cut into chunks of at most
//!    [`SchedulerConfig::low_lane_chunk`] tokens (128), and while interactive requests are
//!    running or waiting, into one chunk of [`SchedulerConfig::low_lane_chunk_busy`] (64) per
//!    step: the steps interactive sequences decode in stay short, at some cost in bulk
//!    prompt throughput. A step whose prompt work is all of a lower lane than a request
//!    that arrives while it runs is abandoned by the engine ([`StepPlan::prompt_lane`]).
//!
//! **Drafts** (multi-token steps): a decoding sequence may carry drafted tokens after its
//! last one ([`Scheduler::set_draft`]). The step then computes the last token and the draft
//! together ([`Scheduled::draft`]), when the budget and free blocks allow without preempting
//! anyone (else the draft is dropped and the sequence decodes one token); drafted tokens
//! never enter the prefix cache. [`Scheduler::accept_draft`] then keeps the part the model
//! confirmed and rolls the rest back: tokens dropped, computed count and blocks shrunk.
//! A preempted sequence loses its draft.
//!
//! **Chunks** are all of what is left when it fits, else at least [`SchedulerConfig::min_chunk`]
//! tokens leaving none or at least as many for later. With `min_chunk` = attention's
//! tiled-path threshold, a prompt's tokens take the same attention path (tiled for prompts of
//! 64+ uncached tokens, vector below) whatever chunks the load cuts it into, so results do
//! not depend on what else runs (batch invariance; see `mica_models` `AttentionPolicy`).
//!
//! **Priority lanes** ([`Lane`]): interactive > background > bulk. Order is by *effective*
//! lane, then arrival. Aging rule: a sequence's effective lane rises one step for every
//! [`SchedulerConfig::aging`] it has existed (default 10 s), up to interactive, so a bulk
//! request waits at most about 20 s before it competes with interactive ones as an equal
//! (older first). `SchedulePolicy::Fifo` orders by arrival alone.
//!
//! **Preemption** (vLLM's recompute): when a running sequence needs a block and none is free,
//! the running sequence of the lowest *base* lane (aging ignored), most recently started, is
//! preempted — its blocks are released (full ones stay in the prefix cache, so resuming is
//! often cheap) and it goes back to waiting with every token it has, to be recomputed. A
//! sequence only ever preempts sequences of its own lane or lower (possibly itself), and a
//! waiting request being admitted only preempts strictly lower lanes: an interactive request
//! is never preempted in favour of bulk. FIFO preempts the most recently started sequence.

use crate::kv_manager::{BlockId, BlockManager, SeqBlocks};
use mica_models::SeqId;
use mica_models::blocks::attention::TILED_MIN_TOKENS;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A request's identity in the engine.
pub type ReqId = u64;

/// Priority lane of a request (lower value: served first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    Interactive = 0,
    Background = 1,
    Bulk = 2,
}

impl Lane {
    pub const ALL: [Lane; 3] = [Lane::Interactive, Lane::Background, Lane::Bulk];

    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Interactive => "interactive",
            Lane::Background => "background",
            Lane::Bulk => "bulk",
        }
    }

    pub fn parse(s: &str) -> Option<Lane> {
        match s.trim().to_ascii_lowercase().as_str() {
            "interactive" | "high" => Some(Lane::Interactive),
            "background" | "normal" => Some(Lane::Background),
            "bulk" | "low" | "batch" => Some(Lane::Bulk),
            _ => None,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// How waiting and running sequences are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulePolicy {
    /// Lanes with aging, preemption by lane.
    Priority,
    /// Arrival order only (for comparison).
    Fifo,
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub policy: SchedulePolicy,
    /// Tokens per step (all sequences together).
    pub max_batch_tokens: usize,
    /// Sequences running at once (KV cache slots).
    pub max_running: usize,
    /// Waiting time that raises a sequence's effective lane by one.
    pub aging: Duration,
    /// Smallest prompt chunk when a prompt is split (see the module docs).
    pub min_chunk: usize,
    /// Priority only: most prompt tokens a background or bulk sequence gets per step, so
    /// that the step an interactive request arrives during ends soon (at least
    /// `2 * min_chunk`, so any prompt can still be chunked).
    pub low_lane_chunk: usize,
    /// Priority only: while interactive requests are running or waiting, background and
    /// bulk prompts get one chunk of this many tokens per step (all of it when less than
    /// `2 * min_chunk` is left; at least `min_chunk`), so the interactive decodes they share
    /// steps with stay fast.
    pub low_lane_chunk_busy: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            policy: SchedulePolicy::Priority,
            max_batch_tokens: 256,
            max_running: 32,
            aging: Duration::from_secs(10),
            min_chunk: TILED_MIN_TOKENS,
            low_lane_chunk: 2 * TILED_MIN_TOKENS,
            low_lane_chunk_busy: TILED_MIN_TOKENS,
        }
    }
}

/// The scheduler's view of one sequence.
#[derive(Debug)]
pub struct Sequence {
    pub id: ReqId,
    pub lane: Lane,
    pub arrival: Instant,
    /// Prompt then generated tokens: `[n_known]`.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    pub n_computed: usize,
    /// Drafted tokens at the end of `tokens` (not yet confirmed by the model).
    pub n_draft: usize,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cached_tokens: usize,
    pub blocks: SeqBlocks,
    /// KV cache slot while running.
    pub slot: Option<SeqId>,
    /// Admission order (0 while waiting).
    pub started: u64,
    pub preemptions: u32,
    admitted_once: bool,
}

impl Sequence {
    /// Tokens known but not computed.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.n_computed
    }

    /// Whether the sequence is decoding: only its last token and its draft are uncomputed.
    pub fn is_decoding(&self) -> bool {
        self.remaining() == 1 + self.n_draft
    }

    /// The drafted tokens after the last token.
    pub fn draft(&self) -> &[u32] {
        &self.tokens[self.tokens.len() - self.n_draft..]
    }
}

/// One sequence's share of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: ReqId,
    pub slot: SeqId,
    /// First position computed (= tokens computed before the step).
    pub start: usize,
    pub n: usize,
    /// Whether the step computes the last known token, so a new token is sampled.
    pub sample: bool,
    /// Drafted tokens among the last of the `n` (with `sample`): logits are wanted at the
    /// last `draft + 1` positions.
    pub draft: usize,
    /// Whether attention takes its tiled path for these tokens (see [`tiled_run`]); the
    /// engine names the sequence to the model when `n` alone would not choose it.
    pub tiled: bool,
}

/// Whether a step's `n` tokens of a sequence from position `start` take attention's tiled
/// path: a run of [`TILED_MIN_TOKENS`] or more does (`AttentionPolicy::PerSequence`), and so
/// does any part of a prompt of that length — also the few tokens left after a prefix-cache
/// hit — so every prompt position gets the arithmetic of the whole prompt computed alone.
/// Decoding (one token and its draft, after the prompt) takes the vector path.
pub fn tiled_run(start: usize, n: usize, prompt_len: usize) -> bool {
    n >= TILED_MIN_TOKENS || (start < prompt_len && prompt_len >= TILED_MIN_TOKENS)
}

/// What one step runs.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    pub seqs: Vec<Scheduled>,
    /// Block copies to make before the step (copy-on-write): `(src, dst)`.
    pub copies: Vec<(BlockId, BlockId)>,
    /// Sequences sent back to waiting this step.
    pub preempted: Vec<ReqId>,
    /// Priority only: the highest (effective) lane of the step's prompt work, `None` when it
    /// has none (decodes only) or under FIFO. A request of a higher lane arriving while the
    /// step runs may abandon it: the step holds nothing more urgent than prompt chunks that
    /// can be recomputed.
    pub prompt_lane: Option<Lane>,
}

impl StepPlan {
    pub fn n_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.n).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

/// Why a sequence can't be added.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    #[error("request {0} is already known")]
    Duplicate(ReqId),
    #[error("the sequence needs {needed} KV blocks but the pool has {total}")]
    TooLarge { needed: usize, total: usize },
    #[error("the prompt is empty")]
    Empty,
}

/// Tokens of a prompt with `remaining` uncomputed tokens that go into a step with `budget`
/// tokens left: all of them if they fit, else a chunk of at least `min_chunk` that leaves
/// none or at least `min_chunk`; 0 when no such chunk fits.
pub fn prefill_chunk(remaining: usize, budget: usize, min_chunk: usize) -> usize {
    if remaining <= budget {
        return remaining;
    }
    if remaining < 2 * min_chunk {
        return 0;
    }
    let n = budget.min(remaining - min_chunk);
    if n >= min_chunk { n } else { 0 }
}

/// Sequences, lanes and the KV block manager.
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: BlockManager,
    seqs: HashMap<ReqId, Sequence>,
    /// Waiting ids in arrival order.
    waiting: Vec<ReqId>,
    running: Vec<ReqId>,
    free_slots: Vec<SeqId>,
    started: u64,
    preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: BlockManager) -> Scheduler {
        let slots = cfg.max_running.max(1);
        Scheduler {
            cfg,
            kv,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            free_slots: (0..slots).rev().collect(),
            started: 0,
            preemptions: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn kv(&self) -> &BlockManager {
        &self.kv
    }

    pub fn kv_mut(&mut self) -> &mut BlockManager {
        &mut self.kv
    }

    /// Queues a sequence.
    pub fn add(
        &mut self,
        id: ReqId,
        lane: Lane,
        tokens: Vec<u32>,
        now: Instant,
    ) -> Result<(), AddError> {
        if tokens.is_empty() {
            return Err(AddError::Empty);
        }
        if self.seqs.contains_key(&id) {
            return Err(AddError::Duplicate(id));
        }
        let needed = self.kv.blocks_for(tokens.len() + 1);
        if needed > self.kv.n_blocks() {
            return Err(AddError::TooLarge {
                needed,
                total: self.kv.n_blocks(),
            });
        }
        let prompt_len = tokens.len();
        self.seqs.insert(
            id,
            Sequence {
                id,
                lane,
                arrival: now,
                tokens,
                prompt_len,
                n_computed: 0,
                n_draft: 0,
                cached_tokens: 0,
                blocks: SeqBlocks::default(),
                slot: None,
                started: 0,
                preemptions: 0,
                admitted_once: false,
            },
        );
        self.waiting.push(id);
        Ok(())
    }

    /// Keys the prefix-cache blocks of waiting sequence `id` by `salt` as well as by its
    /// tokens ([`SeqBlocks::set_salt`]): e.g. its LoRA adapters, so that blocks computed
    /// under other adapters (or none) are never reused for it, nor its blocks for them.
    pub fn set_prefix_salt(&mut self, id: ReqId, salt: u64) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.blocks.set_salt(salt);
        }
    }

    pub fn get(&self, id: ReqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub fn contains(&self, id: ReqId) -> bool {
        self.seqs.contains_key(&id)
    }

    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    /// Waiting sequences per lane.
    pub fn waiting_by_lane(&self) -> [usize; 3] {
        let mut n = [0; 3];
        for id in &self.waiting {
            n[self.seqs[id].lane.index()] += 1;
        }
        n
    }

    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The block table of a running sequence.
    pub fn blocks(&self, id: ReqId) -> &[BlockId] {
        self.seqs.get(&id).map_or(&[], |s| &s.blocks.blocks)
    }

    /// Prompt tokens a sequence of `lane` with `remaining` uncomputed tokens may take from
    /// what is left of the step's budget (`busy`: interactive requests are running or
    /// waiting and this sequence does not rank as one).
    fn chunk_budget(
        cfg: &SchedulerConfig,
        lane: Lane,
        remaining: usize,
        budget: usize,
        busy: bool,
    ) -> usize {
        if cfg.policy != SchedulePolicy::Priority || lane == Lane::Interactive {
            return budget;
        }
        if busy {
            if remaining < 2 * cfg.min_chunk {
                // Too short to split: all of it (at most 2 * min_chunk - 1 tokens).
                return budget;
            }
            return budget.min(cfg.low_lane_chunk_busy.max(cfg.min_chunk));
        }
        budget.min(cfg.low_lane_chunk.max(2 * cfg.min_chunk))
    }

    /// Whether an interactive request is running or waiting.
    fn interactive_busy(&self) -> bool {
        self.cfg.policy == SchedulePolicy::Priority
            && self.seqs.values().any(|s| s.lane == Lane::Interactive)
    }

    /// Effective lane (0 = interactive) after aging.
    fn effective_lane(&self, s: &Sequence, now: Instant) -> usize {
        let waited = now.saturating_duration_since(s.arrival);
        let steps = if self.cfg.aging.is_zero() {
            0
        } else {
            (waited.as_secs_f64() / self.cfg.aging.as_secs_f64()) as usize
        };
        s.lane.index().saturating_sub(steps)
    }

    /// `ids` sorted in scheduling order.
    fn order(&self, ids: &mut [ReqId], now: Instant) {
        let key = |id: &ReqId| {
            let s = &self.seqs[id];
            let lane = match self.cfg.policy {
                SchedulePolicy::Priority => self.effective_lane(s, now),
                SchedulePolicy::Fifo => 0,
            };
            (lane, s.arrival, s.id)
        };
        ids.sort_by_key(key);
    }

    /// Plans the next step.
    pub fn schedule(&mut self, now: Instant) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_batch_tokens;

        // 1. Decoding sequences, one token each; then their drafts, in what budget and free
        //    blocks are left (a draft never takes a block another sequence needs).
        let mut running = self.running.clone();
        self.order(&mut running, now);
        let mut drafts = Vec::new();
        for &id in &running {
            if budget == 0 {
                break;
            }
            let Some(s) = self.seqs.get(&id) else {
                continue;
            };
            if s.slot.is_none() || !s.is_decoding() {
                continue;
            }
            if s.n_draft > 0 {
                drafts.push((id, s.draft().to_vec()));
                self.drop_draft(id);
            }
            if self.grow(id, 1, &mut plan, &mut budget) {
                budget -= 1;
            }
        }
        for (id, draft) in drafts {
            self.schedule_draft(id, draft, &mut plan, &mut budget);
        }

        // 2. Prompts: running ones part-way, then waiting ones, in one priority order.
        let mut cands: Vec<ReqId> = self
            .running
            .iter()
            .copied()
            .filter(|id| !self.seqs[id].is_decoding())
            .chain(self.waiting.iter().copied())
            .collect();
        self.order(&mut cands, now);
        // Priority: once a prompt of some lane is in the step, prompts of lower lanes wait
        // for the next one, so the step stays short and the higher lane's first token comes
        // sooner (decodes of every lane still run).
        let mut top_lane: Option<usize> = None;
        let busy = self.interactive_busy();
        let mut prompts: Vec<(ReqId, usize)> = Vec::new();
        for id in cands {
            let Some(s) = self.seqs.get(&id) else {
                continue;
            };
            let lane = self.effective_lane(s, now);
            if self.cfg.policy == SchedulePolicy::Priority {
                if top_lane.is_some_and(|top| lane > top) {
                    break;
                }
                top_lane = Some(lane);
                // While interactive work is on, one low-lane prompt chunk per step (aged
                // sequences ranking as interactive are not low-lane).
                if busy && lane > 0 && !prompts.is_empty() {
                    break;
                }
            }
            if s.slot.is_some() {
                if s.is_decoding() || plan.seqs.iter().any(|p| p.id == id) {
                    continue;
                }
                let cap =
                    Self::chunk_budget(&self.cfg, s.lane, s.remaining(), budget, busy && lane > 0);
                let n = prefill_chunk(s.remaining(), cap, self.cfg.min_chunk);
                if n == 0 {
                    break;
                }
                if self.grow(id, n, &mut plan, &mut budget) {
                    budget -= n;
                    prompts.push((id, lane));
                }
            } else if self.admit(id, &mut plan, &mut budget, busy && lane > 0) {
                prompts.push((id, lane));
            } else {
                break;
            }
        }
        if self.cfg.policy == SchedulePolicy::Priority {
            // (A prompt chunk may have been preempted by a later one.)
            plan.prompt_lane = prompts
                .iter()
                .filter(|(id, _)| plan.seqs.iter().any(|p| p.id == *id))
                .map(|&(_, lane)| lane)
                .min()
                .map(|l| Lane::ALL[l]);
        }
        // Hybrid models: the recurrent states worth keeping that the step computes.
        for p in &plan.seqs {
            if let Some(s) = self.seqs.get_mut(&p.id) {
                self.kv
                    .plan_captures(&mut s.blocks, p.start, p.n, s.prompt_len);
            }
        }
        plan
    }

    /// Hybrid models: the checkpoint running sequence `id` must restore its recurrent state
    /// from before its first step, if it starts from a cached prefix (given once).
    pub fn take_restore(&mut self, id: ReqId) -> Option<crate::checkpoints::CkptId> {
        let s = self.seqs.get_mut(&id)?;
        self.kv.take_restore(&mut s.blocks)
    }

    /// Gives running sequence `id` room for `n` more tokens and schedules it, if the pool
    /// has the blocks (preempting no one).
    fn try_grow(&mut self, id: ReqId, n: usize, plan: &mut StepPlan) -> bool {
        let s = self.seqs.get_mut(&id).expect("running");
        let (start, end) = (s.n_computed, s.n_computed + n);
        if !self
            .kv
            .allocate(&mut s.blocks, start, end, &mut plan.copies)
        {
            return false;
        }
        plan.seqs.push(Scheduled {
            id,
            slot: s.slot.expect("running"),
            start,
            n,
            sample: end == s.tokens.len(),
            draft: 0,
            tiled: tiled_run(start, n, s.prompt_len),
        });
        true
    }

    /// Puts `draft` back after decoding sequence `id` (scheduled for its last token in
    /// `plan`) and adds it to the step, if the budget and the free blocks hold it;
    /// otherwise the draft is dropped.
    fn schedule_draft(
        &mut self,
        id: ReqId,
        draft: Vec<u32>,
        plan: &mut StepPlan,
        budget: &mut usize,
    ) {
        let k = draft.len();
        let Some(p) = plan.seqs.iter_mut().find(|p| p.id == id) else {
            return;
        };
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let start = s.n_computed;
        if k > *budget
            || !self
                .kv
                .allocate(&mut s.blocks, start, start + 1 + k, &mut plan.copies)
        {
            return;
        }
        s.tokens.extend_from_slice(&draft);
        s.n_draft = k;
        p.n += k;
        p.draft = k;
        p.tiled = tiled_run(p.start, p.n, s.prompt_len);
        *budget -= k;
    }

    /// Gives running sequence `id` room for `n` more tokens and schedules it, preempting
    /// sequences of its lane or lower when the pool is full. False if it was preempted itself.
    fn grow(&mut self, id: ReqId, n: usize, plan: &mut StepPlan, budget: &mut usize) -> bool {
        loop {
            if self.try_grow(id, n, plan) {
                return true;
            }
            let lane = self.seqs[&id].lane;
            let victim = self.victim(|v| v.lane >= lane);
            let Some(victim) = victim else { return false };
            self.preempt(victim, plan, budget);
            if victim == id {
                return false;
            }
        }
    }

    /// Tries to start waiting sequence `id` with its first chunk. False when it can't (no
    /// slot, no budget or no KV room), which ends admission for this step.
    fn admit(&mut self, id: ReqId, plan: &mut StepPlan, budget: &mut usize, busy: bool) -> bool {
        if self.free_slots.is_empty() || *budget == 0 {
            return false;
        }
        let s = self.seqs.get_mut(&id).expect("waiting");
        let hit = self.kv.match_prefix(&mut s.blocks, &s.tokens, s.prompt_len);
        s.n_computed = hit;
        if !s.admitted_once {
            s.cached_tokens = hit;
        }
        let cap = Self::chunk_budget(&self.cfg, s.lane, s.remaining(), *budget, busy);
        let n = prefill_chunk(s.remaining(), cap, self.cfg.min_chunk);
        let lane = s.lane;
        loop {
            let s = self.seqs.get_mut(&id).expect("waiting");
            if n > 0
                && self
                    .kv
                    .allocate(&mut s.blocks, hit, hit + n, &mut plan.copies)
            {
                break;
            }
            // Only strictly lower lanes make room for an admission (never in FIFO).
            let victim = match self.cfg.policy {
                SchedulePolicy::Priority if n > 0 => self.victim(|v| v.lane > lane),
                _ => None,
            };
            match victim {
                Some(v) => self.preempt(v, plan, budget),
                None => {
                    let s = self.seqs.get_mut(&id).expect("waiting");
                    self.kv.free(&mut s.blocks);
                    s.n_computed = 0;
                    return false;
                }
            }
        }
        let slot = self.free_slots.pop().expect("checked above");
        self.started += 1;
        let s = self.seqs.get_mut(&id).expect("waiting");
        if !s.admitted_once {
            self.kv.record_lookup(s.tokens.len(), hit);
        }
        s.slot = Some(slot);
        s.started = self.started;
        s.admitted_once = true;
        self.waiting.retain(|&w| w != id);
        self.running.push(id);
        plan.seqs.push(Scheduled {
            id,
            slot,
            start: hit,
            n,
            sample: hit + n == s.tokens.len(),
            draft: 0,
            tiled: tiled_run(hit, n, s.prompt_len),
        });
        *budget -= n;
        true
    }

    /// The running sequence to preempt among those `eligible`: lowest base lane, then most
    /// recently started (FIFO: most recently started).
    fn victim(&self, eligible: impl Fn(&Sequence) -> bool) -> Option<ReqId> {
        let fifo = self.cfg.policy == SchedulePolicy::Fifo;
        self.running
            .iter()
            .map(|id| &self.seqs[id])
            .filter(|s| fifo || eligible(s))
            .max_by_key(|s| (if fifo { 0 } else { s.lane.index() }, s.started))
            .map(|s| s.id)
    }

    /// Sends a running sequence back to waiting, releasing its blocks and slot.
    fn preempt(&mut self, id: ReqId, plan: &mut StepPlan, budget: &mut usize) {
        self.drop_draft(id);
        let s = self.seqs.get_mut(&id).expect("running");
        self.kv.free(&mut s.blocks);
        s.n_computed = 0;
        s.preemptions += 1;
        if let Some(slot) = s.slot.take() {
            self.free_slots.push(slot);
        }
        s.started = 0;
        self.running.retain(|&r| r != id);
        // Keep arrival order in the waiting list.
        let arrival = s.arrival;
        let at = self
            .waiting
            .iter()
            .position(|w| self.seqs[w].arrival > arrival)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, id);
        if let Some(i) = plan.seqs.iter().position(|p| p.id == id) {
            *budget += plan.seqs.remove(i).n;
        }
        plan.preempted.push(id);
        self.preemptions += 1;
    }

    /// Records that a step computed `n` tokens of `id`, and registers its newly full blocks
    /// in the prefix cache (up to its draft, which waits for [`Scheduler::accept_draft`]).
    /// `tiled`: whether they took attention's tiled path ([`Scheduled::tiled`]).
    pub fn on_computed(&mut self, id: ReqId, n: usize, tiled: bool) {
        if let Some(s) = self.seqs.get_mut(&id) {
            self.kv.computed(&mut s.blocks, s.n_computed, n, tiled);
            s.n_computed = (s.n_computed + n).min(s.tokens.len());
            let confirmed = s.n_computed.min(s.tokens.len() - s.n_draft);
            self.kv
                .cache_full_blocks(&mut s.blocks, &s.tokens, confirmed);
            self.kv.commit_captures(&mut s.blocks, confirmed);
        }
    }

    /// Puts `draft` (tokens guessed to follow) after decoding sequence `id`'s last token,
    /// replacing any earlier draft: the next step computes the last token and the draft
    /// together, with logits at each position. False, changing nothing, unless `id` is
    /// running and decoding.
    pub fn set_draft(&mut self, id: ReqId, draft: &[u32]) -> bool {
        let ok = self
            .seqs
            .get(&id)
            .is_some_and(|s| s.slot.is_some() && s.is_decoding());
        if ok {
            self.drop_draft(id);
            let s = self.seqs.get_mut(&id).expect("checked");
            s.tokens.extend_from_slice(draft);
            s.n_draft = draft.len();
        }
        ok
    }

    /// After a step computed `id`'s last token and its draft: the first `accepted` drafted
    /// tokens stand, the rest are dropped with their cache positions (computed count rolled
    /// back, blocks past the new length released), and the full blocks confirmed now enter
    /// the prefix cache. The caller then appends the model's own next token.
    pub fn accept_draft(&mut self, id: ReqId, accepted: usize) {
        let Some(s) = self.seqs.get_mut(&id) else {
            return;
        };
        let keep = s.tokens.len() - s.n_draft + accepted.min(s.n_draft);
        s.tokens.truncate(keep);
        s.n_draft = 0;
        s.n_computed = s.n_computed.min(keep);
        self.kv.truncate(&mut s.blocks, s.n_computed);
        self.kv
            .cache_full_blocks(&mut s.blocks, &s.tokens, s.n_computed);
    }

    /// Drops `id`'s draft (no cache positions of it are kept).
    fn drop_draft(&mut self, id: ReqId) {
        if let Some(s) = self.seqs.get_mut(&id)
            && s.n_draft > 0
        {
            let keep = s.tokens.len() - s.n_draft;
            s.tokens.truncate(keep);
            s.n_draft = 0;
            s.n_computed = s.n_computed.min(keep);
            self.kv.truncate(&mut s.blocks, keep);
        }
    }

    /// Appends a sampled token to `id`.
    pub fn append_token(&mut self, id: ReqId, token: u32) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.tokens.push(token);
        }
    }

    /// A new running sequence `child` sharing every token and block of running `parent`
    /// (copy-on-write), for several completions of one prompt. False when no slot is free.
    pub fn fork(&mut self, parent: ReqId, child: ReqId) -> bool {
        if self.free_slots.is_empty() || self.seqs.contains_key(&child) {
            return false;
        }
        let Some(p) = self.seqs.get(&parent) else {
            return false;
        };
        if p.slot.is_none() {
            return false;
        }
        let blocks = self.kv.fork(&p.blocks);
        let slot = self.free_slots.pop().expect("checked above");
        self.started += 1;
        let known = p.tokens.len() - p.n_draft;
        let seq = Sequence {
            id: child,
            lane: p.lane,
            arrival: p.arrival,
            tokens: p.tokens[..known].to_vec(),
            prompt_len: p.prompt_len,
            n_computed: p.n_computed.min(known),
            n_draft: 0,
            cached_tokens: p.cached_tokens,
            blocks,
            slot: Some(slot),
            started: self.started,
            preemptions: 0,
            admitted_once: true,
        };
        self.seqs.insert(child, seq);
        self.running.push(child);
        true
    }

    /// Removes `id` (finished or cancelled), releasing its blocks and slot.
    pub fn finish(&mut self, id: ReqId) -> Option<Sequence> {
        let mut s = self.seqs.remove(&id)?;
        self.kv.free(&mut s.blocks);
        if let Some(slot) = s.slot.take() {
            self.free_slots.push(slot);
        }
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Some(s)
    }
}
