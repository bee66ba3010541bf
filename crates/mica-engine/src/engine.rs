//! The serving engine: many requests on one model, continuously batched.
//!
//! The engine owns the model's compute on its own thread (ARCHITECTURE decision 4); callers
//! talk to it through an [`EngineHandle`] (submit) and an [`EventSink`] per request (tokens
//! out), so it needs no async runtime. Each iteration of its loop is vLLM v1's step:
//! 1. **schedule** — [`Scheduler::schedule`] picks how many tokens each sequence gets under
//!    the token budget (priority lanes, chunked prompts, preemption when KV runs out);
//! 2. **execute** — block copies for copy-on-write, block tables into the paged
//!    [`KvCache`], and one ragged [`Batch`] of every scheduled token through the forward
//!    pass (attention per sequence, [`AttentionPolicy::PerSequence`], so results do not
//!    depend on the rest of the batch);
//! 3. **update** — per sequence: record computed tokens (full blocks enter the prefix cache,
//!    generated ones too), sample with the request's own seeded sampler, stream text through
//!    stop strings, finish on EOS / stop / max tokens / context, and free.
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

use crate::error::EngineError;
use crate::generate::{FinishReason, GenerateParams, StopMatcher};
use crate::kv_manager::BlockManager;
use crate::metrics::{EngineMetrics, RequestStatus};
pub use crate::request::{Event, EventSink, Request, SubmitError, TokenLogprob, Usage};
use crate::sampler::{Sampler, log_softmax};
use crate::scheduler::{Lane, ReqId, Scheduler, SchedulerConfig};
use crate::step_gate::StepGate;
use mica_kernels::ThreadPool;
use mica_models::blocks::attention::AttentionPolicy;
use mica_models::kv_cache::BLOCK_SIZE;
use mica_models::tokenizer::{DecodeOptions, TokenStreamDecoder};
use mica_models::{Batch, KvCache, LoadedModel, Workspace};
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
    pub prefix_caching: bool,
    /// Most completions per request (`n`).
    pub max_n: usize,
    /// Diagnostics: abandon every N-th step half-way through its forward pass, as if a
    /// more urgent request had arrived (0: never). Abandoned steps must not change any
    /// result; tests use this to prove it.
    pub abandon_every: u64,
}

