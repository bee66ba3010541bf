//! The sampling flags shared by `mica run` and `mica chat`, so both accept the same names,
//! defaults (llama.cpp's) and penalties.

use clap::Args;
use mica::engine::{Mirostat, SamplingParams};

#[derive(Args, Debug, Clone, PartialEq)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens; 0 disables.
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P; 1 disables.
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one; 0 disables.
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize recently seen tokens (divide positive logits by it); 1 disables.
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtracted once from every recently seen token's logit; 0 disables.
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence from recently seen tokens' logits; 0 disables.
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: a new random one; for chat, one per answer). The same seed
    /// reproduces a run.
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    /// Mirostat sampling (llama.cpp's flag): 0 off, 1 mirostat, 2 mirostat 2.0. Replaces
    /// top-k, top-p, min-p and the penalties.
    #[arg(long = "mirostat", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub mirostat: u8,
    /// Mirostat target entropy (tau).
    #[arg(long = "mirostat-ent", default_value_t = mica::engine::mirostat::DEFAULT_TAU)]
    pub mirostat_ent: f32,
    /// Mirostat learning rate (eta).
    #[arg(long = "mirostat-lr", default_value_t = mica::engine::mirostat::DEFAULT_ETA)]
    pub mirostat_lr: f32,
    /// Add BIAS to a token's logit, as TOKEN=BIAS or llama.cpp's TOKEN+BIAS / TOKEN-BIAS
    /// (repeatable; a large negative bias such as -100 all but forbids the token).
    #[arg(short = 'l', long = "logit-bias", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Locally typical sampling: keep the tokens whose surprise is nearest the entropy until
    /// their probability passes P; 1 disables.
    #[arg(long = "typical-p", alias = "typical", default_value_t = 1.0)]
    pub typical_p: f32,
    /// XTC: the chance per token of removing every token above the threshold but the least
    /// likely of them; 0 disables.
    #[arg(long = "xtc-probability", default_value_t = 0.0)]
    pub xtc_probability: f32,
    /// XTC: tokens at least this likely are the top choices it removes.
    #[arg(long = "xtc-threshold", default_value_t = 0.1)]
    pub xtc_threshold: f32,
    /// DRY: penalty multiplier for tokens that would extend a repeated sequence; 0 disables.
    #[arg(long = "dry-multiplier", default_value_t = 0.0)]
    pub dry_multiplier: f32,
    /// DRY: the penalty grows by this factor per token of the repeat.
    #[arg(long = "dry-base", default_value_t = mica::engine::dry::DEFAULT_BASE)]
    pub dry_base: f32,
    /// DRY: repeats up to this long go unpenalized.
    #[arg(long = "dry-allowed-length", default_value_t = mica::engine::dry::DEFAULT_ALLOWED_LENGTH)]
    pub dry_allowed_length: u32,
    /// DRY: how many recent tokens it looks at; -1 the whole context, 0 disables.
    #[arg(long = "dry-penalty-last-n", default_value_t = mica::engine::dry::DEFAULT_PENALTY_LAST_N,
          allow_hyphen_values = true)]
    pub dry_penalty_last_n: i32,
    /// DRY: a string that ends a repeat (repeatable; \n, \t and \\ are unescaped). Replaces
    /// the defaults ("\n", ":", "\"", "*"); "none" for no breakers.
    #[arg(long = "dry-sequence-breaker")]
    pub dry_sequence_breaker: Vec<String>,
}

/// The DRY breakers of `--dry-sequence-breaker` values: llama.cpp's defaults when there are
/// none, no breakers for `none`, else the values with `\n`, `\t` and `\\` unescaped.
pub fn dry_breakers(values: &[String]) -> Vec<String> {
    if values.is_empty() {
        return mica::engine::dry::default_breakers();
    }
    if values.iter().any(|v| v == "none") {
        return Vec::new();
    }
    values
        .iter()
        .map(|v| {
            let mut out = String::with_capacity(v.len());
            let mut chars = v.chars();
            while let Some(c) = chars.next() {
                if c != '\\' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('\\') => out.push('\\'),
                    Some(o) => {
                        out.push('\\');
                        out.push(o);
                    }
                    None => out.push('\\'),
                }
            }
            out
        })
        .collect()
}

/// One `--logit-bias` value: `TOKEN=BIAS`, `TOKEN+BIAS` or `TOKEN-BIAS`.
pub fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let at = s
        .find(['=', '+', '-'])
        .ok_or_else(|| format!("'{s}': expected TOKEN=BIAS, TOKEN+BIAS or TOKEN-BIAS"))?;
    let token: u32 = s[..at]
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': '{}' is not a token id", &s[..at]))?;
    let rest = if s.as_bytes()[at] == b'=' {
        &s[at + 1..]
    } else {
        &s[at..]
    };
    let bias: f32 = rest
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': '{rest}' is not a number"))?;
    if !bias.is_finite() {
        return Err(format!("'{s}': the bias must be a finite number"));
    }
    Ok((token, bias))
}

impl SamplingArgs {
    /// The sampler's parameters; `seed` is used when no seed was fixed.
    pub fn params(&self, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or(seed),
            mirostat: match self.mirostat {
                1 => Some(Mirostat::V1 {
                    tau: self.mirostat_ent,
                    eta: self.mirostat_lr,
                }),
                2 => Some(Mirostat::V2 {
                    tau: self.mirostat_ent,
                    eta: self.mirostat_lr,
                }),
                _ => None,
            },
            typical_p: self.typical_p,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length: self.dry_allowed_length,
            dry_penalty_last_n: self.dry_penalty_last_n,
            dry_sequence_breakers: dry_breakers(&self.dry_sequence_breaker),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{dry_breakers, parse_logit_bias};

    #[test]
    fn dry_breaker_values() {
        assert_eq!(dry_breakers(&[]), ["\n", ":", "\"", "*"]);
        assert!(dry_breakers(&["none".into()]).is_empty());
        let got = dry_breakers(&["\\n".into(), "a\\tb".into(), "x\\\\y".into(), "q\\z".into()]);
        assert_eq!(got, ["\n", "a\tb", "x\\y", "q\\z"]);
    }

    #[test]
    fn logit_bias_forms() {
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("7-2.5"), Ok((7, -2.5)));
        assert_eq!(parse_logit_bias("7=-100"), Ok((7, -100.0)));
        assert!(parse_logit_bias("7=-inf").is_err());
        assert!(parse_logit_bias("x=1").is_err());
        assert!(parse_logit_bias("7").is_err());
        assert!(parse_logit_bias("7=nan").is_err());
    }
}
