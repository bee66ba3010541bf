//! The chat loop: read a message or a command, answer with the model while streaming, report.
//!
//! Each answer renders the whole conversation with the chat template and hands it to the
//! session, whose KV cache still holds the previous prompt and answer: only the tokens
//! after the common prefix are evaluated (the stats line and `/stats` show how many were
//! reused). Ctrl-C during an answer sets a flag the streaming callback checks, so the
//! answer stops at the next token and the loop goes on; at the prompt the line editor
//! reports it as a key press instead.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mica::engine::generate::PROMPT_CHUNK;
use mica::engine::{FinishReason, Hooks, LogitsProcessor, Proposer, Session};
use mica::models::LoadedModel;

use crate::budget::{InUse, ResidentCheck};
use mica::models::chat::ChatMessage;

use super::commands::{self, Command, Settings};
use super::input::{Input, Read};
use mica::models::{Conversation, ConversationError};

/// Set while an answer is being generated.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during an answer; checked by the streaming callback.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Routes Ctrl-C: during an answer it stops the answer; otherwise (loading, or reading
/// piped input) it ends the program as usual. At an interactive prompt the terminal is in
/// raw mode, so Ctrl-C arrives as a key, not as this signal.
pub fn install_ctrl_c() {
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            std::process::exit(130);
        }
    });
}

/// Counts for `/stats`.
#[derive(Debug, Default)]
pub struct Stats {
    pub answers: usize,
    pub prompt_new: usize,
    pub prompt_reused: usize,
    pub prompt_time: Duration,
    pub gen_tokens: usize,
    pub gen_time: Duration,
    pub last: Option<Turn>,
}

/// One answer's figures.
#[derive(Debug, Clone)]
pub struct Turn {
    pub prompt_tokens: usize,
    pub reused: usize,
    pub new: usize,
    pub prompt_time: Duration,
    pub gen_tokens: usize,
    pub gen_time: Duration,
    pub finish: FinishReason,
}

/// How the loop ended.
pub enum Outcome {
    Quit,
    /// Switch to this model file (with this display name).
    Switch(PathBuf, String),
}

/// Everything one model's chat loop works with.
pub struct Chat<'a, 'm> {
    pub lm: &'m LoadedModel,
    pub session: Session<&'m LoadedModel>,
    /// Drafts tokens for speculative decoding (`--spec`), kept across answers.
    pub proposer: Option<Box<dyn Proposer>>,
    /// The constraint every answer is generated under.
    pub grammar: Option<&'m mica::grammar::CompiledGrammar>,
    pub model_name: &'a str,
    pub model_path: &'a std::path::Path,
    pub conv: &'a mut Conversation,
    pub settings: &'a mut Settings,
    pub stats: &'a mut Stats,
    pub threads: usize,
    /// The memory check after the first forward pass.
    pub resident: ResidentCheck,
}

