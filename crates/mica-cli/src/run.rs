//! `mica run`: one prompt in, streamed text out, timings on stderr.

use anyhow::{Context, Result, bail};
use clap::Args;
use mica::engine::{GenerateParams, Hooks, LogitsProcessor, Proposer, Session};

use crate::budget::{self, BudgetArgs, InUse, ResidentCheck, Sizing};
use crate::cache_args::CacheArgs;
use crate::constraint_args::{self, ConstraintArgs};
use crate::lora_args::LoraArgs;
use crate::sampling_args::SamplingArgs;
use crate::spec_args::SpecArgs;
use mica::engine::generate::PROMPT_CHUNK;
use mica::models::chat::ChatMessage;
use mica::models::config::Numerics;
use mica::models::memory::mib;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Model: a GGUF file or a store name (see `mica list`). Without it, the default model
    /// is used (downloaded on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Prompt text. Special tokens written in it (e.g. <|im_start|>) are parsed as such.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    #[command(flatten)]
    pub lora: LoraArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub gpu: crate::gpu_args::GpuArgs,
    /// Stop before this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long = "chat")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long = "system", requires = "chat")]
    pub system: Option<String>,
    /// Compute threads (default: physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// KV cache type: f16 (llama.cpp's numerics) or f32 (f32 cache and attention, GELU by
    /// its formula). Default: f32 for float32 checkpoints, f16 otherwise.
    #[arg(long = "kv-type", value_parser = ["f16", "f32"])]
    pub kv_type: Option<String>,
    /// Keep the weights in the file's layout instead of repacking them at load for faster
    /// products (same results; repacking reads the whole file up front).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Print one JSON object (ids, text, timings) instead of streaming text.
    #[arg(long = "json")]
    pub json: bool,
    /// Do not parse special tokens written in the prompt.
    #[arg(long = "no-parse-special", conflicts_with = "chat")]
    pub no_parse_special: bool,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

