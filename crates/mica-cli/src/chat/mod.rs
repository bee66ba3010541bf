//! `mica chat`: an interactive conversation with a model in the terminal.
//!
//! [`input`] reads messages (line editor and history on a terminal, plain lines from a
//! pipe), [`commands`] parses the slash commands, [`conversation`] holds the messages and
//! renders them with the model's template, and [`repl`] runs the loop: answer, stream,
//! report. This module resolves the flags, picks the model (from `-m`, or from the store),
//! and reloads when `/model` switches models, keeping the conversation and settings.

mod commands;
mod input;
mod repl;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use mica::engine::Session;
use mica::engine::generate::PROMPT_CHUNK;
use mica::models::{LoadedModel, MemoryEstimate};

use crate::budget::{self, BudgetArgs, ResidentCheck, Sizing};
use crate::cache_args::CacheArgs;
use crate::constraint_args::{self, ConstraintArgs};
use crate::lora_args::LoraArgs;
use crate::sampling_args::SamplingArgs;
use crate::spec_args::SpecArgs;
use crate::store;
use commands::Settings;
use input::{Input, Read};
use mica::models::Conversation;
use repl::{Chat, Outcome, Stats};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model: a store name (see `mica list`) or a GGUF file. Without it, pick one from the
    /// store (the default model when the store is empty).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// System prompt.
    #[arg(long = "system")]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Every answer is constrained (checked when the model loads, before any answer).
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Adapters for the model named by `-m` (not applied to models switched to later).
    #[command(flatten)]
    pub lora: LoraArgs,
    /// KV cache types of every model loaded in the session.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "tokens", default_value_t = 1024)]
    pub tokens: usize,
    /// Compute threads (default: physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Keep the weights in the file's layout instead of repacking them at load for faster
    /// products (same results; repacking reads the whole file up front).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// The memory check applies to every model loaded (the first and `/model` switches).
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// The last layers of every model loaded, and its head, on the first CUDA GPU.
    #[command(flatten)]
    pub gpu: crate::gpu_args::GpuArgs,
}

pub fn chat(args: ChatArgs) -> Result<()> {
    let settings = Settings {
        sampling: args.sampling.clone(),
        max_tokens: args.tokens,
    };
    settings
        .params(0)
        .sampling
        .validate()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.tokens == 0 || args.ctx_size == Some(0) || args.threads == Some(0) {
        bail!("--tokens, --ctx-size and --threads must be positive");
    }
    let constraint = args.constraint.constraint()?;
    repl::install_ctrl_c();
    let history = store::env::home_dir().ok().map(|h| h.join("chat_history"));
    let mut input = Input::new(history);
    let (path, name) = match &args.model {
        Some(m) => (store::resolve_model(Some(m), false)?, m.clone()),
        None => pick_model(&mut input)?,
    };
    let mut state = State {
        settings,
        conv: Conversation {
            system: args.system.clone().unwrap_or_default(),
            turns: Vec::new(),
        },
        stats: Stats::default(),
    };
    let constrained = |(mut lm, est): (LoadedModel, MemoryEstimate)| -> Result<Loaded> {
        let grammar = match &constraint {
            Some(c) => Some(constraint_args::compile(&lm, c)?),
            None => None,
        };
        let offload = offload(&lm, &args)?;
        if let Some(o) = &offload {
            crate::gpu_args::evict(&mut lm, o.first_layer());
        }
        Ok(Loaded {
            lm,
            grammar,
            est,
            offload,
        })
    };
    let mut first = load(&path, &args)?;
    args.lora.apply(&mut first.0, false)?;
    let mut current = (constrained(first)?, path, name);
    loop {
        let (loaded, path, name) = &mut current;
        let outcome = session_loop(loaded, path, name, &args, &mut state, &mut input);
        match outcome {
            Outcome::Quit => return Ok(()),
            Outcome::Switch(new_path, new_name) => {
                match load(&new_path, &args).and_then(constrained) {
                    Ok(l) => {
                        if !args.lora.lora.is_empty() {
                            eprintln!("note: the LoRA adapters stay with {name}");
                        }
                        current = (l, new_path, new_name)
                    }
                    Err(e) => eprintln!("error: {e:#}; staying with {name}"),
                }
            }
        }
    }
}

/// A loaded model with the constraint compiled for its vocabulary.
struct Loaded {
    lm: LoadedModel,
    grammar: Option<mica::grammar::CompiledGrammar>,
    /// Its memory estimate, checked against the resident set after the first answer.
    est: MemoryEstimate,
    /// Its last layers on the GPU (`--gpu-layers`), between its sessions.
    offload: Option<Box<dyn mica::models::LayerOffload + Send>>,
}

