//! Validation both APIs share, so that one value gets one answer whichever API carries it:
//! the sampling fields ([`SamplingFields`], checked by [`validate_sampling`]: the same
//! ranges and the same 400 for OpenAI's `temperature` and Ollama's `options.temperature`),
//! roles, completion counts and log-probabilities, and the context rule
//! ([`completion_budget`]). Field names in errors are the API's own: the caller passes its
//! prefix (`""` for OpenAI, `"options."` for Ollama).
//!
//! This layer is the server's own: it does not rely on the engine's checks (which remain as
//! a guard) and returns a typed [`ParamError`] naming the field.

use crate::error::ParamError;
use mica::engine::{Mirostat, SamplingParams};

/// Most completions per request (`n`), and most alternatives per token (`top_logprobs`,
/// legacy `logprobs`), as OpenAI allows for the latter.
pub const MAX_N: usize = 16;
pub const MAX_LOGPROBS: usize = 20;
/// Most stop strings per request.
pub const MAX_STOP: usize = 16;
/// Most DRY sequence breakers per request (each costs a scan of the vocabulary).
pub const MAX_DRY_BREAKERS: usize = 16;

/// Sampling fields as a request gives them, before validation (both APIs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    /// Tokens the penalties look back over; -1: the whole context.
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    /// 0 off, 1 mirostat, 2 mirostat 2.0 (llama.cpp's and Ollama's field).
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f64>,
    pub mirostat_eta: Option<f64>,
    /// Token id (as a string, OpenAI's JSON shape) → bias added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// Locally typical sampling's mass (1 off).
    pub typical_p: Option<f64>,
    /// XTC's chance per token (0 off) and threshold (default 0.1).
    pub xtc_probability: Option<f64>,
    pub xtc_threshold: Option<f64>,
    /// DRY (llama.cpp's server names): multiplier (0 off), base, allowed length, window
    /// (-1: the whole context, 0 off) and sequence breakers.
    pub dry_multiplier: Option<f64>,
    pub dry_base: Option<f64>,
    pub dry_allowed_length: Option<i64>,
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
}

/// What an API uses for the fields a request leaves out.
#[derive(Clone, Copy, Debug)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
}

/// OpenAI's meaning: temperature 1, top-p 1, no top-k, min-p or repeat penalty.
pub const OPENAI_DEFAULTS: SamplingDefaults = SamplingDefaults {
    temperature: 1.0,
    top_k: 0,
    top_p: 1.0,
    min_p: 0.0,
    repeat_penalty: 1.0,
    repeat_last_n: 64,
};

/// Ollama's defaults (llama.cpp's chain): top-k 40, top-p 0.9, temperature 0.8, repeat
/// penalty 1.1 over the last 64 tokens.
pub const OLLAMA_DEFAULTS: SamplingDefaults = SamplingDefaults {
    temperature: 0.8,
    top_k: 40,
    top_p: 0.9,
    min_p: 0.0,
    repeat_penalty: 1.1,
    repeat_last_n: 64,
};

/// Validated sampling: the sampler's parameters (seed resolved: the request's, or a random
/// one) and the stop strings.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub params: SamplingParams,
    pub stop: Vec<String>,
    /// `(token, bias)` of the request's `logit_bias`.
    pub logit_bias: Vec<(u32, f32)>,
}

fn range(prefix: &str, name: &str, v: Option<f64>, min: f64, max: f64) -> Result<(), ParamError> {
    match v {
        Some(x) if !(x.is_finite() && (min..=max).contains(&x)) => Err(ParamError::OutOfRange {
            field: format!("{prefix}{name}"),
            min,
            max,
            got: x,
        }),
        _ => Ok(()),
    }
}

