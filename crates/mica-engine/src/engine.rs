//! The serving engine: many requests on one model, continuously batched.
//!
//! The engine owns the model's compute on its own thread (so that no model work runs on a
//! caller's async executor); callers
//! talk to it through an [`EngineHandle`] (submit) and an [`EventSink`] per request (tokens
//! out), so it needs no async runtime. Each iteration of its loop is vLLM v1's step:
//! 1. **schedule** — [`Scheduler::schedule`] picks how many tokens each sequence gets under
//!    the token budget (priority lanes, chunked prompts, preemption when KV runs out);
//! 2. **execute** — block copies for copy-on-write, a hybrid model's recurrent states
//!    restored from checkpoints for sequences starting from a cached prefix (and the
//!    states to checkpoint named to the cache, see [`crate::checkpoints`]), block tables
//!    into the paged [`KvCache`], and one ragged [`Batch`] of every scheduled token through
//!    the forward pass (attention per sequence, [`AttentionPolicy::PerSequence`], so results
//!    do not depend on the rest of the batch);
//! 3. **update** ([`update`]) — per sequence: record computed tokens (full blocks enter the
//!    prefix cache, generated ones too, and so do the state checkpoints the step
//!    completed), choose tokens with the sequence's own
//!    [`SequenceDecoder`](crate::decoder::SequenceDecoder) (processors, seeded sampler, stop
//!    strings, finish on EOS / stop / max tokens / context), stream them, and free.
//!
//! **Multi-token steps.** A request may carry a [`Proposer`](crate::proposer::Proposer):
//! after each step that leaves it decoding, the proposer is told the step's load
//! ([`StepLoad`](crate::proposer::StepLoad)) and asked for a draft, which is put after the
//! sequence's last token ([`Scheduler::set_draft`]); the next step computes both with
//! logits at every position. The decoder keeps the drafted tokens it accepts (greedy: those
//! the model agrees with; sampled: the rejection-sampling rule) plus the model's own next
//! token; the scheduler rolls the rest back ([`Scheduler::accept_draft`]). Greedy tokens
//! are those of one-token steps, and sampled ones follow the same distribution; only the
//! number of steps changes.
//!
//! A request whose sink reports its client gone is cancelled at the next step and its blocks
//! return to the pool at once.
//!
//! **Abandoned steps.** A step cannot be cut short once the forward pass runs, so a request
//! arriving just after a long step began would wait for all of it. Instead, when a request
//! arrives whose lane is higher than every prompt chunk of the running step
//! ([`StepPlan::prompt_lane`](crate::scheduler::StepPlan); decodes alone never qualify, nor
//! does anything under FIFO), the step is abandoned between two layers and nothing it
//! computed counts: no position is marked computed (the keys and values it wrote in some
//! layers are rewritten when those positions are next computed), nothing is sampled and no
//! block enters the prefix cache; its decodes simply run again in the next step, which the
//! new request's prompt joins. Results are the same as if the step had never been planned.
//! A sequence's draft stays in place through an abandoned step and is verified by the step
//! that runs again.

mod step_trace;
mod update;

use crate::decoder::SequenceDecoder;
use crate::error::{ConfigError, EngineError, ParamError};
use crate::generate::GenerateParams;
use crate::kv_manager::BlockManager;
use crate::metrics::{EngineMetrics, RequestStatus};
use crate::proposer::Proposer;
pub use crate::request::{
    Event, EventSink, ProcessorFactory, Request, RequestError, SubmitError, TokenLogprob, Usage,
};
use crate::scheduler::{Lane, ReqId, Scheduler, SchedulerConfig};
use crate::step_gate::StepGate;
use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::kv_cache::BLOCK_SIZE;
use mica_models::{Batch, KvCache, LayerOffload, LoadedModel, Workspace};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runtime settings of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub n_threads: usize,
    /// Positions one sequence may reach (prompt + generated).
    pub n_ctx: usize,
    /// KV blocks in the pool ([`EngineConfig::blocks_for_memory`]).
    pub kv_blocks: usize,
    pub scheduler: SchedulerConfig,
    /// Requests per lane that may wait for a slot before new ones are refused.
    pub max_waiting_per_lane: usize,
    /// Reuse the KV blocks of prompt prefixes computed before. A hybrid model (Qwen3.5's
    /// recurrent layers) reuses a prefix only up to a recurrent-state checkpoint
    /// ([`crate::checkpoints`]), and only with `state_checkpoints` > 0: without any it is
    /// forced off ([`EngineHandle::config`] reports the setting in force).
    pub prefix_caching: bool,
    /// Hybrid models: recurrent-state checkpoints kept for prefix caching, least recently
    /// used evicted first; each takes [`KvCache::state_bytes_per_seq`] bytes
    /// ([`EngineConfig::memory_plan`] sizes them with the blocks). Ignored for other models.
    pub state_checkpoints: usize,
    /// Hybrid models: also checkpoint a prompt's state every this many positions (a
    /// multiple of [`BLOCK_SIZE`]; 0: only at the points `crate::kv_manager` describes), so
    /// prompts sharing a long prefix take most of it even from the first one.
    pub state_checkpoint_interval: usize,
    /// Most completions per request (`n`).
    pub max_n: usize,
    /// Diagnostics: abandon every N-th step half-way through its forward pass, as if a
    /// more urgent request had arrived (0: never). Abandoned steps must not change any
    /// result; tests use this to prove it.
    pub abandon_every: u64,
}

