//! The chat's slash commands and the settings they change.
//!
//! Parsing is kept apart from acting on a command so every malformed command can be tested
//! to produce a one-line hint (the `Err` of [`parse`]) and never reach the model.

use mica::engine::GenerateParams;

use crate::sampling_args::SamplingArgs;

/// Sampling and length settings of the chat, changed by `/temp`, `/top-p`, `/tokens`,
/// `/seed`. A fixed seed samples every answer from it; without one each answer draws a
/// fresh random seed.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sampling: SamplingArgs,
    /// Tokens per answer at most.
    pub max_tokens: usize,
}

impl Settings {
    /// The engine's parameters for one answer; `seed` is used when none is fixed.
    pub fn params(&self, seed: u64) -> GenerateParams {
        GenerateParams {
            max_tokens: self.max_tokens,
            sampling: self.sampling.params(seed),
            stop: Vec::new(),
            ignore_eos: false,
            logit_bias: self.sampling.logit_bias.clone(),
        }
    }
}

/// A parsed slash command.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Help,
    Quit,
    Reset,
    /// Show the system prompt (`None`), clear it (`Some("")`), or set it.
    System(Option<String>),
    /// Show (`None`) or set the temperature.
    Temp(Option<f32>),
    TopP(Option<f32>),
    Tokens(Option<usize>),
    /// Show (`None`), fix (`Some(Some(n))`) or unfix (`Some(None)`, "random") the seed.
    Seed(Option<Option<u64>>),
    /// Show the model (`None`) or switch to a store name or path.
    Model(Option<String>),
    History,
    Save(String),
    Load(String),
    Stats,
    Config,
}

/// The `/help` text.
pub const HELP: &str = "\
Type a message and press Enter. Multi-line: end a line with \\ to continue it, or put the
text between lines of \"\"\" . Ctrl-C stops an answer, Ctrl-D (or /quit) leaves.
  /help            this text
  /quit            leave (also /exit, /bye)
  /reset           forget the conversation (the system prompt stays)
  /system [TEXT]   show or set the system prompt (/system none clears it)
  /temp [V]        temperature, 0 = greedy
  /top-p [V]       nucleus sampling threshold in (0, 1]
  /tokens [N]      most tokens per answer
  /seed [N|random] fix the sampling seed, or draw a new one per answer
  /model [NAME]    show the model, or switch to a store name or GGUF path
  /history         the conversation so far
  /save FILE       save the conversation as JSON
  /load FILE       load a conversation saved with /save
  /stats           token counts and speeds (cache reuse of the last prompt)
  /config          the settings, model and context";

/// Parses a line starting with `/`. `Err` holds a one-line hint for the user.
pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    let (name, arg) = match line.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (line, ""),
    };
    let arg_opt = (!arg.is_empty()).then_some(arg);
    let no_arg = |cmd: Command| {
        if arg.is_empty() {
            Ok(cmd)
        } else {
            Err(format!("{name} takes no argument"))
        }
    };
    match name.to_ascii_lowercase().as_str() {
        "/help" | "/?" | "/h" => no_arg(Command::Help),
        "/quit" | "/exit" | "/bye" | "/q" => no_arg(Command::Quit),
        "/reset" | "/clear" => no_arg(Command::Reset),
        "/system" => Ok(Command::System(arg_opt.map(|a| {
            if a.eq_ignore_ascii_case("none") {
                String::new()
            } else {
                a.to_string()
            }
        }))),
        "/temp" => number(
            arg_opt,
            "/temp V: a temperature from 0 (greedy) to 5",
            |v: f32| (0.0..=5.0).contains(&v),
        )
        .map(Command::Temp),
        "/top-p" | "/top_p" | "/topp" => number(
            arg_opt,
            "/top-p V: a probability mass above 0, at most 1",
            |v: f32| v > 0.0 && v <= 1.0,
        )
        .map(Command::TopP),
        "/tokens" | "/max-tokens" => number(
            arg_opt,
            "/tokens N: the most tokens per answer, at least 1",
            |v: usize| (1..=10_000_000).contains(&v),
        )
        .map(Command::Tokens),
        "/seed" => match arg_opt {
            None => Ok(Command::Seed(None)),
            Some(a) if a.eq_ignore_ascii_case("random") => Ok(Command::Seed(Some(None))),
            Some(a) => a
                .parse::<u64>()
                .map(|n| Command::Seed(Some(Some(n))))
                .map_err(|_| format!("/seed N: a whole number, or `random` (got {a:?})")),
        },
        "/model" | "/models" => Ok(Command::Model(arg_opt.map(str::to_string))),
        "/history" => no_arg(Command::History),
        "/save" => arg_opt
            .map(|a| Command::Save(a.to_string()))
            .ok_or_else(|| "/save FILE: where to write the conversation (JSON)".into()),
        "/load" => arg_opt
            .map(|a| Command::Load(a.to_string()))
            .ok_or_else(|| "/load FILE: a conversation written by /save".into()),
        "/stats" => no_arg(Command::Stats),
        "/config" | "/settings" => no_arg(Command::Config),
        _ => Err(format!(
            "unknown command {name}; /help lists the commands (start a message with // to send a literal /)"
        )),
    }
}

