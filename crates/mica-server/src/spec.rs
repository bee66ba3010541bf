//! Speculative decoding in the server: the per-request fields both APIs take (`spec`,
//! `spec_max`; Ollama's inside `options`), checked by [`validate_spec`], and the proposer
//! each request gets from its model's [`SpecConfig`] ([`proposer`]).
//!
//! The server's configuration ([`ServerConfig::spec`](crate::ServerConfig)) says what a
//! request gets when it asks for nothing: n-gram lookup (with a cache of recent outputs
//! shared by every request), a draft model, or none. A request may turn speculation off,
//! ask for n-gram lookup, or ask for the draft model when the server has one, and may lower
//! the draft length. Every proposer is adaptive: it drafts only while drafts pay, and drafts
//! nothing in a step crowded with other sequences, so continuous batching and the priority
//! lanes run as before. Speculation never changes what is generated (greedy: the same
//! tokens; sampled: the same distribution), only how many tokens each step gives; the
//! per-request counts of drafted and accepted tokens are in the response's usage, and the
//! totals in `/metrics`.

use crate::error::ParamError;
use crate::models::Loaded;
use mica::engine::spec::{SpecConfig, SpecMethod};
use mica::engine::{MAX_DRAFT, Proposer};

/// The speculation fields as a request gives them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecFields {
    /// `off`, `ngram` or `draft`.
    pub spec: Option<String>,
    /// Most tokens per draft.
    pub spec_max: Option<i64>,
}

/// Which proposer a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecChoice {
    Off,
    Ngram,
    Draft,
}

/// A request's checked speculation fields (`None`: the server's setting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecRequest {
    pub choice: Option<SpecChoice>,
    pub max: Option<usize>,
}

/// Checks `spec` (one of `off`, `ngram`, `draft`) and `spec_max` (1 to
/// [`MAX_DRAFT`]); `prefix` is the API's field prefix (`""` or `"options."`).
pub fn validate_spec(f: &SpecFields, prefix: &str) -> Result<SpecRequest, ParamError> {
    let choice = match f.spec.as_deref() {
        None => None,
        Some("off") => Some(SpecChoice::Off),
        Some("ngram") => Some(SpecChoice::Ngram),
        Some("draft") => Some(SpecChoice::Draft),
        Some(other) => {
            return Err(ParamError::Invalid {
                field: format!("{prefix}spec"),
                rule: "one of \"off\", \"ngram\", \"draft\"",
                got: format!("{other:?}"),
            });
        }
    };
    let max = match f.spec_max {
        None => None,
        Some(v) if (1..=MAX_DRAFT as i64).contains(&v) => Some(v as usize),
        Some(v) => {
            return Err(ParamError::OutOfRange {
                field: format!("{prefix}spec_max"),
                min: 1.0,
                max: MAX_DRAFT as f64,
                got: v as f64,
            });
        }
    };
    Ok(SpecRequest { choice, max })
}

/// The proposer for a request to `loaded` asking for `req` (`None`: no speculation). A
/// request for the draft model fails, naming `{prefix}spec`, when the server has none.
pub fn proposer(
    loaded: &Loaded,
    req: &SpecRequest,
    prefix: &str,
) -> Result<Option<Box<dyn Proposer>>, ParamError> {
    let server = &loaded.spec;
    let mut cfg: SpecConfig = match req.choice {
        None => server.clone(),
        Some(SpecChoice::Off) => return Ok(None),
        Some(SpecChoice::Ngram) => match &server.method {
            SpecMethod::Ngram { .. } => server.clone(),
            _ => SpecConfig {
                adaptive: server.adaptive,
                ..SpecConfig::ngram(server.adaptive.max_draft)
            },
        },
        Some(SpecChoice::Draft) => match &server.method {
            SpecMethod::Draft { .. } => server.clone(),
            _ => {
                return Err(ParamError::Unsupported {
                    field: format!("{prefix}spec"),
                    message: "this server has no draft model (start it with --draft-model)".into(),
                });
            }
        },
    };
    if let Some(max) = req.max {
        cfg.adaptive.max_draft = max;
    }
    if !matches!(cfg.method, SpecMethod::Off) && loaded.model.model.config.has_recurrent_state() {
        return Err(ParamError::Unsupported {
            field: format!("{prefix}spec"),
            message: "this model has recurrent layers (Gated DeltaNet), whose state cannot drop \
                      rejected drafts: speculative decoding is off for it"
                .into(),
        });
    }
    // The vocabulary was checked when the model was loaded (`models::start`).
    cfg.proposer(&loaded.model, &loaded.engine.pool())
        .map_err(|e| ParamError::Unsupported {
            field: format!("{prefix}spec"),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_and_named() {
        let ok = validate_spec(
            &SpecFields {
                spec: Some("draft".into()),
                spec_max: Some(4),
            },
            "",
        )
        .unwrap();
        assert_eq!(ok.choice, Some(SpecChoice::Draft));
        assert_eq!(ok.max, Some(4));
        assert_eq!(
            validate_spec(&SpecFields::default(), "").unwrap(),
            SpecRequest::default()
        );
        let bad = validate_spec(
            &SpecFields {
                spec: Some("medusa".into()),
                spec_max: None,
            },
            "options.",
        )
        .unwrap_err();
        assert_eq!(bad.field(), "options.spec");
        for v in [0, MAX_DRAFT as i64 + 1] {
            let bad = validate_spec(
                &SpecFields {
                    spec: None,
                    spec_max: Some(v),
                },
                "",
            )
            .unwrap_err();
            assert_eq!(bad.field(), "spec_max", "{v}");
        }
    }
}