impl EngineConfig {
    /// Blocks that fit in `bytes` of KV memory for `model`.
    pub fn blocks_for_memory(model: &LoadedModel, bytes: usize) -> usize {
        bytes / KvCache::bytes_per_block(&model.model.config)
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
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EngineHandle {
    /// Starts an engine thread for `model`.
    pub fn start(
        model: Arc<LoadedModel>,
        mut cfg: EngineConfig,
    ) -> Result<EngineHandle, EngineError> {
        // A lone sequence must always fit: cap the context at what the pool holds.
        cfg.n_ctx = cfg.n_ctx.min(cfg.kv_blocks * BLOCK_SIZE);
        if cfg.n_ctx < 2 {
            return Err(EngineError::Params(format!(
                "the KV memory holds {} blocks of {BLOCK_SIZE} positions: too small for any request",
                cfg.kv_blocks
            )));
        }
        let sc = &cfg.scheduler;
        if sc.max_batch_tokens < sc.max_running + 2 * sc.min_chunk {
            return Err(EngineError::Params(format!(
                "the step token budget ({}) must be at least the running sequences ({}) plus {}",
                sc.max_batch_tokens,
                sc.max_running,
                2 * sc.min_chunk
            )));
        }
        if cfg.abandon_every == 1 {
            return Err(EngineError::Params(
                "abandoning every step would never finish one (abandon_every must be 0 or at least 2)".into(),
            ));
        }
        if cfg.n_threads == 0 {
            return Err(EngineError::Params(
                "the thread count must be positive".into(),
            ));
        }
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
        let mut core = Core::new(model, &cfg, rx, shared);
        let thread = std::thread::Builder::new()
            .name("mica-engine".into())
            .spawn(move || core.run())
            .map_err(|e| EngineError::Params(format!("cannot start the engine thread: {e}")))?;
        Ok(EngineHandle {
            tx: Mutex::new(tx),
            metrics,
            queued,
            gate,
            next_id: AtomicU64::new(1),
            cfg,
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

    /// Queues a request; its events go to `req.sink`.
    pub fn submit(&self, req: Request) -> Result<ReqId, SubmitError> {
        let lane = req.lane;
        let reject = |e: SubmitError| {
            self.metrics.count_request(lane, RequestStatus::Rejected);
            Err(e)
        };
        if let Err(e) = req.params.sampling.validate() {
            return reject(SubmitError::Params(e));
        }
        if req.prompt.is_empty() {
            return reject(SubmitError::Params("the prompt is empty".into()));
        }
        if req.n == 0 || req.n > self.cfg.max_n {
            return reject(SubmitError::Params(format!(
                "n must be between 1 and {}, got {}",
                self.cfg.max_n, req.n
            )));
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
    sampler: Sampler,
    decoder: TokenStreamDecoder,
    stops: StopMatcher,
    generated: usize,
    last_token_at: Option<Instant>,
}

/// One request: its sink and the state shared by its completions.
struct Group {
    sink: Box<dyn EventSink>,
    lane: Lane,
    params: GenerateParams,
    logprobs: Option<usize>,
    n: usize,
    /// Completions still to fork once the prompt is computed.
    to_fork: usize,
    live: usize,
    arrival: Instant,
    admitted: bool,
    first_token: bool,
    usage: Usage,
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
    pool: ThreadPool,
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
    ) -> Core {
        let mcfg = &model.model.config;
        let kv = KvCache::paged(mcfg, cfg.kv_blocks, cfg.scheduler.max_running, cfg.n_ctx);
        let mut blocks = BlockManager::new(cfg.kv_blocks, BLOCK_SIZE);
        blocks.set_prefix_caching(cfg.prefix_caching);
        let mut ws = Workspace::default();
        ws.attention = AttentionPolicy::PerSequence;
        Core {
            pool: ThreadPool::new(cfg.n_threads),
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
            recent: VecDeque::new(),
            stopping: false,
            gate: shared.gate,
            received: [0; 3],
            step_no: 0,
            abandon_every: cfg.abandon_every,
            model,
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
                for g in ids {
                    self.fail_group(g, &e.to_string());
                }
            }
            self.publish();
        }
        let ids: Vec<ReqId> = self.groups.keys().copied().collect();
        for g in ids {
            self.fail_group(g, "the server is shutting down");
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
        } = req;
        self.metrics
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Relaxed);
        let prompt_len = prompt.len();
        if let Err(e) = self.sched.add(id, lane, prompt, now) {
            self.queued[lane.index()].fetch_sub(1, Relaxed);
            self.metrics.count_request(lane, RequestStatus::Rejected);
            sink.send(Event::Error(e.to_string()));
            return;
        }
        self.choices.insert(id, self.new_choice(id, 0, &params));
        self.groups.insert(
            id,
            Group {
                sink,
                lane,
                logprobs,
                n,
                to_fork: n - 1,
                live: 1,
                arrival: now,
                admitted: false,
                first_token: false,
                usage: Usage {
                    prompt_tokens: prompt_len,
                    ..Default::default()
                },
                params,
            },
        );
    }

    fn new_choice(&self, group: ReqId, index: usize, params: &GenerateParams) -> Choice {
        let mut sampling = params.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(index as u64);
        Choice {
            group,
            index,
            sampler: Sampler::new(sampling),
            decoder: self
                .model
                .tokenizer
                .stream_decoder(DecodeOptions { skip_special: true }),
            stops: StopMatcher::new(&params.stop),
            generated: 0,
            last_token_at: None,
        }
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
        let plan = self.sched.schedule(now);
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
        }
        self.batch.clear();
        for s in &plan.seqs {
            self.kv
                .set_table(s.slot, self.sched.blocks(s.id), s.start)?;
            let seq = self.sched.get(s.id).expect("scheduled");
            for (j, &t) in seq.tokens[s.start..s.start + s.n].iter().enumerate() {
                let last = j + 1 == s.n;
                self.batch.push(t, s.start + j, s.slot, last && s.sample);
            }
            let g = self.choices[&s.id].group;
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
        if !self.forward(plan.prompt_lane)? {
            self.metrics.abandoned_steps.fetch_add(1, Relaxed);
            return Ok(());
        }
        self.metrics.steps.fetch_add(1, Relaxed);

        // Update.
        let n_vocab = self.model.model.config.n_vocab;
        let mut row = 0;
        let mut generated = 0;
        let all_logits = std::mem::take(&mut self.logits);
        for s in &plan.seqs {
            self.sched.on_computed(s.id, s.n);
            if !s.sample {
                continue;
            }
            let r = row;
            row += 1;
            let Some(g) = self.choices.get(&s.id).map(|c| c.group) else {
                continue;
            };
            // Completions beyond the first share the prompt's blocks from here on.
            let forks = self.groups.get(&g).map_or(0, |gr| gr.to_fork);
            let mut ids = vec![s.id];
            if forks > 0 {
                ids.extend(self.fork_group(g, s.id));
            }
            for id in ids {
                let logits = &all_logits[r * n_vocab..(r + 1) * n_vocab];
                generated += usize::from(self.sample_one(id, logits));
            }
        }
        self.logits = all_logits;
        self.record_rate(now, generated);
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
        let out = self.model.model.forward_interruptible(
            &self.pool,
            &self.batch,
            &mut self.kv,
            &mut self.ws,
            &mut stop,
        );
        self.gate.close();
        let Some(logits) = out? else {
            return Ok(false);
        };
        self.logits.clear();
        self.logits.extend_from_slice(logits);
        Ok(true)
    }

    /// Creates the other completions of group `g` as forks of `parent`.
    fn fork_group(&mut self, g: ReqId, parent: ReqId) -> Vec<ReqId> {
        let Some(group) = self.groups.get_mut(&g) else {
            return Vec::new();
        };
        let (n, params) = (group.n, group.params.clone());
        group.to_fork = 0;
        let mut out = Vec::new();
        for index in 1..n {
            let child = g + index as u64;
            if self.sched.fork(parent, child) {
                out.push(child);
            } else {
                // No free slot: the completion queues on its own (its prompt then hits the
                // prefix cache).
                let tokens = self.sched.get(parent).map(|s| s.tokens.clone());
                let lane = self.groups[&g].lane;
                if let Some(t) = tokens
                    && self.sched.add(child, lane, t, Instant::now()).is_err()
                {
                    continue;
                }
            }
            let c = self.new_choice(g, index, &params);
            self.choices.insert(child, c);
            if let Some(group) = self.groups.get_mut(&g) {
                group.live += 1;
            }
        }
        out
    }

    /// Samples the next token of sequence `id`, streams it, and finishes the sequence when
    /// it should stop. Returns whether a token was produced.
    fn sample_one(&mut self, id: ReqId, logits: &[f32]) -> bool {
        let Some(seq) = self.sched.get(id) else {
            return false;
        };
        let history = &seq.tokens;
        let Some(choice) = self.choices.get_mut(&id) else {
            return false;
        };
        let Some(group) = self.groups.get_mut(&choice.group) else {
            return false;
        };
        let token = choice.sampler.sample(logits, history);
        let logprob = group.logprobs.map(|k| token_logprob(logits, token, k));
        let tok = &self.model.tokenizer;
        choice.generated += 1;
        group.usage.completion_tokens += 1;
        self.metrics.generated_tokens.fetch_add(1, Relaxed);
        if !group.first_token {
            group.first_token = true;
            let ttft = Instant::now().saturating_duration_since(group.arrival);
            self.metrics.ttft[group.lane.index()].observe(ttft.as_secs_f64());
        }
        let at = Instant::now();
        if let Some(prev) = choice.last_token_at {
            self.metrics
                .tpot
                .observe(at.duration_since(prev).as_secs_f64());
        }
        choice.last_token_at = Some(at);

        let params = &group.params;
        let mut finish = None;
        let mut text = String::new();
        if !params.ignore_eos && tok.is_eog(token) {
            finish = Some(FinishReason::Eos);
        } else {
            let piece = choice.decoder.push(token).unwrap_or_default();
            let (ready, hit) = choice.stops.push(&piece);
            text = ready;
            if hit {
                finish = Some(FinishReason::Stop);
            }
        }
        let alive = group.sink.send(Event::Token {
            index: choice.index,
            token,
            text,
            logprob,
        });
        if !alive {
            let g = choice.group;
            self.end_group(g, RequestStatus::Cancelled);
            return true;
        }
        if finish.is_none() {
            if choice.generated >= params.max_tokens {
                finish = Some(FinishReason::Length);
            } else if history.len() + 1 >= self.n_ctx {
                finish = Some(FinishReason::Context);
            }
        }
        match finish {
            Some(f) => self.finish_choice(id, f),
            None => self.sched.append_token(id, token),
        }
        true
    }

    /// Ends one completion; the group ends with its last one.
    fn finish_choice(&mut self, id: ReqId, finish: FinishReason) {
        self.sched.finish(id);
        let Some(mut choice) = self.choices.remove(&id) else {
            return;
        };
        let Some(group) = self.groups.get_mut(&choice.group) else {
            return;
        };
        let text = if finish == FinishReason::Stop {
            String::new()
        } else {
            choice.stops.flush(&choice.decoder.finish())
        };
        group.sink.send(Event::Done {
            index: choice.index,
            finish,
            text,
        });
        group.live -= 1;
        if group.live == 0 && group.to_fork == 0 {
            let usage = group.usage;
            // Counted before the client hears the end, so metrics read after a response
            // already include it.
            if let Some(mut group) = self.end_group(choice.group, RequestStatus::Ok) {
                group.sink.send(Event::Finished { usage });
            }
        }
    }

    fn fail_group(&mut self, g: ReqId, msg: &str) {
        if let Some(group) = self.groups.get_mut(&g) {
            group.sink.send(Event::Error(msg.to_string()));
        }
        self.end_group(g, RequestStatus::Error);
    }

    /// Removes a request and every sequence of it, freeing their blocks.
    /// Returns the removed request, if it was still there.
    fn end_group(&mut self, g: ReqId, status: RequestStatus) -> Option<Group> {
        let ids: Vec<ReqId> = self
            .choices
            .iter()
            .filter(|(_, c)| c.group == g)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.sched.finish(id);
            self.choices.remove(&id);
        }
        let group = self.groups.remove(&g)?;
        if !group.admitted {
            self.queued[group.lane.index()].fetch_sub(1, Relaxed);
        }
        self.metrics.count_request(group.lane, status);
        Some(group)
    }

    fn record_rate(&mut self, now: Instant, generated: usize) {
        self.recent.push_back((now, generated));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(5))
        {
            self.recent.pop_front();
        }
        let span = self
            .recent
            .front()
            .map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64());
        let total: usize = self.recent.iter().map(|(_, n)| n).sum();
        self.metrics
            .set_tokens_per_s(if span > 0.0 { total as f64 / span } else { 0.0 });
    }

    /// Copies scheduler and cache state into the metrics.
    fn publish(&self) {
        let m = &self.metrics;
        let w = self.sched.waiting_by_lane();
        for lane in Lane::ALL {
            m.waiting[lane.index()].store(w[lane.index()] as u64, Relaxed);
        }
        m.running.store(self.sched.n_running() as u64, Relaxed);
        let kv = self.sched.kv();
        m.kv_blocks_used.store(kv.n_used() as u64, Relaxed);
        m.kv_blocks_cached.store(kv.n_cached() as u64, Relaxed);
        let st = kv.stats();
        m.prefix_queried_tokens.store(st.queried_tokens, Relaxed);
        m.prefix_hit_tokens.store(st.hit_tokens, Relaxed);
    }
}

/// Log-probability of `token` and the `k` most likely tokens, from raw logits.
fn token_logprob(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b))
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
        top = idx.into_iter().map(|i| (i, lp[i as usize])).collect();
    }
    TokenLogprob {
        logprob: lp[token as usize],
        top,
    }
}
