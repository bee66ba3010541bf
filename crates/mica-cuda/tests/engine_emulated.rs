//! The serving engine with the last layers and the head offloaded to the GPU decoder, run on
//! the CPU emulator of the kernels (`tests/emu`): `EngineHandle::start_offloaded` on the tiny
//! random LLaMA fixture (fixtures/hf/llama) gives transformers' greedy continuation, a
//! request of two completions (sharing the prompt's blocks, so the partly filled last block
//! is copied on write, on the host and through `LayerOffload::copy_block` on the device)
//! gives it twice, a repeated prompt (served from the prefix cache) gives it again, and a
//! sampled request gives the host engine's very tokens — with the offloaded layers' weights
//! dropped from the host (`Model::evict_offloaded`). A request choosing LoRA adapters, which
//! the offloaded layers would not apply, is refused, and so is any pass of the evicted model
//! without its offload.

mod common;
use common::emu::emu;
use common::hf_common::{ids, load};
use mica_cuda::GpuDecoder;
use mica_engine::{
    EngineConfig, EngineHandle, Event, EventSink, GenerateParams, Lane, ParamError, Request,
    SamplingParams, SchedulerConfig, SubmitError,
};
use mica_models::chat::ChatTemplate;
use mica_models::lora::{LoraAdapter, LoraSelection};
use mica_models::tokenizer::{Tokenizer, TokenizerSpec};
use mica_models::{Batch, KvCache, LayerOffload, LoadedModel, Model};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

const KV_BLOCKS: usize = 32;
const GREEDY: usize = 12;

struct Chan(Sender<Event>);

impl EventSink for Chan {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// The offload, counting the blocks it is asked to copy.
struct Counted<O>(O, Arc<AtomicUsize>);

impl<O: LayerOffload> LayerOffload for Counted<O> {
    fn first_layer(&self) -> usize {
        self.0.first_layer()
    }
    fn run_layers(
        &mut self,
        batch: &Batch,
        kv: &KvCache,
        x: &mut [f32],
    ) -> mica_models::Result<()> {
        self.0.run_layers(batch, kv, x)
    }
    fn head(&mut self, h: &[f32], n: usize, logits: &mut [f32]) -> mica_models::Result<bool> {
        self.0.head(h, n, logits)
    }
    fn copy_block(&mut self, src: u32, dst: u32) -> mica_models::Result<()> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.copy_block(src, dst)
    }
}

/// The fixture as a servable model: a stand-in vocabulary of its 128 ids (`t0`, `t1`, ...),
/// end of text 2 as in its generation config.
fn servable(model: Model) -> LoadedModel {
    let spec = TokenizerSpec {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens: (0..model.config.n_vocab).map(|i| format!("t{i}")).collect(),
        bos_id: Some(1),
        eos_id: Some(2),
        merges: Some(Vec::new()),
        ..Default::default()
    };
    LoadedModel {
        model,
        tokenizer: Tokenizer::from_spec(&spec).unwrap(),
        template: ChatTemplate::chatml("", "t2"),
    }
}

fn engine(lm: &Arc<LoadedModel>, offload: Option<Box<dyn LayerOffload + Send>>) -> EngineHandle {
    let cfg = EngineConfig {
        n_threads: 2,
        n_ctx: 128,
        kv_blocks: KV_BLOCKS,
        scheduler: SchedulerConfig::default(),
        max_waiting_per_lane: 8,
        prefix_caching: true,
        max_n: 2,
        abandon_every: 0,
        state_checkpoints: 0,
        state_checkpoint_interval: 0,
    };
    EngineHandle::start_offloaded(lm.clone(), cfg, offload).unwrap()
}

fn submit(e: &EngineHandle, prompt: &[u32], n: usize, sampling: SamplingParams) -> Receiver<Event> {
    let (tx, rx) = channel();
    let params = GenerateParams {
        max_tokens: GREEDY,
        sampling,
        ignore_eos: true,
        ..Default::default()
    };
    e.submit(Request {
        prompt: prompt.to_vec(),
        params,
        lane: Lane::Interactive,
        n,
        logprobs: None,
        sink: Box::new(Chan(tx)),
        processors: None,
        proposer: None,
        lora: None,
    })
    .unwrap();
    rx
}