/// Checks every sampling field against the one set of rules both APIs follow:
///
/// | field | rule |
/// | --- | --- |
/// | `temperature` | 0 to 2 (0 is greedy) |
/// | `top_p`, `min_p` | 0 to 1 |
/// | `top_k` | ≥ 0 (0 disables) |
/// | `repeat_penalty` | > 0 and finite |
/// | `repeat_last_n` | ≥ -1 (-1: the whole context) |
/// | `presence_penalty`, `frequency_penalty` | -2 to 2 |
/// | `stop` | at most [`MAX_STOP`] strings, none empty |
/// | `mirostat` | 0, 1 or 2; `mirostat_tau` > 0 (default 5), `mirostat_eta` 0 to 1 (default 0.1) |
/// | `logit_bias` | token ids as keys, biases -100 to 100 |
/// | `typical_p`, `xtc_probability`, `xtc_threshold` | 0 to 1 (defaults 1, 0, 0.1) |
/// | `dry_multiplier` | ≥ 0 and finite (default 0: off) |
/// | `dry_base` | ≥ 1 and finite (default 1.75) |
/// | `dry_allowed_length` | ≥ 0 (default 2) |
/// | `dry_penalty_last_n` | ≥ -1 (default -1: the whole context; 0: off) |
/// | `dry_sequence_breakers` | 1 to [`MAX_DRY_BREAKERS`] strings, none empty (default `["\n", ":", "\"", "*"]`) |
pub fn validate_sampling(
    f: &SamplingFields,
    prefix: &str,
    d: &SamplingDefaults,
) -> Result<Sampling, ParamError> {
    let field = |name: &str| format!("{prefix}{name}");
    range(prefix, "temperature", f.temperature, 0.0, 2.0)?;
    range(prefix, "top_p", f.top_p, 0.0, 1.0)?;
    range(prefix, "min_p", f.min_p, 0.0, 1.0)?;
    range(prefix, "presence_penalty", f.presence_penalty, -2.0, 2.0)?;
    range(prefix, "frequency_penalty", f.frequency_penalty, -2.0, 2.0)?;
    if let Some(k) = f.top_k
        && k < 0
    {
        return Err(ParamError::Invalid {
            field: field("top_k"),
            rule: "at least 0 (0 disables top-k)",
            got: k.to_string(),
        });
    }
    if let Some(p) = f.repeat_penalty
        && !(p.is_finite() && p > 0.0)
    {
        return Err(ParamError::Invalid {
            field: field("repeat_penalty"),
            rule: "greater than 0 (1 disables it)",
            got: p.to_string(),
        });
    }
    if let Some(n) = f.repeat_last_n
        && n < -1
    {
        return Err(ParamError::Invalid {
            field: field("repeat_last_n"),
            rule: "at least -1 (-1: the whole context, 0: none)",
            got: n.to_string(),
        });
    }
    let mirostat = mirostat(f, prefix)?;
    let logit_bias = logit_bias(f, prefix)?;
    range(prefix, "typical_p", f.typical_p, 0.0, 1.0)?;
    range(prefix, "xtc_probability", f.xtc_probability, 0.0, 1.0)?;
    range(prefix, "xtc_threshold", f.xtc_threshold, 0.0, 1.0)?;
    let stop = f.stop.clone().unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ParamError::TooMany {
            field: field("stop"),
            max: MAX_STOP,
            got: stop.len(),
        });
    }
    if let Some(i) = stop.iter().position(String::is_empty) {
        return Err(ParamError::Empty {
            field: format!("{prefix}stop[{i}]"),
        });
    }
    let params = SamplingParams {
        temperature: f.temperature.map_or(d.temperature, |v| v as f32),
        top_k: f
            .top_k
            .map_or(d.top_k, |k| usize::try_from(k).unwrap_or(usize::MAX)),
        top_p: f.top_p.map_or(d.top_p, |v| v as f32),
        min_p: f.min_p.map_or(d.min_p, |v| v as f32),
        repeat_penalty: f.repeat_penalty.map_or(d.repeat_penalty, |v| v as f32),
        presence_penalty: f.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0) as f32,
        penalty_last_n: match f.repeat_last_n {
            None => d.repeat_last_n,
            Some(-1) => usize::MAX,
            Some(n) => usize::try_from(n).unwrap_or(0),
        },
        seed: f.seed.unwrap_or_else(mica::engine::random_seed),
        mirostat,
        ..SamplingParams::default()
    };
    let params = SamplingParams {
        typical_p: f.typical_p.map_or(params.typical_p, |v| v as f32),
        xtc_probability: f
            .xtc_probability
            .map_or(params.xtc_probability, |v| v as f32),
        xtc_threshold: f.xtc_threshold.map_or(params.xtc_threshold, |v| v as f32),
        ..dry(f, prefix, params)?
    };
    Ok(Sampling {
        params,
        stop,
        logit_bias,
    })
}