/// `None` without an argument; the parsed value when it is valid; else the usage hint.
fn number<T: std::str::FromStr + Copy>(
    arg: Option<&str>,
    usage: &str,
    valid: impl Fn(T) -> bool,
) -> Result<Option<T>, String> {
    let Some(a) = arg else { return Ok(None) };
    match a.parse::<T>() {
        Ok(v) if valid(v) => Ok(Some(v)),
        _ => Err(format!("{usage} (got {a:?})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands() {
        assert_eq!(parse("/temp 0"), Ok(Command::Temp(Some(0.0))));
        assert_eq!(parse("/temp"), Ok(Command::Temp(None)));
        assert_eq!(parse(" /TOP-P 0.5 "), Ok(Command::TopP(Some(0.5))));
        assert_eq!(parse("/tokens 12"), Ok(Command::Tokens(Some(12))));
        assert_eq!(parse("/seed random"), Ok(Command::Seed(Some(None))));
        assert_eq!(parse("/seed 7"), Ok(Command::Seed(Some(Some(7)))));
        assert_eq!(
            parse("/system Be  brief."),
            Ok(Command::System(Some("Be  brief.".into())))
        );
        assert_eq!(
            parse("/system none"),
            Ok(Command::System(Some(String::new())))
        );
        assert_eq!(
            parse("/save a b.json"),
            Ok(Command::Save("a b.json".into()))
        );
        assert_eq!(parse("/bye"), Ok(Command::Quit));
    }

    #[test]
    fn bad_values_give_one_line_hints() {
        for bad in [
            "/temp hot",
            "/temp -1",
            "/temp NaN",
            "/temp 9",
            "/top-p 0",
            "/top-p 1.5",
            "/tokens 0",
            "/tokens -3",
            "/tokens many",
            "/seed x",
            "/save",
            "/load",
            "/quit now",
            "/frobnicate",
            "/",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(!e.contains('\n') && !e.is_empty(), "{bad}: {e}");
        }
        assert!(parse("/frobnicate").unwrap_err().contains("/help"));
    }

    #[test]
    fn settings_become_params() {
        let mut s = Settings {
            sampling: SamplingArgs {
                temp: 0.0,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                repeat_penalty: 1.1,
                repeat_last_n: 32,
                presence_penalty: 0.5,
                frequency_penalty: 0.25,
                seed: Some(3),
                mirostat: 0,
                mirostat_ent: 5.0,
                mirostat_lr: 0.1,
                logit_bias: Vec::new(),
                typical_p: 1.0,
                xtc_probability: 0.0,
                xtc_threshold: 0.1,
                dry_multiplier: 0.0,
                dry_base: 1.75,
                dry_allowed_length: 2,
                dry_penalty_last_n: -1,
                dry_sequence_breaker: Vec::new(),
            },
            max_tokens: 5,
        };
        let p = s.params(99);
        assert_eq!(p.sampling.seed, 3);
        assert_eq!(p.max_tokens, 5);
        assert_eq!(p.sampling.top_p, 0.9);
        assert_eq!(p.sampling.repeat_penalty, 1.1);
        assert_eq!(p.sampling.penalty_last_n, 32);
        assert_eq!(p.sampling.presence_penalty, 0.5);
        assert_eq!(p.sampling.frequency_penalty, 0.25);
        s.sampling.seed = None;
        assert_eq!(s.params(99).sampling.seed, 99);
    }
}