pub fn run(args: RunArgs) -> Result<()> {
    let prompt_text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt from {}", f.display()))?,
        (None, None) => bail!("no prompt: pass -p TEXT or -f FILE"),
    };
    let constraint = args.constraint.constraint()?;
    let path = crate::store::resolve_model(args.model.as_deref(), args.json)?;
    let t0 = Instant::now();
    let repack = !args.no_repack;
    let mut lm = budget::open(&path)?;
    match args.kv_type.as_deref() {
        Some("f16") => lm.model.config.numerics = Numerics::LlamaCpp,
        Some("f32") => lm.model.config.numerics = Numerics::F32,
        _ => {}
    }
    args.cache.apply(&mut lm)?;
    let n_ctx = args
        .ctx_size
        .unwrap_or(lm.model.config.n_ctx_train.min(4096));
    if n_ctx == 0 {
        bail!("the context size must be positive");
    }
    let sizing = Sizing::one_sequence(n_ctx, PROMPT_CHUNK);
    let est = budget::fit(&mut lm, repack, sizing, &args.budget)?;
    args.lora.apply(&mut lm, args.json)?;
    // The GPU's layers placed (from the file's bytes) and dropped from host memory before
    // the weights are repacked: only the host's layers are.
    let blocks = n_ctx.div_ceil(mica::models::kv_cache::BLOCK_SIZE);
    let offload = args.gpu.offload(&lm.model, blocks, PROMPT_CHUNK)?;
    if let Some(o) = &offload {
        crate::gpu_args::evict(&mut lm, o.first_layer());
    }
    budget::prepare(&mut lm, repack);
    let load_time = t0.elapsed();

    let prompt_ids = if args.chat {
        if lm.template.is_fallback() {
            eprintln!(
                "note: {} has no chat template; using ChatML (as llama.cpp does)",
                path.display()
            );
        }
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", prompt_text));
        lm.chat_prompt(&msgs)?
    } else {
        lm.tokenizer
            .encode(&prompt_text, true, !args.no_parse_special)?
    };

    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores);
    if threads == 0 {
        bail!("the thread count must be positive");
    }
    let sampling = args.sampling.params(mica::engine::random_seed());
    let seed = sampling.seed;
    let params = GenerateParams {
        max_tokens: args.n_predict,
        sampling,
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        logit_bias: args.sampling.logit_bias.clone(),
    };

    let spec = args.spec.resolve(Some(&lm), n_ctx, args.json)?;
    // Checked before anything is generated: a bad constraint is an error, never
    // unconstrained output.
    let grammar = match &constraint {
        Some(c) => Some(constraint_args::compile(&lm, c)?),
        None => None,
    };
    let t_session = Instant::now();
    let mut session = Session::new(&lm, n_ctx, threads);
    if let Some(o) = offload {
        session.offload(o);
    }
    log::info!(
        "load: session ({} threads, KV cache for {n_ctx} positions, {} reserved) in {:.0} ms",
        threads,
        mib(est.kv_cache),
        t_session.elapsed().as_secs_f64() * 1e3
    );
    let mut resident = ResidentCheck::new(est);
    let first_pass = InUse::one_sequence(&lm.model, prompt_ids.len() + 1, PROMPT_CHUNK);
    let mut proposer = spec.proposer(&lm, &session.shared_pool())?;
    let hooks = Hooks {
        processors: grammar
            .iter()
            .map(|g| Box::new(g.processor()) as Box<dyn LogitsProcessor>)
            .collect(),
        proposer: proposer.as_deref_mut().map(|p| p as &mut dyn Proposer),
    };
    let stdout = std::io::stdout();
    let json = args.json;
    let gen_result = session.generate_with(&prompt_ids, &params, hooks, |piece| {
        // The first piece comes after the prompt's forward pass.
        resident.after_forward(None, first_pass);
        if !json {
            let mut out = stdout.lock();
            // A closed stdout (e.g. piped into `head`) ends generation quietly.
            return out
                .write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_ok();
        }
        true
    })?;
    // Nothing streamed (an immediate end): the check after the whole run.
    let positions = prompt_ids.len() + gen_result.output_ids.len();
    resident.after_forward(
        None,
        InUse::one_sequence(&lm.model, positions, PROMPT_CHUNK),
    );
    let t = gen_result.timings;
    if json {
        let obj = serde_json::json!({
            "model": path.display().to_string(),
            "prompt_ids": prompt_ids,
            "output_ids": gen_result.output_ids,
            "text": gen_result.text,
            "finish_reason": gen_result.finish.as_str(),
            "seed": seed,
            "timings": {
                "load_ms": load_time.as_secs_f64() * 1e3,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms": t.prompt_time.as_secs_f64() * 1e3,
                "prompt_tokens_per_s": t.prompt_tps(),
                "gen_tokens": t.gen_tokens,
                "gen_ms": t.gen_time.as_secs_f64() * 1e3,
                "gen_tokens_per_s": t.gen_tps(),
                "gen_passes": t.gen_passes,
                "draft_tokens": t.draft_tokens,
                "accepted_draft_tokens": t.accepted_draft_tokens,
                "spec": format!("{:?}", args.spec.kind()).to_lowercase(),
                "threads": threads,
            },
        });
        println!("{obj}");
    } else {
        println!();
        let drafts = if t.draft_tokens > 0 {
            format!(
                " ({} passes; {} of {} drafted tokens accepted)",
                t.gen_passes, t.accepted_draft_tokens, t.draft_tokens
            )
        } else {
            String::new()
        };
        eprintln!(
            "\n[mica] load {:.0} ms | prompt {} tok, {:.1} tok/s | generation {} tok, {:.1} tok/s{drafts} | {} threads | stop: {}",
            load_time.as_secs_f64() * 1e3,
            t.prompt_tokens,
            t.prompt_tps(),
            t.gen_tokens,
            t.gen_tps(),
            threads,
            gen_result.finish.as_str(),
        );
    }
    Ok(())
}