/// `params` with the `dry_*` fields of the request.
fn dry(
    f: &SamplingFields,
    prefix: &str,
    params: SamplingParams,
) -> Result<SamplingParams, ParamError> {
    let field = |name: &str| format!("{prefix}{name}");
    let invalid = |name: &str, rule: &'static str, got: String| ParamError::Invalid {
        field: field(name),
        rule,
        got,
    };
    let mut p = params;
    if let Some(m) = f.dry_multiplier {
        if !(m.is_finite() && m >= 0.0) {
            return Err(invalid(
                "dry_multiplier",
                "at least 0 (0 disables DRY)",
                m.to_string(),
            ));
        }
        p.dry_multiplier = m as f32;
    }
    if let Some(b) = f.dry_base {
        if !(b.is_finite() && b >= 1.0) {
            return Err(invalid("dry_base", "at least 1", b.to_string()));
        }
        p.dry_base = b as f32;
    }
    if let Some(n) = f.dry_allowed_length {
        p.dry_allowed_length = u32::try_from(n)
            .map_err(|_| invalid("dry_allowed_length", "at least 0", n.to_string()))?;
    }
    if let Some(n) = f.dry_penalty_last_n {
        p.dry_penalty_last_n = i32::try_from(n.min(i32::MAX as i64))
            .ok()
            .filter(|&n| n >= -1)
            .ok_or_else(|| {
                invalid(
                    "dry_penalty_last_n",
                    "at least -1 (-1: the whole context, 0: off)",
                    n.to_string(),
                )
            })?;
    }
    if let Some(b) = &f.dry_sequence_breakers {
        if b.is_empty() {
            return Err(ParamError::Empty {
                field: field("dry_sequence_breakers"),
            });
        }
        if b.len() > MAX_DRY_BREAKERS {
            return Err(ParamError::TooMany {
                field: field("dry_sequence_breakers"),
                max: MAX_DRY_BREAKERS,
                got: b.len(),
            });
        }
        if let Some(i) = b.iter().position(String::is_empty) {
            return Err(ParamError::Empty {
                field: format!("{prefix}dry_sequence_breakers[{i}]"),
            });
        }
        p.dry_sequence_breakers = b.clone();
    }
    Ok(p)
}

/// The `mirostat` fields as the sampler's setting.
fn mirostat(f: &SamplingFields, prefix: &str) -> Result<Option<Mirostat>, ParamError> {
    range(prefix, "mirostat_eta", f.mirostat_eta, 0.0, 1.0)?;
    let tau = f
        .mirostat_tau
        .unwrap_or(mica::engine::mirostat::DEFAULT_TAU as f64);
    if !(tau.is_finite() && tau > 0.0) {
        return Err(ParamError::Invalid {
            field: format!("{prefix}mirostat_tau"),
            rule: "a positive number (target surprise in bits)",
            got: tau.to_string(),
        });
    }
    let (tau, eta) = (
        tau as f32,
        f.mirostat_eta
            .map_or(mica::engine::mirostat::DEFAULT_ETA, |v| v as f32),
    );
    match f.mirostat {
        None | Some(0) => Ok(None),
        Some(1) => Ok(Some(Mirostat::V1 { tau, eta })),
        Some(2) => Ok(Some(Mirostat::V2 { tau, eta })),
        Some(v) => Err(ParamError::Invalid {
            field: format!("{prefix}mirostat"),
            rule: "0 (off), 1 or 2",
            got: v.to_string(),
        }),
    }
}