/// How a KV memory budget is split ([`EngineConfig::memory_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub kv_blocks: usize,
    pub state_checkpoints: usize,
}

impl MemoryPlan {
    /// The KV sizing of this plan for a memory estimate: its blocks, and a recurrent state
    /// per running sequence plus the checkpoints.
    pub fn kv_sizing(&self, max_running: usize) -> mica_models::KvSizing {
        mica_models::KvSizing::Pool {
            blocks: self.kv_blocks,
            states: max_running + self.state_checkpoints,
        }
    }
}

impl EngineConfig {
    /// Splits `bytes` of KV memory for `model` with up to `max_running` sequences running:
    /// a hybrid model's running states first, then recurrent-state checkpoints (a quarter
    /// of what is left, at most two per running sequence), then blocks for the rest. An
    /// attention-only model gets [`EngineConfig::blocks_for_memory`] and no checkpoints.
    pub fn memory_plan(model: &LoadedModel, bytes: usize, max_running: usize) -> MemoryPlan {
        let cfg = &model.model.config;
        let state = KvCache::state_bytes_per_seq(cfg);
        if state == 0 {
            return MemoryPlan {
                kv_blocks: Self::blocks_for_memory(model, bytes, max_running),
                state_checkpoints: 0,
            };
        }
        let rest = bytes.saturating_sub(max_running.saturating_mul(state));
        let state_checkpoints = (rest / 4 / state).min(2 * max_running.max(1));
        MemoryPlan {
            kv_blocks: (rest - state_checkpoints * state) / KvCache::bytes_per_block(cfg),
            state_checkpoints,
        }
    }

    /// Blocks that fit in `bytes` of KV memory for `model` with up to `max_running`
    /// sequences running: a hybrid model's recurrent states (one per running sequence,
    /// [`KvCache::state_bytes_per_seq`]) come out of the same bytes first.
    pub fn blocks_for_memory(model: &LoadedModel, bytes: usize, max_running: usize) -> usize {
        let cfg = &model.model.config;
        let states = max_running.saturating_mul(KvCache::state_bytes_per_seq(cfg));
        bytes.saturating_sub(states) / KvCache::bytes_per_block(cfg)
    }
}

enum Command {
    Add(ReqId, Box<Request>),
    Shutdown,
}

/// The caller's side of a running engine.
pub struct EngineHandle {
    tx: Mutex<Sender<Command>>,
    metrics: Arc<EngineMetrics>,
    queued: Arc<[AtomicUsize; 3]>,
    gate: Arc<StepGate>,
    next_id: AtomicU64,
    cfg: EngineConfig,
    /// Width of the model's logits (bounds logit-bias token ids).
    n_vocab: usize,
    /// The model keeps a recurrent state per sequence (no drafts: it cannot roll back).
    recurrent: bool,
    /// Layers run through a [`LayerOffload`] (requests cannot choose LoRA adapters).
    offloaded: bool,
    /// The engine's compute threads, shared with draft models of requests.
    pool: Arc<ThreadPool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts an engine thread for `model`.
    pub fn start(model: Arc<LoadedModel>, cfg: EngineConfig) -> Result<EngineHandle, EngineError> {
        Self::start_offloaded(model, cfg, None)
    }