/// Each completion's tokens.
fn tokens(rx: Receiver<Event>, n: usize) -> Vec<Vec<u32>> {
    let mut out = vec![Vec::new(); n];
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            Event::Token { index, token, .. } => out[index].push(token),
            Event::Done { .. } => {}
            Event::Finished { .. } => return out,
            Event::Error(e) => panic!("the request failed: {e}"),
        }
    }
}

#[test]
fn an_offloaded_engine_serves_what_the_host_does() {
    let (mut model, exp, _) = load("llama");
    let n_layer = model.layers.len();
    let dec = GpuDecoder::layers(emu(), &model, 1, KV_BLOCKS).unwrap();
    assert!(n_layer > 1, "the fixture has layers on both sides");
    // The host drops what the device holds (and never reads it again: an empty matrix
    // read would panic).
    let held: usize = model.layers[1..]
        .iter()
        .map(|l| l.wq.w.n_bytes() + l.wo.w.n_bytes())
        .sum();
    assert!(model.evict_offloaded(1) > held);
    assert_eq!(model.layers[1].wq.w.n_bytes(), 0);
    let copies = Arc::new(AtomicUsize::new(0));
    let lm = Arc::new(servable(model));
    let gpu = engine(&lm, Some(Box::new(Counted(dec, copies.clone()))));
    let host = engine(&Arc::new(servable(load("llama").0)), None);

    let prompt = ids(&exp["greedy_prompt"]);
    assert_ne!(prompt.len() % 16, 0, "the prompt ends inside a block");
    let want: Vec<u32> = ids(&exp["greedy_ids"]).into_iter().take(GREEDY).collect();
    let greedy = SamplingParams::greedy();

    assert_eq!(
        tokens(submit(&gpu, &prompt, 1, greedy.clone()), 1),
        std::slice::from_ref(&want)
    );
    // Two completions share the prompt's blocks: each copies the last one before writing.
    let before = copies.load(Ordering::Relaxed);
    assert_eq!(
        tokens(submit(&gpu, &prompt, 2, greedy.clone()), 2),
        [want.clone(), want.clone()]
    );
    assert!(
        copies.load(Ordering::Relaxed) > before,
        "the shared block was copied on the device"
    );
    // The prompt again: served from the prefix cache.
    assert_eq!(
        tokens(submit(&gpu, &prompt, 1, greedy), 1),
        std::slice::from_ref(&want)
    );

    let sampled = SamplingParams {
        temperature: 0.9,
        seed: 7,
        ..Default::default()
    };
    let on_host = tokens(submit(&host, &prompt, 2, sampled.clone()), 2);
    let offloaded = tokens(submit(&gpu, &prompt, 2, sampled), 2);
    assert_eq!(offloaded, on_host);
    assert_ne!(on_host[0], on_host[1], "the two samples differ");

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lora/llama");
    let adapter = LoraAdapter::open(&dir, &lm.model, 1.0).unwrap();
    let (tx, _rx) = channel();
    let err = gpu
        .submit(Request {
            prompt,
            params: GenerateParams::default(),
            lane: Lane::Interactive,
            n: 1,
            logprobs: None,
            sink: Box::new(Chan(tx)),
            processors: None,
            proposer: None,
            lora: Some(Arc::new(LoraSelection {
                adapters: vec![(Arc::new(adapter), 1.0)],
            })),
        })
        .unwrap_err();
    assert!(
        matches!(err, SubmitError::Params(ParamError::LoraOnOffloadedLayers)),
        "{err}"
    );

    // Without the offload, the model whose layers left is refused by name, not run.
    let cpu = engine(&lm, None);
    let rx = submit(&cpu, &[1, 2, 3], 1, SamplingParams::greedy());
    let err = loop {
        match rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            Event::Error(e) => break e.to_string(),
            Event::Finished { .. } => panic!("an evicted model ran on the CPU"),
            _ => {}
        }
    };
    assert!(
        err.contains("layers 1.. of this model run on another device"),
        "{err}"
    );
}