/// The `--gpu-layers` placement of `lm`, with caches for its context.
fn offload(
    lm: &LoadedModel,
    args: &ChatArgs,
) -> Result<Option<Box<dyn mica::models::LayerOffload + Send>>> {
    let blocks = context_size(args, lm).div_ceil(mica::models::kv_cache::BLOCK_SIZE);
    args.gpu.offload(&lm.model, blocks, PROMPT_CHUNK)
}

/// What survives a model switch.
struct State {
    settings: Settings,
    conv: Conversation,
    stats: Stats,
}

/// One model's chat: prints the banner and runs the loop with a fresh session.
fn session_loop(
    loaded: &mut Loaded,
    path: &Path,
    name: &str,
    args: &ChatArgs,
    state: &mut State,
    input: &mut Input,
) -> Outcome {
    // Placed at load, and handed back at the end of the session: a chat that comes back
    // to this model (after a failed switch) reuses it.
    let offload = loaded.offload.take();
    let mine = &*loaded;
    let lm = &mine.lm;
    let n_ctx = context_size(args, lm);
    let threads = args
        .threads
        .unwrap_or_else(mica::kernels::pool::physical_cores);
    if lm.template.is_fallback() {
        eprintln!("note: {name} has no chat template; using ChatML");
    }
    eprintln!(
        "mica chat: {name} · context {n_ctx} tokens · /help for commands, Ctrl-C stops an answer, Ctrl-D leaves"
    );
    let mut session = Session::new(lm, n_ctx, threads);
    if let Some(o) = offload {
        session.offload(o);
    }
    let proposer = match args
        .spec
        .resolve(Some(lm), n_ctx, false)
        .and_then(|spec| Ok(spec.proposer(lm, &session.shared_pool())?))
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}; answering without speculative decoding");
            None
        }
    };
    let mut chat = Chat {
        lm,
        session,
        proposer,
        grammar: mine.grammar.as_ref(),
        model_name: name,
        model_path: path,
        conv: &mut state.conv,
        settings: &mut state.settings,
        stats: &mut state.stats,
        threads,
        resident: ResidentCheck::new(mine.est),
    };
    let outcome = repl::run(&mut chat, input);
    let back = chat.session.into_offload();
    loaded.offload = back;
    outcome
}

/// The context a model gets: `--ctx-size`, else the model's, at most 4096.
fn context_size(args: &ChatArgs, lm: &LoadedModel) -> usize {
    args.ctx_size
        .unwrap_or(lm.model.config.n_ctx_train.min(4096))
        .max(1)
}

/// Opens a model, checks its memory estimate and prepares it.
fn load(path: &Path, args: &ChatArgs) -> Result<(LoadedModel, MemoryEstimate)> {
    let t0 = Instant::now();
    let lm = budget::load(path, !args.no_repack, &args.budget, &args.cache, |lm| {
        Sizing::one_sequence(context_size(args, lm), PROMPT_CHUNK)
    })?;
    eprintln!(
        "mica: loaded {} in {:.0} ms",
        path.display(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    Ok(lm)
}

/// Without `-m`: the only GGUF model in the store, or one the user picks from a numbered
/// list (the default model when reading from a pipe), or the default model, fetched, when
/// the store is empty.
fn pick_model(input: &mut Input) -> Result<(PathBuf, String)> {
    let all: Vec<mica::hub::Installed> = store::env::store()?
        .list()?
        .into_iter()
        .filter(|m| m.kind == mica::hub::Kind::Gguf)
        .collect();
    let default_name =
        mica::hub::catalog::find("smollm2-135m-instruct").map_or("default", |e| e.name);
    match all.len() {
        0 => {
            eprintln!("mica: the store is empty; using the default model ({default_name})");
            let path = store::default_model(false)?;
            Ok((path, default_name.to_string()))
        }
        1 => Ok((all[0].path.clone(), all[0].name.clone())),
        _ if !input.interactive() => {
            let m = all
                .iter()
                .find(|m| m.name == default_name)
                .unwrap_or(&all[0]);
            eprintln!("mica: using {} (pass -m to choose)", m.name);
            Ok((m.path.clone(), m.name.clone()))
        }
        _ => {
            eprintln!("models in the store:");
            for (i, m) in all.iter().enumerate() {
                eprintln!(
                    "  {}. {} ({})",
                    i + 1,
                    m.name,
                    indicatif::HumanBytes(m.size)
                );
            }
            loop {
                match input.line(&format!("pick a model [1-{}, Enter = 1]: ", all.len())) {
                    Read::Text(t) if t.trim().is_empty() => {
                        return Ok((all[0].path.clone(), all[0].name.clone()));
                    }
                    Read::Text(t) => match t.trim().parse::<usize>() {
                        Ok(n) if (1..=all.len()).contains(&n) => {
                            return Ok((all[n - 1].path.clone(), all[n - 1].name.clone()));
                        }
                        _ => eprintln!("type a number from 1 to {}", all.len()),
                    },
                    Read::Interrupted | Read::Eof => bail!("no model chosen"),
                }
            }
        }
    }
}
