//! The errors of `mica-engine`: [`EngineError`] for the library's calls, [`ParamError`] for
//! a request parameter out of range (naming the [`Param`], so a server can fill an API's
//! `param` field and a binding raise the matching exception), [`ConfigError`] for engine
//! settings that cannot work.

use mica_models::ModelError;
use mica_models::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(
        "the prompt has {tokens} tokens but the context holds {n_ctx}; shorten the prompt or raise the context size"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    // The causes below are part of the message and not also a `source`, so that an error
    // chain (anyhow's `{:#}`) prints them once.
    #[error("invalid parameters: {0}")]
    Params(ParamError),
    #[error("invalid parameters: {0}")]
    Config(ConfigError),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
    #[error(transparent)]
    Spec(#[from] SpecError),
}

impl From<ParamError> for EngineError {
    fn from(e: ParamError) -> Self {
        EngineError::Params(e)
    }
}

impl From<ConfigError> for EngineError {
    fn from(e: ConfigError) -> Self {
        EngineError::Config(e)
    }
}

/// Why a draft model cannot serve a target model ([`crate::spec::DraftModelProposer`]): its
/// token ids would mean other text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "the draft model's vocabulary is not the target's: the draft uses a {draft} tokenizer, the target a {target} one"
    )]
    VocabKind { target: String, draft: String },
    #[error(
        "the draft model's vocabulary is not the target's: {draft} tokens against {target} (at most 128 may differ, as padding)"
    )]
    VocabSize { target: usize, draft: usize },
    #[error(
        "the draft model's vocabulary is not the target's: token {id} is {draft:?} in the draft, {target:?} in the target"
    )]
    Token {
        id: u32,
        target: String,
        draft: String,
    },
    #[error(
        "the draft model has recurrent layers (a hybrid model such as Qwen3.5), whose state \
         cannot be rolled back past rejected drafts; use an attention-only draft model"
    )]
    RecurrentDraft,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A request parameter, by the name the OpenAI-style APIs give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Param {
    Temperature,
    TopP,
    MinP,
    RepeatPenalty,
    PresencePenalty,
    FrequencyPenalty,
    LogitBias,
    Mirostat,
    TypicalP,
    XtcProbability,
    XtcThreshold,
    DryMultiplier,
    DryBase,
    DryPenaltyLastN,
    DrySequenceBreakers,
    Prompt,
    N,
    /// A draft proposer (speculative decoding).
    Proposer,
    /// LoRA adapters chosen for the request.
    Lora,
}

impl Param {
    /// The API field name (`top_p`, `logit_bias`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Param::Temperature => "temperature",
            Param::TopP => "top_p",
            Param::MinP => "min_p",
            Param::RepeatPenalty => "repeat_penalty",
            Param::PresencePenalty => "presence_penalty",
            Param::FrequencyPenalty => "frequency_penalty",
            Param::LogitBias => "logit_bias",
            Param::Mirostat => "mirostat",
            Param::TypicalP => "typical_p",
            Param::XtcProbability => "xtc_probability",
            Param::XtcThreshold => "xtc_threshold",
            Param::DryMultiplier => "dry_multiplier",
            Param::DryBase => "dry_base",
            Param::DryPenaltyLastN => "dry_penalty_last_n",
            Param::DrySequenceBreakers => "dry_sequence_breakers",
            Param::Prompt => "prompt",
            Param::N => "n",
            Param::Proposer => "proposer",
            Param::Lora => "lora",
        }
    }
}

