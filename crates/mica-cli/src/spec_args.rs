//! The speculative-decoding flags shared by `mica run`, `mica chat`, `mica bench` and
//! `mica serve`, resolved into the engine's [`SpecConfig`].

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use mica::engine::spec::{AdaptiveConfig, DraftModelConfig, NgramConfig, SpecConfig, SpecMethod};
use mica::models::{LoadOptions, LoadedModel};
use std::sync::Arc;

/// Which proposer drafts tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpecKind {
    /// N-gram lookup in the prompt and the output (free; pays where the output repeats
    /// the input: code edits, quoting, reformatting).
    Ngram,
    /// A draft model with the target's vocabulary (--draft-model).
    Draft,
    /// No speculative decoding.
    Off,
}

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: several tokens per forward pass, the same output (greedy: the
    /// same tokens; sampled: the same distribution). Drafts are sized by their recent
    /// acceptance and stop where they do not pay. Default: ngram, or draft with
    /// --draft-model.
    #[arg(long = "spec", value_enum)]
    pub spec: Option<SpecKind>,
    /// Draft model for --spec draft: a GGUF file or store name with the target's
    /// vocabulary (checked at load).
    #[arg(long = "draft-model")]
    pub draft_model: Option<String>,
    /// Run only the first N layers of the draft model (an early-exit draft; with the
    /// target itself as --draft-model, self-speculation).
    #[arg(long = "draft-layers")]
    pub draft_layers: Option<usize>,
    /// Most tokens per draft.
    #[arg(long = "spec-max", default_value_t = 16)]
    pub spec_max: usize,
}

impl SpecArgs {
    /// The method the flags ask for.
    pub fn kind(&self) -> SpecKind {
        match (self.spec, &self.draft_model) {
            (Some(k), _) => k,
            (None, Some(_)) => SpecKind::Draft,
            (None, None) => SpecKind::Ngram,
        }
    }

    /// The resolved configuration (loading the draft model) for a context of `n_ctx`
    /// positions; with `target`, the draft model's vocabulary is checked against it (the
    /// server checks it against each model it loads).
    pub fn resolve(
        &self,
        target: Option<&LoadedModel>,
        n_ctx: usize,
        quiet: bool,
    ) -> Result<SpecConfig> {
        if self.spec_max == 0 {
            bail!("--spec-max must be at least 1 (use --spec off to turn speculation off)");
        }
        if self.draft_layers == Some(0) {
            bail!("--draft-layers must be at least 1");
        }
        let adaptive = AdaptiveConfig {
            max_draft: self.spec_max.min(mica::engine::MAX_DRAFT),
            ..AdaptiveConfig::default()
        };
        // A hybrid model's recurrent state cannot drop rejected drafts: the default
        // (n-gram) is off for it, an explicit request an error.
        if let Some(t) = target
            && t.model.config.has_recurrent_state()
        {
            return match self.kind() {
                SpecKind::Off => Ok(SpecConfig {
                    method: SpecMethod::Off,
                    adaptive,
                }),
                _ if self.spec.is_none() && self.draft_model.is_none() => Ok(SpecConfig {
                    method: SpecMethod::Off,
                    adaptive,
                }),
                k => bail!(
                    "--spec {}: this model has recurrent layers (Gated DeltaNet), whose state \
                     cannot drop rejected drafts; use --spec off",
                    format!("{k:?}").to_lowercase()
                ),
            };
        }
        let method = match self.kind() {
            SpecKind::Off => SpecMethod::Off,
            SpecKind::Ngram => {
                if self.draft_model.is_some() {
                    bail!("--draft-model needs --spec draft");
                }
                SpecMethod::Ngram {
                    config: NgramConfig::default(),
                    cache: None,
                }
            }
            SpecKind::Draft => {
                let Some(name) = &self.draft_model else {
                    bail!(
                        "--spec draft needs --draft-model (a model with the target's vocabulary)"
                    );
                };
                let path = crate::store::resolve_model(Some(name), quiet)?;
                let mut draft = LoadedModel::open_with(&path, LoadOptions { repack: true })
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                if let Some(n) = self.draft_layers {
                    let have = draft.model.layers.len();
                    if !draft.model.truncate_layers(n) {
                        bail!("--draft-layers {n}: the draft model has {have} layers");
                    }
                }
                if let Some(target) = target {
                    mica::engine::spec::check_vocab(&target.tokenizer, &draft.tokenizer)
                        .with_context(|| format!("draft model {}", path.display()))?;
                }
                SpecMethod::Draft {
                    model: Arc::new(draft),
                    config: DraftModelConfig {
                        n_ctx,
                        ..DraftModelConfig::default()
                    },
                }
            }
        };
        Ok(SpecConfig { method, adaptive })
    }
}