    /// [`EngineHandle::start`] with layers `offload.first_layer()..` and the output head run
    /// by `offload` (a GPU, `mica_models::offload`), whose caches hold `cfg.kv_blocks`
    /// blocks per layer: the engine's block tables address them.
    pub fn start_offloaded(
        model: Arc<LoadedModel>,
        mut cfg: EngineConfig,
        offload: Option<Box<dyn LayerOffload + Send>>,
    ) -> Result<EngineHandle, EngineError> {
        // A lone sequence must always fit: cap the context at what the pool holds.
        cfg.n_ctx = cfg.n_ctx.min(cfg.kv_blocks * BLOCK_SIZE);
        if cfg.n_ctx < 2 {
            return Err(ConfigError::KvTooSmall {
                blocks: cfg.kv_blocks,
                block_size: BLOCK_SIZE,
            }
            .into());
        }
        let sc = &cfg.scheduler;
        if sc.max_batch_tokens < sc.max_running + 2 * sc.min_chunk {
            return Err(ConfigError::StepBudget {
                budget: sc.max_batch_tokens,
                running: sc.max_running,
                min: 2 * sc.min_chunk,
            }
            .into());
        }
        if cfg.abandon_every == 1 {
            return Err(ConfigError::AbandonEveryStep.into());
        }
        if cfg.n_threads == 0 {
            return Err(ConfigError::NoThreads.into());
        }
        if !cfg.state_checkpoint_interval.is_multiple_of(BLOCK_SIZE) {
            return Err(ConfigError::CheckpointInterval {
                interval: cfg.state_checkpoint_interval,
                block_size: BLOCK_SIZE,
            }
            .into());
        }
        // A recurrent state cannot be cut back to a cached prefix: a hybrid model reuses
        // prefixes only through state checkpoints (docs/families.md).
        let recurrent = model.model.config.has_recurrent_state();
        if !recurrent {
            cfg.state_checkpoints = 0;
        } else if cfg.state_checkpoints == 0 {
            cfg.prefix_caching = false;
        }
        let n_vocab = model.model.config.n_vocab;
        let metrics = Arc::new(EngineMetrics::default());
        metrics.kv_blocks_total.store(cfg.kv_blocks as u64, Relaxed);
        let queued: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
        let (tx, rx) = channel();
        let gate = Arc::new(StepGate::new());
        let shared = Shared {
            metrics: metrics.clone(),
            queued: queued.clone(),
            gate: gate.clone(),
        };
        let pool = Arc::new(ThreadPool::new(cfg.n_threads));
        let offloaded = offload.is_some();
        let mut core = Core::new(model, &cfg, rx, shared, pool.clone(), offload);
        let thread = std::thread::Builder::new()
            .name("mica-engine".into())
            .spawn(move || core.run())
            .map_err(EngineError::Thread)?;
        Ok(EngineHandle {
            tx: Mutex::new(tx),
            metrics,
            queued,
            gate,
            next_id: AtomicU64::new(1),
            cfg,
            n_vocab,
            recurrent,
            offloaded,
            pool,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn n_ctx(&self) -> usize {
        self.cfg.n_ctx
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// The engine's compute thread pool, for a request's draft-model proposer to share
    /// (proposers run on the engine thread between steps, never during one).
    pub fn pool(&self) -> Arc<ThreadPool> {
        self.pool.clone()
    }

    /// Queues a request; its events go to `req.sink`.
    pub fn submit(&self, req: Request) -> Result<ReqId, SubmitError> {
        let lane = req.lane;
        let reject = |e: SubmitError| {
            self.metrics.count_request(lane, RequestStatus::Rejected);
            Err(e)
        };
        if let Err(e) = req.params.validate(self.n_vocab) {
            return reject(e.into());
        }
        if req.prompt.is_empty() {
            return reject(ParamError::EmptyPrompt.into());
        }
        if self.recurrent && req.proposer.is_some() {
            return reject(ParamError::DraftsOnRecurrentModel.into());
        }
        if self.offloaded && req.lora.as_ref().is_some_and(|l| !l.is_empty()) {
            return reject(ParamError::LoraOnOffloadedLayers.into());
        }
        if req.n == 0 || req.n > self.cfg.max_n {
            return reject(
                ParamError::N {
                    n: req.n,
                    max: self.cfg.max_n,
                }
                .into(),
            );
        }
        if req.prompt.len() >= self.cfg.n_ctx {
            return reject(SubmitError::PromptTooLong {
                tokens: req.prompt.len(),
                n_ctx: self.cfg.n_ctx,
            });
        }
        let limit = self.cfg.max_waiting_per_lane;
        let q = &self.queued[lane.index()];
        if q.fetch_add(1, Relaxed) >= limit {
            q.fetch_sub(1, Relaxed);
            return reject(SubmitError::QueueFull { lane, limit });
        }
        let id = self.next_id.fetch_add(1, Relaxed) << 8;
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        // Counted before it is sent, so a step planned without it sees it coming.
        self.gate.sent[lane.index()].fetch_add(1, SeqCst);
        if tx.send(Command::Add(id, Box::new(req))).is_err() {
            q.fetch_sub(1, Relaxed);
            return Err(SubmitError::Stopped);
        }
        drop(tx);
        self.gate.interrupt_for(lane);
        Ok(id)
    }

    /// Stops the engine thread (requests in flight end with an error).
    pub fn shutdown(&self) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Shutdown);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One completion being generated (a sequence in the scheduler).
struct Choice {
    group: ReqId,
    index: usize,
    decoder: SequenceDecoder,
    last_token_at: Option<Instant>,
    /// Proposal distributions of the draft in the scheduler (empty: deterministic guesses).
    draft_dists: Vec<Vec<(u32, f32)>>,
}

/// One request: its sink and the state shared by its completions.
struct Group {
    sink: Box<dyn EventSink>,
    lane: Lane,
    params: GenerateParams,
    processors: Option<ProcessorFactory>,
    proposer: Option<Box<dyn Proposer>>,
    logprobs: Option<usize>,
    n: usize,
    /// Completions still to fork once the prompt is computed.
    to_fork: usize,
    live: usize,
    arrival: Instant,
    admitted: bool,
    first_token: bool,
    usage: Usage,
    /// The request's own LoRA adapters.
    lora: Option<Arc<mica_models::lora::LoraSelection>>,
}

/// State the engine thread shares with its handle.
struct Shared {
    metrics: Arc<EngineMetrics>,
    queued: Arc<[AtomicUsize; 3]>,
    gate: Arc<StepGate>,
}

/// The engine thread's state.
struct Core {
    model: Arc<LoadedModel>,
    /// The last layers and the head, when they run on a device.
    offload: Option<Box<dyn LayerOffload + Send>>,
    pool: Arc<ThreadPool>,
    kv: KvCache,
    ws: Workspace,
    sched: Scheduler,
    rx: Receiver<Command>,
    metrics: Arc<EngineMetrics>,
    queued: Arc<[AtomicUsize; 3]>,
    n_ctx: usize,
    choices: HashMap<ReqId, Choice>,
    groups: HashMap<ReqId, Group>,
    batch: Batch,
    logits: Vec<f32>,
    /// Tokens chosen for one sequence in a step (reused).
    chosen: Vec<u32>,
    /// Generated-token counts of recent steps, for the tokens/s gauge.
    recent: VecDeque<(Instant, usize)>,
    stopping: bool,
    gate: Arc<StepGate>,
    /// Requests received per lane (against `gate.sent`).
    received: [u64; 3],
    /// Steps executed (numbers the gate's steps).
    step_no: u64,
    abandon_every: u64,
}

impl Core {
    fn new(
        model: Arc<LoadedModel>,
        cfg: &EngineConfig,
        rx: Receiver<Command>,
        shared: Shared,
        pool: Arc<ThreadPool>,
        offload: Option<Box<dyn LayerOffload + Send>>,
    ) -> Core {
        let mcfg = &model.model.config;
        let host_layers = offload.as_ref().map_or(mcfg.n_layer, |o| o.first_layer());
        let (blocks, running) = (cfg.kv_blocks, cfg.scheduler.max_running);
        let mut kv = KvCache::paged_offloaded(mcfg, blocks, running, cfg.n_ctx, host_layers);
        let mut blocks = BlockManager::new(cfg.kv_blocks, BLOCK_SIZE);
        blocks.set_prefix_caching(cfg.prefix_caching);
        if kv.has_state() && cfg.prefix_caching {
            kv.set_checkpoints(cfg.state_checkpoints);
            blocks.set_checkpoints(cfg.state_checkpoints, cfg.state_checkpoint_interval);
        }
        let mut ws = Workspace::default();
        ws.attention = AttentionPolicy::PerSequence;
        Core {
            pool,
            kv,
            ws,
            sched: Scheduler::new(cfg.scheduler.clone(), blocks),
            rx,
            metrics: shared.metrics,
            queued: shared.queued,
            n_ctx: cfg.n_ctx,
            choices: HashMap::new(),
            groups: HashMap::new(),
            batch: Batch::new(),
            logits: Vec::new(),
            chosen: Vec::new(),
            recent: VecDeque::new(),
            stopping: false,
            gate: shared.gate,
            received: [0; 3],
            step_no: 0,
            abandon_every: cfg.abandon_every,
            model,
            offload,
        }
    }

    fn run(&mut self) {
        while !self.stopping {
            self.receive();
            if self.stopping {
                break;
            }
            self.cancel_closed();
            if let Err(e) = self.step() {
                // A failed forward pass fails the requests it carried; the engine goes on.
                let ids: Vec<ReqId> = self.groups.keys().copied().collect();
                let e = Arc::new(e);
                for g in ids {
                    self.fail_group(g, RequestError::Step(e.clone()));
                }
            }
            self.publish();
        }
        let ids: Vec<ReqId> = self.groups.keys().copied().collect();
        for g in ids {
            self.fail_group(g, RequestError::ShuttingDown);
        }
    }

    /// Takes new commands; blocks while there is nothing to do.
    fn receive(&mut self) {
        loop {
            let cmd = if self.sched.has_work() {
                match self.rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => return,
                    Err(TryRecvError::Disconnected) => {
                        self.stopping = true;
                        return;
                    }
                }
            } else {
                match self.rx.recv() {
                    Ok(c) => c,
                    Err(_) => {
                        self.stopping = true;
                        return;
                    }
                }
            };
            match cmd {
                Command::Shutdown => {
                    self.stopping = true;
                    return;
                }
                Command::Add(id, req) => {
                    self.received[req.lane.index()] += 1;
                    self.add(id, *req)
                }
            }
        }
    }

    fn add(&mut self, id: ReqId, req: Request) {
        let now = Instant::now();
        let Request {
            prompt,
            params,
            lane,
            n,
            logprobs,
            mut sink,
            processors,
            proposer,
            lora,
        } = req;
        self.metrics
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Relaxed);
        let prompt_len = prompt.len();
        let decoder = self.new_decoder(0, &params, processors.as_ref(), &prompt);
        // Mirostat's truncation adapts after every token, which the verification rule
        // (`Sampler::verify`) does not model: mirostat runs without drafts.
        let proposer = proposer.filter(|_| params.sampling.mirostat.is_none());
        if let Err(e) = self.sched.add(id, lane, prompt, now) {
            self.queued[lane.index()].fetch_sub(1, Relaxed);
            self.metrics.count_request(lane, RequestStatus::Rejected);
            sink.send(Event::Error(e.into()));
            return;
        }
        let lora = lora.filter(|l| !l.is_empty());
        if let Some(l) = &lora {
            self.sched.set_prefix_salt(id, l.cache_key());
        }
        self.choices.insert(
            id,
            Choice {
                group: id,
                index: 0,
                decoder,
                last_token_at: None,
                draft_dists: Vec::new(),
            },
        );
        self.groups.insert(
            id,
            Group {
                sink,
                lane,
                processors,
                proposer,
                logprobs,
                n,
                to_fork: n - 1,
                live: 1,
                arrival: now,
                admitted: false,
                first_token: false,
                lora,
                usage: Usage {
                    prompt_tokens: prompt_len,
                    ..Default::default()
                },
                params,
            },
        );
    }

    /// Cancels requests whose client went away.
    fn cancel_closed(&mut self) {
        let closed: Vec<ReqId> = self
            .groups
            .iter()
            .filter(|(_, g)| g.sink.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for g in closed {
            self.end_group(g, RequestStatus::Cancelled);
        }
    }

    /// One schedule → execute → update step.
    fn step(&mut self) -> Result<(), EngineError> {
        let now = Instant::now();
        let step = step_trace::step_span();
        let _step = step.enter();
        let plan = tracing::trace_span!("schedule").in_scope(|| self.sched.schedule(now));
        step_trace::record(&step, &plan, &self.sched);
        self.metrics
            .preemptions
            .fetch_add(plan.preempted.len() as u64, Relaxed);
        if plan.is_empty() {
            if self.sched.has_work() {
                std::thread::sleep(Duration::from_millis(1));
            }
            return Ok(());
        }
        // Execute.
        for &(src, dst) in &plan.copies {
            self.kv.copy_block(src, dst);
            if let Some(o) = &mut self.offload {
                o.copy_block(src, dst)?;
            }
        }
        self.batch.clear();
        self.ws.tiled_seqs.clear();
        self.ws.lora.clear();
        // Hybrid models: a sequence starting from a cached prefix restores the state there;
        // the states worth keeping are captured on the way.
        self.kv.clear_captures();
        for s in &plan.seqs {
            if let Some(ckpt) = self.sched.take_restore(s.id) {
                self.kv.restore_state(ckpt, s.slot, s.start)?;
            }
            let seq = self.sched.get(s.id).expect("scheduled");
            for (at, ckpt) in seq.blocks.captures() {
                if at > s.start && at <= s.start + s.n {
                    self.kv.capture_state(s.slot, at, ckpt)?;
                }
            }
        }
        for s in &plan.seqs {
            if s.tiled {
                self.ws.tiled_seqs.push(s.slot);
            }
            self.kv
                .set_table(s.slot, self.sched.blocks(s.id), s.start)?;
            let seq = self.sched.get(s.id).expect("scheduled");
            // Logits at the last token, and at each drafted token after it.
            let first_out = s.n - 1 - s.draft;
            for (j, &t) in seq.tokens[s.start..s.start + s.n].iter().enumerate() {
                self.batch
                    .push(t, s.start + j, s.slot, s.sample && j >= first_out);
            }
            let g = self.choices[&s.id].group;
            if let Some(l) = self.groups.get(&g).and_then(|g| g.lora.clone()) {
                self.ws.lora.push((s.slot, l));
            }
            if let Some(group) = self.groups.get_mut(&g)
                && !group.admitted
            {
                group.admitted = true;
                group.usage.cached_tokens = seq.cached_tokens;
                self.metrics
                    .cached_prompt_tokens
                    .fetch_add(seq.cached_tokens as u64, Relaxed);
                self.queued[group.lane.index()].fetch_sub(1, Relaxed);
            }
        }
        // A step of decodes only, some with drafts: every token gets the arithmetic of a
        // one-token batch, so a verified draft gives the tokens of one-at-a-time decoding
        // (with prompt chunks in the step, the batch's paths stay, for the prompts' sake).
        self.ws.alone_paths = plan.seqs.iter().any(|s| s.draft > 0)
            && plan.seqs.iter().all(|s| s.sample && s.n == 1 + s.draft);
        let execute = tracing::trace_span!("execute").entered();
        let done = self.forward(plan.prompt_lane)?;
        drop(execute);
        if !done {
            self.metrics.abandoned_steps.fetch_add(1, Relaxed);
            return Ok(());
        }
        self.metrics.steps.fetch_add(1, Relaxed);
        let _update = tracing::trace_span!("update").entered();
        self.update(&plan.seqs, now);
        Ok(())
    }

    /// Runs the batch into `self.logits`, unless the step is abandoned (false): a request
    /// of a lane above `prompt_lane` arrived (or was already on its way when the step was
    /// planned), or the diagnostic `abandon_every` says so.
    fn forward(&mut self, prompt_lane: Option<Lane>) -> Result<bool, EngineError> {
        self.step_no += 1;
        self.gate.open(self.step_no, prompt_lane);
        // A request sent before the gate opened saw no step to abandon: look for one.
        let floor = prompt_lane.map_or(0, Lane::index);
        let missed = (0..floor).any(|l| self.gate.sent[l].load(SeqCst) > self.received[l]);
        let forced = self.abandon_every > 0 && self.step_no.is_multiple_of(self.abandon_every);
        let n_layers = self.model.model.layers.len();
        let (gate, mut layer) = (&self.gate, 0);
        let mut stop = || {
            layer += 1;
            missed || gate.abandoned() || (forced && layer > n_layers / 2)
        };
        let (model, kv, ws) = (&self.model.model, &mut self.kv, &mut self.ws);
        let out = match self.offload.as_deref_mut() {
            Some(o) => model.forward_offloaded(&self.pool, &self.batch, kv, ws, &mut stop, o),
            None => model.forward_interruptible(&self.pool, &self.batch, kv, ws, &mut stop),
        };
        self.gate.close();
        let Some(logits) = out? else {
            return Ok(false);
        };
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        Ok(true)
    }
}
