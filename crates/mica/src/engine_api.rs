//! [`Engine`]: many concurrent requests on one model, continuously batched on the engine's
//! own thread (the serving engine of `mica serve`), with a blocking [`Stream`] of events per
//! request — no async runtime needed. Dropping a stream cancels its request and frees its
//! KV blocks at the engine's next step.

use crate::error::{Error, Result};
use crate::model::Model;
use mica_engine::{
    EngineConfig, EngineHandle, EngineMetrics, Event, EventSink, FinishReason, GenerateParams,
    Lane, ProcessorFactory, Proposer, SchedulerConfig, TokenLogprob, Usage,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};

/// Settings of an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Positions one sequence may reach; `None`: the model's
    /// [`default_n_ctx`](Model::default_n_ctx).
    pub n_ctx: Option<usize>,
    /// Compute threads; `None`: the machine's physical cores.
    pub threads: Option<usize>,
    /// Memory for the paged KV cache shared by all sequences, in bytes.
    pub kv_bytes: usize,
    /// Step size, concurrency, priority lanes.
    pub scheduler: SchedulerConfig,
    /// Requests per lane that may wait before new ones are refused.
    pub max_waiting_per_lane: usize,
    /// Reuse the KV blocks of prompt prefixes seen before.
    pub prefix_caching: bool,
    /// Most completions per request (`n`).
    pub max_n: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_ctx: None,
            threads: None,
            kv_bytes: 512 << 20,
            scheduler: SchedulerConfig::default(),
            max_waiting_per_lane: 256,
            prefix_caching: true,
            max_n: 16,
        }
    }
}

impl EngineOptions {
    /// The engine configuration these options give for `model`.
    pub fn to_config(&self, model: &Model) -> EngineConfig {
        let mem =
            EngineConfig::memory_plan(model.loaded(), self.kv_bytes, self.scheduler.max_running);
        EngineConfig {
            n_threads: self
                .threads
                .unwrap_or_else(mica_kernels::pool::physical_cores),
            n_ctx: self.n_ctx.unwrap_or_else(|| model.default_n_ctx()),
            kv_blocks: mem.kv_blocks,
            scheduler: self.scheduler.clone(),
            max_waiting_per_lane: self.max_waiting_per_lane,
            prefix_caching: self.prefix_caching,
            max_n: self.max_n,
            abandon_every: 0,
            state_checkpoints: mem.state_checkpoints,
            state_checkpoint_interval: 0,
        }
    }
}

/// What to generate for one request of an [`Engine`].
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    pub lane: Lane,
    /// Completions of the prompt (sharing its KV blocks).
    pub n: usize,
    /// Report each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// Logits processors per completion (called with the completion's index).
    pub processors: Option<ProcessorFactory>,
    /// Drafts tokens to verify several per step ([`Engine::proposer`]).
    pub proposer: Option<Box<dyn Proposer>>,
    /// LoRA adapters for this request only, each at its scale
    /// ([`mica_models::lora::LoraSelection`]).
    pub lora: Option<std::sync::Arc<mica_models::lora::LoraSelection>>,
}

impl Request {
    /// One completion of `prompt` in the interactive lane.
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Request {
        Request {
            prompt,
            params,
            lane: Lane::Interactive,
            n: 1,
            logprobs: None,
            processors: None,
            proposer: None,
            lora: None,
        }
    }

    /// Constrains every completion of the request to `grammar` (replacing other
    /// processors).
    pub fn constrained(mut self, grammar: &mica_grammar::CompiledGrammar) -> Request {
        self.processors = Some(grammar.factory());
        self
    }
}

/// A running serving engine. Dropping it stops the engine thread (requests in flight end
/// with an error event).
pub struct Engine {
    handle: EngineHandle,
    model: Model,
}

impl Engine {
    pub(crate) fn start(model: &Model, opts: EngineOptions) -> Result<Engine> {
        let handle = EngineHandle::start(model.loaded().clone(), opts.to_config(model))?;
        Ok(Engine {
            handle,
            model: model.clone(),
        })
    }