/// `logit_bias` as `(token, bias)` pairs (token ids are checked against the vocabulary by
/// the engine).
fn logit_bias(f: &SamplingFields, prefix: &str) -> Result<Vec<(u32, f32)>, ParamError> {
    let Some(map) = &f.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(k, &v)| {
            let field = format!("{prefix}logit_bias.{k}");
            let token: u32 = k.trim().parse().map_err(|_| ParamError::Invalid {
                field: field.clone(),
                rule: "keyed by token ids",
                got: format!("'{k}'"),
            })?;
            if !(v.is_finite() && (-100.0..=100.0).contains(&v)) {
                return Err(ParamError::OutOfRange {
                    field,
                    min: -100.0,
                    max: 100.0,
                    got: v,
                });
            }
            Ok((token, v as f32))
        })
        .collect()
}

/// `n`: 1 to [`MAX_N`] completions (default 1).
pub fn validate_n(n: Option<i64>) -> Result<usize, ParamError> {
    match n {
        None => Ok(1),
        Some(v) if (1..=MAX_N as i64).contains(&v) => Ok(v as usize),
        Some(v) => Err(ParamError::OutOfRange {
            field: "n".into(),
            min: 1.0,
            max: MAX_N as f64,
            got: v as f64,
        }),
    }
}

/// A count of alternatives per token: 0 to [`MAX_LOGPROBS`].
pub fn validate_logprobs(field: &str, v: i64) -> Result<usize, ParamError> {
    if (0..=MAX_LOGPROBS as i64).contains(&v) {
        Ok(v as usize)
    } else {
        Err(ParamError::OutOfRange {
            field: field.into(),
            min: 0.0,
            max: MAX_LOGPROBS as f64,
            got: v as f64,
        })
    }
}

/// A requested completion length (`max_tokens`): at least 1.
pub fn validate_max_tokens(field: &str, v: i64) -> Result<usize, ParamError> {
    usize::try_from(v)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| ParamError::Invalid {
            field: field.into(),
            rule: "at least 1",
            got: v.to_string(),
        })
}

/// The roles a conversation may use under OpenAI's API. `developer` is OpenAI's newer name
/// for `system` and is rendered as one.
pub const OPENAI_ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];
/// The roles of Ollama's API.
pub const OLLAMA_ROLES: &[&str] = &["system", "user", "assistant", "tool"];

/// Checks a message's role against `allowed`; returns the role to render.
pub fn validate_role(role: &str, field: String, allowed: &[&str]) -> Result<String, ParamError> {
    if !allowed.contains(&role) {
        return Err(ParamError::UnknownRole {
            field,
            role: role.to_string(),
            allowed: allowed.join(", "),
        });
    }
    Ok(if role == "developer" { "system" } else { role }.to_string())
}