/// Runs the loop until the user leaves or switches models.
pub fn run(chat: &mut Chat, input: &mut Input) -> Outcome {
    loop {
        let text = match input.message() {
            Read::Eof => return Outcome::Quit,
            Read::Interrupted => {
                eprintln!("(Ctrl-D or /quit leaves)");
                continue;
            }
            Read::Text(t) => t,
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        input.remember(&text);
        if let Some(literal) = trimmed.strip_prefix("//") {
            chat.answer(format!("/{literal}"));
        } else if trimmed.starts_with('/') {
            match commands::parse(trimmed) {
                Ok(cmd) => {
                    if let Some(outcome) = chat.command(cmd, input) {
                        return outcome;
                    }
                }
                Err(hint) => eprintln!("{hint}"),
            }
        } else {
            chat.answer(text);
        }
    }
}

impl Chat<'_, '_> {
    /// Answers `text` as the next user message, streaming to stdout.
    fn answer(&mut self, text: String) {
        // From here on Ctrl-C stops this answer (even one pressed while the prompt is
        // still being prepared) instead of ending the program.
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        self.answer_inner(text);
        GENERATING.store(false, Ordering::SeqCst);
    }

    fn answer_inner(&mut self, text: String) {
        let n_ctx = self.session.n_ctx();
        self.conv.turns.push(ChatMessage::new("user", text));
        let reserve = self.settings.max_tokens.min(n_ctx / 2);
        let (ids, dropped) = match self.conv.fit(self.lm, n_ctx, reserve) {
            Ok(fit) => fit,
            Err(e) => {
                self.conv.turns.pop();
                match e {
                    ConversationError::TooLong { .. } => {
                        eprintln!("error: {e}; shorten it, or lower /tokens")
                    }
                    e => eprintln!("error: {e}"),
                }
                return;
            }
        };
        if dropped > 0 {
            eprintln!(
                "[context full: dropped the {dropped} oldest messages to make room; the system prompt is kept. /reset starts afresh, /history shows what is left]"
            );
        }
        let params = self.settings.params(mica::engine::random_seed());
        let stdout = std::io::stdout();
        let hooks = Hooks {
            processors: self
                .grammar
                .iter()
                .map(|g| Box::new(g.processor()) as Box<dyn LogitsProcessor>)
                .collect(),
            proposer: self.proposer.as_deref_mut().map(|p| p as &mut dyn Proposer),
        };
        let first_pass = InUse::one_sequence(&self.lm.model, ids.len() + 1, PROMPT_CHUNK);
        let resident = &mut self.resident;
        let result = self.session.generate_with(&ids, &params, hooks, |piece| {
            // The first piece comes after the prompt's forward pass.
            resident.after_forward(None, first_pass);
            let mut out = stdout.lock();
            let written = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
            written.is_ok() && !INTERRUPTED.load(Ordering::SeqCst)
        });
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                self.conv.turns.pop();
                eprintln!("error: {e}");
                return;
            }
        };
        if !generation.text.ends_with('\n') {
            println!();
        }
        let t = generation.timings;
        let turn = Turn {
            prompt_tokens: ids.len(),
            reused: ids.len() - t.prompt_tokens,
            new: t.prompt_tokens,
            prompt_time: t.prompt_time,
            gen_tokens: t.gen_tokens,
            gen_time: t.gen_time,
            finish: generation.finish,
        };
        match generation.finish {
            FinishReason::Cancelled => eprintln!("[stopped]"),
            FinishReason::Context => eprintln!(
                "[context full: the answer was cut. With your next message the oldest turns are dropped (the system prompt is kept); /reset starts afresh]"
            ),
            FinishReason::Length => eprintln!(
                "[answer cut at {} tokens; /tokens N allows more]",
                self.settings.max_tokens
            ),
            _ => {}
        }
        self.conv
            .turns
            .push(ChatMessage::new("assistant", generation.text));
        eprintln!(
            "[{} tokens, {:.2} s, {:.1} tok/s | prompt: {} new + {} cached tokens, {:.0} ms | context {}/{}]",
            turn.gen_tokens,
            turn.gen_time.as_secs_f64(),
            t.gen_tps(),
            turn.new,
            turn.reused,
            turn.prompt_time.as_secs_f64() * 1e3,
            ids.len() + turn.gen_tokens,
            n_ctx,
        );
        self.stats.answers += 1;
        self.stats.prompt_new += turn.new;
        self.stats.prompt_reused += turn.reused;
        self.stats.prompt_time += turn.prompt_time;
        self.stats.gen_tokens += turn.gen_tokens;
        self.stats.gen_time += turn.gen_time;
        self.stats.last = Some(turn);
    }

    /// Acts on a command; `Some` ends this model's loop.
    fn command(&mut self, cmd: Command, input: &Input) -> Option<Outcome> {
        let s = &mut *self.settings;
        match cmd {
            Command::Help => println!("{}", commands::HELP),
            Command::Quit => return Some(Outcome::Quit),
            Command::Reset => {
                self.conv.turns.clear();
                println!("conversation cleared");
            }
            Command::System(None) if self.conv.system.is_empty() => {
                println!("no system prompt (/system TEXT sets one)")
            }
            Command::System(None) => println!("system prompt: {}", self.conv.system),
            Command::System(Some(text)) => {
                let cleared = text.is_empty();
                self.conv.system = text;
                println!("system prompt {}", if cleared { "cleared" } else { "set" });
            }
            Command::Temp(None) => println!("temperature {} (0 = greedy)", s.sampling.temp),
            Command::Temp(Some(v)) => {
                s.sampling.temp = v;
                println!(
                    "temperature set to {v}{}",
                    if v == 0.0 { " (greedy)" } else { "" }
                );
            }
            Command::TopP(None) => println!("top-p {}", s.sampling.top_p),
            Command::TopP(Some(v)) => {
                s.sampling.top_p = v;
                println!("top-p set to {v}");
            }
            Command::Tokens(None) => println!("at most {} tokens per answer", s.max_tokens),
            Command::Tokens(Some(n)) => {
                s.max_tokens = n;
                println!("at most {n} tokens per answer");
            }
            Command::Seed(None) => match s.sampling.seed {
                Some(seed) => println!("seed {seed}"),
                None => println!("seed: random per answer"),
            },
            Command::Seed(Some(seed)) => {
                s.sampling.seed = seed;
                match seed {
                    Some(n) => println!("seed set to {n}"),
                    None => println!("seed: random per answer"),
                }
            }
            Command::Model(None) => {
                println!("{} ({})", self.model_name, self.model_path.display())
            }
            Command::Model(Some(name)) => {
                let models = crate::store::env::models_dir();
                match models.and_then(|m| crate::store::resolve_in(&name, &m, false)) {
                    Ok(path) => return Some(Outcome::Switch(path, name)),
                    Err(e) => eprintln!("error: {e:#}"),
                }
            }
            Command::History => self.print_history(),
            Command::Save(file) => {
                let path = PathBuf::from(&file);
                match self.conv.save(&path, self.model_name) {
                    Ok(()) => println!("saved {} messages to {file}", self.conv.turns.len()),
                    Err(e) => eprintln!("error: {e:#}"),
                }
            }
            Command::Load(file) => match Conversation::load(std::path::Path::new(&file)) {
                Ok(conv) => {
                    *self.conv = conv;
                    println!("loaded {} messages from {file}", self.conv.turns.len());
                }
                Err(e) => eprintln!("error: {e:#}"),
            },
            Command::Stats => self.print_stats(),
            Command::Config => self.print_config(input),
        }
        None
    }

    fn print_history(&self) {
        if !self.conv.system.is_empty() {
            println!("system: {}", self.conv.system);
        }
        if self.conv.turns.is_empty() {
            println!("(no messages yet)");
        }
        for m in &self.conv.turns {
            let who = if m.role == "user" {
                "you"
            } else {
                m.role.as_str()
            };
            println!("{who}: {}", m.content.trim_end());
        }
    }

    fn print_stats(&self) {
        let st = &*self.stats;
        match &st.last {
            None => println!("no answers yet"),
            Some(t) => println!(
                "last answer: prompt {} tokens: {} reused from the cache, {} new, processed in {:.0} ms; {} tokens generated in {:.2} s ({:.1} tok/s), stop: {}",
                t.prompt_tokens,
                t.reused,
                t.new,
                t.prompt_time.as_secs_f64() * 1e3,
                t.gen_tokens,
                t.gen_time.as_secs_f64(),
                t.gen_tokens as f64 / t.gen_time.as_secs_f64().max(1e-9),
                t.finish.as_str(),
            ),
        }
        let total = st.prompt_new + st.prompt_reused;
        println!(
            "session: {} answers; prompt tokens {} ({} reused, {:.0}%, {} processed at {:.1} tok/s); {} generated at {:.1} tok/s",
            st.answers,
            total,
            st.prompt_reused,
            100.0 * st.prompt_reused as f64 / total.max(1) as f64,
            st.prompt_new,
            st.prompt_new as f64 / st.prompt_time.as_secs_f64().max(1e-9),
            st.gen_tokens,
            st.gen_tokens as f64 / st.gen_time.as_secs_f64().max(1e-9),
        );
    }

    fn print_config(&self, input: &Input) {
        let s = &*self.settings;
        let c = &self.lm.model.config;
        println!(
            "model:        {} ({})",
            self.model_name,
            self.model_path.display()
        );
        println!(
            "architecture: {}, {} layers, vocab {}",
            c.arch, c.n_layer, c.n_vocab
        );
        println!(
            "template:     {}",
            if self.lm.template.is_fallback() {
                "ChatML (the model has none)"
            } else {
                "the model's own"
            }
        );
        println!(
            "context:      {} tokens ({} trained), {} threads",
            self.session.n_ctx(),
            c.n_ctx_train,
            self.threads
        );
        println!(
            "sampling:     temp {}, top-k {}, top-p {}, min-p {}, repeat penalty {} (last {}), \
             presence {}, frequency {}",
            s.sampling.temp,
            s.sampling.top_k,
            s.sampling.top_p,
            s.sampling.min_p,
            s.sampling.repeat_penalty,
            s.sampling.repeat_last_n,
            s.sampling.presence_penalty,
            s.sampling.frequency_penalty
        );
        let seed = s
            .sampling
            .seed
            .map_or("random per answer".to_string(), |n| n.to_string());
        println!("answers:      at most {} tokens, seed {seed}", s.max_tokens);
        let system = if self.conv.system.is_empty() {
            "(none)"
        } else {
            &self.conv.system
        };
        println!("system:       {system}");
        if let Some(h) = input.history_file() {
            println!("history file: {}", h.display());
        }
    }
}