    /// The model the engine runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Positions one sequence may reach (capped at what the KV memory holds).
    pub fn n_ctx(&self) -> usize {
        self.handle.n_ctx()
    }

    /// Counters and gauges (Prometheus text through [`EngineMetrics::render`]).
    pub fn metrics(&self) -> &EngineMetrics {
        self.handle.metrics()
    }

    /// A proposer for one request as `spec` describes it (a draft model computes on the
    /// engine's threads, between steps); `None` when speculation is off.
    pub fn proposer(&self, spec: &crate::spec::SpecConfig) -> Result<Option<Box<dyn Proposer>>> {
        Ok(spec
            .proposer(self.model.loaded(), &self.handle.pool())
            .map_err(mica_engine::EngineError::from)?)
    }

    /// Queues a request; its events arrive on the returned stream.
    pub fn submit(&self, req: Request) -> Result<Stream> {
        let (tx, rx) = channel();
        let closed = Arc::new(AtomicBool::new(false));
        let sink = StreamSink {
            tx,
            closed: closed.clone(),
        };
        self.handle.submit(mica_engine::Request {
            prompt: req.prompt,
            params: req.params,
            lane: req.lane,
            n: req.n,
            logprobs: req.logprobs,
            sink: Box::new(sink),
            processors: req.processors,
            proposer: req.proposer,
            lora: req.lora,
        })?;
        Ok(Stream { rx, closed })
    }

    /// Generates one completion of `prompt` and waits for it.
    pub fn generate(&self, prompt: &[u32], params: &GenerateParams) -> Result<Completion> {
        let stream = self.submit(Request::new(prompt.to_vec(), params.clone()))?;
        let mut all = stream.wait()?;
        Ok(all.swap_remove(0))
    }
}

/// One finished completion of a request.
#[derive(Clone, Debug, Default)]
pub struct Completion {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Per token, when the request asked for log-probabilities.
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    /// The request's token counts (the same for every completion of it).
    pub usage: Usage,
}

/// The events of one submitted request, in order, ending with [`Event::Finished`] or
/// [`Event::Error`]. Dropping the stream cancels the request.
pub struct Stream {
    rx: Receiver<Event>,
    closed: Arc<AtomicBool>,
}

impl Iterator for Stream {
    type Item = Event;

    /// The next event, waiting for it; `None` once the request has ended.
    fn next(&mut self) -> Option<Event> {
        self.rx.recv().ok()
    }
}

impl Stream {
    /// Waits for the request to end and gathers each completion.
    pub fn wait(self) -> Result<Vec<Completion>> {
        let mut out: Vec<Completion> = Vec::new();
        let at = |out: &mut Vec<Completion>, i: usize| {
            if out.len() <= i {
                out.resize_with(i + 1, Completion::default);
            }
        };
        for ev in self {
            match ev {
                Event::Token {
                    index,
                    token,
                    text,
                    logprob,
                } => {
                    at(&mut out, index);
                    let c = &mut out[index];
                    c.tokens.push(token);
                    c.text.push_str(&text);
                    c.logprobs.extend(logprob);
                }
                Event::Done {
                    index,
                    finish,
                    text,
                } => {
                    at(&mut out, index);
                    out[index].text.push_str(&text);
                    out[index].finish = Some(finish);
                }
                Event::Finished { usage } => {
                    for c in &mut out {
                        c.usage = usage;
                    }
                    return Ok(out);
                }
                Event::Error(e) => return Err(e.into()),
            }
        }
        Err(Error::EngineStopped)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

/// Feeds a [`Stream`]; reports itself closed once the stream is dropped.
struct StreamSink {
    tx: Sender<Event>,
    closed: Arc<AtomicBool>,
}

impl EventSink for StreamSink {
    fn send(&mut self, event: Event) -> bool {
        !self.closed.load(Ordering::Relaxed) && self.tx.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}