/// Tokens a completion may generate, under one rule for both APIs: a request that names a
/// length (`requested`: the value and the field that gave it) must fit with its prompt in
/// the context (`prompt + requested ≤ n_ctx`, else a 400 with the three numbers); a request
/// that names none may use all the room its prompt leaves (`n_ctx - prompt`). Either way
/// the prompt must leave room for at least one token. `field` names the prompt (`messages`,
/// `prompt`).
pub fn completion_budget(
    prompt: usize,
    n_ctx: usize,
    requested: Option<(usize, &str)>,
    field: &str,
) -> Result<usize, ParamError> {
    if prompt >= n_ctx {
        return Err(ParamError::PromptTooLong {
            field: field.into(),
            prompt,
            n_ctx,
        });
    }
    match requested {
        None => Ok(n_ctx - prompt),
        Some((n, _)) if prompt + n <= n_ctx => Ok(n),
        Some((n, budget_field)) => Err(ParamError::ContextLength {
            field: field.into(),
            budget_field: budget_field.into(),
            prompt,
            requested: n,
            n_ctx,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_two_namings() {
        let bad = SamplingFields {
            temperature: Some(-5.0),
            ..Default::default()
        };
        let e = validate_sampling(&bad, "", &OPENAI_DEFAULTS).unwrap_err();
        assert_eq!(e.field(), "temperature");
        let e = validate_sampling(&bad, "options.", &OLLAMA_DEFAULTS).unwrap_err();
        assert_eq!(e.field(), "options.temperature");
        assert_eq!(
            e.to_string(),
            "options.temperature must be between 0 and 2, got -5"
        );
        for (f, name) in [
            (
                SamplingFields {
                    top_p: Some(1.5),
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingFields {
                    top_k: Some(-1),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingFields {
                    min_p: Some(-0.1),
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingFields {
                    repeat_penalty: Some(0.0),
                    ..Default::default()
                },
                "repeat_penalty",
            ),
            (
                SamplingFields {
                    repeat_last_n: Some(-2),
                    ..Default::default()
                },
                "repeat_last_n",
            ),
            (
                SamplingFields {
                    presence_penalty: Some(2.5),
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingFields {
                    frequency_penalty: Some(-3.0),
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingFields {
                    stop: Some(vec!["a".into(), String::new()]),
                    ..Default::default()
                },
                "stop[1]",
            ),
            (
                SamplingFields {
                    stop: Some(vec!["x".into(); 17]),
                    ..Default::default()
                },
                "stop",
            ),
        ] {
            let e = validate_sampling(&f, "options.", &OLLAMA_DEFAULTS).unwrap_err();
            assert_eq!(e.field(), format!("options.{name}"));
            let e = validate_sampling(&f, "", &OPENAI_DEFAULTS).unwrap_err();
            assert_eq!(e.field(), name);
        }
    }

    #[test]
    fn defaults_and_whole_context_penalty() {
        let s = validate_sampling(
            &SamplingFields {
                seed: Some(7),
                repeat_last_n: Some(-1),
                ..Default::default()
            },
            "options.",
            &OLLAMA_DEFAULTS,
        )
        .unwrap();
        assert_eq!(s.params.top_k, 40);
        assert_eq!(s.params.seed, 7);
        assert_eq!(s.params.penalty_last_n, usize::MAX);
        assert!(s.params.validate().is_ok());
    }

    #[test]
    fn context_rule() {
        assert_eq!(completion_budget(10, 100, None, "prompt"), Ok(90));
        assert_eq!(
            completion_budget(10, 100, Some((90, "max_tokens")), "prompt"),
            Ok(90)
        );
        let e = completion_budget(4091, 4096, Some((100, "max_tokens")), "messages").unwrap_err();
        assert_eq!(e.field(), "messages");
        let msg = e.to_string();
        assert!(
            msg.contains("4096") && msg.contains("4191") && msg.contains("4091"),
            "{msg}"
        );
        assert!(matches!(
            completion_budget(100, 100, None, "prompt"),
            Err(ParamError::PromptTooLong { .. })
        ));
    }

    #[test]
    fn roles_counts_logprobs() {
        assert_eq!(
            validate_role("developer", "messages[0].role".into(), OPENAI_ROLES).unwrap(),
            "system"
        );
        let e = validate_role("wizard", "messages[1].role".into(), OPENAI_ROLES).unwrap_err();
        assert_eq!(e.field(), "messages[1].role");
        assert!(validate_role("developer", "messages[0].role".into(), OLLAMA_ROLES).is_err());
        assert!(validate_n(Some(0)).is_err());
        assert!(validate_n(Some(17)).is_err());
        assert_eq!(validate_n(None), Ok(1));
        assert!(validate_logprobs("top_logprobs", 21).is_err());
        assert_eq!(validate_logprobs("logprobs", 20), Ok(20));
        assert!(validate_max_tokens("max_tokens", 0).is_err());
    }
}