/// A request parameter out of range: one variant per rule.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ParamError {
    #[error(
        "speculative decoding is not supported for this model: its recurrent layers' state \
         cannot be rolled back to drop rejected draft tokens; run it without a draft proposer"
    )]
    DraftsOnRecurrentModel,
    #[error(
        "this model's last layers run on another device (--gpu-layers), where LoRA adapters \
         chosen per request do not apply; serve it on the CPU to use them"
    )]
    LoraOnOffloadedLayers,
    #[error("temperature must be a finite number, got {0}")]
    Temperature(f32),
    #[error("top-p must be between 0 and 1, got {0}")]
    TopP(f32),
    #[error("min-p must be between 0 and 1, got {0}")]
    MinP(f32),
    #[error("repeat penalty must be positive, got {0}")]
    RepeatPenalty(f32),
    #[error("presence penalty must be finite, got {0}")]
    PresencePenalty(f32),
    #[error("frequency penalty must be finite, got {0}")]
    FrequencyPenalty(f32),
    #[error("the logit bias of token {token} must be finite, got {bias}")]
    LogitBiasValue { token: u32, bias: f32 },
    #[error("logit bias names token {token}, but the vocabulary has {n_vocab} tokens")]
    LogitBiasToken { token: u32, n_vocab: usize },
    #[error("mirostat needs a positive finite tau and a finite eta ≥ 0, got tau {tau}, eta {eta}")]
    Mirostat { tau: f32, eta: f32 },
    #[error("typical-p must be between 0 and 1, got {0}")]
    TypicalP(f32),
    #[error("the XTC probability must be between 0 and 1, got {0}")]
    XtcProbability(f32),
    #[error("the XTC threshold must be between 0 and 1, got {0}")]
    XtcThreshold(f32),
    #[error("the DRY multiplier must be finite and at least 0, got {0}")]
    DryMultiplier(f32),
    #[error("the DRY base must be finite and at least 1, got {0}")]
    DryBase(f32),
    #[error("the DRY window must be -1 (the whole history), 0 (off) or positive, got {0}")]
    DryPenaltyLastN(i32),
    #[error("DRY sequence breakers must be non-empty strings")]
    DrySequenceBreakers,
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("n must be between 1 and {max}, got {n}")]
    N { n: usize, max: usize },
}

impl ParamError {
    /// The parameter at fault.
    pub fn param(&self) -> Param {
        match self {
            ParamError::Temperature(_) => Param::Temperature,
            ParamError::TopP(_) => Param::TopP,
            ParamError::MinP(_) => Param::MinP,
            ParamError::RepeatPenalty(_) => Param::RepeatPenalty,
            ParamError::PresencePenalty(_) => Param::PresencePenalty,
            ParamError::FrequencyPenalty(_) => Param::FrequencyPenalty,
            ParamError::LogitBiasValue { .. } | ParamError::LogitBiasToken { .. } => {
                Param::LogitBias
            }
            ParamError::Mirostat { .. } => Param::Mirostat,
            ParamError::TypicalP(_) => Param::TypicalP,
            ParamError::XtcProbability(_) => Param::XtcProbability,
            ParamError::XtcThreshold(_) => Param::XtcThreshold,
            ParamError::DryMultiplier(_) => Param::DryMultiplier,
            ParamError::DryBase(_) => Param::DryBase,
            ParamError::DryPenaltyLastN(_) => Param::DryPenaltyLastN,
            ParamError::DrySequenceBreakers => Param::DrySequenceBreakers,
            ParamError::EmptyPrompt => Param::Prompt,
            ParamError::N { .. } => Param::N,
            ParamError::DraftsOnRecurrentModel => Param::Proposer,
            ParamError::LoraOnOffloadedLayers => Param::Lora,
        }
    }
}

/// Engine settings that cannot work ([`EngineHandle::start`](crate::EngineHandle::start)).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the KV memory holds {blocks} blocks of {block_size} positions: too small for any request"
    )]
    KvTooSmall { blocks: usize, block_size: usize },
    #[error(
        "the step token budget ({budget}) must be at least the running sequences ({running}) plus {min}"
    )]
    StepBudget {
        budget: usize,
        running: usize,
        min: usize,
    },
    #[error("abandoning every step would never finish one (abandon_every must be 0 or at least 2)")]
    AbandonEveryStep,
    #[error("the thread count must be positive")]
    NoThreads,
    #[error(
        "the state checkpoint interval ({interval}) must be a multiple of the {block_size}-position KV block"
    )]
    CheckpointInterval { interval: usize, block_size: usize },
}
